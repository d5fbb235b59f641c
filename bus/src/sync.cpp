#include "bus/detail/sync.hpp"

#include <linux/futex.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <ctime>

namespace bus::detail {
namespace {

bool register_membarrier() {
  if (const char* off = std::getenv("BUS_NO_MEMBARRIER"); off != nullptr && *off == '1') {
    return false;
  }
  long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (cmds < 0 || (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

}  // namespace

bool g_membarrier = register_membarrier();

Clock::duration read_coarse_margin() {
  timespec res;
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &res) != 0) return Clock::duration::max();
  auto tick = std::chrono::seconds(res.tv_sec) + std::chrono::nanoseconds(res.tv_nsec);
  // Over 100 ms of margin the coarse clock would answer too seldom to be worth a read.
  if (tick <= Clock::duration::zero() || 8 * tick > std::chrono::milliseconds(100)) {
    return Clock::duration::max();
  }
  return std::chrono::duration_cast<Clock::duration>(8 * tick);
}

bool on_one_cpu() {
  cpu_set_t set;
  CPU_ZERO(&set);
  return sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) == 1;
}

void heavy_barrier() {
  if (g_membarrier && syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0) {
    return;
  }
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void futex_wait(std::atomic<uint32_t>& word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{};
  timespec* tsp = nullptr;
  if (timeout.count() >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout.count() / 1'000'000'000);
    ts.tv_nsec = static_cast<long>(timeout.count() % 1'000'000'000);
    tsp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, tsp, nullptr,
          0);
}

void futex_wake_all(std::atomic<uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr,
          nullptr, 0);
}

}  // namespace bus::detail
