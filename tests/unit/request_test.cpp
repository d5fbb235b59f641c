// Request/reply: every request gets its reply or a status, on the caller's own executor.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

using namespace std::chrono_literals;

inline const bus::Endpoint<std::string, std::string> greet{"request_test.greet"};
inline const bus::Endpoint<int, int> slow{"request_test.slow"};
inline const bus::Endpoint<int, int> thrower{"request_test.thrower"};
inline const bus::Endpoint<int, int> refuser{"request_test.refuser"};
inline const bus::Endpoint<int, int> nobody{"request_test.nobody"};
inline const bus::Topic<int> kick{"request_test.kick"};

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
                         bus.request(slow, 7, 20ms, [&](absl::StatusOr<int> r) {
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
  absl::StatusOr<int> r = bus.call(slow, 1, 20ms);
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

}  // namespace
