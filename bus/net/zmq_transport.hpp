// The ZeroMQ transport: a node's sockets (XPUB out, SUB in, ROUTER for requests, a DEALER per
// peer, ZAP for CURVE) and how the bridge loop polls them. Peers on other hosts use it, and
// every peer's heartbeats reach a node here first. The sockets and who may connect:
// zmq_transport.cpp; sending: zmq_transport_send.cpp; polling and reading:
// zmq_transport_receive.cpp.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <poll.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "bus/net/options.hpp"
#include "frames.hpp"
#include "peers.hpp"

namespace bus::net::detail {

using Parts = std::vector<zmq::message_t>;
/// Reads one multipart message without waiting (false: none), keeping at most `max_parts`.
bool recv(zmq::socket_t& s, Parts& parts, std::size_t max_parts = 5);
/// A DEALER toward a node's ROUTER (`server_key`: its CURVE public key, when `opt` is secure).
std::unique_ptr<zmq::socket_t> make_dealer(zmq::context_t& ctx, const NodeOptions& opt,
                                           const std::string& server_key);

// absl::string_view: Debian's Abseil does not alias it to std::string_view, and its hash maps
// look it up without a copy.
inline absl::string_view view(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

/// The channel, envelope and payload parts of a multipart message from `first` on, as read from
/// `stream` (valid while `parts` lives).
inline InFrame frame_of(Parts& parts, std::size_t first, Stream stream) {
  InFrame f;
  f.stream = stream;
  f.channel = view(parts[first]);
  f.envelope = parts[first + 1].data();
  f.envelope_size = parts[first + 1].size();
  f.payload = parts[first + 2].data();
  f.payload_size = parts[first + 2].size();
  return f;
}

/// The file descriptors one pass of the bridge loop waits on.
struct PollSet {
  std::vector<pollfd> fds;
  std::size_t add(int fd, short events) {
    fds.push_back({fd, events, 0});
    return fds.size() - 1;
  }
  bool in(std::size_t i) const { return (fds[i].revents & POLLIN) != 0; }
};

class ZmqTransport {
 public:
  ZmqTransport(const NodeOptions& options, uint64_t node_id, FrameSink& sink);
  ~ZmqTransport();

  /// Binds the publisher and request sockets. Throws std::runtime_error naming the address.
  void start();
  /// Closes every socket and the context (waits up to the linger for queued frames).
  void close();
  zmq::context_t& context() { return ctx_; }
  const std::string& publish_address() const { return publish_address_; }
  const std::string& request_address() const { return request_address_; }

  // ---- listening to publishers -----------------------------------------------------------

  /// Connects the subscriber to `peer`'s publisher. Throws std::invalid_argument for an address
  /// ZeroMQ refuses or a CURVE peer without a key; a key not in the allowlist is not listened to.
  void listen(const Peer& peer);
  /// Disconnects the subscriber from `address` (nothing when it was not connected).
  void unlisten(const std::string& address);
  /// A new connection to the publisher listened to at `address` (with the key it was listened
  /// with) in place of the one there is: what the old one still held unread is dropped (counted
  /// as gaps by the sequence numbers). False (and the old one kept) when it is not listened to.
  bool relisten(const std::string& address);
  /// Takes (or stops taking) topic messages whose channel starts with `prefix`.
  void filter(const std::string& prefix, bool on);
  /// True while the subscriber holds frames not read yet (this node is behind).
  bool behind();
  /// Whether `p`'s frames may still wait in the subscriber, `topic_frames` having been read from
  /// it so far (see PeerState::frames_at_seen): with input waiting, a peer is silent only if
  /// kFairFrames frames of others were read since its last one.
  static bool input_waiting(const PeerState& p, bool behind, uint64_t topic_frames);

  // ---- requests, replies, publishing -----------------------------------------------------

  /// A DEALER to `peer`'s ROUTER at `address`; null (logged) when ZeroMQ refuses the address.
  PeerRoute* open_route(uint64_t peer, const std::string& name, const std::string& address,
                        const std::string& public_key);
  /// Closes the DEALER to `peer`; what its backlog still held is counted as refused.
  void close_route(uint64_t peer);
  /// The DEALER to `peer` (null: none).
  PeerRoute* route(uint64_t peer);
  /// Queues a reply frame for the ROUTER (in order behind those waiting for room).
  void reply(const std::string& identity, std::string_view channel, const std::string& envelope,
             std::string_view payload, std::size_t replies);
  /// The publisher, as the publish gate sees it.
  Subscribers& publisher();
  /// Remote subscriptions to `topic` (one per subscribed node).
  std::size_t subscribers(std::string_view topic) const;

  // ---- the loop ----------------------------------------------------------------------------

  /// Adds the sockets to `set`; true when one has input (or room) already.
  bool prepare(PollSet& set);
  /// Reads topics, requests and replies (within the read budget).
  void read_traffic(const PollSet& set);
  /// Reads subscriptions and ZAP requests.
  void read_control(const PollSet& set);
  /// Sends what waited for room: peers' backlogs, then replies.
  void flush();
  /// Messages in peers' backlogs; reply frames waiting for room.
  std::size_t backlogged() const { return backlogged_; }
  std::size_t replies_waiting() const { return reply_backlog_.size(); }
  /// Every socket is asked for its events on the next pass, whatever their ZMQ_FDs say.
  void ask_all() { ask_all_ = true; }
  /// Waits up to `bound` for the subscriber's input and reads it (a stopping node's last words).
  void read_topics_for(std::chrono::milliseconds bound);

 private:
  class Publisher;
  class Route;
  /// A send, a connect or a read that stopped before the socket was empty may leave it holding
  /// input that its ZMQ_FD no longer signals: the loop asks it for its events before it polls.
  void touched(void* socket_handle) {
    if (touched_.empty() || touched_.back() != socket_handle) touched_.push_back(socket_handle);
  }
  /// Sends a multipart message; false if the first part was refused (the pipe is full).
  bool send_all(zmq::socket_t& s, Parts& parts);
  void on_sub(Parts& parts);
  void on_router(Parts& parts);
  void on_dealer(Parts& parts);
  void on_xpub(const zmq::message_t& m);
  void on_zap();
  void flush_replies();
  bool allowed(const std::string& public_key) const;

  const NodeOptions& opt_;
  const uint64_t id_;
  FrameSink& sink_;
  zmq::context_t ctx_;
  std::optional<zmq::socket_t> xpub_, sub_, router_, zap_;
  std::unique_ptr<Publisher> publisher_;
  std::string publish_address_;
  std::string request_address_;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Route>> routes_;  // by peer id
  std::size_t backlogged_ = 0;                                    // messages in routes' backlogs
  // Reply frames the ROUTER did not take yet, with the replies each holds.
  std::deque<std::pair<Parts, std::size_t>> reply_backlog_;
  absl::flat_hash_map<std::string, std::size_t> subscribers_;  // remote ones, through XPUB
  absl::flat_hash_map<std::string, std::string> listened_;     // address -> its CURVE key
  std::vector<void*> touched_;  // sockets to ask for their events before the next poll
  bool ask_all_ = false;
  Parts parts_;
  // Indices into this pass's PollSet.
  std::size_t at_xpub_ = 0, at_sub_ = 0, at_router_ = 0, at_zap_ = 0, at_dealers_ = 0;
  std::vector<uint64_t> dealers_;  // this pass's dealers, by PollSet index - at_dealers_
  std::vector<bool> ready_;        // by PollSet index - at_xpub_: has input to read this pass
  bool router_held_ = false;
};

}  // namespace bus::net::detail
