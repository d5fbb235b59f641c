// The one include for in-process work: channels, the Bus, services, request/reply, timers.
//
// What each public class is and promises is in its own header: bus/channel.hpp (Topic, Queue,
// Endpoint), bus/subscription.hpp, bus/batch.hpp, bus/publisher.hpp, bus/external_inbox.hpp,
// bus/service.hpp, bus/replier.hpp, bus/options.hpp, bus/stats.hpp, bus/principal.hpp. The
// template bodies are in bus/detail/*-inl.hpp.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <chrono>
#include <concepts>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "bus/batch.hpp"
#include "bus/channel.hpp"
#include "bus/detail/core.hpp"
#include "bus/detail/endpoint_target.hpp"
#include "bus/external_inbox.hpp"
#include "bus/options.hpp"
#include "bus/principal.hpp"
#include "bus/publisher.hpp"
#include "bus/replier.hpp"
#include "bus/service.hpp"
#include "bus/stats.hpp"
#include "bus/subscription.hpp"

namespace bus {

class Reactor;
namespace net::detail {
struct BusAccess;
}

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
  /// publish()'s out-of-line step (detail::resolve_and_send()), one member call in few
  /// registers: see Publisher::publish_slow().
  template <class T, class U>
  [[gnu::noinline]] absl::Status publish_slow(detail::Producer& p, const Topic<T>& topic, U&& msg);
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

}  // namespace bus

#include "bus/detail/bus-inl.hpp"
#include "bus/detail/external_inbox-inl.hpp"
#include "bus/detail/publisher-inl.hpp"
#include "bus/detail/service-inl.hpp"
