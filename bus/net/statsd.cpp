// StatsD sources of bus::net: a node's traffic and a rate limiter's decisions.
#include "bus/statsd.hpp"

#include <absl/strings/str_cat.h>

#include <set>
#include <string>

#include "bridge.hpp"
#include "bus/net/limiter.hpp"
#include "bus/net/node.hpp"

namespace bus::net {

void detail::node_figures(const NodeStats& s, StatsdSink& out) {
  out.gauge("node.peers", static_cast<double>(s.peers.size()));
  std::size_t shm = 0;
  for (const PeerInfo& p : s.peers) shm += p.transport == Transport::kSharedMemory ? 1 : 0;
  out.gauge("node.peers_shm", static_cast<double>(shm));
  out.gauge("node.shm_heap_bytes", static_cast<double>(s.shm_heap_bytes));
  out.gauge("node.shm_pinned_bytes", static_cast<double>(s.shm_pinned_bytes));
  for (const NodeFigure& f : kNodeFigures) out.counter(absl::StrCat("node.", f.name), s.*f.member);
  // Per channel, summed over peers (peer names come and go; StatsD names should not).
  std::set<std::string> channels;
  for (const ChannelTraffic& t : s.traffic) channels.insert(t.channel);
  for (const std::string& channel : channels) {
    ChannelTraffic t = s.channel(channel);
    for (const TrafficFigure& f : kTrafficFigures) {
      out.counter(absl::StrCat("node.channel.", channel, ".", f.name), t.*f.member);
    }
  }
}

void detail::peer_figures(const NodeStats& s, StatsdSink& out) {
  // Named by peer: for a look at one node now ($bus.stats), not for StatsD, whose names should
  // outlive the nodes. Rows of nodes gone are folded under "gone".
  for (const PeerInfo& p : s.peers) {
    out.gauge(absl::StrCat("node.peer.", p.name, ".shm"),
              p.transport == Transport::kSharedMemory ? 1.0 : 0.0);
  }
  for (const ChannelTraffic& t : s.traffic) {
    if (t.gaps == 0 && t.peer_missed == 0) continue;
    std::string base =
        absl::StrCat("node.peer.", t.peer == 0 ? "gone" : t.peer_name, ".channel.", t.channel, ".");
    out.counter(base + "gaps", t.gaps);
    out.counter(base + "peer_missed", t.peer_missed);
  }
}

StatsdSource statsd_source(const Node& node) {
  return [&node](StatsdSink& out) { detail::node_figures(node.stats(), out); };
}

StatsdSource RateLimiter::statsd_source() const {
  return [this](StatsdSink& out) {
    LimiterStats s = stats();
    std::string base = absl::StrCat("limiter.", name(), ".");
    out.counter(base + "admitted", s.admitted);
    out.counter(base + "refused", s.refused);
    out.counter(base + "over_admitted", s.over_admitted);
    out.counter(base + "sent", s.sent);
    out.counter(base + "received", s.received);
    out.counter(base + "stale", s.stale);
    out.gauge(base + "keys", static_cast<double>(s.keys));
  };
}

}  // namespace bus::net
