// Request/reply: every request gets its reply or a status, on the caller's own executor.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <functional>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::Gate;
using bus_test::OpenOnExit;

inline const bus::Endpoint<std::string, std::string> greet{"request_test.greet"};
inline const bus::Endpoint<int, int> slow{"request_test.slow"};
inline const bus::Endpoint<int, int> thrower{"request_test.thrower"};
inline const bus::Endpoint<int, int> refuser{"request_test.refuser"};
inline const bus::Endpoint<int, int> nobody{"request_test.nobody"};
inline const bus::Topic<int> kick{"request_test.kick"};
inline const bus::Endpoint<int, int> silent{"request_test.silent"};
inline const bus::Endpoint<int, int> held_up{"request_test.held_up"};
inline const bus::Topic<int> filler{"request_test.filler", bus::Overflow::kFail};

TEST(Request, BlockingCallReturnsTheReply) {
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(greet, [](std::string&& name) { return "Hello " + name; });
  absl::StatusOr<std::string> r = bus.call(greet, std::string("Sergio"), 5s);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(*r, "Hello Sergio");
}

TEST(Request, ReplyCallbackRunsOnTheRequestersExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto server = bus.serve(
      greet, [](std::string&& n) { return n + "!"; }, bus::on_executor(2));
  std::atomic<int> where{-1};
  std::atomic<bool> done{false};
  std::string got;
  auto sub = bus.subscribe(
      kick,
      [&](const int&) {
        bus.request(greet, std::string("hi"), 5s, [&](absl::StatusOr<std::string> r) {
          where = static_cast<int>(bus.current_executor().value_or(99));
          got = r.value_or("error");
          done = true;
        });
      },
      bus::on_executor(1));
  ASSERT_TRUE(bus.publish(kick, 1).ok());
  while (!done.load()) std::this_thread::yield();
  EXPECT_EQ(where.load(), 1);
  EXPECT_EQ(got, "hi!");
}

// A request is latency-bound: it leaves at once, not when the handler batch that made it ends.
TEST(Request, ARequestFromAHandlerLeavesBeforeTheHandlerReturns) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<bool> served{false};
  auto server = bus.serve(
      greet,
      [&](std::string&& n) {
        served = true;
        return n;
      },
      bus::on_executor(1));
  std::atomic<bool> seen_inside{false};
  std::atomic<bool> done{false};
  auto sub = bus.subscribe(
      kick,
      [&](const int&) {
        bus.request(greet, std::string("now"), 5s, [&](absl::StatusOr<std::string> r) {
          EXPECT_EQ(r.value_or("error"), "now");
          done = true;
        });
        // Still inside the handler: the server must get the request without this one returning.
        seen_inside = bus_test::eventually([&] { return served.load(); });
      },
      bus::on_executor(0));
  ASSERT_TRUE(bus.publish(kick, 1).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return done.load(); }));
  EXPECT_TRUE(seen_inside.load());
}

TEST(Request, DeadlineFiresAndTheLateReplyIsDroppedAndCounted) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<bool> release{false};
  auto server = bus.serve(
      slow,
      [&](int&& v) {
        while (!release.load()) std::this_thread::yield();
        return v;
      },
      bus::on_executor(1));
  std::atomic<int> code{-1};
  std::atomic<int> callbacks{0};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         // Long enough that a loaded run still starts the handler in time
                         // (a request that expires first is answered by the server instead,
                         // which can beat this caller's timer: then no reply is late).
                         bus.request(slow, 7, 1s, [&](absl::StatusOr<int> r) {
                           callbacks++;
                           code = static_cast<int>(r.status().code());
                         });
                       })
                  .ok());
  while (code.load() < 0) std::this_thread::yield();
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  release = true;
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(callbacks.load(), 1) << "the late reply does not call back a second time";
  EXPECT_EQ(bus.stats().channel("request_test.slow")->late_replies, 1u);
}

TEST(Request, BlockingCallTimesOutInsteadOfHanging) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<bool> release{false};
  auto server = bus.serve(slow, [&](int&& v) {
    while (!release.load()) std::this_thread::yield();
    return v;
  });
  // Long enough that even a loaded sanitizer run hands the request to the handler before it
  // expires (an expired one is answered by the server, which could beat the caller's own timer
  // and leave no late reply to count).
  absl::StatusOr<int> r = bus.call(slow, 1, 1s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded);
  release = true;
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(bus.stats().channel("request_test.slow")->late_replies, 1u);
}

TEST(Request, ThrowingHandlerYieldsInternalStatusNotACrash) {
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(thrower, [](int&&) -> int { throw std::runtime_error("disk on fire"); });
  absl::StatusOr<int> r = bus.call(thrower, 1, 5s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(std::string(r.status().message()).find("disk on fire"), std::string::npos);
  // The executor is alive: the next request is served.
  auto again = bus.call(thrower, 1, 5s);
  EXPECT_EQ(again.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(bus.stats().channel("request_test.thrower")->handler_failed, 2u);
}

TEST(Request, HandlerMayAnswerWithAStatus) {
  bus::Bus bus(bus::Options().executors(1));
  auto server = bus.serve(refuser, [](int&& v) -> absl::StatusOr<int> {
    if (v < 0) return absl::InvalidArgumentError("negative");
    return v * 2;
  });
  EXPECT_EQ(*bus.call(refuser, 21, 5s), 42);
  EXPECT_EQ(bus.call(refuser, -1, 5s).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Request, NoHandlerIsUnavailableAtOnce) {
  bus::Bus bus(bus::Options().executors(2));
  EXPECT_EQ(bus.call(nobody, 1, 1h).status().code(), absl::StatusCode::kUnavailable);
  std::atomic<int> code{-1};
  bus.request(nobody, 1, 1h,
              [&](absl::StatusOr<int> r) { code = static_cast<int>(r.status().code()); });
  while (code.load() < 0) std::this_thread::yield();
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST(Request, CallFromAnExecutorIsRefusedRatherThanBlocking) {
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(greet, [](std::string&& n) { return n; });
  std::atomic<int> code{-1};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         code = static_cast<int>(
                             bus.call(greet, std::string("x"), 1s).status().code());
                       })
                  .ok());
  while (code.load() < 0) std::this_thread::yield();
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
}

TEST(Request, ManyConcurrentRequestsAllComplete) {
  bus::Bus bus(bus::Options().executors(3));
  auto s1 = bus.serve(refuser, [](int&& v) -> absl::StatusOr<int> { return v * 2; });
  auto s2 = bus.serve(refuser, [](int&& v) -> absl::StatusOr<int> { return v * 2; });
  std::atomic<long> sum{0};
  std::atomic<int> done{0};
  constexpr int kN = 20000;
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         for (int i = 0; i < kN; ++i) {
                           bus.request(refuser, int{i}, 30s, [&](absl::StatusOr<int> r) {
                             sum += r.value_or(-1000000);
                             done++;
                           });
                         }
                       })
                  .ok());
  while (done.load() < kN) std::this_thread::yield();
  EXPECT_EQ(sum.load(), 2L * (kN - 1) * kN / 2);
}

TEST(Request, DeadlinesExpireInTheirOwnOrderWhateverOrderRepliesComeIn) {
  // Even requests are answered at once and have a long deadline; odd ones are held and have a
  // short one, so answered requests' deadlines sit behind pending ones that expire first.
  bus::Bus bus(bus::Options().executors(2));
  std::mutex mu;
  std::vector<bus::Replier<int>> held;
  auto server = bus.serve_async(
      slow,
      [&](int&& v, bus::Replier<int> reply) {
        if (v % 2 == 0) {
          reply(v + 1);
          return;
        }
        std::lock_guard lock(mu);
        held.push_back(std::move(reply));
      },
      bus::on_executor(1));
  constexpr int kN = 1000;
  std::atomic<int> callbacks{0}, answered{0}, expired{0}, wrong{0};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         for (int i = 0; i < kN; ++i) {
                           auto timeout = i % 2 == 0 ? std::chrono::milliseconds(60'000)
                                                     : std::chrono::milliseconds(30 + i % 7);
                           bus.request(slow, int{i}, timeout, [&, i](absl::StatusOr<int> r) {
                             if (r.ok()) {
                               answered++;
                               wrong += (i % 2 != 0 || *r != i + 1);
                             } else {
                               expired++;
                               wrong += (i % 2 == 0 ||
                                         r.status().code() != absl::StatusCode::kDeadlineExceeded);
                             }
                             callbacks++;
                           });
                         }
                       })
                  .ok());
  while (callbacks.load() < kN) std::this_thread::yield();
  EXPECT_EQ(answered.load(), kN / 2);
  EXPECT_EQ(expired.load(), kN / 2);
  EXPECT_EQ(wrong.load(), 0);
  // An odd request may expire before the server has even taken it (a slow run, a sanitizer):
  // the server then answers DeadlineExceeded without running the handler and counts it expired.
  // Wait until every odd one is either held or counted so, then answer the held ones, too late.
  auto expired_at_server = [&] { return bus.stats().channel("request_test.slow")->expired; };
  std::size_t n_held = 0;
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    n_held = held.size();
    return n_held + expired_at_server() == std::size_t{kN / 2};
  }));
  {
    std::lock_guard lock(mu);
    for (auto& r : held) r(0);  // too late: counted, not called back
    held.clear();
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(callbacks.load(), kN);
  // Every held answer is late; a server-side expiry is late too unless it beat the caller's own
  // timer (then it was the callback's DeadlineExceeded, checked above).
  uint64_t late = bus.stats().channel("request_test.slow")->late_replies;
  EXPECT_GE(late, n_held);
  EXPECT_LE(late, uint64_t{kN / 2});
  EXPECT_EQ(expired_at_server(), uint64_t{kN / 2} - n_held);
}

TEST(Request, AnEarlyPendingRequestOutlivesManyAnsweredOnesBehindIt) {
  // Request 0 is held; 2,000 more, one after another, are answered at once with later
  // deadlines. Their entries pile up behind request 0's and are swept out as they grow; request
  // 0 must still be pending, and answered, at the end.
  bus::Bus bus(bus::Options().executors(2));
  std::optional<bus::Replier<int>> held;
  std::atomic<bool> holding{false};
  auto server = bus.serve_async(
      slow,
      [&](int&& v, bus::Replier<int> reply) {
        if (v == 0) {
          held.emplace(std::move(reply));
          holding = true;
          return;
        }
        reply(v + 1);
      },
      bus::on_executor(1));
  constexpr int kN = 2000;
  std::atomic<int> first{-1}, chain_done{0}, wrong{0};
  std::function<void(int)> next = [&](int i) {
    bus.request(slow, int{i}, std::chrono::seconds(120), [&, i](absl::StatusOr<int> r) {
      wrong += (!r.ok() || *r != i + 1);
      if (i < kN) {
        next(i + 1);
      } else {
        chain_done = 1;
      }
    });
  };
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         bus.request(slow, 0, std::chrono::seconds(60),
                                     [&](absl::StatusOr<int> r) { first = r.ok() ? *r : -2; });
                         next(1);
                       })
                  .ok());
  while (chain_done.load() == 0 || !holding.load()) std::this_thread::yield();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(first.load(), -1);  // still pending
  ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { (*held)(42); }).ok());
  while (first.load() == -1) std::this_thread::yield();
  EXPECT_EQ(first.load(), 42);
  ASSERT_TRUE(bus.stop().ok());
}

/// Serves `slow` on executor 1 by keeping each request's replier, unanswered, in `held` (touched
/// on executor 1 only); `holding` counts them.
struct HeldReplies {
  std::vector<bus::Replier<int>> held;
  std::atomic<int> holding{0};
  bus::Subscription serve(bus::Bus& bus) {
    return bus.serve_async(
        slow,
        [this](int&& v, bus::Replier<int> reply) {
          (void)v;
          held.push_back(std::move(reply));
          holding++;
        },
        bus::on_executor(1));
  }
};

TEST(Request, ALateReplyNeverAnswersTheRequestThatTookItsPlace) {
  // Request A expires; request B, made in A's callback, takes the pending-request slot A left.
  // A's reply then comes, late: it is counted as late, and B gets its own reply, not A's.
  bus::Bus bus(bus::Options().executors(2));
  HeldReplies replies;
  auto server = replies.serve(bus);
  auto& held = replies.held;
  auto& holding = replies.holding;
  std::atomic<int> a_calls{0}, a_code{-1}, b_value{-1};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         // Long enough that a loaded run still starts the handler in time.
                         bus.request(slow, 1, 1s, [&](absl::StatusOr<int> r) {
                           a_calls++;
                           a_code = static_cast<int>(r.status().code());
                           bus.request(slow, 2, 60s, [&](absl::StatusOr<int> rb) {
                             b_value = rb.ok() ? *rb : -2;
                           });
                         });
                       })
                  .ok());
  ASSERT_TRUE(bus_test::eventually([&] { return holding.load() == 2; }, 30s));
  EXPECT_EQ(a_code.load(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { held[0](100); }).ok());  // A's, late
  ASSERT_TRUE(bus_test::eventually(
      [&] { return bus.stats().channel("request_test.slow")->late_replies == 1; }, 30s));
  EXPECT_EQ(b_value.load(), -1) << "A's late reply must not answer B";
  ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { held[1](200); }).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return b_value.load() != -1; }, 30s));
  EXPECT_EQ(b_value.load(), 200);
  EXPECT_EQ(a_calls.load(), 1);
  ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { held.clear(); }).ok());
  ASSERT_TRUE(bus.stop().ok());
}

TEST(Request, RequestsPastTheLimitOfPendingOnesAreRefusedThroughTheirCallback) {
  bus::Bus bus(bus::Options().executors(2).max_pending_requests(3));
  HeldReplies replies;
  auto server = replies.serve(bus);
  auto& held = replies.held;
  auto& holding = replies.holding;
  std::mutex mu;
  std::vector<std::pair<int, absl::StatusOr<int>>> results;
  auto request = [&](int i) {
    bus.request(slow, int{i}, 60s, [&, i](absl::StatusOr<int> r) {
      std::lock_guard lock(mu);
      results.emplace_back(i, std::move(r));
    });
  };
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         for (int i = 0; i < 5; ++i) request(i);
                       })
                  .ok());
  // Three are pending; the fourth and fifth are refused (on executor 0, after request()).
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    return holding.load() == 3 && results.size() == 2;
  }));
  {
    std::lock_guard lock(mu);
    for (auto& [i, r] : results) {
      EXPECT_GE(i, 3);
      EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
      EXPECT_NE(r.status().message().find("max_pending_requests"), std::string::npos);
    }
  }
  EXPECT_EQ(bus.stats().channel("request_test.slow")->failed, 2u);
  // Answering one frees its place: the next request is sent.
  ASSERT_TRUE(bus.post(bus::on_executor(1), [&] { held[0](10); }).ok());
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    return results.size() == 3;
  }));
  ASSERT_TRUE(bus.post(bus::on_executor(0), [&] { request(5); }).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return holding.load() == 4; }));
  ASSERT_TRUE(bus.post(bus::on_executor(1),
                       [&] {
                         for (std::size_t k = 1; k < held.size(); ++k) held[k](static_cast<int>(k));
                       })
                  .ok());
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    return results.size() == 6;
  }));
  std::lock_guard lock(mu);
  for (auto& [i, r] : results) {
    if (i < 3 || i == 5) EXPECT_TRUE(r.ok()) << i << ": " << r.status();
  }
}

TEST(Request, StopEndsAPendingCallWithCancelled) {
  // The server keeps every request unanswered: only stop() can end the call before its deadline.
  bus_test::Watchdog watchdog("a call pending across stop()", 120s);
  std::mutex mu;
  std::vector<bus::Replier<int>> kept;
  std::atomic<int> received{0};
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve_async(silent, [&](int&&, bus::Replier<int> reply) {
    std::lock_guard lock(mu);
    kept.push_back(std::move(reply));
    received++;
  });
  absl::StatusOr<int> result = absl::UnknownError("not returned");
  std::atomic<bool> returned{false};
  std::thread caller([&] {
    result = bus.call(silent, 1, std::chrono::hours(1));
    returned = true;
  });
  ASSERT_TRUE(bus_test::eventually([&] { return received.load() == 1; }));
  ASSERT_TRUE(bus.stop().ok());
  caller.join();
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  std::lock_guard lock(mu);
  kept.clear();  // answering after the stop reaches nobody and is harmless
}

TEST(Request, ACallEndsByItsDeadlineWhenTheServersRingIsFull) {
  // The server's executor is held, and this thread's ring to it is full: the call must not wait
  // for room past its deadline (the gate opens only after the call has returned, or after the
  // watchdog's bound when it hangs).
  bus_test::Watchdog watchdog("a call waiting for ring room", 120s);
  Gate gate;
  std::atomic<bool> handler_ran{false};
  bus::Bus bus(bus::Options().executors(2).ring_bytes(512));
  auto hold = bus.subscribe(
      filler, [&](const int&) { gate.wait(); }, bus::on_executor(0));
  auto server = bus.serve(
      held_up,
      [&](int&& v) {
        handler_ran = true;
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  int accepted = 0;
  while (bus.publish(filler, accepted).ok()) ++accepted;  // the fail policy: until it is full
  ASSERT_GT(accepted, 0);
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int> r = bus.call(held_up, i, 20ms);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded) << r.status();
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_FALSE(handler_ran.load()) << "the requests never entered the ring";
  const bus::Stats stats = bus.stats();
  const auto* c = stats.channel("request_test.held_up");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->published, 3u);
  EXPECT_EQ(c->failed, 3u) << "a request refused for want of room by its deadline is failed";
}

TEST(Request, ARequestFromAPlainThreadEndsByItsDeadlineWhenTheRingIsFull) {
  // request() from a plain thread hands the request to an executor through this thread's ring:
  // with that ring full, the callback still runs by the deadline.
  bus_test::Watchdog watchdog("a request waiting for ring room", 120s);
  Gate gate;
  bus::Bus bus(bus::Options().executors(1).ring_bytes(512));
  auto hold = bus.subscribe(
      filler, [&](const int&) { gate.wait(); }, bus::on_executor(0));
  auto server = bus.serve(
      held_up, [](int&& v) { return v; }, bus::on_executor(0));
  OpenOnExit open_on_exit{gate};
  int accepted = 0;
  while (bus.publish(filler, accepted).ok()) ++accepted;
  std::atomic<int> code{-1};
  bus.request(held_up, 1, 20ms,
              [&](absl::StatusOr<int> r) { code = static_cast<int>(r.status().code()); });
  ASSERT_TRUE(bus_test::eventually([&] { return code.load() >= 0; }));
  EXPECT_EQ(code.load(), static_cast<int>(absl::StatusCode::kDeadlineExceeded));
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
}

}  // namespace
