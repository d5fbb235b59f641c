// Request and reply: an endpoint's servers (EndpointTarget), its state, the envelopes a request
// and its reply travel in, and the waiter of a plain thread blocked in call().
#pragma once

#include "bus/detail/targets.hpp"

namespace bus::detail {

/// Where a plain thread blocked in call() waits for its reply. Whoever claims it first decides
/// the outcome: the server's reply, stop()'s Cancelled, or the caller giving up at its deadline.
template <class Rep>
struct Waiter final : WaiterBase {
  std::optional<absl::StatusOr<Rep>> result;
  /// Any thread. False when the outcome was decided already (the caller gave up, or stop()).
  bool fulfil(absl::StatusOr<Rep> r) {
    uint32_t waiting = kWaiting;
    if (!state.compare_exchange_strong(waiting, kWriting, std::memory_order_relaxed)) return false;
    result.emplace(std::move(r));
    state.store(kDone, std::memory_order_release);  // pairs with the acquire in wait_until()
    futex_wake_all(state);
    return true;
  }
  void cancel(const absl::Status& why) override { (void)fulfil(absl::StatusOr<Rep>(why)); }
};

template <class Req, class Rep>
struct RequestEnvelope {
  Req request;
  uint64_t correlation;
  Inbox* reply_to;                      // null when a plain thread waits in call()
  std::shared_ptr<Waiter<Rep>> waiter;  // set when reply_to is null
  Clock::time_point deadline;
  PrincipalPtr principal;  // who it is for (the requester's current principal), or null
};

template <class Rep>
struct ReplyEnvelope {
  absl::StatusOr<Rep> result;
  uint64_t correlation;
  uint32_t channel;
  // False for an answer the bus gave without a handler (the request expired, or no server was
  // left): its request is counted there, so it is never counted as a late reply too.
  bool by_handler;

  static void run(Target*, void* payload, Inbox& in) {
    PayloadGuard<ReplyEnvelope> guard{payload};
    auto* env = Payload<ReplyEnvelope>::get(payload);
    if (env->result.ok()) {
      in.complete(env->correlation, env->channel, absl::OkStatus(), &env->result.value(),
                  env->by_handler);
    } else {
      in.complete(env->correlation, env->channel, env->result.status(), nullptr, env->by_handler);
    }
  }
  static inline Target kTarget{&run, &Payload<ReplyEnvelope>::kOps};
};

template <class Req, class Rep>
inline constexpr bool kLatencyBound<RequestEnvelope<Req, Rep>> = true;
template <class Rep>
inline constexpr bool kLatencyBound<ReplyEnvelope<Rep>> = true;
template <class Rep>
inline constexpr bool kEssential<ReplyEnvelope<Rep>> = true;

template <class Req, class Rep>
struct EndpointState;
template <class Req, class Rep>
struct EndpointTarget;

}  // namespace bus::detail

namespace bus::detail {

/// One server of an endpoint: a local handler, or (`remote`) a bridge that forwards the request
/// to a server in another process and replies through `state->reply()` when the answer comes.
template <class Req, class Rep>
struct EndpointTarget : Target {
  using Envelope = RequestEnvelope<Req, Rep>;
  using Handler = absl::AnyInvocable<absl::StatusOr<Rep>(Req&&)>;
  using Forward = absl::AnyInvocable<void(Envelope&&)>;
  using Async = absl::AnyInvocable<void(Req&&, Replier<Rep>)>;
  /// Called from any thread; the answer, or nullopt when the deadline passed first.
  using Direct =
      absl::AnyInvocable<std::optional<absl::StatusOr<Rep>>(Req&&, Clock::time_point) const>;
  EndpointTarget(uint32_t ch, Inbox& in, EndpointState<Req, Rep>& st, Handler f)
      : Target{&run, &Payload<Envelope>::kOps},
        channel(ch),
        inbox(&in),
        state(&st),
        remote(false),
        fn(std::move(f)) {}
  EndpointTarget(uint32_t ch, Inbox& in, EndpointState<Req, Rep>& st, Forward f,
                 std::shared_ptr<const Direct> d = nullptr)
      : Target{&run, &Payload<Envelope>::kOps},
        channel(ch),
        inbox(&in),
        state(&st),
        remote(true),
        direct(std::move(d)),
        forward(std::move(f)) {}
  EndpointTarget(uint32_t ch, Inbox& in, EndpointState<Req, Rep>& st, Async f)
      : Target{&run, &Payload<Envelope>::kOps},
        channel(ch),
        inbox(&in),
        state(&st),
        remote(false),
        async(std::move(f)) {}
  const uint32_t channel;
  Inbox* const inbox;
  EndpointState<Req, Rep>* const state;
  const bool remote;
  // Remote proxies: Bus::call from a plain thread calls it instead of forwarding. Set once;
  // shared, so that a call in progress keeps it alive however long the proxy is gone.
  const std::shared_ptr<const Direct> direct;
  Handler fn;  // owner thread; all empty once the server is removed
  Forward forward;
  Async async;
  // Owner thread: set when the server is cancelled (at once, even from its own handler); what
  // reaches it after that goes to another server.
  bool stopped = false;
  void retire() {
    stopped = true;
    fn = nullptr;
    forward = nullptr;
    async = nullptr;
  }

  static void run(Target* self, void* payload, Inbox& in);
  /// On the server's thread: the plain handler's answer to `req`, counted as delivered or failed
  /// (a throw becomes Internal); DeadlineExceeded without running it, counted as expired, once
  /// `deadline` has passed.
  absl::StatusOr<Rep> answer(Inbox& in, Req&& req, Clock::time_point deadline);
  /// answer() once the deadline was looked at (see detail::reached()).
  absl::StatusOr<Rep> answer_unexpired(Inbox& in, Req&& req);

 private:
  absl::Status expired(Inbox& in);
};

template <class Req, class Rep>
struct EndpointState : ChannelState {
  using Envelope = RequestEnvelope<Req, Rep>;
  EndpointState(uint32_t ch, KeyFn<Req> k, Overflow o) : channel(ch), key(k), overflow(o) {}
  const uint32_t channel;
  const KeyFn<Req> key;
  const Overflow overflow;
  Targets<EndpointTarget<Req, Rep>> targets;

  absl::Status route(Producer& p, Envelope&& env) {
    return route_to(p, pick(p, targets.load(), channel, key, static_cast<const Req&>(env.request)),
                    std::move(env));
  }
  /// route() to `t`, picked already (null: none serves the endpoint).
  absl::Status route_to(Producer& p, EndpointTarget<Req, Rep>* t, Envelope&& env) {
    if (t == nullptr) {
      p.counters.add(channel, kFailed);  // (a full ring is counted by send())
      return absl::UnavailableError(
          absl::StrCat("bus: no handler serves endpoint '", channel_info(channel).name, "'"));
    }
    return send_to(p, *t, std::move(env));
  }
  absl::Status send_to(Producer& p, EndpointTarget<Req, Rep>& t, Envelope&& env) {
    return p.core.send<Envelope>(p, *t.inbox, &t, overflow, channel, std::move(env));
  }

  /// Sends the result back to whoever asked. Runs on the server's executor. `by_handler`: see
  /// ReplyEnvelope.
  void reply(Inbox& in, Envelope& env, absl::StatusOr<Rep> result, bool by_handler = true) {
    answer(in.core(), env.reply_to, env.waiter, env.correlation, std::move(result), by_handler);
  }
  /// The same from any thread that may send (an executor, or a plain thread that entered).
  void answer(Core& core, Inbox* reply_to, const std::shared_ptr<Waiter<Rep>>& waiter,
              uint64_t correlation, absl::StatusOr<Rep> result, bool by_handler = true) {
    Producer& p = core.producer();
    if (reply_to == nullptr) {
      // The caller gave up at its deadline, or stop() answered it: a late reply, counted by
      // this thread (which may have no inbox: a Replier answering from a plain thread).
      if (!waiter->fulfil(std::move(result)) && by_handler) {
        p.counters.add(channel, kRepliedLate);
      }
      return;
    }
    (void)p.core.send<ReplyEnvelope<Rep>>(p, *reply_to, &ReplyEnvelope<Rep>::kTarget,
                                          Overflow::kBlock, channel, std::move(result), correlation,
                                          channel, by_handler);
  }
  /// A Replier's way back (see bus::Replier).
  static void answer_later(void* self, Core& core, Inbox* reply_to,
                           std::shared_ptr<Waiter<Rep>>& waiter, uint64_t correlation,
                           absl::StatusOr<Rep>&& result) {
    Producer& p = core.producer();
    if (!core.enter(p)) return;  // stopped: the requester is told Cancelled by stop()
    static_cast<EndpointState*>(self)->answer(core, reply_to, waiter, correlation,
                                              std::move(result));
    core.leave(p);
  }
};

template <class Req, class Rep>
void EndpointTarget<Req, Rep>::run(Target* self, void* payload, Inbox& in) {
  auto* t = static_cast<EndpointTarget*>(self);
  PayloadGuard<Envelope> guard{payload};
  Envelope& env = *Payload<Envelope>::get(payload);
  if (t->stopped) {
    // This server was removed while the request was on its way: hand it to another one, or
    // count it as unrouted (a full ring counts where it refuses) and answer the caller.
    Producer& p = in.core().producer();
    auto* next = pick(p, t->state->targets.load(), t->channel, t->state->key,
                      static_cast<const Req&>(env.request));
    absl::Status s;
    if (next == nullptr) {
      in.counters.add(t->channel, kUnrouted);
      s = absl::UnavailableError(
          absl::StrCat("bus: no handler serves endpoint '", channel_info(t->channel).name, "'"));
    } else {
      s = t->state->send_to(p, *next, std::move(env));
    }
    if (!s.ok()) t->state->reply(in, env, std::move(s), /*by_handler=*/false);
    return;
  }
  if (reached(env.deadline)) {
    // The caller has given up (or is about to): do not spend the handler on it.
    t->state->reply(in, env, t->expired(in), /*by_handler=*/false);
    return;
  }
  if (t->forward) {
    t->forward(std::move(env));  // the bridge replies when the remote answer (or failure) comes
    return;
  }
  // The handler, and what it requests in turn, act for the request's principal.
  PrincipalScope acting_for(env.principal);
  if (t->async) {
    Replier<Rep> replier(&EndpointState<Req, Rep>::answer_later, t->state, in.core(), env.reply_to,
                         std::move(env.waiter), env.correlation, t->channel);
    try {
      t->async(std::move(env.request), std::move(replier));
      in.counters.add(t->channel, kDelivered);
    } catch (...) {
      // The replier went with the unwinding, answering Internal unless it was answered.
      in.counters.add(t->channel, kHandlerFailed);
      in.core().log_once(t->channel, "handler",
                         "async handler threw: " + describe_exception(std::current_exception()));
    }
    return;
  }
  t->state->reply(in, env, t->answer_unexpired(in, std::move(env.request)));
}

template <class Req, class Rep>
absl::StatusOr<Rep> EndpointTarget<Req, Rep>::answer(Inbox& in, Req&& req,
                                                     Clock::time_point deadline) {
  if (reached(deadline)) return expired(in);
  return answer_unexpired(in, std::move(req));
}

template <class Req, class Rep>
absl::StatusOr<Rep> EndpointTarget<Req, Rep>::answer_unexpired(Inbox& in, Req&& req) {
  try {
    absl::StatusOr<Rep> result = fn(std::move(req));
    in.counters.add(channel, kDelivered);
    return result;
  } catch (...) {
    in.counters.add(channel, kHandlerFailed);
    return absl::InternalError(
        absl::StrCat("bus: handler of '", channel_info(channel).name,
                     "' threw: ", describe_exception(std::current_exception())));
  }
}

template <class Req, class Rep>
absl::Status EndpointTarget<Req, Rep>::expired(Inbox& in) {
  in.counters.add(channel, kExpired);
  return absl::DeadlineExceededError(absl::StrCat("bus: request to '", channel_info(channel).name,
                                                  "' expired before a handler ran"));
}

}  // namespace bus::detail
