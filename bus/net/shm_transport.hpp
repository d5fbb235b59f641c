// The shared-memory transport: how a node's bridge reaches peers on its own host. It listens on
// an abstract Unix socket named after the node; a peer that hears the node's heartbeat (over
// ZeroMQ, as every peer first does) and finds it on the same host connects there, and the two
// make a link: two rings in shared memory, one written by each end, plus the socket, whose end
// says the other process is gone. Over a link go the frames ZeroMQ would carry, unchanged; large
// payloads stay in the sender's heap and are read in place. Links made and ended:
// shm_transport.cpp; sending: shm_transport_send.cpp; polling and reading:
// shm_transport_receive.cpp.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bus/net/options.hpp"
#include "frames.hpp"
#include "shm_link.hpp"
#include "zmq_transport.hpp"

namespace bus::net::detail {

class ShmTransport {
 public:
  /// What the bridge hears of links coming and going.
  class Events {
   public:
    /// A link to bridge node `peer` is up (whoever made it): `link` reaches its requests.
    virtual void on_link_up(uint64_t link, uint64_t peer, const std::string& publish_address) = 0;
    /// The link to `peer` is gone: `died` when its process ended (no goodbye came first).
    /// `publisher` (the link's subscriber) goes with it.
    virtual void on_link_down(uint64_t link, uint64_t peer, bool died, const std::string& why,
                              const Subscribers* publisher) = 0;

   protected:
    ~Events() = default;
  };

  ShmTransport(const NodeOptions& options, uint64_t node_id, FrameSink& sink, Events& events);
  ~ShmTransport();

  /// Listens for links (after the node's publisher is bound: its address goes in hellos).
  /// Throws std::runtime_error when the socket cannot be bound.
  void start(int wake_fd, std::string publish_address);
  /// Says goodbye on every link and closes them.
  void close();
  bool on() const { return listener_ >= 0; }

  /// Makes a link to `node` (which said it listens at `shm_socket_name(node)`), unless there is
  /// one (or one on the way). Failures are logged once and counted; the peer keeps ZeroMQ.
  void connect(uint64_t node, const std::string& name);
  /// True while a link to bridge node `node` is up.
  bool linked(uint64_t node) const;
  /// Takes `prefix`'s topic frames of `node` over the link from now on (or stops).
  void subscribe(uint64_t node, const std::string& prefix, bool on);

  // ---- sending -------------------------------------------------------------------------------

  /// The subscribers over links, for a published frame (those that take its channel).
  void subscribers_of(const OutFrame& frame, std::vector<Subscribers*>& out);
  /// The route to bridge node `node`'s requests over its link (null: no link).
  PeerRoute* route(uint64_t node);
  /// The id of the link to bridge node `node` (0: none).
  uint64_t link_of(uint64_t node) const;
  /// A reply frame to `link`; counted unroutable when the link is gone or its backlog is full.
  void reply(uint64_t link, std::string_view channel, const std::string& envelope,
             std::string_view payload, const bus::detail::MessageRef& large, std::size_t replies);
  /// Remote subscriptions to `topic` over links (one per subscribed node).
  std::size_t subscribers(std::string_view topic) const;
  /// ZeroMQ subscriptions to `topic` of nodes whose handover to a link is done: they go soon,
  /// and meanwhile those nodes are not counted twice.
  std::size_t leaving(std::string_view topic) const;
  /// A ZeroMQ subscription to `topic` went: one of those leaving, if any.
  void left_zmq(const std::string& topic);
  /// Nodes that take this node's heartbeats over a link: a heartbeat names them (`handover`),
  /// and the first that does is the first frame their link carries (their handover from
  /// ZeroMQ).
  std::vector<uint64_t> handovers() const;
  /// Wakes the ends that were written to since the last call.
  void wake_written();

  // ---- the loop ----------------------------------------------------------------------------

  /// Adds the sockets to `set`; true when a link has frames to read already.
  bool prepare(PollSet& set);
  /// Reads what the sockets say (new links, handshakes, extents, ends) and every link's frames.
  void read(const PollSet& set);
  /// Reads every link's frames only (a stopping node's last words).
  void read_links();
  /// Sends what waited for room in the rings.
  void flush();
  /// Frames waiting for room, over every link.
  std::size_t backlogged() const { return backlogged_; }
  /// True when a link has frames to read (no syscall: for a loop that spins).
  bool has_input() const;
  /// Before the loop sleeps in poll: every link's reader is marked asleep. False when input
  /// came meanwhile (do not sleep).
  bool sleep();
  /// After it woke.
  void awake();
  /// Whether frames of bridge node `node` wait unread on its link (it is not silent).
  bool input_waiting(uint64_t node) const;
  std::size_t links() const { return up_; }
  /// Bytes of this node's heap blocks that peers still read in place.
  std::size_t pinned_bytes() const;

 private:
  struct Link;
  class Publisher;
  class Route;
  enum class State { kAccepted, kHello, kUp };
  Link* find(uint64_t id);
  Link* by_node(uint64_t node) const;
  bool allowed(const ShmLink::Hello& hello) const;
  void accept();
  void on_socket(Link& l);
  void finish_accept(Link& l);
  void finish_connect(Link& l);
  void up(Link& l);
  void read_frames(Link& l);
  /// Writes a frame to `l` now (a heap block for a large payload): false when there is no room.
  bool write(Link& l, std::string_view channel, const std::string& envelope,
             std::string_view payload, const bus::detail::MessageRef& large);
  /// Writes `type` (kData: a point-to-point frame; kSubscribe, kUnsubscribe) now, or keeps it in
  /// the link's backlog, in order, while there is no room. False when the backlog is full.
  bool send_or_keep(Link& l, shm::FrameType type, std::string_view channel, std::string envelope,
                    std::string_view payload, bus::detail::MessageRef large, std::size_t replies);
  void drop(Link& l, bool died, const std::string& why);
  void reap();

  const NodeOptions& opt_;
  const uint64_t id_;
  FrameSink& sink_;
  Events& events_;
  ShmSettings settings_;
  int listener_ = -1;
  int wake_fd_ = -1;
  std::string publish_address_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Link>> links_;  // by link id
  absl::flat_hash_map<uint64_t, uint64_t> by_node_;             // bridge node -> link id
  absl::flat_hash_set<uint64_t> refused_;  // nodes that failed a link: ZeroMQ from now on
  uint64_t next_link_ = 1;
  std::size_t up_ = 0;
  std::size_t backlogged_ = 0;
  std::vector<uint64_t> dead_;  // links dropped during this pass, freed by reap()
  absl::flat_hash_map<std::string, std::size_t> leaving_;  // see leaving()
  std::size_t at_listener_ = 0;
  std::vector<std::pair<uint64_t, std::size_t>> polled_;  // link id, PollSet index
  std::string envelope_;                                  // reused
};

}  // namespace bus::net::detail
