// Connections: keep-alive, pipelining, the read/idle timeouts, the body limit, many concurrent
// connections, the connection cap and several I/O threads.
#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using http_test::Connection;
using http_test::get;

TEST(Connections, KeepAliveConnectionServesManyRequests) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.connected()) << c.connect_error();
  uint16_t local = c.local_port();
  for (int i = 0; i < 20; ++i) {
    auto r = c.request("GET", "/greeting/n" + std::to_string(i));
    ASSERT_EQ(r.status, 200u) << "request " << i << ": " << describe(r);
    EXPECT_EQ(r.body, R"({"message":"Hello n)" + std::to_string(i) + R"("})");
    EXPECT_NE(r.header("Connection"), "close");
  }
  EXPECT_EQ(c.local_port(), local);  // one TCP connection throughout
  EXPECT_EQ(http.stats().connections_accepted, 1u);
  EXPECT_EQ(http.stats().requests, 20u);
}

TEST(Connections, PipelinedRequestsAreAnsweredInOrder) {
  Services services;  // greet runs on executor 0, echo on executor 1
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.route(Method::kGet, "/orders/{id}", echo);
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.send("GET", "/greeting/one"));
  ASSERT_TRUE(c.send("GET", "/orders/2"));
  ASSERT_TRUE(c.send("GET", "/nope"));
  ASSERT_TRUE(c.send("HEAD", "/greeting/four"));
  ASSERT_TRUE(c.send("GET", "/greeting/five"));
  auto r1 = c.read();
  auto r2 = c.read();
  auto r3 = c.read();
  auto r4 = c.read(/*head=*/true);
  auto r5 = c.read();
  EXPECT_EQ(r1.status, 200u) << describe(r1);
  EXPECT_EQ(r1.body, R"({"message":"Hello one"})");
  EXPECT_EQ(r2.status, 200u) << describe(r2);
  EXPECT_TRUE(starts_with(r2.body, R"({"id":2,)")) << r2.body;
  EXPECT_EQ(r3.status, 404u) << describe(r3);
  EXPECT_EQ(r4.status, 200u) << describe(r4);
  EXPECT_EQ(r4.header("Content-Length"),
            std::to_string(std::string(R"({"message":"Hello four"})").size()));
  EXPECT_EQ(r5.status, 200u) << describe(r5);
  EXPECT_EQ(r5.body, R"({"message":"Hello five"})");
  EXPECT_EQ(http.stats().connections_accepted, 1u);
}

TEST(Connections, SlowHeaderClientIsClosed) {
  Services services;
  Server http(services.bus, ServerOptions().read_timeout(300ms));
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.connected());
  // A byte every 100 ms: the request would take seconds to arrive.
  bool wrote_all =
      c.write_slowly("GET /greeting/slow HTTP/1.1\r\nHost: a\r\nX-Slow: yes\r\n\r\n", 100ms);
  EXPECT_FALSE(wrote_all) << "the server let a trickling client finish its request";
  EXPECT_TRUE(c.closed_by_peer());
  EXPECT_FALSE(contains(c.received(), "200 OK")) << c.received();
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_timed_out == 1; }))
      << "timed out: " << http.stats().connections_timed_out;
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
  // The server itself is fine.
  EXPECT_EQ(get(http.port(), "/greeting/fast").status, 200u);
}

TEST(Connections, IdleKeepAliveConnectionIsClosedAfterTheIdleTimeout) {
  Services services;
  Server http(services.bus, ServerOptions().idle_timeout(300ms));
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  auto r = c.request("GET", "/greeting/idle");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_NE(r.header("Connection"), "close");
  EXPECT_TRUE(c.closed_by_peer()) << "an idle keep-alive connection stayed open";
  EXPECT_TRUE(c.received().empty()) << c.received();
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_timed_out == 1; }));
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
}

TEST(Connections, OversizedBodyIsRefusedWhileOtherClientsAreServed) {
  Services services;
  Server http(services.bus, ServerOptions().max_body_bytes(1024));
  http.route(Method::kPost, "/orders", echo);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection other(http.port());
  ASSERT_EQ(other.request("GET", "/greeting/before").status, 200u);

  Connection big(http.port());
  auto r =
      big.request("POST", "/orders", R"({"customer":")" + std::string(64 * 1024, 'x') + R"("})");
  EXPECT_EQ(r.status, 413u) << describe(r);
  EXPECT_EQ(r.body, error_json("payload_too_large", "the body exceeds 1024 bytes"));
  EXPECT_TRUE(big.closed_by_peer());

  // The connection that was open meanwhile, and a new one, are still served.
  auto again = other.request("GET", "/greeting/after");
  EXPECT_EQ(again.status, 200u) << describe(again);
  EXPECT_EQ(again.body, R"({"message":"Hello after"})");
  auto fresh = get(http.port(), "/greeting/fresh");
  EXPECT_EQ(fresh.status, 200u) << describe(fresh);
  Connection small(http.port());
  auto fits = small.request("POST", "/orders", R"({"customer":"short"})");
  EXPECT_EQ(fits.status, 200u) << describe(fits);
  EXPECT_EQ(http.stats().bad_requests, 1u);
}

TEST(Connections, ClientAskingToCloseGetsConnectionCloseAndIsClosed) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  auto r = c.request("GET", "/greeting/bye", "", {{"Connection", "close"}});
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(Connections, RequestSlowerThanTheReadAndIdleTimeoutsIsStillAnswered) {
  Blocker blocker;
  bus::Bus bus{bus::Options().executors(1)};
  bus::Subscription sub = bus.serve(blocking, [&](Tagged&& t) { return blocker(std::move(t)); });
  Server http(bus, ServerOptions().read_timeout(100ms).idle_timeout(100ms));
  http.route(Method::kGet, "/slow/{tag}", blocking).timeout(60s);
  http.start();
  bus_test::OpenOnExit open{blocker.gate};

  Connection c(http.port());
  // Connection: close, so that once answered it is closed as asked, not timed out idle before
  // the count below is read.
  ASSERT_TRUE(c.send("GET", "/slow/patient", "", {{"Connection", "close"}}));
  ASSERT_TRUE(bus_test::eventually([&] { return blocker.entered.load() == 1; }));
  // A witness connection that stays idle: once the sweep has closed it, the idle and read
  // timeouts have passed for the working connection too, which the sweep must leave alone.
  {
    Connection witness(http.port());
    ASSERT_TRUE(bus_test::eventually([&] { return http.stats().connections_timed_out == 1; }));
  }
  blocker.gate.open();
  auto r = c.read();
  EXPECT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"tag":"patient"})");
  EXPECT_EQ(http.stats().connections_timed_out, 1u);  // the witness only
}

TEST(Connections, RequestsOverMaxInFlightWaitTheirTurnAndAreAllAnswered) {
  Blocker blocker;
  bus::Bus bus{bus::Options().executors(3)};
  auto handler = [&](Tagged&& t) { return blocker(std::move(t)); };
  bus::Subscription s0 = bus.serve(blocking, handler, bus::on_executor(0));
  bus::Subscription s1 = bus.serve(blocking, handler, bus::on_executor(1));
  bus::Subscription s2 = bus.serve(blocking, handler, bus::on_executor(2));
  Server http(bus, ServerOptions().max_in_flight(2));
  http.route(Method::kGet, "/slow/{tag}", blocking).timeout(60s);
  http.start();
  bus_test::OpenOnExit open{blocker.gate};

  constexpr int kClients = 5;
  std::vector<Connection> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back(http.port());
    ASSERT_TRUE(clients.back().send("GET", "/slow/t" + std::to_string(i)));
  }
  ASSERT_TRUE(bus_test::eventually([&] { return blocker.entered.load() == 2; }));
  // Three executors could take three: the other three requests wait for a turn instead.
  ASSERT_TRUE(bus_test::eventually([&] { return http.stats().requests_waiting == 3; }));
  EXPECT_EQ(blocker.entered.load(), 2);
  blocker.gate.open();
  for (int i = 0; i < kClients; ++i) {
    auto r = clients[i].read();
    EXPECT_EQ(r.status, 200u) << describe(r);
    EXPECT_EQ(r.body, R"({"tag":"t)" + std::to_string(i) + R"("})");
  }
  EXPECT_EQ(blocker.left.load(), kClients);
}

TEST(Connections, ClientNotReadingItsResponseIsClosedAfterTheWriteTimeout) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus, ServerOptions().write_timeout(300ms));
  // Far more than the socket buffers of both ends hold.
  http.handle(Method::kGet, "/huge",
              [](const Request&) { return Reply::text(std::string(64 << 20, 'h')); });
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.send("GET", "/huge"));
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_timed_out == 1; }))
      << "a client that takes nothing kept its connection";
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
  std::string got = c.read_all();
  EXPECT_LT(got.size(), std::size_t{64 << 20});
}

TEST(Connections, Http10RequestIsAnsweredAndClosed) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.write_raw("GET /greeting/old HTTP/1.0\r\n\r\n"));
  auto r = c.read();
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"message":"Hello old"})");
  EXPECT_TRUE(c.closed_by_peer());
}

TEST(Connections, ClientVanishingMidRequestLeavesTheServerHealthy) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();
  {
    Connection c(http.port());
    ASSERT_TRUE(c.write_raw("GET /greeting/half HTTP/1.1\r\nHo"));
  }
  {
    Connection c(http.port());
    ASSERT_TRUE(c.write_raw("POST /orders HTTP/1.1\r\nContent-Length: 100\r\n\r\n{\"id\":"));
  }
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
  EXPECT_EQ(get(http.port(), "/greeting/whole").status, 200u);
}

TEST(Connections, ThousandConcurrentConnectionsAreAllServed) {
  constexpr int kThreads = 4;
  constexpr int kPerThread = 250;
  constexpr int kTotal = kThreads * kPerThread;
  uint64_t limit = http_test::raise_fd_limit();
  ASSERT_GE(limit, 2 * kTotal + 100u) << "RLIMIT_NOFILE's hard limit is too low for this test";

  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();
  uint16_t port = http.port();

  std::latch connected(kThreads);
  std::latch go(1);
  std::atomic<int> served{0};
  std::mutex mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string what) {
    std::lock_guard lock(mu);
    failures.push_back(std::move(what));
  };
  std::vector<std::thread> clients;
  for (int t = 0; t < kThreads; ++t) {
    clients.emplace_back([&, t] {
      std::vector<Connection> conns;
      conns.reserve(kPerThread);
      for (int i = 0; i < kPerThread; ++i) {
        conns.emplace_back(port);
        if (!conns.back().connected()) fail("connect: " + conns.back().connect_error());
      }
      connected.count_down();
      go.wait();  // every connection is open at once
      for (int i = 0; i < kPerThread; ++i) {
        std::string name = "c" + std::to_string(t) + "_" + std::to_string(i);
        if (!conns[i].send("GET", "/greeting/" + name)) fail("send " + name);
      }
      for (int i = 0; i < kPerThread; ++i) {
        std::string name = "c" + std::to_string(t) + "_" + std::to_string(i);
        auto r = conns[i].read();
        if (r.status == 200 && r.body == R"({"message":"Hello )" + name + R"("})") {
          served.fetch_add(1);
        } else {
          fail(name + ": " + describe(r));
        }
      }
    });
  }
  connected.wait();
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == kTotal; }))
      << "open: " << http.stats().connections_open;
  go.count_down();
  for (auto& t : clients) t.join();

  EXPECT_EQ(served.load(), kTotal);
  std::lock_guard lock(mu);
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, first: " << failures.front();
  EXPECT_EQ(http.stats().connections_accepted, static_cast<uint64_t>(kTotal));
  EXPECT_EQ(http.stats().connections_refused, 0u);
}

TEST(Connections, ConnectionOverTheCapGetsA503) {
  Services services;
  Server http(services.bus, ServerOptions().max_connections(2));
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection a(http.port());
  Connection b(http.port());
  ASSERT_EQ(a.request("GET", "/greeting/a").status, 200u);
  ASSERT_EQ(b.request("GET", "/greeting/b").status, 200u);

  Connection c(http.port());
  auto r = c.request("GET", "/greeting/c");
  EXPECT_EQ(r.status, 503u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_EQ(r.body, error_json("unavailable", "too many connections; try again later"));
  EXPECT_TRUE(c.closed_by_peer());
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_refused == 1; }));
  EXPECT_EQ(http.stats().connections_accepted, 2u);

  // The connections within the cap are unaffected; a freed slot is taken again.
  EXPECT_EQ(a.request("GET", "/greeting/a2").status, 200u);
  b.close();
  ASSERT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 1; }));
  Connection d(http.port());
  auto rd = d.request("GET", "/greeting/d");
  EXPECT_EQ(rd.status, 200u) << describe(rd);
  EXPECT_EQ(http.stats().connections_refused, 1u);
}

TEST(Connections, TwoIoThreadsBothServeRequests) {
  Services services;
  Server http(services.bus, ServerOptions().io_threads(2));
  http.handle(Method::kGet, "/who", [](const Request&) {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof name);
    return Reply::text(name);
  });
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  constexpr int kConnections = 200;
  std::set<std::string> threads;
  int served = 0;
  for (int i = 0; i < kConnections; ++i) {
    Connection c(http.port());
    auto who = c.request("GET", "/who");
    auto hello = c.request("GET", "/greeting/t" + std::to_string(i));
    ASSERT_EQ(who.status, 200u) << describe(who);
    threads.insert(who.body);
    // The bus reply comes back to the I/O thread that made the request.
    if (hello.status == 200 &&
        hello.body == R"({"message":"Hello t)" + std::to_string(i) + R"("})") {
      ++served;
    } else {
      ADD_FAILURE() << describe(hello);
    }
  }
  EXPECT_EQ(served, kConnections);
  EXPECT_EQ(threads, (std::set<std::string>{"bus-http-0", "bus-http-1"}));
  EXPECT_EQ(http.stats().connections_accepted, static_cast<uint64_t>(kConnections));

  auto m = get(http.port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  EXPECT_EQ(metric(m.body, R"(bus_http_requests_total{method="GET",route="/who",code="200"})"),
            kConnections);
  EXPECT_EQ(metric(m.body,
                   R"(bus_http_requests_total{method="GET",route="/greeting/{name}",code="200"})"),
            kConnections);
}

TEST(Connections, ReplyLargerThanTheSocketBuffersArrivesWholeAndTheConnectionGoesOn) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  // 16 MiB: the server's writes fill the socket and resume when the client has read some.
  std::string big(16 << 20, 'x');
  for (std::size_t i = 0; i < big.size(); i += 4096)
    big[i] = static_cast<char>('a' + i / 4096 % 26);
  http.handle(Method::kGet, "/big", [&big](const Request&) { return Reply::text(big); });
  http.handle(Method::kGet, "/small", [](const Request&) { return Reply::text("small"); });
  http.start();

  Connection c(http.port());
  for (int i = 0; i < 2; ++i) {
    auto r = c.request("GET", "/big");
    ASSERT_EQ(r.status, 200u) << describe(r);
    EXPECT_EQ(r.body.size(), big.size());
    EXPECT_TRUE(r.body == big) << "the body arrived changed";
  }
  auto r = c.request("GET", "/small");
  EXPECT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, "small");
  EXPECT_EQ(http.stats().connections_accepted, 1u);
}

TEST(Connections, ManyPipelinedRequestsInOneWriteAreAllAnsweredInOrder) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  // Answered on the I/O thread at once: each answer is written before the next request is read.
  http.handle(Method::kGet, "/n/{i}",
              [](const Request& r) { return Reply::text(std::string(*r.param("i"))); });
  http.start();

  constexpr int kRequests = 2000;
  std::string burst;
  for (int i = 0; i < kRequests; ++i) {
    burst += "GET /n/" + std::to_string(i) + " HTTP/1.1\r\nHost: x\r\n\r\n";
  }
  Connection c(http.port());
  ASSERT_TRUE(c.write_raw(burst));
  for (int i = 0; i < kRequests; ++i) {
    auto r = c.read();
    ASSERT_EQ(r.status, 200u) << "request " << i << ": " << describe(r);
    ASSERT_EQ(r.body, std::to_string(i));
  }
  EXPECT_EQ(http.stats().requests, static_cast<uint64_t>(kRequests));
}

TEST(Connections, ClientThatEndsItsSideAfterTheRequestStillGetsTheAnswer) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  Connection c(http.port());
  ASSERT_TRUE(c.send("GET", "/greeting/last"));
  c.shutdown_send();
  auto r = c.read();
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"message":"Hello last"})");
  EXPECT_TRUE(c.closed_by_peer());  // and then the server closes its side
  EXPECT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
}
