// ExternalInbox's template definitions. Included by bus/bus.hpp once Bus is complete.
#pragma once

#include <utility>

namespace bus {

template <class T, class F>
requires std::invocable<F&, const T&> Subscription ExternalInbox::subscribe(const Topic<T>& topic,
                                                                            F&& handler) {
  return bus_.subscribe_at(topic, *inbox_, std::forward<F>(handler));
}

template <class T, class F>
requires std::invocable<F&, std::span<const T>> Subscription
ExternalInbox::subscribe_bulk(const Topic<T>& topic, F&& handler) {
  return bus_.add_subscriber(
      topic, *inbox_,
      {0, {}, absl::AnyInvocable<void(std::span<const T>)>(std::forward<F>(handler))});
}

template <class F>
requires std::invocable<F&> absl::Status ExternalInbox::post(F&& fn) {
  return bus_.post_to(*inbox_, std::forward<F>(fn));
}

}  // namespace bus
