// The requests one inbox waits on: their slots, callbacks and deadlines.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/status.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "bus/detail/sync.hpp"

namespace bus::detail {

/// The pending requests' deadlines of one inbox, earliest first, with no allocation per request.
/// Most come in order (one timeout per call site): those go to a FIFO, where an answer in order
/// pops its entry in O(1); the others go to a min-heap. An answered request's entry stays until
/// it is first (PendingRequests pops answered ones there) or a sweep drops it.
class Deadlines {
 public:
  using Entry = std::pair<Clock::time_point, uint64_t>;  // deadline, correlation

  bool empty() const { return fifo_.empty() && heap_.empty(); }
  std::size_t size() const { return fifo_.size() + heap_.size(); }
  void push(Clock::time_point at, uint64_t corr) {
    if (fifo_.empty() || at >= fifo_.back().first) {
      fifo_.emplace_back(at, corr);
    } else {
      heap_.emplace_back(at, corr);
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }
  /// The earliest; not empty().
  const Entry& top() const { return from_fifo() ? fifo_.front() : heap_.front(); }
  void pop() {
    if (from_fifo()) {
      fifo_.pop_front();
    } else {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      heap_.pop_back();
    }
  }
  /// Keeps the entries for which `keep(correlation)` holds.
  template <class F>
  void retain(F keep) {
    std::erase_if(fifo_, [&](const Entry& e) { return !keep(e.second); });
    std::erase_if(heap_, [&](const Entry& e) { return !keep(e.second); });
    std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
  }
  void clear() {
    fifo_.clear();
    heap_.clear();
  }

 private:
  bool from_fifo() const {
    return heap_.empty() || (!fifo_.empty() && fifo_.front() < heap_.front());
  }
  std::deque<Entry> fifo_;  // in deadline order
  std::vector<Entry> heap_;
};

/// The requests an inbox waits on, in a table of slots: a reply finds its request by the slot
/// its correlation names (no hashing), and slots are reused most recent first. Owner thread
/// only; what an answer, an expiry or a cancel runs is the inbox's.
class PendingRequests {
 public:
  using CompleteFn = absl::AnyInvocable<void(absl::Status, void* reply)>;
  /// Correlations: the slot in the low kSlotBits, a sequence number of this inbox above them,
  /// so a reply to an answered (or expired) request does not match the slot's next request (the
  /// sequence repeats only after 2^40 requests of one inbox).
  static constexpr unsigned kSlotBits = 24;
  static constexpr std::size_t kMaxPending = std::size_t{1} << kSlotBits;

  /// `max`: Options::max_pending_requests (kMaxPending at most).
  explicit PendingRequests(std::size_t max) : max_(std::min(max, kMaxPending)) {}

  std::size_t max() const { return max_; }
  /// Slots taken (reserved or filled).
  std::size_t count() const { return slots_.size() - free_.size(); }
  /// Takes a slot for a request about to be sent and returns its correlation, or 0 when max()
  /// requests are pending already. add() fills the slot, or release() gives it back.
  uint64_t reserve();
  void release(uint64_t corr);
  void add(uint64_t corr, uint32_t channel, Clock::time_point deadline, CompleteFn&& fn);
  /// A reply to `corr` on `channel` arrived: runs the request's callback (its slot freed first,
  /// so the callback may make another request) and returns true; false when no such request is
  /// pending (a late reply: its slot holds another request, a later sequence, or one on another
  /// channel, which cannot be this reply's type). A slot reserved but not yet filled cannot have
  /// a reply: its request is being sent by this very thread.
  bool complete(uint64_t corr, uint32_t channel, absl::Status&& status, void* reply);
  /// True while a pending request has a deadline entry; earliest_deadline() is then its deadline.
  bool has_deadline() const { return !deadlines_.empty(); }
  Clock::time_point earliest_deadline() const { return deadlines_.top().first; }
  /// The correlation of a pending request whose deadline is at or before `now`, its deadline
  /// entry dropped (it stays pending until take()); 0 when none is. Call forget_answered() once
  /// done, so earliest_deadline() is a pending request's.
  uint64_t next_expired(Clock::time_point now);
  void forget_answered();
  /// A pending request's channel and callback, its slot freed (`corr` from next_expired()).
  std::pair<uint32_t, CompleteFn> take(uint64_t corr);
  /// Takes every pending request's callback and runs `call(fn)`, until a pass finds none (a
  /// callback may make another request).
  template <class F>
  void cancel_all(F&& call) {
    for (bool found = true; found;) {
      found = false;
      for (std::size_t i = 0; i < slots_.size(); ++i) {
        if (!slots_[i].fn) continue;  // free, or reserved by a request being sent
        found = true;
        call(free_slot(slots_[i]));
      }
    }
    deadlines_.clear();
  }

 private:
  struct Slot {
    uint64_t corr = 0;  // 0: the slot is free
    uint32_t channel = 0;
    CompleteFn fn;  // empty while reserved
  };
  /// The slot of `corr` while that request is pending, else null.
  Slot* find(uint64_t corr) {
    std::size_t slot = corr & (kMaxPending - 1);
    return slot < slots_.size() && slots_[slot].corr == corr ? &slots_[slot] : nullptr;
  }
  /// Frees the slot and returns its callback.
  CompleteFn free_slot(Slot& slot);

  std::vector<Slot> slots_;  // indexed by a correlation's slot
  const std::size_t max_;
  std::vector<uint32_t> free_;
  // Swept of answered entries once it holds over twice as many as there are requests pending.
  Deadlines deadlines_;
  uint64_t last_correlation_ = 0;
};

}  // namespace bus::detail
