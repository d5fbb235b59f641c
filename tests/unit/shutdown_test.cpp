// stop() stops intake and drains: nothing accepted is lost, nothing waits forever.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <mutex>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

inline const bus::Topic<long> events{"shutdown_test.events"};
inline const bus::Queue<long> relay{"shutdown_test.relay"};
inline const bus::Endpoint<long, long> echo{"shutdown_test.echo"};

TEST(Shutdown, MessagesInFlightAtStopAreAllDelivered) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<long> got{0};
  auto sub = bus.subscribe(events, [&](const long&) {
    got++;
    std::this_thread::yield();  // a slow subscriber: the rings are full when stop() begins
  });
  std::atomic<long> accepted{0};
  std::atomic<bool> go{true};
  std::vector<std::thread> producers;
  for (int t = 0; t < 3; ++t) {
    producers.emplace_back([&] {
      while (go.load()) {
        if (bus.publish(events, 1L).ok()) {
          accepted++;
        } else {
          break;  // refused after stop(): that is the only way a publish fails here
        }
      }
    });
  }
  while (accepted.load() < 20000) std::this_thread::yield();
  ASSERT_TRUE(bus.stop().ok());
  go = false;
  for (auto& t : producers) t.join();
  EXPECT_EQ(got.load(), accepted.load());
  EXPECT_EQ(bus.publish(events, 1L).code(), absl::StatusCode::kUnavailable);
}

TEST(Shutdown, WorkThatExecutorsSendOnDuringTheDrainIsDelivered) {
  bus::Bus bus(bus::Options().executors(3));
  std::atomic<long> hops{0};
  auto a = bus.consume(relay, [&](long&& n) {
    hops++;
    if (n > 0) ASSERT_TRUE(bus.send(relay, n - 1).ok());
  });
  auto b = bus.consume(relay, [&](long&& n) {
    hops++;
    if (n > 0) ASSERT_TRUE(bus.send(relay, n - 1).ok());
  });
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.send(relay, 999L).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(hops.load(), 100 * 1000);
}

TEST(Shutdown, PendingRequestsAreReportedNotLost) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<int> replies{0}, statuses{0};
  auto server = bus.serve(
      echo, [](long&& v) { return v; }, bus::on_executor(1));
  for (int i = 0; i < 1000; ++i) {
    bus.request(echo, long{i}, std::chrono::seconds(30), [&](absl::StatusOr<long> r) {
      if (r.ok()) {
        replies++;
      } else {
        statuses++;
      }
    });
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(replies.load() + statuses.load(), 1000) << "every callback ran exactly once";
}

TEST(Shutdown, WhatAnExecutorSendsAfterItsLoopEndedIsRefused) {
  // An executor needs no look at the bus's state per send while it runs its loop; after it,
  // stop() answers its pending requests (Cancelled) and what those callbacks send is refused.
  std::mutex mu;
  std::vector<bus::Replier<long>> held;  // never answered before the stop
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<long> got{0};
  auto sub = bus.subscribe(events, [&](const long&) { got++; });
  auto server = bus.serve_async(
      echo,
      [&](long&&, bus::Replier<long> reply) {
        std::lock_guard lock(mu);
        held.push_back(std::move(reply));
      },
      bus::on_executor(1));
  std::atomic<int> answer{-1}, sent{-1}, during{-1};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         during = static_cast<int>(bus.publish(events, 1L).code());
                         bus.request(echo, 1L, std::chrono::seconds(60),
                                     [&](absl::StatusOr<long> r) {
                                       sent = static_cast<int>(bus.publish(events, 2L).code());
                                       answer = static_cast<int>(r.status().code());
                                     });
                       })
                  .ok());
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    return held.size() == 1;
  }));
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(during.load(), static_cast<int>(absl::StatusCode::kOk));
  EXPECT_EQ(answer.load(), static_cast<int>(absl::StatusCode::kCancelled));
  EXPECT_EQ(sent.load(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(got.load(), 1) << "the message sent in the loop was delivered";
}

TEST(Shutdown, StopIsIdempotentAndDestructionStops) {
  auto bus = std::make_unique<bus::Bus>(bus::Options().executors(2));
  std::atomic<long> got{0};
  auto sub = bus->subscribe(events, [&](const long&) { got++; });
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(bus->publish(events, 1L).ok());
  ASSERT_TRUE(bus->stop().ok());
  ASSERT_TRUE(bus->stop().ok());
  bus.reset();
  EXPECT_EQ(got.load(), 1000);
}

TEST(Shutdown, StopFromAnExecutorIsRefused) {
  bus::Bus bus(bus::Options().executors(1));
  std::atomic<int> code{-1};
  ASSERT_TRUE(
      bus.post(bus::on_executor(0), [&] { code = static_cast<int>(bus.stop().code()); }).ok());
  while (code.load() < 0) std::this_thread::yield();
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
}

TEST(Shutdown, ThreadsThatExitLeaveNothingBehind) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<long> got{0};
  auto sub = bus.subscribe(events, [&](const long&) { got++; });
  for (int round = 0; round < 50; ++round) {
    std::thread t([&] {
      for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.publish(events, 1L).ok());
    });
    t.join();
  }
  // Consumers free the rings of exited threads once they are empty (they are woken for it).
  auto rings = [&] {
    uint32_t n = 0;
    for (auto& in : bus.stats().inboxes) n += in.rings;
    return n;
  };
  EXPECT_TRUE(bus_test::eventually([&] { return rings() <= 10; })) << rings() << " rings left";
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got.load(), 5000);
  // The counts of exited threads stay.
  EXPECT_EQ(bus.stats().channel("shutdown_test.events")->published, 5000u);
}

}  // namespace
