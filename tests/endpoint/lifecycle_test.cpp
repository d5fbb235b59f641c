// Stopping: shutdown() with requests in flight, the grace period, and SIGTERM under
// run_until_signal().
#include <gtest/gtest.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <functional>
#include <thread>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using http_test::Connection;

namespace {

/// True if `http.wait()` returns within `bound`. If it does not, `unblock()` is called so that
/// it can (the test then fails instead of hanging).
bool wait_returns(Server& http, std::chrono::milliseconds bound,
                  const std::function<void()>& unblock) {
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    http.wait();
    done.store(true);
  });
  bool returned = bus_test::eventually([&] { return done.load(); }, bound);
  if (!returned) unblock();
  waiter.join();
  return returned;
}

bool sigterm_handled() {
  struct sigaction sa {};
  ::sigaction(SIGTERM, nullptr, &sa);
  return sa.sa_handler != SIG_DFL;
}

/// Blocks SIGTERM on the calling thread, and so on every thread it starts meanwhile, until the
/// end of the scope. A process-directed SIGTERM then goes to the one thread that unblocks it:
/// run_until_signal()'s, which installed Asio's handler (run elsewhere, the handler reads
/// Asio's state with no ordering ThreadSanitizer can see).
class SigtermOnlyFor {
 public:
  SigtermOnlyFor() { ::pthread_sigmask(SIG_BLOCK, &set(), &old_); }
  ~SigtermOnlyFor() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  /// Called on the thread that should take SIGTERM.
  static void take_it_here() { ::pthread_sigmask(SIG_UNBLOCK, &set(), nullptr); }

 private:
  static const sigset_t& set() {
    static const sigset_t s = [] {
      sigset_t t;
      sigemptyset(&t);
      sigaddset(&t, SIGTERM);
      return t;
    }();
    return s;
  }
  sigset_t old_;
};

/// A bus whose `blocking` endpoint has one handler per executor, each waiting at the gate.
struct BlockingServices {
  Blocker blocker;
  bus::Bus bus{bus::Options().executors(2)};
  bus::Subscription s0 = bus.serve(
      blocking, [this](Tagged&& t) { return blocker(std::move(t)); }, bus::on_executor(0));
  bus::Subscription s1 = bus.serve(
      blocking, [this](Tagged&& t) { return blocker(std::move(t)); }, bus::on_executor(1));
};

void add_routes(Server& http) {
  http.route(Method::kGet, "/slow/{tag}", blocking).timeout(60s);
  http.handle(Method::kGet, "/ping", [](const Request&) { return Reply::text("pong"); });
}

}  // namespace

TEST(Shutdown, RequestsInFlightAreAnsweredWithConnectionClose) {
  BlockingServices services;
  Server http(services.bus, ServerOptions().grace(60s));
  add_routes(http);
  http.start();
  bus_test::OpenOnExit open{services.blocker.gate};
  uint16_t port = http.port();

  Connection idle(port);  // keep-alive, between requests when the server stops
  ASSERT_EQ(idle.request("GET", "/ping").status, 200u);
  Connection a(port);
  Connection b(port);
  ASSERT_TRUE(a.send("GET", "/slow/a"));
  ASSERT_TRUE(b.send("GET", "/slow/b"));
  ASSERT_TRUE(bus_test::eventually([&] { return services.blocker.entered.load() == 2; }));

  http.shutdown();
  // New connections are refused; the idle one is closed.
  EXPECT_TRUE(bus_test::eventually([&] { return !http_test::can_connect(port); }))
      << "the server still accepts connections after shutdown()";
  EXPECT_TRUE(idle.closed_by_peer());

  services.blocker.gate.open();
  auto ra = a.read();
  auto rb = b.read();
  EXPECT_EQ(ra.status, 200u) << describe(ra);
  EXPECT_EQ(ra.body, R"({"tag":"a"})");
  EXPECT_EQ(ra.header("Connection"), "close");
  EXPECT_EQ(rb.status, 200u) << describe(rb);
  EXPECT_EQ(rb.body, R"({"tag":"b"})");
  EXPECT_EQ(rb.header("Connection"), "close");
  EXPECT_TRUE(a.closed_by_peer());
  EXPECT_TRUE(b.closed_by_peer());
  EXPECT_TRUE(wait_returns(http, 30s, [] {})) << "wait() did not return after the answers";
  EXPECT_EQ(http.stats().connections_open, 0u);
}

TEST(Shutdown, WithNothingInFlightWaitReturnsAndShutdownIsIdempotent) {
  BlockingServices services;
  Server http(services.bus);
  add_routes(http);
  http.start();
  Connection idle(http.port());
  ASSERT_EQ(idle.request("GET", "/ping").status, 200u);
  http.shutdown();
  http.shutdown();
  EXPECT_TRUE(wait_returns(http, 30s, [] {}));
  EXPECT_TRUE(idle.closed_by_peer());
  EXPECT_FALSE(http_test::can_connect(http.port()));
  http.wait();  // again: returns at once
}

TEST(Shutdown, RequestStillInFlightPastTheGraceHasItsConnectionClosed) {
  BlockingServices services;
  Server http(services.bus, ServerOptions().grace(300ms));
  add_routes(http);
  http.start();
  bus_test::OpenOnExit open{services.blocker.gate};

  Connection a(http.port());
  ASSERT_TRUE(a.send("GET", "/slow/a"));
  ASSERT_TRUE(bus_test::eventually([&] { return services.blocker.entered.load() == 1; }));
  http.shutdown();
  auto r = a.read();
  EXPECT_EQ(r.status, 0u) << "answered although the handler never returned: " << describe(r);
  EXPECT_TRUE(a.closed_by_peer());
  services.blocker.gate.open();
  EXPECT_TRUE(wait_returns(http, 30s, [] {}));
}

TEST(Shutdown, WaitReturnsWhileAHandlerIsStillStuckPastTheGrace) {
  BlockingServices services;
  Server http(services.bus, ServerOptions().grace(300ms));
  add_routes(http);
  http.start();
  bus_test::OpenOnExit open{services.blocker.gate};

  Connection a(http.port());
  ASSERT_TRUE(a.send("GET", "/slow/a"));
  ASSERT_TRUE(bus_test::eventually([&] { return services.blocker.entered.load() == 1; }));
  http.shutdown();
  EXPECT_TRUE(a.closed_by_peer());
  EXPECT_TRUE(wait_returns(http, 10s, [&] { services.blocker.gate.open(); }))
      << "wait() blocked until the stuck handler was released";
}

/// Whether SIGTERM is blocked on the calling thread.
bool sigterm_blocked_here() {
  sigset_t mask;
  ::pthread_sigmask(SIG_BLOCK, nullptr, &mask);
  return sigismember(&mask, SIGTERM) == 1;
}

TEST(Shutdown, RunUntilSignalTakesSigtermOnItsOwnThreadNotOnTheThreadsItStarts) {
  ASSERT_FALSE(sigterm_handled()) << "SIGTERM already has a handler in this process";
  SigtermOnlyFor runner_only;
  bus::Bus bus;
  Server http(bus);
  std::atomic<int> io_thread{0};  // 1: SIGTERM blocked on the I/O thread that answered, 2: not
  http.handle(Method::kGet, "/mask", [&](const Request&) {
    io_thread.store(sigterm_blocked_here() ? 1 : 2);
    return Reply::text("ok");
  });
  std::atomic<int> caller{0};  // the same, on run_until_signal()'s thread once it returned
  std::thread runner([&] {
    SigtermOnlyFor::take_it_here();
    http.run_until_signal();  // starts the server: its I/O threads are started on this thread
    caller.store(sigterm_blocked_here() ? 1 : 2);
  });
  ASSERT_TRUE(bus_test::eventually(sigterm_handled)) << "run_until_signal() handles no SIGTERM";
  ASSERT_TRUE(bus_test::eventually([&] { return http.port() != 0; }));
  Connection c(http.port());
  EXPECT_EQ(c.request("GET", "/mask").status, 200u);
  EXPECT_EQ(io_thread.load(), 1) << "an I/O thread can take SIGTERM";

  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);
  EXPECT_TRUE(bus_test::eventually([&] { return caller.load() != 0; }))
      << "run_until_signal() did not return";
  if (caller.load() == 0) http.shutdown();
  runner.join();
  EXPECT_EQ(caller.load(), 2) << "run_until_signal() left SIGTERM blocked on its caller";
}

TEST(Shutdown, SigtermStopsRunUntilSignalAfterAnsweringRequestsInFlight) {
  ASSERT_FALSE(sigterm_handled()) << "SIGTERM already has a handler in this process";
  SigtermOnlyFor runner_only;  // first: the bus's and the server's threads inherit the mask
  BlockingServices services;
  Server http(services.bus, ServerOptions().grace(60s));
  add_routes(http);
  http.start();
  bus_test::OpenOnExit open{services.blocker.gate};
  uint16_t port = http.port();

  std::atomic<bool> returned{false};
  std::thread runner([&] {
    SigtermOnlyFor::take_it_here();
    http.run_until_signal();
    returned.store(true);
  });
  // SIGTERM must not reach the default action (ending the test): wait for the handler.
  ASSERT_TRUE(bus_test::eventually(sigterm_handled)) << "run_until_signal() handles no SIGTERM";

  Connection a(port);
  ASSERT_TRUE(a.send("GET", "/slow/a"));
  ASSERT_TRUE(bus_test::eventually([&] { return services.blocker.entered.load() == 1; }));
  ASSERT_EQ(::kill(::getpid(), SIGTERM), 0);

  EXPECT_TRUE(bus_test::eventually([&] { return !http_test::can_connect(port); }))
      << "SIGTERM did not stop the server accepting";
  EXPECT_FALSE(returned.load()) << "run_until_signal() returned with a request in flight";
  services.blocker.gate.open();
  auto r = a.read();
  EXPECT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"tag":"a"})");
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_TRUE(bus_test::eventually([&] { return returned.load(); }))
      << "run_until_signal() did not return";
  if (!returned.load()) http.shutdown();
  runner.join();
}

TEST(Shutdown, ShutdownFromAnotherThreadEndsRunUntilSignal) {
  BlockingServices services;
  Server http(services.bus);
  add_routes(http);
  http.start();  // here, not in the runner: shutdown() must not race with start()
  std::atomic<bool> returned{false};
  std::thread runner([&] {
    http.run_until_signal();
    returned.store(true);
  });
  ASSERT_TRUE(bus_test::eventually([&] { return sigterm_handled(); }));
  http.shutdown();
  EXPECT_TRUE(bus_test::eventually([&] { return returned.load(); }));
  runner.join();
}
