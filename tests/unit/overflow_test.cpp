// Every ring is bounded; a full one applies the channel's policy and never loses silently.
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <atomic>
#include <bus/bus.hpp>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

inline const bus::Topic<long> blocking{"overflow_test.block"};
inline const bus::Topic<long> failing{"overflow_test.fail", bus::Overflow::kFail};
inline const bus::Topic<long> dropping{"overflow_test.drop", bus::Overflow::kDropNewest};
inline const bus::Topic<long> ping{"overflow_test.ping"};
inline const bus::Topic<long> pong{"overflow_test.pong"};

using bus_test::Gate;

// The smallest ring (512 bytes) holds a few dozen 8-byte messages: a stalled subscriber fills it.
bus::Options small() { return bus::Options().executors(2).ring_bytes(512); }

TEST(Overflow, BlockPolicyMakesTheProducerWaitAndLosesNothing) {
  bus::Bus bus(small());
  Gate gate;
  std::atomic<long> got{0};
  auto slow = bus.subscribe(
      blocking,
      [&](const long& v) {
        gate.wait();
        got += v;
      },
      bus::on_executor(0));
  std::atomic<int> published{0};
  std::thread producer([&] {
    for (long i = 1; i <= 1000; ++i) {
      ASSERT_TRUE(bus.publish(blocking, i).ok());
      published++;
    }
  });
  // The producer stalls on the full ring: it cannot get far ahead of the stalled subscriber.
  while (bus.stats().inboxes[0].depth_bytes + 64 < 512) std::this_thread::yield();
  EXPECT_LT(published.load(), 1000);
  gate.open();
  producer.join();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got.load(), 1000L * 1001 / 2);
}

// A process confined to one CPU (taskset): a plain thread waiting for room yields that CPU to
// the consumer instead of pausing on it. Nothing is lost or reordered on the way.
TEST(Overflow, OnOneCpuABlockedPlainPublisherYieldsToTheConsumerAndLosesNothing) {
  cpu_set_t was;
  ASSERT_EQ(pthread_getaffinity_np(pthread_self(), sizeof was, &was), 0);
  int cpu = 0;
  while (!CPU_ISSET(cpu, &was)) ++cpu;
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(cpu, &one);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
  struct Restore {  // however the test ends, the tests after it run on every CPU again
    const cpu_set_t& mask;
    ~Restore() { pthread_setaffinity_np(pthread_self(), sizeof mask, &mask); }
  } restore{was};
  {
    bus::Bus bus(small());  // its executors inherit the one CPU, as the producer below does
    constexpr long kCount = 20000;
    std::atomic<long> got{0}, sum{0}, out_of_order{0};  // read here once the bus has stopped
    auto sub = bus.subscribe(
        blocking,
        [&](const long& v) {
          if (v != got.load() + 1) ++out_of_order;
          ++got;
          sum += v;
        },
        bus::on_executor(0));
    std::thread producer([&] {
      for (long i = 1; i <= kCount; ++i) ASSERT_TRUE(bus.publish(blocking, i).ok());
    });
    producer.join();
    ASSERT_TRUE(bus.stop().ok());
    EXPECT_EQ(got.load(), kCount);
    EXPECT_EQ(sum.load(), kCount * (kCount + 1) / 2);
    EXPECT_EQ(out_of_order.load(), 0);
  }
}

TEST(Overflow, FailPolicyReturnsResourceExhaustedAndCounts) {
  bus::Bus bus(small());
  Gate gate;
  std::atomic<long> got{0};
  auto slow = bus.subscribe(
      failing,
      [&](const long&) {
        gate.wait();
        got++;
      },
      bus::on_executor(0));
  long accepted = 0, refused = 0;
  for (long i = 0; i < 1000; ++i) {
    absl::Status s = bus.publish(failing, i);
    if (s.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_GT(refused, 0);
  EXPECT_EQ(got.load(), accepted) << "everything accepted was delivered";
  EXPECT_EQ(bus.stats().channel("overflow_test.fail")->failed, static_cast<uint64_t>(refused));
}

TEST(Overflow, DropPolicyCountsWhatItDropsAndOthersKeepReceiving) {
  bus::Bus bus(small());
  Gate gate;
  std::atomic<long> slow_got{0}, fast_got{0};
  auto slow = bus.subscribe(
      dropping,
      [&](const long&) {
        gate.wait();
        slow_got++;
      },
      bus::on_executor(0));
  auto fast = bus.subscribe(
      dropping, [&](const long&) { fast_got++; }, bus::on_executor(1));
  for (long i = 0; i < 1000; ++i) ASSERT_TRUE(bus.publish(dropping, i).ok());
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  const bus::Stats stats = bus.stats();
  const bus::ChannelStats* st = stats.channel("overflow_test.drop");
  ASSERT_NE(st, nullptr);
  EXPECT_GT(st->dropped, 0u);
  EXPECT_EQ(fast_got.load() + slow_got.load() + static_cast<long>(st->dropped), 2000);
}

TEST(Overflow, SlowSubscriberDoesNotStopOthersUnderFailPolicy) {
  bus::Bus bus(small());
  Gate gate;
  std::atomic<long> fast_got{0};
  auto slow = bus.subscribe(
      failing, [&](const long&) { gate.wait(); }, bus::on_executor(0));
  auto fast = bus.subscribe(
      failing, [&](const long&) { fast_got++; }, bus::on_executor(1));
  // In lockstep with the fast subscriber, so only the stalled one's ring can fill.
  long refused = 0;
  for (long i = 0; i < 200; ++i) {
    if (!bus.publish(failing, i).ok()) ++refused;
    while (fast_got.load() <= i) std::this_thread::yield();
  }
  EXPECT_GT(refused, 100) << "the stalled subscriber's ring (32 records) filled";
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(fast_got.load(), 200);
}

TEST(Overflow, ExecutorsFloodingEachOtherDoNotDeadlock) {
  // Each side answers every message with one to the other, and each handler also starts with a
  // burst far larger than the rings: both rings fill at once. Executors never block on a full
  // ring (they hold records back, bounded), so both keep draining and every message arrives.
  bus::Bus bus(bus::Options().executors(2).ring_bytes(512));
  constexpr long kBurst = 5000, kHops = 20;
  std::atomic<long> pings{0}, pongs{0};
  std::atomic<long> refused{0};
  auto on_ping = bus.subscribe(
      ping,
      [&](const long& hop) {
        pings++;
        if (hop == 0) {
          for (long i = 0; i < kBurst; ++i) {
            if (!bus.publish(pong, kHops).ok()) refused++;
          }
        }
        if (hop > 1 && !bus.publish(pong, hop - 1).ok()) refused++;
      },
      bus::on_executor(0));
  auto on_pong = bus.subscribe(
      pong,
      [&](const long& hop) {
        pongs++;
        if (hop > 1 && !bus.publish(ping, hop - 1).ok()) refused++;
      },
      bus::on_executor(1));
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         for (long i = 0; i < kBurst; ++i) {
                           if (!bus.publish(ping, kHops).ok()) refused++;
                         }
                       })
                  .ok());
  ASSERT_TRUE(bus.publish(ping, 0L).ok());
  ASSERT_TRUE(bus.stop().ok());  // returns only once nothing is in flight
  EXPECT_EQ(refused.load(), 0);
  // kBurst chains of kHops messages started on each side, plus the starter.
  EXPECT_EQ(pings.load() + pongs.load(), 2 * kBurst * kHops + 1);
}

}  // namespace
