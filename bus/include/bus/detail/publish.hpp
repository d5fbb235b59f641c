// The publish path, in the order a message takes it. Bus::publish() and Publisher::publish()
// run its first two steps inline; the rest is out of line.
//
//   join_held_run       the run this thread's route holds (inside a Batch or an executor's pass)
//   send_through_gate   enter the bus as the thread must (Producer::Gate), then
//   send_on_route       the route's one subscribing inbox, while the route still holds; else
//   resolve_and_send    find the topic's subscribers, set the route again, apply the overflow
//                       policy, or
//   send_to_each        a copy to each subscribing inbox.
//
// Included by bus/detail/bus-inl.hpp.
#pragma once

#include <absl/status/status.h>

#include <type_traits>
#include <utility>

#include "bus/channel.hpp"
#include "bus/detail/core.hpp"
#include "bus/detail/targets.hpp"

namespace bus::detail {

/// The message joins the run `route` holds (its lease), while the topic's subscribers are
/// those of the route: true when it did (`msg` is untouched otherwise). With `kChannel`, the
/// route must also be `channel`'s (a slot of the thread's table, which channels share).
template <class T, bool kChannel, class U>
[[gnu::always_inline]] inline bool join_held_run(Producer::Route& route, uint32_t channel,
                                                 U&& msg) {
  // No look at the gate: a lease is taken inside a Batch or an executor's loop only, and their
  // flush closes the run, which empties the lease, before anything else runs on this thread.
  constexpr uint32_t kWords = Payload<T>::kWords - 1;
  RunLease& lease = route.lease;
  if (!lease.has_room(kWords) || (kChannel && route.channel != channel) ||
      static_cast<const TopicState<T>*>(route.state)->targets.load() != route.list)
    return false;
  // As Ring::extend_at() does: the lines ahead are asked for before the stores reach them.
  prefetch_for_write<Ring::kPrefetchWords * 8>(lease.at);
  Payload<T>::construct(lease.at, std::forward<U>(msg));
  lease.at += kWords;
  return true;
}

/// The route's one subscribing inbox, while the route still holds (this thread's route for the
/// topic, or a Publisher's): true when the message went into the ring (`msg` is untouched
/// otherwise). Only whether `g` is kPerSend matters: a Batch and an executor commit alike. A
/// message that joins an open run takes that run into the route's lease.
template <class T, class U>
[[gnu::always_inline]] inline bool send_on_route(Producer& p, Producer::Gate g,
                                                 Producer::Route& route, U&& msg) {
  if (static_cast<const TopicState<T>*>(route.state)->targets.load() != route.list) return false;
  auto* t = static_cast<TopicTarget<T>*>(route.target);
  // A message joins an open run of `t` without a look at its subscriber count: the run began
  // in this Batch (or executor pass) with a subscriber, and if the last one left since, the
  // message finds no handler, as one already in the ring does.
  if (g != Producer::kPerSend && Core::extend<T>(*route.ring, t, std::forward<U>(msg))) {
    // The second message of a run takes it (the first may be the only one: a message that
    // opens a run takes no lease, so sends to topics in turn never give one back). The lease
    // is the route's own, if it held one: spent, it went back as this run opened.
    route.ring->lease_run(reinterpret_cast<uint64_t>(t), route.lease);
    return true;
  }
  if (t->live.load(std::memory_order_relaxed) == 0 ||
      !Core::append_record<T, true>(p, g, *route.ring, *t->inbox, t, route.published,
                                    std::forward<U>(msg)))
    return false;
  // Outside kPerSend the message joined a run, counted when the run closes.
  if (g == Producer::kPerSend) CounterTable<kProducerCounters>::bump(*route.published);
  return true;
}

/// When the held run did not take the message: enters (a plain thread outside a Batch), tries
/// `route` when `routed`, else or when that fails calls `slow(msg)`, and leaves. In a Batch or
/// an executor's loop, a message that joins an open run takes the run into the route's lease
/// (send_on_route()).
template <class T, class U, class Slow>
[[gnu::always_inline]] inline absl::Status send_through_gate(Core& c, Producer& p, bool routed,
                                                             Producer::Route& route, U&& msg,
                                                             Slow&& slow) {
  // The slow path gets a small message by value: the caller's variable's address never leaves
  // the inline path, so it can live in a register. (Inlined itself: GCC otherwise makes this
  // lambda a function taking the variable's address, which keeps a loop's counter in memory,
  // stored and loaded again around every publish.)
  auto call_slow = [&]() __attribute__((always_inline)) {
    if constexpr (std::is_trivially_copyable_v<T> && sizeof(T) <= 16) {
      T copy = msg;
      return slow(std::move(copy));
    } else {
      return slow(std::forward<U>(msg));
    }
  };
  using Gate = Producer::Gate;
  const Gate gate = p.gate;
  // Inside a Batch (entered when it began) or on an executor running its loop: the records are
  // published at the Batch's end or the executor's flush. An executor whose loop ended looks at
  // whether the bus has stopped (see Producer::Gate).
  if (gate != Gate::kPerSend) [[unlikely]] {
    // The lease did not take the message: the first two of a run (the second takes the lease),
    // or one after another send to the inbox closed the run. (kPerSend's look comes
    // first: one branch for it, not two.)
    if (gate == Gate::kOpen) {
      if (routed && send_on_route<T>(p, Gate::kOpen, route, std::forward<U>(msg)))
        return absl::OkStatus();
      return call_slow();
    }
    if (c.enter(p, gate)) return call_slow();  // an executor past its loop: no lease
    return Core::stopped_status();
  }
  // A plain thread: enter (stop() waits for it), publish the record, wake, leave.
  constexpr Gate g = Gate::kPerSend;
  if (!c.enter(p, g)) [[unlikely]]
    return Core::stopped_status();
  if constexpr (Payload<T>::kInline && std::is_nothrow_constructible_v<T, U&&>) {
    // Nothing on the inline path can throw (the message is built in the ring, not boxed with
    // `new`, by a constructor that does not throw): no scope guard (it would keep the result in
    // memory).
    if (routed && send_on_route<T>(p, g, route, std::forward<U>(msg))) [[likely]] {
      Core::leave(p, g);
      return absl::OkStatus();
    }
    Leave leave{p, g};
    return call_slow();
  } else {
    Leave leave{p, g};  // also when building the message throws
    if (routed && send_on_route<T>(p, g, route, std::forward<U>(msg))) [[likely]]
      return absl::OkStatus();
    return call_slow();
  }
}

/// The topic's one subscribing inbox's target, when there is one and `p` is not a bridge thread
/// (which may have to skip its own inbox): the message then needs no copy.
template <class T>
TopicTarget<T>* sole_target(const Producer& p, const TargetList<TopicTarget<T>>* list) {
  return list != nullptr && list->targets.size() == 1 && !p.bridge_thread ? list->targets.front()
                                                                          : nullptr;
}

/// A copy to each subscribing inbox (several, or a bridge thread's publish): out of line.
template <class T, class U>
[[gnu::noinline]] absl::Status send_to_each(Core& c, Producer& p,
                                            const TargetList<TopicTarget<T>>& list,
                                            const Topic<T>& topic, U&& msg) {
  absl::Status result;
  TopicTarget<T>* last = nullptr;
  for (auto* t : list.targets) {
    if (t->live.load(std::memory_order_relaxed) == 0) continue;
    if (p.bridge && t->inbox == p.own_inbox) continue;  // see Producer
    // A run of `t` opened by the one-inbox route counts its messages when it closes; what is
    // sent here is counted per publish() (below): close that run rather than join it. (The
    // other way round cannot happen: a topic's target list only grows, so once a thread sends
    // here it never takes the one-inbox route for the topic again.)
    p.ring_to(*t->inbox).claim_run(reinterpret_cast<uint64_t>(t), nullptr);
    if (last) {
      absl::Status s = c.send<T, true>(p, *last->inbox, last, topic.overflow(), topic.id(),
                                       static_cast<const T&>(msg));
      if (!s.ok()) result = std::move(s);
    }
    last = t;
  }
  if (last) {
    absl::Status s =
        c.send<T, true>(p, *last->inbox, last, topic.overflow(), topic.id(), std::forward<U>(msg));
    if (!s.ok()) result = std::move(s);
  }
  return result;
}

/// When `route` does not hold (this thread has no route for the topic yet, or its subscribers
/// changed) or the ring is full (the overflow policy). Sets `route` again when the topic's
/// subscribers are on one inbox.
template <class T, class U>
[[gnu::noinline]] absl::Status resolve_and_send(Core& c, Producer& p, TopicState<T>& st,
                                                const Topic<T>& topic, Producer::Route& route,
                                                U&& msg) {
  const auto* list = st.targets.load();
  absl::Status result;
  if (TopicTarget<T>* t = sole_target(p, list)) {
    if (t->live.load(std::memory_order_relaxed) != 0) {
      Ring& ring = p.ring_to(*t->inbox);
      auto* published = &p.counters.cell(topic.id(), kPublished);
      route.set(topic.id(), &st, list, t, &ring, published);  // (gives the old lease back)
      const Producer::Gate g = p.gate;
      if (Core::append<T, true>(p, g, ring, *t->inbox, t, published, std::forward<U>(msg))) {
        if (g == Producer::kPerSend) CounterTable<kProducerCounters>::bump(*published);
        return absl::OkStatus();
      }
      result =
          c.send_full<T>(p, ring, *t->inbox, t, topic.overflow(), topic.id(), std::forward<U>(msg));
    }
  } else if (list != nullptr) {
    result = send_to_each(c, p, *list, topic, std::forward<U>(msg));
  }
  p.counters.add(topic.id(), kPublished);  // whatever became of its copies (see Stats)
  return result;
}

}  // namespace bus::detail
