// An executor's loop: drain, spin with a spacing that follows the traffic, park.
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cstdio>
#include <thread>

#include "bus/detail/core.hpp"

namespace bus::detail {

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

  Producer& p = executor_producer(in);

  // Sends from now on need no look at the state (see Producer::Gate) until the loop ends.
  p.gate = Producer::kOpen;
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
  p.gate = Producer::kOutsideLoop;  // what the callbacks below send is refused
  in.end_loop();                    // a cancel waiting for this executor stops waiting
  in.cancel_all_pending(absl::CancelledError("bus: stopped before the reply arrived"));
}

}  // namespace bus::detail
