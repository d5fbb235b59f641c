// Cancelling: a subscription, consumer, server, timer or service stopped from anywhere (its own
// handler, another executor, a plain thread) never deadlocks, and once cancel() has returned its
// handler does not start again.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::eventually;
using bus_test::Gate;
using bus_test::OpenOnExit;
using bus_test::Watchdog;

inline const bus::Topic<int> left{"cancel_test.left"};
inline const bus::Topic<int> right{"cancel_test.right"};
inline const bus::Topic<int> numbers{"cancel_test.numbers"};
inline const bus::Queue<int> jobs{"cancel_test.jobs"};
inline const bus::Endpoint<int, int> asks{"cancel_test.asks"};

// Rounds of the crossing tests: each round is a few microseconds when nothing hangs.
constexpr int kRounds = 4000 / BUS_STRESS_SCALE + 200;

/// Runs `a` on executor 0 and `b` on executor 1 at once, and returns when both have returned.
/// With `meet`, each waits for the other to arrive before it runs its part: the two then call
/// in at the same moment, the case that deadlocked.
template <class A, class B>
void crossing(bus::Bus& bus, bool meet, A a, B b) {
  std::atomic<int> arrived{0};
  std::atomic<int> finished{0};
  auto wait_for_other = [&] {
    arrived.fetch_add(1);
    while (meet && arrived.load() < 2) std::this_thread::yield();
  };
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         wait_for_other();
                         a();
                         finished.fetch_add(1);
                       })
                  .ok());
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         wait_for_other();
                         b();
                         finished.fetch_add(1);
                       })
                  .ok());
  // No bound here: the test's watchdog turns a hang into a failure.
  while (finished.load() < 2) std::this_thread::yield();
}

class Crossing : public ::testing::TestWithParam<bool> {};

TEST_P(Crossing, CancelsOfSubscriptionsOnEachOthersExecutorsDoNotDeadlock) {
  Watchdog watchdog("crossing subscription cancels", 300s);
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<long> got{0};
  for (int round = 0; round < kRounds; ++round) {
    bus::Subscription on0 = bus.subscribe(
        left, [&](const int&) { got++; }, bus::on_executor(0));
    bus::Subscription on1 = bus.subscribe(
        right, [&](const int&) { got++; }, bus::on_executor(1));
    crossing(
        bus, GetParam(), [&] { on1.cancel(); }, [&] { on0.cancel(); });
    ASSERT_FALSE(on0);
    ASSERT_FALSE(on1);
  }
  ASSERT_TRUE(bus.publish(left, 1).ok());
  ASSERT_TRUE(bus.publish(right, 1).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got.load(), 0) << "a cancelled subscriber got a message published after its cancel";
}

TEST_P(Crossing, CancelsOfConsumersAndServersOnEachOthersExecutorsDoNotDeadlock) {
  Watchdog watchdog("crossing consumer and server cancels", 300s);
  bus::Bus bus(bus::Options().executors(2));
  for (int round = 0; round < kRounds; ++round) {
    bus::Subscription consumer = bus.consume(
        jobs, [](int&&) {}, bus::on_executor(0));
    bus::Subscription server = bus.serve(
        asks, [](int&& v) { return v; }, bus::on_executor(1));
    crossing(
        bus, GetParam(), [&] { server.cancel(); }, [&] { consumer.cancel(); });
  }
  EXPECT_EQ(bus.servers(asks), 0u);
  ASSERT_TRUE(bus.stop().ok());
}

TEST_P(Crossing, StopsOfServicesOnEachOthersExecutorsDoNotDeadlock) {
  Watchdog watchdog("crossing Service::stop", 300s);
  struct Counter {
    long seen = 0;
    void on(const int&) { ++seen; }
  };
  bus::Bus bus(bus::Options().executors(2));
  for (int round = 0; round < kRounds; ++round) {
    auto s0 = bus.service<Counter>(bus::on_executor(0));
    auto s1 = bus.service<Counter>(bus::on_executor(1));
    s0.subscribe(left, &Counter::on).every(1h, [](Counter&) {});
    s1.subscribe(right, &Counter::on).every(1h, [](Counter&) {});
    crossing(
        bus, GetParam(), [&] { s1.stop(); }, [&] { s0.stop(); });
    ASSERT_FALSE(s0.running());
    ASSERT_FALSE(s1.running());
  }
  ASSERT_TRUE(bus.stop().ok());
}

TEST_P(Crossing, TimerCancelsOnEachOthersExecutorsDoNotDeadlock) {
  Watchdog watchdog("crossing timer cancels", 300s);
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<int> fired{0};
  for (int round = 0; round < kRounds; ++round) {
    bus::TimerId t0 = bus.after(bus::on_executor(0), 1h, [&] { fired++; });
    bus::TimerId t1 = bus.every(bus::on_executor(1), 1h, [&] { fired++; });
    crossing(
        bus, GetParam(), [&] { bus.cancel(t1); }, [&] { bus.cancel(t0); });
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(fired.load(), 0);
}

TEST_P(Crossing, HandlersCancellingEachOtherDoNotDeadlockAndNeitherStartsAfterItsCancel) {
  // Each handler cancels the other's subscription while both run: neither can wait for the
  // other to return (the cycle), so each cancel returns while the other handler may still be
  // in its call. Neither handler starts again once the cancel of it has returned.
  Watchdog watchdog("handlers cancelling each other", 300s);
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<int> started_after_cancel{0};
  for (int round = 0; round < kRounds / 4; ++round) {
    std::atomic<int> arrived{0};
    std::atomic<bool> cancelled0{false}, cancelled1{false};
    std::optional<bus::Subscription> on0, on1;
    auto handler = [&](std::optional<bus::Subscription>& other, std::atomic<bool>& mine,
                       std::atomic<bool>& theirs) {
      return [&](const int&) {
        if (mine.load()) started_after_cancel++;
        arrived++;
        while (GetParam() && arrived.load() < 2) std::this_thread::yield();
        other->cancel();
        theirs = true;
      };
    };
    on0.emplace(bus.subscribe(left, handler(on1, cancelled0, cancelled1), bus::on_executor(0)));
    on1.emplace(bus.subscribe(right, handler(on0, cancelled1, cancelled0), bus::on_executor(1)));
    {
      bus::Batch batch(bus);
      for (int i = 0; i < 3; ++i) {
        ASSERT_TRUE(bus.publish(left, i).ok());
        ASSERT_TRUE(bus.publish(right, i).ok());
      }
    }
    // Free, the first cancel may return before the other handler ever started: that one then
    // never runs, and its subscription stays. Either way a round's handlers are done with its
    // locals once both executors have run a closure posted after the messages.
    while (!cancelled0.load() && !cancelled1.load()) std::this_thread::yield();
    std::atomic<int> quiet{0};
    ASSERT_TRUE(bus.post(bus::on_executor(0), [&] { quiet++; }).ok());
    ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { quiet++; }).ok());
    while (quiet.load() < 2) std::this_thread::yield();
    if (GetParam()) {
      // Meeting, both handlers ran before either cancelled: both cancels happened.
      ASSERT_TRUE(cancelled0.load() && cancelled1.load());
    }
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(started_after_cancel.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Cancel, Crossing, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Meeting" : "Free"; });

// ---- a cancel from the handler's own executor -------------------------------------------------

/// Publishes `n` numbers to a subscriber that cancels itself in its first call; they are all
/// queued before it runs (it waits at a gate that opens once they are).
int calls_after_self_cancel(bool batched, int n) {
  Gate gate;
  std::atomic<int> calls{0};
  bus::Bus bus(bus::Options().executors(1));
  std::optional<bus::Subscription> sub;
  std::atomic<bool> subscribed{false};
  sub.emplace(bus.subscribe(
      numbers,
      [&](const int&) {
        gate.wait();
        calls++;
        sub->cancel();
      },
      bus::on_executor(0)));
  subscribed = true;
  {
    std::optional<bus::Batch> batch;
    if (batched) batch.emplace(bus);
    for (int i = 0; i < n; ++i) EXPECT_TRUE(bus.publish(numbers, i).ok());
  }
  gate.open();
  EXPECT_TRUE(bus.stop().ok());
  return calls.load();
}

TEST(Cancel, ASubscriberCancelledInItsHandlerGetsNothingAfterThatHandler) {
  Watchdog watchdog("ASubscriberCancelledInItsHandlerGetsNothingAfterThatHandler", 120s);
  EXPECT_EQ(calls_after_self_cancel(/*batched=*/true, 200), 1) << "published in a Batch";
  EXPECT_EQ(calls_after_self_cancel(/*batched=*/false, 100), 1) << "published one by one";
}

TEST(Cancel, ASubscriberMayFreeWhatItsHandlerUsesAfterCancellingInIt) {
  Watchdog watchdog("ASubscriberMayFreeWhatItsHandlerUsesAfterCancellingInIt", 120s);
  // The handler owns its state through the subscription's holder; cancelling and freeing it in
  // the handler must leave no later call on freed memory (ASan sees one).
  struct State {
    std::vector<int> seen;
    std::optional<bus::Subscription> sub;
  };
  Gate gate;
  bus::Bus bus(bus::Options().executors(1));
  auto* state = new State;
  state->sub.emplace(bus.subscribe(
      numbers,
      [&gate, state](const int& v) {
        gate.wait();
        state->seen.push_back(v);
        if (v == 3) {
          bus::Subscription mine = std::move(*state->sub);
          mine.cancel();
          delete state;
        }
      },
      bus::on_executor(0)));
  {
    bus::Batch batch(bus);
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(bus.publish(numbers, i).ok());
  }
  for (int i = 50; i < 100; ++i) ASSERT_TRUE(bus.publish(numbers, i).ok());
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
}

TEST(Cancel, ASubscriberCancelledByAnotherOnItsExecutorIsNotCalledAgain) {
  Watchdog watchdog("ASubscriberCancelledByAnotherOnItsExecutorIsNotCalledAgain", 120s);
  // Two subscribers of one topic on one executor: the first cancels the second in its first
  // call. The second is not called for that message, nor for any after it.
  Gate gate;
  std::atomic<int> first{0}, second{0};
  bus::Bus bus(bus::Options().executors(1));
  std::optional<bus::Subscription> b;
  auto a = bus.subscribe(
      numbers,
      [&](const int&) {
        gate.wait();
        if (first++ == 0) b->cancel();
      },
      bus::on_executor(0));
  b.emplace(bus.subscribe(
      numbers, [&](const int&) { second++; }, bus::on_executor(0)));
  {
    bus::Batch batch(bus);
    for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.publish(numbers, i).ok());
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(first.load(), 100);
  EXPECT_EQ(second.load(), 0);
}

TEST(Cancel, AConsumerCancelledInItsHandlerHandsTheRestToAnother) {
  Watchdog watchdog("AConsumerCancelledInItsHandlerHandsTheRestToAnother", 120s);
  Gate gate;
  std::atomic<int> mine{0}, other{0};
  bus::Bus bus(bus::Options().executors(2));
  std::optional<bus::Subscription> first;
  first.emplace(bus.consume(
      jobs,
      [&](int&&) {
        gate.wait();
        mine++;
        first->cancel();
      },
      bus::on_executor(0)));
  // Every message goes to the first consumer (the only one) until it cancels itself.
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.send(jobs, i).ok());
  auto second = bus.consume(
      jobs, [&](int&&) { other++; }, bus::on_executor(1));
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(mine.load(), 1);
  EXPECT_EQ(other.load(), 99);
  const bus::Stats stats = bus.stats();
  const auto* c = stats.channel("cancel_test.jobs");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->unrouted, 0u);
  EXPECT_EQ(c->delivered, 100u);
}

TEST(Cancel, AServerCancelledInItsHandlerAnswersNoMoreRequests) {
  Watchdog watchdog("AServerCancelledInItsHandlerAnswersNoMoreRequests", 120s);
  Gate gate;
  std::atomic<int> served{0};
  bus::Bus bus(bus::Options().executors(2));
  std::optional<bus::Subscription> server;
  server.emplace(bus.serve(
      asks,
      [&](int&& v) {
        gate.wait();
        served++;
        server->cancel();
        return v;
      },
      bus::on_executor(0)));
  std::atomic<int> ok{0}, unavailable{0};
  // Asked from executor 1: executor 0 is held by the first request's handler.
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         for (int i = 0; i < 20; ++i) {
                           bus.request(asks, i, 30s, [&](absl::StatusOr<int> r) {
                             if (r.ok()) {
                               ok++;
                             } else if (r.status().code() == absl::StatusCode::kUnavailable) {
                               unavailable++;
                             }
                           });
                         }
                       })
                  .ok());
  ASSERT_TRUE(eventually([&] {
    return bus.stats().channel("cancel_test.asks") != nullptr &&
           bus.stats().channel("cancel_test.asks")->published == 20;
  }));
  gate.open();
  ASSERT_TRUE(eventually([&] { return ok.load() + unavailable.load() == 20; }));
  EXPECT_EQ(served.load(), 1);
  EXPECT_EQ(ok.load(), 1);
  EXPECT_EQ(unavailable.load(), 19);
  ASSERT_TRUE(bus.stop().ok());
}

TEST(Cancel, ATimerCancelledFromAnotherExecutorNeverFiresAfterTheCancelReturned) {
  Watchdog watchdog("ATimerCancelledFromAnotherExecutorNeverFiresAfterTheCancelReturned", 120s);
  bus::Bus bus(bus::Options().executors(2));
  for (int round = 0; round < 200; ++round) {
    std::atomic<bool> cancelled{false};
    std::atomic<int> late{0};
    bus::TimerId t = bus.every(bus::on_executor(1), 10us, [&] {
      if (cancelled.load()) late++;
    });
    std::atomic<bool> done{false};
    ASSERT_TRUE(bus.post(bus::on_executor(0),
                         [&] {
                           bus.cancel(t);
                           cancelled = true;
                           done = true;
                         })
                    .ok());
    ASSERT_TRUE(eventually([&] { return done.load(); }));
    // A later timer on executor 1 has had its turn: the cancelled one would have fired first.
    std::atomic<bool> after{false};
    ASSERT_TRUE(bus.after(bus::on_executor(1), 1ms, [&] { after = true; }));
    ASSERT_TRUE(eventually([&] { return after.load(); }));
    ASSERT_EQ(late.load(), 0);
  }
  ASSERT_TRUE(bus.stop().ok());
}

}  // namespace
