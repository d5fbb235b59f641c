// What the endpoint tests share: the channels they route to, the services behind them, and
// helpers for the JSON the server writes.
#pragma once

#include <absl/status/statusor.h>
#include <bus/schemas/greeting.capnp.h>
#include <endpoint_test/test.capnp.h>

#include <atomic>
#include <bus/bus.hpp>
#include <bus/http/server.hpp>
#include <bus/message.hpp>
#include <stdexcept>
#include <string>
#include <string_view>

#include "endpoint/client.hpp"
#include "support/test_support.hpp"

namespace endpoint_test_support {

using GreetingRequest = bus::Message<greeting::GreetingRequest>;
using Greeting = bus::Message<greeting::Greeting>;
using PingRequest = bus::Message<greeting::PingRequest>;
using PingReply = bus::Message<greeting::PingReply>;
using Order = bus::Message<endpoint_test::Order>;
using Tagged = bus::Message<endpoint_test::Tagged>;

using bus::http::Method;
using bus::http::Reply;
using bus::http::Request;
using bus::http::Server;
using bus::http::ServerOptions;

// Served over HTTP, so kFail: a full ring fails at once instead of blocking an I/O thread.
inline const bus::Endpoint<GreetingRequest, Greeting> greet{"test.http.greet",
                                                            bus::Overflow::kFail};
inline const bus::Endpoint<PingRequest, PingReply> ping{"test.http.ping", bus::Overflow::kFail};
/// Answers the order it was sent: the reply shows how the request was filled.
inline const bus::Endpoint<Order, Order> echo{"test.http.echo", bus::Overflow::kFail};
/// Its handlers wait at a gate the test opens.
inline const bus::Endpoint<Tagged, Tagged> blocking{"test.http.blocking", bus::Overflow::kFail};
/// Never served: a route to it has no handler.
inline const bus::Endpoint<GreetingRequest, Greeting> nobody{"test.http.nobody",
                                                             bus::Overflow::kFail};

inline Greeting hello(GreetingRequest&& req) {
  return bus::build<greeting::Greeting>([&](greeting::Greeting::Builder b) {
    b.setMessage(std::string("Hello ") + req->getName().cStr());
  });
}

inline PingReply pong(PingRequest&&) {
  return bus::build<greeting::PingReply>(
      [](greeting::PingReply::Builder b) { b.initGreetings(1).set(0, "Hello World!"); });
}

inline Tagged tagged(std::string_view tag) {
  return bus::build<endpoint_test::Tagged>(
      [&](endpoint_test::Tagged::Builder b) { b.setTag(std::string(tag)); });
}

/// A bus with the greeting and echo services (each on its executor).
struct Services {
  bus::Bus bus{bus::Options().executors(2)};
  bus::Subscription greeting = bus.serve(greet, hello, bus::on_executor(0));
  bus::Subscription pinging = bus.serve(ping, pong, bus::on_executor(0));
  bus::Subscription echoing = bus.serve(
      echo, [](Order&& o) { return std::move(o); }, bus::on_executor(1));
};

/// Handlers of `blocking` that count who entered and wait at `gate` until the test opens it.
struct Blocker {
  bus_test::Gate gate;
  std::atomic<int> entered{0};
  std::atomic<int> left{0};

  Tagged operator()(Tagged&& t) {
    entered.fetch_add(1);
    gate.wait();
    left.fetch_add(1);
    return std::move(t);
  }
};

/// The body of every error reply: {"error":..., "detail":...} (compact, in schema order).
inline std::string error_json(std::string_view error, std::string_view detail) {
  return std::string(R"({"error":")") + std::string(error) + R"(","detail":")" +
         std::string(detail) + R"("})";
}

/// `{"error":"<error>",` : the start of an error body whose detail varies.
inline std::string error_prefix(std::string_view error) {
  return std::string(R"({"error":")") + std::string(error) + R"(","detail":")";
}

inline bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

inline bool contains(std::string_view s, std::string_view part) {
  return s.find(part) != std::string_view::npos;
}

/// One response described for failure messages.
inline std::string describe(const http_test::Response& r) {
  std::string out = "status " + std::to_string(r.status);
  if (!r.error.empty()) out += " (" + r.error + ")";
  for (const auto& [k, v] : r.headers) out += "\n  " + k + ": " + v;
  out += "\n  body: " + r.body;
  return out;
}

/// The value of one sample line of the Prometheus text (`name{labels}` exactly as written), or
/// -1 if absent.
inline double metric(std::string_view text, std::string_view series) {
  std::size_t at = 0;
  while ((at = text.find(series, at)) != std::string_view::npos) {
    bool line_start = at == 0 || text[at - 1] == '\n';
    std::size_t after = at + series.size();
    if (line_start && after < text.size() && text[after] == ' ') {
      std::size_t end = text.find('\n', after);
      return std::stod(std::string(text.substr(after + 1, end - after - 1)));
    }
    at = after;
  }
  return -1;
}

}  // namespace endpoint_test_support
