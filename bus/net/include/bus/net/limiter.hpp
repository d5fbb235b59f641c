// A rate limit shared by every node of a bus: N events per window per key (an API key, a
// client address), counted locally and shared over a topic of the bus itself.
//
//   bus::net::RateLimiter limiter(bus, node, "api", bus::net::LimiterOptions()
//                                                       .limit(100).window(std::chrono::seconds(1)));
//   if (!limiter.admit(api_key).admitted) return Reply::error(429, ...);
//
// How it decides: windows are aligned on the wall clock (time since the epoch / window), so every
// node agrees on them. A node admits an event while its own count plus the latest counts it has
// heard from the other nodes stay within the limit. Every `exchange` interval each node
// publishes its counts of the keys that changed (absolute counts: a lost message is repaired by
// the next one; every tenth exchange sends them all).
//
// The bound (docs/compose.md): nodes err on the side of admitting. What one node does not know
// yet is what the others admitted since their last exchange reached it, so in one window the
// nodes together admit at most `limit` plus what the other nodes admitted during one exchange
// interval plus the transit time. Once the counts are exchanged every node refuses. Clocks of
// different hosts must agree to well within a window (NTP).
#pragma once

#include <absl/container/flat_hash_map.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "bus/bus.hpp"
#include "bus/net/node.hpp"
#include "bus/statsd.hpp"

namespace bus::net {

/// How a RateLimiter counts, with fluent setters:
/// `bus::net::LimiterOptions().limit(100).window(std::chrono::minutes(1))`.
class LimiterOptions {
 public:
  /// Events admitted per key per window, over all nodes.
  LimiterOptions& limit(uint64_t n) {
    limit_ = n;
    return *this;
  }
  uint64_t limit() const { return limit_; }

  /// The window, in whole milliseconds (more than zero): windows are numbered from the epoch
  /// of the wall clock, so that every node counts the same window.
  LimiterOptions& window(std::chrono::milliseconds w) {
    window_ = w;
    return *this;
  }
  std::chrono::milliseconds window() const { return window_; }

  /// How often a node publishes its counts. Zero: only when exchange() is called.
  LimiterOptions& exchange(std::chrono::steady_clock::duration e) {
    exchange_ = e;
    return *this;
  }
  std::chrono::steady_clock::duration exchange() const { return exchange_; }

  /// The wall clock (tests give their own); empty: std::chrono::system_clock.
  LimiterOptions& clock(std::function<std::chrono::system_clock::time_point()> c) {
    clock_ = std::move(c);
    return *this;
  }
  const std::function<std::chrono::system_clock::time_point()>& clock() const { return clock_; }

 private:
  uint64_t limit_ = 100;
  std::chrono::milliseconds window_{1000};
  std::chrono::steady_clock::duration exchange_ = std::chrono::milliseconds(100);
  std::function<std::chrono::system_clock::time_point()> clock_;
};

struct Decision {
  bool admitted = false;
  /// When refused: until the window ends (a 429's Retry-After).
  std::chrono::milliseconds retry_after{0};
  /// The count this node knew for the key, this event included if admitted.
  uint64_t known = 0;
};

struct LimiterStats {
  uint64_t admitted = 0;
  uint64_t refused = 0;
  uint64_t sent = 0;           // count messages published
  uint64_t received = 0;       // count messages from other nodes taken in
  uint64_t stale = 0;          // ... ignored because their window had passed here
  uint64_t over_admitted = 0;  // events admitted beyond the limit, as learned from the counts
  uint64_t keys = 0;           // keys counted in the current windows
};

class RateLimiter {
 public:
  /// Shared with the other nodes of `node` that run a limiter of the same name (the limiter
  /// exports and imports its topic, `bus.limit.<name>`, on the node).
  RateLimiter(Bus& bus, Node& node, std::string name, LimiterOptions options = {});
  /// Shared only with limiters of the same name on this bus.
  RateLimiter(Bus& bus, std::string name, LimiterOptions options = {});
  RateLimiter(const RateLimiter&) = delete;
  RateLimiter& operator=(const RateLimiter&) = delete;
  ~RateLimiter();

  /// Admits `n` events for `key` if the shared count allows it. Any thread.
  Decision admit(std::string_view key, uint64_t n = 1);
  /// The count this node knows for `key` in the current window (its own plus the others').
  uint64_t known(std::string_view key) const;
  /// Publishes this node's counts now (all of them).
  void exchange();
  const std::string& name() const { return name_; }
  uint64_t id() const { return id_; }
  LimiterStats stats() const;
  /// Its counters for a bus::StatsdExporter (the limiter must outlive the exporter).
  StatsdSource statsd_source() const;

  struct Impl;

 private:
  std::string name_;
  uint64_t id_;
  std::shared_ptr<Impl> impl_;
};

}  // namespace bus::net
