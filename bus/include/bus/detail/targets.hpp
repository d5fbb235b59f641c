// Per-channel state and the targets records are addressed to.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/hash/hash.h>
#include <absl/status/statusor.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "bus/detail/core.hpp"
#include "bus/principal.hpp"
#include "bus/replier.hpp"

namespace bus::detail {

/// Calls an endpoint handler that returns Rep or absl::StatusOr<Rep>, as absl::StatusOr<Rep>.
template <class Rep, class F, class... A>
absl::StatusOr<Rep> invoke_handler(F& f, A&&... a) {
  using R = std::invoke_result_t<F&, A...>;
  if constexpr (std::is_same_v<std::remove_cvref_t<R>, absl::StatusOr<Rep>>) {
    return std::invoke(f, std::forward<A>(a)...);
  } else {
    static_assert(std::is_convertible_v<R, Rep>,
                  "an endpoint handler returns the endpoint's reply type or absl::StatusOr of it");
    return absl::StatusOr<Rep>(std::invoke(f, std::forward<A>(a)...));
  }
}

std::string describe_exception(std::exception_ptr e);

/// In a catch block: `messages` of `channel` failed in a subscriber on `in`. Counts them and logs
/// the first such failure of the channel.
void subscriber_threw(Inbox& in, uint32_t channel, std::size_t messages);

/// Destroys a record's payload when the invoke that consumes it ends, however it ends.
template <class P>
struct PayloadGuard {
  void* at;
  ~PayloadGuard() { Payload<P>::destroy(at); }
};

/// An immutable snapshot of a channel's targets. Publishers read it without a lock; a change
/// installs a new one and keeps the old until the bus goes (they are few: see README).
template <class Tgt>
struct TargetList {
  std::vector<Tgt*> targets;
};

template <class Tgt>
class Targets {
 public:
  const TargetList<Tgt>* load() const {
    return current_.load(std::memory_order_acquire);  // pairs with the release in replace()
  }
  /// Under Core::mu: takes ownership of `t` and routes to it from now on.
  Tgt* add(std::unique_ptr<Tgt> t) {
    Tgt* raw = t.get();
    owned.push_back(std::move(t));
    auto next = copy();
    next.push_back(raw);
    replace(std::move(next));
    return raw;
  }
  /// Under Core::mu: routes to `t` (one of `owned`) again.
  void reinstate(Tgt* t) {
    auto next = copy();
    if (std::find(next.begin(), next.end(), t) != next.end()) return;
    next.push_back(t);
    replace(std::move(next));
  }
  /// Under Core::mu: stops routing to `t` (it stays alive: records may still name it).
  void remove(Tgt* t) {
    auto next = copy();
    std::erase(next, t);
    replace(std::move(next));
  }
  std::vector<std::unique_ptr<Tgt>> owned;  // under Core::mu; live as long as the bus

 private:
  std::vector<Tgt*> copy() const {
    auto* l = load();
    return l ? l->targets : std::vector<Tgt*>{};
  }
  void replace(std::vector<Tgt*> next) {
    auto list = std::make_unique<TargetList<Tgt>>();
    list->targets = std::move(next);
    current_.store(list.get(), std::memory_order_release);
    lists_.push_back(std::move(list));
  }

  std::atomic<const TargetList<Tgt>*> current_{nullptr};
  std::vector<std::unique_ptr<TargetList<Tgt>>> lists_;
};

// ---- topics ----------------------------------------------------------------------------------

/// The subscribers of one topic on one inbox. The message is copied once per inbox and shared
/// by that inbox's subscribers.
template <class T>
struct TopicTarget : Target {
  TopicTarget(uint32_t ch, Inbox& in)
      : Target{&run, &Payload<T>::kOps, &run_many, &live}, channel(ch), inbox(&in) {}

  /// The handler of a subscriber that takes each message, kept as its own type: `one` calls it
  /// for one message, `each` for a run of them in one loop with the call inlined (one indirect
  /// call per run instead of one per message).
  struct Handler {
    std::shared_ptr<void> fn;  // the handler object (a D of handler<F>())
    void (*one)(void* fn, const T& msg) = nullptr;
    std::size_t (*each)(void* fn, uint64_t* payload, uint32_t stride, std::size_t count,
                        TopicTarget& t, Inbox& in) = nullptr;
  };
  template <class F>
  static Handler handler(F&& f) {
    using D = std::decay_t<F>;
    return Handler{std::make_shared<D>(std::forward<F>(f)),
                   +[](void* h, const T& msg) { (*static_cast<D*>(h))(msg); }, &each_of<D>};
  }
  /// A run to one subscriber: each payload is destroyed after its call, thrown or not. The
  /// loop's bound is `t.run_limit`, which stop_now() cuts to 0: a subscriber cancelled in its
  /// handler gets no more of the run. (Compared in memory, the bound costs no instruction more
  /// than a register; the rest of a cut run is destroyed undelivered.)
  template <class D>
  static std::size_t each_of(void* h, uint64_t* payload, uint32_t stride, std::size_t count,
                             TopicTarget& t, Inbox& in) {
    D& f = *static_cast<D*>(h);
    std::size_t delivered = 0;
    std::size_t i = 0;
    t.run_limit = count;
    for (; i < t.run_limit; ++i) {
      void* at = payload + i * stride;
      PayloadGuard<T> guard{at};
      try {
        f(*Payload<T>::get(at));
        ++delivered;
      } catch (...) {
        t.handler_threw(in, 1);
      }
    }
    for (; i < count; ++i) Payload<T>::destroy(payload + i * stride);
    return delivered;
  }

  /// A subscriber takes each message (`fn`), or a run of messages at once (`bulk`).
  struct Sub {
    uint64_t id;
    Handler fn;
    absl::AnyInvocable<void(std::span<const T>)> bulk;
    bool stopped = false;  // owner thread: cancelled, not called again; removed at the next record
  };
  /// A run record of T lies in memory as an array of T when the payloads are inline and fill
  /// their words exactly: then a bulk subscriber gets the run as one span.
  static constexpr bool kArrayRuns = Payload<T>::kInline && sizeof(T) % 8 == 0;
  const uint32_t channel;
  Inbox* const inbox;
  std::atomic<int> live{0};   // subscriptions; publishers skip the target at zero
  std::vector<Sub> subs;      // owner thread only
  std::size_t run_limit = 0;  // owner thread: each_of()'s bound, cut by stop_now()

  // Subscribe and cancel from any thread stage their change here; the owner applies it before
  // the next record, so a message published after subscribe() returned finds its handler.
  std::mutex changes_mu;
  std::vector<Sub> added;         // under changes_mu
  std::vector<uint64_t> removed;  // under changes_mu
  std::atomic<bool> changed{false};

  void stage(Sub* add, uint64_t remove) {
    std::lock_guard lock(changes_mu);
    if (add) added.push_back(std::move(*add));
    if (remove) removed.push_back(remove);
    changed.store(true, std::memory_order_release);  // pairs with the acquire in run()
  }
  /// Owner thread, between records. The subscribers removed go after the lock is released:
  /// their handlers' captures may cancel other registrations, this target's among them.
  void apply_changes() {
    std::vector<Sub> gone;
    {
      std::lock_guard lock(changes_mu);
      for (auto& s : added) subs.push_back(std::move(s));
      added.clear();
      for (uint64_t id : removed) {
        for (auto it = subs.begin(); it != subs.end();) {
          if (it->id == id) {
            gone.push_back(std::move(*it));
            it = subs.erase(it);
          } else {
            ++it;
          }
        }
      }
      removed.clear();
      changed.store(false, std::memory_order_relaxed);
    }
  }
  /// Owner thread, at any moment (a handler of this inbox may be running, this subscriber's
  /// own among them): subscriber `id` is not called again, not even for the rest of the record
  /// or run being delivered. Its removal from `subs` is staged for the next record.
  void stop_now(uint64_t id) {
    for (Sub& s : subs) {
      if (s.id == id) {
        s.stopped = true;
        run_limit = 0;  // a run in each_of() goes to this subscriber only
      }
    }
    std::vector<Sub> gone;  // subscribed and cancelled before the owner took it in
    std::lock_guard lock(changes_mu);
    for (auto it = added.begin(); it != added.end();) {
      if (it->id == id) {
        gone.push_back(std::move(*it));
        it = added.erase(it);
      } else {
        ++it;
      }
    }
    removed.push_back(id);
    changed.store(true, std::memory_order_release);
  }

  /// Delivers one message to every subscriber; returns how many took it without throwing.
  [[gnu::always_inline]] std::size_t deliver(void* payload, Inbox& in) {
    if (changed.load(std::memory_order_acquire)) apply_changes();  // pairs with stage()
    return deliver_to_subs(payload, in);
  }
  [[gnu::always_inline]] std::size_t deliver_to_subs(void* payload, Inbox& in) {
    PayloadGuard<T> guard{payload};
    const T& msg = *Payload<T>::get(payload);
    // The changes applied just before removed every stopped subscriber: only a handler of this
    // message can stop one, and after the only one nothing is left to call.
    if (subs.size() == 1) [[likely]]
      return call_one(subs.front(), msg, in);
    std::size_t delivered = 0;
    for (auto& s : subs) {
      if (!s.stopped) delivered += call_one(s, msg, in);
    }
    return delivered;
  }
  /// One message to one subscriber, whichever kind.
  std::size_t call_one(Sub& s, const T& msg, Inbox& in) {
    return s.bulk ? call_bulk(s, {&msg, 1}, in) : call(s, msg, in);
  }
  [[gnu::always_inline]] std::size_t call(Sub& s, const T& msg, Inbox& in) {
    try {
      s.fn.one(s.fn.fn.get(), msg);
      return 1;
    } catch (...) {
      handler_threw(in, 1);
      return 0;
    }
  }
  /// A bulk handler that throws counts the whole span as failed (it cannot say where it stopped).
  std::size_t call_bulk(Sub& s, std::span<const T> msgs, Inbox& in) {
    try {
      s.bulk(msgs);
      return msgs.size();
    } catch (...) {
      handler_threw(in, msgs.size());
      return 0;
    }
  }
  [[gnu::noinline]] void handler_threw(Inbox& in, std::size_t messages) {
    subscriber_threw(in, channel, messages);
  }
  static void run(Target* self, void* payload, Inbox& in) {
    auto* t = static_cast<TopicTarget*>(self);
    in.counters.add(t->channel, kDelivered, t->deliver(payload, in));
  }
  /// A run of messages: counted once. Changes staged before it are applied first; the run's
  /// messages were all visible before that look (so one published after a subscribe() returned
  /// finds its handler), and handlers only stage changes, so `subs` holds still during the run.
  static void run_many(Target* self, uint64_t* payload, uint32_t stride, std::size_t count,
                       Inbox& in) {
    auto* t = static_cast<TopicTarget*>(self);
    if (t->changed.load(std::memory_order_acquire)) t->apply_changes();  // pairs with stage()
    std::size_t delivered = 0;
    auto at = [&](std::size_t i) -> void* { return payload + i * stride; };
    if (t->subs.size() == 1 && !t->subs.front().bulk) {
      Handler& h = t->subs.front().fn;
      delivered = h.each(h.fn.get(), payload, stride, count, *t, in);
    } else {
      // Each subscriber takes the whole run in turn (its order is kept); then the payloads go.
      // One stopped by a handler of the run (stop_now) is not called again.
      bool array = kArrayRuns && stride * 8 == sizeof(T);
      for (Sub& s : t->subs) {
        if (s.stopped) continue;
        if (s.bulk && array) {
          delivered += t->call_bulk(s, {Payload<T>::get(payload), count}, in);
          continue;
        }
        for (std::size_t i = 0; i < count && !s.stopped; ++i) {
          delivered += t->call_one(s, *Payload<T>::get(at(i)), in);
        }
      }
      for (std::size_t i = 0; i < count; ++i) Payload<T>::destroy(at(i));
    }
    in.counters.add(t->channel, kDelivered, delivered);
  }
};

template <class T>
struct TopicState : ChannelState {
  Targets<TopicTarget<T>> targets;
  uint64_t last_sub = 0;  // under Core::mu
};

// ---- queues and endpoints: one consumer per message --------------------------------------------

/// Routes a message to one of a channel's consumers. Key routing uses the key's hash modulo the
/// consumer count; otherwise the producing thread's own round-robin counter (no shared write).
/// A bridge thread skips remote proxies (what came from another node stays local).
template <class Tgt, class T>
Tgt* pick(Producer& p, const TargetList<Tgt>* list, uint32_t channel, KeyFn<T> key, const T& msg) {
  if (list == nullptr || list->targets.empty()) return nullptr;
  std::size_t n = list->targets.size();
  std::size_t i = key ? absl::HashOf(key(msg)) % n : p.next_round_robin(channel) % n;
  if (__builtin_expect(p.bridge, 0)) {
    for (std::size_t k = 0; k < n; ++k) {
      Tgt* t = list->targets[(i + k) % n];
      if (!t->remote) return t;
    }
    return nullptr;
  }
  return list->targets[i];
}

template <class T>
struct QueueState;

/// One consumer of a queue: a local handler, or (`remote`) a bridge that forwards to a consumer
/// in another process.
template <class T>
struct QueueTarget : Target {
  using Handler = absl::AnyInvocable<void(T&&)>;
  QueueTarget(uint32_t ch, Inbox& in, QueueState<T>& st, Handler f, bool is_remote = false)
      : Target{&run, &Payload<T>::kOps},
        channel(ch),
        inbox(&in),
        state(&st),
        remote(is_remote),
        fn(std::move(f)) {}
  const uint32_t channel;
  Inbox* const inbox;
  QueueState<T>* const state;
  const bool remote;
  Handler fn;  // owner thread; empty once the consumer is removed
  // Owner thread: set when the consumer is cancelled (at once, even from its own handler);
  // what reaches it after that goes to another consumer.
  bool stopped = false;
  void retire() {
    stopped = true;
    fn = nullptr;
  }

  static void run(Target* self, void* payload, Inbox& in);
};

template <class T>
struct QueueState : ChannelState {
  QueueState(uint32_t ch, KeyFn<T> k, Overflow o) : channel(ch), key(k), overflow(o) {}
  const uint32_t channel;
  const KeyFn<T> key;
  const Overflow overflow;
  Targets<QueueTarget<T>> targets;

  absl::Status route(Producer& p, T&& msg) {
    QueueTarget<T>* t = pick(p, targets.load(), channel, key, static_cast<const T&>(msg));
    if (t == nullptr) {
      p.counters.add(channel, kFailed);
      return absl::UnavailableError(
          absl::StrCat("bus: no consumer for queue '", channel_info(channel).name, "'"));
    }
    return p.core.send<T>(p, *t->inbox, t, overflow, channel, std::move(msg));
  }
  /// A message whose consumer was cancelled on its way, from that consumer's inbox: to another
  /// consumer, or counted as unrouted when none is left (a full ring counts where it refuses).
  void reroute(Producer& p, Inbox& in, T&& msg) {
    QueueTarget<T>* t = pick(p, targets.load(), channel, key, static_cast<const T&>(msg));
    if (t == nullptr) {
      in.counters.add(channel, kUnrouted);
      in.core().log_once(channel, "unrouted", "consumer removed and no other consumer left");
      return;
    }
    (void)p.core.send<T>(p, *t->inbox, t, overflow, channel, std::move(msg));
  }
};

template <class T>
void QueueTarget<T>::run(Target* self, void* payload, Inbox& in) {
  auto* t = static_cast<QueueTarget*>(self);
  PayloadGuard<T> guard{payload};
  T& msg = *Payload<T>::get(payload);
  if (t->stopped) {
    // This consumer was removed while the message was on its way: hand it to another one.
    t->state->reroute(in.core().producer(), in, std::move(msg));
    return;
  }
  try {
    t->fn(std::move(msg));
    in.counters.add(t->channel, kDelivered);
  } catch (...) {
    in.counters.add(t->channel, kHandlerFailed);
    in.core().log_once(t->channel, "handler",
                       "consumer threw: " + describe_exception(std::current_exception()));
  }
}

}  // namespace bus::detail
