// How a bridge node binds, whom it listens to, and the limits it enforces on what it reads.
#pragma once

#include <absl/status/statusor.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bus::net {

/// A CURVE key pair in Z85 text (40 characters each), as zmq_curve_keypair() makes them.
struct CurveKeys {
  std::string public_key;
  std::string secret_key;
  /// A fresh key pair (libsodium through libzmq).
  static CurveKeys generate();
};

/// How a node reaches its peers (NodeOptions::transport).
enum class Transport {
  kAuto,          // shared memory with peers on this host, ZeroMQ with the others (the default)
  kZeroMq,        // ZeroMQ with every peer
  kSharedMemory,  // as kAuto, but a link that fails is tried again at every heartbeat instead of
                  // leaving that peer on ZeroMQ
};

/// Another node to listen to: the address its publisher binds (`tcp://host:port`, `ipc://path`)
/// and, when CURVE is on, its public key.
struct Peer {
  std::string address;
  std::string public_key;
};

/// Node parameters, with fluent setters:
///   bus::net::NodeOptions().name("aggregator").publish_on("tcp://*:7001")
///       .requests_on("tcp://*:7002").advertise("tcp://10.0.0.5:7002").peer("tcp://10.0.0.4:7001")
class NodeOptions {
 public:
  /// A readable name for logs and `peers()`.
  NodeOptions& name(std::string n) {
    name_ = std::move(n);
    return *this;
  }
  /// Where this node's publisher binds (topics and heartbeats go out here). Required.
  NodeOptions& publish_on(std::string address) {
    publish_on_ = std::move(address);
    return *this;
  }
  /// Where this node's request socket binds (requests and queue messages come in here).
  /// Required when it exports endpoints or queues; a port of 0 (`tcp://127.0.0.1:*`) is fine.
  NodeOptions& requests_on(std::string address) {
    requests_on_ = std::move(address);
    return *this;
  }
  /// The request address other nodes should connect to, when it differs from what was bound
  /// (a wildcard `tcp://*:7002` binds every interface; peers need a real address).
  NodeOptions& advertise(std::string address) {
    advertise_ = std::move(address);
    return *this;
  }
  /// The publish address other nodes should connect to, when it differs from what was bound
  /// (what etcd registration tells them). Default: the bound address, with a wildcard host
  /// replaced by advertise()'s host, or else by this host's first non-loopback address.
  NodeOptions& advertise_publish(std::string address) {
    advertise_publish_ = std::move(address);
    return *this;
  }
  /// A node to listen to. Peers may start in any order and restart at any time. A host name
  /// (`tcp://bus.default.svc:7001`) is resolved again every resolve_every(), and every address
  /// it gives is a peer (a Kubernetes headless service's pattern): one that stops being given is
  /// dropped after heartbeat() x dead_after. `public_key` then holds for every address.
  NodeOptions& peer(std::string address, std::string public_key = {}) {
    peers_.push_back(Peer{std::move(address), std::move(public_key)});
    return *this;
  }
  /// How often peers given by host name are resolved again. Default 1 s.
  NodeOptions& resolve_every(std::chrono::milliseconds every) {
    resolve_every_ = every;
    return *this;
  }
  /// Finds peers through etcd (its v3 API, over the JSON gateway every etcd serves on its client
  /// port): registers this node under `prefix` + its id in hex (name, addresses, key, what it
  /// exports, serves and imports) with a lease of heartbeat() x dead_after (at least 5 s: the
  /// lease says whom to listen to, heartbeats say who is alive) kept alive every third of it,
  /// and listens to every node registered there, adding and dropping them as
  /// they come and go. `endpoints`: `http://host:port` of etcd members, tried in turn. While
  /// etcd cannot be reached the node keeps its peers, and registers again when it can.
  NodeOptions& etcd(std::vector<std::string> endpoints, std::string prefix = "/bus/") {
    etcd_ = std::move(endpoints);
    etcd_prefix_ = std::move(prefix);
    return *this;
  }
  /// With etcd(): false finds the nodes without registering this one (a tool, like busctl).
  NodeOptions& etcd_register(bool on) {
    etcd_register_ = on;
    return *this;
  }
  /// With etcd(): listen only to the registered nodes this one shares a channel with (one
  /// exports or serves what the other imports, by name) instead of to every node. What keeps a
  /// node's idle cost to the nodes it works with past a few dozen nodes; a channel added later
  /// re-registers the node and adds the nodes it now shares with.
  NodeOptions& etcd_related_only(bool on) {
    etcd_related_only_ = on;
    return *this;
  }
  /// Heartbeat period, and how many may be missed before a node is declared dead.
  NodeOptions& heartbeat(std::chrono::milliseconds every, unsigned dead_after_missed = 3) {
    heartbeat_ = every;
    dead_after_ = dead_after_missed;
    return *this;
  }
  /// Largest payload accepted (bytes); larger ones are dropped and counted.
  NodeOptions& max_message_bytes(std::size_t n) {
    max_message_bytes_ = n;
    return *this;
  }
  /// Largest message on `channel` (bytes), in place of max_message_bytes() for it: one this node
  /// would send is not sent, one it receives is not taken; both are counted (`oversized`) and
  /// logged once, naming the channel and the limit. Above max_message_bytes() it raises the
  /// limit for that channel alone (the wire takes what the largest limit allows).
  NodeOptions& message_limit(std::string channel, std::size_t bytes) {
    message_limits_.emplace_back(std::move(channel), bytes);
    return *this;
  }
  /// Cap'n Proto reader limits applied to every payload read from the wire.
  NodeOptions& reader_limits(uint64_t traversal_words, int nesting) {
    traversal_limit_words_ = traversal_words;
    nesting_limit_ = nesting;
    return *this;
  }
  /// Encrypts and authenticates every connection with CURVE. Only nodes whose public key is in
  /// `allow` may connect (enforced by a ZAP handler); an empty allowlist admits no one.
  NodeOptions& curve(CurveKeys keys, std::vector<std::string> allow) {
    curve_ = std::move(keys);
    allow_ = std::move(allow);
    return *this;
  }
  /// How long the publisher holds its output back for a subscriber whose queue is full before
  /// it sends on without it. ZeroMQ then drops that subscriber's copies only (until its queue
  /// has room again), and the subscriber counts what it missed as sequence gaps. While it holds,
  /// every other subscriber waits too and local publishers feel the back-pressure through the
  /// bounded rings, so keep it short, and well under heartbeat() x dead_after. 0: never hold.
  NodeOptions& send_stall_limit(std::chrono::milliseconds d) {
    stall_limit_ = d;
    return *this;
  }
  /// Frames queued for each subscription, at each end: for each subscriber in the publisher
  /// (ZMQ_SNDHWM; past it the subscriber counts as full) and for each publisher in the
  /// subscriber (ZMQ_RCVHWM). A frame holds up to 32 KiB of messages, or one larger message.
  /// With the socket buffers, this is what a subscriber may fall behind by without loss (and
  /// then send_stall_limit()), what memory one that stops reading costs its publisher, and how
  /// stale a slow reader's input gets.
  NodeOptions& subscription_queue(int frames) {
    subscription_queue_ = frames;
    return *this;
  }
  /// A subscriber whose connection shows no sign of life for this long (ZMTP heartbeats, which
  /// its ZeroMQ answers by itself while it reads) is disconnected, and what was queued for it is
  /// freed; it reconnects by itself once it reads again (and counts what it missed). Default 0:
  /// never (a subscriber that stops reading then holds at most subscription_queue() frames here
  /// until its process or its host goes). Off by default because libzmq 4.3.4 (Debian 12's) can
  /// abort the process at the other end of a connection its heartbeat timeout resets while that
  /// end's input is stopped (zeromq/libzmq#4364, #4767; seen here in nodes starting under load,
  /// docs/wire-protocol.md §6). Each ping also wakes both ends' ZeroMQ threads.
  NodeOptions& subscriber_timeout(std::chrono::milliseconds d) {
    subscriber_timeout_ = d;
    return *this;
  }
  /// How long one TCP connect to a peer may take before it is given up and tried again (100 ms
  /// later). Short, so that the first attempt after a network partition heals gets through
  /// instead of waiting on the kernel's SYN retries (1, 2, 4 ... s apart); long enough for the
  /// slowest network between the nodes (a round trip well under it). Default 1 s; 0: the
  /// kernel's own (minutes).
  NodeOptions& connect_timeout(std::chrono::milliseconds d) {
    connect_timeout_ = d;
    return *this;
  }

  /// How peers are reached. kAuto: a peer on this host (same kernel boot, IPC and network
  /// namespaces) is linked over shared memory when both nodes take links and run as one user (or
  /// share shm_group()), the others over ZeroMQ; a link that cannot be made leaves that peer on
  /// ZeroMQ (logged, counted). kZeroMq: never shared memory. A node with CURVE on uses ZeroMQ
  /// only: shared memory authenticates by user, not by key.
  NodeOptions& transport(Transport t) {
    transport_ = t;
    return *this;
  }
  /// Each end's ring of a shared-memory link (bytes, a power of two, 256 KiB to 1 GiB): what a
  /// reader may fall behind by before it counts as full (send_stall_limit, then passed over).
  /// Reserved when the link is made. Default 256 KiB.
  NodeOptions& shm_ring_bytes(std::size_t bytes) {
    shm_ring_bytes_ = bytes;
    return *this;
  }
  /// The most the process's shared-memory heap may grow to: large messages (16 KiB and more)
  /// are built there, so that peers on this host read them in place. It grows as needed, each
  /// piece reserved when made. Default 512 MiB; a process takes the largest any of its nodes asks.
  NodeOptions& shm_heap_limit(std::size_t bytes) {
    shm_heap_limit_ = bytes;
    return *this;
  }
  /// How long a reader of shared memory polls before it sleeps (in poll(2) or on a futex): the
  /// latency of a message that comes while it polls is a cache-line transfer, after it a wake-up.
  /// Default 50 us; an idle link costs nothing once it sleeps.
  NodeOptions& shm_spin(std::chrono::microseconds spin) {
    shm_spin_ = spin;
    return *this;
  }
  /// Lets processes of group `gid` link too (segments 0640, of that group). Default -1: only
  /// processes of this node's user (segments 0600).
  NodeOptions& shm_group(int gid) {
    shm_group_ = gid;
    return *this;
  }

  /// Reads options from a small config text, one `key = value` per line. `#` comments a line
  /// that starts with it, or the rest of a line after a value and a blank; a '#' in a value
  /// (Z85 keys have them) is kept:
  ///   name = aggregator
  ///   publish = tcp://*:7411          requests = tcp://*:7412     advertise = tcp://10.0.0.5:7412
  ///   peer = tcp://10.0.0.4:7401 [public-key]   (one line per peer; a host name is resolved
  ///                                              again every resolve_every_ms = 1000)
  ///   etcd = http://10.0.0.9:2379 (one line per etcd member)   etcd_prefix = /bus/
  ///   etcd_register = true            etcd_related_only = false
  ///   advertise_publish = tcp://10.0.0.5:7411
  ///   heartbeat_ms = 200              dead_after = 3
  ///   max_message_bytes = 1048576     traversal_limit_words = 8388608   nesting_limit = 64
  ///   message_limit = <channel> <bytes>   (one line per channel)
  ///   curve_public = ...              curve_secret = ...          allow = <key> (one per line)
  ///   send_stall_limit_ms = 100       subscription_queue = 64       subscriber_timeout_ms = 0
  ///   connect_timeout_ms = 1000
  ///   transport = auto|zmq|shm        shm_ring_bytes = 262144       shm_heap_limit = 536870912
  ///   shm_spin_us = 50                shm_group = <group name or gid>
  /// InvalidArgument names the line and what is wrong with it.
  static absl::StatusOr<NodeOptions> parse(std::string_view config);
  /// parse() of a file's contents; NotFound when it cannot be read.
  static absl::StatusOr<NodeOptions> load(const std::string& path);

  const std::string& name() const { return name_; }
  const std::string& publish_on() const { return publish_on_; }
  const std::string& requests_on() const { return requests_on_; }
  const std::string& advertise() const { return advertise_; }
  const std::string& advertise_publish() const { return advertise_publish_; }
  const std::vector<Peer>& peers() const { return peers_; }
  std::chrono::milliseconds resolve_every() const { return resolve_every_; }
  const std::vector<std::string>& etcd() const { return etcd_; }
  const std::string& etcd_prefix() const { return etcd_prefix_; }
  bool etcd_register() const { return etcd_register_; }
  bool etcd_related_only() const { return etcd_related_only_; }
  /// heartbeat() x dead_after: how long a silent peer (or an address DNS no longer gives) lasts.
  std::chrono::milliseconds dead_after_time() const { return heartbeat_ * dead_after_; }
  std::chrono::milliseconds heartbeat() const { return heartbeat_; }
  unsigned dead_after() const { return dead_after_; }
  std::size_t max_message_bytes() const { return max_message_bytes_; }
  const std::vector<std::pair<std::string, std::size_t>>& message_limits() const {
    return message_limits_;
  }
  /// The limit of `channel`: its message_limit(), else max_message_bytes().
  std::size_t message_limit_of(std::string_view channel) const {
    for (const auto& [name, bytes] : message_limits_) {
      if (name == channel) return bytes;
    }
    return max_message_bytes_;
  }
  /// The largest of every limit: what a frame may hold.
  std::size_t largest_message() const {
    std::size_t n = max_message_bytes_;
    for (const auto& [name, bytes] : message_limits_) n = std::max(n, bytes);
    return n;
  }
  uint64_t traversal_limit_words() const { return traversal_limit_words_; }
  int nesting_limit() const { return nesting_limit_; }
  const CurveKeys& curve_keys() const { return curve_; }
  const std::vector<std::string>& allow() const { return allow_; }
  bool secure() const { return !curve_.secret_key.empty(); }
  std::chrono::milliseconds send_stall_limit() const { return stall_limit_; }
  int subscription_queue() const { return subscription_queue_; }
  std::chrono::milliseconds subscriber_timeout() const { return subscriber_timeout_; }
  std::chrono::milliseconds connect_timeout() const { return connect_timeout_; }
  Transport transport() const { return transport_; }
  /// Whether this node takes shared-memory links (not with CURVE, nor when told kZeroMq).
  bool shares_memory() const { return transport_ != Transport::kZeroMq && !secure(); }
  std::size_t shm_ring_bytes() const { return shm_ring_bytes_; }
  std::size_t shm_heap_limit() const { return shm_heap_limit_; }
  std::chrono::microseconds shm_spin() const { return shm_spin_; }
  int shm_group() const { return shm_group_; }

 private:
  std::string name_ = "node";
  std::string publish_on_;
  std::string requests_on_;
  std::string advertise_;
  std::string advertise_publish_;
  std::vector<Peer> peers_;
  std::chrono::milliseconds resolve_every_{1000};
  std::vector<std::string> etcd_;
  std::string etcd_prefix_;
  bool etcd_register_ = true;
  bool etcd_related_only_ = false;
  std::chrono::milliseconds heartbeat_{200};
  unsigned dead_after_ = 3;
  std::size_t max_message_bytes_ = 1 << 20;
  std::vector<std::pair<std::string, std::size_t>> message_limits_;
  uint64_t traversal_limit_words_ = 8 << 20;
  int nesting_limit_ = 64;
  CurveKeys curve_;
  std::vector<std::string> allow_;
  std::chrono::milliseconds stall_limit_{100};
  int subscription_queue_ = 64;
  std::chrono::milliseconds subscriber_timeout_{0};
  std::chrono::milliseconds connect_timeout_{1000};
  Transport transport_ = Transport::kAuto;
  std::size_t shm_ring_bytes_ = 256 * 1024;
  std::size_t shm_heap_limit_ = std::size_t{512} << 20;
  std::chrono::microseconds shm_spin_{50};
  int shm_group_ = -1;
};

}  // namespace bus::net
