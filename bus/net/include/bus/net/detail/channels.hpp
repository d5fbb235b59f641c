// The typed adapters between a channel and the bridge: one per channel and direction. They run
// on the bridge thread only; the bridge (bus/net/bridge.hpp) sees them through `Bridged`.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <kj/exception.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "bus/bus.hpp"
#include "bus/message.hpp"

namespace bus::net::detail {

struct Limits {
  std::size_t max_message_bytes;
  uint64_t traversal_limit_words;
  int nesting_limit;
};

/// Appends the builder's message to `out` in Cap'n Proto stream framing.
void append_message(capnp::MessageBuilder& builder, std::string& out);
/// Reader options for `limits`.
capnp::ReaderOptions reader_options(const Limits& limits);
std::string describe(const kj::Exception& e);

/// Messages this large or larger go alone in their frame, as they are (a peer that shares memory
/// reads them in place); smaller ones are batched, many to a frame of up to this size.
inline constexpr std::size_t kLargeMessageBytes = bus::detail::kSharedBufferBytes;

/// One message on its way out: its bytes, or, for a large Message (kLargeMessageBytes and more),
/// the message itself, which a peer that shares memory with this process reads in place.
struct OutPayload {
  std::string bytes;
  bus::detail::MessageRef large;
  std::string_view view() const {
    if (!large) return bytes;
    auto w = large.words();
    return {reinterpret_cast<const char*>(w.begin()), w.size() * sizeof(capnp::word)};
  }
  std::size_t size() const { return view().size(); }
};

/// Words that lie in a peer's shared memory while the bridge hands them over: a decoder may
/// keep them (a Message that reads them in place) instead of copying them.
class PayloadHold {
 public:
  /// True when `words` lie in the held block.
  virtual bool covers(kj::ArrayPtr<const capnp::word> words) const = 0;
  /// A keeper for one more message on the block (released with its last copy); null when
  /// none can be had (the decoder copies).
  virtual bus::detail::WordsKeeper* keep() = 0;

 protected:
  ~PayloadHold() = default;
};
/// The hold of the payload being handed over on this thread (the bridge's), or null.
PayloadHold*& current_hold();
/// Sets current_hold() for a scope.
class HoldScope {
 public:
  explicit HoldScope(PayloadHold* h) : was_(current_hold()) { current_hold() = h; }
  HoldScope(const HoldScope&) = delete;
  HoldScope& operator=(const HoldScope&) = delete;
  ~HoldScope() { current_hold() = was_; }

 private:
  PayloadHold* was_;
};

/// Appends `v` as one Cap'n Proto message to `out`.
template <Bridgeable T>
void encode(const T& v, std::string& out) {
  if constexpr (bus::detail::IsMessage<T>::value) {
    auto b = v.bytes();
    out.append(reinterpret_cast<const char*>(b.begin()), b.size());
  } else {
    bus::detail::ScratchBuilder builder;
    Codec<T>::encode(v, builder.get().initRoot<typename Codec<T>::Schema>());
    append_message(builder.get(), out);
  }
}

/// `v` on its way out: a large Message as it is, anything else encoded.
template <Bridgeable T>
OutPayload encode_out(const T& v) {
  OutPayload out;
  if constexpr (bus::detail::IsMessage<T>::value) {
    if (v.bytes().size() >= kLargeMessageBytes) {
      out.large = bus::detail::MessageAccess::ref(v);
      return out;
    }
  }
  encode(v, out.bytes);
  return out;
}

/// The segment of `payload` (one message in stream framing, aligned) when Cap'n Proto may read it
/// as it is without bounds checks, the way a Message keeps its words: one segment, the root a
/// struct; every struct and list inside the segment; no far or capability pointers; no deeper
/// than the nesting limit (nor 256 levels); and no more words reached, counting each time a pointer
/// reaches them, than the segment holds (nor the traversal limit), so shared targets cannot amplify
/// and cycles end. Otherwise an empty array: decode() then copies the payload through Cap'n Proto's
/// checked reader, which takes the rest of what is legal and says what is wrong with what is not.
/// Cap'n Proto has no such check short of isCanonical(), which builders' own output fails.
kj::ArrayPtr<const capnp::word> readable_unchecked(kj::ArrayPtr<const capnp::word> payload,
                                                   const Limits& limits);

/// Reads one payload (aligned words in stream framing, already bounds-checked) as a `T`.
/// Malformed input is an InvalidArgument status, never an exception.
template <Bridgeable T>
absl::StatusOr<T> decode(kj::ArrayPtr<const capnp::word> words, const Limits& limits) {
  using S = typename Codec<T>::Schema;
  try {
    if constexpr (bus::detail::IsMessage<T>::value) {
      // What an honest sender writes: its words become the message's with one copy and a walk
      // of its pointers, no reader or builder.
      if (auto segment = readable_unchecked(words, limits); segment.size() != 0) {
        // In a peer's shared memory: read in place, kept until the message's last copy goes.
        if (PayloadHold* hold = current_hold(); hold != nullptr && hold->covers(words)) {
          if (bus::detail::WordsKeeper* keeper = hold->keep()) {
            return bus::detail::MessageAccess::view<S>(words, keeper);
          }
        }
        return bus::detail::MessageAccess::from_segment<S>(segment);
      }
    }
    capnp::FlatArrayMessageReader reader(words, reader_options(limits));
    auto root = reader.getRoot<S>();
    if constexpr (bus::detail::IsMessage<T>::value) {
      // Copied into the unchecked layout, traversing (and checking) it all; the payload's size
      // bounds the copy's.
      return bus::detail::MessageAccess::copy<S>(root, words.size());
    } else {
      root.totalSize();  // checks the whole message before the codec reads any of it
      return Codec<T>::decode(root);
    }
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "undecodable ", std::string(bus::detail::type_name<S>()), " payload: ", describe(e)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec of ", std::string(bus::detail::type_name<T>()), " failed: ", e.what()));
  }
}

/// Outgoing topic messages not yet handed to a transport (per exported topic): the open batch,
/// and, when a large message came, what waits in order before the batch (a large message goes
/// as it is, in a frame of its own).
struct Outbox {
  std::string bytes;  // the open batch
  uint32_t count = 0;
  uint64_t next_seq = 1;
  bool queued = false;
  struct Piece {
    std::string bytes;  // a closed batch of `count` messages, or:
    uint32_t count = 0;
    bus::detail::MessageRef large;  // one large message
  };
  std::deque<Piece> pieces;
};

/// The end of a request forwarded to another node: completed once, by the reply or a failure.
struct PendingCall {
  virtual ~PendingCall() = default;
  /// `payload` is the reply when `status` is OK.
  virtual void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) = 0;
};

/// Requests sent and answered on the calling thread, for Bus::call from a plain thread: each
/// caller borrows a lane (a DEALER per serving node) and waits on it for the reply, so the
/// request does not pass through the bridge thread on its way out nor the reply on its way back.
class DirectCalls {
 public:
  virtual ~DirectCalls() = default;
  /// Sends `payload` to a live node that serves endpoint `name` with these types, then waits
  /// here for its answer until `deadline`. `done` gets the answer or a failure (no live node,
  /// peer gone, the node stopped) on this thread, and true is returned; false when `deadline`
  /// passed first (`done` is not called). Any thread.
  virtual bool call(std::string_view name, uint64_t type_id, uint64_t reply_type_id,
                    const OutPayload& payload, Clock::time_point deadline, PendingCall& done) = 0;
};

/// Where the reply to a request goes: back through the ROUTER to `identity` (ZeroMQ), or over
/// shared-memory link `link`.
struct ReplyTo {
  std::string identity;
  uint64_t link = 0;
  bool operator==(const ReplyTo&) const = default;
  template <class H>
  friend H AbslHashValue(H h, const ReplyTo& r) {
    return H::combine(std::move(h), r.identity, r.link);
  }
};

/// A request that came from another node, for the reply.
struct RemoteCall {
  ReplyTo to;
  uint64_t correlation = 0;
  uint64_t peer = 0;
  bool batched = false;  // the requester reads reply batches
};

class Bridged;

/// The bridge as the adapters see it (bridge thread only).
class Link {
 public:
  virtual ~Link() = default;
  virtual Bus& bus() = 0;
  virtual ExternalInbox& inbox() = 0;
  virtual const Limits& limits() const = 0;
  /// `out` of `channel` has new messages: publish them when this drain ends.
  virtual void queue_publish(Bridged& channel, Outbox& out) = 0;
  /// A large message of `channel`, published as it is (after what `out` holds).
  virtual void publish_large(Bridged& channel, Outbox& out, bus::detail::MessageRef message) = 0;
  /// A message of `bytes` for `channel` is over max_message_bytes: counts and logs it (no
  /// receiver would take it) and returns true.
  virtual bool oversized(const Bridged& channel, std::size_t bytes) = 0;
  /// Sends a request, for `principal` (or nobody), to a live node serving `channel`. Takes
  /// `pending` and finishes it (now with a failure, or later with the reply, a timeout or "peer
  /// gone").
  virtual void call(Bridged& channel, OutPayload payload, Clock::time_point deadline,
                    PrincipalPtr principal, std::unique_ptr<PendingCall> pending) = 0;
  /// Calls from other threads that do not pass through the bridge thread (see DirectCalls). It
  /// may outlive the link.
  virtual std::shared_ptr<DirectCalls> direct_calls() = 0;
  /// Sends a queue message to a live node consuming `channel`.
  virtual absl::Status send(Bridged& channel, OutPayload payload) = 0;
  virtual void reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
                     OutPayload payload) = 0;
};

/// Bus internals the bridge needs (remote proxies are consumers the bus routes to).
struct BusAccess {
  static bus::detail::Inbox& inbox(ExternalInbox& x) { return *x.inbox_; }
  /// See Core::on_stop.
  static void on_stop(Bus& bus, absl::AnyInvocable<void()> hook) {
    bus.core_->on_stop(std::move(hook));
  }
  static void mark_bridge_thread(Bus& bus) {
    auto& p = bus.core_->producer();
    p.bridge_thread = true;
    p.routes = {};  // a bridge thread never takes the one-inbox route (see Producer::bridge)
  }
  /// While it lives, the calling bridge thread hands on what came from another node: its
  /// publishes, sends and requests stay local and skip the bridge's own inbox (see
  /// Producer::bridge).
  class ForOtherNodes {
   public:
    explicit ForOtherNodes(Bus& bus) : p_(bus.core_->producer()), was_(p_.bridge) {
      p_.bridge = true;
    }
    ForOtherNodes(const ForOtherNodes&) = delete;
    ForOtherNodes& operator=(const ForOtherNodes&) = delete;
    ~ForOtherNodes() { p_.bridge = was_; }

   private:
    bus::detail::Producer& p_;
    bool was_;
  };
  /// A remote proxy for `ep` on the bridge's inbox, owned by the bus and routed to at once.
  /// It lives as long as the bus; the bridge takes it in and out of the routing with route().
  template <class Req, class Rep>
  static bus::detail::EndpointTarget<Req, Rep>* add_remote_server(
      Bus& bus, const Endpoint<Req, Rep>& ep, bus::detail::Inbox& in,
      typename bus::detail::EndpointTarget<Req, Rep>::Forward fwd,
      std::shared_ptr<const typename bus::detail::EndpointTarget<Req, Rep>::Direct> direct) {
    auto& st = bus.endpoint_state(ep);
    std::lock_guard lock(bus.core_->mu);
    return st.targets.add(std::make_unique<bus::detail::EndpointTarget<Req, Rep>>(
        ep.id(), in, st, std::move(fwd), std::move(direct)));
  }
  /// A local server of `ep` on the bridge's own inbox (Node::serve).
  template <class Req, class Rep>
  static Subscription serve_at(Bus& bus, const Endpoint<Req, Rep>& ep, bus::detail::Inbox& in,
                               typename bus::detail::EndpointTarget<Req, Rep>::Handler fn) {
    auto& st = bus.endpoint_state(ep);
    return bus.add_consumer(st.targets, std::make_unique<bus::detail::EndpointTarget<Req, Rep>>(
                                            ep.id(), in, st, std::move(fn)));
  }
  /// A request from the bridge thread to a local server of `ep`. When routing picks a server on
  /// the bridge's own inbox (Node::serve) with a plain handler, it runs here and now and
  /// `callback` gets its answer at once: no record, no thread hop. Any other server gets the
  /// request as Bus::request() would send it, and `callback` runs later.
  template <class Req, class Rep, class F>
  static void request_local(Bus& bus, ExternalInbox& from, const Endpoint<Req, Rep>& ep, Req&& req,
                            Clock::duration timeout, F&& callback) {
    bus::detail::Core& c = *bus.core_;
    bus::detail::Producer& p = c.producer();
    bus::detail::Inbox& home = *from.inbox_;
    auto deadline = Clock::now() + timeout;
    auto& st = bus.endpoint_state(ep);
    ForOtherNodes for_others(bus);
    bus::detail::EndpointTarget<Req, Rep>* t = nullptr;
    if (c.enter(p)) {
      t = bus::detail::pick(p, st.targets.load(), st.channel, st.key, static_cast<const Req&>(req));
      c.leave(p);
    }
    // stopped and fn: read on their owner thread, this one.
    if (t != nullptr && t->inbox == &home && !t->stopped && t->fn) {
      p.counters.add(ep.id(), bus::detail::kPublished);
      absl::StatusOr<Rep> rep;
      {
        p.bridge = false;  // the handler's own requests and publishes go anywhere
        rep = t->answer(home, std::move(req), deadline);
        p.bridge = true;
      }
      callback(std::move(rep));
      return;
    }
    bus.request_from(p, home, ep, std::move(req), deadline, std::forward<F>(callback), t);
  }
  template <class T>
  static bus::detail::QueueState<T>& queue_state(Bus& bus, const Queue<T>& q) {
    return bus.queue_state(q);
  }
  template <class T>
  static bus::detail::QueueTarget<T>* add_remote_consumer(Bus& bus, const Queue<T>& q,
                                                          bus::detail::Inbox& in,
                                                          absl::AnyInvocable<void(T&&)> fn) {
    auto& st = bus.queue_state(q);
    std::lock_guard lock(bus.core_->mu);
    return st.targets.add(std::make_unique<bus::detail::QueueTarget<T>>(
        q.id(), in, st, std::move(fn), /*is_remote=*/true));
  }
  /// Takes a proxy in or out of its channel's routing. Records already on their way to it still
  /// reach it (the bridge answers them: "no live node" once none is left).
  template <class Tgt>
  static void route(Bus& bus, bus::detail::Targets<Tgt>& targets, Tgt* t, bool on) {
    std::lock_guard lock(bus.core_->mu);
    if (on) {
      targets.reinstate(t);
    } else {
      targets.remove(t);
    }
  }
  template <class Req, class Rep>
  static bus::detail::EndpointState<Req, Rep>& endpoint_state(Bus& bus,
                                                              const Endpoint<Req, Rep>& ep) {
    return bus.endpoint_state(ep);
  }
  /// Runs `fn` on `msg` as a subscriber of `topic` on the bridge's inbox, counted as that inbox
  /// counts its subscribers: delivered, or failed (and logged once) when it throws.
  template <class T, class F>
  static void run_subscriber(ExternalInbox& x, const Topic<T>& topic, F& fn, const T& msg) {
    try {
      fn(msg);
      x.inbox_->counters.add(topic.id(), bus::detail::kDelivered);
    } catch (...) {
      bus::detail::subscriber_threw(*x.inbox_, topic.id(), 1);
    }
  }
  /// True when `topic` has a subscriber on another inbox than `except` (the bridge's own).
  template <class T>
  static bool has_subscribers(Bus& bus, const Topic<T>& topic, bus::detail::Inbox& except) {
    const auto* list = bus.topic_state(topic).targets.load();
    if (list == nullptr) return false;
    for (const auto* t : list->targets) {
      if (t->inbox != &except && t->live.load(std::memory_order_relaxed) > 0) return true;
    }
    return false;
  }
};

/// One channel crossing the bridge in one direction.
class Bridged {
 public:
  enum class Role {
    kExportTopic,
    kImportTopic,
    kExportEndpoint,
    kImportEndpoint,
    kExportQueue,
    kImportQueue
  };
  Bridged(Role r, const bus::detail::ChannelBase& ch, uint64_t type, uint64_t reply_type)
      : role(r), name(ch.name()), type_id(type), reply_type_id(reply_type) {}
  /// A channel known by name only (untyped access: Node::call_raw).
  Bridged(Role r, std::string n, uint64_t type, uint64_t reply_type)
      : role(r), name(std::move(n)), type_id(type), reply_type_id(reply_type) {}
  virtual ~Bridged() = default;

  /// On the bridge thread, once registered / when the node stops.
  virtual void start(Link&) {}
  virtual void stop(Link&) {}
  /// On the bridge thread: the same channel added again (Node::serve() after export_endpoint(),
  /// say). Takes what `again` adds; it is then dropped.
  virtual void merge(Link&, Bridged& /*again*/) {}
  /// Import topic, export queue: one payload from another node, for local delivery.
  virtual absl::Status deliver(Link&, kj::ArrayPtr<const capnp::word>) {
    return absl::InternalError("not a receiving channel");
  }
  /// Export endpoint: a request from another node.
  virtual void serve(Link&, RemoteCall, kj::ArrayPtr<const capnp::word>, Clock::duration) {}
  /// Import endpoint or queue: whether some live node serves it.
  virtual void set_reachable(Link&, bool) {}
  /// Import topic: whether it has local subscribers (the node subscribes only then).
  virtual bool wanted(Link&) { return false; }

  const Role role;
  const std::string name;
  const uint64_t type_id;
  const uint64_t reply_type_id;  // endpoints
  Outbox out;                    // export topic
};

template <class T>
class ExportTopic final : public Bridged {
 public:
  explicit ExportTopic(const Topic<T>& t)
      : Bridged(Role::kExportTopic, t, schema_id<T>(), 0), topic_(t) {}
  void start(Link& link) override {
    sub_ = link.inbox().subscribe(topic_, [this, &link](const T& m) {
      if constexpr (bus::detail::IsMessage<T>::value) {
        if (m.bytes().size() >= kLargeMessageBytes) {
          if (!link.oversized(*this, m.bytes().size())) {
            link.publish_large(*this, out, bus::detail::MessageAccess::ref(m));
          }
          return;
        }
      }
      std::size_t before = out.bytes.size();
      encode(m, out.bytes);
      if (link.oversized(*this, out.bytes.size() - before)) {
        out.bytes.resize(before);
        return;
      }
      ++out.count;
      link.queue_publish(*this, out);
    });
  }
  void stop(Link&) override { sub_.cancel(); }

 private:
  const Topic<T>& topic_;
  Subscription sub_;
};

/// Bridged::merge() for a channel whose only addition is a handler of its own (`here_`, taken
/// at start()): `self` takes `again`'s.
template <class C>
void merge_handler(C& self, Link& link, Bridged& again) {
  // One name is one channel type (the registry throws otherwise), so `again` is a C.
  if (auto* same = dynamic_cast<C*>(&again); same != nullptr && same->here_) {
    self.here_ = std::move(same->here_);
    self.start(link);
  }
}

/// Brings other nodes' messages of a topic to its local subscribers; with a handler of its own
/// (Node::subscribe), also one such subscriber on the bridge thread, which takes them inline.
template <class T>
class ImportTopic final : public Bridged {
 public:
  using Handler = absl::AnyInvocable<void(const T&)>;
  explicit ImportTopic(const Topic<T>& t, Handler here = nullptr)
      : Bridged(Role::kImportTopic, t, schema_id<T>(), 0), topic_(t), here_(std::move(here)) {}
  void start(Link& link) override {
    if (!here_) return;
    auto h = std::make_shared<Handler>(std::move(here_));
    here_ = nullptr;
    handlers_.push_back(h);
    // Local publishes reach it through the bridge's inbox (the bridge's own publishes skip that
    // inbox: they come here, to deliver(), instead).
    subs_.push_back(link.inbox().subscribe(topic_, [h](const T& m) { (*h)(m); }));
  }
  void stop(Link&) override {
    for (Subscription& s : subs_) s.cancel();
    handlers_.clear();
  }
  void merge(Link& link, Bridged& again) override { merge_handler(*this, link, again); }
  absl::Status deliver(Link& link, kj::ArrayPtr<const capnp::word> payload) override {
    absl::StatusOr<T> m = decode<T>(payload, link.limits());
    if (!m.ok()) return m.status();
    for (const auto& h : handlers_) BusAccess::run_subscriber(link.inbox(), topic_, *h, *m);
    BusAccess::ForOtherNodes for_others(link.bus());
    (void)link.bus().publish(topic_, std::move(*m));  // local refusals are in the bus's stats
    return absl::OkStatus();
  }
  bool wanted(Link& link) override {
    return !handlers_.empty() ||
           BusAccess::has_subscribers(link.bus(), topic_, BusAccess::inbox(link.inbox()));
  }

 private:
  const Topic<T>& topic_;
  template <class C>
  friend void merge_handler(C&, Link&, Bridged&);
  Handler here_;  // moved into handlers_ at start()
  std::vector<std::shared_ptr<Handler>> handlers_;
  std::vector<Subscription> subs_;
};

template <class T>
class ExportQueue final : public Bridged {
 public:
  explicit ExportQueue(const Queue<T>& q)
      : Bridged(Role::kExportQueue, q, schema_id<T>(), 0), queue_(q) {}
  absl::Status deliver(Link& link, kj::ArrayPtr<const capnp::word> payload) override {
    absl::StatusOr<T> m = decode<T>(payload, link.limits());
    if (!m.ok()) return m.status();
    BusAccess::ForOtherNodes for_others(link.bus());
    (void)link.bus().send(queue_, std::move(*m));
    return absl::OkStatus();
  }

 private:
  const Queue<T>& queue_;
};

template <class T>
class ImportQueue final : public Bridged {
 public:
  explicit ImportQueue(const Queue<T>& q)
      : Bridged(Role::kImportQueue, q, schema_id<T>(), 0), queue_(q) {}
  void set_reachable(Link& link, bool reachable) override {
    if (reachable == routed_) return;
    routed_ = reachable;
    if (proxy_ == nullptr) {
      proxy_ = BusAccess::add_remote_consumer<T>(
          link.bus(), queue_, BusAccess::inbox(link.inbox()), [this, &link](T&& m) {
            (void)link.send(*this, encode_out(m));  // refusals are counted by the bridge
          });
      return;
    }
    BusAccess::route(link.bus(), BusAccess::queue_state(link.bus(), queue_).targets, proxy_,
                     reachable);
  }
  void stop(Link& link) override { set_reachable(link, false); }

 private:
  const Queue<T>& queue_;
  bus::detail::QueueTarget<T>* proxy_ = nullptr;  // owned by the bus
  bool routed_ = false;
};

/// Serves other nodes' requests with the local servers of an endpoint; with a handler of its
/// own (Node::serve), also one such server on the bridge's inbox, which answers them inline.
template <class Req, class Rep>
class ExportEndpoint final : public Bridged {
 public:
  using Handler = typename bus::detail::EndpointTarget<Req, Rep>::Handler;
  explicit ExportEndpoint(const Endpoint<Req, Rep>& e, Handler here = nullptr)
      : Bridged(Role::kExportEndpoint, e, schema_id<Req>(), schema_id<Rep>()),
        endpoint_(e),
        here_(std::move(here)) {}
  void start(Link& link) override {
    if (here_) {
      servers_.push_back(BusAccess::serve_at(link.bus(), endpoint_, BusAccess::inbox(link.inbox()),
                                             std::move(here_)));
    }
  }
  void stop(Link&) override {
    for (Subscription& s : servers_) s.cancel();
  }
  void merge(Link& link, Bridged& again) override { merge_handler(*this, link, again); }
  void serve(Link& link, RemoteCall call, kj::ArrayPtr<const capnp::word> payload,
             Clock::duration timeout) override {
    absl::StatusOr<Req> req = decode<Req>(payload, link.limits());
    if (!req.ok()) {
      link.reply(*this, call, req.status(), {});
      return;
    }
    // From the bridge thread, the bus routes to local servers only.
    BusAccess::request_local(link.bus(), link.inbox(), endpoint_, std::move(*req), timeout,
                             [this, &link, call = std::move(call)](absl::StatusOr<Rep> rep) {
                               OutPayload out;
                               if (rep.ok()) out = encode_out(*rep);
                               link.reply(*this, call, rep.status(), std::move(out));
                             });
  }

 private:
  const Endpoint<Req, Rep>& endpoint_;
  template <class C>
  friend void merge_handler(C&, Link&, Bridged&);
  Handler here_;  // moved into a server at start()
  std::vector<Subscription> servers_;
};

template <class Req, class Rep>
class ImportEndpoint final : public Bridged {
  using Envelope = bus::detail::RequestEnvelope<Req, Rep>;
  using State = bus::detail::EndpointState<Req, Rep>;

  static absl::StatusOr<Rep> result(absl::Status status, kj::ArrayPtr<const capnp::word> payload,
                                    const Limits& limits) {
    return status.ok() ? decode<Rep>(payload, limits) : absl::StatusOr<Rep>(std::move(status));
  }
  struct Call final : PendingCall {
    Call(Link& l, State& s, Envelope&& e) : link(l), state(s), env(std::move(e)) {}
    void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) override {
      state.reply(BusAccess::inbox(link.inbox()), env,
                  result(std::move(status), payload, link.limits()));
    }
    Link& link;
    State& state;
    Envelope env;
  };
  /// A Bus::call() made on its caller's thread (see DirectCalls). Holds copies of what it
  /// needs: a call may outlast the node.
  struct CallHere {
    std::shared_ptr<DirectCalls> calls;
    std::string name;
    uint64_t type_id, reply_type_id;
    Limits limits;
    std::optional<absl::StatusOr<Rep>> operator()(Req&& req, Clock::time_point deadline) const {
      OutPayload payload = encode_out(req);
      struct Answer final : PendingCall {
        explicit Answer(const Limits& l) : limits(l) {}
        void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) override {
          rep = result(std::move(status), payload, limits);
        }
        const Limits& limits;
        std::optional<absl::StatusOr<Rep>> rep;
      } answer(limits);
      if (!calls->call(name, type_id, reply_type_id, payload, deadline, answer)) {
        return std::nullopt;
      }
      return std::move(answer.rep);
    }
  };

 public:
  explicit ImportEndpoint(const Endpoint<Req, Rep>& e)
      : Bridged(Role::kImportEndpoint, e, schema_id<Req>(), schema_id<Rep>()), endpoint_(e) {}
  void set_reachable(Link& link, bool reachable) override {
    if (reachable == routed_) return;
    routed_ = reachable;
    State& state = BusAccess::endpoint_state(link.bus(), endpoint_);
    if (proxy_ == nullptr) {
      proxy_ = BusAccess::add_remote_server<Req, Rep>(
          link.bus(), endpoint_, BusAccess::inbox(link.inbox()),
          [this, &link, &state](Envelope&& env) {
            OutPayload payload = encode_out(env.request);
            Clock::time_point deadline = env.deadline;
            PrincipalPtr principal = env.principal;
            link.call(*this, std::move(payload), deadline, std::move(principal),
                      std::make_unique<Call>(link, state, std::move(env)));
          },
          std::make_shared<const typename bus::detail::EndpointTarget<Req, Rep>::Direct>(
              CallHere{link.direct_calls(), name, type_id, reply_type_id, link.limits()}));
      return;
    }
    BusAccess::route(link.bus(), state.targets, proxy_, reachable);
  }
  void stop(Link& link) override { set_reachable(link, false); }

 private:
  const Endpoint<Req, Rep>& endpoint_;
  bus::detail::EndpointTarget<Req, Rep>* proxy_ = nullptr;  // owned by the bus
  bool routed_ = false;
};

}  // namespace bus::net::detail
