// How a Bus is sized and how it behaves when a ring is full.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace bus {

/// What `publish` does when the ring to a subscriber's executor is full.
enum class Overflow : uint8_t {
  kBlock,       ///< wait for room (plain threads); executors hold the record back (see README)
  kFail,        ///< return ResourceExhausted; the `failed` counter rises
  kDropNewest,  ///< discard this message; the `dropped` counter rises; publish returns OK
};

/// Bus parameters, with fluent setters: `bus::Options().executors(2).ring_bytes(1 << 16)`.
class Options {
 public:
  /// Executor threads; 0 (the default) means one per core.
  Options& executors(unsigned n) {
    executors_ = n;
    return *this;
  }
  unsigned executors() const { return executors_; }

  /// Size of each producer -> inbox ring, rounded up to a power of two (minimum 512 bytes).
  Options& ring_bytes(std::size_t bytes) {
    ring_bytes_ = bytes;
    return *this;
  }
  std::size_t ring_bytes() const { return ring_bytes_; }

  /// Records an executor may hold back when a ring it sends into is full, before a blocking
  /// publish from that executor fails with ResourceExhausted. Executors never block (two of them
  /// blocking on each other would deadlock); this bounds what they hold instead.
  Options& executor_backlog(std::size_t records) {
    executor_backlog_ = records;
    return *this;
  }
  std::size_t executor_backlog() const { return executor_backlog_; }

  /// Requests one executor (or external inbox) may have waiting for their replies at once; past
  /// it, request() answers ResourceExhausted through its callback. At most 16,777,216 (a
  /// correlation's slot bits); each pending request keeps its callback until answered.
  Options& max_pending_requests(std::size_t n) {
    max_pending_requests_ = n;
    return *this;
  }
  std::size_t max_pending_requests() const { return max_pending_requests_; }

  /// How long an idle executor polls before it parks.
  Options& spin(std::chrono::steady_clock::duration d) {
    spin_ = d;
    return *this;
  }
  std::chrono::steady_clock::duration spin() const { return spin_; }

  /// Pin executor i to core i % cores.
  Options& pin_executors(bool on) {
    pin_ = on;
    return *this;
  }
  bool pin_executors() const { return pin_; }

 private:
  unsigned executors_ = 0;
  std::size_t ring_bytes_ = 64 * 1024;
  std::size_t executor_backlog_ = 1 << 16;
  std::size_t max_pending_requests_ = 1 << 20;
  std::chrono::steady_clock::duration spin_ = std::chrono::microseconds(50);
  bool pin_ = false;
};

}  // namespace bus
