// The endpoint's counters and the Prometheus text exposition of them plus the bus's and the
// bridge's. No Beast here.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bus/http/websocket.hpp"
#include "bus/net/stats.hpp"
#include "bus/stats.hpp"
#include "bus/statsd.hpp"

namespace bus::http::detail {

/// Latency histogram bounds, in seconds.
inline constexpr std::array<double, 16> kLatencyBounds = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
    0.05,   0.1,     0.25,   0.5,   1,      2.5,   5,    10};

/// Adds to a counter that only one thread writes (no locked read-modify-write); readers on other
/// threads load it relaxed and see some recent value.
inline void bump(std::atomic<uint64_t>& c, uint64_t by = 1) {
  c.store(c.load(std::memory_order_relaxed) + by, std::memory_order_relaxed);
}

/// One route's answers on one I/O thread: written by that thread only.
struct RouteCounters {
  std::array<std::atomic<uint64_t>, 500> by_status{};                      // [status - 100]
  std::array<std::atomic<uint64_t>, kLatencyBounds.size() + 1> latency{};  // last: over 10 s
  std::atomic<uint64_t> latency_ns{0};

  void record(unsigned status, std::chrono::steady_clock::duration took);
};

/// One I/O thread's connection counters: written by that thread only.
struct IoCounters {
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> refused{0};
  std::atomic<uint64_t> timed_out{0};
  std::atomic<uint64_t> bad_requests{0};
  std::atomic<uint64_t> tls_handshakes{0};
  std::atomic<uint64_t> tls_failed{0};      // handshakes that failed or timed out
  std::atomic<uint64_t> auth_invalid{0};    // 401: a bearer token refused
  std::atomic<uint64_t> auth_missing{0};    // 401: no credentials for a route that needs them
  std::atomic<uint64_t> auth_forbidden{0};  // 403: a token without the route's scope
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> waiting{0};  // a gauge: requests waiting for their turn (max_in_flight)
};

struct RouteLabel {
  std::string method;
  std::string route;
};

/// Everything /metrics shows. `routes[i]` labels `counters[thread][i]`.
struct MetricsView {
  const std::vector<RouteLabel>* routes = nullptr;
  std::vector<const std::vector<std::unique_ptr<RouteCounters>>*> counters;  // per I/O thread
  std::vector<const IoCounters*> io;                                         // per I/O thread
  uint64_t connections_open = 0;
  Stats bus;
  std::optional<net::NodeStats> node;
  std::optional<WebSocketStats> websocket;  // when the server has a WebSocket bridge
};

/// The Prometheus text format (version 0.0.4).
std::string render_metrics(const MetricsView& view);
/// The HTTP figures of `view` (not the bus's or the node's: they have sources of their own) as
/// StatsD counters, gauges and timings.
void statsd_metrics(const MetricsView& view, StatsdSink& out);

}  // namespace bus::http::detail
