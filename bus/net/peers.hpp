// The peers a node hears: who they are, what they serve and import, whether they are alive.
#pragma once

#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "frames.hpp"

namespace bus::net::detail {

struct ChannelDesc {
  std::string name;
  uint64_t type_id = 0;
  uint64_t reply_type_id = 0;
  wire::Channel::Kind kind = wire::Channel::Kind::TOPIC;
  bool operator==(const ChannelDesc&) const = default;
};

/// Requests to one peer on one endpoint, sent in one frame when the loop's pass ends.
struct CallBatch {
  struct Call {
    Clock::time_point deadline;
    std::unique_ptr<PendingCall> pending;
  };
  Bridged* channel = nullptr;
  PrincipalPtr principal;  // every request of a batch is for one principal (or none)
  std::string bytes;       // the requests' payloads, back to back
  std::vector<Call> calls;
};

/// How a node reaches a peer.
enum class TransportKind { kZmq, kShm };

/// A node this one hears heartbeats from.
struct PeerState {
  uint64_t id = 0;
  std::string name;
  std::string request_address;
  std::string publish_address;  // as its heartbeats say: where others should reach it
  std::string public_key;
  std::chrono::milliseconds interval{0};
  Clock::time_point last_seen;  // when a frame of any kind last came from it
  uint64_t frames_at_seen = 0;  // the ZeroMQ subscriber's frame count then (see input_waiting)
  std::vector<ChannelDesc> serves;
  std::vector<ChannelDesc> imports;
  // Requests and queue messages go here; null: it takes none (it has no request socket).
  PeerRoute* route = nullptr;
  TransportKind transport = TransportKind::kZmq;        // what `route` and its frames to us use
  uint64_t link = 0;                                    // the shared-memory link (kShm)
  absl::flat_hash_map<std::string, uint64_t> send_seq;  // queues: last seq sent to it per channel
  bool batches = false;          // its heartbeat says it reads request and reply batches
  std::vector<CallBatch> calls;  // requests to it not sent yet, a batch per endpoint and principal
};

/// The live peers, and the liveness rule: a peer silent for dead_after of its heartbeat
/// intervals is dead, but silence counts only while this node keeps up with its input and its
/// own loop runs. Bridge thread only.
class PeerTable {
 public:
  PeerTable(std::chrono::milliseconds heartbeat, unsigned dead_after)
      : heartbeat_(heartbeat), dead_after_(dead_after) {}

  PeerState* find(uint64_t id) {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : &it->second;
  }
  const PeerState* find(uint64_t id) const {
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : &it->second;
  }
  bool contains(uint64_t id) const { return peers_.contains(id); }
  /// The peer of `id`, made when new (`fresh`).
  PeerState& emplace(uint64_t id, bool& fresh);
  void erase(uint64_t id) { peers_.erase(id); }
  void clear() { peers_.clear(); }
  auto begin() { return peers_.begin(); }
  auto end() { return peers_.end(); }
  auto begin() const { return peers_.begin(); }
  auto end() const { return peers_.end(); }
  std::size_t size() const { return peers_.size(); }

  /// A frame came from `sender`: if it is a live peer, it is alive now (any frame proves it).
  /// `frames`: the ZeroMQ subscriber's frame count (see PeerState::frames_at_seen).
  void heard(uint64_t sender, uint64_t frames);
  /// The peers silent for too long, to be declared dead. `input_waiting(peer)`: frames of it
  /// may wait unread here (it is not silent, this node is behind). Meant to run every
  /// check_every(); `now` is a parameter so that a test can run it on a clock of its own.
  template <class Waiting>
  std::vector<uint64_t> silent(Waiting input_waiting, Clock::time_point now = Clock::now());
  /// How often silent() is meant to run: once a heartbeat of this node (the bridge checks with
  /// its own heartbeat, and never later than this after the last check).
  std::chrono::milliseconds check_every() const { return heartbeat_; }
  /// The longest gap between two checks that counts as silence. A longer one was time away,
  /// and all of it past check_every() is given back to the peers. So a peer last heard at t is
  /// declared dead after more than its interval x dead_after, and by then + check_every() while
  /// checks keep time, + longest_counted_gap() of counted time however late they come
  /// (docs/wire-protocol.md §6, tests/net/wire_doc_test.cpp).
  std::chrono::milliseconds longest_counted_gap() const { return heartbeat_ + heartbeat_ / 2; }
  /// `id` was declared dead: a frame from the same run of it later is a return.
  void declared_dead(uint64_t id) { declared_dead_[id] = Clock::now(); }
  /// True once when a node declared dead speaks again (its numbering went on).
  bool returned(uint64_t id) { return declared_dead_.erase(id) > 0; }

  /// True when `p` serves `ch` (an import) with its types and can be sent to.
  static bool serves(const PeerState& p, const Bridged& ch, bool endpoint);
  /// A live peer serving `ch`, round-robin; null when none does.
  PeerState* pick(const Bridged& ch, bool endpoint);

 private:
  const std::chrono::milliseconds heartbeat_;
  const unsigned dead_after_;
  absl::flat_hash_map<uint64_t, PeerState> peers_;
  // Nodes declared dead (by id, with when), to tell a false death when one speaks again.
  absl::flat_hash_map<uint64_t, Clock::time_point> declared_dead_;
  absl::flat_hash_map<std::string, uint32_t> round_robin_;
  Clock::time_point last_check_{};  // of silent(): how long this thread was away
};

template <class Waiting>
std::vector<uint64_t> PeerTable::silent(Waiting input_waiting, Clock::time_point now) {
  using namespace std::chrono_literals;
  // Time this thread did not run its loop (checks come a heartbeat apart at most) does not
  // count: the process was stopped, or this thread was held up (a blocked publish to a full
  // local ring, a slow handler). Peers get that time back: after a pause, frames that came
  // meanwhile may not even have reached this node's sockets yet.
  if (last_check_ != Clock::time_point{} && now - last_check_ > longest_counted_gap()) {
    auto away = now - last_check_ - check_every();
    for (auto& [id, p] : peers_) p.last_seen += away;
  }
  last_check_ = now;
  std::vector<uint64_t> dead;
  for (auto& [id, p] : peers_) {
    if (now - p.last_seen <= p.interval * dead_after_) continue;
    if (input_waiting(p)) continue;
    dead.push_back(id);
  }
  // Bounded like the sequence state: what is kept for peers that may come back.
  if (declared_dead_.size() > kMaxSenders) {
    absl::erase_if(declared_dead_, [&](const auto& d) { return now - d.second > 1h; });
    if (declared_dead_.size() > kMaxSenders) declared_dead_.clear();
  }
  return dead;
}

}  // namespace bus::net::detail
