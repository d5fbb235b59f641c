#include "bus/detail/core.hpp"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <bit>
#include <cassert>
#include <cstdio>
#include <exception>

#include "bus/detail/endpoint_target.hpp"

namespace bus::detail {

constinit thread_local uint64_t Core::tls_uid_ = 0;
constinit thread_local Producer* Core::tls_producer_ = nullptr;

std::string describe_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(std::move(e));
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "a non-std::exception";
  }
}

void subscriber_threw(Inbox& in, uint32_t channel, std::size_t messages) {
  in.counters.add(channel, kHandlerFailed, messages);
  in.core().log_once(channel, "handler",
                     "subscriber threw: " + describe_exception(std::current_exception()));
}

std::size_t ring_words_for(std::size_t bytes) {
  return std::bit_ceil(std::max<std::size_t>(bytes / 8, 64));
}

void Core::on_stop(absl::AnyInvocable<void()> hook) {
  std::lock_guard lock(mu);
  stop_hooks_.push_back(std::move(hook));
}

bool WaiterBase::wait_until(Clock::time_point deadline) {
  while (true) {
    uint32_t s = state.load(std::memory_order_acquire);  // pairs with the release in fulfil()
    if (s == kDone) return true;
    if (s == kWriting) {  // claimed: the result is being stored
      futex_wait(state, kWriting, std::chrono::milliseconds(1));
      continue;
    }
    auto left = deadline - Clock::now();
    if (left > Clock::duration::zero()) {
      futex_wait(state, kWaiting, left);
      continue;
    }
    uint32_t waiting = kWaiting;
    if (state.compare_exchange_strong(waiting, kAbandoned, std::memory_order_relaxed)) return false;
  }
}

// ---- cancels ------------------------------------------------------------------------------------

absl::Status Core::post_control(Producer& p, Inbox& dest, absl::AnyInvocable<void()> fn) {
  if (!p.executor && &dest == p.own_inbox) {
    dest.defer(std::move(fn));  // its own ring may be full, and only this thread drains it
    return absl::OkStatus();
  }
  // No look at the gate: a closure sent after stop() has seen every ring quiet is either run by
  // an executor still in its loop or left there, which the caller learns from loop_ended().
  return send<ControlClosure>(p, dest, &ClosureTarget<ControlClosure>::kTarget, Overflow::kBlock,
                              UINT32_MAX, ControlClosure{std::move(fn)});
}

bool Core::cancel_on(Inbox& owner, absl::AnyInvocable<void()> now,
                     absl::AnyInvocable<void()> later) {
  Producer& p = producer();
  if (&owner == p.own_inbox) {
    if (p.executor && owner.loop_ended()) return false;
    now();
    if (later) (void)post_control(p, owner, std::move(later));
    return true;
  }
  const bool external = owner.kind() == Inbox::Kind::kExternal;
  if (external ? state() == State::kStopped : owner.loop_ended()) return false;
  auto h = std::make_shared<Handoff>(std::move(now), p.executor ? p.own_inbox : nullptr);
  absl::Status sent = post_control(p, owner, [h, later = std::move(later)]() mutable {
    h->run_now();
    if (later) later();
    h->finish();
  });
  if (!sent.ok()) return false;
  p.flush();  // an executor's or a Batch's sends are published at a flush: this one must go now
  if (external) return true;
  return await(p, owner, h);
}

bool Core::await(Producer& p, Inbox& owner, const std::shared_ptr<Handoff>& h) {
  // pairs with the release store in Handoff::finish()
  auto done = [&] { return h->done.load(std::memory_order_acquire) != 0; };
  if (!p.executor) {
    while (!done() && !owner.loop_ended()) {
      // Woken by finish(); the timeout looks at loop_ended(), which wakes nobody.
      futex_wait(h->done, 0, std::chrono::milliseconds(1));
    }
    return done();
  }
  Inbox& self = *p.own_inbox;
  self.waiting_for.store(&owner, std::memory_order_seq_cst);
  owner.add_handoff(h);
  while (!done() && !owner.loop_ended()) {
    uint32_t seen = self.wait_word().load(std::memory_order_seq_cst);
    // What this executor owes others while it waits: records held for full rings (what the
    // owner waits for may be among them) and the cancels of those waiting for it in a cycle.
    if (!p.backlog.empty()) p.drain_backlog();
    if (self.run_handoffs_in_cycles() > 0 || done()) continue;
    futex_wait(self.wait_word(), seen,
               p.backlog.empty() ? std::chrono::milliseconds(1) : std::chrono::microseconds(50));
  }
  self.waiting_for.store(nullptr, std::memory_order_seq_cst);
  owner.remove_handoff(h.get());
  return done();
}

// ---- lifecycle ----------------------------------------------------------------------------------

Core::Core(const Options& options, uint64_t uid) : options_(options), uid_(uid) {
  unsigned n = options_.executors();
  if (n == 0) n = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned i = 0; i < n; ++i) {
    inboxes.push_back(std::make_unique<Inbox>(*this, i, Inbox::Kind::kExecutor));
    executors_.push_back(inboxes.back().get());
  }
}

Core::~Core() {
  (void)stop();
  // Inboxes first: records still in their rings (an external loop that stopped draining) name
  // targets owned by the channel states below, which must outlive them.
  executors_.clear();
  inboxes.clear();
  for (auto& c : channel_chunks_) delete c.load(std::memory_order_relaxed);
}

void Core::start(const std::shared_ptr<Core>& self) {
  self_ = self;
  for (unsigned i = 0; i < executors_.size(); ++i) {
    threads_.emplace_back([this, i] { run_executor(*executors_[i], i); });
  }
}

Inbox& Core::create_external_inbox() {
  std::lock_guard lock(mu);
  auto index = static_cast<uint32_t>(inboxes.size());
  inboxes.push_back(std::make_unique<Inbox>(*this, index, Inbox::Kind::kExternal));
  return *inboxes.back();
}

bool Core::quiescent() {
  // Mattern's four-counter wave: heads (what was consumed) in the first wave, tails (what was
  // sent) in the second. Equal per ring means nothing was in flight and nothing new was sent
  // in between; a handler still running holds its ring's head back, so it is seen too.
  struct Wave {
    std::vector<Ring*> rings;
    std::vector<uint64_t> values;
    std::vector<uint64_t> started, done;
    uint64_t held = 0;
  };
  auto wave = [this](bool heads) {
    Wave w;
    std::lock_guard lock(mu);
    for (auto& r : rings) {
      if (r->consumer()->kind() != Inbox::Kind::kExecutor) continue;
      w.rings.push_back(r.get());
      w.values.push_back(heads ? r->head() : r->tail());
    }
    for (Inbox* e : executors_) {
      w.started.push_back(e->ticks_started.load(std::memory_order_seq_cst));
      w.done.push_back(e->ticks_done.load(std::memory_order_seq_cst));
    }
    for (Producer* p : producers) w.held += p->backlog_size.load(std::memory_order_seq_cst);
    return w;
  };
  Wave a = wave(true);
  Wave b = wave(false);
  if (a.rings != b.rings || a.held != 0 || b.held != 0) return false;
  for (std::size_t i = 0; i < a.values.size(); ++i) {
    if (a.values[i] != b.values[i]) return false;
  }
  for (std::size_t i = 0; i < a.done.size(); ++i) {
    if (a.done[i] != b.started[i]) return false;
  }
  last_started_ = b.started;
  return true;
}

absl::Status Core::stop() {
  std::lock_guard guard(stop_mu_);
  if (stopped_) return absl::OkStatus();
  if (tls_uid_ == uid_ && tls_producer_ && tls_producer_->executor) {
    return absl::FailedPreconditionError(
        "bus: stop() called from one of its executors; it would wait for itself. Call it from "
        "another thread.");
  }
  Producer* me = tls_uid_ == uid_ ? tls_producer_ : nullptr;
  if (me) me->flush();

  state_.store(State::kDraining);
  heavy_barrier();  // pairs with light_barrier() in enter(): a publish sees us or we see it
  for (Inbox* e : executors_) e->wake();

  // Publishes that passed the state check finish; later ones are refused.
  while (true) {
    bool busy = false;
    {
      std::lock_guard lock(mu);
      for (Producer* p : producers) {
        if (p == me || p->executor) continue;
        // pairs with the release store in leave()
        if (p->active.load(std::memory_order_acquire) != 0) busy = true;
      }
    }
    if (!busy) break;
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  // Drain: executors keep running (and sending to each other) until nothing is in flight.
  while (true) {
    if (quiescent()) {
      state_.store(State::kStopped);
      bool timer_slipped = false;
      for (std::size_t i = 0; i < executors_.size(); ++i) {
        if (executors_[i]->ticks_started.load(std::memory_order_seq_cst) != last_started_[i]) {
          timer_slipped = true;
        }
      }
      if (!timer_slipped) break;
      state_.store(State::kDraining);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Nothing is in flight: a plain thread still blocked in call() has no reply to wait for.
  {
    std::lock_guard lock(mu);
    for (Producer* p : producers) {
      std::lock_guard call(p->call_mu);
      if (p->calling)
        p->calling->cancel(absl::CancelledError("bus: stopped before the reply arrived"));
    }
    for (auto& hook : stop_hooks_) hook();
  }
  exit_.store(true, std::memory_order_release);  // now executors leave their loops
  for (Inbox* e : executors_) e->wake();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
  stopped_ = true;
  return absl::OkStatus();
}

ChannelState& Core::install_state(uint32_t id,
                                  const std::function<std::unique_ptr<ChannelState>()>& make) {
  std::lock_guard lock(mu);
  auto& chunk = channel_chunks_[id / kStatesPerChunk];
  StateChunk* c = chunk.load(std::memory_order_relaxed);
  if (!c) {
    c = new StateChunk{};
    chunk.store(c, std::memory_order_release);  // pairs with channel_state()
  }
  auto& slot = (*c)[id % kStatesPerChunk];
  if (ChannelState* s = slot.load(std::memory_order_relaxed)) return *s;
  states_.push_back(make());
  slot.store(states_.back().get(), std::memory_order_release);  // pairs with channel_state()
  return *states_.back();
}

void Core::log_once(uint32_t channel, std::string_view kind, const std::string& what) {
  std::string key = absl::StrCat(channel, "/", std::string(kind));
  {
    std::lock_guard lock(mu);
    if (std::find(logged_.begin(), logged_.end(), key) != logged_.end()) return;
    logged_.push_back(key);
  }
  std::string where = channel < channel_count()
                          ? absl::StrCat(" on channel '", channel_info(channel).name, "'")
                          : "";
  std::fprintf(stderr, "bus: %s%s (logged once%s)\n", what.c_str(), where.c_str(),
               where.empty() ? "" : "; stats() counts every occurrence");
}

}  // namespace bus::detail
