// What a bridge node can tell about its peers and its traffic.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bus/net/options.hpp"
#include "bus/stats.hpp"

namespace bus::net {

/// A channel a peer announces, with its types (schema ids).
struct ChannelInfo {
  enum class Kind { kTopic, kQueue, kEndpoint };
  std::string name;
  Kind kind = Kind::kTopic;
  uint64_t type_id = 0;        // the message type; the request type of an endpoint
  uint64_t reply_type_id = 0;  // endpoints
  bool served = false;         // served (endpoints, queues) rather than imported (topics)
};

/// A node this one hears heartbeats from.
struct PeerInfo {
  uint64_t id = 0;
  std::string name;
  std::string request_address;
  std::vector<std::string> serves;   // endpoints and queues it takes from other nodes
  std::vector<std::string> imports;  // topics it subscribes to
  std::chrono::milliseconds since_heartbeat{0};
  std::vector<ChannelInfo> channels;         // serves and imports, with their types
  Transport transport = Transport::kZeroMq;  // kSharedMemory while a link to it is up
};

/// "zmq" or "shm", as busctl, $bus.stats and /metrics name a peer's transport.
inline const char* transport_name(Transport t) {
  return t == Transport::kSharedMemory ? "shm" : "zmq";
}

/// Traffic of one channel with one peer (`peer` 0: peers that are gone, folded together).
struct ChannelTraffic {
  std::string channel;
  uint64_t peer = 0;
  std::string peer_name;
  uint64_t sent = 0;      // messages (publishes, sends, requests, replies) that left for it
  uint64_t received = 0;  // accepted from it
  uint64_t gaps = 0;      // messages it sent that never arrived (sequence numbers skipped)
  uint64_t rejected = 0;  // wrong type id, undecodable payload
  // Messages this node sent that the peer says never reached it: the gaps it counted in what
  // came from here, as its heartbeats report them (so only from peers this node listens to).
  uint64_t peer_missed = 0;
};

struct NodeStats {
  uint64_t id = 0;
  std::vector<PeerInfo> peers;          // live peers
  std::vector<ChannelTraffic> traffic;  // per (channel, peer)
  // The counters; kNodeFigures below says what each counts.
  uint64_t published = 0;
  uint64_t publish_frames = 0;
  uint64_t publish_stalls = 0;
  // After a cut ZeroMQ drops that subscriber's copies until it has room again; what it missed is
  // counted by it (gaps) and reported back here (peer_missed).
  uint64_t publish_cuts = 0;
  uint64_t malformed_frames = 0;
  uint64_t oversized = 0;
  uint64_t unknown_channel = 0;
  uint64_t peers_lost = 0;
  uint64_t peers_returned = 0;  // same run: the same node id
  uint64_t reconnects = 0;      // connections to a peer made anew when it was declared dead
  uint64_t calls_peer_gone = 0;
  uint64_t late_replies = 0;
  uint64_t unroutable_replies = 0;
  uint64_t send_refused = 0;
  uint64_t auth_denied = 0;
  // Requests (replies) sent over request_frames (reply_frames) is the batching achieved, to and
  // from nodes that read batches.
  uint64_t request_frames = 0;
  uint64_t reply_frames = 0;
  uint64_t direct_calls = 0;  // one frame each, counted in request_frames too
  // Membership (NodeOptions::peer by host name, NodeOptions::etcd).
  uint64_t members_found = 0;
  uint64_t members_dropped = 0;
  uint64_t members_kept = 0;  // etcd dropped them while they were heard: kept until they die
  uint64_t etcd_registrations = 0;
  uint64_t etcd_errors = 0;
  uint64_t dns_errors = 0;
  // Shared memory with peers on this host.
  uint64_t shm_links = 0;
  uint64_t shm_handovers = 0;
  uint64_t shm_in_place = 0;
  uint64_t shm_refused = 0;
  uint64_t shm_corrupt = 0;
  uint64_t shm_torn_frames = 0;
  uint64_t shm_heap_full = 0;
  // Levels, not totals (gauges in $bus.stats and /metrics): bytes of the process's shared-memory
  // heap in use, and of this node's blocks that peers still read in place.
  uint64_t shm_heap_bytes = 0;
  uint64_t shm_pinned_bytes = 0;

  /// Sums over peers for `channel`.
  ChannelTraffic channel(std::string_view channel) const;
};

/// The counters of NodeStats and ChannelTraffic, each named once: StatsD and $bus.stats report
/// `node.<name>` (traffic: `node.channel.<channel>.<name>`), /metrics `bus_bridge_<name>_total`
/// (traffic labelled by channel and peer). A new counter is a field plus a row here.
using NodeFigure = Figure<NodeStats>;
inline constexpr NodeFigure kNodeFigures[] = {
    {"published", "Topic messages that left through the publisher.", &NodeStats::published},
    {"publish_frames", "Frames the published messages left in (published over it: the batching).",
     &NodeStats::publish_frames},
    {"publish_stalls", "Frames a subscriber's full queue held back (each once).",
     &NodeStats::publish_stalls},
    {"publish_cuts", "Times the publisher sent on without a subscriber whose queue stayed full.",
     &NodeStats::publish_cuts},
    {"malformed_frames", "Frames with a bad envelope or framing.", &NodeStats::malformed_frames},
    {"oversized", "Payloads over the maximum message size.", &NodeStats::oversized},
    {"unknown_channel", "Frames for channels this node does not bridge.",
     &NodeStats::unknown_channel},
    {"peers_lost", "Nodes declared dead after hearing nothing from them.", &NodeStats::peers_lost},
    {"peers_returned", "Nodes declared dead that were heard from again.",
     &NodeStats::peers_returned},
    {"reconnects", "Connections to a peer's publisher made anew when it was declared dead.",
     &NodeStats::reconnects},
    {"calls_peer_gone", "Requests failed because their node died.", &NodeStats::calls_peer_gone},
    {"late_replies", "Replies that came after their request had ended.", &NodeStats::late_replies},
    {"unroutable_replies", "Replies whose requester had disconnected.",
     &NodeStats::unroutable_replies},
    {"send_refused", "Requests or queue messages refused: no room toward the peer.",
     &NodeStats::send_refused},
    {"auth_denied", "Connections refused by the CURVE allowlist.", &NodeStats::auth_denied},
    {"request_frames", "Frames that carried requests (one, or a batch).",
     &NodeStats::request_frames},
    {"reply_frames", "Frames that carried replies (one, or a batch).", &NodeStats::reply_frames},
    {"direct_calls", "Requests sent and answered on their callers' threads (Bus::call).",
     &NodeStats::direct_calls},
    {"members_found", "Publishers DNS or etcd gave that were not listened to yet.",
     &NodeStats::members_found},
    {"members_dropped",
     "Publishers no longer listened to: gone from etcd, or from DNS for "
     "heartbeat x dead_after.",
     &NodeStats::members_dropped},
    {"members_kept",
     "Publishers etcd dropped while their nodes were heard: listened to until they are declared "
     "dead.",
     &NodeStats::members_kept},
    {"etcd_registrations", "Times this node registered in etcd (again after a lost lease).",
     &NodeStats::etcd_registrations},
    {"etcd_errors", "Failed etcd calls and watch streams, and registrations that did not decode.",
     &NodeStats::etcd_errors},
    {"dns_errors", "Failed resolutions of peers given by host name.", &NodeStats::dns_errors},
    {"shm_links", "Shared-memory links made with peers on this host.", &NodeStats::shm_links},
    {"shm_handovers",
     "Publishers whose topics moved from ZeroMQ to a shared-memory link (nothing lost or twice).",
     &NodeStats::shm_handovers},
    {"shm_in_place",
     "Large messages from peers on this host read in place in their shared memory (no copy).",
     &NodeStats::shm_in_place},
    {"shm_refused",
     "Shared-memory links that could not be made (the peer stays on ZeroMQ), or were refused.",
     &NodeStats::shm_refused},
    {"shm_corrupt",
     "Shared-memory links dropped because the other end wrote what does not read as frames.",
     &NodeStats::shm_corrupt},
    {"shm_torn_frames",
     "Frames a peer died writing: never read, what they held is counted as gaps.",
     &NodeStats::shm_torn_frames},
    {"shm_heap_full",
     "Large messages that found no room in the shared-memory heap (held, then passed over).",
     &NodeStats::shm_heap_full},
};

using TrafficFigure = Figure<ChannelTraffic>;
inline constexpr TrafficFigure kTrafficFigures[] = {
    {"sent", "Messages that left for a peer, by channel.", &ChannelTraffic::sent},
    {"received", "Messages accepted from a peer, by channel.", &ChannelTraffic::received},
    {"gaps", "Messages a peer sent that never arrived (sequence gaps).", &ChannelTraffic::gaps},
    {"rejected", "Messages from a peer rejected: wrong type id, undecodable.",
     &ChannelTraffic::rejected},
    {"peer_missed", "Messages sent to a peer that it reports never arrived (its gaps).",
     &ChannelTraffic::peer_missed},
};

inline ChannelTraffic NodeStats::channel(std::string_view channel) const {
  ChannelTraffic t;
  t.channel = std::string(channel);
  for (const ChannelTraffic& c : traffic) {
    if (c.channel != channel) continue;
    for (const TrafficFigure& f : kTrafficFigures) t.*f.member += c.*f.member;
  }
  return t;
}

}  // namespace bus::net
