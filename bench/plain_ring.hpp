// The plain reference ring of the queue benchmarks (bench/queues.cpp, bench/instructions.cpp):
// the near-limit figure the bus is held against.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace bench {

inline void cpu_relax() { __builtin_ia32_pause(); }

/// A minimal SPSC ring: indices cached on each side, each on its own cache line; the producer
/// publishes its tail once per `kEvery` items (and at the end), the consumer its head once per
/// `kEvery` items or at the end of what it saw. Capacity > kEvery, so it cannot stall on an
/// unpublished tail.
template <class T, uint64_t kEvery, std::size_t kRingBytes = 64 * 1024>
class PlainRing {
 public:
  static constexpr uint64_t kCap = kRingBytes / sizeof(T);
  static_assert((kCap & (kCap - 1)) == 0 && kCap > kEvery && (kEvery & (kEvery - 1)) == 0);

  void push(const T& v) {
    if (tail_ - head_cache_ == kCap) {
      while ((head_cache_ = head_.load(std::memory_order_acquire)) + kCap == tail_) cpu_relax();
    }
    buf_[tail_ & (kCap - 1)] = v;
    if ((++tail_ & (kEvery - 1)) == 0) shared_tail_.store(tail_, std::memory_order_release);
  }
  void flush() { shared_tail_.store(tail_, std::memory_order_release); }

  /// Calls f(item) on what is available; returns how many.
  template <class F>
  uint64_t pop_some(F&& f) {
    if (head_local_ == tail_cache_) {
      tail_cache_ = shared_tail_.load(std::memory_order_acquire);
      if (head_local_ == tail_cache_) return 0;
    }
    uint64_t start = head_local_;
    while (head_local_ != tail_cache_) {
      uint64_t end = std::min(tail_cache_, (head_local_ | (kEvery - 1)) + 1);
      for (; head_local_ != end; ++head_local_) f(buf_[head_local_ & (kCap - 1)]);
      head_.store(head_local_, std::memory_order_release);
    }
    return head_local_ - start;
  }

 private:
  alignas(64) std::atomic<uint64_t> shared_tail_{0};
  alignas(64) std::atomic<uint64_t> head_{0};
  alignas(64) uint64_t tail_ = 0;  // producer's
  uint64_t head_cache_ = 0;
  alignas(64) uint64_t head_local_ = 0;  // consumer's
  uint64_t tail_cache_ = 0;
  alignas(64) T buf_[kCap];
};

}  // namespace bench
