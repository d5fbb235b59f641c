// publish_bulk() and subscribe_bulk(): messages in runs, in order, counted, freed.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <cstdint>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

inline const bus::Topic<uint64_t> numbers{"bulk_test.numbers"};
inline const bus::Topic<uint64_t> others{"bulk_test.others"};
struct Odd {  // 12 bytes: not whole words, so a run of them is no array
  int32_t a, b, c;
};
inline const bus::Topic<Odd> odds{"bulk_test.odds"};
inline const bus::Topic<std::string> texts{"bulk_test.texts"};

/// Counts live instances: every copy the bus makes must be destroyed.
struct Tracked {
  static inline std::atomic<int> live{0};
  uint64_t v = 0;
  explicit Tracked(uint64_t x) : v(x) { ++live; }
  Tracked(const Tracked& o) : v(o.v) { ++live; }
  Tracked(Tracked&& o) noexcept : v(o.v) { ++live; }
  Tracked& operator=(const Tracked&) = default;
  ~Tracked() { --live; }
};
inline const bus::Topic<Tracked> tracked{"bulk_test.tracked"};

/// What one subscriber saw: every value in order, and the largest span.
struct Seen {
  std::vector<uint64_t> values;
  std::size_t largest_span = 0;
  void take(std::span<const uint64_t> s) {
    values.insert(values.end(), s.begin(), s.end());
    largest_span = std::max(largest_span, s.size());
  }
};

std::vector<uint64_t> one_to(uint64_t n) {
  std::vector<uint64_t> v(n);
  std::iota(v.begin(), v.end(), uint64_t{1});
  return v;
}

TEST(Bulk, PublishBulkReachesEverySubscriberInOrderAndBulkOnesInSpans) {
  constexpr uint64_t kN = 20'000;
  bus::Bus bus(bus::Options().executors(2));
  Seen bulk0, bulk1, single1;
  auto a = bus.subscribe_bulk(
      numbers, [&](std::span<const uint64_t> s) { bulk0.take(s); }, bus::on_executor(0));
  // One inbox with a bulk and a per-message subscriber: both see the run.
  auto b = bus.subscribe_bulk(
      numbers, [&](std::span<const uint64_t> s) { bulk1.take(s); }, bus::on_executor(1));
  auto c = bus.subscribe(
      numbers,
      [&](const uint64_t& v) {
        single1.take({&v, 1});
      },
      bus::on_executor(1));
  std::vector<uint64_t> all = one_to(kN);
  for (uint64_t i = 0; i < kN; i += 1000) {
    ASSERT_TRUE(bus.publish_bulk(numbers, std::span<const uint64_t>(all).subspan(i, 1000)).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(bulk0.values, all);
  EXPECT_EQ(bulk1.values, all);
  EXPECT_EQ(single1.values, all);
  // A span of 1,000 is built whole before the ring is published: runs of up to 256 arrive.
  EXPECT_GT(bulk0.largest_span, 1u);
  EXPECT_LE(bulk0.largest_span, 256u);
  const bus::ChannelStats st = *bus.stats().channel("bulk_test.numbers");
  EXPECT_EQ(st.published, kN);
  EXPECT_EQ(st.delivered, 3 * kN);
}

TEST(Bulk, OneSubscribingInboxTakesTheRunCopyAndKeepsOrderWithOtherTopics) {
  // The single-inbox route copies whole runs into the ring; interleaved with another topic
  // to the same inbox, each topic's order holds.
  constexpr uint64_t kN = 50'000;
  bus::Bus bus(bus::Options().executors(1));
  Seen nums, oths;
  auto a = bus.subscribe_bulk(numbers, [&](std::span<const uint64_t> s) { nums.take(s); });
  auto b = bus.subscribe(others, [&](const uint64_t& v) { oths.take({&v, 1}); });
  std::vector<uint64_t> all = one_to(kN);
  for (uint64_t i = 0; i < kN; i += 500) {
    ASSERT_TRUE(bus.publish_bulk(numbers, std::span<const uint64_t>(all).subspan(i, 500)).ok());
    ASSERT_TRUE(bus.publish(others, i / 500 + 1).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(nums.values, all);
  EXPECT_EQ(oths.values, one_to(kN / 500));
}

TEST(Bulk, FromAnExecutorAndInsideABatchRunsFormAndOrderHolds) {
  constexpr uint64_t kN = 30'000;
  bus::Bus bus(bus::Options().executors(2));
  Seen from_exec, from_batch;
  std::atomic<int> phase{0};
  auto a = bus.subscribe_bulk(
      numbers, [&](std::span<const uint64_t> s) { from_exec.take(s); }, bus::on_executor(1));
  auto b = bus.subscribe_bulk(
      others, [&](std::span<const uint64_t> s) { from_batch.take(s); }, bus::on_executor(1));
  // An executor publishes one by one: its sends are published once per handler, in runs.
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         for (uint64_t v = 1; v <= kN; ++v) {
                           if (!bus.publish(numbers, v).ok()) phase = -1;
                         }
                       })
                  .ok());
  {
    bus::Batch batch(bus);
    for (uint64_t v = 1; v <= kN; ++v) ASSERT_TRUE(bus.publish(others, v).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(phase.load(), 0);
  EXPECT_EQ(from_exec.values, one_to(kN));
  EXPECT_EQ(from_batch.values, one_to(kN));
  EXPECT_GT(from_exec.largest_span, 1u);
  EXPECT_GT(from_batch.largest_span, 1u);
}

TEST(Bulk, ATypeThatIsNotWholeWordsComesOneMessagePerSpan) {
  bus::Bus bus(bus::Options().executors(1));
  std::vector<int32_t> got;
  std::size_t largest = 0;
  auto a = bus.subscribe_bulk(odds, [&](std::span<const Odd> s) {
    largest = std::max(largest, s.size());
    for (const Odd& o : s) got.push_back(o.a + o.b + o.c);
  });
  std::vector<Odd> msgs;
  for (int32_t i = 0; i < 2000; ++i) msgs.push_back({i, i, i});
  ASSERT_TRUE(bus.publish_bulk(odds, std::span<const Odd>(msgs)).ok());
  ASSERT_TRUE(bus.stop().ok());
  ASSERT_EQ(got.size(), msgs.size());
  for (int32_t i = 0; i < 2000; ++i) EXPECT_EQ(got[i], 3 * i);
  EXPECT_EQ(largest, 1u);
}

TEST(Bulk, AThrowingBulkHandlerFailsItsSpanAndTheNextSpansStillArrive) {
  bus::Bus bus(bus::Options().executors(1));
  std::size_t first_span = 0;
  uint64_t after = 0;
  auto a = bus.subscribe_bulk(numbers, [&](std::span<const uint64_t> s) {
    if (first_span == 0) {
      first_span = s.size();
      throw std::runtime_error("bulk_test: a bulk handler that fails on purpose");
    }
    after += s.size();
  });
  std::vector<uint64_t> all = one_to(1000);
  ASSERT_TRUE(bus.publish_bulk(numbers, std::span<const uint64_t>(all)).ok());
  ASSERT_TRUE(bus.stop().ok());
  ASSERT_GT(first_span, 0u);
  EXPECT_EQ(first_span + after, 1000u);
  const bus::ChannelStats st = *bus.stats().channel("bulk_test.numbers");
  EXPECT_EQ(st.handler_failed, first_span);
  EXPECT_EQ(st.delivered, after);
}

TEST(Bulk, MessagesThatOwnMemoryAreCopiedWholeAndFreed) {
  bus::Bus bus(bus::Options().executors(2));
  std::vector<std::string> got_bulk, got_single;
  auto a = bus.subscribe_bulk(
      texts,
      [&](std::span<const std::string> s) { got_bulk.insert(got_bulk.end(), s.begin(), s.end()); },
      bus::on_executor(0));
  auto b = bus.subscribe(
      texts, [&](const std::string& s) { got_single.push_back(s); }, bus::on_executor(1));
  std::vector<std::string> msgs;
  for (int i = 0; i < 3000; ++i) msgs.push_back(std::string(40, 'a' + i % 26) + std::to_string(i));
  ASSERT_TRUE(bus.publish_bulk(texts, std::span<const std::string>(msgs)).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got_bulk, msgs);
  EXPECT_EQ(got_single, msgs);
}

TEST(Bulk, EveryCopyInARunIsDestroyedDeliveredOrNot) {
  {
    bus::Bus bus(bus::Options().executors(1));
    uint64_t sum = 0;
    auto a = bus.subscribe_bulk(tracked, [&](std::span<const Tracked> s) {
      for (const Tracked& t : s) sum += t.v;
    });
    std::vector<Tracked> msgs;
    for (uint64_t i = 1; i <= 1000; ++i) msgs.emplace_back(i);
    ASSERT_TRUE(bus.publish_bulk(tracked, std::span<const Tracked>(msgs)).ok());
    {
      bus::Batch batch(bus);
      for (const Tracked& t : msgs) ASSERT_TRUE(bus.publish(tracked, t).ok());
    }
    ASSERT_TRUE(bus.stop().ok());
    EXPECT_EQ(sum, 2 * 500'500u);
    EXPECT_EQ(Tracked::live.load(), 1000);  // only `msgs`
  }
  EXPECT_EQ(Tracked::live.load(), 0);
  {
    // Runs waiting in an inbox that is never drained go with the bus.
    bus::Bus bus(bus::Options().executors(1));
    bus::ExternalInbox inbox(bus);
    auto a = inbox.subscribe_bulk(tracked, [](std::span<const Tracked>) {});
    std::vector<Tracked> msgs;
    for (uint64_t i = 1; i <= 1000; ++i) msgs.emplace_back(i);
    ASSERT_TRUE(bus.publish_bulk(tracked, std::span<const Tracked>(msgs)).ok());
    EXPECT_EQ(Tracked::live.load(), 2000);
  }
  EXPECT_EQ(Tracked::live.load(), 0);
}

struct Counter {
  uint64_t total = 0;
  void add(std::span<const uint64_t> s) {
    for (uint64_t v : s) total += v;
  }
};

TEST(Bulk, AServiceTakesSpansThroughItsMemberFunction) {
  bus::Bus bus(bus::Options().executors(2));
  auto svc = bus.service<Counter>();
  svc.subscribe_bulk(numbers, &Counter::add);
  std::vector<uint64_t> all = one_to(5000);
  ASSERT_TRUE(bus.publish_bulk(numbers, std::span<const uint64_t>(all)).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(svc.state().total, 5000u * 5001 / 2);
}

}  // namespace
