// Publisher<T>'s definitions. Included by bus/bus.hpp once Bus is complete.
#pragma once

#include <cassert>
#include <utility>

namespace bus {

template <class T>
Publisher<T>::Publisher(const std::shared_ptr<detail::Core>& core, const Topic<T>& topic)
    : core_(core.get()), producer_(&core->producer()), topic_(topic) {
#ifndef NDEBUG
  alive_ = core;
#endif
  state_ = &Bus::topic_state(*core_, topic_);
  route_.channel = topic_.id();
  route_.state = state_;
  route_.list = &detail::kUnresolvedRoute;  // no target list: the first publish() resolves
}

template <class T>
template <MessageOf<T> U>
absl::Status Publisher<T>::publish(U&& msg) {
  assert(!alive_.expired() && "a Publisher is used while its Bus exists");
  assert(&core_->producer() == producer_ && "a Publisher publishes on the thread that made it");
  assert(!route_.lease.held() || producer_->gate == detail::Producer::kOpen);
  if (detail::join_held_run<T, false>(route_, 0, std::forward<U>(msg))) [[likely]]
    return absl::OkStatus();
  detail::Producer& p = *producer_;
  return detail::send_through_gate<T>(
      *core_, p, true, route_, std::forward<U>(msg),
      [&]<class M>(M&& m) { return publish_slow(std::forward<M>(m)); });
}

// Out of line, in three argument registers (the result, this, the message). Called inline, the
// six-argument detail::resolve_and_send() took a seventh on the stack: the caller kept a frame
// pointer for it, and a loop of publish() calls spilled its own counter to memory.
template <class T>
template <class U>
absl::Status Publisher<T>::publish_slow(U&& msg) {
  return detail::resolve_and_send(*core_, *producer_, *state_, topic_, route_,
                                  std::forward<U>(msg));
}

}  // namespace bus
