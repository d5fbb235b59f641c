// A rate limiter on a route (429 with Retry-After, per key, shared by limiters of one name) and
// the server's figures pushed to StatsD.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bus/net/limiter.hpp>
#include <bus/statsd.hpp>
#include <string>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;

namespace {

std::string api_key(const Request& r) { return std::string(r.header("X-Api-Key").value_or("")); }

class Limits : public ::testing::Test {
 protected:
  void SetUp() override {
    http.route(Method::kGet, "/greeting/{name}", greet).limit(limiter, api_key);
    http.route(Method::kGet, "/services/myservice/ping", ping);  // not limited
    http.start();
  }
  http_test::Response get(http_test::Connection& c, std::string target, std::string key) {
    return c.request("GET", std::move(target), "", {{"X-Api-Key", std::move(key)}});
  }

  Services services;
  bus::Bus& bus = services.bus;
  // A window of an hour: the test's requests all fall in one (unless one begins meanwhile,
  // which the tests below allow for).
  bus::net::RateLimiter limiter{bus, "http-test",
                                bus::net::LimiterOptions().limit(3).window(3'600'000ms)};
  Server http{bus, ServerOptions()};
};

TEST_F(Limits, OverTheLimitIsA429WithRetryAfterAndNeverReachesTheBus) {
  http_test::Connection c(http.port());
  int ok = 0;
  http_test::Response refused;
  for (int i = 0; i < 5; ++i) {
    auto r = get(c, "/greeting/Sergio", "alice");
    if (r.status == 200) {
      EXPECT_EQ(r.body, R"({"message":"Hello Sergio"})");
      ++ok;
    } else {
      refused = r;
    }
  }
  if (ok > 3) GTEST_SKIP() << "a new window began during the test";
  EXPECT_EQ(ok, 3);
  EXPECT_EQ(refused.status, 429u) << describe(refused);
  EXPECT_TRUE(starts_with(refused.body, error_prefix("too_many_requests"))) << refused.body;
  EXPECT_TRUE(contains(refused.body, "rate limit 'http-test'")) << refused.body;
  ASSERT_TRUE(refused.header("Retry-After").has_value()) << describe(refused);
  int after = std::stoi(*refused.header("Retry-After"));
  EXPECT_GE(after, 1);
  EXPECT_LE(after, 3600);
  // The refused requests did not reach the greeting service.
  EXPECT_EQ(bus.stats().channel("test.http.greet")->delivered, 3u);
  EXPECT_EQ(limiter.stats().refused, 2u);
  // The connection stays usable, another key has its own count, other routes are not limited.
  EXPECT_EQ(get(c, "/greeting/Bob", "bob").status, 200u);
  EXPECT_EQ(get(c, "/services/myservice/ping", "alice").status, 200u);
}

TEST_F(Limits, LimitersOfOneNameShareTheCount) {
  // A second limiter of the same name (another node, as far as counts go) has admitted 3 for
  // "carol": once its counts arrive, this server refuses her.
  bus::net::RateLimiter elsewhere{bus, "http-test",
                                  bus::net::LimiterOptions().limit(3).window(3'600'000ms)};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(elsewhere.admit("carol").admitted);
  elsewhere.exchange();
  while (limiter.known("carol") < 3 && elsewhere.known("carol") == 3) {
    std::this_thread::sleep_for(1ms);
  }
  if (elsewhere.known("carol") != 3) GTEST_SKIP() << "a new window began during the test";
  http_test::Connection c(http.port());
  EXPECT_EQ(get(c, "/greeting/Carol", "carol").status, 429u);
}

/// A UDP socket on 127.0.0.1 with a kernel-chosen port.
struct Udp {
  Udp() {
    fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ~Udp() { ::close(fd); }
  std::string take() {
    std::string all;
    char buf[65536];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 0) == 1) {
      ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      all.append(buf, static_cast<std::size_t>(n));
      all += '\n';
    }
    return all;
  }
  int fd = -1;
  uint16_t port = 0;
};

TEST_F(Limits, TheServersFiguresGoToStatsd) {
  Udp udp;
  bus::StatsdExporter statsd(
      bus, bus::StatsdOptions().address("127.0.0.1:" + std::to_string(udp.port)).interval(1h));
  statsd.add_source(http.statsd_source());
  statsd.add_source(limiter.statsd_source());
  http_test::Connection c(http.port());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(get(c, "/services/myservice/ping", "x").status, 200u);
  ASSERT_EQ(get(c, "/nope", "x").status, 404u);
  // The server counts a request once its answer is handed to the socket, which is before the
  // client reads it: wait for the count.
  while (http.stats().requests < 3) std::this_thread::sleep_for(1ms);
  statsd.push();
  std::string text = udp.take();
  EXPECT_TRUE(contains(text, "bus.http.requests.GET.services_myservice_ping.200:2|c")) << text;
  EXPECT_TRUE(contains(text, "bus.http.requests.unmatched.404:1|c")) << text;
  EXPECT_TRUE(contains(text, "bus.http.latency.GET.services_myservice_ping:")) << text;
  EXPECT_TRUE(contains(text, "|ms|@0.5")) << text;  // two requests: one mean, rate 1/2
  EXPECT_TRUE(contains(text, "bus.http.connections.accepted:1|c")) << text;
  EXPECT_TRUE(contains(text, "bus.http.connections.open:1|g")) << text;
  EXPECT_TRUE(contains(text, "bus.channel.test.http.ping.delivered:2|c")) << text;
  EXPECT_TRUE(contains(text, "bus.limiter.http-test.keys:")) << text;
}

}  // namespace
