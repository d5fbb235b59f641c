// Service<S>'s and ServiceGroup<S>'s definitions. Included by bus/bus.hpp once Bus is complete.
#pragma once

#include <absl/strings/str_cat.h>

#include <functional>
#include <stdexcept>
#include <utility>

namespace bus {

template <class S>
template <class T, class F>
Service<S>& Service<S>::subscribe(const Topic<T>& topic, F f) {
  return keep(bus_->subscribe(
      topic,
      [life = life_, s = state_, f = std::move(f)](const T& m) mutable {
        if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, m);
      },
      on_executor(executor_)));
}

template <class S>
template <class T, class F>
Service<S>& Service<S>::subscribe_bulk(const Topic<T>& topic, F f) {
  return keep(bus_->subscribe_bulk(
      topic,
      [life = life_, s = state_, f = std::move(f)](std::span<const T> m) mutable {
        if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, m);
      },
      on_executor(executor_)));
}

template <class S>
template <class T, class F>
Service<S>& Service<S>::consume(const Queue<T>& queue, F f) {
  return keep(bus_->consume(
      queue,
      [life = life_, s = state_, f = std::move(f)](T&& m) mutable {
        if (life->alive.load(std::memory_order_relaxed)) std::invoke(f, *s, std::move(m));
      },
      on_executor(executor_)));
}

template <class S>
template <class Req, class Rep, class F>
Service<S>& Service<S>::serve(const Endpoint<Req, Rep>& endpoint, F f) {
  return keep(bus_->serve(
      endpoint,
      [life = life_, s = state_, &endpoint, f = std::move(f)](Req&& r) mutable {
        if (!life->alive.load(std::memory_order_relaxed)) {
          return absl::StatusOr<Rep>(absl::UnavailableError(
              absl::StrCat("bus: the service serving '", endpoint.name(), "' has stopped")));
        }
        return detail::invoke_handler<Rep>(f, *s, std::move(r));
      },
      on_executor(executor_)));
}

template <class S>
template <class Req, class Rep, class F>
Service<S>& Service<S>::serve_async(const Endpoint<Req, Rep>& endpoint, F f) {
  return keep(bus_->serve_async(
      endpoint,
      [life = life_, s = state_, &endpoint, f = std::move(f)](Req&& r, Replier<Rep> reply) mutable {
        if (!life->alive.load(std::memory_order_relaxed)) {
          return reply(absl::UnavailableError(
              absl::StrCat("bus: the service serving '", endpoint.name(), "' has stopped")));
        }
        std::invoke(f, *s, std::move(r), std::move(reply));
      },
      on_executor(executor_)));
}

template <class S>
template <class F>
TimerId Service<S>::after(Clock::duration delay, F fn) {
  return bus_->after(on_executor(executor_), delay, guarded(std::move(fn)));
}

template <class S>
template <class F>
TimerId Service<S>::every(Clock::duration period, F fn) {
  TimerId id = bus_->every(on_executor(executor_), period, guarded(std::move(fn)));
  std::lock_guard lock(life_->mu);
  life_->periodic.push_back(id);  // cancelled by stop()
  return id;
}

template <class S>
template <class F>
absl::Status Service<S>::post(F fn) {
  return bus_->post(on_executor(executor_), guarded(std::move(fn)));
}

template <class S>
template <class Req, class Rep, class F>
void Service<S>::request(const Endpoint<Req, Rep>& endpoint, Req req, Clock::duration timeout,
                         F callback) {
  auto deadline = Clock::now() + timeout;
  Bus* bus = bus_;
  auto go = [bus, &endpoint, life = life_, s = state_, req = std::move(req), deadline,
             cb = std::move(callback)]() mutable {
    if (!life->alive.load(std::memory_order_relaxed)) return;
    auto& p = bus->core_->producer();
    bus->request_from(p, *p.own_inbox, endpoint, std::move(req), deadline,
                      [life, s, cb = std::move(cb)](absl::StatusOr<Rep> r) mutable {
                        if (life->alive.load(std::memory_order_relaxed)) cb(*s, std::move(r));
                      });
  };
  if (bus_->current_executor() == executor_) {
    go();
  } else if (absl::Status st = bus_->post(on_executor(executor_), std::move(go)); !st.ok()) {
    if (running()) callback(*state_, absl::StatusOr<Rep>(st));
  }
}

template <class S>
void Service<S>::stop() {
  bus_->stop_service(*life_, executor_);
}

template <class S>
Service<S>& Service<S>::keep(Subscription sub) {
  std::lock_guard lock(life_->mu);
  life_->subs.push_back(std::move(sub));
  return *this;
}

template <class S>
template <class F>
auto Service<S>::guarded(F fn) {
  return [life = life_, s = state_, fn = std::move(fn)]() mutable {
    if (life->alive.load(std::memory_order_relaxed)) fn(*s);
  };
}

template <class S>
template <class T, class F>
ServiceGroup<S>& ServiceGroup<S>::subscribe(const Topic<T>& topic, F f) {
  for (auto& m : members_) m.subscribe(topic, f);
  return *this;
}

template <class S>
template <class T, class F>
ServiceGroup<S>& ServiceGroup<S>::consume(const Queue<T>& queue, F f) {
  check_keyed(queue.key() != nullptr, queue.name());
  for (auto& m : members_) m.consume(queue, f);
  return *this;
}

template <class S>
template <class Req, class Rep, class F>
ServiceGroup<S>& ServiceGroup<S>::serve(const Endpoint<Req, Rep>& endpoint, F f) {
  check_keyed(endpoint.key() != nullptr, endpoint.name());
  for (auto& m : members_) m.serve(endpoint, f);
  return *this;
}

template <class S>
template <class Req, class Rep, class F>
ServiceGroup<S>& ServiceGroup<S>::serve_async(const Endpoint<Req, Rep>& endpoint, F f) {
  check_keyed(endpoint.key() != nullptr, endpoint.name());
  for (auto& m : members_) m.serve_async(endpoint, f);
  return *this;
}

template <class S>
void ServiceGroup<S>::stop() {
  for (auto& m : members_) m.stop();
}

template <class S>
void ServiceGroup<S>::check_keyed(bool keyed, const std::string& name) const {
  if (sharded_ && !keyed) {
    throw std::invalid_argument(
        absl::StrCat("bus: a sharded service consumes keyed channels; '", name,
                     "' has no key function (declare it with one, or use pool())"));
  }
}

}  // namespace bus
