// One thread's sending side of a bus (Producer), what it counts, and the closures and waiters its
// sends carry; Core (core.hpp) owns the producers.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>
#include <absl/strings/str_cat.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <concepts>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bus/channel.hpp"
#include "bus/detail/counters.hpp"
#include "bus/detail/inbox.hpp"
#include "bus/detail/record.hpp"
#include "bus/detail/ring.hpp"
#include "bus/options.hpp"

namespace bus::detail {

/// Counters a thread keeps per channel as it sends (docs/core.md, "Stats", defines each).
enum ProducerCounter : std::size_t {
  kPublished,
  kDropped,
  kFailed,
  kRepliedLate,  // answers this thread gave to a call() that had ended already
  kProducerCounters
};
enum class State : int { kRunning, kDraining, kStopped };

/// A closure posted with a deadline (a plain thread's request() handed to an executor): a
/// plain thread waits for room in the ring no longer than that (see deadline_of()).
template <class F>
struct DeadlineClosure {
  F fn;
  Clock::time_point deadline;
  void operator()() { fn(); }
};

/// A cancel's closure (Core::cancel_on): essential (see kEssential).
struct ControlClosure {
  absl::AnyInvocable<void()> fn;
  void operator()() { fn(); }
};
template <>
inline constexpr bool kEssential<ControlClosure> = true;

/// A plain thread blocked in call() (detail::Waiter): its state word, and how stop() ends it.
struct WaiterBase {
  enum : uint32_t { kWaiting, kWriting, kDone, kAbandoned };
  std::atomic<uint32_t> state{kWaiting};
  virtual ~WaiterBase() = default;
  /// Any thread: the outcome is Cancelled `why`, unless it was decided already.
  virtual void cancel(const absl::Status& why) = 0;
  /// The caller: waits until the outcome is decided (true: the result may be taken) or, when
  /// `deadline` comes first, gives up (false).
  bool wait_until(Clock::time_point deadline);
};

/// The deadline a record's payload carries (a request's), or none: how long a plain thread may
/// wait for room in a full ring to send it (Core::send_full). `args` build the payload.
template <class P>
concept CarriesDeadline = requires(const P& p) {
  { p.deadline } -> std::convertible_to<Clock::time_point>;
};
template <class... A>
Clock::time_point deadline_of(const A&...) {
  return Clock::time_point::max();
}
template <CarriesDeadline P>
Clock::time_point deadline_of(const P& payload) {
  return payload.deadline;
}

/// One thread's sending side for one bus: its rings (one per inbox it has sent to), the rings
/// waiting to be published, its counters, and (executors only) the records held back while a
/// destination ring is full.
struct Producer {
  /// How a send enters the bus and when its ring is published: kPerSend, a plain thread
  /// (stop() waits for its publish, published per send); kOpen, entered already and published
  /// at a flush: inside a Batch (entered when it began, published when it ends) or an executor
  /// running its loop (published at the end of each handler batch); kOutsideLoop, an executor
  /// before its loop starts or after it ended (the bus stopped): it looks at the state per
  /// send, and its sends are refused once the bus has stopped.
  ///
  /// An executor's loop needs no look at the state per send: stop() flips to kStopped only when
  /// no handler runs and none can start but a timer's or a deadline's, which counts itself in
  /// ticks_started first and looks at the state after (stop() then sees the tick and goes back
  /// to draining, so what that handler sends is delivered). Only what runs after the loop (the
  /// callbacks of requests cancelled by the stop) is refused.
  enum Gate : uint8_t { kOpen, kOutsideLoop, kPerSend };

  Producer(Core& c, std::weak_ptr<Core> w, Inbox* own, bool is_executor)
      : core(c),
        weak(std::move(w)),
        own_inbox(own),
        executor(is_executor),
        one_cpu(!is_executor && on_one_cpu()),
        gate(executor ? kOutsideLoop : kPerSend) {}

  Core& core;
  std::weak_ptr<Core> weak;
  uint64_t uid = 0;
  Inbox* own_inbox;  // the inbox this thread drains, if any
  const bool executor;
  // A plain thread whose process may run on one CPU only (on_one_cpu(), looked at once): waiting
  // for room, it yields the CPU to the consumer instead of pausing.
  const bool one_cpu;
  // A bridge thread (bus::net) never takes the one-inbox route (send_to_each() instead, which
  // looks at `bridge`).
  bool bridge_thread = false;
  // Set while a bridge thread hands on what came from another node: its publishes then skip the
  // targets on its own inbox (the bridge's export subscriptions) and its sends and requests skip
  // remote proxies, so such a message is never sent back out. Clear while the bridge thread runs
  // handlers (Node::subscribe, Node::serve): what they publish, send and request goes everywhere.
  bool bridge = false;
  std::vector<std::shared_ptr<Ring>> rings;  // by destination inbox index
  std::vector<Ring*> unpublished;
  int batch_depth = 0;
  // kOpen while batch_depth > 0 (a Batch restores the gate it found) and while an executor
  // runs its loop (Core::run_executor() opens it, and closes it after).
  Gate gate;
  /// An executor outside a Batch: its sends are published at the end of its handler batch.
  bool executor_unbatched() const { return executor && batch_depth == 0; }
  std::vector<uint32_t> round_robin;  // per channel id
  CounterTable<kProducerCounters> counters;

  /// A topic this thread publishes to whose subscribers are all on one inbox, resolved once: the
  /// target list it was resolved from (a change of subscribers installs a new list, and the
  /// route no longer matches), the target, this thread's ring to its inbox and its published
  /// counter. Direct-mapped by channel id; Bus::publish() fills and checks it. Inside a Batch or
  /// an executor's pass it may hold the open run of its target in `ring` (`lease`,
  /// Ring::lease_run()), which goes back to that ring when the route is set again, moved from
  /// or destroyed.
  struct alignas(64) Route {  // one line: the lookup is a shift
    uint32_t channel = UINT32_MAX;
    const void* state = nullptr;  // the channel's TopicState<T>
    const void* list = nullptr;
    Target* target = nullptr;
    Ring* ring = nullptr;
    std::atomic<uint64_t>* published = nullptr;
    RunLease lease;

    Route() = default;
    Route(Route&& o) noexcept { *this = std::move(o); }
    Route& operator=(Route&& o) noexcept {
      o.give_back();
      set(o.channel, o.state, o.list, o.target, o.ring, o.published);
      return *this;
    }
    ~Route() { give_back(); }
    /// Routes to `t` through `r` from now on; a lease held goes back first.
    void set(uint32_t ch, const void* st, const void* l, Target* t, Ring* r,
             std::atomic<uint64_t>* counter) {
      give_back();
      channel = ch;
      state = st;
      list = l;
      target = t;
      ring = r;
      published = counter;
    }
    void give_back() {
      if (lease.held()) ring->return_lease(lease);
    }
  };
  static_assert(sizeof(Route) == 64);
  static constexpr std::size_t kRoutes = 64;
  std::array<Route, kRoutes> routes{};

  struct Held {
    Ring* ring;
    std::unique_ptr<uint64_t[]> record;
  };
  std::deque<Held> backlog;
  std::size_t backlog_rings = 0;          // rings with held records
  std::atomic<uint64_t> backlog_size{0};  // read by stop()

  // A plain thread's call() waiting for its reply, for stop() to end (Core::stop).
  std::mutex call_mu;
  std::shared_ptr<WaiterBase> calling;  // under call_mu
  /// Registers a call() for its scope.
  class Calling {
   public:
    Calling(Producer& p, std::shared_ptr<WaiterBase> w) : p_(p) {
      std::lock_guard lock(p_.call_mu);
      p_.calling = std::move(w);
    }
    Calling(const Calling&) = delete;
    Calling& operator=(const Calling&) = delete;
    ~Calling() {
      std::lock_guard lock(p_.call_mu);
      p_.calling = nullptr;
    }

   private:
    Producer& p_;
  };

  // Set while a plain thread is inside publish (or a Batch); stop() waits for it to clear.
  alignas(kCacheLine) std::atomic<uint32_t> active{0};

  Ring& ring_to(Inbox& dest) {
    uint32_t i = dest.index();
    if (i < rings.size() && rings[i]) [[likely]]
      return *rings[i];
    return new_ring_to(dest);
  }
  Ring& new_ring_to(Inbox& dest);
  /// Publishes every ring written since the last flush and wakes their consumers.
  void flush();
  /// Moves held records into their rings as room appears. Returns how many moved.
  std::size_t drain_backlog();
  /// Flags the rings this executor's backlog waits on, so their consumers wake it.
  void want_room();
  /// True when a ring this executor's backlog waits on has room for its next record.
  bool backlog_has_room();
  uint32_t next_round_robin(uint32_t channel) {
    if (channel >= round_robin.size()) round_robin.resize(channel + 1, 0);
    return round_robin[channel]++;
  }
};

}  // namespace bus::detail
