// stats(): exact per-channel counts once the bus stopped, failures counted where they happen,
// and the inboxes with their rings.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::eventually;
using bus_test::Gate;
using bus_test::OpenOnExit;

inline const bus::Topic<int> counted_ticks{"stats_test.counted.ticks"};
inline const bus::Queue<int> counted_jobs{"stats_test.counted.jobs"};
inline const bus::Endpoint<int, int> counted_asks{"stats_test.counted.asks"};
inline const bus::Topic<int> fragile{"stats_test.fragile"};
inline const bus::Endpoint<int, int> slow_for_call{"stats_test.slow_for_call"};
inline const bus::Endpoint<int, int> slow_for_request{"stats_test.slow_for_request"};
inline const bus::Endpoint<int, int> behind{"stats_test.behind"};
inline const bus::Topic<int> lossy{"stats_test.lossy", bus::Overflow::kDropNewest};
inline const bus::Topic<int> strict{"stats_test.strict", bus::Overflow::kFail};
inline const bus::Queue<int> orphan_jobs{"stats_test.orphan_jobs"};
inline const bus::Topic<int> strict_pair{"stats_test.strict_pair", bus::Overflow::kFail};
inline const bus::Endpoint<int, int> async_late{"stats_test.async_late"};
inline const bus::Endpoint<int, int> expiring{"stats_test.expiring"};
inline const bus::Topic<int> spread{"stats_test.spread"};
struct Token {
  std::shared_ptr<int> life;  // every copy the bus holds keeps it; all must go
  int n;
};
inline const bus::Topic<Token> tokens{"stats_test.tokens"};

/// A copy of the channel's counters (so a snapshot taken in the same expression may go).
bus::ChannelStats channel(const bus::Stats& stats, const char* name) {
  const bus::ChannelStats* c = stats.channel(name);
  if (c == nullptr) throw std::runtime_error(std::string("no stats for channel ") + name);
  return *c;
}

TEST(Stats, CountsPublishedAndDeliveredPerChannel) {
  bus::Bus bus(bus::Options().executors(2));
  auto a = bus.subscribe(
      counted_ticks, [](const int&) {}, bus::on_executor(0));
  auto b = bus.subscribe(
      counted_ticks, [](const int&) {}, bus::on_executor(1));
  auto c = bus.subscribe(
      counted_ticks, [](const int&) {}, bus::on_executor(1));
  auto jobs = bus.consume(counted_jobs, [](int) {});
  auto asks = bus.serve(counted_asks, [](int v) { return v; });

  // From threads that are gone by the time of the snapshot, and from this one.
  constexpr int kThreads = 3;
  constexpr int kPerThread = 1000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(bus.publish(counted_ticks, i).ok());
        EXPECT_TRUE(bus.send(counted_jobs, i).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kPerThread; ++i) ASSERT_TRUE(bus.publish(counted_ticks, i).ok());
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(bus.call(counted_asks, i, 30s).ok());
  ASSERT_TRUE(bus.stop().ok());

  bus::Stats stats = bus.stats();
  const auto& ticks = channel(stats, "stats_test.counted.ticks");
  EXPECT_EQ(ticks.type, "Topic<int>");
  EXPECT_EQ(ticks.published, uint64_t{(kThreads + 1) * kPerThread});
  EXPECT_EQ(ticks.delivered, uint64_t{3 * (kThreads + 1) * kPerThread});  // three subscribers
  EXPECT_EQ(ticks.dropped + ticks.failed + ticks.handler_failed, 0u);

  const auto& queue = channel(stats, "stats_test.counted.jobs");
  EXPECT_EQ(queue.type, "Queue<int>");
  EXPECT_EQ(queue.published, uint64_t{kThreads * kPerThread});
  EXPECT_EQ(queue.delivered, uint64_t{kThreads * kPerThread});

  const auto& endpoint = channel(stats, "stats_test.counted.asks");
  EXPECT_EQ(endpoint.type, "Endpoint<int, int>");
  EXPECT_EQ(endpoint.published, 50u);
  EXPECT_EQ(endpoint.delivered, 50u);
  EXPECT_EQ(endpoint.late_replies + endpoint.expired, 0u);
}

TEST(Stats, ThrowingSubscriberIsCountedAndTheOtherStillGetsEverything) {
  std::atomic<int> got{0};
  bus::Bus bus(bus::Options().executors(2));
  // Both on one executor, the throwing one first: they share one record.
  auto thrower = bus.subscribe(
      fragile,
      [](const int&) {
        throw std::runtime_error("stats_test: a subscriber that fails on purpose");
      },
      bus::on_executor(0));
  auto counter = bus.subscribe(
      fragile, [&](const int&) { got.fetch_add(1); }, bus::on_executor(0));
  constexpr int kN = 500;
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(bus.publish(fragile, i).ok());
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_EQ(got.load(), kN);
  const auto& c = channel(bus.stats(), "stats_test.fragile");
  EXPECT_EQ(c.published, uint64_t{kN});
  EXPECT_EQ(c.handler_failed, uint64_t{kN});
  EXPECT_EQ(c.delivered, uint64_t{kN});
}

TEST(Stats, ALoneSubscriberThatThrowsInARunGetsTheRestAndEveryMessageIsDestroyed) {
  // Published in a Batch, the messages reach the lone subscriber in runs, which it takes in one
  // loop: a throw fails that message only, and each payload is destroyed whether it threw or not.
  auto life = std::make_shared<int>(0);
  constexpr int kN = 3000;
  int calls = 0;
  long sum = 0;  // written on the executor, read after stop()
  {
    bus::Bus bus(bus::Options().executors(1));
    auto sub = bus.subscribe(tokens, [&](const Token& t) {
      ++calls;
      if (t.n % 3 == 0) throw std::runtime_error("stats_test: every third message fails");
      sum += t.n;
    });
    {
      bus::Batch batch(bus);
      for (int n = 1; n <= kN; ++n) ASSERT_TRUE(bus.publish(tokens, Token{life, n}).ok());
    }
    ASSERT_TRUE(bus.stop().ok());
    const auto& c = channel(bus.stats(), "stats_test.tokens");
    EXPECT_EQ(c.published, uint64_t{kN});
    EXPECT_EQ(c.handler_failed, uint64_t{kN / 3});
    EXPECT_EQ(c.delivered, uint64_t{kN - kN / 3});
    EXPECT_EQ(life.use_count(), 1) << "a payload was not destroyed";
  }
  EXPECT_EQ(calls, kN);
  EXPECT_EQ(sum, long{kN} * (kN + 1) / 2 - 3L * (kN / 3) * (kN / 3 + 1) / 2);
}

TEST(Stats, ReplyAfterACallGaveUpIsALateReply) {
  Gate gate;
  std::atomic<bool> entered{false};
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(
      slow_for_call,
      [&](int v) {
        entered.store(true);
        gate.wait();
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  absl::StatusOr<int> r = bus.call(slow_for_call, 1, 1s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  gate.open();  // only now can the handler reply: after call() returned
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_TRUE(entered.load());
  const auto& c = channel(bus.stats(), "stats_test.slow_for_call");
  EXPECT_EQ(c.late_replies, 1u);
  EXPECT_EQ(c.delivered, 1u);
  EXPECT_EQ(c.expired, 0u);
}

TEST(Stats, ReplyAfterARequestTimedOutIsALateReply) {
  Gate gate;
  std::atomic<bool> entered{false};
  std::atomic<bool> called_back{false};
  absl::StatusCode code = absl::StatusCode::kUnknown;
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(
      slow_for_request,
      [&](int v) {
        entered.store(true);
        gate.wait();
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  // Asked from executor 1, whose deadline timer is free to fire while executor 0 is held.
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         bus.request(slow_for_request, 1, 1s, [&](absl::StatusOr<int> r) {
                           code = r.status().code();
                           called_back.store(true);
                         });
                       })
                  .ok());
  ASSERT_TRUE(eventually([&] { return called_back.load(); }));
  EXPECT_EQ(code, absl::StatusCode::kDeadlineExceeded);
  gate.open();
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_TRUE(entered.load());
  const auto& c = channel(bus.stats(), "stats_test.slow_for_request");
  EXPECT_EQ(c.late_replies, 1u);
  EXPECT_EQ(c.expired, 0u);
}

TEST(Stats, RequestWhoseDeadlinePassedBeforeAHandlerRanIsExpired) {
  Gate gate;
  std::atomic<int> handled{0};
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(
      behind,
      [&](int v) {
        handled.fetch_add(1);
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  // Executor 0 is held until the caller has given up: the handler's turn comes too late.
  ASSERT_TRUE(bus.post(bus::on_executor(0), [&] { gate.wait(); }).ok());
  EXPECT_EQ(bus.call(behind, 1, 50ms).status().code(), absl::StatusCode::kDeadlineExceeded);
  gate.open();
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_EQ(handled.load(), 0);
  const auto& c = channel(bus.stats(), "stats_test.behind");
  EXPECT_EQ(c.published, 1u);
  EXPECT_EQ(c.expired, 1u);
  EXPECT_EQ(c.delivered, 0u);
}

TEST(Stats, DroppedMessagesAreCountedAndNotDelivered) {
  Gate gate;
  std::atomic<int> got{0};
  bus::Bus bus(bus::Options().executors(2).ring_bytes(512));  // 32 two-word records
  auto sub = bus.subscribe(
      lossy,
      [&](const int&) {
        gate.wait();
        got.fetch_add(1);
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  constexpr int kN = 200;
  for (int i = 0; i < kN; ++i) ASSERT_TRUE(bus.publish(lossy, i).ok());  // drop-newest: OK
  gate.open();
  ASSERT_TRUE(bus.stop().ok());

  const auto& c = channel(bus.stats(), "stats_test.lossy");
  EXPECT_GT(c.dropped, 0u);
  EXPECT_EQ(c.failed, 0u);
  EXPECT_EQ(c.delivered, static_cast<uint64_t>(got.load()));
  EXPECT_EQ(c.published, uint64_t{kN});
  EXPECT_EQ(c.published, c.delivered + c.dropped);
}

TEST(Stats, RefusedMessagesAreCountedAsFailed) {
  Gate gate;
  std::atomic<int> got{0};
  bus::Bus bus(bus::Options().executors(2).ring_bytes(512));
  auto sub = bus.subscribe(
      strict,
      [&](const int&) {
        gate.wait();
        got.fetch_add(1);
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  constexpr int kN = 200;
  uint64_t accepted = 0;
  uint64_t refused = 0;
  for (int i = 0; i < kN; ++i) {
    absl::Status s = bus.publish(strict, i);
    if (s.ok()) {
      ++accepted;
    } else {
      EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_GT(refused, 0u);
  const auto& c = channel(bus.stats(), "stats_test.strict");
  EXPECT_EQ(c.failed, refused);
  EXPECT_EQ(c.published, uint64_t{kN}) << "every message offered, refused ones too";
  EXPECT_EQ(c.delivered, accepted);
  EXPECT_EQ(c.published, c.delivered + c.failed);
  EXPECT_EQ(static_cast<uint64_t>(got.load()), accepted);
}

TEST(Stats, SendWithoutAConsumerIsRefusedAndCounted) {
  bus::Bus bus(bus::Options().executors(2));
  EXPECT_EQ(bus.send(orphan_jobs, 1).code(), absl::StatusCode::kUnavailable);
  const auto& c = channel(bus.stats(), "stats_test.orphan_jobs");
  EXPECT_EQ(c.failed, 1u);
  EXPECT_EQ(c.published, 1u);
}

TEST(Stats, RefusedRequestsAreCountedOnce) {
  static const bus::Endpoint<int, int> nobody{"stats_test.nobody"};
  bus::Bus bus(bus::Options().executors(1));
  EXPECT_EQ(bus.call(nobody, 1, std::chrono::seconds(5)).status().code(),
            absl::StatusCode::kUnavailable);
  std::promise<absl::StatusCode> code;
  bus.request(nobody, 2, std::chrono::seconds(5),
              [&](absl::StatusOr<int> r) { code.set_value(r.status().code()); });
  EXPECT_EQ(code.get_future().get(), absl::StatusCode::kUnavailable);
  const auto& c = channel(bus.stats(), "stats_test.nobody");
  EXPECT_EQ(c.failed, 2u);
  EXPECT_EQ(c.published, 2u);
}

// ---- the identity: every message offered has one outcome per subscriber ----------------------

TEST(Stats, EveryMessageOfferedToATopicHasOneOutcomePerSubscriber) {
  // Two subscribers on one executor that is held, one on another that is not, under the fail
  // policy: a refused copy to the held executor counts once for each of its two subscribers.
  Gate gate;
  std::atomic<int> held_calls{0}, free_calls{0};
  bus::Bus bus(bus::Options().executors(2).ring_bytes(512));
  auto a = bus.subscribe(
      strict_pair,
      [&](const int&) {
        gate.wait();
        held_calls++;
      },
      bus::on_executor(0));
  auto b = bus.subscribe(
      strict_pair, [&](const int&) { held_calls++; }, bus::on_executor(0));
  auto c = bus.subscribe(
      strict_pair, [&](const int&) { free_calls++; }, bus::on_executor(1));
  OpenOnExit open_on_exit{gate};
  constexpr int kN = 300;
  int partly_refused = 0;
  for (int i = 0; i < kN; ++i) {
    if (!bus.publish(strict_pair, i).ok()) ++partly_refused;
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_GT(partly_refused, 0);
  const auto& s = channel(bus.stats(), "stats_test.strict_pair");
  EXPECT_EQ(s.published, uint64_t{kN}) << "a message some subscribers took is published";
  EXPECT_EQ(s.delivered, static_cast<uint64_t>(held_calls.load() + free_calls.load()));
  // Per subscriber, each message was delivered or failed. The one with room may have been
  // refused some too (its ring is as small); each copy refused to the held executor stood for
  // its two subscribers.
  const uint64_t free_failed = kN - static_cast<uint64_t>(free_calls.load());
  const uint64_t held_failed = s.failed - free_failed;
  EXPECT_EQ(held_failed % 2, 0u);
  EXPECT_EQ(static_cast<uint64_t>(held_calls.load()), 2 * uint64_t{kN} - held_failed);
  EXPECT_EQ(3 * s.published, s.delivered + s.handler_failed + s.dropped + s.failed);
}

TEST(Stats, ALateAnswerFromAServerOnAPlainThreadIsCounted) {
  // serve_async keeps the replier; a plain thread answers after the call gave up.
  std::mutex mu;
  std::optional<bus::Replier<int>> kept;
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve_async(async_late, [&](int&&, bus::Replier<int> reply) {
    std::lock_guard lock(mu);
    kept.emplace(std::move(reply));
  });
  EXPECT_EQ(bus.call(async_late, 1, 20ms).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return kept.has_value();
  }));
  std::thread([&] {
    std::lock_guard lock(mu);
    (*kept)(7);
  }).join();
  ASSERT_TRUE(bus.stop().ok());
  const auto& c = channel(bus.stats(), "stats_test.async_late");
  EXPECT_EQ(c.late_replies, 1u);
  EXPECT_EQ(c.delivered, 1u);
  EXPECT_EQ(c.expired, 0u);
}

TEST(Stats, ARequestThatExpiresAtTheServerIsCountedOnceAsExpired) {
  // The server's executor is held past the deadlines of a call() and of a request(): the
  // server finds both expired, runs no handler, and counts each once, never as a late reply.
  Gate gate;
  std::atomic<int> handled{0};
  bus::Bus bus(bus::Options().executors(3));
  auto server = bus.serve(
      expiring,
      [&](int v) {
        handled++;
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  ASSERT_TRUE(bus.post(bus::on_executor(0), [&] { gate.wait(); }).ok());
  std::atomic<int> code{-1};
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         bus.request(expiring, 1, 20ms, [&](absl::StatusOr<int> r) {
                           code = static_cast<int>(r.status().code());
                         });
                       })
                  .ok());
  EXPECT_EQ(bus.call(expiring, 2, 20ms).status().code(), absl::StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(eventually([&] { return code.load() >= 0; }));
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(handled.load(), 0);
  const auto& c = channel(bus.stats(), "stats_test.expiring");
  EXPECT_EQ(c.published, 2u);
  EXPECT_EQ(c.expired, 2u);
  EXPECT_EQ(c.late_replies, 0u);
  EXPECT_EQ(c.published, c.delivered + c.handler_failed + c.expired + c.unrouted + c.failed);
}

TEST(Stats, InboxesReportTheirRingsAndCapacity) {
  bus::Bus bus(bus::Options().executors(2).ring_bytes(4096));
  auto a = bus.subscribe(
      spread, [](const int&) {}, bus::on_executor(0));
  auto b = bus.subscribe(
      spread, [](const int&) {}, bus::on_executor(1));
  ASSERT_TRUE(bus.publish(spread, 1).ok());
  ASSERT_TRUE(bus.stop().ok());

  bus::Stats stats = bus.stats();
  ASSERT_EQ(stats.inboxes.size(), 2u);
  for (unsigned i = 0; i < 2; ++i) {
    const bus::InboxStats& in = stats.inboxes[i];
    EXPECT_EQ(in.index, i);
    EXPECT_FALSE(in.external);
    EXPECT_GE(in.rings, 1u);  // at least this thread's
    EXPECT_GT(in.capacity_bytes, 0u);
    EXPECT_EQ(in.capacity_bytes, uint64_t{in.rings} * 4096);
    EXPECT_EQ(in.depth_bytes, 0u);  // stopped: everything was run
  }
  EXPECT_EQ(stats.held_records, 0u);
}

TEST(Stats, RingSizeIsRoundedUpToAPowerOfTwoOfAtLeast512Bytes) {
  for (auto [asked, got] :
       {std::pair<std::size_t, uint64_t>{1000, 1024}, {100, 512}, {4096, 4096}}) {
    bus::Bus bus(bus::Options().executors(1).ring_bytes(asked));
    ASSERT_TRUE(bus.post(bus::on_executor(0), [] {}).ok());
    ASSERT_TRUE(bus.stop().ok());
    bus::Stats stats = bus.stats();
    ASSERT_EQ(stats.inboxes.size(), 1u);
    ASSERT_EQ(stats.inboxes[0].rings, 1u);
    EXPECT_EQ(stats.inboxes[0].capacity_bytes, got) << "ring_bytes(" << asked << ")";
  }
}

TEST(Stats, ExternalInboxIsListedAsExternal) {
  bus::Bus bus(bus::Options().executors(2));
  bus::ExternalInbox external(bus);
  bus::Stats stats = bus.stats();
  ASSERT_EQ(stats.inboxes.size(), 3u);
  EXPECT_FALSE(stats.inboxes[0].external);
  EXPECT_FALSE(stats.inboxes[1].external);
  EXPECT_TRUE(stats.inboxes[2].external);
  EXPECT_EQ(stats.inboxes[2].index, 2u);
}

}  // namespace
