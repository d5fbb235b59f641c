// Bus's template definitions: publishing (its path is bus/detail/publish.hpp), registrations,
// requests, services, timers.
// Included by bus/bus.hpp.
#pragma once

#include <absl/strings/str_cat.h>

#include <cassert>
#include <memory>
#include <optional>
#include <type_traits>
#include <utility>

#include "bus/detail/publish.hpp"

namespace bus {

template <class T, MessageOf<T> U>
absl::Status Bus::publish(const Topic<T>& topic, U&& msg) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  // The common case, inline: this thread published here before, the topic's subscribers are
  // still the ones it saw, all on one inbox (so no copy to make), and the ring has room.
  detail::Producer::Route& r = p.routes[topic.id() % detail::Producer::kRoutes];
  // Inside a Batch or an executor's loop, the run this route holds (see Publisher).
  if (detail::join_held_run<T, true>(r, topic.id(), std::forward<U>(msg))) [[likely]]
    return absl::OkStatus();
  return detail::send_through_gate<T>(
      c, p, r.channel == topic.id(), r, std::forward<U>(msg),
      [&]<class M>(M&& m) { return publish_slow(p, topic, std::forward<M>(m)); });
}

template <class T>
Publisher<T> Bus::publisher(const Topic<T>& topic) {
  return Publisher<T>(core_, topic);
}

template <class T, class U>
absl::Status Bus::publish_slow(detail::Producer& p, const Topic<T>& topic, U&& msg) {
  return detail::resolve_and_send(*core_, p, topic_state(topic), topic,
                                  p.routes[topic.id() % detail::Producer::kRoutes],
                                  std::forward<U>(msg));
}

template <class T, class F>
requires std::invocable<F&, const T&> Subscription Bus::subscribe(const Topic<T>& topic,
                                                                  F&& handler, Placement where) {
  return subscribe_at(topic, placed(where), std::forward<F>(handler));
}

template <class T, class F>
requires std::invocable<F&, std::span<const T>> Subscription
Bus::subscribe_bulk(const Topic<T>& topic, F&& handler, Placement where) {
  return add_subscriber(
      topic, placed(where),
      {0, {}, absl::AnyInvocable<void(std::span<const T>)>(std::forward<F>(handler))});
}

template <class T, class F>
Subscription Bus::subscribe_at(const Topic<T>& topic, detail::Inbox& inbox, F&& handler) {
  return add_subscriber(topic, inbox,
                        {0, detail::TopicTarget<T>::handler(std::forward<F>(handler)), nullptr});
}

template <class T>
Subscription Bus::add_subscriber(const Topic<T>& topic, detail::Inbox& inbox,
                                 typename detail::TopicTarget<T>::Sub sub) {
  auto& st = topic_state(topic);
  detail::TopicTarget<T>* target = nullptr;
  uint64_t id;
  {
    std::lock_guard lock(core_->mu);
    for (auto& t : st.targets.owned) {
      if (t->inbox == &inbox) target = t.get();
    }
    if (!target)
      target = st.targets.add(std::make_unique<detail::TopicTarget<T>>(topic.id(), inbox));
    id = ++st.last_sub;
  }
  sub.id = id;
  target->stage(&sub, 0);
  target->live.fetch_add(1, std::memory_order_relaxed);
  return Subscription(core_, [target, id](detail::Core& c) {
    target->live.fetch_sub(1, std::memory_order_relaxed);
    // What this thread published before still reaches the handler: the cancel follows it
    // through the ring (Core::cancel_on).
    if (!c.cancel_on(
            *target->inbox, [target, id] { target->stop_now(id); },
            [target] { target->apply_changes(); })) {
      target->stage(nullptr, id);  // stopped: nothing runs it any more
    }
  });
}

template <class T>
absl::Status Bus::publish_bulk(const Topic<T>& topic, std::span<const T> msgs) {
  // A batch of its own: a plain thread builds the whole span before it publishes.
  Batch batch(*this);
  if (!batch.accepted()) [[unlikely]]
    return detail::Core::stopped_status();
  detail::Producer& p = core_->producer();
  absl::Status result;
  std::size_t done = 0;
  if (detail::TopicTarget<T>* t = sole_target(p, topic_state(topic).targets.load())) {
    if (t->live.load(std::memory_order_relaxed) == 0) {
      done = msgs.size();  // no subscriber: published to nobody, as publish() does
      p.counters.add(topic.id(), detail::kPublished, done);
    } else {
      // Counted by their runs as they close (see detail::resolve_and_send()).
      detail::Ring& ring = p.ring_to(*t->inbox);
      auto* published = &p.counters.cell(topic.id(), detail::kPublished);
      done =
          detail::Core::append_all<T>(p, ring, *t->inbox, t, published, msgs.data(), msgs.size());
    }
  }
  // The rest (a full ring, several inboxes, a bridge thread) one by one: the overflow policy.
  for (; done < msgs.size(); ++done) {
    absl::Status s = publish_slow(p, topic, msgs[done]);
    if (!s.ok() && result.ok()) result = std::move(s);
  }
  return result;
}

template <class T, MessageOf<T> U>
absl::Status Bus::send(const Queue<T>& queue, U&& msg) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (!c.enter(p)) return detail::Core::stopped_status();
  absl::Status s = queue_state(queue).route(p, T(std::forward<U>(msg)));
  p.counters.add(queue.id(), detail::kPublished);  // refused ones too: counted as failed
  c.leave(p);
  return s;
}

template <class T, class F>
requires std::invocable<F&, T&&> Subscription Bus::consume(const Queue<T>& queue, F&& handler,
                                                           Placement where) {
  auto& st = queue_state(queue);
  return add_consumer(st.targets, std::make_unique<detail::QueueTarget<T>>(
                                      queue.id(), placed(where), st,
                                      absl::AnyInvocable<void(T &&)>(std::forward<F>(handler))));
}

template <class Req, class Rep, class F>
requires std::invocable<F&, Req&&> Subscription Bus::serve(const Endpoint<Req, Rep>& endpoint,
                                                           F&& handler, Placement where) {
  auto& st = endpoint_state(endpoint);
  using Target = detail::EndpointTarget<Req, Rep>;
  return add_consumer(st.targets,
                      std::make_unique<Target>(
                          endpoint.id(), placed(where), st,
                          typename Target::Handler([f = std::forward<F>(handler)](Req&& r) mutable {
                            return detail::invoke_handler<Rep>(f, std::move(r));
                          })));
}

template <class Req, class Rep, class F>
requires std::invocable<F&, Req&&, Replier<Rep>> Subscription
Bus::serve_async(const Endpoint<Req, Rep>& endpoint, F&& handler, Placement where) {
  auto& st = endpoint_state(endpoint);
  using Target = detail::EndpointTarget<Req, Rep>;
  return add_consumer(st.targets,
                      std::make_unique<Target>(endpoint.id(), placed(where), st,
                                               typename Target::Async(std::forward<F>(handler))));
}

template <class Tgt>
Subscription Bus::add_consumer(detail::Targets<Tgt>& targets, std::unique_ptr<Tgt> owned) {
  Tgt* target;
  {
    std::lock_guard lock(core_->mu);
    target = targets.add(std::move(owned));
  }
  return Subscription(core_, [&targets, target](detail::Core& c) {
    {
      std::lock_guard lock(c.mu);
      targets.remove(target);
    }
    // Messages already on their way to it are handed to another consumer by its inbox.
    (void)c.cancel_on(
        *target->inbox, [target] { target->stopped = true; }, [target] { target->retire(); });
  });
}

template <class Req, class Rep, MessageOf<Req> R, class F>
requires std::invocable<F&, absl::StatusOr<Rep>>
void Bus::request(const Endpoint<Req, Rep>& endpoint, R&& req, Clock::duration timeout,
                  F&& callback) {
  auto deadline = Clock::now() + timeout;
  detail::Producer& p = core_->producer();
  if (p.own_inbox != nullptr) {
    request_from(p, *p.own_inbox, endpoint, Req(std::forward<R>(req)), deadline,
                 std::forward<F>(callback));
    return;
  }
  // A plain thread has no inbox for the reply: make the request from an executor, for this
  // thread's principal. Handing it over waits for room in this thread's ring no longer than the
  // deadline.
  auto cb = std::make_shared<std::decay_t<F>>(std::forward<F>(callback));
  auto make = [this, &endpoint, req = Req(std::forward<R>(req)), deadline, cb,
               principal = detail::current_principal()]() mutable {
    PrincipalScope acting_for(principal);
    detail::Producer& ep = core_->producer();
    request_from(ep, *ep.own_inbox, endpoint, std::move(req), deadline,
                 [cb](absl::StatusOr<Rep> r) mutable { (*cb)(std::move(r)); });
  };
  absl::Status st = post_to(placed(Placement{}),
                            detail::DeadlineClosure<decltype(make)>{std::move(make), deadline});
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kDeadlineExceeded) {
      p.counters.add(endpoint.id(), detail::kPublished);
      p.counters.add(endpoint.id(), detail::kFailed);
    }
    (*cb)(absl::StatusOr<Rep>(st));  // on this thread: no executor took the request
  }
}

template <class Req, class Rep, class F>
void Bus::request_from(detail::Producer& p, detail::Inbox& home, const Endpoint<Req, Rep>& endpoint,
                       Req&& req, Clock::time_point deadline, F&& callback,
                       detail::EndpointTarget<Req, Rep>* to) {
  detail::Core& c = *core_;
  using CB = std::decay_t<F>;
  auto fail = [&](absl::Status s) {
    // Never call back inside request(): the failure waits in the caller's own inbox (`home` is
    // this thread's), outside its rings, which may be full.
    home.defer([cb = CB(std::forward<F>(callback)), s]() mutable { cb(absl::StatusOr<Rep>(s)); });
  };
  if (!c.enter(p)) {
    if (c.state() == detail::State::kStopped) {
      CB(std::forward<F>(callback))(absl::StatusOr<Rep>(detail::Core::stopped_status()));
    } else {
      fail(detail::Core::stopped_status());
    }
    return;
  }
  uint64_t corr = home.reserve_pending();
  p.counters.add(endpoint.id(), detail::kPublished);  // refused ones too: counted as failed
  if (corr == 0) [[unlikely]] {
    c.leave(p);
    p.counters.add(endpoint.id(), detail::kFailed);
    fail(absl::ResourceExhaustedError(absl::StrCat(
        "bus: ", home.max_pending(), " requests are waiting for replies on this thread already (",
        "Options::max_pending_requests); request to '", endpoint.name(), "' refused")));
    return;
  }
  detail::RequestEnvelope<Req, Rep> env{std::move(req), corr,     &home,
                                        nullptr,        deadline, detail::current_principal()};
  auto& st = endpoint_state(endpoint);
  absl::Status s = to ? st.send_to(p, *to, std::move(env)) : st.route(p, std::move(env));
  c.leave(p);
  if (!s.ok()) {
    home.release_pending(corr);
    fail(std::move(s));  // counted as failed by route()
    return;
  }
  // A request waits for its reply: it leaves at once (with what this thread sent before it), not
  // at the end of the handler batch making it. A Batch still holds it until the Batch ends.
  if (p.executor_unbatched()) p.flush();
  home.add_pending(corr, endpoint.id(), deadline,
                   [cb = CB(std::forward<F>(callback))](absl::Status st, void* rep) mutable {
                     if (st.ok()) {
                       cb(absl::StatusOr<Rep>(std::move(*static_cast<Rep*>(rep))));
                     } else {
                       cb(absl::StatusOr<Rep>(std::move(st)));
                     }
                   });
}

template <class Req, class Rep, MessageOf<Req> R>
absl::StatusOr<Rep> Bus::call(const Endpoint<Req, Rep>& endpoint, R&& req,
                              Clock::duration timeout) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (p.executor || p.bridge_thread) [[unlikely]] {
    return absl::FailedPreconditionError(
        p.executor ? "bus: call() would block an executor; use request() with a callback"
                   : "bus: call() would block a node's bridge thread (a Node::subscribe or "
                     "Node::serve handler); use request() with a callback");
  }
  auto deadline = Clock::now() + timeout;
  auto no_reply = [&] {
    return absl::DeadlineExceededError(
        absl::StrCat("bus: no reply from '", endpoint.name(), "' before the deadline"));
  };
  if (!c.enter(p)) return detail::Core::stopped_status();
  auto& st = endpoint_state(endpoint);
  Req request(std::forward<R>(req));
  auto* t =
      detail::pick(p, st.targets.load(), st.channel, st.key, static_cast<const Req&>(request));
  if (t != nullptr && t->direct) {
    // Another node's server: this thread sends the request and waits for the reply itself.
    std::shared_ptr<const typename detail::EndpointTarget<Req, Rep>::Direct> direct = t->direct;
    c.leave(p);
    p.counters.add(endpoint.id(), detail::kPublished);
    p.flush();  // what this thread published in a Batch goes before the request, as below
    std::optional<absl::StatusOr<Rep>> rep = (*direct)(std::move(request), deadline);
    if (!rep) return no_reply();
    return std::move(*rep);
  }
  auto waiter = std::make_shared<detail::Waiter<Rep>>();
  // Registered before the request leaves: stop() ends a call it finds there with Cancelled
  // (it looks once nothing is in flight, so after this thread's send and leave).
  detail::Producer::Calling calling(p, waiter);
  absl::Status s =
      st.route_to(p, t,
                  detail::RequestEnvelope<Req, Rep>{std::move(request), 0, nullptr, waiter,
                                                    deadline, detail::current_principal()});
  c.leave(p);
  p.counters.add(endpoint.id(), detail::kPublished);
  if (!s.ok()) return s;  // counted as failed where it failed
  p.flush();              // inside a Batch the request would otherwise wait for the batch to end
  if (waiter->wait_until(deadline)) return std::move(*waiter->result);
  return no_reply();
}

template <class S, class... A>
Service<S> Bus::service(Placement where, A&&... args) {
  unsigned executor = place(where);
  auto state = std::make_shared<S>(std::forward<A>(args)...);
  S* raw = state.get();
  return Service<S>(this, raw, keep_service(std::move(state)), executor);
}

template <class S, class... A>
ServiceGroup<S> Bus::group(unsigned n, bool sharded, const A&... args) {
  ServiceGroup<S> g;
  g.sharded_ = sharded;
  unsigned first = place(Placement{});
  for (unsigned i = 0; i < n; ++i) {
    g.members_.push_back(service<S>(on_executor((first + i) % executors()), args...));
  }
  return g;
}
template <class S, class... A>
ServiceGroup<S> Bus::pool(unsigned n, const A&... args) {
  return group<S>(n, false, args...);
}
template <class S, class... A>
ServiceGroup<S> Bus::sharded(unsigned n, const A&... args) {
  return group<S>(n, true, args...);
}

template <class F>
absl::Status Bus::post_to(detail::Inbox& inbox, F&& fn) {
  detail::Core& c = *core_;
  detail::Producer& p = c.producer();
  if (!c.enter(p)) return detail::Core::stopped_status();
  if (!p.executor && &inbox == p.own_inbox) {
    // An event loop posting to itself (a request's failure, a reply for its own thread): its
    // ring could be full, and only this thread drains it. Keep it in the inbox instead.
    inbox.defer(std::forward<F>(fn));
    c.leave(p);
    return absl::OkStatus();
  }
  using Fn = std::decay_t<F>;
  absl::Status s = c.send<Fn>(p, inbox, &detail::ClosureTarget<Fn>::kTarget, Overflow::kBlock,
                              UINT32_MAX, std::forward<F>(fn));
  c.leave(p);
  return s;
}

template <class F>
requires std::invocable<F&> absl::Status Bus::post(Placement where, F&& fn) {
  return post_to(placed(where), std::forward<F>(fn));
}

template <class F>
requires std::invocable<F&> TimerId Bus::after(Placement where, Clock::duration delay, F&& fn) {
  return schedule(where, delay, Clock::duration::zero(), std::forward<F>(fn));
}

template <class F>
requires std::invocable<F&> TimerId Bus::every(Placement where, Clock::duration period, F&& fn) {
  return schedule(where, period, period, std::forward<F>(fn));
}

template <class F>
TimerId Bus::schedule(Placement where, Clock::duration first, Clock::duration period, F&& fn) {
  detail::Inbox& in = placed(where);
  uint64_t id = in.reserve_timer_id();
  auto at = Clock::now() + first;
  absl::Status s = post_to(in, [&in, id, at, period, fn = std::forward<F>(fn)]() mutable {
    in.add_timer(id, at, period, std::move(fn), false);
  });
  return s.ok() ? TimerId{in.index(), id} : TimerId{};
}

}  // namespace bus
