// A snapshot of the bus's counters, taken at any time from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bus {

/// One channel's counters. Every message offered has one outcome per subscriber: once nothing is
/// in flight, `published * subscribers == delivered + handler_failed + dropped + failed` for a
/// topic whose subscribers stayed, and `published == delivered + handler_failed + dropped +
/// failed + expired + unrouted` for a queue or endpoint (docs/core.md, "Stats").
struct ChannelStats {
  std::string name;
  std::string type;        // e.g. "Topic<Tick>"
  uint64_t published = 0;  // offered by publish/send/request/call while the bus ran
  uint64_t delivered = 0;  // handler calls that returned (one per subscriber)
  uint64_t dropped = 0;    // discarded by the drop-newest policy, once per subscriber
  uint64_t failed = 0;     // refused (full ring under kFail, full backlog, no consumer, no room
                           // before a request's deadline, ...), once per subscriber
  uint64_t handler_failed = 0;  // handler calls that threw (a bulk handler: its span)
  uint64_t late_replies = 0;    // handlers' replies that came after their request had ended
  uint64_t expired = 0;         // requests a server did not run: their deadline had passed
  uint64_t unrouted = 0;        // cancelled on their way to a consumer, with none left
};

/// One counter of a stats struct `S`, named once for every exporter (StatsD, /metrics,
/// `$bus.stats`), with what it counts.
template <class S>
struct Figure {
  const char* name;
  const char* help;
  uint64_t S::*member;
};

/// The counters of ChannelStats: StatsD sends `channel.<channel>.<name>`, /metrics
/// `bus_channel_<name>_total{channel=...}`, `$bus.stats` `channel.<channel>.<name>` (docs/core.md,
/// "Stats", defines each).
using ChannelFigure = Figure<ChannelStats>;
inline constexpr ChannelFigure kChannelFigures[] = {
    {"published", "Messages offered by publish, send, request or call.", &ChannelStats::published},
    {"delivered", "Handler calls that returned (one per subscriber).", &ChannelStats::delivered},
    {"dropped", "Messages discarded by the drop-newest policy, once per subscriber.",
     &ChannelStats::dropped},
    {"failed",
     "Messages refused (full ring under kFail, full backlog, no consumer, no room "
     "before the deadline), once per subscriber.",
     &ChannelStats::failed},
    {"handler_failed", "Handler calls that threw.", &ChannelStats::handler_failed},
    {"late_replies", "Replies that came after their request had ended.",
     &ChannelStats::late_replies},
    {"expired", "Requests whose deadline passed before a handler ran.", &ChannelStats::expired},
    {"unrouted", "Messages whose consumer went away with none left to take them.",
     &ChannelStats::unrouted},
};

struct InboxStats {
  unsigned index = 0;
  bool external = false;     // owned by an external event loop rather than an executor
  uint32_t rings = 0;        // producing threads that have sent to it
  uint64_t depth_bytes = 0;  // bytes waiting in its rings
  uint64_t capacity_bytes = 0;
};

struct Stats {
  std::vector<ChannelStats> channels;
  std::vector<InboxStats> inboxes;
  uint64_t held_records = 0;  // records executors hold back while rings are full
  /// The channel named `name`, or null.
  const ChannelStats* channel(std::string_view name) const {
    for (const auto& c : channels) {
      if (c.name == name) return &c;
    }
    return nullptr;
  }
};

}  // namespace bus
