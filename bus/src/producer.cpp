// The producers of each thread (one per bus it has used) and their rings, flush and backlog.
#include <algorithm>
#include <cassert>
#include <memory>
#include <vector>

#include "bus/detail/core.hpp"

namespace bus::detail {

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

Producer& Core::executor_producer(Inbox& in) {
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
  return p;
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

}  // namespace bus::detail
