// The bus's shared state: inboxes, executors, per-thread producers and the send primitive.
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
  /// How a send enters the bus and when its ring is published: kPlainGate, a plain thread
  /// (stop() waits for its publish, published per send); kBatchGate, entered already and
  /// published at a flush: inside a Batch (entered when it began, published when it ends) or an
  /// executor running its loop (published at the end of each handler batch); kExecutorGate, an
  /// executor whose loop has ended (the bus stopped): its sends are refused.
  ///
  /// An executor's loop needs no look at the state per send: stop() flips to kStopped only when
  /// no handler runs and none can start but a timer's or a deadline's, which counts itself in
  /// ticks_started first and looks at the state after (stop() then sees the tick and goes back
  /// to draining, so what that handler sends is delivered). Only what runs after the loop (the
  /// callbacks of requests cancelled by the stop) is refused.
  enum Gate : uint8_t { kBatchGate, kExecutorGate, kPlainGate };

  Producer(Core& c, std::weak_ptr<Core> w, Inbox* own, bool is_executor)
      : core(c),
        weak(std::move(w)),
        own_inbox(own),
        executor(is_executor),
        one_cpu(!is_executor && on_one_cpu()),
        gate(executor ? kExecutorGate : kPlainGate) {}

  Core& core;
  std::weak_ptr<Core> weak;
  uint64_t uid = 0;
  Inbox* own_inbox;  // the inbox this thread drains, if any
  const bool executor;
  // A plain thread whose process may run on one CPU only (on_one_cpu(), looked at once): waiting
  // for room, it yields the CPU to the consumer instead of pausing.
  const bool one_cpu;
  // A bridge thread (bus::net) never takes the one-inbox route (publish_to_list() instead, which
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
  // kBatchGate while batch_depth > 0 (a Batch restores the gate it found) and while an executor
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

/// What an unresolved Route's `list` points to: no target list has its address.
inline const char kUnresolvedRoute = 0;

/// Per-bus state of one channel (its targets), kept in a chunked table read without a lock.
/// Every publish reads it (is the thread's route still the channel's target list?), so it has
/// its lines to itself: a consumer writing an object the allocator put beside it took the line
/// from the publishing core on every message. (bench/queues, 64-byte batched case, a
/// subscriber's counters beside it: 43% of the producer's samples on that load, 2% aligned. The
/// payload stores bound that case's rate, which did not move.)
class alignas(kCacheLine) ChannelState {
 public:
  virtual ~ChannelState() = default;
};

class Core {
 public:
  Core(const Options& options, uint64_t uid);
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;
  ~Core();

  /// Starts the executor threads; `self` is the owning shared_ptr (for producers' weak refs).
  void start(const std::shared_ptr<Core>& self);
  absl::Status stop();

  const Options& options() const { return options_; }
  uint64_t uid() const { return uid_; }
  State state() const { return state_.load(std::memory_order_relaxed); }
  /// Set by stop() once the bus has stopped for good (kStopped, and no timer started in the
  /// window): executors leave their loops then, not when they see kStopped, which stop() takes
  /// back when a timer started in the window (a handler that runs then may send to any executor).
  bool exiting() const { return exit_.load(std::memory_order_acquire); }
  unsigned executor_count() const { return static_cast<unsigned>(executors_.size()); }
  Inbox& executor(unsigned i) { return *executors_[i]; }
  unsigned next_placement() {
    return placement_.fetch_add(1, std::memory_order_relaxed) % executor_count();
  }

  /// A new inbox owned by an external event loop (woken through an eventfd).
  Inbox& create_external_inbox();

  /// This thread's producer for this bus (created on first use).
  Producer& producer() {
    if (tls_uid_ == uid_) [[likely]]
      return *tls_producer_;
    return producer_slow();
  }
  /// Makes `inbox` the one this thread drains (its replies and callbacks land there).
  void bind_thread(Inbox& inbox);

  /// Cancels something that lives on `owner` (a subscriber, consumer, server, timer or service):
  /// `now` (flags its handlers look at: safe while one of them runs) and then `later` (the rest,
  /// between two records) run on the owner's thread, and this returns once `now` has run:
  /// - from the owner's own thread, `now` runs here and `later` after the current handler;
  /// - from another thread, both go through this thread's ring, after what it sent to the owner
  ///   before, and this waits. An executor that waits keeps draining its backlog and runs the
  ///   `now` of cancellers that wait for it in turn, so executors cancelling on each other never
  ///   deadlock; a canceller whose own wait is part of such a cycle is released as soon as the
  ///   owner's wait reaches it (Handoff);
  /// - to an external inbox (an event loop that may have stopped draining) it does not wait:
  ///   `now` runs when that loop next drains.
  /// Returns false when nothing runs on the owner any more (the bus has stopped): the caller
  /// then cleans up itself.
  bool cancel_on(Inbox& owner, absl::AnyInvocable<void()> now, absl::AnyInvocable<void()> later);

  /// `hook` runs once stop() has found nothing in flight, where it ends plain threads' pending
  /// calls: for calls that wait elsewhere (another node's, bus::net). Runs under `mu`: it must
  /// not call back into the bus.
  void on_stop(absl::AnyInvocable<void()> hook);
  Ring& new_ring(Producer& p, Inbox& dest);

  /// Plain threads: announce a publish so stop() can wait for it. Returns false if stopping.
  /// `g` is p.gate, read once by the caller (it does not change inside a send).
  [[gnu::always_inline]] bool enter(Producer& p, Producer::Gate g) {
    if (g == Producer::kBatchGate) [[likely]]
      return true;  // the Batch entered already
    if (g == Producer::kExecutorGate) return state() != State::kStopped;
    p.active.store(1, std::memory_order_relaxed);
    light_barrier();  // pairs with heavy_barrier() in stop(): we see its state or it sees us
    if (state() != State::kRunning) {
      p.active.store(0, std::memory_order_release);
      return false;
    }
    return true;
  }
  [[gnu::always_inline]] bool enter(Producer& p) { return enter(p, p.gate); }
  [[gnu::always_inline]] static void leave(Producer& p, Producer::Gate g) {
    if (g == Producer::kPlainGate) p.active.store(0, std::memory_order_release);
  }
  [[gnu::always_inline]] void leave(Producer& p) { leave(p, p.gate); }
  static absl::Status stopped_status() {
    return absl::UnavailableError("bus: stopped; it takes no more messages");
  }

  /// Builds a record for `target` in `dest`'s ring from this producer. The one send primitive:
  /// inline while the ring has room, send_full() (out of line) when it has not. With `kRun`
  /// (targets that take runs), a send right after one to the same target, before the ring is
  /// published, joins its record: one header for the batch, the payloads back to back.
  template <class P, bool kRun = false, class... A>
  [[gnu::always_inline]] absl::Status send(Producer& p, Inbox& dest, Target* target,
                                           Overflow policy, uint32_t channel, A&&... args) {
    return send_on<P, kRun>(p, p.ring_to(dest), dest, target, policy, channel,
                            std::forward<A>(args)...);
  }
  /// send() through `r`, the producer's ring to `dest`.
  template <class P, bool kRun = false, class... A>
  [[gnu::always_inline]] absl::Status send_on(Producer& p, Ring& r, Inbox& dest, Target* target,
                                              Overflow policy, uint32_t channel, A&&... args) {
    if (append<P, kRun>(p, r, dest, target, std::forward<A>(args)...)) [[likely]]
      return absl::OkStatus();
    return send_full<P>(p, r, dest, target, policy, channel, std::forward<A>(args)...);
  }
  /// send_on() while `r` has room and no records wait before it: builds the record (or joins
  /// the open run) and returns true. Returns false, `args` untouched, otherwise. `g` is p.gate.
  /// With `kRun`, outside the plain gate, the record opens a run counted into `counter` when it
  /// closes (Ring::commit_run): the caller counts the message only under the plain gate.
  template <class P, bool kRun, class... A>
  [[gnu::always_inline]] static bool append(Producer& p, Producer::Gate g, Ring& r, Inbox& dest,
                                            Target* target, std::atomic<uint64_t>* counter,
                                            A&&... args) {
    if (kRun && extend<P>(r, target, std::forward<A>(args)...)) return true;
    return append_record<P, kRun>(p, g, r, dest, target, counter, std::forward<A>(args)...);
  }
  /// The part of append() that joins the open run of `target`, if there is one with room.
  template <class P, class... A>
  [[gnu::always_inline]] static bool extend(Ring& r, Target* target, A&&... args) {
    constexpr uint32_t kWords = Payload<P>::kWords;
    // A run is open only while no record of the ring is held (send_full() publishes, which
    // closes it, before it holds one) and never on a plain thread outside a Batch (it publishes
    // each record at once, and a Batch's end publishes before the gate opens): no other check.
    uint64_t* w = r.extend_at(reinterpret_cast<uint64_t>(target), kWords - 1);
    if (w == nullptr) return false;
    Payload<P>::construct(w, std::forward<A>(args)...);
    r.extended(kWords - 1);  // the run's ring is queued for the flush already
    return true;
  }
  /// The part of append() that builds a record of its own (a run's first, with `kRun`).
  template <class P, bool kRun, class... A>
  [[gnu::always_inline]] static bool append_record(Producer& p, Producer::Gate g, Ring& r,
                                                   Inbox& dest, Target* target,
                                                   std::atomic<uint64_t>* counter, A&&... args) {
    constexpr uint32_t kWords = Payload<P>::kWords;
    if (g != Producer::kPlainGate) {
      // Only executors hold records back (send_full()); the plain gate is never an executor's.
      if (r.held != 0) [[unlikely]]
        return false;
      r.close_run();  // the record goes after the open run's payloads (a plain thread has none)
    }
    uint64_t* w;
    if constexpr (kLatencyBound<P> && kWords <= kCacheLine / 8) {
      w = r.try_reserve_in_line(kWords);
    } else {
      w = r.try_reserve(kWords);
    }
    if (w == nullptr) [[unlikely]]
      return false;
    // Where the record ends, read before the stores below (a word store may alias the ring's
    // own position, and the compiler would read it again).
    const uint64_t end = r.write_position() + kWords;
    const auto header = reinterpret_cast<uint64_t>(target);
    Payload<P>::construct(w + 1, std::forward<A>(args)...);
    if (g == Producer::kPlainGate) {
      // A plain thread publishes at once: its runs would end here.
      r.commit_publish(w, header, end);
      light_barrier();  // pairs with heavy_barrier() in Inbox::park()
      dest.notify();
      return true;
    }
    if (kRun) {
      r.commit_run(header, kWords, counter);
    } else {
      r.commit(header, kWords);
      if constexpr (kLatencyBound<P> && kWords <= kCacheLine / 8) r.skip_short_line(kWords);
    }
    committed(p, g, r, dest);
    return true;
  }
  template <class P, bool kRun, class... A>
  [[gnu::always_inline]] static bool append(Producer& p, Ring& r, Inbox& dest, Target* target,
                                            A&&... args) {
    return append<P, kRun>(p, p.gate, r, dest, target, nullptr, std::forward<A>(args)...);
  }

  /// append() of `n` messages at `msgs`, in order: as many as `r` has room for; returns how many.
  /// Runs of them are built at once (a copy of the array when P is an inline array type), and
  /// counted into `counter` when they close (p.gate is not the plain gate: a Batch is open).
  template <class P>
  static std::size_t append_all(Producer& p, Ring& r, Inbox& dest, Target* target,
                                std::atomic<uint64_t>* counter, const P* msgs, std::size_t n) {
    constexpr uint32_t kPayload = Payload<P>::kWords - 1;
    auto header = reinterpret_cast<uint64_t>(target);
    std::size_t done = 0;
    while (done < n) {
      std::size_t k = std::min(n - done, r.held == 0 ? r.extend_room(header, kPayload) : 0);
      if (k == 0) {
        if (!append<P, true>(p, p.gate, r, dest, target, counter, msgs[done])) break;  // a run
        ++done;
        continue;
      }
      uint64_t* at = r.extend_at(header, kPayload);
      if constexpr (Payload<P>::kInline && sizeof(P) == kPayload * 8 &&
                    std::is_trivially_copyable_v<P>) {
        std::memcpy(at, msgs + done, k * sizeof(P));
        r.extended_by(k, kPayload);
      } else {
        for (std::size_t i = 0; i < k; ++i) {  // counted one by one: a copy may throw
          Payload<P>::construct(at + i * kPayload, msgs[done + i]);
          r.extended(kPayload);
        }
      }
      done += k;
    }
    return done;
  }

  /// A record was committed to `r`: a plain thread outside a Batch publishes it now; executors
  /// and batches publish at their flush.
  [[gnu::always_inline]] static void committed(Producer& p, Producer::Gate g, Ring& r,
                                               Inbox& dest) {
    if (g == Producer::kPlainGate) {
      r.publish();
      light_barrier();  // pairs with heavy_barrier() in Inbox::park()
      dest.notify();
    } else if (!r.queued_for_flush) [[unlikely]] {
      r.queued_for_flush = true;
      p.unpublished.push_back(&r);
    }
  }
  /// send() when the ring has no room (or records wait before it): the overflow policy.
  template <class P, class... A>
  absl::Status send_full(Producer& p, Ring& r, Inbox& dest, Target* target, Overflow policy,
                         uint32_t channel, A&&... args);

  template <class S, class Make>
  S& channel_state(uint32_t id, Make&& make) {
    auto& chunk = channel_chunks_[id / kStatesPerChunk];
    // pairs with the release store in install_state()
    StateChunk* c = chunk.load(std::memory_order_acquire);
    if (c) {
      ChannelState* s = (*c)[id % kStatesPerChunk].load(std::memory_order_acquire);
      if (s) return static_cast<S&>(*s);
    }
    return static_cast<S&>(
        install_state(id, [&] { return std::unique_ptr<ChannelState>(make()); }));
  }
  ChannelState* find_state(uint32_t id) const {
    StateChunk* c = channel_chunks_[id / kStatesPerChunk].load(std::memory_order_acquire);
    return c ? (*c)[id % kStatesPerChunk].load(std::memory_order_acquire) : nullptr;
  }

  /// Logs `what` for (channel, kind) the first time only.
  void log_once(uint32_t channel, std::string_view kind, const std::string& what);

  std::mutex mu;  // guards what follows and every slow path (registration, snapshots)
  std::vector<Producer*> producers;                // live
  std::vector<std::shared_ptr<Ring>> rings;        // every ring, for stats and stop()
  std::vector<std::unique_ptr<Inbox>> inboxes;     // executors first, then external
  CounterTable<kProducerCounters> retired_counts;  // producers whose threads exited
  void retire_producer(Producer& p);               // under mu

 private:
  friend struct ThreadProducers;
  Producer& producer_slow();
  /// A closure for `dest`'s thread, sent whatever the state (see cancel_on()): kBlock, as a
  /// post; to the caller's own external inbox, deferred.
  absl::Status post_control(Producer& p, Inbox& dest, absl::AnyInvocable<void()> fn);
  /// cancel_on()'s wait: until `h` is done, or `owner`'s loop has ended (then false).
  bool await(Producer& p, Inbox& owner, const std::shared_ptr<Handoff>& h);
  ChannelState& install_state(uint32_t id,
                              const std::function<std::unique_ptr<ChannelState>()>& make);
  void run_executor(Inbox& inbox, unsigned index);
  bool quiescent();

  static constexpr std::size_t kStatesPerChunk = 256;
  using StateChunk = std::array<std::atomic<ChannelState*>, kStatesPerChunk>;

  const Options options_;
  const uint64_t uid_;
  std::weak_ptr<Core> self_;
  std::atomic<State> state_{State::kRunning};
  std::atomic<bool> exit_{false};  // see exiting()
  std::atomic<unsigned> placement_{0};
  std::vector<Inbox*> executors_;
  std::vector<std::thread> threads_;
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::array<std::atomic<StateChunk*>, 256> channel_chunks_{};
  std::vector<std::unique_ptr<ChannelState>> states_;
  std::vector<std::string> logged_;
  std::vector<uint64_t> last_started_;  // ticks_started seen by the last quiescent wave
  std::vector<absl::AnyInvocable<void()>> stop_hooks_;  // under mu

  // constinit: no dynamic initialisation, so other translation units read them directly rather
  // than through a TLS wrapper call (cheaper, and UBSan mis-reports the wrapper as a null load).
  static constinit thread_local uint64_t tls_uid_;
  static constinit thread_local Producer* tls_producer_;
};

std::size_t ring_words_for(std::size_t bytes);

/// Core::leave() at the end of a scope that entered.
struct Leave {
  Producer& p;
  Producer::Gate g;
  ~Leave() { Core::leave(p, g); }
};

template <class P, class... A>
[[gnu::noinline]] absl::Status Core::send_full(Producer& p, Ring& r, Inbox& dest, Target* target,
                                               Overflow policy, uint32_t channel, A&&... args) {
  constexpr uint32_t kWords = Payload<P>::kWords;
  uint64_t* w = nullptr;
  // A copy to a topic's target stands for each of its subscribers (see Stats). Closures are
  // posted on no channel (UINT32_MAX): their poster counts what it must.
  auto refused = [&](ProducerCounter c) {
    if (channel != UINT32_MAX) p.counters.add(channel, c, target->copies());
  };
  // Full. Records this thread built but did not publish yet count as taken room: publish them
  // so the consumer can free it.
  if (r.publish()) {
    light_barrier();
    dest.notify();
    if (r.held == 0) w = r.try_reserve(kWords);
  }
  if (w == nullptr) {
    switch (policy) {
      case Overflow::kDropNewest: refused(kDropped); return absl::OkStatus();
      case Overflow::kFail:
        refused(kFailed);
        return absl::ResourceExhaustedError(
            absl::StrCat("bus: ring to inbox ", dest.index(), " is full (channel '",
                         channel_info(channel).name, "', overflow policy: fail)"));
      case Overflow::kBlock: break;
    }
    dest.hurry();  // a spinning consumer looks now, not at its next spaced look
    if (p.executor && r.held == 0) {
      // The consumer usually frees room within microseconds: a bounded spin costs less than
      // holding the record back (an allocation). Bounded, so two executors cannot wait forever.
      for (int spin = 0; spin < 2048 && w == nullptr; ++spin) {
        cpu_relax();
        if ((spin & 63) == 63 && r.has_room(kWords)) w = r.try_reserve(kWords);
      }
    }
  }
  if (__builtin_expect(w == nullptr, 0)) {
    if (p.executor) {
      // An executor never blocks: it holds the record back, in order, up to a bound.
      if (!kEssential<P> && p.backlog.size() >= options_.executor_backlog()) {
        refused(kFailed);
        return absl::ResourceExhaustedError(
            absl::StrCat("bus: executor backlog full (", p.backlog.size(),
                         " records held while rings are full; "
                         "raise Options::executor_backlog or slow the producer) on channel '",
                         channel_info(channel).name, "'"));
      }
      auto rec = std::make_unique<uint64_t[]>(kWords);
      rec[0] = reinterpret_cast<uint64_t>(target);
      Payload<P>::construct(rec.get() + 1, std::forward<A>(args)...);
      p.backlog.push_back(Producer::Held{&r, std::move(rec)});
      if (r.held++ == 0) ++p.backlog_rings;
      p.backlog_size.store(p.backlog.size(), std::memory_order_relaxed);
      return absl::OkStatus();
    }
    // A plain thread waits for room: spin briefly, then park until the consumer releases. On
    // one CPU the consumer cannot free room while this thread spins: it yields instead. A
    // request waits no longer than its deadline: that bounds everything it waits for.
    if (p.one_cpu) {
      for (int look = 0; look < 16 && !r.has_room(kWords); ++look) std::this_thread::yield();
    } else {
      for (int spin = 0; spin < 4096 && !r.has_room(kWords); ++spin) cpu_relax();
    }
    const Clock::time_point deadline = deadline_of(args...);
    while (!r.has_room(kWords)) {
      auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero() || dest.loop_ended()) {
        r.producer_waiting.store(0, std::memory_order_relaxed);
        refused(kFailed);
        if (dest.loop_ended()) return stopped_status();
        return absl::DeadlineExceededError(absl::StrCat(
            "bus: no room in the ring to inbox ", dest.index(), " before the request's deadline",
            channel == UINT32_MAX ? ""
                                  : absl::StrCat(" (channel '", channel_info(channel).name, "')")));
      }
      r.producer_waiting.store(1, std::memory_order_relaxed);
      heavy_barrier();  // pairs with the consumer's light_barrier() after release()
      if (r.has_room(kWords)) break;
      futex_wait(r.producer_waiting, 1,
                 std::min<Clock::duration>(left, std::chrono::milliseconds(100)));
    }
    r.producer_waiting.store(0, std::memory_order_relaxed);
    w = r.try_reserve(kWords);
  }
  Payload<P>::construct(w + 1, std::forward<A>(args)...);
  r.commit(reinterpret_cast<uint64_t>(target), kWords);
  committed(p, p.gate, r, dest);
  return absl::OkStatus();
}

}  // namespace bus::detail
