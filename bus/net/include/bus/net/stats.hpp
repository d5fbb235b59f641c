// What a bridge node can tell about its peers and its traffic.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
  std::string request_endpoint;
  std::vector<std::string> serves;   // endpoints and queues it takes from other nodes
  std::vector<std::string> imports;  // topics it subscribes to
  std::chrono::milliseconds since_heartbeat{0};
  std::vector<ChannelInfo> channels;  // serves and imports, with their types
};

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
  uint64_t published = 0;               // topic messages that left through the publisher
  uint64_t publish_frames = 0;          // frames they left in: published over it is the batching
  uint64_t publish_stalls = 0;          // frames a subscriber's full queue held back (each once)
  // Times the publisher stopped waiting for a full subscriber (send_stall_limit) and sent on
  // without it: from then on ZeroMQ drops that subscriber's copies until it has room again;
  // what it missed is counted by it (gaps) and reported back here (peer_missed).
  uint64_t publish_cuts = 0;
  uint64_t malformed_frames = 0;    // bad envelope, bad framing, wrong part count
  uint64_t oversized = 0;           // payloads over max_message_bytes
  uint64_t unknown_channel = 0;     // frames for channels this node does not bridge
  uint64_t peers_lost = 0;          // nodes declared dead (heard nothing from them)
  uint64_t peers_returned = 0;      // nodes declared dead and heard from again (same run)
  uint64_t calls_peer_gone = 0;     // requests failed because their node died
  uint64_t late_replies = 0;        // replies after their request was done
  uint64_t unroutable_replies = 0;  // replies whose requester disconnected
  uint64_t send_refused = 0;        // requests or queue messages refused: no room toward the peer
  uint64_t auth_denied = 0;         // connections refused by the CURVE allowlist
  // Frames that carried requests / replies: one each, or a batch of several (to and from nodes
  // that read batches). Requests sent over request_frames is the batching achieved.
  uint64_t request_frames = 0;
  uint64_t reply_frames = 0;
  // Requests sent and answered on their callers' threads (Bus::call from a plain thread), not
  // through the bridge thread: one frame each, counted in request_frames too.
  uint64_t direct_calls = 0;

  /// Sums over peers for `channel`.
  ChannelTraffic channel(std::string_view channel) const {
    ChannelTraffic t;
    t.channel = std::string(channel);
    for (const auto& c : traffic) {
      if (c.channel != channel) continue;
      t.sent += c.sent;
      t.received += c.received;
      t.gaps += c.gaps;
      t.rejected += c.rejected;
      t.peer_missed += c.peer_missed;
    }
    return t;
  }
};

}  // namespace bus::net
