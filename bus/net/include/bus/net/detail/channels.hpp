// The typed adapters between a channel and the bridge: one per channel and direction. They run
// on the bridge thread only; the bridge (bus/net/bridge.hpp) sees them through `Bridged`
// (bridged.hpp).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bus/bus.hpp"
#include "bus/message.hpp"
#include "bus/net/detail/bridged.hpp"
#include "bus/net/detail/bus_access.hpp"
#include "bus/net/detail/payload.hpp"

namespace bus::net::detail {

template <class T>
class ExportTopic final : public Bridged {
 public:
  explicit ExportTopic(const Topic<T>& t)
      : Bridged(Role::kExportTopic, t, schema_id<T>(), 0), topic_(t) {}
  void start(Link& link) override {
    sub_ = link.inbox().subscribe(topic_, [this, &link](const T& m) {
      if constexpr (bus::detail::IsMessage<T>::value) {
        if (m.bytes().size() >= kLargeMessageBytes) {
          if (!link.oversized(*this, m.bytes().size())) {
            link.publish_large(*this, out, bus::detail::MessageAccess::ref(m));
          }
          return;
        }
      }
      std::size_t before = out.bytes.size();
      encode(m, out.bytes);
      if (link.oversized(*this, out.bytes.size() - before)) {
        out.bytes.resize(before);
        return;
      }
      ++out.count;
      link.queue_publish(*this, out);
    });
  }
  void stop(Link&) override { sub_.cancel(); }

 private:
  const Topic<T>& topic_;
  Subscription sub_;
};

/// Bridged::merge() for a channel whose only addition is a handler of its own (`here_`, taken
/// at start()): `self` takes `again`'s.
template <class C>
void merge_handler(C& self, Link& link, Bridged& again) {
  // One name is one channel type (the registry throws otherwise), so `again` is a C.
  if (auto* same = dynamic_cast<C*>(&again); same != nullptr && same->here_) {
    self.here_ = std::move(same->here_);
    self.start(link);
  }
}

/// Brings other nodes' messages of a topic to its local subscribers; with a handler of its own
/// (Node::subscribe), also one such subscriber on the bridge thread, which takes them inline.
template <class T>
class ImportTopic final : public Bridged {
 public:
  using Handler = absl::AnyInvocable<void(const T&)>;
  explicit ImportTopic(const Topic<T>& t, Handler here = nullptr)
      : Bridged(Role::kImportTopic, t, schema_id<T>(), 0), topic_(t), here_(std::move(here)) {}
  void start(Link& link) override {
    if (!here_) return;
    auto h = std::make_shared<Handler>(std::move(here_));
    here_ = nullptr;
    handlers_.push_back(h);
    // Local publishes reach it through the bridge's inbox (the bridge's own publishes skip that
    // inbox: they come here, to deliver(), instead).
    subs_.push_back(link.inbox().subscribe(topic_, [h](const T& m) { (*h)(m); }));
  }
  void stop(Link&) override {
    for (Subscription& s : subs_) s.cancel();
    handlers_.clear();
  }
  void merge(Link& link, Bridged& again) override { merge_handler(*this, link, again); }
  absl::Status deliver(Link& link, kj::ArrayPtr<const capnp::word> payload) override {
    absl::StatusOr<T> m = decode<T>(payload, link.limits());
    if (!m.ok()) return m.status();
    for (const auto& h : handlers_) BusAccess::run_subscriber(link.inbox(), topic_, *h, *m);
    BusAccess::ForOtherNodes for_others(link.bus());
    (void)link.bus().publish(topic_, std::move(*m));  // local refusals are in the bus's stats
    return absl::OkStatus();
  }
  bool wanted(Link& link) override {
    return !handlers_.empty() ||
           BusAccess::has_subscribers(link.bus(), topic_, BusAccess::inbox(link.inbox()));
  }

 private:
  const Topic<T>& topic_;
  template <class C>
  friend void merge_handler(C&, Link&, Bridged&);
  Handler here_;  // moved into handlers_ at start()
  std::vector<std::shared_ptr<Handler>> handlers_;
  std::vector<Subscription> subs_;
};

template <class T>
class ExportQueue final : public Bridged {
 public:
  explicit ExportQueue(const Queue<T>& q)
      : Bridged(Role::kExportQueue, q, schema_id<T>(), 0), queue_(q) {}
  absl::Status deliver(Link& link, kj::ArrayPtr<const capnp::word> payload) override {
    absl::StatusOr<T> m = decode<T>(payload, link.limits());
    if (!m.ok()) return m.status();
    BusAccess::ForOtherNodes for_others(link.bus());
    (void)link.bus().send(queue_, std::move(*m));
    return absl::OkStatus();
  }

 private:
  const Queue<T>& queue_;
};

template <class T>
class ImportQueue final : public Bridged {
 public:
  explicit ImportQueue(const Queue<T>& q)
      : Bridged(Role::kImportQueue, q, schema_id<T>(), 0), queue_(q) {}
  void set_reachable(Link& link, bool reachable) override {
    if (reachable == routed_) return;
    routed_ = reachable;
    if (proxy_ == nullptr) {
      proxy_ = BusAccess::add_remote_consumer<T>(
          link.bus(), queue_, BusAccess::inbox(link.inbox()), [this, &link](T&& m) {
            (void)link.send(*this, encode_out(m));  // refusals are counted by the bridge
          });
      return;
    }
    BusAccess::route(link.bus(), BusAccess::queue_state(link.bus(), queue_).targets, proxy_,
                     reachable);
  }
  void stop(Link& link) override { set_reachable(link, false); }

 private:
  const Queue<T>& queue_;
  bus::detail::QueueTarget<T>* proxy_ = nullptr;  // owned by the bus
  bool routed_ = false;
};

/// Serves other nodes' requests with the local servers of an endpoint; with a handler of its
/// own (Node::serve), also one such server on the bridge's inbox, which answers them inline.
template <class Req, class Rep>
class ExportEndpoint final : public Bridged {
 public:
  using Handler = typename bus::detail::EndpointTarget<Req, Rep>::Handler;
  explicit ExportEndpoint(const Endpoint<Req, Rep>& e, Handler here = nullptr)
      : Bridged(Role::kExportEndpoint, e, schema_id<Req>(), schema_id<Rep>()),
        endpoint_(e),
        here_(std::move(here)) {}
  void start(Link& link) override {
    if (here_) {
      servers_.push_back(BusAccess::serve_at(link.bus(), endpoint_, BusAccess::inbox(link.inbox()),
                                             std::move(here_)));
    }
  }
  void stop(Link&) override {
    for (Subscription& s : servers_) s.cancel();
  }
  void merge(Link& link, Bridged& again) override { merge_handler(*this, link, again); }
  void serve(Link& link, RemoteCall call, kj::ArrayPtr<const capnp::word> payload,
             Clock::duration timeout) override {
    absl::StatusOr<Req> req = decode<Req>(payload, link.limits());
    if (!req.ok()) {
      link.reply(*this, call, req.status(), {});
      return;
    }
    // From the bridge thread, the bus routes to local servers only.
    BusAccess::request_local(link.bus(), link.inbox(), endpoint_, std::move(*req), timeout,
                             [this, &link, call = std::move(call)](absl::StatusOr<Rep> rep) {
                               OutPayload out;
                               if (rep.ok()) out = encode_out(*rep);
                               link.reply(*this, call, rep.status(), std::move(out));
                             });
  }

 private:
  const Endpoint<Req, Rep>& endpoint_;
  template <class C>
  friend void merge_handler(C&, Link&, Bridged&);
  Handler here_;  // moved into a server at start()
  std::vector<Subscription> servers_;
};

template <class Req, class Rep>
class ImportEndpoint final : public Bridged {
  using Envelope = bus::detail::RequestEnvelope<Req, Rep>;
  using State = bus::detail::EndpointState<Req, Rep>;

  static absl::StatusOr<Rep> result(absl::Status status, kj::ArrayPtr<const capnp::word> payload,
                                    const Limits& limits) {
    return status.ok() ? decode<Rep>(payload, limits) : absl::StatusOr<Rep>(std::move(status));
  }
  struct Call final : PendingCall {
    Call(Link& l, State& s, Envelope&& e) : link(l), state(s), env(std::move(e)) {}
    void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) override {
      state.reply(BusAccess::inbox(link.inbox()), env,
                  result(std::move(status), payload, link.limits()));
    }
    Link& link;
    State& state;
    Envelope env;
  };
  /// A Bus::call() made on its caller's thread (see DirectCalls). Holds copies of what it
  /// needs: a call may outlast the node.
  struct CallHere {
    std::shared_ptr<DirectCalls> calls;
    std::string name;
    uint64_t type_id, reply_type_id;
    Limits limits;
    std::optional<absl::StatusOr<Rep>> operator()(Req&& req, Clock::time_point deadline) const {
      OutPayload payload = encode_out(req);
      struct Answer final : PendingCall {
        explicit Answer(const Limits& l) : limits(l) {}
        void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) override {
          rep = result(std::move(status), payload, limits);
        }
        const Limits& limits;
        std::optional<absl::StatusOr<Rep>> rep;
      } answer(limits);
      if (!calls->call(name, type_id, reply_type_id, payload, deadline, answer)) {
        return std::nullopt;
      }
      return std::move(answer.rep);
    }
  };

 public:
  explicit ImportEndpoint(const Endpoint<Req, Rep>& e)
      : Bridged(Role::kImportEndpoint, e, schema_id<Req>(), schema_id<Rep>()), endpoint_(e) {}
  void set_reachable(Link& link, bool reachable) override {
    if (reachable == routed_) return;
    routed_ = reachable;
    State& state = BusAccess::endpoint_state(link.bus(), endpoint_);
    if (proxy_ == nullptr) {
      proxy_ = BusAccess::add_remote_server<Req, Rep>(
          link.bus(), endpoint_, BusAccess::inbox(link.inbox()),
          [this, &link, &state](Envelope&& env) {
            OutPayload payload = encode_out(env.request);
            Clock::time_point deadline = env.deadline;
            PrincipalPtr principal = env.principal;
            link.call(*this, std::move(payload), deadline, std::move(principal),
                      std::make_unique<Call>(link, state, std::move(env)));
          },
          std::make_shared<const typename bus::detail::EndpointTarget<Req, Rep>::Direct>(
              CallHere{link.direct_calls(), name, type_id, reply_type_id, link.limits()}));
      return;
    }
    BusAccess::route(link.bus(), state.targets, proxy_, reachable);
  }
  void stop(Link& link) override { set_reachable(link, false); }

 private:
  const Endpoint<Req, Rep>& endpoint_;
  bus::detail::EndpointTarget<Req, Rep>* proxy_ = nullptr;  // owned by the bus
  bool routed_ = false;
};

}  // namespace bus::net::detail
