// The shared rate limiter, deterministically: limiters of one name on one bus stand for the
// nodes (they share counts over the same topic as across processes), the clock is the test's,
// and counts are exchanged when the test says so.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/net/limiter.hpp>
#include <chrono>
#include <thread>

using namespace std::chrono_literals;
using bus::net::LimiterOptions;
using bus::net::RateLimiter;

#include "support/test_support.hpp"

namespace {

struct FakeClock {
  std::atomic<int64_t> ms{1'000'000'000'000};  // some time in 2001, on a window boundary
  std::chrono::system_clock::time_point now() const {
    return std::chrono::system_clock::time_point(std::chrono::milliseconds(ms.load()));
  }
};

LimiterOptions manual(FakeClock& clock, uint64_t limit) {
  return LimiterOptions().limit(limit).window(1000ms).exchange(0ms).clock(
      [&clock] { return clock.now(); });
}

uint64_t admit_n(RateLimiter& l, std::string_view key, int n) {
  uint64_t admitted = 0;
  for (int i = 0; i < n; ++i) admitted += l.admit(key).admitted ? 1 : 0;
  return admitted;
}

TEST(RateLimiter, OneNodeAdmitsExactlyTheLimitPerKeyAndWindow) {
  bus::Bus bus(bus::Options().executors(1));
  FakeClock clock;
  RateLimiter a(bus, "one", manual(clock, 10));
  EXPECT_EQ(admit_n(a, "k", 15), 10u);
  EXPECT_EQ(admit_n(a, "other", 3), 3u);  // keys are counted apart
  auto d = a.admit("k");
  EXPECT_FALSE(d.admitted);
  EXPECT_EQ(d.retry_after, 1000ms);  // the window just began
  clock.ms += 400;
  EXPECT_EQ(a.admit("k").retry_after, 600ms);
  clock.ms += 600;  // the next window
  EXPECT_EQ(admit_n(a, "k", 15), 10u);
  auto st = a.stats();
  EXPECT_EQ(st.admitted, 23u);
  EXPECT_EQ(st.refused, 12u);
}

TEST(RateLimiter, NodesShareTheirCountsAndTheLimitHoldsOnceExchanged) {
  bus::Bus bus(bus::Options().executors(2));
  FakeClock clock;
  RateLimiter a(bus, "shared", manual(clock, 100));
  RateLimiter b(bus, "shared", manual(clock, 100));
  RateLimiter other(bus, "unrelated", manual(clock, 100));
  EXPECT_EQ(admit_n(a, "key", 70), 70u);
  a.exchange();
  ASSERT_TRUE(bus_test::eventually([&] { return b.known("key") == 70; }));
  EXPECT_EQ(admit_n(b, "key", 50), 30u);  // 70 + 30 = the limit
  b.exchange();
  ASSERT_TRUE(bus_test::eventually([&] { return a.known("key") == 100; }));
  EXPECT_EQ(admit_n(a, "key", 5), 0u);
  EXPECT_EQ(other.known("key"), 0u);  // another limiter name is another count
  EXPECT_EQ(a.stats().over_admitted, 0u);
}

TEST(RateLimiter, DisagreementOverAdmitsAtMostWhatTheOthersAdmittedUnseen) {
  bus::Bus bus(bus::Options().executors(2));
  FakeClock clock;
  RateLimiter a(bus, "race", manual(clock, 100));
  RateLimiter b(bus, "race", manual(clock, 100));
  RateLimiter c(bus, "race", manual(clock, 100));
  // Rounds: each node admits up to 20 without hearing the others, then all exchange.
  uint64_t total = 0;
  for (int round = 0; round < 10; ++round) {
    uint64_t before = total;
    total += admit_n(a, "k", 20) + admit_n(b, "k", 20) + admit_n(c, "k", 20);
    a.exchange();
    b.exchange();
    c.exchange();
    ASSERT_TRUE(bus_test::eventually(
        [&] { return a.known("k") == total && b.known("k") == total && c.known("k") == total; }));
    // The documented bound: the limit plus what the other nodes admitted in one exchange
    // interval (two nodes x 20 here).
    EXPECT_LE(total, 100u + 2 * 20) << "round " << round;
    if (total == before) break;
  }
  EXPECT_GE(total, 100u);  // it errs on the side of admitting, never below the limit
  EXPECT_EQ(admit_n(a, "k", 1) + admit_n(b, "k", 1) + admit_n(c, "k", 1), 0u);
  EXPECT_EQ(a.stats().over_admitted, total - 100);
}

TEST(RateLimiter, CountsOfAWindowThatHasPassedAreIgnored) {
  bus::Bus bus(bus::Options().executors(2));
  FakeClock clock_a, clock_b;
  RateLimiter a(bus, "late", manual(clock_a, 10));
  RateLimiter b(bus, "late", manual(clock_b, 10));
  EXPECT_EQ(admit_n(a, "k", 10), 10u);
  clock_b.ms += 1000;  // b is in the next window already when a's counts arrive
  a.exchange();
  ASSERT_TRUE(bus_test::eventually([&] { return b.stats().stale == 1; }));
  EXPECT_EQ(b.known("k"), 0u);
  EXPECT_EQ(admit_n(b, "k", 10), 10u);
}

TEST(RateLimiter, ALostMessageIsRepairedByTheNextExchange) {
  bus::Bus bus(bus::Options().executors(2));
  FakeClock clock;
  RateLimiter a(bus, "repair", manual(clock, 100));
  EXPECT_EQ(admit_n(a, "k", 30), 30u);
  a.exchange();  // nobody else listens yet: this one is "lost"
  RateLimiter b(bus, "repair", manual(clock, 100));
  EXPECT_EQ(b.known("k"), 0u);
  EXPECT_EQ(admit_n(a, "k", 1), 1u);
  a.exchange();  // absolute counts: b learns all 31 at once
  ASSERT_TRUE(bus_test::eventually([&] { return b.known("k") == 31; }));
}

TEST(RateLimiter, PeriodicExchangeNeedsNoCall) {
  bus::Bus bus(bus::Options().executors(2));
  auto opts = LimiterOptions().limit(1000).window(3'600'000ms).exchange(5ms);
  RateLimiter a(bus, "auto", opts);
  RateLimiter b(bus, "auto", opts);
  EXPECT_EQ(admit_n(a, "k", 12), 12u);
  ASSERT_TRUE(bus_test::eventually(
      [&] { return b.known("k") >= 12 || a.known("k") == 0; }));  // (a new hour: start over)
  EXPECT_TRUE(b.known("k") == 12 || a.known("k") == 0);
}

TEST(RateLimiter, RefusesABadWindow) {
  bus::Bus bus(bus::Options().executors(1));
  EXPECT_THROW(RateLimiter(bus, "bad", LimiterOptions().window(0ms)), std::invalid_argument);
}

}  // namespace
