// The timers of one inbox: when each fires, which ids it has seen, and the one firing now.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/functional/any_invocable.h>

#include <cstdint>
#include <map>
#include <optional>
#include <utility>

#include "bus/detail/sync.hpp"

namespace bus::detail {

/// An inbox's timers, earliest first. Owner thread only: the ids come from Inbox (any thread
/// may name a timer before the closure adding it arrives), and what firing means (the bus's
/// state, the quiescence ticks, a callback that throws) is the inbox's.
class Timers {
 public:
  using Fn = absl::AnyInvocable<void()>;
  /// A timer taken out to fire.
  struct Fired {
    uint64_t id;
    Clock::time_point at;  // when it was due
    Fn fn;
    Clock::duration period;  // zero: once
    bool essential;
  };

  /// Marks `id` as seen; false when it was cancelled before it was seen (the cancel came first,
  /// through another ring or at once on the owner: Core::cancel_on). A periodic timer added
  /// again passes.
  bool admit(uint64_t id) { return !(see(id) && cancelled_unseen_.erase(id) != 0); }
  /// Adds an admitted timer.
  void insert(uint64_t id, Clock::time_point at, Clock::duration period, Fn fn, bool essential);
  /// False when `id` already fired (once) or was cancelled. The timer firing now is cancelled
  /// for its next period (done_firing() says so); an id not seen yet when it arrives.
  bool cancel(uint64_t id);
  std::optional<Clock::time_point> next() const {
    if (timers_.empty()) return std::nullopt;
    return timers_.begin()->first.first;
  }
  bool due(Clock::time_point now) const {
    return !timers_.empty() && timers_.begin()->first.first <= now;
  }
  /// The earliest timer, taken out; it counts as firing until done_firing(). Not empty().
  Fired fire_first();
  /// The timer fire_first() took has run: true unless its own callback (or another) cancelled it.
  bool done_firing() {
    firing_ = 0;
    return !firing_cancelled_;
  }
  /// Drops the timers that are not essential (stop() has begun).
  void drop_inessential();

 private:
  bool seen(uint64_t id) const { return id <= seen_ || seen_above_.contains(id); }
  /// Returns false when `id` was seen before (a periodic timer added again).
  bool see(uint64_t id);

  struct Timer {
    Fn fn;
    Clock::duration period;
    bool essential;
  };
  std::map<std::pair<Clock::time_point, uint64_t>, Timer> timers_;
  absl::flat_hash_map<uint64_t, Clock::time_point> at_;  // id -> its key in timers_
  uint64_t firing_ = 0;                                  // id of the timer being run
  bool firing_cancelled_ = false;
  // Ids whose add ran: every one up to seen_, and those above it in seen_above_ (few: ids are
  // added nearly in order). An id cancelled before it was seen waits in cancelled_unseen_.
  uint64_t seen_ = 0;
  absl::flat_hash_set<uint64_t> seen_above_;
  absl::flat_hash_set<uint64_t> cancelled_unseen_;
};

}  // namespace bus::detail
