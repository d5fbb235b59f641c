// A rate limiter on a route (429 with Retry-After, per key, shared by limiters of one name) and
// the server's figures pushed to StatsD.
#include <gtest/gtest.h>

#include <bus/net/limiter.hpp>
#include <bus/statsd.hpp>
#include <string>

#include "endpoint/common.hpp"
#include "support/udp_listener.hpp"

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
  ASSERT_TRUE(bus_test::eventually(
      [&] { return limiter.known("carol") == 3 || elsewhere.known("carol") != 3; }));
  if (elsewhere.known("carol") != 3) GTEST_SKIP() << "a new window began during the test";
  http_test::Connection c(http.port());
  EXPECT_EQ(get(c, "/greeting/Carol", "carol").status, 429u);
}

TEST_F(Limits, TheServersFiguresGoToStatsd) {
  bus_test::UdpListener udp;
  ASSERT_TRUE(udp.bound());
  bus::StatsdExporter statsd(bus, bus::StatsdOptions().address(udp.address()).interval(1h));
  statsd.add_source(http.statsd_source());
  statsd.add_source(limiter.statsd_source());
  http_test::Connection c(http.port());
  for (int i = 0; i < 2; ++i) ASSERT_EQ(get(c, "/services/myservice/ping", "x").status, 200u);
  ASSERT_EQ(get(c, "/nope", "x").status, 404u);
  // The server counts a request once its answer is handed to the socket, which is before the
  // client reads it: wait for the count.
  ASSERT_TRUE(bus_test::eventually([&] { return http.stats().requests == 3; }));
  statsd.push();
  std::string text;
  for (const std::string& datagram : udp.take()) text += datagram + "\n";
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
