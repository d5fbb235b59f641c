// Requests sent and answered on the calling thread (DirectCalls): Bus::call from a plain thread
// to another node's server, without the bridge thread in the way.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "bus/net/detail/channels.hpp"
#include "bus/net/options.hpp"
#include "bus/net/stats.hpp"
#include "sequences.hpp"
#include "shm_link.hpp"
#include "wire.hpp"
#include "zmq_transport.hpp"

namespace bus::net::detail {

/// A live node serving an endpoint, as the bridge last saw it.
struct DirectServer {
  uint64_t id = 0;
  std::string name;
  std::string request_address;
  std::string public_key;
  bool shm = false;        // linked to this node over shared memory: a lane links to it too
  uint64_t picked_at = 0;  // a call's copy: the generation of the servers it was picked from
};

/// The lanes of one node. The bridge thread tells them which nodes serve what (set_servers) and
/// which went away (peer_gone); any thread calls. A caller takes an idle lane (or a new one)
/// for the length of its call, so each lane's sockets are used by one thread at a time, and
/// gives it back after: there are as many lanes as threads ever called at once.
class DirectLanes final : public DirectCalls {
 public:
  DirectLanes(zmq::context_t& ctx, const NodeOptions& options, uint64_t node_id, Limits limits);
  ~DirectLanes() override;

  bool call(std::string_view name, uint64_t type_id, uint64_t reply_type_id,
            const OutPayload& payload, Clock::time_point deadline, PendingCall& done) override;

  // ---- bridge thread -------------------------------------------------------------------------

  /// The live servers of each imported endpoint, by name (the node imports a name with one
  /// pair of types, and only nodes serving it with those are listed).
  void set_servers(absl::flat_hash_map<std::string, std::vector<DirectServer>> servers);
  /// Node `id` is gone: calls waiting on it fail with `why` (within kDirectSlice).
  void peer_gone(uint64_t id, const absl::Status& why);
  /// No more calls: those waiting fail with Cancelled (within kDirectSlice), idle lanes close
  /// their sockets now and busy ones when their call ends. Before the context is closed.
  void stop();
  /// Adds the lanes' counters to `s` and their traffic to `rows` (the bridge's, copied).
  void add_to(NodeStats& s, TrafficRows& rows) const;

 private:
  struct Lane;
  struct Servers {
    uint64_t generation = 0;
    absl::flat_hash_map<std::string, std::vector<DirectServer>> by_endpoint;
  };
  enum class Wait { kAnswered, kExpired, kFailed };

  /// Waits on `dealer` for the answer to `correlation`; kFailed when the node went or stopped
  /// (`done` was told).
  Wait await(Lane& lane, zmq::socket_t& dealer, const DirectServer& to, std::string_view name,
             uint64_t reply_type_id, uint64_t correlation, Clock::time_point deadline,
             PendingCall& done);
  /// The call over the lane's shared-memory link to `to` (made on first use); nothing when
  /// there is none to be had (the call takes the lane's DEALER then).
  std::optional<Wait> call_linked(Lane& lane, const DirectServer& to, std::string_view name,
                                  uint64_t type_id, uint64_t reply_type_id,
                                  const OutPayload& payload, Clock::time_point deadline,
                                  PendingCall& done, bool& sent);
  /// The lane's link to `to`, made now if it has none; null when none can be made.
  ShmLink* link_to(Lane& lane, const DirectServer& to, Clock::time_point deadline);
  /// Reads one reply frame; true when it answered `correlation` (`done` was told).
  bool on_reply(Lane& lane, const void* envelope, std::size_t envelope_size, const void* payload,
                std::size_t payload_size, const DirectServer& from, std::string_view name,
                uint64_t reply_type_id, uint64_t correlation, PendingCall& done);
  /// Why `server` can no longer answer (peer gone since it was picked, the node stopped); OK
  /// while it can.
  absl::Status gone(const DirectServer& server) const;
  /// Under mu_: the gone_ entry of `server`'s node given up on since it was picked, if any (a
  /// node that comes back keeps its id: calls picked after that do not see the old entry).
  const absl::Status* gone_since_picked(const DirectServer& server) const;
  /// Tells `done` it failed with `why` (counted when its node is gone).
  static void fail(Lane& lane, const absl::Status& why, PendingCall& done);

  zmq::context_t& ctx_;
  const NodeOptions options_;
  ShmSettings shm_;  // lanes link to servers the bridge is linked to
  const uint64_t node_id_;
  const Limits limits_;
  std::atomic<bool> stopped_{false};

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Lane>> idle_;  // under mu_
  std::shared_ptr<const Servers> servers_;   // under mu_
  struct Gone {
    uint64_t id;
    uint64_t generation;  // of the servers when it went
    absl::Status why;
  };
  std::deque<Gone> gone_;                                   // under mu_: recent, bounded
  absl::flat_hash_map<std::string, uint32_t> round_robin_;  // under mu_
  TrafficRows traffic_;                                     // under mu_
  NodeStats counters_;  // under mu_: late_replies, calls_peer_gone, request_frames, malformed...
};

}  // namespace bus::net::detail
