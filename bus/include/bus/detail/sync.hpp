// Parking and barriers shared by the rings and the inboxes.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace bus::detail {

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

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace bus::detail
