// Reactor's and the compositions' definitions. Included by bus/compose.hpp.
#pragma once

#include <absl/strings/str_cat.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

namespace bus {

namespace detail {

/// An error for "every call failed": the last failure's code, every failure's message.
inline absl::Status all_failed(const std::vector<absl::Status>& errors, std::size_t last) {
  std::string msg = absl::StrCat("bus: all ", errors.size(), " calls failed:");
  for (std::size_t i = 0; i < errors.size(); ++i) {
    absl::StrAppend(&msg, " [", i, "] ", errors[i].ToString(), i + 1 < errors.size() ? ";" : "");
  }
  return absl::Status(errors[last].code(), msg);
}

}  // namespace detail

// ==== Reactor ===================================================================================

inline Reactor::~Reactor() {
  core_->alive.store(false, std::memory_order_relaxed);
  detail::ReactorCore::bump(core_->abandoned, static_cast<int64_t>(core_->awaiting));
  core_->awaiting = 0;
}

inline ReactorStats Reactor::stats() const {
  ReactorStats s;
  s.started = core_->started.load(std::memory_order_relaxed);
  s.completed = core_->completed.load(std::memory_order_relaxed);
  s.rejected = core_->rejected.load(std::memory_order_relaxed);
  s.abandoned = core_->abandoned.load(std::memory_order_relaxed);
  s.pending = core_->pending.load(std::memory_order_relaxed);
  return s;
}

inline detail::Producer& Reactor::owner() {
  detail::Producer& p = bus_.core_->producer();
  if (p.own_inbox == nullptr) {
    throw std::logic_error(
        "bus::Reactor: start compositions on an executor or an external inbox's thread (in a "
        "handler, a timer or a posted closure), not on a plain thread");
  }
  if (core_->home == nullptr) core_->home = p.own_inbox;
  if (core_->home != p.own_inbox) {
    throw std::logic_error(
        "bus::Reactor: used from two threads; a reactor belongs to the thread of its first "
        "composition (give each service or I/O thread its own)");
  }
  return p;
}

inline bool Reactor::admit() {
  if (core_->pending.load(std::memory_order_relaxed) >= core_->max_pending) {
    detail::ReactorCore::bump(core_->rejected);
    return false;
  }
  detail::ReactorCore::bump(core_->started);
  detail::ReactorCore::bump(core_->pending);
  ++core_->awaiting;
  return true;
}

template <class F>
void Reactor::later(F fn) {
  (void)bus_.post_to(*core_->home, [core = core_, fn = std::move(fn)]() mutable {
    if (core->alive.load(std::memory_order_relaxed)) fn();
  });
}

inline absl::Status Reactor::refusal(std::size_t max) {
  return absl::ResourceExhaustedError(absl::StrCat(
      "bus: too many compositions in progress (ReactorOptions::max_pending_compositions ", max,
      ")"));
}

template <class Call, class CB>
void Reactor::issue(detail::Producer& p, Call&& c, Clock::time_point now, Clock::duration timeout,
                    CB&& cb) {
  Clock::duration t = c.timeout && *c.timeout < timeout ? *c.timeout : timeout;
  bus_.request_from(p, *core_->home, *c.endpoint, std::move(c.request), now + t,
                    std::forward<CB>(cb));
}

template <class Req, class Rep>
const detail::TargetList<detail::EndpointTarget<Req, Rep>>* Reactor::servers(
    const Endpoint<Req, Rep>& endpoint) {
  return bus_.endpoint_state(endpoint).targets.load();
}

template <class Req, class Rep, class CB>
void Reactor::issue_to(detail::Producer& p, const Endpoint<Req, Rep>& endpoint,
                       detail::EndpointTarget<Req, Rep>* server, Req&& request,
                       Clock::time_point deadline, CB&& cb) {
  bus_.request_from(p, *core_->home, endpoint, std::move(request), deadline, std::forward<CB>(cb),
                    server);
}

// ==== the compositions ==========================================================================

template <class... C>
template <class F>
void AllOf<C...>::then(F&& fn) && {
  using Fn = std::decay_t<F>;
  static_assert(std::is_invocable_v<Fn&, absl::StatusOr<typename C::Reply>...>,
                "bus::Reactor::all: the continuation takes absl::StatusOr<Reply> for each "
                "call, in order");
  Reactor& r = reactor_;
  detail::Producer& p = r.owner();
  if (!r.admit()) {
    r.later([fn = Fn(std::forward<F>(fn)), max = r.core_->max_pending]() mutable {
      fn(absl::StatusOr<typename C::Reply>(Reactor::refusal(max))...);
    });
    return;
  }
  struct State {
    std::shared_ptr<detail::ReactorCore> core;
    Fn fn;
    std::tuple<std::optional<absl::StatusOr<typename C::Reply>>...> results;
    std::size_t left = sizeof...(C);
    void arrived() {
      if (--left > 0) return;
      core->settled();
      if (!core->due()) return;
      std::apply([&](auto&... r) { fn(std::move(*r)...); }, results);
    }
  };
  auto st = std::make_shared<State>(State{r.core_, Fn(std::forward<F>(fn)), {}});
  auto now = Clock::now();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (r.issue(p, std::move(std::get<I>(calls_)), now, timeout_,
             [st](absl::StatusOr<typename C::Reply> rep) {
               std::get<I>(st->results).emplace(std::move(rep));
               st->arrived();
             }),
     ...);
  }
  (std::index_sequence_for<C...>{});
}

template <class... C>
template <class F>
void FirstOf<C...>::then(F&& fn) && {
  using Fn = std::decay_t<F>;
  static_assert(std::is_invocable_v<Fn&, absl::StatusOr<Rep>, std::size_t>,
                "bus::Reactor::first: the continuation takes (absl::StatusOr<Reply>, "
                "std::size_t index)");
  Reactor& r = reactor_;
  detail::Producer& p = r.owner();
  if (!r.admit()) {
    r.later([fn = Fn(std::forward<F>(fn)), max = r.core_->max_pending]() mutable {
      fn(absl::StatusOr<Rep>(Reactor::refusal(max)), SIZE_MAX);
    });
    return;
  }
  struct State {
    std::shared_ptr<detail::ReactorCore> core;
    Fn fn;
    std::vector<absl::Status> errors = std::vector<absl::Status>(sizeof...(C));
    std::size_t left = sizeof...(C);
    bool done = false;
    void arrived(std::size_t i, absl::StatusOr<Rep>&& rep) {
      bool last = --left == 0;
      if (last) core->settled();
      if (done) return;
      if (rep.ok()) {
        done = true;
        if (core->due()) fn(std::move(rep), i);
      } else {
        errors[i] = rep.status();
        if (last) {
          done = true;
          if (core->due()) fn(absl::StatusOr<Rep>(detail::all_failed(errors, i)), SIZE_MAX);
        }
      }
    }
  };
  auto st = std::make_shared<State>(State{r.core_, Fn(std::forward<F>(fn))});
  auto now = Clock::now();
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    (r.issue(p, std::move(std::get<I>(calls_)), now, timeout_,
             [st](absl::StatusOr<Rep> rep) { st->arrived(I, std::move(rep)); }),
     ...);
  }
  (std::index_sequence_for<C...>{});
}

template <class Req, class Rep>
template <class F>
void EachOf<Req, Rep>::then(F&& fn) && {
  using Fn = std::decay_t<F>;
  using Replies = std::vector<absl::StatusOr<Rep>>;
  static_assert(std::is_invocable_v<Fn&, Replies>,
                "bus::Reactor::each: the continuation takes "
                "std::vector<absl::StatusOr<Reply>>");
  static_assert(std::is_copy_constructible_v<Req>,
                "bus::Reactor::each: the request is copied to every server");
  Reactor& r = reactor_;
  detail::Producer& p = r.owner();
  if (!r.admit()) {
    r.later([fn = Fn(std::forward<F>(fn)), max = r.core_->max_pending]() mutable {
      fn(Replies{absl::StatusOr<Rep>(Reactor::refusal(max))});
    });
    return;
  }
  // A snapshot: servers added later are not asked, removed ones hand their copy on.
  const auto* list = r.servers(endpoint_);
  std::size_t n = list == nullptr ? 0 : list->targets.size();
  struct State {
    std::shared_ptr<detail::ReactorCore> core;
    Fn fn;
    std::vector<std::optional<absl::StatusOr<Rep>>> results;
    std::size_t left;
    void arrived() {
      if (--left > 0) return;
      core->settled();
      if (!core->due()) return;
      Replies out;
      out.reserve(results.size());
      for (auto& res : results) out.push_back(std::move(*res));
      fn(std::move(out));
    }
  };
  auto st = std::make_shared<State>(State{r.core_, Fn(std::forward<F>(fn)), {}, n});
  st->results.resize(n);
  if (n == 0) {
    r.core_->settled();
    r.later([st] {
      if (st->core->due()) st->fn(Replies{});
    });
    return;
  }
  auto deadline = Clock::now() + timeout_;
  for (std::size_t i = 0; i < n; ++i) {
    Req copy = i + 1 < n ? Req(request_) : std::move(request_);
    r.issue_to(p, endpoint_, list->targets[i], std::move(copy), deadline,
               [st, i](absl::StatusOr<Rep> rep) {
                 st->results[i].emplace(std::move(rep));
                 st->arrived();
               });
  }
}

}  // namespace bus
