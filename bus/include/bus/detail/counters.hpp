// Per-channel counters with one writer each, readable from any thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

namespace bus::detail {

/// `Fields` counters per channel id, written by one thread only (a producer or an inbox) with
/// plain relaxed load+store, so the hot path has no locked instruction and no shared cache line.
/// Readers sum the tables of every thread. Chunks are allocated on first use and never move.
template <std::size_t Fields>
class CounterTable {
 public:
  static constexpr std::size_t kPerChunk = 64;
  static constexpr std::size_t kChunks = 1024;  // 65,536 channels

  CounterTable() = default;
  CounterTable(const CounterTable&) = delete;
  CounterTable& operator=(const CounterTable&) = delete;
  ~CounterTable() {
    for (auto& c : chunks_) delete c.load(std::memory_order_relaxed);
  }

  /// Writer thread only.
  void add(uint32_t channel, std::size_t field, uint64_t n = 1) { bump(slot(channel, field), n); }

  /// Writer thread only: the counter itself, to keep and add() to through bump().
  std::atomic<uint64_t>& cell(uint32_t channel, std::size_t field) { return slot(channel, field); }
  /// A relaxed load and store, not a locked add: only the writer thread changes the counter.
  /// On x86-64 one `add` to memory (a relaxed load and store of its own: readers see the old or
  /// the new value, never a torn one), which the compiler does not make of the two atomic
  /// operations (3 instructions); ThreadSanitizer builds keep them, so it sees the store.
  [[gnu::always_inline]] static void bump(std::atomic<uint64_t>& a, uint64_t n = 1) {
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__)
    static_assert(sizeof(a) == 8 && alignof(std::atomic<uint64_t>) == 8);
    asm volatile("addq %1, %0" : "+m"(a) : "er"(n));
#else
    a.store(a.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
#endif
  }

  /// Any thread.
  uint64_t get(uint32_t channel, std::size_t field) const {
    // pairs with the release store in slot()
    const Chunk* c = chunks_[channel / kPerChunk].load(std::memory_order_acquire);
    return c ? c->v[channel % kPerChunk][field].load(std::memory_order_relaxed) : 0;
  }

  /// Any thread: f(channel, field, value) for every non-zero counter.
  template <class F>
  void for_each(F&& f) const {
    for (std::size_t ci = 0; ci < kChunks; ++ci) {
      const Chunk* c = chunks_[ci].load(std::memory_order_acquire);
      if (!c) continue;
      for (std::size_t i = 0; i < kPerChunk; ++i) {
        for (std::size_t fld = 0; fld < Fields; ++fld) {
          uint64_t v = c->v[i][fld].load(std::memory_order_relaxed);
          if (v) f(static_cast<uint32_t>(ci * kPerChunk + i), fld, v);
        }
      }
    }
  }

 private:
  struct Chunk {
    std::atomic<uint64_t> v[kPerChunk][Fields] = {};
  };
  std::atomic<uint64_t>& slot(uint32_t channel, std::size_t field) {
    auto& cp = chunks_[channel / kPerChunk];
    Chunk* c = cp.load(std::memory_order_relaxed);  // only this thread stores it
    if (__builtin_expect(c == nullptr, 0)) {
      c = new Chunk;
      cp.store(c, std::memory_order_release);  // pairs with the acquire loads of readers
    }
    return c->v[channel % kPerChunk][field];
  }
  std::array<std::atomic<Chunk*>, kChunks> chunks_{};
};

}  // namespace bus::detail
