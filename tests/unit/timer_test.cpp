// Timers: after() fires once and every() until cancelled, on the executor asked for; a timer
// callback that throws leaves its executor running.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "bus/detail/sync.hpp"
#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::eventually;

/// Returns once a timer set on `executor` after `delay` has fired: every timer of that executor
/// due earlier has had its turn by then (one inbox runs its timers in order of their due time).
void wait_for_later_timer(bus::Bus& bus, unsigned executor, bus::Clock::duration delay) {
  auto fired = std::make_shared<std::atomic<bool>>(false);
  ASSERT_TRUE(bus.after(bus::on_executor(executor), delay, [fired] { fired->store(true); }));
  ASSERT_TRUE(eventually([&] { return fired->load(); }));
}

inline const bus::Topic<int> survivors{"timer_test.survivors"};

TEST(Timer, AfterFiresOnceOnTheChosenExecutor) {
  std::array<std::atomic<int>, 3> fired{};
  std::atomic<int> elsewhere{0};
  bus::Bus bus(bus::Options().executors(3));
  for (unsigned e = 0; e < 3; ++e) {
    bus::TimerId id = bus.after(bus::on_executor(e), 1ms, [&, e] {
      if (bus.current_executor() != e) elsewhere.fetch_add(1);
      fired[e].fetch_add(1);
    });
    ASSERT_TRUE(id);
  }
  ASSERT_TRUE(eventually([&] { return fired[0] + fired[1] + fired[2] == 3; }));
  for (unsigned e = 0; e < 3; ++e) wait_for_later_timer(bus, e, 20ms);
  for (unsigned e = 0; e < 3; ++e) EXPECT_EQ(fired[e].load(), 1) << "executor " << e;
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(Timer, EveryFiresRepeatedlyUntilCancelled) {
  std::atomic<int> ticks{0};
  std::atomic<int> elsewhere{0};
  bus::Bus bus(bus::Options().executors(2));
  bus::TimerId id = bus.every(bus::on_executor(1), 1ms, [&] {
    if (bus.current_executor() != 1u) elsewhere.fetch_add(1);
    ticks.fetch_add(1);
  });
  ASSERT_TRUE(id);
  ASSERT_TRUE(eventually([&] { return ticks.load() >= 5; }));
  bus.cancel(id);  // from a plain thread: once it returns, the timer never fires again
  int at_cancel = ticks.load();
  // A live 1 ms timer would be due before this one.
  wait_for_later_timer(bus, 1, 10ms);
  EXPECT_EQ(ticks.load(), at_cancel);
  EXPECT_EQ(elsewhere.load(), 0);
}

TEST(Timer, EveryCancelledFromItsOwnCallbackStops) {
  std::atomic<int> ticks{0};
  std::atomic<bool> later{false};
  std::mutex mu;
  bus::TimerId id;
  bus::Bus bus(bus::Options().executors(2));
  {
    // The callback takes `mu` before reading `id`: it sees it assigned.
    std::lock_guard lock(mu);
    id = bus.every(bus::on_executor(0), 1ms, [&] {
      if (ticks.fetch_add(1) + 1 != 3) return;
      std::lock_guard inner(mu);
      bus.cancel(id);
      // Set after the cancel from the same executor: a live timer would be due before it.
      (void)bus.after(bus::on_executor(0), 10ms, [&] { later.store(true); });
    });
  }
  ASSERT_TRUE(id);
  ASSERT_TRUE(eventually([&] { return later.load(); }));
  EXPECT_EQ(ticks.load(), 3);
}

TEST(Timer, AfterCancelledBeforeItIsDueNeverFires) {
  std::atomic<bool> fired{false};
  std::atomic<bool> later{false};
  bus::Bus bus(bus::Options().executors(2));
  // Set and cancelled from the executor itself: both closures run before its next timer pass.
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         bus::TimerId id =
                             bus.after(bus::on_executor(1), 0ms, [&] { fired.store(true); });
                         bus.cancel(id);
                         (void)bus.after(bus::on_executor(1), 5ms, [&] { later.store(true); });
                       })
                  .ok());
  ASSERT_TRUE(eventually([&] { return later.load(); }));
  EXPECT_FALSE(fired.load());
}

struct Clocked {
  std::atomic<int> afters{0};
  std::atomic<int> everys{0};
  std::atomic<int> wrong{0};  // callbacks handed another state, or run off the service's executor
};

TEST(Timer, ServiceTimersGetTheServiceState) {
  bus::Bus bus(bus::Options().executors(3));
  auto svc = bus.service<Clocked>(bus::on_executor(2));
  Clocked* expected = &svc.state();
  auto check = [&bus, expected](Clocked& s) {
    if (&s != expected || bus.current_executor() != 2u) s.wrong.fetch_add(1);
  };
  ASSERT_TRUE(svc.after(1ms, [check](Clocked& s) {
    check(s);
    s.afters.fetch_add(1);
  }));
  bus::TimerId every = svc.every(1ms, [check](Clocked& s) {
    check(s);
    s.everys.fetch_add(1);
  });
  ASSERT_TRUE(every);
  ASSERT_TRUE(
      eventually([&] { return expected->afters.load() == 1 && expected->everys.load() >= 3; }));
  bus.cancel(every);
  int at_cancel = expected->everys.load();
  wait_for_later_timer(bus, 2, 10ms);
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(expected->afters.load(), 1);
  EXPECT_EQ(expected->everys.load(), at_cancel);
  EXPECT_EQ(expected->wrong.load(), 0);
}

TEST(Timer, ThrowingCallbackDoesNotKillTheExecutor) {
  std::atomic<bool> threw{false};
  std::atomic<int> got{0};
  bus::Bus bus(bus::Options().executors(2));
  auto sub = bus.subscribe(
      survivors, [&](const int&) { got.fetch_add(1); }, bus::on_executor(0));
  ASSERT_TRUE(bus.after(bus::on_executor(0), 0ms, [&] {
    threw.store(true);
    throw std::runtime_error("timer_test: a timer callback that fails on purpose");
  }));
  wait_for_later_timer(bus, 0, 5ms);  // the executor still runs timers after the throw ...
  EXPECT_TRUE(threw.load());
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(bus.publish(survivors, i).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got.load(), 1000);  // ... and still delivers messages
}

TEST(Timer, ThrowingPeriodicCallbackKeepsFiring) {
  std::atomic<int> ticks{0};
  bus::Bus bus(bus::Options().executors(2));
  bus::TimerId id = bus.every(bus::on_executor(1), 1ms, [&] {
    ticks.fetch_add(1);
    throw std::runtime_error("timer_test: a periodic callback that fails on purpose");
  });
  ASSERT_TRUE(id);
  EXPECT_TRUE(eventually([&] { return ticks.load() >= 3; }));
  bus.cancel(id);
}

TEST(Timer, TimersAreRefusedOnceTheBusStopped) {
  std::atomic<bool> fired{false};
  bus::Bus bus(bus::Options().executors(2));
  ASSERT_TRUE(bus.stop().ok());
  bus::TimerId id = bus.after(bus::on_executor(0), 0ms, [&] { fired.store(true); });
  EXPECT_FALSE(id);
  bus.cancel(id);  // cancelling the empty id is harmless
  EXPECT_FALSE(fired.load());
}

TEST(Clock, ReachedSaysWhatThePreciseClockSays) {
  using bus::detail::Clock;
  using bus::detail::reached;
  EXPECT_TRUE(reached(Clock::now() - 1ms));
  EXPECT_TRUE(reached(Clock::now()));
  EXPECT_FALSE(reached(Clock::now() + 1h));  // the coarse clock answers this one
  // A time within the coarse clock's margin: answered by the precise clock, so it counts as
  // reached as soon as that clock has passed it, not a tick or more later.
  for (Clock::duration ahead : {Clock::duration(50us), Clock::duration(2ms)}) {
    auto at = Clock::now() + ahead;
    while (Clock::now() < at) {
    }
    EXPECT_TRUE(reached(at)) << ahead.count();
  }
}

}  // namespace
