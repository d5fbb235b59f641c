// The ZeroMQ bridge: the same typed channels across processes and hosts, with no broker.
//
//   bus::Bus bus;
//   bus::net::Node node(bus, bus::net::NodeOptions().name("monitor")
//                                .publish_on("tcp://127.0.0.1:7101")
//                                .peer("tcp://127.0.0.1:7001"));
//   node.import_topic(readings).import_endpoint(stats);
//
// Only channels exported or imported here cross the bridge. A handler never knows whether its
// message came from this process or another. Destroy the node before its bus.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bus/bus.hpp"
#include "bus/message.hpp"
#include "bus/net/detail/channels.hpp"
#include "bus/net/options.hpp"
#include "bus/net/stats.hpp"
#include "bus/statsd.hpp"

namespace bus::net {

namespace detail {
class Bridge;
}

/// A message as it crossed the wire, undecoded: for tools that learn types at run time (busctl).
struct RawMessage {
  std::string_view channel;
  uint64_t type_id = 0;
  uint64_t sender = 0;                      // node id
  kj::ArrayPtr<const capnp::word> payload;  // one Cap'n Proto message; valid during the call
};
using RawHandler = absl::AnyInvocable<void(const RawMessage&)>;
using RawReply = absl::AnyInvocable<void(absl::StatusOr<RawMessage>)>;

#define BUS_NET_REQUIRE_CODEC(T)                                                              \
  static_assert(::bus::Bridgeable<T>,                                                         \
                "bus: this channel's message type cannot cross processes: use a Cap'n Proto " \
                "struct (bus::Message<S>) or specialise bus::Codec<T> for it")

class Node {
 public:
  /// Binds the node's sockets and starts its bridge thread. Throws std::runtime_error when a
  /// socket cannot bind (the message names the address and the reason).
  Node(Bus& bus, NodeOptions options);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;
  /// Stops the node (see stop()).
  ~Node();

  /// Local publishes on `topic` go to every node that imports it.
  template <class T>
  Node& export_topic(const Topic<T>& topic) {
    BUS_NET_REQUIRE_CODEC(T);
    return add(std::make_unique<detail::ExportTopic<T>>(topic));
  }
  /// Publishes of other nodes on `topic` reach local subscribers.
  template <class T>
  Node& import_topic(const Topic<T>& topic) {
    BUS_NET_REQUIRE_CODEC(T);
    return add(std::make_unique<detail::ImportTopic<T>>(topic));
  }
  /// Other nodes may send to local consumers of `queue`.
  template <class T>
  Node& export_queue(const Queue<T>& queue) {
    BUS_NET_REQUIRE_CODEC(T);
    return add(std::make_unique<detail::ExportQueue<T>>(queue));
  }
  /// Subscribes `handler(const T&)` to `topic` on the bridge thread and imports the topic. A
  /// message from another node reaches it as soon as the bridge reads it: no copy into a ring,
  /// no thread hop (a subscriber on an executor costs one). In-process publishes reach it too,
  /// through the bridge's inbox. For short handlers that never block: while one runs, the node
  /// moves no traffic. It is unsubscribed when the node stops.
  template <class T, class F>
  requires std::invocable<F&, const T&> Node& subscribe(const Topic<T>& topic, F&& handler) {
    BUS_NET_REQUIRE_CODEC(T);
    return add(std::make_unique<detail::ImportTopic<T>>(
        topic, typename detail::ImportTopic<T>::Handler(std::forward<F>(handler))));
  }
  /// Local sends on `queue` may go to consumers on other nodes (they take turns with local ones).
  template <class T>
  Node& import_queue(const Queue<T>& queue) {
    BUS_NET_REQUIRE_CODEC(T);
    return add(std::make_unique<detail::ImportQueue<T>>(queue));
  }
  /// Other nodes may call local servers of `endpoint`.
  template <class Req, class Rep>
  Node& export_endpoint(const Endpoint<Req, Rep>& endpoint) {
    BUS_NET_REQUIRE_CODEC(Req);
    BUS_NET_REQUIRE_CODEC(Rep);
    return add(std::make_unique<detail::ExportEndpoint<Req, Rep>>(endpoint));
  }
  /// Serves `endpoint` on the bridge thread and exports it. `handler(Req&&)` returns Rep or
  /// absl::StatusOr<Rep>, as with Bus::serve(). A request from another node runs it as soon as
  /// the bridge reads it, and the reply leaves in the same pass: no thread hop on this side,
  /// where a server on an executor costs two. In-process requests reach it too, through the
  /// bridge's inbox, and it takes turns with the endpoint's other local servers. For short
  /// handlers that never block (Bus::call() is refused there): while one runs, the node moves no
  /// traffic.
  /// It stops serving when the node stops.
  template <class Req, class Rep, class F>
  requires std::invocable<F&, Req&&> Node& serve(const Endpoint<Req, Rep>& endpoint, F&& handler) {
    BUS_NET_REQUIRE_CODEC(Req);
    BUS_NET_REQUIRE_CODEC(Rep);
    return add(std::make_unique<detail::ExportEndpoint<Req, Rep>>(
        endpoint, typename detail::ExportEndpoint<Req, Rep>::Handler(
                      [f = std::forward<F>(handler)](Req&& r) mutable {
                        return ::bus::detail::invoke_handler<Rep>(f, std::move(r));
                      })));
  }
  /// Local requests on `endpoint` may go to live nodes that serve it (round-robin with local
  /// servers). A request whose node dies fails with Aborted ("peer gone") at once.
  template <class Req, class Rep>
  Node& import_endpoint(const Endpoint<Req, Rep>& endpoint) {
    BUS_NET_REQUIRE_CODEC(Req);
    BUS_NET_REQUIRE_CODEC(Rep);
    return add(std::make_unique<detail::ImportEndpoint<Req, Rep>>(endpoint));
  }

  // ---- untyped access, for tools (busctl): types are schema ids known at run time ----------

  /// Topic messages of other nodes on `topic` (empty: every topic this node hears), whatever
  /// their type, go to `fn` on the bridge thread. Not announced to peers as an import.
  Node& tap(std::string topic, RawHandler fn);
  /// Sends one message of `type_id` on `topic` straight to every live node that imports it (over
  /// their request sockets: they need not listen to this node). Returns how many nodes it went
  /// to; Unavailable when none imports it, InvalidArgument when they import another type.
  absl::StatusOr<std::size_t> publish_raw(std::string topic, uint64_t type_id, std::string payload);
  /// Calls `endpoint` with a request of `type_id`, expecting `reply_type_id`, on node `peer` (0:
  /// a live node that serves it with those types). `done` runs once, on the bridge thread.
  void call_raw(std::string endpoint, uint64_t type_id, uint64_t reply_type_id, uint64_t peer,
                std::string payload, Clock::duration timeout, RawReply done);

  /// Listens to one more node (like NodeOptions::peer, at run time).
  Node& peer(std::string address, std::string public_key = {});

  /// This node's id (random, new at every start).
  uint64_t id() const;
  /// The addresses actually bound (a `*` port resolved).
  std::string publish_address() const;
  std::string request_address() const;
  [[deprecated("renamed publish_address()")]] std::string publish_endpoint() const {
    return publish_address();
  }
  [[deprecated("renamed request_address()")]] std::string request_endpoint() const {
    return request_address();
  }

  /// Live peers, and traffic counters.
  std::vector<PeerInfo> peers() const;
  NodeStats stats() const;
  /// Remote subscriptions to `topic` on this node's publisher (one per subscribed node).
  std::size_t subscribers(std::string_view topic) const;
  /// Waits until `n` remote nodes subscribe to `topic` (the slow-joiner wait before a first
  /// publish) or `timeout` passes. True when they did. Any subscriber counts (a `busctl sub`
  /// too): to wait for particular nodes, name them.
  bool wait_for_subscribers(std::string_view topic, std::size_t n,
                            std::chrono::milliseconds timeout) const;
  /// Waits until the live nodes called `names` import `topic` (their heartbeats say so) and
  /// their subscriptions have reached this node's publisher (at least as many as the live nodes
  /// importing it), or `timeout` passes. True when they did.
  bool wait_for_subscribers(std::string_view topic, const std::vector<std::string>& names,
                            std::chrono::milliseconds timeout) const;
  /// Waits until a live peer serves `channel` (an endpoint or queue) or `timeout` passes.
  bool wait_for_server(std::string_view channel, std::chrono::milliseconds timeout) const;

  /// Says goodbye to peers (a last heartbeat marked leaving), publishes what was accepted, fails
  /// pending requests with Cancelled and stops the bridge thread. Idempotent.
  void stop();

 private:
  Node& add(std::unique_ptr<detail::Bridged> channel);
  std::unique_ptr<detail::Bridge> bridge_;
};

#undef BUS_NET_REQUIRE_CODEC

/// A node's counters for a bus::StatsdExporter (the node must outlive the exporter).
StatsdSource statsd_source(const Node& node);

}  // namespace bus::net
