// Core's template bodies: the slow path of a send (a full ring) and the scope guard of a send.
// Included at the end of core.hpp.
#pragma once

namespace bus::detail {

/// Core::leave() at the end of a scope that entered.
struct Leave {
  Producer& p;
  Producer::Gate g;
  ~Leave() { Core::leave(p, g); }
};

template <class P, class... A>
[[gnu::noinline]] absl::Status Core::send_full(Producer& p, Ring& r, Inbox& dest, Target* target,
                                               Overflow policy, uint32_t channel, A&&... args) {
  constexpr uint32_t kWords = Payload<P>::kWords;
  uint64_t* w = nullptr;
  // A copy to a topic's target stands for each of its subscribers (see Stats). Closures are
  // posted on no channel (UINT32_MAX): their poster counts what it must.
  auto refused = [&](ProducerCounter c) {
    if (channel != UINT32_MAX) p.counters.add(channel, c, target->copies());
  };
  // Full. Records this thread built but did not publish yet count as taken room: publish them
  // so the consumer can free it.
  if (r.publish()) {
    light_barrier();
    dest.notify();
    if (r.held == 0) w = r.try_reserve(kWords);
  }
  if (w == nullptr) {
    switch (policy) {
      case Overflow::kDropNewest: refused(kDropped); return absl::OkStatus();
      case Overflow::kFail:
        refused(kFailed);
        return absl::ResourceExhaustedError(
            absl::StrCat("bus: ring to inbox ", dest.index(), " is full (channel '",
                         channel_info(channel).name, "', overflow policy: fail)"));
      case Overflow::kBlock: break;
    }
    dest.hurry();  // a spinning consumer looks now, not at its next spaced look
    if (p.executor && r.held == 0) {
      // The consumer usually frees room within microseconds: a bounded spin costs less than
      // holding the record back (an allocation). Bounded, so two executors cannot wait forever.
      for (int spin = 0; spin < 2048 && w == nullptr; ++spin) {
        cpu_relax();
        if ((spin & 63) == 63 && r.has_room(kWords)) w = r.try_reserve(kWords);
      }
    }
  }
  if (__builtin_expect(w == nullptr, 0)) {
    if (p.executor) {
      // An executor never blocks: it holds the record back, in order, up to a bound.
      if (!kEssential<P> && p.backlog.size() >= options_.executor_backlog()) {
        refused(kFailed);
        return absl::ResourceExhaustedError(
            absl::StrCat("bus: executor backlog full (", p.backlog.size(),
                         " records held while rings are full; "
                         "raise Options::executor_backlog or slow the producer) on channel '",
                         channel_info(channel).name, "'"));
      }
      auto rec = std::make_unique<uint64_t[]>(kWords);
      rec[0] = reinterpret_cast<uint64_t>(target);
      Payload<P>::construct(rec.get() + 1, std::forward<A>(args)...);
      p.backlog.push_back(Producer::Held{&r, std::move(rec)});
      if (r.held++ == 0) ++p.backlog_rings;
      p.backlog_size.store(p.backlog.size(), std::memory_order_relaxed);
      return absl::OkStatus();
    }
    // A plain thread waits for room: spin briefly, then park until the consumer releases. On
    // one CPU the consumer cannot free room while this thread spins: it yields instead. A
    // request waits no longer than its deadline: that bounds everything it waits for.
    if (p.one_cpu) {
      for (int look = 0; look < 16 && !r.has_room(kWords); ++look) std::this_thread::yield();
    } else {
      for (int spin = 0; spin < 4096 && !r.has_room(kWords); ++spin) cpu_relax();
    }
    const Clock::time_point deadline = deadline_of(args...);
    while (!r.has_room(kWords)) {
      auto left = deadline - Clock::now();
      if (left <= Clock::duration::zero() || dest.loop_ended()) {
        r.producer_waiting.store(0, std::memory_order_relaxed);
        refused(kFailed);
        if (dest.loop_ended()) return stopped_status();
        return absl::DeadlineExceededError(absl::StrCat(
            "bus: no room in the ring to inbox ", dest.index(), " before the request's deadline",
            channel == UINT32_MAX ? ""
                                  : absl::StrCat(" (channel '", channel_info(channel).name, "')")));
      }
      r.producer_waiting.store(1, std::memory_order_relaxed);
      heavy_barrier();  // pairs with the consumer's light_barrier() after release()
      if (r.has_room(kWords)) break;
      futex_wait(r.producer_waiting, 1,
                 std::min<Clock::duration>(left, std::chrono::milliseconds(100)));
    }
    r.producer_waiting.store(0, std::memory_order_relaxed);
    w = r.try_reserve(kWords);
  }
  Payload<P>::construct(w + 1, std::forward<A>(args)...);
  r.commit(reinterpret_cast<uint64_t>(target), kWords);
  committed(p, p.gate, r, dest);
  return absl::OkStatus();
}

}  // namespace bus::detail
