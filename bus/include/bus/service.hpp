// Service<S> and ServiceGroup<S>: state pinned to an executor and the handlers that share it.
// Part of bus/bus.hpp.
#pragma once

#include <absl/status/status.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bus/channel.hpp"
#include "bus/subscription.hpp"

namespace bus {

class Bus;

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

/// A handle to state `S` pinned to one executor (made by Bus::service()). Handlers take
/// `(S&, message)`; member function pointers work too. Every registration and callback of the
/// service runs on its executor, one at a time, and none runs after stop(). Handles are cheap
/// to copy; the bus owns the state until stop() or until the bus goes.
template <class S>
class Service {
 public:
  unsigned executor() const { return executor_; }
  /// The state. Touch it only from the service's own handlers, or after the bus stopped (and
  /// never after stop()).
  S& state() const { return *state_; }
  /// False once stop() began.
  bool running() const { return life_->alive.load(std::memory_order_relaxed); }

  /// Bus::subscribe(), Bus::subscribe_bulk(), Bus::consume() and Bus::serve() on the service's
  /// executor, with `f(S&, ...)`. A request served after stop() began answers Unavailable.
  template <class T, class F>
  Service& subscribe(const Topic<T>& topic, F f);
  template <class T, class F>
  Service& subscribe_bulk(const Topic<T>& topic, F f);
  template <class T, class F>
  Service& consume(const Queue<T>& queue, F f);
  template <class Req, class Rep, class F>
  Service& serve(const Endpoint<Req, Rep>& endpoint, F f);
  /// Serves with answers that may come later: `f(S&, Req&&, bus::Replier<Rep>)` (see
  /// Bus::serve_async). If the service stops first, the replier answers Unavailable.
  template <class Req, class Rep, class F>
  Service& serve_async(const Endpoint<Req, Rep>& endpoint, F f);

  /// `fn(S&)` after `delay` / every `period`, on the service's executor (never after stop()).
  template <class F>
  TimerId after(Clock::duration delay, F fn);
  template <class F>
  TimerId every(Clock::duration period, F fn);
  /// `fn(S&)` on the service's executor (dropped if the service stops first).
  template <class F>
  absl::Status post(F fn);
  /// A request made by the service: `callback(S&, absl::StatusOr<Rep>)` runs on its executor,
  /// unless the service stopped meanwhile (then it does not run at all).
  template <class Req, class Rep, class F>
  void request(const Endpoint<Req, Rep>& endpoint, Req req, Clock::duration timeout, F callback);

  /// Stops the service: its handlers, timers and reply callbacks stop running, its
  /// registrations are removed (queue and endpoint traffic goes to the other consumers, or
  /// fails with Unavailable), and its state is destroyed on its executor. From another thread,
  /// returns once that is done; from one of its own handlers, the state goes when that handler
  /// returns (and so in a cycle of cancels: see Subscription). Never deadlocks. Requests it made
  /// that are still in flight are dropped when their replies come. Idempotent.
  void stop();

 private:
  friend class Bus;
  Service(Bus* bus, S* state, detail::ServiceLife* life, unsigned executor)
      : bus_(bus), state_(state), life_(life), executor_(executor) {}
  Service& keep(Subscription sub);
  /// `fn(S&)` as a closure that does nothing once the service stopped.
  template <class F>
  auto guarded(F fn);

  Bus* bus_;
  S* state_;
  detail::ServiceLife* life_;
  unsigned executor_;
};

/// N instances of a service on distinct executors (as far as there are executors), made by
/// Bus::pool() (round-robin) or Bus::sharded() (each instance owns the keys that hash to it).
template <class S>
class ServiceGroup {
 public:
  std::size_t size() const { return members_.size(); }
  Service<S>& operator[](std::size_t i) { return members_[i]; }
  auto begin() { return members_.begin(); }
  auto end() { return members_.end(); }

  /// The same registration on every member. A sharded group takes only keyed queues and
  /// endpoints (std::invalid_argument otherwise).
  template <class T, class F>
  ServiceGroup& subscribe(const Topic<T>& topic, F f);
  template <class T, class F>
  ServiceGroup& consume(const Queue<T>& queue, F f);
  template <class Req, class Rep, class F>
  ServiceGroup& serve(const Endpoint<Req, Rep>& endpoint, F f);
  template <class Req, class Rep, class F>
  ServiceGroup& serve_async(const Endpoint<Req, Rep>& endpoint, F f);
  /// Stops every member (see Service::stop()).
  void stop();

 private:
  friend class Bus;
  void check_keyed(bool keyed, const std::string& name) const;
  std::vector<Service<S>> members_;
  bool sharded_ = false;
};

}  // namespace bus

#include "bus/bus.hpp"  // the definitions (bus/detail/service-inl.hpp)
