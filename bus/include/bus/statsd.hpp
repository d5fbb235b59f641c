// StatsD export: the bus's counters (and those of any other source: the HTTP server, a
// bridge node) pushed in the StatsD line protocol over UDP at an interval.
//
//   bus::StatsdExporter statsd(bus, bus::StatsdOptions().address("127.0.0.1:8125"));
//   statsd.add_source(http.statsd_source());          // bus::http::Server
//   statsd.add_source(bus::net::statsd_source(node)); // bus::net::Node
//
// The exporter has a thread of its own: it reads counters as /metrics does (relaxed loads of
// counters that each thread writes alone) and never waits on an executor. A send that fails (no
// listener, a full socket buffer) is counted and dropped: StatsD is lossy by design.
//
// Lines: counters as deltas since the last push (`name:5|c`, only when they moved), gauges as
// values (`name:3|g`), timings as the interval's mean with a sample rate of 1/count
// (`name:0.42|ms|@0.01`), so that the StatsD server counts every request and averages them
// right (its percentiles then come from one sample per interval). Several lines per datagram,
// newline-separated, up to `max_packet` bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "bus/bus.hpp"

namespace bus {

/// Where and how often the exporter pushes, with fluent setters:
/// `bus::StatsdOptions().address("127.0.0.1:8125").interval(std::chrono::seconds(10))`.
class StatsdOptions {
 public:
  /// "host:port" (an IPv4 address or a name). Throws std::invalid_argument when malformed.
  StatsdOptions& address(std::string_view host_port);
  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }

  /// Between pushes (more than zero).
  StatsdOptions& interval(std::chrono::steady_clock::duration i) {
    interval_ = i;
    return *this;
  }
  std::chrono::steady_clock::duration interval() const { return interval_; }

  /// Prepended to every name, with a dot (empty: none).
  StatsdOptions& prefix(std::string p) {
    prefix_ = std::move(p);
    return *this;
  }
  const std::string& prefix() const { return prefix_; }

  /// The largest datagram; lines never straddle two.
  StatsdOptions& max_packet(std::size_t bytes) {
    max_packet_ = bytes;
    return *this;
  }
  std::size_t max_packet() const { return max_packet_; }

 private:
  std::string host_ = "127.0.0.1";
  uint16_t port_ = 8125;
  std::chrono::steady_clock::duration interval_ = std::chrono::seconds(10);
  std::string prefix_ = "bus";
  std::size_t max_packet_ = 1432;  // fits an Ethernet MTU with IP and UDP headers
};

/// What a source writes its figures into. Names are dotted paths; characters StatsD reserves
/// (`:|@`, whitespace and the like) become `_`.
class StatsdSink {
 public:
  virtual ~StatsdSink() = default;
  /// A counter's total since it began: the exporter sends what it grew by since the last push.
  virtual void counter(std::string_view name, uint64_t total) = 0;
  virtual void gauge(std::string_view name, double value) = 0;
  /// A timing's totals since it began (how many, and their sum in milliseconds).
  virtual void timing(std::string_view name, uint64_t count, double sum_ms) = 0;
};
using StatsdSource = std::function<void(StatsdSink&)>;

namespace detail {
/// The bus's own figures (what /metrics shows for it), into `out`.
void bus_figures(Bus& bus, StatsdSink& out);
}  // namespace detail

struct StatsdStats {
  uint64_t pushes = 0;
  uint64_t datagrams = 0;
  uint64_t lines = 0;
  uint64_t send_errors = 0;  // datagrams the kernel refused (counted, not retried)
};

class StatsdExporter {
 public:
  /// Resolves the address and starts the exporter's thread. Throws std::invalid_argument when
  /// the address does not resolve.
  StatsdExporter(Bus& bus, StatsdOptions options);
  StatsdExporter(const StatsdExporter&) = delete;
  StatsdExporter& operator=(const StatsdExporter&) = delete;
  /// Stops the thread after a last push. Remove sources' owners after this.
  ~StatsdExporter();

  /// Another source of figures (any thread). It is called on the exporter's thread.
  void add_source(StatsdSource source);
  /// Pushes now (from any thread; pushes never overlap).
  void push();
  StatsdStats stats() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

/// `name` with the characters StatsD reserves replaced (for sources building names).
std::string statsd_name(std::string_view name);

}  // namespace bus
