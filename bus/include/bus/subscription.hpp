// Where handlers run, and the handle that keeps one registered: Placement, TimerId,
// Subscription. Part of bus/bus.hpp.
#pragma once

#include <absl/functional/any_invocable.h>

#include <chrono>
#include <concepts>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>

#include "bus/detail/core.hpp"

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

}  // namespace bus
