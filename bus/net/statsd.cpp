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
  {
    out.gauge("node.peers", static_cast<double>(s.peers.size()));
    out.counter("node.published", s.published);
    out.counter("node.publish_stalls", s.publish_stalls);
    out.counter("node.publish_cuts", s.publish_cuts);
    out.counter("node.malformed_frames", s.malformed_frames);
    out.counter("node.oversized", s.oversized);
    out.counter("node.unknown_channel", s.unknown_channel);
    out.counter("node.peers_lost", s.peers_lost);
    out.counter("node.peers_returned", s.peers_returned);
    out.counter("node.calls_peer_gone", s.calls_peer_gone);
    out.counter("node.late_replies", s.late_replies);
    out.counter("node.unroutable_replies", s.unroutable_replies);
    out.counter("node.send_refused", s.send_refused);
    out.counter("node.auth_denied", s.auth_denied);
    out.counter("node.publish_frames", s.publish_frames);
    out.counter("node.request_frames", s.request_frames);
    out.counter("node.reply_frames", s.reply_frames);
    out.counter("node.direct_calls", s.direct_calls);
    // Per channel, summed over peers (peer names come and go; StatsD names should not).
    std::set<std::string> channels;
    for (const ChannelTraffic& t : s.traffic) channels.insert(t.channel);
    for (const std::string& channel : channels) {
      ChannelTraffic t = s.channel(channel);
      std::string base = absl::StrCat("node.channel.", channel, ".");
      out.counter(base + "sent", t.sent);
      out.counter(base + "received", t.received);
      out.counter(base + "gaps", t.gaps);
      out.counter(base + "rejected", t.rejected);
      out.counter(base + "peer_missed", t.peer_missed);
    }
  }
}

void detail::peer_figures(const NodeStats& s, StatsdSink& out) {
  // Named by peer: for a look at one node now ($bus.stats), not for StatsD, whose names should
  // outlive the nodes. Rows of nodes gone are folded under "gone".
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
