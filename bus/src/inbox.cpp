#include "bus/detail/inbox.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "bus/detail/core.hpp"
#include "bus/detail/endpoint_target.hpp"

namespace bus::detail {

Inbox::Inbox(Core& core, uint32_t index, Kind kind)
    : core_(core), index_(index), kind_(kind), pending_(core.options().max_pending_requests()) {
  if (kind_ == Kind::kExternal) {
    sleeping_.store(1, std::memory_order_relaxed);  // the loop is in its poll until drain()
    eventfd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (eventfd_ < 0) {
      throw std::runtime_error(std::string("bus: eventfd() failed: ") + std::strerror(errno) +
                               " (raise the open-file limit?)");
    }
  }
}

Inbox::~Inbox() {
  adopt_rings();
  // Records nobody will run (an external loop that stopped draining): destroy their payloads.
  for (auto& r : rings_) {
    r->consume_runs(SIZE_MAX, [](Target* t, uint64_t* payload, uint32_t stride, std::size_t n) {
      for (std::size_t i = 0; i < n; ++i) t->ops->destroy(payload + i * stride);
    });
    r->release();
  }
  if (eventfd_ >= 0) ::close(eventfd_);
}

void Inbox::add_ring(std::shared_ptr<Ring> ring) {
  auto* node = new Node{std::move(ring), incoming_.load(std::memory_order_relaxed)};
  // pairs with the acquire exchange in adopt_rings()
  while (!incoming_.compare_exchange_weak(node->next, node, std::memory_order_release,
                                          std::memory_order_relaxed)) {
  }
}

void Inbox::adopt_rings() {
  if (incoming_.load(std::memory_order_relaxed) == nullptr) return;
  Node* n = incoming_.exchange(nullptr, std::memory_order_acquire);  // pairs with add_ring
  std::size_t first = rings_.size();
  while (n) {
    rings_.push_back(std::move(n->ring));
    Node* next = n->next;
    delete n;
    n = next;
  }
  std::reverse(rings_.begin() + static_cast<std::ptrdiff_t>(first), rings_.end());
}

void Inbox::wake() {
  if (kind_ == Kind::kExternal) {
    uint64_t one = 1;
    ssize_t rc = ::write(eventfd_, &one, sizeof one);
    (void)rc;  // EAGAIN: the counter is saturated, so the loop is awake anyway
    return;
  }
  sleeping_.store(0, std::memory_order_relaxed);
  futex_wake_all(sleeping_);
}

void Handoff::finish() {
  done.store(1, std::memory_order_release);  // pairs with the acquire loads in Core::await()
  if (from != nullptr) {
    from->wake_waiter();
  } else {
    futex_wake_all(done);
  }
}

void Inbox::add_handoff(std::shared_ptr<Handoff> h) {
  {
    std::lock_guard lock(handoffs_mu_);
    handoffs_.push_back(std::move(h));
  }
  wake_waiter();  // if the owner waits, it looks for a cycle through the canceller
}

void Inbox::remove_handoff(const Handoff* h) {
  std::lock_guard lock(handoffs_mu_);
  std::erase_if(handoffs_, [h](const std::shared_ptr<Handoff>& x) { return x.get() == h; });
}

void Inbox::wake_waiter() {
  wait_word_.fetch_add(1, std::memory_order_seq_cst);
  futex_wake_all(wait_word_);
}

bool Inbox::waits_for(const Inbox* target) const {
  // A chain is as long as the executors at most; the bound only guards a chain that changes
  // under the walk (a stale link is looked at again on the next wake-up).
  const Inbox* x = waiting_for.load(std::memory_order_seq_cst);
  for (int hops = 0; x != nullptr && hops < 4096; ++hops) {
    if (x == target) return true;
    x = x->waiting_for.load(std::memory_order_seq_cst);
  }
  return false;
}

std::size_t Inbox::run_handoffs_in_cycles() {
  std::vector<std::shared_ptr<Handoff>> ready;
  {
    std::lock_guard lock(handoffs_mu_);
    for (const auto& h : handoffs_) {
      if (h->done.load(std::memory_order_acquire) == 0 && h->from != nullptr &&
          waits_for(h->from)) {
        ready.push_back(h);
      }
    }
  }
  for (const auto& h : ready) {
    h->run_now();
    h->finish();
  }
  return ready.size();
}

void Inbox::invoke(Target* t, uint64_t* payload) {
  try {
    t->invoke(t, payload, *this);
  } catch (...) {
    // Targets count their own handler failures; this is a posted closure or a reply callback.
    core_.log_once(UINT32_MAX, "callback",
                   "a posted closure or reply callback threw: " +
                       describe_exception(std::current_exception()));
  }
}

std::size_t Inbox::drain_ring(Ring& r) {
  return r.consume_runs(kBatch,
                        [this](Target* t, uint64_t* payload, uint32_t stride, std::size_t count) {
                          if (count > 1 && t->invoke_run != nullptr) {
                            // Run targets catch what their handlers throw, per payload.
                            t->invoke_run(t, payload, stride, count, *this);
                            return;
                          }
                          for (std::size_t i = 0; i < count; ++i) invoke(t, payload + i * stride);
                        });
}

std::size_t Inbox::run_once(bool plain_rings) {
  std::size_t n = run_deferred();
  adopt_rings();
  Producer& p = core_.producer();
  // Records held back for our own ring can only move once we consume it: keep consuming it then.
  bool self_blocked = index_ < p.rings.size() && p.rings[index_] && p.rings[index_]->held > 0;
  for (std::size_t i = 0; i < rings_.size();) {
    Ring& r = *rings_[i];
    if (!plain_rings &&
        (r.producer_inbox() == nullptr || (r.producer_inbox() == this && !self_blocked))) {
      ++i;
      continue;
    }
    std::size_t k = drain_ring(r);
    // What the handlers sent becomes visible before the head moves: stop() relies on it.
    if (k > 0) p.flush();
    // The head moves past the records taken and past markers skipped (a marker published alone
    // counts in the tail, and stop() waits for heads to meet tails).
    if (r.release()) {
      light_barrier();  // pairs with heavy_barrier() of a producer waiting for room
      if (r.producer_waiting.load(std::memory_order_relaxed) != 0) {
        r.producer_waiting.store(0, std::memory_order_relaxed);
        if (Inbox* pi = r.producer_inbox()) {
          pi->wake();
        } else {
          futex_wake_all(r.producer_waiting);
        }
      }
    }
    if (k > 0) {
      n += k;
      ++i;
      continue;
    }
    // pairs with the release store in Core::retire_producer
    if (r.retired.load(std::memory_order_acquire) && r.empty_for_consumer()) {
      std::shared_ptr<Ring> gone = std::move(rings_[i]);
      rings_[i] = std::move(rings_.back());
      rings_.pop_back();
      std::lock_guard lock(core_.mu);
      std::erase(core_.rings, gone);
      continue;
    }
    ++i;
  }
  n += run_due_timers();
  p.flush();
  return n;
}

void Inbox::defer(TimerFn fn) {
  // Counted like a timer tick, so stop() does not see an executor as quiescent before it ran.
  ticks_started.fetch_add(1, std::memory_order_seq_cst);
  deferred_.push_back(std::move(fn));
  // Outside a drain an external loop is waiting on its eventfd: make it come back.
  if (kind_ == Kind::kExternal && sleeping_.load(std::memory_order_relaxed) != 0) wake();
}

std::size_t Inbox::run_deferred() {
  std::size_t n = 0;
  while (!deferred_.empty()) {
    std::vector<TimerFn> fns = std::move(deferred_);
    deferred_.clear();
    for (TimerFn& fn : fns) {
      try {
        fn();
      } catch (...) {
        core_.log_once(UINT32_MAX, "closure",
                       "a posted closure threw: " + describe_exception(std::current_exception()));
      }
      ticks_done.fetch_add(1, std::memory_order_seq_cst);
      ++n;
    }
  }
  return n;
}

bool Inbox::ready() { return has_records() || timer_due(); }

bool Inbox::timer_due() const {
  auto next = next_timer();
  return next && reached(*next);
}

bool Inbox::add_timer(uint64_t id, Clock::time_point at, Clock::duration period, TimerFn fn,
                      bool essential) {
  if (!timers_.admit(id)) return false;  // cancelled already
  State s = core_.state();
  if (s == State::kStopped || (s == State::kDraining && !essential)) return false;
  timers_.insert(id, at, period, std::move(fn), essential);
  return true;
}

std::optional<Clock::time_point> Inbox::next_timer() const {
  std::optional<Clock::time_point> next = timers_.next();
  if (pending_.has_deadline() && (!next || pending_.earliest_deadline() < *next)) {
    next = pending_.earliest_deadline();
  }
  return next;
}

std::size_t Inbox::run_due_timers() {
  // An executor with requests out comes here every pass; mostly nothing is due yet.
  if (!timer_due()) return 0;
  std::size_t n = 0;
  auto now = Clock::now();
  n += expire_due(now);
  while (timers_.due(now)) {
    // stop() flips to kStopped and then re-reads ticks_started: either it sees this increment
    // or we see kStopped (both seq_cst).
    ticks_started.fetch_add(1, std::memory_order_seq_cst);
    if (core_.state() == State::kStopped) {
      ticks_done.fetch_add(1, std::memory_order_seq_cst);
      break;
    }
    Timers::Fired t = timers_.fire_first();
    try {
      t.fn();
    } catch (...) {
      core_.log_once(UINT32_MAX, "timer",
                     "a timer callback threw: " + describe_exception(std::current_exception()));
    }
    if (timers_.done_firing() && t.period > Clock::duration::zero()) {
      auto next = t.at + t.period;
      if (next < now) next = now + t.period;  // fell behind: skip, do not burst
      (void)add_timer(t.id, next, t.period, std::move(t.fn), t.essential);
    }
    ticks_done.fetch_add(1, std::memory_order_seq_cst);
    ++n;
  }
  return n;
}

std::size_t Inbox::expire_due(Clock::time_point now) {
  std::size_t n = 0;
  while (uint64_t corr = pending_.next_expired(now)) {
    // Counted like a timer tick (see run_due_timers()).
    ticks_started.fetch_add(1, std::memory_order_seq_cst);
    if (core_.state() == State::kStopped) {
      ticks_done.fetch_add(1, std::memory_order_seq_cst);
      break;  // cancel_all_pending() answers it
    }
    auto [channel, fn] = pending_.take(corr);
    try {
      fn(absl::DeadlineExceededError(absl::StrCat(
             "bus: no reply from '", channel_info(channel).name, "' before the deadline")),
         nullptr);
    } catch (...) {
      core_.log_once(UINT32_MAX, "timer",
                     "a reply callback threw: " + describe_exception(std::current_exception()));
    }
    ticks_done.fetch_add(1, std::memory_order_seq_cst);
    ++n;
  }
  pending_.forget_answered();  // so next_timer() names a pending request's deadline
  return n;
}

void Inbox::cancel_all_pending(const absl::Status& why) {
  // A callback may make another request (refused once the bus stops, but an external inbox
  // closes while the bus runs): cancel_all() sweeps again until a pass finds none.
  pending_.cancel_all([&](CompleteFn fn) {
    try {
      fn(why, nullptr);
    } catch (...) {
    }
  });
}

}  // namespace bus::detail
