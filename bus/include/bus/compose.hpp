// Composing requests: several calls, one deadline, one continuation (QBit's Reactor).
//
//   struct Checkout {                      // a service: its handlers run on one executor
//     explicit Checkout(bus::Bus& bus) : reactor(bus) {}
//     bus::Reactor reactor;                // dies with the service: nothing calls back after
//     void on_order(const Order& o) {
//       reactor.all(200ms, bus::call(prices, PriceReq{o.item}), bus::call(stock, StockReq{o.item}))
//           .then([this](absl::StatusOr<Price> price, absl::StatusOr<Level> level) { ... });
//     }
//   };
//
// The requests go out at once; the continuation runs on the thread that started the
// composition (the service's executor, or the event loop of an external inbox), like every
// reply, and no thread waits meanwhile. Every call's deadline is at most the composition's, so
// the continuation of all() runs by that deadline at the latest.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "bus/bus.hpp"

namespace bus {

/// One request of a composition: made with bus::call().
template <class Req, class Rep>
struct Call {
  using Request = Req;
  using Reply = Rep;
  const Endpoint<Req, Rep>* endpoint;
  Req request;
  std::optional<Clock::duration> timeout;  // this call's own, when shorter than the composition's

  /// Gives this call a deadline of its own (the composition's still applies if it is shorter).
  Call within(Clock::duration t) && {
    timeout = t;
    return std::move(*this);
  }
};

template <class Req, class Rep, MessageOf<Req> R>
Call<Req, Rep> call(const Endpoint<Req, Rep>& endpoint, R&& request) {
  return Call<Req, Rep>{&endpoint, Req(std::forward<R>(request)), std::nullopt};
}

/// How many compositions a Reactor keeps, with fluent setters.
class ReactorOptions {
 public:
  /// Compositions with requests still out, at most; past it a new one is refused at once (its
  /// continuation gets ResourceExhausted for every call) and counted.
  ReactorOptions& max_pending_compositions(std::size_t n) {
    max_pending_compositions_ = n;
    return *this;
  }
  std::size_t max_pending_compositions() const { return max_pending_compositions_; }

 private:
  std::size_t max_pending_compositions_ = 10'000;
};

struct ReactorStats {
  uint64_t started = 0;    // compositions whose requests went out
  uint64_t completed = 0;  // continuations that ran
  uint64_t rejected =
      0;  // refused: max_pending_compositions reached (their continuation got the refusal)
  uint64_t abandoned = 0;  // continuations dropped because the reactor went first
  uint64_t pending = 0;    // now: compositions with requests still out
};

namespace detail {

/// What a reactor's compositions share. Written on the owning thread only.
struct ReactorCore {
  explicit ReactorCore(std::size_t max) : max_pending(max) {}
  const std::size_t max_pending;
  Inbox* home = nullptr;          // the owning thread's inbox, set by the first composition
  std::atomic<bool> alive{true};  // false once the reactor is destroyed
  std::size_t awaiting = 0;       // compositions whose continuation has not run
  std::atomic<uint64_t> started{0}, completed{0}, rejected{0}, abandoned{0}, pending{0};

  static void bump(std::atomic<uint64_t>& c, int64_t by = 1) {
    c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
  }
  /// The continuation is due: true if it may run (the reactor still exists).
  bool due() {
    // A reactor that went counted its awaiting compositions as abandoned when it went.
    if (!alive.load(std::memory_order_relaxed)) return false;
    --awaiting;
    bump(completed);
    return true;
  }
  /// Every request of a composition has its answer.
  void settled() { bump(pending, -1); }
};

template <class C>
using CallOf = std::remove_cvref_t<C>;

}  // namespace detail

template <class... C>
class AllOf;
template <class... C>
class FirstOf;
template <class Req, class Rep>
class EachOf;

/// Starts compositions of requests and runs their continuations, on one thread: the executor
/// (or external inbox's loop) where it is first used. Destroying it abandons the compositions
/// in progress: their continuations never run (their requests finish and are forgotten), which
/// is what makes a reactor held by a service safe when the service stops. Destroy it on that
/// thread (a service's state is), or once the bus has stopped.
class Reactor {
 public:
  explicit Reactor(Bus& bus, ReactorOptions options = {})
      : bus_(bus),
        core_(std::make_shared<detail::ReactorCore>(options.max_pending_compositions())) {}
  Reactor(const Reactor&) = delete;
  Reactor& operator=(const Reactor&) = delete;
  ~Reactor();

  /// Every call; `then(absl::StatusOr<Rep>...)` (one argument per call, in order) runs once all
  /// have answered, failed or reached their deadline: by `timeout` at the latest.
  template <class... C>
  [[nodiscard]] AllOf<detail::CallOf<C>...> all(Clock::duration timeout, C&&... calls) {
    static_assert(sizeof...(C) > 0, "bus::Reactor::all needs at least one call");
    return AllOf<detail::CallOf<C>...>(*this, timeout, std::forward<C>(calls)...);
  }
  /// The first success: `then(absl::StatusOr<Rep>, std::size_t index)` runs as soon as one call
  /// succeeds (index: which), or once every call failed (the last failure's code, all their
  /// messages; index: SIZE_MAX). The calls share one reply type. Later replies are dropped.
  template <class... C>
  [[nodiscard]] FirstOf<detail::CallOf<C>...> first(Clock::duration timeout, C&&... calls) {
    static_assert(sizeof...(C) > 0, "bus::Reactor::first needs at least one call");
    return FirstOf<detail::CallOf<C>...>(*this, timeout, std::forward<C>(calls)...);
  }
  /// Fan-out: the request to every server of `endpoint` (each instance of a pool, each shard;
  /// the bridge's proxy counts as one, served by one remote node), and
  /// `then(std::vector<absl::StatusOr<Rep>>)` with their answers in the servers' order once all
  /// are in (empty when nothing serves the endpoint). `Req` must be copyable.
  template <class Req, class Rep, MessageOf<Req> R>
  [[nodiscard]] EachOf<Req, Rep> each(const Endpoint<Req, Rep>& endpoint, R&& request,
                                      Clock::duration timeout) {
    return EachOf<Req, Rep>(*this, endpoint, Req(std::forward<R>(request)), timeout);
  }

  /// Readable from any thread.
  ReactorStats stats() const;

 private:
  template <class... C>
  friend class AllOf;
  template <class... C>
  friend class FirstOf;
  template <class Req, class Rep>
  friend class EachOf;

  /// The calling thread's producer, after checking that it owns this reactor's inbox.
  detail::Producer& owner();
  /// Counts a new composition in; false (and the refusal is counted) past max_pending.
  bool admit();
  /// Runs `fn` later on the owning thread (never inside then()), unless the reactor goes first.
  template <class F>
  void later(F fn);
  /// The ResourceExhausted a refused composition's continuation gets.
  static absl::Status refusal(std::size_t max);
  /// Sends one call of a composition from `p`: its deadline is `now` plus the shorter of
  /// `timeout` and the call's own; `cb` gets the reply on the owning thread.
  template <class Call, class CB>
  void issue(detail::Producer& p, Call&& c, Clock::time_point now, Clock::duration timeout,
             CB&& cb);

  /// The endpoint's servers now (a snapshot that stays valid while the bus lives).
  template <class Req, class Rep>
  const detail::TargetList<detail::EndpointTarget<Req, Rep>>* servers(
      const Endpoint<Req, Rep>& endpoint);
  /// Sends `request` to `server` itself, past the endpoint's choice of server (each() asks all).
  template <class Req, class Rep, class CB>
  void issue_to(detail::Producer& p, const Endpoint<Req, Rep>& endpoint,
                detail::EndpointTarget<Req, Rep>* server, Req&& request, Clock::time_point deadline,
                CB&& cb);

  Bus& bus_;
  std::shared_ptr<detail::ReactorCore> core_;
};

// ==== the compositions ==========================================================================

/// Returned by Reactor::all(): nothing is sent until then().
template <class... C>
class AllOf {
 public:
  AllOf(Reactor& r, Clock::duration timeout, C... calls)
      : reactor_(r), timeout_(timeout), calls_(std::move(calls)...) {}

  /// Sends every call now and runs `fn(absl::StatusOr<Reply>...)` once, on the reactor's thread,
  /// when all have answered or failed. Call it on that thread; a refused composition's `fn`
  /// still runs (later, with ResourceExhausted for every call), an abandoned one's never does.
  template <class F>
  void then(F&& fn) &&;

 private:
  Reactor& reactor_;
  Clock::duration timeout_;
  std::tuple<C...> calls_;
};

/// Returned by Reactor::first(): nothing is sent until then().
template <class... C>
class FirstOf {
  using Rep = typename std::tuple_element_t<0, std::tuple<C...>>::Reply;
  static_assert((std::is_same_v<typename C::Reply, Rep> && ...),
                "bus::Reactor::first: every call must have the same reply type");

 public:
  FirstOf(Reactor& r, Clock::duration timeout, C... calls)
      : reactor_(r), timeout_(timeout), calls_(std::move(calls)...) {}

  /// Sends every call now and runs `fn(absl::StatusOr<Reply>, std::size_t index)` once, on the
  /// reactor's thread: for the first success, or once all failed (index SIZE_MAX).
  template <class F>
  void then(F&& fn) &&;

 private:
  Reactor& reactor_;
  Clock::duration timeout_;
  std::tuple<C...> calls_;
};

/// Returned by Reactor::each(): nothing is sent until then().
template <class Req, class Rep>
class EachOf {
 public:
  EachOf(Reactor& r, const Endpoint<Req, Rep>& endpoint, Req request, Clock::duration timeout)
      : reactor_(r), endpoint_(endpoint), request_(std::move(request)), timeout_(timeout) {}

  /// Sends a copy of the request to each server there is now and runs
  /// `fn(std::vector<absl::StatusOr<Reply>>)` once, on the reactor's thread, with every answer.
  template <class F>
  void then(F&& fn) &&;

 private:
  Reactor& reactor_;
  const Endpoint<Req, Rep>& endpoint_;
  Req request_;
  Clock::duration timeout_;
};

}  // namespace bus

#include "bus/detail/compose-inl.hpp"
