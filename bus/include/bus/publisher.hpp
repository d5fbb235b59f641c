// Publisher<T>: one thread's handle for publishing to one topic. Part of bus/bus.hpp.
#pragma once

#include <absl/status/status.h>

#include <memory>

#include "bus/channel.hpp"
#include "bus/detail/core.hpp"
#include "bus/detail/targets.hpp"
#include "bus/subscription.hpp"

namespace bus {

class Bus;

/// One thread's handle for publishing to one topic: publish() is Bus::publish(), with the same
/// results and overflow policy, without the lookups Bus::publish() makes on every call (this
/// thread's producer, then its route for the topic). For a loop that publishes many messages to
/// one topic: inside a Batch or on an executor, consecutive messages to a topic whose
/// subscribers are on one inbox cost a look at those subscribers and a store into the ring.
///
/// Made by Bus::publisher() on the thread that publishes with it, and used on that thread only,
/// while its Bus exists (a debug build asserts both); it may be destroyed anywhere, before or
/// after the Bus. It does not keep the bus alive (so a handler or a service may hold one): once
/// the bus has stopped, publish() returns Unavailable as Bus::publish() does. Subscribers that
/// come and go are seen at the next publish(), as with Bus::publish().
template <class T>
class Publisher {
 public:
  Publisher(Publisher&&) noexcept = default;
  Publisher& operator=(Publisher&&) noexcept = default;
  Publisher(const Publisher&) = delete;
  Publisher& operator=(const Publisher&) = delete;

  template <MessageOf<T> U>
  [[gnu::always_inline]] inline absl::Status publish(U&& msg);
  const Topic<T>& topic() const { return topic_; }

 private:
  friend class Bus;
  Publisher(const std::shared_ptr<detail::Core>& core, const Topic<T>& topic);

  /// publish() when neither the lease nor the route takes the message (see publisher-inl.hpp).
  template <class U>
  [[gnu::noinline]] absl::Status publish_slow(U&& msg);

  detail::Core* core_;  // not owned: a handler holding a Publisher must not keep its bus alive
  detail::Producer* producer_;
#ifndef NDEBUG
  std::weak_ptr<detail::Core> alive_;  // what the debug build's assert looks at
#endif
  Topic<T> topic_;
  detail::TopicState<T>* state_;
  // Its lease is the open run this handle appends to (detail::join_held_run()).
  detail::Producer::Route route_;
};

}  // namespace bus

#include "bus/bus.hpp"  // the definitions (bus/detail/publisher-inl.hpp)
