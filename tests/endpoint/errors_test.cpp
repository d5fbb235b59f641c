// Every error the server answers: its status, its JSON body {"error":..., "detail":...} with
// Content-Type application/json, and what becomes of the connection.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>

#include "endpoint/common.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using http_test::get;

namespace {

inline const bus::Endpoint<GreetingRequest, Greeting> throwing{"test.http.throwing",
                                                               bus::Overflow::kFail};

class Errors : public ::testing::Test {
 protected:
  void SetUp() override {
    http.route(Method::kGet, "/greeting/{name}", greet);
    http.route(Method::kPost, "/orders", echo);
    http.route(Method::kGet, "/nobody/{name}", nobody);
    http.route(Method::kGet, "/throws/{name}", throwing);
    http.handle(Method::kGet, "/direct-throws",
                [](const Request&) -> Reply { throw std::runtime_error("boom"); });
    http.start();
    port = http.port();
  }

  /// The answer must be JSON: Content-Type application/json and an error body.
  static void expect_json_error(const http_test::Response& r, unsigned status,
                                std::string_view error) {
    EXPECT_EQ(r.status, status) << describe(r);
    EXPECT_EQ(r.header("Content-Type"), "application/json") << describe(r);
    EXPECT_TRUE(starts_with(r.body, error_prefix(error))) << r.body;
    EXPECT_EQ(r.body.back(), '}') << r.body;
  }

  Services services;
  bus::Bus& bus = services.bus;
  bus::Subscription throwing_server = bus.serve(throwing, [](GreetingRequest&&) -> Greeting {
    throw std::runtime_error("the service failed");
  });
  Server http{bus, ServerOptions().max_body_bytes(64).max_header_bytes(1024)};
  uint16_t port = 0;
};

}  // namespace

TEST_F(Errors, MalformedHttpIsA400AndTheConnectionIsClosed) {
  http_test::Connection c(port);
  ASSERT_TRUE(c.write_raw("GET /greeting/x HTTX/1.1\r\nHost: a\r\n\r\n"));
  auto r = c.read();
  expect_json_error(r, 400, "bad_request");
  EXPECT_TRUE(contains(r.body, "malformed HTTP request")) << r.body;
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_TRUE(c.closed_by_peer());
  EXPECT_EQ(http.stats().bad_requests, 1u);
}

TEST_F(Errors, MalformedTargetIsA400) {
  http_test::Connection c(port);
  auto r = c.request("GET", "no-slash");
  expect_json_error(r, 400, "bad_request");
  EXPECT_EQ(r.body, error_json("bad_request",
                               "malformed request target: it must be a path starting with '/' in "
                               "visible ASCII (percent-encode other bytes)"));
}

TEST_F(Errors, UnknownRouteIsA404) {
  auto r = get(port, "/nope");
  expect_json_error(r, 404, "not_found");
  EXPECT_EQ(r.body, error_json("not_found", "no route for GET /nope"));
}

TEST_F(Errors, WrongMethodIsA405ListingTheAllowedOnes) {
  http_test::Connection c(port);
  auto r = c.request("DELETE", "/greeting/x");
  expect_json_error(r, 405, "method_not_allowed");
  EXPECT_EQ(r.header("Allow"), "GET, HEAD");
  EXPECT_EQ(r.body, error_json("method_not_allowed",
                               "DELETE is not allowed on /greeting/x (allowed: GET, HEAD)"));
  auto post_only = c.request("GET", "/orders");
  expect_json_error(post_only, 405, "method_not_allowed");
  EXPECT_EQ(post_only.header("Allow"), "POST");
}

TEST_F(Errors, RoutingErrorsKeepTheConnectionAlive) {
  http_test::Connection c(port);
  uint16_t local = c.local_port();
  EXPECT_EQ(c.request("GET", "/nope").status, 404u);
  EXPECT_EQ(c.request("PUT", "/greeting/x").status, 405u);
  EXPECT_EQ(c.request("POST", "/orders", "[]").status, 400u);
  auto r = c.request("GET", "/greeting/again");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"message":"Hello again"})");
  EXPECT_EQ(c.local_port(), local);
  EXPECT_EQ(http.stats().connections_accepted, 1u);
}

TEST_F(Errors, BodyOverTheLimitIsA413AndTheConnectionIsClosed) {
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", std::string(200, ' '));
  expect_json_error(r, 413, "payload_too_large");
  EXPECT_EQ(r.body, error_json("payload_too_large", "the body exceeds 64 bytes"));
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_TRUE(c.closed_by_peer());
}

TEST_F(Errors, BodyOfExactlyTheLimitIsAccepted) {
  std::string body = R"({"customer":")";
  body += std::string(64 - body.size() - 2, 'c') + R"("})";
  ASSERT_EQ(body.size(), 64u);
  http_test::Connection c(port);
  auto r = c.request("POST", "/orders", body);
  EXPECT_EQ(r.status, 200u) << describe(r);
  auto over = c.request("POST", "/orders", body + " ");
  EXPECT_EQ(over.status, 413u) << describe(over);
}

TEST_F(Errors, ChunkedBodyOverTheLimitIsA413) {
  http_test::Connection c(port);
  std::string chunk(50, 'x');
  ASSERT_TRUE(
      c.write_raw("POST /orders HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "32\r\n" +
                  chunk + "\r\n32\r\n" + chunk + "\r\n0\r\n\r\n"));
  auto r = c.read();
  expect_json_error(r, 413, "payload_too_large");
}

TEST_F(Errors, HeadersOverTheLimitAreA431AndTheConnectionIsClosed) {
  http_test::Connection c(port);
  auto r = c.request("GET", "/greeting/x", "", {{"X-Padding", std::string(2000, 'p')}});
  expect_json_error(r, 431, "header_fields_too_large");
  EXPECT_EQ(r.body, error_json("header_fields_too_large",
                               "the request line and headers exceed 1024 bytes"));
  EXPECT_EQ(r.header("Connection"), "close");
  EXPECT_TRUE(c.closed_by_peer());
}

TEST_F(Errors, RouteToAnEndpointNobodyServesIsA503) {
  auto r = get(port, "/nobody/x");
  expect_json_error(r, 503, "unavailable");
}

TEST_F(Errors, HandlerThatThrowsIsA500) {
  auto r = get(port, "/throws/x");
  expect_json_error(r, 500, "internal");
  EXPECT_EQ(get(port, "/greeting/after").status, 200u);
}

TEST_F(Errors, DirectHandlerThatThrowsIsA500) {
  auto r = get(port, "/direct-throws");
  expect_json_error(r, 500, "internal");
  EXPECT_EQ(r.body, error_json("internal", "the handler threw: boom"));
}

TEST_F(Errors, UnknownMethodIsA501) {
  http_test::Connection c(port);
  auto r = c.request("BREW", "/greeting/x");
  expect_json_error(r, 501, "not_implemented");
  EXPECT_EQ(r.body, error_json("not_implemented", "method BREW is not served"));
  // Not fatal for the connection.
  EXPECT_EQ(c.request("GET", "/greeting/x").status, 200u);
}

TEST(DeadlineErrors, HandlerSlowerThanTheRouteTimeoutIsA504) {
  Blocker blocker;
  bus::Bus bus{bus::Options().executors(1)};
  bus::Subscription sub = bus.serve(blocking, [&](Tagged&& t) { return blocker(std::move(t)); });
  Server http(bus);
  // Long enough that a loaded run hands the request to the handler before it expires.
  http.route(Method::kGet, "/slow/{tag}", blocking).timeout(1s);
  http.start();
  bus_test::OpenOnExit open{blocker.gate};  // before ~Server: see lifecycle_test

  auto r = get(http.port(), "/slow/a");
  EXPECT_EQ(r.status, 504u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_TRUE(starts_with(r.body, error_prefix("deadline_exceeded"))) << r.body;
  EXPECT_EQ(blocker.entered.load(), 1);
  blocker.gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return blocker.left.load() == 1; }));
}

TEST(DeadlineErrors, ServerDeadlineAppliesWhenTheRouteSetsNone) {
  Blocker blocker;
  bus::Bus bus{bus::Options().executors(1)};
  bus::Subscription sub = bus.serve(blocking, [&](Tagged&& t) { return blocker(std::move(t)); });
  Server http(bus, ServerOptions().deadline(1s));
  http.route(Method::kGet, "/slow/{tag}", blocking);
  http.start();
  bus_test::OpenOnExit open{blocker.gate};  // before ~Server: see lifecycle_test

  auto r = get(http.port(), "/slow/a");
  EXPECT_EQ(r.status, 504u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, error_prefix("deadline_exceeded"))) << r.body;
  // Let the handler go before the server stops (see ShutdownWithAHandlerStuckPastTheGrace...).
  blocker.gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return blocker.left.load() == 1; }));
}

TEST(Replies, HeaderFieldsThatWouldInjectOrOverrideTheServersAreNotSent) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.handle(Method::kGet, "/h", [](const Request&) {
    Reply r = Reply::text("body");
    r.headers = {{"X-Kept", "yes"},       {"X-Injected", "a\r\nSet-Cookie: stolen=1"},
                 {"Bad\r\nName", "v"},    {"Content-Length", "999"},
                 {"connection", "close"}, {"Retry-After", "7"}};
    return r;
  });
  http.start();

  http_test::Connection c(http.port());
  auto r = c.request("GET", "/h");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, "body");
  EXPECT_EQ(r.header("X-Kept"), "yes");
  EXPECT_EQ(r.header("Retry-After"), "7");
  EXPECT_FALSE(r.has_header("X-Injected"));
  EXPECT_FALSE(r.has_header("Set-Cookie"));
  EXPECT_EQ(r.header("Content-Length"), "4");
  EXPECT_FALSE(r.has_header("Connection"));
  // The connection is still framed right and open.
  EXPECT_EQ(c.request("GET", "/h").body, "body");
}

TEST(Replies, NoContentHasNeitherBodyNorContentLength) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.handle(Method::kGet, "/none", [](const Request&) {
    return Reply{204, "text/plain", "dropped", {}};
  });
  http.handle(Method::kGet, "/after", [](const Request&) { return Reply::text("after"); });
  http.start();

  http_test::Connection c(http.port());
  ASSERT_TRUE(c.send("GET", "/none"));
  ASSERT_TRUE(c.send("GET", "/after"));
  auto r = c.read();
  EXPECT_EQ(r.status, 204u) << describe(r);
  EXPECT_EQ(r.body, "");
  EXPECT_FALSE(r.has_header("Content-Length"));
  auto next = c.read();  // framed right: the next response follows at once
  EXPECT_EQ(next.status, 200u) << describe(next);
  EXPECT_EQ(next.body, "after");
}

TEST(Replies, StatusOutsideTheHttpRangeIsA500) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.handle(Method::kGet, "/odd", [](const Request&) {
    return Reply{1000, "text/plain", "x", {}};
  });
  http.start();

  auto r = get(http.port(), "/odd");
  EXPECT_EQ(r.status, 500u) << describe(r);
  EXPECT_EQ(r.body, error_json("internal",
                               "the route answered with status 1000, which is not an HTTP status "
                               "code"));
}
