// GET /health and GET /metrics, in one process and with a bridge node attached.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bus/http/websocket.hpp>
#include <bus/net/node.hpp>
#include <bus/statsd.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "endpoint/common.hpp"
#include "endpoint/ws_client.hpp"
#include "support/udp_listener.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using http_test::get;

namespace {

constexpr const char* kPromtool = "/usr/bin/promtool";

struct PromtoolResult {
  bool ran = false;
  int exit_code = -1;
  std::string output;
};

/// `promtool check metrics < file` on `text`.
PromtoolResult promtool_check(const std::string& text) {
  PromtoolResult out;
  char path[] = "/tmp/bus-endpoint-metrics-XXXXXX";
  int fd = ::mkstemp(path);
  if (fd < 0) {
    out.output = "mkstemp failed";
    return out;
  }
  ::close(fd);
  {
    std::ofstream f(path, std::ios::binary);
    f << text;
  }
  std::string cmd = std::string(kPromtool) + " check metrics < " + path + " 2>&1";
  if (FILE* p = ::popen(cmd.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.output.append(buf, n);
    int status = ::pclose(p);
    out.ran = true;
    out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  ::unlink(path);
  return out;
}

void expect_promtool_accepts(const std::string& text) {
  if (::access(kPromtool, X_OK) != 0) {
    FAIL() << kPromtool << " is missing: install the Debian package 'prometheus' "
           << "(apt-get install -y prometheus; scripts/test.sh does)";
  }
  PromtoolResult r = promtool_check(text);
  ASSERT_TRUE(r.ran) << r.output;
  EXPECT_EQ(r.exit_code, 0) << "promtool check metrics rejected /metrics:\n"
                            << r.output << "\n--- the text ---\n"
                            << text;
}

/// A health timeout far above what a free executor needs, even on a loaded machine.
ServerOptions healthy_options() { return ServerOptions().health_timeout(20s); }

std::string hex_id(uint64_t id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

}  // namespace

// ---- /health --------------------------------------------------------------------------------

TEST(Health, OkListsExecutorsAndEachRoutesEndpointWithItsHandlers) {
  Services services;
  bus::Subscription second_greeter = services.bus.serve(greet, hello, bus::on_executor(1));
  Server http(services.bus, healthy_options());
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.route(Method::kGet, "/services/myservice/ping", ping);
  http.handle(Method::kGet, "/direct", [](const Request&) { return Reply::text("d"); });
  http.start();

  auto r = get(http.port(), "/health");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body,
            R"({"status":"ok",)"
            R"("executors":[{"index":0,"alive":true},{"index":1,"alive":true}],)"
            R"("services":[)"
            R"({"route":"GET /greeting/{name}","endpoint":"test.http.greet","handlers":2},)"
            R"({"route":"GET /services/myservice/ping","endpoint":"test.http.ping","handlers":1}],)"
            R"("bridge":{"enabled":false}})");
}

TEST(Health, RouteWithNoHandlerIsUnavailable) {
  Services services;
  Server http(services.bus, healthy_options());
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.route(Method::kGet, "/nobody/{name}", nobody);
  http.start();

  auto r = get(http.port(), "/health");
  ASSERT_EQ(r.status, 503u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_TRUE(starts_with(r.body, R"({"status":"unavailable",)")) << r.body;
  EXPECT_TRUE(contains(
      r.body, R"({"route":"GET /nobody/{name}","endpoint":"test.http.nobody","handlers":0})"))
      << r.body;
  EXPECT_TRUE(contains(
      r.body, R"({"route":"GET /greeting/{name}","endpoint":"test.http.greet","handlers":1})"))
      << r.body;
}

TEST(Health, FollowsHandlersComingAndGoing) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus, healthy_options());
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();
  EXPECT_EQ(get(http.port(), "/health").status, 503u);
  {
    bus::Subscription greeter = bus.serve(greet, hello);
    auto r = get(http.port(), "/health");
    EXPECT_EQ(r.status, 200u) << describe(r);
    EXPECT_TRUE(starts_with(r.body, R"({"status":"ok",)")) << r.body;
  }
  auto r = get(http.port(), "/health");
  EXPECT_EQ(r.status, 503u) << describe(r);
  EXPECT_TRUE(contains(r.body, R"("handlers":0)")) << r.body;
}

TEST(Health, ExecutorStuckInAHandlerIsReportedDead) {
  bus_test::Gate gate;  // outlives the bus: the executor waits here
  std::atomic<bool> stuck{false};
  Services services;
  Server http(services.bus, ServerOptions().health_timeout(2s));
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();
  bus_test::OpenOnExit open{gate};  // before ~Server, which waits for every executor
  ASSERT_TRUE(services.bus
                  .post(bus::on_executor(1),
                        [&] {
                          stuck.store(true);
                          gate.wait();
                        })
                  .ok());
  ASSERT_TRUE(bus_test::eventually([&] { return stuck.load(); }));

  auto r = get(http.port(), "/health");
  ASSERT_EQ(r.status, 503u) << describe(r);
  EXPECT_TRUE(starts_with(
      r.body,
      R"({"status":"unavailable","executors":[{"index":0,"alive":true},{"index":1,"alive":false}],)"))
      << r.body;

  gate.open();
  // Once it is free again, it answers the next probe.
  EXPECT_TRUE(bus_test::eventually([&] { return get(http.port(), "/health").status == 200; }));
}

// ---- /metrics -------------------------------------------------------------------------------

TEST(Metrics, CountRequestsByRouteAndCodeWithLatencyAndBusCounters) {
  Services services;
  Server http(services.bus);
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.route(Method::kPost, "/orders", echo);
  http.start();
  uint16_t port = http.port();

  ASSERT_EQ(get(port, "/greeting/a").status, 200u);
  ASSERT_EQ(get(port, "/greeting/b").status, 200u);
  ASSERT_EQ(get(port, "/nope").status, 404u);
  ASSERT_EQ(http_test::request(port, {"DELETE", "/greeting/a", {}, {}}).status, 405u);
  ASSERT_EQ(http_test::request(port, {"POST", "/orders", "[]", {}}).status, 400u);
  ASSERT_EQ(http_test::request(port, {"POST", "/orders", R"({"id":3})", {}}).status, 200u);

  // The clients closed their connections; the server notices on its own time.
  ASSERT_TRUE(bus_test::eventually([&] { return http.stats().connections_open == 0; }));
  auto m = get(port, "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  ASSERT_TRUE(m.header("Content-Type").has_value());
  EXPECT_TRUE(starts_with(*m.header("Content-Type"), "text/plain")) << *m.header("Content-Type");
  const std::string& t = m.body;

  EXPECT_EQ(
      metric(t, R"(bus_http_requests_total{method="GET",route="/greeting/{name}",code="200"})"), 2);
  EXPECT_EQ(metric(t, R"(bus_http_requests_total{method="POST",route="/orders",code="200"})"), 1);
  EXPECT_EQ(metric(t, R"(bus_http_requests_total{method="POST",route="/orders",code="400"})"), 1);
  EXPECT_EQ(metric(t, R"m(bus_http_requests_total{method="",route="(unmatched)",code="404"})m"), 1);
  EXPECT_EQ(metric(t, R"m(bus_http_requests_total{method="",route="(unmatched)",code="405"})m"), 1);
  EXPECT_EQ(
      metric(t, R"(bus_http_requests_total{method="GET",route="/greeting/{name}",code="404"})"),
      -1);

  EXPECT_TRUE(contains(t, "# TYPE bus_http_request_duration_seconds histogram\n")) << t;
  EXPECT_EQ(
      metric(
          t,
          R"(bus_http_request_duration_seconds_bucket{method="GET",route="/greeting/{name}",le="+Inf"})"),
      2);
  EXPECT_EQ(
      metric(t,
             R"(bus_http_request_duration_seconds_count{method="GET",route="/greeting/{name}"})"),
      2);
  EXPECT_GT(
      metric(t, R"(bus_http_request_duration_seconds_sum{method="GET",route="/greeting/{name}"})"),
      0);

  EXPECT_EQ(metric(t, "bus_http_connections_accepted_total"), 7);
  EXPECT_EQ(metric(t, "bus_http_connections_open"), 1);  // the /metrics request's own
  EXPECT_EQ(metric(t, "bus_http_bad_requests_total"), 0);

  // The bus's counters for the endpoints the routes called.
  EXPECT_TRUE(contains(t, "\nbus_channel_published_total{channel=\"test.http.greet\",")) << t;
  EXPECT_TRUE(contains(t, "\nbus_channel_delivered_total{channel=\"test.http.echo\",")) << t;
  EXPECT_TRUE(contains(t, "\nbus_inbox_depth_bytes{inbox=\"0\",kind=\"executor\"}")) << t;

  expect_promtool_accepts(t);
}

const bus::Topic<Tagged> ws_news{"test.ws.metrics"};

TEST(Metrics, WebSocketBridgeCountersAreExposed) {
  Services services;
  Server http(services.bus);
  http.websocket().topic(ws_news).permit(bus::http::Permit::kSubscribe, "test.ws.metrics");
  http.start();
  ws_test::Client c(http.port());
  c.send_text(R"({"op":"sub","channel":"test.ws.metrics"})");
  ASSERT_TRUE(c.next_json()) << c.error();  // subscribed
  c.send_text(R"({"op":"pub","channel":"test.ws.metrics","body":{"tag":"x"}})");
  ASSERT_TRUE(c.next_json()) << c.error();  // forbidden: publishing is not permitted
  c.send_text("not json");
  ASSERT_TRUE(c.next_json()) << c.error();  // an error frame

  auto m = get(http.port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  const std::string& t = m.body;
  bus::http::WebSocketStats s = http.websocket_stats();
  EXPECT_EQ(metric(t, "bus_ws_connections_open"), 1) << t;
  EXPECT_EQ(metric(t, "bus_ws_connections_accepted_total"), 1) << t;
  EXPECT_EQ(metric(t, "bus_ws_frames_in_total"), 3) << t;
  EXPECT_EQ(metric(t, "bus_ws_refused_total"), 1) << t;
  EXPECT_EQ(metric(t, "bus_ws_bad_frames_total"), 1) << t;
  EXPECT_EQ(metric(t, "bus_ws_messages_out_total"), 3) << t;
  EXPECT_EQ(metric(t, "bus_ws_messages_out_total"), static_cast<double>(s.messages_out)) << t;
  EXPECT_EQ(metric(t, "bus_ws_dropped_total"), 0) << t;
  EXPECT_TRUE(contains(t, "# TYPE bus_ws_queued_bytes gauge\n")) << t;
  expect_promtool_accepts(t);

  // The same figures go to StatsD.
  bus_test::UdpListener udp;
  ASSERT_TRUE(udp.bound());
  bus::StatsdExporter statsd(services.bus,
                             bus::StatsdOptions().address(udp.address()).interval(1h));
  statsd.add_source(http.statsd_source());
  statsd.push();
  std::string text;
  for (const std::string& datagram : udp.take()) text += datagram + "\n";
  EXPECT_TRUE(contains(text, "bus.ws.refused:1|c")) << text;
  EXPECT_TRUE(contains(text, "bus.ws.bad_frames:1|c")) << text;
  EXPECT_TRUE(contains(text, "bus.ws.connections_open:1|g")) << text;

  // A server without a bridge shows none of them.
  Server plain(services.bus);
  plain.start();
  EXPECT_FALSE(contains(get(plain.port(), "/metrics").body, "bus_ws_"));
}

TEST(Metrics, EmptyServerPassesPromtool) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus);
  http.start();
  auto m = get(http.port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  expect_promtool_accepts(m.body);
}

TEST(Metrics, RefusedRequestLatencyIsMeasuredFromItsArrival) {
  bus::Bus bus{bus::Options().executors(1)};
  Server http(bus, ServerOptions().max_header_bytes(512));
  http.start();
  auto r =
      http_test::request(http.port(), {"GET", "/metrics", {}, {{"X-Big", std::string(1024, 'b')}}});
  ASSERT_EQ(r.status, 431u) << describe(r);
  auto m = get(http.port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  const std::string& t = m.body;
  EXPECT_EQ(metric(t, R"m(bus_http_requests_total{method="",route="(unmatched)",code="431"})m"), 1);
  EXPECT_EQ(
      metric(t, R"m(bus_http_request_duration_seconds_count{method="",route="(unmatched)"})m"), 1);
  // Answered at once: a sane sample lands in a finite bucket and adds well under an hour.
  EXPECT_EQ(
      metric(
          t,
          R"m(bus_http_request_duration_seconds_bucket{method="",route="(unmatched)",le="10"})m"),
      1)
      << t;
  EXPECT_LT(metric(t, R"m(bus_http_request_duration_seconds_sum{method="",route="(unmatched)"})m"),
            3600)
      << t;
}

// ---- a bridged route ------------------------------------------------------------------------

namespace {

bus::net::NodeOptions local_node(const char* name) {
  return bus::net::NodeOptions()
      .name(name)
      .publish_on("tcp://127.0.0.1:*")
      .requests_on("tcp://127.0.0.1:*")
      .heartbeat(50ms, 40);
}

}  // namespace

TEST(Bridge, RouteIsAnsweredThroughTheBridgeAndHealthListsThePeer) {
  bus::Bus service_bus{bus::Options().executors(1)};
  bus::Bus front_bus{bus::Options().executors(1)};
  bus::net::Node service_node{service_bus, local_node("svc")};
  bus::net::Node front_node{front_bus, local_node("front")};
  service_node.peer(front_node.publish_address());
  front_node.peer(service_node.publish_address());
  bus::Subscription greeter = service_bus.serve(greet, hello);
  service_node.export_endpoint(greet);
  front_node.import_endpoint(greet);
  ASSERT_TRUE(front_node.wait_for_server(greet.name(), 10s));

  Server http(front_bus, healthy_options().node(&front_node));
  http.route(Method::kGet, "/greeting/{name}", greet);
  http.start();

  auto r = get(http.port(), "/greeting/Bridge");
  ASSERT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.body, R"({"message":"Hello Bridge"})");

  auto h = get(http.port(), "/health");
  ASSERT_EQ(h.status, 200u) << describe(h);
  EXPECT_TRUE(starts_with(h.body, R"({"status":"ok",)")) << h.body;
  EXPECT_TRUE(contains(
      h.body, R"({"route":"GET /greeting/{name}","endpoint":"test.http.greet","handlers":1})"))
      << h.body;
  EXPECT_TRUE(
      contains(h.body, R"("bridge":{"enabled":true,"node":")" + hex_id(front_node.id()) +
                           R"(","peers":[{"id":")" + hex_id(service_node.id()) +
                           R"(","name":"svc","serves":["test.http.greet"],"sinceHeartbeatMs":")"))
      << h.body;

  auto m = get(http.port(), "/metrics");
  ASSERT_EQ(m.status, 200u) << describe(m);
  EXPECT_EQ(metric(m.body, "bus_bridge_peers"), 1);
  EXPECT_TRUE(contains(m.body, "\nbus_bridge_sent_total{channel=\"test.http.greet\",peer=\"svc\","))
      << m.body;
  expect_promtool_accepts(m.body);
}
