// A snapshot of the bus's counters, taken at any time from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace bus {

struct ChannelStats {
  std::string name;
  std::string type;        // e.g. "Topic<Tick>"
  uint64_t published = 0;  // accepted by publish/send/request
  uint64_t delivered = 0;  // messages handlers took and returned (one per subscriber)
  uint64_t dropped = 0;    // discarded by the drop-newest policy
  uint64_t failed = 0;     // refused: ring full under the fail policy, no consumer, backlog full
  uint64_t handler_failed = 0;  // messages whose handler threw (a bulk handler: its span)
  uint64_t late_replies = 0;    // replies that came after the requester's deadline
  uint64_t expired = 0;         // requests whose deadline passed before a handler ran
  uint64_t unrouted = 0;        // messages whose consumer went away with none left to take them
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
