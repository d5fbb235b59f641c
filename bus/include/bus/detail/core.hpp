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
#include "bus/detail/producer.hpp"
#include "bus/detail/record.hpp"
#include "bus/detail/ring.hpp"
#include "bus/options.hpp"

namespace bus::detail {

/// What an unresolved Route's `list` points to: no target list has its address.
inline const char kUnresolvedRoute = 0;

/// Per-bus state of one channel (its targets), kept in a chunked table read without a lock.
/// Every publish reads it (is the thread's route still the channel's target list?), so it has
/// its lines to itself: a consumer writing an object the allocator put beside it took the line
/// from the publishing core on every message.
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
    if (g == Producer::kOpen) [[likely]]
      return true;  // the Batch entered already
    if (g == Producer::kOutsideLoop) return state() != State::kStopped;
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
    if (g == Producer::kPerSend) p.active.store(0, std::memory_order_release);
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
  /// With `kRun`, outside kPerSend, the record opens a run counted into `counter` when it
  /// closes (Ring::commit_run): the caller counts the message only under kPerSend.
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
    if (g != Producer::kPerSend) {
      // Only executors hold records back (send_full()); kPerSend is never an executor's.
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
    if (g == Producer::kPerSend) {
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
  /// counted into `counter` when they close (p.gate is not kPerSend: a Batch is open).
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
    if (g == Producer::kPerSend) {
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
  void run_executor(Inbox& inbox, unsigned index);  // executor.cpp
  /// The producer of an executor's own thread, registered like a plain thread's.
  Producer& executor_producer(Inbox& inbox);
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

}  // namespace bus::detail

#include "bus/detail/core-inl.hpp"
