// The receiving end of a thread: its rings and their drain, cancel hand-offs, and the timers
// and pending requests (timers.hpp, pending.hpp) it runs.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "bus/detail/counters.hpp"
#include "bus/detail/pending.hpp"
#include "bus/detail/record.hpp"
#include "bus/detail/ring.hpp"
#include "bus/detail/sync.hpp"
#include "bus/detail/timers.hpp"

namespace bus::detail {

class Core;

class Inbox;

/// A cancel that another thread waits for (Core::cancel_on). `now` runs once on the owner's
/// thread: from a closure in the owner's ring, in order with what the canceller sent before, or,
/// when the owner is itself waiting for a cancel and its chain of waits reaches the canceller
/// (a cycle no wait could end), from that wait at once. `now` only sets flags its handlers look
/// at, so it is safe to run while one of them is on the owner's stack.
struct Handoff {
  Handoff(absl::AnyInvocable<void()> fn, Inbox* canceller) : now(std::move(fn)), from(canceller) {}
  absl::AnyInvocable<void()> now;
  Inbox* const from;  // the waiting executor's inbox; null for a thread none can wait for
  std::atomic<uint32_t> done{0};  // futex word of a canceller that is not an executor
  bool ran = false;               // owner thread only
  /// Owner thread.
  void run_now() {
    if (!ran) {
      ran = true;
      now();
    }
  }
  /// Owner thread: `now` has run; the canceller may go on.
  void finish();
};

/// Counters an inbox keeps per channel (its thread is their only writer).
enum InboxCounter : std::size_t {
  kDelivered,      // handler invocations that returned
  kHandlerFailed,  // handler invocations that threw
  kLateReplies,    // replies that came after their deadline (or for a cancelled request)
  kExpired,        // requests whose deadline passed before a handler could run
  kUnrouted,       // queue messages whose consumer went away with no other to take them
  kInboxCounters
};

/// A thread's inbox: one ring per producing thread, created lazily by the producer. Executors
/// own one; an external event loop can own one too (`ExternalInbox`), woken through an eventfd.
/// Everything below "owner thread" is touched by the owning thread only.
class Inbox {
 public:
  enum class Kind : uint8_t { kExecutor, kExternal };
  /// Records taken from one ring before looking at the next, per run or drain.
  static constexpr std::size_t kBatch = 256;

  Inbox(Core& core, uint32_t index, Kind kind);
  Inbox(const Inbox&) = delete;
  Inbox& operator=(const Inbox&) = delete;
  ~Inbox();

  Core& core() const { return core_; }
  uint32_t index() const { return index_; }
  Kind kind() const { return kind_; }

  // ---- any thread ----------------------------------------------------------------------------

  /// Hands a new ring to the owner (lock-free push; the owner adopts it on its next pass).
  void add_ring(std::shared_ptr<Ring> ring);
  /// Called by a producer after light_barrier(): wakes the owner if it is parked.
  [[gnu::always_inline]] void notify() {
    if (sleeping_.load(std::memory_order_relaxed) != 0) wake();
  }
  void wake();
  /// Called by a producer that found its ring to this inbox full and waits for room: a spinning
  /// owner looks at its rings at once instead of at its next spaced look (see run_executor).
  void hurry() {
    if (hurry_.load(std::memory_order_relaxed) == 0) hurry_.store(1, std::memory_order_relaxed);
  }
  /// The eventfd an external loop polls (-1 for executors).
  int eventfd() const { return eventfd_; }
  /// True once the owning executor has left its loop for good: nothing posted to it runs.
  bool loop_ended() const { return loop_ended_.load(std::memory_order_acquire); }

  // ---- waits for cancels (Core::cancel_on): executors only ------------------------------------

  /// Set while the owner waits for a cancel on another inbox: that inbox. Read by others.
  std::atomic<Inbox*> waiting_for{nullptr};
  /// A canceller waiting for this (executor) inbox registers its handoff here, so that the owner
  /// can run it from a wait of its own when the two wait on each other.
  void add_handoff(std::shared_ptr<Handoff> h);
  void remove_handoff(const Handoff* h);
  /// Wakes the owner if it waits for a cancel (a handoff of its own finished, or one arrived).
  void wake_waiter();
  /// The word the owner waits on while it waits for a cancel.
  std::atomic<uint32_t>& wait_word() { return wait_word_; }
  /// Owner, while it waits: runs every registered handoff whose canceller waits, through a
  /// chain of waits, for this owner. Returns how many ran.
  std::size_t run_handoffs_in_cycles();

  // ---- owner thread --------------------------------------------------------------------------

  /// Runs what is ready: records (in batches per ring) and due timers. Returns how much ran.
  /// `plain_rings` false skips rings fed by plain threads and by this inbox itself: the
  /// back-pressure of an executor holding a backlog. Rings from other executors keep draining,
  /// so two executors waiting on each other's rings still make progress.
  std::size_t run_once(bool plain_rings = true);
  /// True when a record is waiting in some ring or a timer is due.
  bool ready();
  /// True after hurry(), until take_hurry().
  bool hurried() const { return hurry_.load(std::memory_order_relaxed) != 0; }
  void take_hurry() {
    if (hurried()) hurry_.store(0, std::memory_order_relaxed);
  }
  /// True when a record, a new ring or a deferred call is waiting (no clock read: the spin loop).
  bool has_records() {
    if (!deferred_.empty() || incoming_.load(std::memory_order_relaxed) != nullptr) return true;
    for (auto& r : rings_) {
      if (!r->empty_for_consumer()) return true;
    }
    return false;
  }
  /// Parks until woken or until the next timer; `extra_ready` is re-checked after announcing sleep.
  template <class F>
  void park(F&& extra_ready) {
    sleeping_.store(1, std::memory_order_relaxed);
    heavy_barrier();  // pairs with the producers' light_barrier() before notify()
    if (!ready() && !extra_ready()) {
      auto next = next_timer();
      auto timeout =
          next ? std::max(*next - Clock::now(), Clock::duration::zero()) : Clock::duration(-1);
      if (timeout != Clock::duration::zero()) {
        futex_wait(sleeping_, 1, std::chrono::duration_cast<std::chrono::nanoseconds>(timeout));
      }
    }
    sleeping_.store(0, std::memory_order_relaxed);
  }

  /// External inboxes: around one drain() of the owning loop. After `end_drain` producers write
  /// the eventfd again; if work slipped in meanwhile, it writes the eventfd itself.
  void begin_drain() { sleeping_.store(0, std::memory_order_relaxed); }
  void end_drain() {
    sleeping_.store(1, std::memory_order_relaxed);
    heavy_barrier();  // pairs with the producers' light_barrier() before notify()
    if (ready()) wake();
  }

  using TimerFn = absl::AnyInvocable<void()>;
  /// Runs `fn` at the start of the owner's next run_once(), without a ring: an external loop
  /// posting to its own inbox must not wait for room in a ring only it can drain. (Executors
  /// post to themselves through their ring: they hold records back instead of waiting.)
  void defer(TimerFn fn);
  /// Runs what defer() queued; returns how many ran.
  std::size_t run_deferred();

  /// Timers. `essential` timers (request deadlines) keep firing while the bus drains at stop;
  /// the others are cancelled when stop() begins. Returns 0 when the bus no longer takes timers.
  /// Ids come from any thread (a timer can be named before the closure adding it arrives).
  uint64_t reserve_timer_id() { return last_timer_.fetch_add(1, std::memory_order_relaxed) + 1; }
  bool add_timer(uint64_t id, Clock::time_point at, Clock::duration period, TimerFn fn,
                 bool essential);
  bool cancel_timer(uint64_t id) { return timers_.cancel(id); }
  std::optional<Clock::time_point> next_timer() const;
  /// True when the earliest timer or pending request's deadline has come.
  bool timer_due() const;
  std::size_t run_due_timers();
  void drop_user_timers() { timers_.drop_inessential(); }

  // Requests this inbox is waiting on (see PendingRequests).
  using CompleteFn = PendingRequests::CompleteFn;
  /// A correlation for a request about to be sent, or 0 when max_pending() requests are pending
  /// already. add_pending() fills its slot, or release_pending() gives it back (not sent).
  uint64_t reserve_pending() { return pending_.reserve(); }
  /// Options::max_pending_requests (PendingRequests::kMaxPending at most).
  std::size_t max_pending() const { return pending_.max(); }
  void release_pending(uint64_t corr) { pending_.release(corr); }
  /// Pending requests' deadlines are not timers (no allocation or map node per request), but
  /// next_timer(), ready() and run_due_timers() cover them too.
  void add_pending(uint64_t corr, uint32_t channel, Clock::time_point deadline, CompleteFn fn) {
    pending_.add(corr, channel, deadline, std::move(fn));
  }
  /// A reply arrived: runs the callback, or, when none is pending, counts a late reply (only
  /// one a handler gave: see ReplyEnvelope::by_handler).
  void complete(uint64_t corr, uint32_t channel, absl::Status status, void* reply,
                bool by_handler = true) {
    if (!pending_.complete(corr, channel, std::move(status), reply) && by_handler) [[unlikely]] {
      counters.add(channel, kLateReplies);
    }
  }
  /// Slots taken (reserved or filled).
  std::size_t pending_count() const { return pending_.count(); }
  void cancel_all_pending(const absl::Status& why);
  /// Owner thread, once its loop has ended for good.
  void end_loop() { loop_ended_.store(true, std::memory_order_release); }

  CounterTable<kInboxCounters> counters;
  // Quiescence at stop(): a timer callback runs between these two increments (see Core::stop).
  std::atomic<uint64_t> ticks_started{0};
  std::atomic<uint64_t> ticks_done{0};

 private:
  struct Node {
    std::shared_ptr<Ring> ring;
    Node* next;
  };
  void adopt_rings();
  std::size_t drain_ring(Ring& ring);
  void invoke(Target* target, uint64_t* payload);

  Core& core_;
  const uint32_t index_;
  const Kind kind_;
  int eventfd_ = -1;

  alignas(kCacheLine) std::atomic<uint32_t> sleeping_{0};  // futex word: 1 while parked
  // Producers read sleeping_ and the owner reads hurry_ often; both are written rarely.
  std::atomic<uint32_t> hurry_{0};
  alignas(kCacheLine) std::atomic<Node*> incoming_{nullptr};
  std::atomic<uint64_t> last_timer_{0};
  std::atomic<bool> loop_ended_{false};
  std::atomic<uint32_t> wait_word_{0};
  std::mutex handoffs_mu_;
  std::vector<std::shared_ptr<Handoff>> handoffs_;  // under handoffs_mu_
  /// True when this inbox's chain of waits reaches `target`.
  bool waits_for(const Inbox* target) const;

  alignas(kCacheLine) std::vector<std::shared_ptr<Ring>> rings_;
  Timers timers_;
  PendingRequests pending_;
  std::size_t expire_due(Clock::time_point now);
  std::vector<TimerFn> deferred_;
};

}  // namespace bus::detail
