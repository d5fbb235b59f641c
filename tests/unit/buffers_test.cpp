// The recycled message buffers: buffers made on one thread and freed on another, of every size
// class and beyond, keep their bytes while live and are never handed out twice at once.
#include <gtest/gtest.h>

#include <bus/detail/buffers.hpp>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace {

using bus::detail::alloc_recycled;
using bus::detail::free_recycled;

/// A size for the i-th buffer: every class from 1 byte to past kRecycledMax.
std::size_t size_of(uint64_t i) {
  static const std::size_t sizes[] = {1,    63,   64,    65,    200,   1000, 4096,
                                      8191, 8192, 20000, 65536, 65537, 70000};
  return sizes[i % std::size(sizes)];
}

void fill(void* p, std::size_t n, uint64_t tag) {
  auto* b = static_cast<unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) b[i] = static_cast<unsigned char>(tag * 31 + i);
}

bool holds(const void* p, std::size_t n, uint64_t tag) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (std::size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<unsigned char>(tag * 31 + i)) return false;
  }
  return true;
}

}  // namespace

TEST(Buffers, LiveBuffersAreDistinctAlignedAndKeepTheirBytes) {
  std::vector<std::pair<void*, std::size_t>> live;
  for (int round = 0; round < 3; ++round) {
    for (uint64_t i = 0; i < 2000; ++i) {
      std::size_t n = size_of(i);
      void* p = alloc_recycled(n);
      ASSERT_NE(p, nullptr);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % alignof(std::max_align_t), 0u);
      fill(p, n, i);
      live.emplace_back(p, n);
    }
    std::set<void*> distinct;
    for (auto [p, n] : live) distinct.insert(p);
    EXPECT_EQ(distinct.size(), live.size());
    for (uint64_t i = 0; i < live.size(); ++i) {
      ASSERT_TRUE(holds(live[i].first, live[i].second, i)) << "buffer " << i;
    }
    // Free every other one, then the rest: the next round reuses them.
    for (std::size_t i = 0; i < live.size(); i += 2) free_recycled(live[i].first, live[i].second);
    for (std::size_t i = 1; i < live.size(); i += 2) free_recycled(live[i].first, live[i].second);
    live.clear();
  }
}

TEST(Buffers, BuffersMadeOnOneThreadAndFreedOnAnotherCycleIntact) {
  // The publisher / consumer shape: one thread allocates and fills, another checks and frees,
  // through a bounded queue, many magazines' worth.
  constexpr uint64_t kN = 200000;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<void*, uint64_t>> queue;
  uint64_t bad = 0;
  std::thread consumer([&] {
    for (uint64_t got = 0; got < kN; ++got) {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return !queue.empty(); });
      auto [p, i] = queue.front();
      queue.pop_front();
      lock.unlock();
      cv.notify_all();
      if (!holds(p, size_of(i), i)) ++bad;
      free_recycled(p, size_of(i));
    }
  });
  for (uint64_t i = 0; i < kN; ++i) {
    void* p = alloc_recycled(size_of(i));
    fill(p, size_of(i), i);
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return queue.size() < 1000; });
    queue.emplace_back(p, i);
    lock.unlock();
    cv.notify_all();
  }
  consumer.join();
  EXPECT_EQ(bad, 0u);
}

TEST(Buffers, AThreadThatExitsHandsItsBuffersBackAndOthersFreeItsBuffers) {
  std::vector<std::pair<void*, std::size_t>> made;
  std::thread maker([&] {
    // Some stay in this thread's cache when it exits; others outlive it.
    for (uint64_t i = 0; i < 500; ++i) {
      void* p = alloc_recycled(size_of(i));
      fill(p, size_of(i), i);
      if (i % 2 == 0) {
        free_recycled(p, size_of(i));
      } else {
        made.emplace_back(p, size_of(i));
      }
    }
  });
  maker.join();
  for (uint64_t k = 0; k < made.size(); ++k) {
    EXPECT_TRUE(holds(made[k].first, made[k].second, 2 * k + 1));
    free_recycled(made[k].first, made[k].second);
  }
  // And recycling still works here.
  void* p = alloc_recycled(100);
  fill(p, 100, 7);
  EXPECT_TRUE(holds(p, 100, 7));
  free_recycled(p, 100);
}
