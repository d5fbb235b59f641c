// The bus's internals, as the bridge reaches them: the bridge's own inbox, the routing of the
// proxies that stand for other nodes' consumers, and requests to local servers from the bridge
// thread.
#pragma once

#include <absl/functional/any_invocable.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <utility>

#include "bus/bus.hpp"

namespace bus::net::detail {

/// Bus internals the bridge needs (remote proxies are consumers the bus routes to).
struct BusAccess {
  static bus::detail::Inbox& inbox(ExternalInbox& x) { return *x.inbox_; }
  /// See Core::on_stop.
  static void on_stop(Bus& bus, absl::AnyInvocable<void()> hook) {
    bus.core_->on_stop(std::move(hook));
  }
  static void mark_bridge_thread(Bus& bus) {
    auto& p = bus.core_->producer();
    p.bridge_thread = true;
    p.routes = {};  // a bridge thread never takes the one-inbox route (see Producer::bridge)
  }
  /// While it lives, the calling bridge thread hands on what came from another node: its
  /// publishes, sends and requests stay local and skip the bridge's own inbox (see
  /// Producer::bridge).
  class ForOtherNodes {
   public:
    explicit ForOtherNodes(Bus& bus) : p_(bus.core_->producer()), was_(p_.bridge) {
      p_.bridge = true;
    }
    ForOtherNodes(const ForOtherNodes&) = delete;
    ForOtherNodes& operator=(const ForOtherNodes&) = delete;
    ~ForOtherNodes() { p_.bridge = was_; }

   private:
    bus::detail::Producer& p_;
    bool was_;
  };
  /// A remote proxy for `ep` on the bridge's inbox, owned by the bus and routed to at once.
  /// It lives as long as the bus; the bridge takes it in and out of the routing with route().
  template <class Req, class Rep>
  static bus::detail::EndpointTarget<Req, Rep>* add_remote_server(
      Bus& bus, const Endpoint<Req, Rep>& ep, bus::detail::Inbox& in,
      typename bus::detail::EndpointTarget<Req, Rep>::Forward fwd,
      std::shared_ptr<const typename bus::detail::EndpointTarget<Req, Rep>::Direct> direct) {
    auto& st = bus.endpoint_state(ep);
    std::lock_guard lock(bus.core_->mu);
    return st.targets.add(std::make_unique<bus::detail::EndpointTarget<Req, Rep>>(
        ep.id(), in, st, std::move(fwd), std::move(direct)));
  }
  /// A local server of `ep` on the bridge's own inbox (Node::serve).
  template <class Req, class Rep>
  static Subscription serve_at(Bus& bus, const Endpoint<Req, Rep>& ep, bus::detail::Inbox& in,
                               typename bus::detail::EndpointTarget<Req, Rep>::Handler fn) {
    auto& st = bus.endpoint_state(ep);
    return bus.add_consumer(st.targets, std::make_unique<bus::detail::EndpointTarget<Req, Rep>>(
                                            ep.id(), in, st, std::move(fn)));
  }
  /// A request from the bridge thread to a local server of `ep`. When routing picks a server on
  /// the bridge's own inbox (Node::serve) with a plain handler, it runs here and now and
  /// `callback` gets its answer at once: no record, no thread hop. Any other server gets the
  /// request as Bus::request() would send it, and `callback` runs later.
  template <class Req, class Rep, class F>
  static void request_local(Bus& bus, ExternalInbox& from, const Endpoint<Req, Rep>& ep, Req&& req,
                            Clock::duration timeout, F&& callback) {
    bus::detail::Core& c = *bus.core_;
    bus::detail::Producer& p = c.producer();
    bus::detail::Inbox& home = *from.inbox_;
    auto deadline = Clock::now() + timeout;
    auto& st = bus.endpoint_state(ep);
    ForOtherNodes for_others(bus);
    bus::detail::EndpointTarget<Req, Rep>* t = nullptr;
    if (c.enter(p)) {
      t = bus::detail::pick(p, st.targets.load(), st.channel, st.key, static_cast<const Req&>(req));
      c.leave(p);
    }
    // stopped and fn: read on their owner thread, this one.
    if (t != nullptr && t->inbox == &home && !t->stopped && t->fn) {
      p.counters.add(ep.id(), bus::detail::kPublished);
      absl::StatusOr<Rep> rep;
      {
        p.bridge = false;  // the handler's own requests and publishes go anywhere
        rep = t->answer(home, std::move(req), deadline);
        p.bridge = true;
      }
      callback(std::move(rep));
      return;
    }
    bus.request_from(p, home, ep, std::move(req), deadline, std::forward<F>(callback), t);
  }
  template <class T>
  static bus::detail::QueueState<T>& queue_state(Bus& bus, const Queue<T>& q) {
    return bus.queue_state(q);
  }
  template <class T>
  static bus::detail::QueueTarget<T>* add_remote_consumer(Bus& bus, const Queue<T>& q,
                                                          bus::detail::Inbox& in,
                                                          absl::AnyInvocable<void(T&&)> fn) {
    auto& st = bus.queue_state(q);
    std::lock_guard lock(bus.core_->mu);
    return st.targets.add(std::make_unique<bus::detail::QueueTarget<T>>(
        q.id(), in, st, std::move(fn), /*is_remote=*/true));
  }
  /// Takes a proxy in or out of its channel's routing. Records already on their way to it still
  /// reach it (the bridge answers them: "no live node" once none is left).
  template <class Tgt>
  static void route(Bus& bus, bus::detail::Targets<Tgt>& targets, Tgt* t, bool on) {
    std::lock_guard lock(bus.core_->mu);
    if (on) {
      targets.reinstate(t);
    } else {
      targets.remove(t);
    }
  }
  template <class Req, class Rep>
  static bus::detail::EndpointState<Req, Rep>& endpoint_state(Bus& bus,
                                                              const Endpoint<Req, Rep>& ep) {
    return bus.endpoint_state(ep);
  }
  /// Runs `fn` on `msg` as a subscriber of `topic` on the bridge's inbox, counted as that inbox
  /// counts its subscribers: delivered, or failed (and logged once) when it throws.
  template <class T, class F>
  static void run_subscriber(ExternalInbox& x, const Topic<T>& topic, F& fn, const T& msg) {
    try {
      fn(msg);
      x.inbox_->counters.add(topic.id(), bus::detail::kDelivered);
    } catch (...) {
      bus::detail::subscriber_threw(*x.inbox_, topic.id(), 1);
    }
  }
  /// True when `topic` has a subscriber on another inbox than `except` (the bridge's own).
  template <class T>
  static bool has_subscribers(Bus& bus, const Topic<T>& topic, bus::detail::Inbox& except) {
    const auto* list = bus.topic_state(topic).targets.load();
    if (list == nullptr) return false;
    for (const auto* t : list->targets) {
      if (t->inbox != &except && t->live.load(std::memory_order_relaxed) > 0) return true;
    }
    return false;
  }
};

}  // namespace bus::net::detail
