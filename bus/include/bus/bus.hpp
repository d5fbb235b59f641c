// The one include for in-process work: channels, the Bus, services, request/reply, timers.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <atomic>
#include <cassert>
#include <chrono>
#include <concepts>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>
#include <vector>

#include "bus/channel.hpp"
#include "bus/detail/core.hpp"
#include "bus/detail/targets.hpp"
#include "bus/options.hpp"
#include "bus/principal.hpp"
#include "bus/stats.hpp"

namespace bus {

using Clock = std::chrono::steady_clock;

/// `U` is exactly the channel's message type (no conversions: a Topic<Tick> takes a Tick).
template <class U, class T>
concept MessageOf = std::same_as<std::remove_cvref_t<U>, T>;

/// Where a subscriber, consumer, server or service runs: an executor index, or any (the bus
/// spreads them round-robin).
struct Placement {
  int executor = -1;
};
inline Placement on_executor(unsigned i) { return Placement{static_cast<int>(i)}; }

/// Names a timer so it can be cancelled.
struct TimerId {
  uint32_t inbox = 0;
  uint64_t id = 0;
  explicit operator bool() const { return id != 0; }
};

/// A subscription, consumer or server registration; cancels itself when destroyed. Once
/// `cancel()` has returned the handler does not start again (not even for messages already
/// queued to it) and is not running, with two exceptions in which the call running at that
/// moment finishes first: a cancel from the handler's own executor (one of its own handlers),
/// and a cancel of a handler that is itself waiting, through other executors' cancels, for the
/// caller's executor (a cycle no wait could end). Messages the caller sent before cancel()
/// still reach the handler, except in that cycle. cancel() never deadlocks; from another thread
/// to an ExternalInbox's handler it does not wait, and takes effect when that loop next drains.
class [[nodiscard]] Subscription {
 public:
  Subscription() = default;
  Subscription(std::weak_ptr<detail::Core> core, absl::AnyInvocable<void(detail::Core&)> cancel)
      : core_(std::move(core)), cancel_(std::move(cancel)) {}
  Subscription(Subscription&&) noexcept = default;
  Subscription& operator=(Subscription&& o) noexcept {
    if (this != &o) {
      cancel();
      core_ = std::move(o.core_);
      cancel_ = std::move(o.cancel_);
    }
    return *this;
  }
  ~Subscription() { cancel(); }
  void cancel() {
    if (!cancel_) return;
    auto fn = std::move(cancel_);
    cancel_ = nullptr;
    if (auto core = core_.lock()) fn(*core);
  }
  /// Keeps the registration for the bus's lifetime.
  void release() { cancel_ = nullptr; }
  explicit operator bool() const { return static_cast<bool>(cancel_); }

 private:
  std::weak_ptr<detail::Core> core_;
  absl::AnyInvocable<void(detail::Core&)> cancel_;
};

template <class S>
class Service;
template <class S>
class ServiceGroup;
class Batch;
class ExternalInbox;
template <class T>
class Publisher;
class Reactor;
namespace net::detail {
struct BusAccess;
}

namespace detail {
/// What a service's handlers share: whether it still runs, its registrations and its state.
/// Owned by the bus until the bus goes, so that handles and late callbacks can always look.
struct ServiceLife {
  /// Written on the service's executor (or once the executors are gone); handlers, timers and
  /// replies read it there before touching the state.
  std::atomic<bool> alive{true};
  std::mutex mu;  // guards the two below (registrations come from any thread)
  std::vector<Subscription> subs;
  std::vector<TimerId> periodic;
  std::shared_ptr<void> state;
};
}  // namespace detail

/// The bus: executors, their inboxes and every channel's state. Handlers run on executors;
/// any thread may publish. Destroying the bus stops it (draining what was accepted).
class Bus {
 public:
  explicit Bus(Options options = {});
  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;
  ~Bus();

  unsigned executors() const { return core_->executor_count(); }
  /// The executor running the calling thread, if it is one of this bus's.
  std::optional<unsigned> current_executor() const;

  // ---- topics: every subscriber gets each message ---------------------------------------------

  /// Sends `msg` to every subscriber. OK, or: ResourceExhausted (a ring was full under the fail
  /// policy; subscribers whose rings had room still get it), Unavailable (the bus is stopping).
  template <class T, MessageOf<T> U>
  [[gnu::always_inline]] inline absl::Status publish(const Topic<T>& topic, U&& msg);

  template <class T, class F>
  requires std::invocable<F&, const T&> Subscription subscribe(const Topic<T>& topic, F&& handler,
                                                               Placement where = {});

  /// A handle for publishing to `topic` from the calling thread, message by message, without
  /// the lookups publish() makes on every call (see Publisher).
  template <class T>
  Publisher<T> publisher(const Topic<T>& topic);

  /// publish() of every message in `msgs`, in order, as one batch: to a topic whose subscribers
  /// are on one inbox they are copied into the ring in runs (a memcpy for trivially copyable
  /// types), and a plain thread publishes the ring once at the end. The same result as
  /// publish() one by one (the first error, if any; the rest are still offered).
  template <class T>
  absl::Status publish_bulk(const Topic<T>& topic, std::span<const T> msgs);
  /// subscribe() for a handler that takes messages in bulk: `handler(std::span<const T>)` gets
  /// consecutive messages of the topic, in order, as many at once as arrived together (up to
  /// 256 from one producer). Spans of more than one message need a type that fills whole 8-byte
  /// words (sizeof(T) % 8 == 0, alignment <= 8, at most 192 bytes); others come one per span.
  /// If the handler throws, every message of that span counts as failed.
  template <class T, class F>
  requires std::invocable<F&, std::span<const T>> Subscription subscribe_bulk(const Topic<T>& topic,
                                                                              F&& handler,
                                                                              Placement where = {});

  // ---- queues: one consumer per message --------------------------------------------------------

  template <class T, MessageOf<T> U>
  absl::Status send(const Queue<T>& queue, U&& msg);

  template <class T, class F>
  requires std::invocable<F&, T&&> Subscription consume(const Queue<T>& queue, F&& handler,
                                                        Placement where = {});

  // ---- request / reply
  // ---------------------------------------------------------------------------

  /// Serves `endpoint`: `handler(Req&&)` returns Rep or absl::StatusOr<Rep>; a throw becomes an
  /// Internal status for the caller.
  template <class Req, class Rep, class F>
  requires std::invocable<F&, Req&&> Subscription serve(const Endpoint<Req, Rep>& endpoint,
                                                        F&& handler, Placement where = {});

  /// Serves `endpoint` with answers that may come later: `handler(Req&&, bus::Replier<Rep>)`
  /// keeps the replier (in a composition's continuation, say) and calls it once, from any
  /// thread. The caller's deadline still applies; a replier dropped unanswered answers Internal.
  template <class Req, class Rep, class F>
  requires std::invocable<F&, Req&&, Replier<Rep>> Subscription
  serve_async(const Endpoint<Req, Rep>& endpoint, F&& handler, Placement where = {});

  /// Sends a request; `callback(absl::StatusOr<Rep>)` runs exactly once, on the calling
  /// executor (or external inbox), with the reply or a status: DeadlineExceeded, Unavailable (no
  /// handler, bus stopping), Internal (the handler threw), Cancelled (bus stopped first).
  /// From a plain thread the callback runs on an executor the bus picks, or on the calling
  /// thread before request() returns when no executor could take the request (the bus stopped,
  /// or this thread's ring to it stayed full until the deadline).
  template <class Req, class Rep, MessageOf<Req> R, class F>
  requires std::invocable<F&, absl::StatusOr<Rep>>
  void request(const Endpoint<Req, Rep>& endpoint, R&& req, Clock::duration timeout, F&& callback);

  /// How many servers `endpoint` has now: handlers in this process, plus the bridge's proxy
  /// while live nodes elsewhere serve it (bus::net).
  template <class Req, class Rep>
  std::size_t servers(const Endpoint<Req, Rep>& endpoint) {
    const auto* list = endpoint_state(endpoint).targets.load();
    return list == nullptr ? 0 : list->targets.size();
  }

  /// Blocks the calling plain thread until the reply or the deadline. Refused (FailedPrecondition)
  /// on an executor and on a node's bridge thread. To another node's server, the request leaves
  /// from this thread and the reply is read here (bus::net::Node), not through the bridge.
  template <class Req, class Rep, MessageOf<Req> R>
  absl::StatusOr<Rep> call(const Endpoint<Req, Rep>& endpoint, R&& req, Clock::duration timeout);

  // ---- services
  // ----------------------------------------------------------------------------------

  /// State `S` pinned to one executor: all its handlers run there, one at a time.
  template <class S, class... A>
  Service<S> service(Placement where, A&&... args);
  template <class S, class... A>
  Service<S> service(A&&... args) {
    return service<S>(Placement{}, std::forward<A>(args)...);
  }
  /// N instances of `S` taking turns (round-robin) on the queues and endpoints they consume.
  template <class S, class... A>
  ServiceGroup<S> pool(unsigned n, const A&... args);
  /// N instances of `S`, each owning the keys that hash to it on the keyed channels it consumes.
  template <class S, class... A>
  ServiceGroup<S> sharded(unsigned n, const A&... args);

  // ---- closures and timers --------------------------------------------------------------------

  /// Runs `fn()` on executor `where` (any: round-robin).
  template <class F>
  requires std::invocable<F&> absl::Status post(Placement where, F&& fn);
  template <class F>
  requires std::invocable<F&> TimerId after(Placement where, Clock::duration delay, F&& fn);
  template <class F>
  requires std::invocable<F&> TimerId every(Placement where, Clock::duration period, F&& fn);
  void cancel(TimerId timer);

  /// Stops intake (publish from plain threads returns Unavailable), lets executors run until
  /// nothing is in flight, then joins them. Pending requests get Cancelled. Idempotent.
  absl::Status stop();

  Stats stats() const;

 private:
  template <class S>
  friend class Service;
  friend class Batch;
  template <class>
  friend class Publisher;
  friend class ExternalInbox;
  friend class Reactor;
  friend struct net::detail::BusAccess;

  detail::Inbox& placed(Placement where);
  unsigned place(Placement where);
  template <class F>
  absl::Status post_to(detail::Inbox& inbox, F&& fn);
  /// publish() and Publisher::publish() through the run `route` holds (its lease), while the
  /// topic's subscribers are those of the route: true when the message went into the run
  /// (`msg` is untouched otherwise). With `kChannel`, the route must also be `channel`'s (a
  /// slot of the thread's table, which channels share).
  template <class T, bool kChannel, class U>
  [[gnu::always_inline]] static inline bool publish_leased(detail::Producer::Route& route,
                                                           uint32_t channel, U&& msg);
  /// publish() and Publisher::publish() when the lease did not take the message: enters (a
  /// plain thread outside a Batch), tries `route` when `routed`, else or when that fails calls
  /// `slow(msg)`, and leaves. In a Batch or an executor's loop, a message that joins an open
  /// run takes the run into the route's lease (Bus::publish_routed).
  template <class T, class U, class Slow>
  [[gnu::always_inline]] static inline absl::Status publish_gated(detail::Core& c,
                                                                  detail::Producer& p, bool routed,
                                                                  detail::Producer::Route& route,
                                                                  U&& msg, Slow&& slow);
  /// publish() through `route` (this thread's route for the topic, or a Publisher's) while it
  /// still holds: true when the message went into the ring (`msg` is untouched otherwise). Only
  /// whether `g` is the plain gate matters: a Batch and an executor commit alike. A message
  /// that joins an open run takes that run into the route's lease.
  template <class T, class U>
  [[gnu::always_inline]] static inline bool publish_routed(detail::Producer& p,
                                                           detail::Producer::Gate g,
                                                           detail::Producer::Route& route, U&& msg);
  /// publish() when `route` does not hold (this thread has no route for the topic yet, or its
  /// subscribers changed) or the ring is full (the overflow policy). Sets `route` again when
  /// the topic's subscribers are on one inbox.
  template <class T, class U>
  [[gnu::noinline]] static absl::Status publish_resolving(detail::Core& c, detail::Producer& p,
                                                          detail::TopicState<T>& st,
                                                          const Topic<T>& topic,
                                                          detail::Producer::Route& route, U&& msg);
  template <class T, class U>
  [[gnu::noinline]] absl::Status publish_resolving(detail::Producer& p, const Topic<T>& topic,
                                                   U&& msg) {
    return publish_resolving(*core_, p, topic_state(topic), topic,
                             p.routes[topic.id() % detail::Producer::kRoutes],
                             std::forward<U>(msg));
  }
  /// publish() to several inboxes, or from a bridge thread: out of line.
  template <class T, class U>
  [[gnu::noinline]] static absl::Status publish_to_list(
      detail::Core& c, detail::Producer& p, const detail::TargetList<detail::TopicTarget<T>>& list,
      const Topic<T>& topic, U&& msg);
  template <class T>
  static detail::TopicState<T>& topic_state(detail::Core& c, const Topic<T>& t) {
    return c.channel_state<detail::TopicState<T>>(t.id(), [] { return new detail::TopicState<T>; });
  }
  template <class T>
  detail::TopicState<T>& topic_state(const Topic<T>& t) {
    return topic_state(*core_, t);
  }
  template <class T>
  detail::QueueState<T>& queue_state(const Queue<T>& q) {
    return core_->channel_state<detail::QueueState<T>>(
        q.id(), [&] { return new detail::QueueState<T>(q.id(), q.key(), q.overflow()); });
  }
  template <class Req, class Rep>
  detail::EndpointState<Req, Rep>& endpoint_state(const Endpoint<Req, Rep>& e) {
    return core_->channel_state<detail::EndpointState<Req, Rep>>(
        e.id(), [&] { return new detail::EndpointState<Req, Rep>(e.id(), e.key(), e.overflow()); });
  }
  template <class T, class F>
  Subscription subscribe_at(const Topic<T>& topic, detail::Inbox& inbox, F&& handler);
  /// The topic's one subscribing inbox's target, when there is one and `p` is not a bridge
  /// thread (which may have to skip its own inbox): publish() then needs no copy.
  template <class T>
  static detail::TopicTarget<T>* sole_target(
      const detail::Producer& p, const detail::TargetList<detail::TopicTarget<T>>* list) {
    return list != nullptr && list->targets.size() == 1 && !p.bridge_thread ? list->targets.front()
                                                                            : nullptr;
  }
  template <class T>
  Subscription add_subscriber(const Topic<T>& topic, detail::Inbox& inbox,
                              typename detail::TopicTarget<T>::Sub sub);
  /// Registers a queue consumer or endpoint server; cancelling removes it from the routing.
  template <class Tgt>
  Subscription add_consumer(detail::Targets<Tgt>& targets, std::unique_ptr<Tgt> target);
  template <class F>
  TimerId schedule(Placement where, Clock::duration first, Clock::duration period, F&& fn);
  /// The request goes to `to` when given (a fan-out), else to the server routing picks.
  template <class Req, class Rep, class F>
  void request_from(detail::Producer& p, detail::Inbox& home, const Endpoint<Req, Rep>& endpoint,
                    Req&& req, Clock::time_point deadline, F&& callback,
                    detail::EndpointTarget<Req, Rep>* to = nullptr);
  void keep(Subscription s);
  detail::ServiceLife* keep_service(std::shared_ptr<void> state);
  /// Stops a service: see Service::stop().
  void stop_service(detail::ServiceLife& life, unsigned executor);
  template <class S, class... A>
  ServiceGroup<S> group(unsigned n, bool sharded, const A&... args);

  std::shared_ptr<detail::Core> core_;
  std::mutex keep_mu_;
  std::vector<Subscription> kept_;
  std::vector<std::unique_ptr<detail::ServiceLife>> services_;
};

/// Defers publication on a plain thread: records are built in the rings as usual but made
/// visible (and their executors woken) once, when the scope ends. Executors batch on their own.
class Batch {
 public:
  explicit Batch(Bus& bus);
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;
  ~Batch();
  /// Publishes what was sent so far.
  void flush();
  /// False when the bus was stopping as the batch began: its publishes are then refused.
  bool accepted() const { return accepted_; }

 private:
  detail::Core& core_;
  detail::Producer& producer_;
  bool accepted_;
  detail::Producer::Gate outer_gate_ = detail::Producer::kPlainGate;  // restored at the end
};

/// One thread's handle for publishing to one topic: publish() is Bus::publish(), with the same
/// results and overflow policy, without the lookups Bus::publish() makes on every call (this
/// thread's producer, then its route for the topic). For a loop that publishes many messages to
/// one topic. Inside a Batch, or on an executor, messages to a topic whose subscribers are on one
/// inbox join one run record, and the handle holds that run's cursor itself (detail::RunLease)
/// until the run closes: publish() then costs a look at the topic's subscribers and a store
/// into the ring. (Bus::publish() holds runs the same way, in the thread's route for the topic,
/// after finding the thread's producer and that route.)
///
/// Made by Bus::publisher() on the thread that publishes with it, and used on that thread only,
/// while its Bus exists (a debug build asserts both); it may be destroyed anywhere, before or
/// after the Bus (a run it holds is given back to its ring when it is destroyed or moved from, on
/// its thread, inside the Batch or executor pass that opened it). It does not keep the bus alive
/// (so a handler or a service may hold one): once the bus has stopped, publish() returns
/// Unavailable as Bus::publish() does. Subscribers that come and go are seen at the next publish(),
/// as with Bus::publish().
template <class T>
class Publisher {
 public:
  Publisher(Publisher&&) noexcept = default;
  Publisher& operator=(Publisher&&) noexcept = default;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  template <MessageOf<T> U>
  [[gnu::always_inline]] inline absl::Status publish(U&& msg);
  const Topic<T>& topic() const { return topic_; }

 private:
  friend class Bus;
  Publisher(const std::shared_ptr<detail::Core>& core, const Topic<T>& topic)
      : core_(core.get()), producer_(&core->producer()), topic_(topic) {
#ifndef NDEBUG
    alive_ = core;
#endif
    state_ = &Bus::topic_state(*core_, topic_);
    route_.channel = topic_.id();
    route_.state = state_;
    route_.list = &detail::kUnresolvedRoute;  // no target list: the first publish() resolves
  }

  /// publish() when neither the lease nor the route takes the message (the topic's subscribers
  /// changed, or the ring is full), and after an executor's loop ended. Out of line, in three
  /// argument registers (the result, this, the message). Called inline, the six-argument
  /// Bus::publish_resolving() took a seventh on the stack: the caller kept a frame pointer for it,
  /// and a loop of publish() calls spilled its own counter to memory (docs/core.md).
  template <class U>
  [[gnu::noinline]] absl::Status publish_slow(U&& msg);

  detail::Core* core_;  // not owned: a handler holding a Publisher must not keep its bus alive
  detail::Producer* producer_;
#ifndef NDEBUG
  std::weak_ptr<detail::Core> alive_;  // what the debug build's assert looks at
#endif
  Topic<T> topic_;
  detail::TopicState<T>* state_;
  // Its lease is the open run this handle appends to (Bus::publish_leased()).
  detail::Producer::Route route_;
};

/// An inbox owned by an event loop that is not an executor (Asio, a zmq poller, ...). The loop
/// polls `fd()` (an eventfd) and calls `drain()` when it is readable or when `next_timer()` is
/// due; replies to requests made on the owning thread and handlers subscribed here run inside
/// `drain()`. Created on, and owned by, the calling thread (see bind_to_this_thread()).
class ExternalInbox {
 public:
  explicit ExternalInbox(Bus& bus);
  ExternalInbox(const ExternalInbox&) = delete;
  ExternalInbox& operator=(const ExternalInbox&) = delete;
  ~ExternalInbox();

  int fd() const { return inbox_->eventfd(); }
  /// Runs what is ready; returns how many records and timers ran. It takes at most kBatch
  /// records from each producer's ring: one that returned kBatch or more may have left some.
  std::size_t drain();
  static constexpr std::size_t kBatch = detail::Inbox::kBatch;
  /// Like drain(), but leaves the inbox awake: producers stop writing the eventfd (a syscall per
  /// message) until the next drain(). For a loop that is busy and will call again at once; it
  /// must call drain() before it blocks in poll.
  std::size_t drain_awake();
  std::optional<Clock::time_point> next_timer() const { return inbox_->next_timer(); }
  /// Makes the calling thread the owner (its requests' replies come here).
  void bind_to_this_thread();

  template <class T, class F>
  requires std::invocable<F&, const T&> Subscription subscribe(const Topic<T>& topic, F&& handler) {
    return bus_.subscribe_at(topic, *inbox_, std::forward<F>(handler));
  }
  /// Bus::subscribe_bulk() on this inbox.
  template <class T, class F>
  requires std::invocable<F&, std::span<const T>> Subscription subscribe_bulk(const Topic<T>& topic,
                                                                              F&& handler) {
    return bus_.add_subscriber(
        topic, *inbox_,
        {0, {}, absl::AnyInvocable<void(std::span<const T>)>(std::forward<F>(handler))});
  }
  /// Runs `fn()` inside a later drain(), on the owning loop's thread. Unavailable once the bus
  /// has stopped.
  template <class F>
  requires std::invocable<F&> absl::Status post(F&& fn) {
    return bus_.post_to(*inbox_, std::forward<F>(fn));
  }

 private:
  friend struct net::detail::BusAccess;
  Bus& bus_;
  detail::Inbox* inbox_;
};

// ==== services
// ======================================================================================

namespace detail {
template <class Rep, class F, class... A>
absl::StatusOr<Rep> invoke_handler(F& f, A&&... a) {
  using R = std::invoke_result_t<F&, A...>;
  if constexpr (std::is_same_v<std::remove_cvref_t<R>, absl::StatusOr<Rep>>) {
    return std::invoke(f, std::forward<A>(a)...);
  } else {
    static_assert(std::is_convertible_v<R, Rep>,
                  "an endpoint handler returns the endpoint's reply type or absl::StatusOr of it");
    return absl::StatusOr<Rep>(std::invoke(f, std::forward<A>(a)...));
  }
}
}  // namespace detail

/// A handle to state `S` pinned to one executor. Handlers take `(S&, message)`; member
/// function pointers work too. Handles are cheap to copy; the bus owns the state until stop()
/// or until the bus goes.
template <class S>
class Service {
 public:
  unsigned executor() const { return executor_; }
  /// The state. Touch it only from the service's own handlers, or after the bus stopped (and
  /// never after stop()).
  S& state() const { return *state_; }
  /// False once stop() began.
  bool running() const { return life_->alive.load(std::memory_order_relaxed); }

  template <class T, class F>
  Service& subscribe(const Topic<T>& topic, F f) {
    return keep(bus_->subscribe(
        topic,
        [life = life_, s = state_, f = std::move(f)](const T& m) mutable {
          if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, m);
        },
        on_executor(executor_)));
  }
  /// Bus::subscribe_bulk() for the service: handlers take `(S&, std::span<const T>)`.
  template <class T, class F>
  Service& subscribe_bulk(const Topic<T>& topic, F f) {
    return keep(bus_->subscribe_bulk(
        topic,
        [life = life_, s = state_, f = std::move(f)](std::span<const T> m) mutable {
          if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, m);
        },
        on_executor(executor_)));
  }
  template <class T, class F>
  Service& consume(const Queue<T>& queue, F f) {
    return keep(bus_->consume(
        queue,
        [life = life_, s = state_, f = std::move(f)](T&& m) mutable {
          if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, std::move(m));
        },
        on_executor(executor_)));
  }
  template <class Req, class Rep, class F>
  Service& serve(const Endpoint<Req, Rep>& endpoint, F f) {
    return keep(bus_->serve(
        endpoint,
        [life = life_, s = state_, &endpoint, f = std::move(f)](Req&& r) mutable {
          if (!life->alive.load(std::memory_order_relaxed)) {
            return absl::StatusOr<Rep>(absl::UnavailableError(
                absl::StrCat("bus: the service serving '", endpoint.name(), "' has stopped")));
          }
          return detail::invoke_handler<Rep>(f, *s, std::move(r));
        },
        on_executor(executor_)));
  }
  /// Serves with answers that may come later: `f(S&, Req&&, bus::Replier<Rep>)` (see
  /// Bus::serve_async). If the service stops first, the replier answers Unavailable.
  template <class Req, class Rep, class F>
  Service& serve_async(const Endpoint<Req, Rep>& endpoint, F f) {
    return keep(bus_->serve_async(
        endpoint,
        [life = life_, s = state_, &endpoint, f = std::move(f)](Req&& r,
                                                                Replier<Rep> reply) mutable {
          if (!life->alive.load(std::memory_order_relaxed)) {
            return reply(absl::UnavailableError(
                absl::StrCat("bus: the service serving '", endpoint.name(), "' has stopped")));
          }
          std::invoke(f, *s, std::move(r), std::move(reply));
        },
        on_executor(executor_)));
  }
  /// `fn(S&)` after `delay` / every `period`, on the service's executor (never after stop()).
  template <class F>
  TimerId after(Clock::duration delay, F fn) {
    return bus_->after(on_executor(executor_), delay, guarded(std::move(fn)));
  }
  template <class F>
  TimerId every(Clock::duration period, F fn) {
    TimerId id = bus_->every(on_executor(executor_), period, guarded(std::move(fn)));
    std::lock_guard lock(life_->mu);
    life_->periodic.push_back(id);
    return id;
  }
  /// `fn(S&)` on the service's executor (dropped if the service stops first).
  template <class F>
  absl::Status post(F fn) {
    return bus_->post(on_executor(executor_), guarded(std::move(fn)));
  }
  /// A request made by the service: `callback(S&, absl::StatusOr<Rep>)` runs on its executor,
  /// unless the service stopped meanwhile (then it does not run at all).
  template <class Req, class Rep, class F>
  void request(const Endpoint<Req, Rep>& endpoint, Req req, Clock::duration timeout, F callback) {
    auto deadline = Clock::now() + timeout;
    Bus* bus = bus_;
    auto go = [bus, &endpoint, life = life_, s = state_, req = std::move(req), deadline,
               cb = std::move(callback)]() mutable {
      if (!life->alive.load(std::memory_order_relaxed)) return;
      auto& p = bus->core_->producer();
      bus->request_from(p, *p.own_inbox, endpoint, std::move(req), deadline,
                        [life, s, cb = std::move(cb)](absl::StatusOr<Rep> r) mutable {
                          if (life->alive.load(std::memory_order_relaxed)) cb(*s, std::move(r));
                        });
    };
    if (bus_->current_executor() == executor_) {
      go();
    } else if (absl::Status st = bus_->post(on_executor(executor_), std::move(go)); !st.ok()) {
      if (running()) callback(*state_, absl::StatusOr<Rep>(st));
    }
  }

  /// Stops the service: its handlers, timers and reply callbacks stop running, its
  /// registrations are removed (queue and endpoint traffic goes to the other consumers, or
  /// fails with Unavailable), and its state is destroyed on its executor. From another thread,
  /// returns once that is done; from one of its own handlers, the state goes when that handler
  /// returns (and so in a cycle of cancels: see Subscription). Never deadlocks. Requests it made
  /// that are still in flight are dropped when their replies come. Idempotent.
  void stop() { bus_->stop_service(*life_, executor_); }

 private:
  friend class Bus;
  Service(Bus* bus, S* state, detail::ServiceLife* life, unsigned executor)
      : bus_(bus), state_(state), life_(life), executor_(executor) {}
  Service& keep(Subscription sub) {
    std::lock_guard lock(life_->mu);
    life_->subs.push_back(std::move(sub));
    return *this;
  }
  template <class F>
  auto guarded(F fn) {
    return [life = life_, s = state_, fn = std::move(fn)]() mutable {
      if (life->alive.load(std::memory_order_relaxed)) fn(*s);
    };
  }
  Bus* bus_;
  S* state_;
  detail::ServiceLife* life_;
  unsigned executor_;
};

/// N instances of a service on distinct executors (as far as there are executors).
template <class S>
class ServiceGroup {
 public:
  std::size_t size() const { return members_.size(); }
  Service<S>& operator[](std::size_t i) { return members_[i]; }
  auto begin() { return members_.begin(); }
  auto end() { return members_.end(); }

  template <class T, class F>
  ServiceGroup& subscribe(const Topic<T>& topic, F f) {
    for (auto& m : members_) m.subscribe(topic, f);
    return *this;
  }
  template <class T, class F>
  ServiceGroup& consume(const Queue<T>& queue, F f) {
    check_keyed(queue.key() != nullptr, queue.name());
    for (auto& m : members_) m.consume(queue, f);
    return *this;
  }
  template <class Req, class Rep, class F>
  ServiceGroup& serve(const Endpoint<Req, Rep>& endpoint, F f) {
    check_keyed(endpoint.key() != nullptr, endpoint.name());
    for (auto& m : members_) m.serve(endpoint, f);
    return *this;
  }
  template <class Req, class Rep, class F>
  ServiceGroup& serve_async(const Endpoint<Req, Rep>& endpoint, F f) {
    check_keyed(endpoint.key() != nullptr, endpoint.name());
    for (auto& m : members_) m.serve_async(endpoint, f);
    return *this;
  }
  /// Stops every member (see Service::stop()).
  void stop() {
    for (auto& m : members_) m.stop();
  }

 private:
  friend class Bus;
  void check_keyed(bool keyed, const std::string& name) const {
    if (sharded_ && !keyed) {
      throw std::invalid_argument(
          absl::StrCat("bus: a sharded service consumes keyed channels; '", name,
                       "' has no key function (declare it with one, or use pool())"));
    }
  }
  std::vector<Service<S>> members_;
  bool sharded_ = false;
};

// ==== implementation
// ===============================================================================

template <class T, MessageOf<T> U>
absl::Status Bus::publish(const Topic<T>& topic, U&& msg) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  // The common case, inline: this thread published here before, the topic's subscribers are
  // still the ones it saw, all on one inbox (so no copy to make), and the ring has room.
  detail::Producer::Route& r = p.routes[topic.id() % detail::Producer::kRoutes];
  // Inside a Batch or an executor's loop, the run this route holds (see Publisher).
  if (publish_leased<T, true>(r, topic.id(), std::forward<U>(msg))) [[likely]]
    return absl::OkStatus();
  return publish_gated<T>(
      c, p, r.channel == topic.id(), r, std::forward<U>(msg),
      [&]<class M>(M&& m) { return publish_resolving(p, topic, std::forward<M>(m)); });
}

template <class T>
template <MessageOf<T> U>
absl::Status Publisher<T>::publish(U&& msg) {
  assert(!alive_.expired() && "a Publisher is used while its Bus exists");
  assert(&core_->producer() == producer_ && "a Publisher publishes on the thread that made it");
  assert(!route_.lease.held() || producer_->gate == detail::Producer::kBatchGate);
  if (Bus::publish_leased<T, false>(route_, 0, std::forward<U>(msg))) [[likely]]
    return absl::OkStatus();
  detail::Producer& p = *producer_;
  return Bus::publish_gated<T>(*core_, p, true, route_, std::forward<U>(msg),
                               [&]<class M>(M&& m) { return publish_slow(std::forward<M>(m)); });
}

template <class T>
template <class U>
absl::Status Publisher<T>::publish_slow(U&& msg) {
  return Bus::publish_resolving(*core_, *producer_, *state_, topic_, route_, std::forward<U>(msg));
}

template <class T, bool kChannel, class U>
bool Bus::publish_leased(detail::Producer::Route& route, uint32_t channel, U&& msg) {
  // No look at the gate: a lease is taken inside a Batch or an executor's loop only, and their
  // flush closes the run, which empties the lease, before anything else runs on this thread.
  constexpr uint32_t kWords = detail::Payload<T>::kWords - 1;
  detail::RunLease& lease = route.lease;
  if (!lease.has_room(kWords) || (kChannel && route.channel != channel) ||
      static_cast<const detail::TopicState<T>*>(route.state)->targets.load() != route.list)
    return false;
  // As Ring::extend_at() does: the lines ahead are asked for before the stores reach them.
  detail::prefetch_for_write<detail::Ring::kPrefetchWords * 8>(lease.at);
  detail::Payload<T>::construct(lease.at, std::forward<U>(msg));
  lease.at += kWords;
  return true;
}

template <class T, class U, class Slow>
absl::Status Bus::publish_gated(detail::Core& c, detail::Producer& p, bool routed,
                                detail::Producer::Route& route, U&& msg, Slow&& slow) {
  // The slow path gets a small message by value: the caller's variable's address never leaves
  // the inline path, so it can live in a register. (Inlined itself: GCC otherwise makes this
  // lambda a function taking the variable's address, which keeps a loop's counter in memory,
  // stored and loaded again around every publish.)
  auto call_slow = [&]() __attribute__((always_inline)) {
    if constexpr (std::is_trivially_copyable_v<T> && sizeof(T) <= 16) {
      T copy = msg;
      return slow(std::move(copy));
    } else {
      return slow(std::forward<U>(msg));
    }
  };
  using Gate = detail::Producer::Gate;
  const Gate gate = p.gate;
  // Inside a Batch (entered when it began) or on an executor running its loop: the records are
  // published at the Batch's end or the executor's flush. An executor whose loop ended looks at
  // whether the bus has stopped (see Producer::Gate).
  if (gate != Gate::kPlainGate) [[unlikely]] {
    // The lease did not take the message: the first two of a run (the second takes the lease),
    // or one after another send to the inbox closed the run. (The plain gate's look comes
    // first: one branch for it, not two.)
    if (gate == Gate::kBatchGate) {
      if (routed && publish_routed<T>(p, Gate::kBatchGate, route, std::forward<U>(msg)))
        return absl::OkStatus();
      return call_slow();
    }
    if (c.enter(p, gate)) return call_slow();  // an executor past its loop: no lease
    return detail::Core::stopped_status();
  }
  // A plain thread: enter (stop() waits for it), publish the record, wake, leave.
  constexpr Gate g = Gate::kPlainGate;
  if (!c.enter(p, g)) [[unlikely]]
    return detail::Core::stopped_status();
  if constexpr (detail::Payload<T>::kInline && std::is_nothrow_constructible_v<T, U&&>) {
    // Nothing on the inline path can throw (the message is built in the ring, not boxed with
    // `new`, by a constructor that does not throw): no scope guard (it would keep the result in
    // memory).
    if (routed && publish_routed<T>(p, g, route, std::forward<U>(msg))) [[likely]] {
      detail::Core::leave(p, g);
      return absl::OkStatus();
    }
    detail::Leave leave{p, g};
    return call_slow();
  } else {
    detail::Leave leave{p, g};  // also when building the message throws
    if (routed && publish_routed<T>(p, g, route, std::forward<U>(msg))) [[likely]]
      return absl::OkStatus();
    return call_slow();
  }
}

template <class T>
Publisher<T> Bus::publisher(const Topic<T>& topic) {
  return Publisher<T>(core_, topic);
}

template <class T, class U>
bool Bus::publish_routed(detail::Producer& p, detail::Producer::Gate g,
                         detail::Producer::Route& route, U&& msg) {
  if (static_cast<const detail::TopicState<T>*>(route.state)->targets.load() != route.list)
    return false;
  auto* t = static_cast<detail::TopicTarget<T>*>(route.target);
  // A message joins an open run of `t` without a look at its subscriber count: the run began
  // in this Batch (or executor pass) with a subscriber, and if the last one left since, the
  // message finds no handler, as one already in the ring does.
  if (g != detail::Producer::kPlainGate &&
      detail::Core::extend<T>(*route.ring, t, std::forward<U>(msg))) {
    // The second message of a run takes it (the first may be the only one: a message that
    // opens a run takes no lease, so sends to topics in turn never give one back). The lease
    // is the route's own, if it held one: spent, it went back as this run opened.
    route.ring->lease_run(reinterpret_cast<uint64_t>(t), route.lease);
    return true;
  }
  if (t->live.load(std::memory_order_relaxed) == 0 ||
      !detail::Core::append_record<T, true>(p, g, *route.ring, *t->inbox, t, route.published,
                                            std::forward<U>(msg)))
    return false;
  // Outside the plain gate the message joined a run, counted when the run closes.
  if (g == detail::Producer::kPlainGate)
    detail::CounterTable<detail::kProducerCounters>::bump(*route.published);
  return true;
}

template <class T, class U>
absl::Status Bus::publish_resolving(detail::Core& c, detail::Producer& p, detail::TopicState<T>& st,
                                    const Topic<T>& topic, detail::Producer::Route& route,
                                    U&& msg) {
  const auto* list = st.targets.load();
  absl::Status result;
  if (detail::TopicTarget<T>* t = sole_target(p, list)) {
    if (t->live.load(std::memory_order_relaxed) != 0) {
      detail::Ring& ring = p.ring_to(*t->inbox);
      auto* published = &p.counters.cell(topic.id(), detail::kPublished);
      route.set(topic.id(), &st, list, t, &ring, published);  // (gives the old lease back)
      const detail::Producer::Gate g = p.gate;
      if (detail::Core::append<T, true>(p, g, ring, *t->inbox, t, published,
                                        std::forward<U>(msg))) {
        if (g == detail::Producer::kPlainGate)
          detail::CounterTable<detail::kProducerCounters>::bump(*published);
        return absl::OkStatus();
      }
      result =
          c.send_full<T>(p, ring, *t->inbox, t, topic.overflow(), topic.id(), std::forward<U>(msg));
    }
  } else if (list != nullptr) {
    result = publish_to_list(c, p, *list, topic, std::forward<U>(msg));
  }
  p.counters.add(topic.id(), detail::kPublished);  // whatever became of its copies (see Stats)
  return result;
}

template <class T, class U>
absl::Status Bus::publish_to_list(detail::Core& c, detail::Producer& p,
                                  const detail::TargetList<detail::TopicTarget<T>>& list,
                                  const Topic<T>& topic, U&& msg) {
  absl::Status result;
  detail::TopicTarget<T>* last = nullptr;
  for (auto* t : list.targets) {
    if (t->live.load(std::memory_order_relaxed) == 0) continue;
    if (p.bridge && t->inbox == p.own_inbox) continue;  // see Producer
    // A run of `t` opened by the one-inbox route counts its messages when it closes; what is
    // sent here is counted per publish() (below): close that run rather than join it. (The
    // other way round cannot happen: a topic's target list only grows, so once a thread sends
    // here it never takes the one-inbox route for the topic again.)
    p.ring_to(*t->inbox).claim_run(reinterpret_cast<uint64_t>(t), nullptr);
    if (last) {
      absl::Status s = c.send<T, true>(p, *last->inbox, last, topic.overflow(), topic.id(),
                                       static_cast<const T&>(msg));
      if (!s.ok()) result = std::move(s);
    }
    last = t;
  }
  if (last) {
    absl::Status s =
        c.send<T, true>(p, *last->inbox, last, topic.overflow(), topic.id(), std::forward<U>(msg));
    if (!s.ok()) result = std::move(s);
  }
  return result;
}

template <class T, class F>
requires std::invocable<F&, const T&> Subscription Bus::subscribe(const Topic<T>& topic,
                                                                  F&& handler, Placement where) {
  return subscribe_at(topic, placed(where), std::forward<F>(handler));
}

template <class T, class F>
requires std::invocable<F&, std::span<const T>> Subscription
Bus::subscribe_bulk(const Topic<T>& topic, F&& handler, Placement where) {
  return add_subscriber(
      topic, placed(where),
      {0, {}, absl::AnyInvocable<void(std::span<const T>)>(std::forward<F>(handler))});
}

template <class T, class F>
Subscription Bus::subscribe_at(const Topic<T>& topic, detail::Inbox& inbox, F&& handler) {
  return add_subscriber(topic, inbox,
                        {0, detail::TopicTarget<T>::handler(std::forward<F>(handler)), nullptr});
}

template <class T>
Subscription Bus::add_subscriber(const Topic<T>& topic, detail::Inbox& inbox,
                                 typename detail::TopicTarget<T>::Sub sub) {
  auto& st = topic_state(topic);
  detail::TopicTarget<T>* target = nullptr;
  uint64_t id;
  {
    std::lock_guard lock(core_->mu);
    for (auto& t : st.targets.owned) {
      if (t->inbox == &inbox) target = t.get();
    }
    if (!target)
      target = st.targets.add(std::make_unique<detail::TopicTarget<T>>(topic.id(), inbox));
    id = ++st.last_sub;
  }
  sub.id = id;
  target->stage(&sub, 0);
  target->live.fetch_add(1, std::memory_order_relaxed);
  return Subscription(core_, [target, id](detail::Core& c) {
    target->live.fetch_sub(1, std::memory_order_relaxed);
    // What this thread published before still reaches the handler: the cancel follows it
    // through the ring (Core::cancel_on).
    if (!c.cancel_on(
            *target->inbox, [target, id] { target->stop_now(id); },
            [target] { target->apply_changes(); })) {
      target->stage(nullptr, id);  // stopped: nothing runs it any more
    }
  });
}

template <class T>
absl::Status Bus::publish_bulk(const Topic<T>& topic, std::span<const T> msgs) {
  // A batch of its own: a plain thread builds the whole span before it publishes.
  Batch batch(*this);
  if (!batch.accepted()) [[unlikely]]
    return detail::Core::stopped_status();
  detail::Producer& p = core_->producer();
  absl::Status result;
  std::size_t done = 0;
  if (detail::TopicTarget<T>* t = sole_target(p, topic_state(topic).targets.load())) {
    if (t->live.load(std::memory_order_relaxed) == 0) {
      done = msgs.size();  // no subscriber: published to nobody, as publish() does
      p.counters.add(topic.id(), detail::kPublished, done);
    } else {
      // Counted by their runs as they close (see publish_resolving()).
      detail::Ring& ring = p.ring_to(*t->inbox);
      auto* published = &p.counters.cell(topic.id(), detail::kPublished);
      done =
          detail::Core::append_all<T>(p, ring, *t->inbox, t, published, msgs.data(), msgs.size());
    }
  }
  // The rest (a full ring, several inboxes, a bridge thread) one by one: the overflow policy.
  for (; done < msgs.size(); ++done) {
    absl::Status s = publish_resolving(p, topic, msgs[done]);
    if (!s.ok() && result.ok()) result = std::move(s);
  }
  return result;
}

template <class T, MessageOf<T> U>
absl::Status Bus::send(const Queue<T>& queue, U&& msg) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (!c.enter(p)) return detail::Core::stopped_status();
  absl::Status s = queue_state(queue).route(p, T(std::forward<U>(msg)));
  p.counters.add(queue.id(), detail::kPublished);  // refused ones too: counted as failed
  c.leave(p);
  return s;
}

template <class T, class F>
requires std::invocable<F&, T&&> Subscription Bus::consume(const Queue<T>& queue, F&& handler,
                                                           Placement where) {
  auto& st = queue_state(queue);
  return add_consumer(st.targets, std::make_unique<detail::QueueTarget<T>>(
                                      queue.id(), placed(where), st,
                                      absl::AnyInvocable<void(T &&)>(std::forward<F>(handler))));
}

template <class Req, class Rep, class F>
requires std::invocable<F&, Req&&> Subscription Bus::serve(const Endpoint<Req, Rep>& endpoint,
                                                           F&& handler, Placement where) {
  auto& st = endpoint_state(endpoint);
  using Target = detail::EndpointTarget<Req, Rep>;
  return add_consumer(st.targets,
                      std::make_unique<Target>(
                          endpoint.id(), placed(where), st,
                          typename Target::Handler([f = std::forward<F>(handler)](Req&& r) mutable {
                            return detail::invoke_handler<Rep>(f, std::move(r));
                          })));
}

template <class Req, class Rep, class F>
requires std::invocable<F&, Req&&, Replier<Rep>> Subscription
Bus::serve_async(const Endpoint<Req, Rep>& endpoint, F&& handler, Placement where) {
  auto& st = endpoint_state(endpoint);
  using Target = detail::EndpointTarget<Req, Rep>;
  return add_consumer(st.targets,
                      std::make_unique<Target>(endpoint.id(), placed(where), st,
                                               typename Target::Async(std::forward<F>(handler))));
}

template <class Tgt>
Subscription Bus::add_consumer(detail::Targets<Tgt>& targets, std::unique_ptr<Tgt> owned) {
  Tgt* target;
  {
    std::lock_guard lock(core_->mu);
    target = targets.add(std::move(owned));
  }
  return Subscription(core_, [&targets, target](detail::Core& c) {
    {
      std::lock_guard lock(c.mu);
      targets.remove(target);
    }
    // Messages already on their way to it are handed to another consumer by its inbox.
    (void)c.cancel_on(
        *target->inbox, [target] { target->stopped = true; }, [target] { target->retire(); });
  });
}

template <class Req, class Rep, MessageOf<Req> R, class F>
requires std::invocable<F&, absl::StatusOr<Rep>>
void Bus::request(const Endpoint<Req, Rep>& endpoint, R&& req, Clock::duration timeout,
                  F&& callback) {
  auto deadline = Clock::now() + timeout;
  detail::Producer& p = core_->producer();
  if (p.own_inbox != nullptr) {
    request_from(p, *p.own_inbox, endpoint, Req(std::forward<R>(req)), deadline,
                 std::forward<F>(callback));
    return;
  }
  // A plain thread has no inbox for the reply: make the request from an executor, for this
  // thread's principal. Handing it over waits for room in this thread's ring no longer than the
  // deadline.
  auto cb = std::make_shared<std::decay_t<F>>(std::forward<F>(callback));
  auto make = [this, &endpoint, req = Req(std::forward<R>(req)), deadline, cb,
               principal = detail::current_principal()]() mutable {
    PrincipalScope acting_for(principal);
    detail::Producer& ep = core_->producer();
    request_from(ep, *ep.own_inbox, endpoint, std::move(req), deadline,
                 [cb](absl::StatusOr<Rep> r) mutable { (*cb)(std::move(r)); });
  };
  absl::Status st = post_to(placed(Placement{}),
                            detail::DeadlineClosure<decltype(make)>{std::move(make), deadline});
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      p.counters.add(endpoint.id(), detail::kPublished);
      p.counters.add(endpoint.id(), detail::kFailed);
    }
    (*cb)(absl::StatusOr<Rep>(st));  // on this thread: no executor took the request
  }
}

template <class Req, class Rep, class F>
void Bus::request_from(detail::Producer& p, detail::Inbox& home, const Endpoint<Req, Rep>& endpoint,
                       Req&& req, Clock::time_point deadline, F&& callback,
                       detail::EndpointTarget<Req, Rep>* to) {
  detail::Core& c = *core_;
  using CB = std::decay_t<F>;
  auto fail = [&](absl::Status s) {
    // Never call back inside request(): the failure waits in the caller's own inbox (`home` is
    // this thread's), outside its rings, which may be full.
    home.defer([cb = CB(std::forward<F>(callback)), s]() mutable { cb(absl::StatusOr<Rep>(s)); });
  };
  if (!c.enter(p)) {
    if (c.state() == detail::State::kStopped) {
      CB(std::forward<F>(callback))(absl::StatusOr<Rep>(detail::Core::stopped_status()));
    } else {
      fail(detail::Core::stopped_status());
    }
    return;
  }
  uint64_t corr = home.reserve_pending();
  p.counters.add(endpoint.id(), detail::kPublished);  // refused ones too: counted as failed
  if (corr == 0) [[unlikely]] {
    c.leave(p);
    p.counters.add(endpoint.id(), detail::kFailed);
    fail(absl::ResourceExhaustedError(absl::StrCat(
        "bus: ", home.max_pending(), " requests are waiting for replies on this thread already (",
        "Options::max_pending_requests); request to '", endpoint.name(), "' refused")));
    return;
  }
  detail::RequestEnvelope<Req, Rep> env{std::move(req), corr,     &home,
                                        nullptr,        deadline, detail::current_principal()};
  auto& st = endpoint_state(endpoint);
  absl::Status s = to ? st.send_to(p, *to, std::move(env)) : st.route(p, std::move(env));
  c.leave(p);
  if (!s.ok()) {
    home.release_pending(corr);
    fail(std::move(s));  // counted as failed by route()
    return;
  }
  // A request waits for its reply: it leaves at once (with what this thread sent before it), not
  // at the end of the handler batch making it. A Batch still holds it until the Batch ends.
  if (p.executor_unbatched()) p.flush();
  home.add_pending(corr, endpoint.id(), deadline,
                   [cb = CB(std::forward<F>(callback))](absl::Status st, void* rep) mutable {
                     if (st.ok()) {
                       cb(absl::StatusOr<Rep>(std::move(*static_cast<Rep*>(rep))));
                     } else {
                       cb(absl::StatusOr<Rep>(std::move(st)));
                     }
                   });
}

template <class Req, class Rep, MessageOf<Req> R>
absl::StatusOr<Rep> Bus::call(const Endpoint<Req, Rep>& endpoint, R&& req,
                              Clock::duration timeout) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (p.executor || p.bridge_thread) [[unlikely]] {
    return absl::FailedPreconditionError(
        p.executor ? "bus: call() would block an executor; use request() with a callback"
                   : "bus: call() would block a node's bridge thread (a Node::subscribe or "
                     "Node::serve handler); use request() with a callback");
  }
  auto deadline = Clock::now() + timeout;
  auto no_reply = [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("bus: no reply from '", endpoint.name(), "' before the deadline"));
  };
  if (!c.enter(p)) return detail::Core::stopped_status();
  auto& st = endpoint_state(endpoint);
  Req request(std::forward<R>(req));
  auto* t =
      detail::pick(p, st.targets.load(), st.channel, st.key, static_cast<const Req&>(request));
  if (t != nullptr && t->direct) {
    // Another node's server: this thread sends the request and waits for the reply itself.
    std::shared_ptr<const typename detail::EndpointTarget<Req, Rep>::Direct> direct = t->direct;
    c.leave(p);
    p.counters.add(endpoint.id(), detail::kPublished);
    p.flush();  // what this thread published in a Batch goes before the request, as below
    std::optional<absl::StatusOr<Rep>> rep = (*direct)(std::move(request), deadline);
    if (!rep) return no_reply();
    return std::move(*rep);
  }
  auto waiter = std::make_shared<detail::Waiter<Rep>>();
  // Registered before the request leaves: stop() ends a call it finds there with Cancelled
  // (it looks once nothing is in flight, so after this thread's send and leave).
  detail::Producer::Calling calling(p, waiter);
  absl::Status s =
      st.route_to(p, t,
                  detail::RequestEnvelope<Req, Rep>{std::move(request), 0, nullptr, waiter,
                                                    deadline, detail::current_principal()});
  c.leave(p);
  p.counters.add(endpoint.id(), detail::kPublished);
  if (!s.ok()) return s;  // counted as failed where it failed
  p.flush();              // inside a Batch the request would otherwise wait for the batch to end
  if (waiter->wait_until(deadline)) return std::move(*waiter->result);
  return no_reply();
}

template <class S, class... A>
Service<S> Bus::service(Placement where, A&&... args) {
  unsigned executor = place(where);
  auto state = std::make_shared<S>(std::forward<A>(args)...);
  S* raw = state.get();
  return Service<S>(this, raw, keep_service(std::move(state)), executor);
}

template <class S, class... A>
ServiceGroup<S> Bus::group(unsigned n, bool sharded, const A&... args) {
  ServiceGroup<S> g;
  g.sharded_ = sharded;
  unsigned first = place(Placement{});
  for (unsigned i = 0; i < n; ++i) {
    g.members_.push_back(service<S>(on_executor((first + i) % executors()), args...));
  }
  return g;
}
template <class S, class... A>
ServiceGroup<S> Bus::pool(unsigned n, const A&... args) {
  return group<S>(n, false, args...);
}
template <class S, class... A>
ServiceGroup<S> Bus::sharded(unsigned n, const A&... args) {
  return group<S>(n, true, args...);
}

template <class F>
absl::Status Bus::post_to(detail::Inbox& inbox, F&& fn) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (!c.enter(p)) return detail::Core::stopped_status();
  if (!p.executor && &inbox == p.own_inbox) {
    // An event loop posting to itself (a request's failure, a reply for its own thread): its
    // ring could be full, and only this thread drains it. Keep it in the inbox instead.
    inbox.defer(std::forward<F>(fn));
    c.leave(p);
    return absl::OkStatus();
  }
  using Fn = std::decay_t<F>;
  absl::Status s = c.send<Fn>(p, inbox, &detail::ClosureTarget<Fn>::kTarget, Overflow::kBlock,
                              UINT32_MAX, std::forward<F>(fn));
  c.leave(p);
  return s;
}

template <class F>
requires std::invocable<F&> absl::Status Bus::post(Placement where, F&& fn) {
  return post_to(placed(where), std::forward<F>(fn));
}

template <class F>
requires std::invocable<F&> TimerId Bus::after(Placement where, Clock::duration delay, F&& fn) {
  return schedule(where, delay, Clock::duration::zero(), std::forward<F>(fn));
}

template <class F>
requires std::invocable<F&> TimerId Bus::every(Placement where, Clock::duration period, F&& fn) {
  return schedule(where, period, period, std::forward<F>(fn));
}

template <class F>
TimerId Bus::schedule(Placement where, Clock::duration first, Clock::duration period, F&& fn) {
  detail::Inbox& in = placed(where);
  uint64_t id = in.reserve_timer_id();
  auto at = Clock::now() + first;
  absl::Status s = post_to(in, [&in, id, at, period, fn = std::forward<F>(fn)]() mutable {
    in.add_timer(id, at, period, std::move(fn), false);
  });
  return s.ok() ? TimerId{in.index(), id} : TimerId{};
}

}  // namespace bus
