// Parking, barriers and prefetches shared by the rings and the inboxes.
#pragma once

#include <time.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

namespace bus::detail {

using Clock = std::chrono::steady_clock;

/// Blocks while `*word == expected`, at most `timeout` (negative: no limit). Spurious returns
/// are allowed: every caller re-checks its condition.
void futex_wait(std::atomic<uint32_t>& word, uint32_t expected,
                std::chrono::nanoseconds timeout = std::chrono::nanoseconds(-1));
void futex_wake_all(std::atomic<uint32_t>& word);

/// Asymmetric Dekker barrier. The hot side (a producer after publishing its tail, a consumer
/// after publishing its head) calls light_barrier(); the rare side (an inbox about to park, a
/// producer about to wait for space, stop()) calls heavy_barrier(). With Linux membarrier the
/// light side is only a compiler barrier: the heavy side makes every running thread of the
/// process execute a full fence, which is what the light side would otherwise pay per message.
/// Without membarrier both sides fall back to seq_cst fences.
extern bool g_membarrier;
void heavy_barrier();
[[gnu::always_inline]] inline void light_barrier() {
  if (g_membarrier) {
    std::atomic_signal_fence(std::memory_order_seq_cst);
  } else {
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

/// True when the calling thread may run on one CPU only (its affinity mask, as threads it starts
/// inherit it). Polling for another thread's work is then pure waste: that thread needs this
/// very CPU to do it. Spinning waits park at once instead, as adaptive locks do on one CPU.
bool on_one_cpu();

// ---- clocks -------------------------------------------------------------------------------
//
// A request's server looks at its deadline, and an executor waiting for replies looks at the
// earliest deadline every pass: both on a request's way, and mostly the deadline is far off.
// CLOCK_MONOTONIC_COARSE, the same clock as of its last tick, reads several times faster than
// steady_clock (CLOCK_MONOTONIC) but lags by a tick or two (more after an idle CPU woke), so it
// answers only where a lag of coarse_margin() (8 ticks) could not change the answer; elsewhere
// the precise clock does. (Were it ever to lag more, a deadline would be seen
// that much later: a server would run a handler whose caller gave up moments before.) Deadlines
// themselves are set from the precise clock.

/// 8 ticks of the coarse clock, or Clock::duration::max() when there is none to use.
Clock::duration read_coarse_margin();
inline Clock::duration coarse_margin() {
  static const Clock::duration margin = read_coarse_margin();
  return margin;
}
/// CLOCK_MONOTONIC_COARSE on steady_clock's time line (both count from the same origin).
inline Clock::time_point coarse_now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return Clock::time_point(std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec));
}
/// `Clock::now() >= at`, reading the precise clock only when `at` is within the margin of the
/// coarse clock's time.
inline bool reached(Clock::time_point at) {
  Clock::duration margin = coarse_margin();
  if (margin != Clock::duration::max() && coarse_now() + margin < at) return false;
  return Clock::now() >= at;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

/// Asks for the cache line `kOffset` bytes past `base + index` with intent to write (x86
/// PREFETCHW: every AMD x86-64 CPU and Intel's since Broadwell have it, and 64-bit Windows
/// requires it since 8.1). __builtin_prefetch(p, 1) emits it only when the build targets such a
/// CPU (-mprfchw), and a read prefetch fetches the line shared: a store still waits for it. Base
/// and index are register operands, not a memory input: the compiler sees no read of memory that a
/// store could alias, and the one instruction, `prefetchw kOffset(base, index, 8)`, needs no
/// address of its own.
template <std::ptrdiff_t kOffset>
[[gnu::always_inline]] inline void prefetch_for_write(const uint64_t* base, uint64_t index) {
#if defined(__x86_64__)
  asm("prefetchw %c2(%0,%1,8)" : : "r"(base), "r"(index), "i"(kOffset));
#else
  __builtin_prefetch(reinterpret_cast<const char*>(base + index) + kOffset, 1);
#endif
}
/// prefetch_for_write() of the line `kOffset` bytes past `at` (an open run's cursor).
/// Ring::at_write() keeps the base-and-index form above: forming the address first lengthens
/// the publish path.
template <std::ptrdiff_t kOffset>
[[gnu::always_inline]] inline void prefetch_for_write(const uint64_t* at) {
#if defined(__x86_64__)
  asm("prefetchw %c1(%0)" : : "r"(at), "i"(kOffset));
#else
  __builtin_prefetch(reinterpret_cast<const char*>(at) + kOffset, 1);
#endif
}

}  // namespace bus::detail
