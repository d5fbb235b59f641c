// ExternalInbox: an inbox drained by an event loop that is not an executor. Part of bus/bus.hpp.
#pragma once

#include <absl/status/status.h>

#include <concepts>
#include <cstddef>
#include <optional>
#include <span>

#include "bus/channel.hpp"
#include "bus/detail/core.hpp"
#include "bus/subscription.hpp"

namespace bus {

class Bus;
namespace net::detail {
struct BusAccess;
}

/// An inbox owned by an event loop that is not an executor (Asio, a zmq poller, ...). The loop
/// polls `fd()` (an eventfd) and calls `drain()` when it is readable or when `next_timer()` is
/// due; replies to requests made on the owning thread and handlers subscribed here run inside
/// `drain()`. Created on, and owned by, the calling thread (see bind_to_this_thread()).
class ExternalInbox {
 public:
  explicit ExternalInbox(Bus& bus);
  ExternalInbox(const ExternalInbox&) = delete;
  ExternalInbox& operator=(const ExternalInbox&) = delete;
  ~ExternalInbox();

  int fd() const { return inbox_->eventfd(); }
  /// Runs what is ready; returns how many records and timers ran. It takes at most kBatch
  /// records from each producer's ring: one that returned kBatch or more may have left some.
  std::size_t drain();
  static constexpr std::size_t kBatch = detail::Inbox::kBatch;
  /// Like drain(), but leaves the inbox awake: producers stop writing the eventfd (a syscall per
  /// message) until the next drain(). For a loop that is busy and will call again at once; it
  /// must call drain() before it blocks in poll.
  std::size_t drain_awake();
  std::optional<Clock::time_point> next_timer() const { return inbox_->next_timer(); }
  /// Makes the calling thread the owner (its requests' replies come here).
  void bind_to_this_thread();

  /// Bus::subscribe() on this inbox: the handler runs inside drain().
  template <class T, class F>
  requires std::invocable<F&, const T&> Subscription subscribe(const Topic<T>& topic, F&& handler);
  /// Bus::subscribe_bulk() on this inbox.
  template <class T, class F>
  requires std::invocable<F&, std::span<const T>> Subscription subscribe_bulk(const Topic<T>& topic,
                                                                              F&& handler);
  /// Runs `fn()` inside a later drain(), on the owning loop's thread. Unavailable once the bus
  /// has stopped.
  template <class F>
  requires std::invocable<F&> absl::Status post(F&& fn);

 private:
  friend struct net::detail::BusAccess;
  Bus& bus_;
  detail::Inbox* inbox_;
};

}  // namespace bus

#include "bus/bus.hpp"  // the definitions (bus/detail/external_inbox-inl.hpp)
