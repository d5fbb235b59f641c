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

// ---- the thread's producers --------------------------------------------------------------------

/// The producers of one thread, one per bus it has used. Retired when the thread exits.
struct ThreadProducers {
  std::vector<std::unique_ptr<Producer>> list;
  ~ThreadProducers() {
    Core::tls_uid_ = 0;
    Core::tls_producer_ = nullptr;
    for (auto& p : list) {
      if (auto core = p->weak.lock()) {
        std::lock_guard lock(core->mu);
        core->retire_producer(*p);
      }
    }
  }
};

namespace {
thread_local ThreadProducers t_producers;
}

Producer& Core::producer_slow() {
  auto& list = t_producers.list;
  // Forget producers of buses that are gone.
  std::erase_if(list, [](const std::unique_ptr<Producer>& p) { return p->weak.expired(); });
  for (auto& p : list) {
    if (&p->core == this && p->uid == uid_) {
      tls_uid_ = uid_;
      tls_producer_ = p.get();
      return *p;
    }
  }
  auto p = std::make_unique<Producer>(*this, self_, nullptr, false);
  p->uid = uid_;
  {
    std::lock_guard lock(mu);
    producers.push_back(p.get());
  }
  list.push_back(std::move(p));
  tls_uid_ = uid_;
  tls_producer_ = list.back().get();
  return *tls_producer_;
}

void Core::bind_thread(Inbox& inbox) { producer().own_inbox = &inbox; }

Ring& Producer::new_ring_to(Inbox& dest) { return core.new_ring(*this, dest); }

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

Ring& Core::new_ring(Producer& p, Inbox& dest) {
  auto ring = std::make_shared<Ring>(ring_words_for(options_.ring_bytes()), &dest,
                                     p.executor ? p.own_inbox : nullptr);
  {
    std::lock_guard lock(mu);
    rings.push_back(ring);
  }
  if (p.rings.size() <= dest.index()) p.rings.resize(dest.index() + 1);
  p.rings[dest.index()] = ring;
  dest.add_ring(ring);
  return *ring;
}

void Producer::flush() {
  if (unpublished.empty()) return;
  bool any = false;
  for (Ring* r : unpublished) any |= r->publish();
  if (any) light_barrier();  // pairs with heavy_barrier() in Inbox::park()
  for (Ring* r : unpublished) {
    r->queued_for_flush = false;
    r->consumer()->notify();
  }
  unpublished.clear();
}

std::size_t Producer::drain_backlog() {
  std::size_t moved = 0;
  // A ring found full stays full for this pass; later records for it wait, in order. The pass
  // ends as soon as every ring with held records is full, so it never walks the whole backlog
  // just to find nothing movable.
  std::vector<Ring*> full;
  for (auto it = backlog.begin(); it != backlog.end() && full.size() < backlog_rings;) {
    Ring* r = it->ring;
    if (std::find(full.begin(), full.end(), r) != full.end()) {
      ++it;
      continue;
    }
    auto* t = reinterpret_cast<Target*>(it->record[0]);
    uint32_t words = t->ops->words;
    uint64_t* w = r->try_reserve(words);
    if (w == nullptr) {
      full.push_back(r);
      ++it;
      continue;
    }
    t->ops->relocate(it->record.get() + 1, w + 1);
    r->commit(it->record[0], words);
    if (--r->held == 0) --backlog_rings;
    if (!r->queued_for_flush) {
      r->queued_for_flush = true;
      unpublished.push_back(r);
    }
    it = backlog.erase(it);
    ++moved;
  }
  backlog_size.store(backlog.size(), std::memory_order_relaxed);
  flush();
  return moved;
}

// The two scans below look at the first held record of each ring only (the one that must move
// first), and stop once they have seen every ring with held records.
template <class F>
static bool for_each_blocked_ring(Producer& p, F&& f) {
  std::vector<Ring*> seen;
  for (auto& h : p.backlog) {
    if (seen.size() == p.backlog_rings) break;
    if (std::find(seen.begin(), seen.end(), h.ring) != seen.end()) continue;
    seen.push_back(h.ring);
    if (f(*h.ring, reinterpret_cast<Target*>(h.record[0])->ops->words)) return true;
  }
  return false;
}

void Producer::want_room() {
  for_each_blocked_ring(*this, [](Ring& r, uint32_t) {
    r.producer_waiting.store(1, std::memory_order_relaxed);
    return false;
  });
}

bool Producer::backlog_has_room() {
  return for_each_blocked_ring(*this, [](Ring& r, uint32_t words) { return r.has_room(words); });
}

void Core::retire_producer(Producer& p) {
  // Publishing closes the rings' open runs, which adds their messages to p's counters.
  for (auto& r : p.rings) {
    if (r) r->publish();
  }
  p.counters.for_each(
      [this](uint32_t ch, std::size_t f, uint64_t v) { retired_counts.add(ch, f, v); });
  // Only executors hold records, and their threads end once stop() has seen none held: this
  // is empty. (A held record names its target, not its channel: there is nothing to count.)
  assert(p.backlog.empty());
  for (auto& h : p.backlog) {
    auto* t = reinterpret_cast<Target*>(h.record[0]);
    t->ops->destroy(h.record.get() + 1);
  }
  p.backlog.clear();
  p.backlog_rings = 0;
  for (auto& r : p.rings) {
    if (r) r->retired.store(true, std::memory_order_release);  // pairs with Inbox::run_once
  }
  light_barrier();
  for (auto& r : p.rings) {
    if (r) r->consumer()->notify();
  }
  std::erase(producers, &p);
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

namespace {
/// Records drained between two spins from which an executor spins as in a stream (it looks at
/// its rings every kStreamPauses), and as in a fast stream (every kFastStreamPauses).
constexpr std::size_t kStreamRecords = 4;
constexpr std::size_t kFastStreamRecords = 32;
constexpr int kStreamPauses = 64;
constexpr int kFastStreamPauses = 512;
/// In a stream, a pass that took fewer records than this goes back to the spin.
constexpr std::size_t kSmallPass = 8;
}  // namespace

void Core::run_executor(Inbox& in, unsigned index) {
  // With the whole process on one CPU, the producers it waits for need this CPU, so it yields it
  // between looks instead of pausing (see on_one_cpu()). Looked at before pinning, on the mask it
  // inherited; executors pinned on purpose (pin_executors) keep pausing for producers elsewhere.
  const bool yield_cpu = !options_.pin_executors() && on_one_cpu();
  const bool spins = options_.spin() > Clock::duration::zero();
  if (options_.pin_executors()) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(index % std::max(1u, std::thread::hardware_concurrency()), &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  char name[16];
  std::snprintf(name, sizeof name, "bus-exec-%u", index);
  pthread_setname_np(pthread_self(), name);

  auto owned = std::make_unique<Producer>(*this, self_, &in, true);
  owned->uid = uid_;
  Producer& p = *owned;
  {
    std::lock_guard lock(mu);
    producers.push_back(&p);
  }
  t_producers.list.push_back(std::move(owned));
  tls_uid_ = uid_;
  tls_producer_ = &p;

  // Sends from now on need no look at the state (see Producer::Gate) until the loop ends.
  p.gate = Producer::kBatchGate;
  bool user_timers_dropped = false;
  std::size_t since_spin = 0;  // records drained since the last spin
  while (true) {
    State s = state();
    if (exiting()) break;  // (set only once the state is kStopped for good)
    if (s == State::kDraining && !user_timers_dropped) {
      in.drop_user_timers();
      user_timers_dropped = true;
    }
    std::size_t n = 0;
    in.take_hurry();
    if (!p.backlog.empty()) n += p.drain_backlog();
    // While it holds a backlog, an executor stops taking work from plain threads (they block,
    // the back-pressure the policy promises them) and from itself (a handler re-posting itself
    // waits for the backlog to clear). Other executors' rings keep draining: no cycle can stall.
    n += in.run_once(/*plain_rings=*/p.backlog.empty());
    since_spin += n;
    // In a stream, a pass that found only a few records means this executor is on the
    // producer's heels: looking again at once takes the tail's and the records' cache lines from
    // the producer's core every message or two. It waits in the spin instead, as after a pass
    // that found none.
    if (n > 0 && (n >= kSmallPass || since_spin < kStreamRecords || !spins)) continue;

    // Spin before parking. How often it looks at the rings adapts to the traffic (the records
    // taken since the last spin): after a trickle (a reply, a request) it looks after every
    // pause, so the next one is taken at once (64 pauses between looks would cost request/reply
    // a good part of a hop); after a stream, every 64 pauses; after a fast stream (32 or more
    // records since the last look), every 512 pauses, so the producer writes hundreds of records
    // on lines this core does not take from it: what lets a producer publishing message by
    // message run at full speed (docs/benchmarks.md, "The figures behind the code"). The clock,
    // timers, state and backlog are looked at every 64 pauses.
    bool work = false;
    if (spins) {
      const int pauses = since_spin >= kFastStreamRecords ? kFastStreamPauses
                         : since_spin >= kStreamRecords   ? kStreamPauses
                                                          : 1;
      // The spin's end is set at its first look at the clock (64 pauses in), not on entry: a
      // clock read is not free, and an executor answering requests enters the spin once per
      // request.
      auto until = Clock::time_point::max();
      for (uint64_t paused = 0; !work;) {
        if (yield_cpu) {
          std::this_thread::yield();  // a syscall: worth the full look every time
          paused += 64;
        } else {
          // A producer waiting for room (Inbox::hurry) ends the spacing at once: it has
          // published what it built, and waits for this core to take it.
          for (int i = 0; i < pauses; ++i) {
            if (in.hurried()) {
              in.take_hurry();  // (a flag set during the pass only costs one early look)
              break;
            }
            cpu_relax();
          }
          paused += pauses;
        }
        work = in.has_records();
        if (!work && paused % 64 == 0) {
          work = in.ready() || state() != s || exiting() ||
                 (!p.backlog.empty() && p.backlog_has_room());
          auto now = Clock::now();
          if (until == Clock::time_point::max()) {
            until = now + options_.spin();
          } else if (now >= until) {
            break;
          }
        }
      }
    }
    since_spin = 0;
    if (work) continue;
    if (!p.backlog.empty()) p.want_room();
    in.park(
        [&] { return state() != s || exiting() || (!p.backlog.empty() && p.backlog_has_room()); });
  }
  p.gate = Producer::kExecutorGate;  // what the callbacks below send is refused
  in.end_loop();                     // a cancel waiting for this executor stops waiting
  in.cancel_all_pending(absl::CancelledError("bus: stopped before the reply arrived"));
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
