// What the same-host shared-memory benchmark's peer roles (shm_iceoryx.cpp, shm_raw.cpp) share on
// top of bridge_common.hpp: the spin/block mode, the driver's `go` line, its stop (stdin closed)
// as a flag, the sequence number in a payload's first 8 bytes, the ping loop and the throughput
// result lines.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bridge_common.hpp"

namespace bench_shm {

/// How the waiting side waits: busy-polling, or asleep in the kernel.
enum class Mode { spin, block };

inline Mode mode_of(const bench_bridge::Args& a, const char* fallback) {
  auto it = a.kv.find("mode");
  std::string m = it == a.kv.end() ? fallback : it->second;
  if (m == "spin") return Mode::spin;
  if (m == "block") return Mode::block;
  bench_bridge::fail("mode must be spin or block, not " + m);
}

/// The unmeasured round trips before the measured `count` (default max(100, count/10)).
inline uint64_t warmup_of(const bench_bridge::Args& a, uint64_t count) {
  return a.num("warmup", std::max<uint64_t>(100, count / 10));
}

inline void put_seq(void* payload, uint64_t seq) { std::memcpy(payload, &seq, 8); }
inline uint64_t get_seq(const void* payload) {
  uint64_t seq;
  std::memcpy(&seq, payload, 8);
  return seq;
}

/// Blocks until the driver sends the line `go` (other lines are skipped); stdin closing first is
/// an error.
inline void wait_for_go() {
  std::string line;
  for (;;) {
    char c;
    ssize_t n = ::read(0, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) bench_bridge::fail("stdin closed before 'go'");
    if (c != '\n') {
      line += c;
    } else if (line == "go") {
      return;
    } else {
      line.clear();
    }
  }
}

/// The driver's stop (our stdin closing), watched by a thread asleep in read(): a busy-polling
/// loop checks stop_requested(), a relaxed load, and makes no syscall between messages. Start it
/// once; roles that read `go` start it after.
inline std::atomic<bool>& stop_flag() {
  static std::atomic<bool> stop{false};
  return stop;
}
inline void watch_stdin() {
  std::thread([] {
    bench_bridge::wait_for_stdin_eof();
    stop_flag().store(true, std::memory_order_relaxed);
  }).detach();
}
inline bool stop_requested() { return stop_flag().load(std::memory_order_relaxed); }

/// The ping role's measurement: `warm` unmeasured then `n` measured round trips, one at a time.
/// `round_trip(seq)` sends ping `seq`, waits for its pong and returns whether the pong carried
/// `seq` (and the right size). Prints the driver's result line.
template <class RoundTrip>
int ping_loop(uint64_t n, uint64_t warm, RoundTrip&& round_trip) {
  if (n == 0) bench_bridge::fail("count must be at least 1");
  std::vector<uint64_t> ns;
  ns.reserve(n);
  bool ok = true;
  uint64_t c0 = bench_bridge::cpu_ns();
  for (uint64_t i = 1; i <= warm + n; ++i) {
    if (i == warm + 1) c0 = bench_bridge::cpu_ns();
    uint64_t t = bench_bridge::now_ns();
    bool good = round_trip(i);
    uint64_t dt = bench_bridge::now_ns() - t;
    ok = ok && good;
    if (i > warm) ns.push_back(dt);
  }
  bench_bridge::print_latency_result(n, ok, ns, bench_bridge::cpu_ns() - c0);
  return 0;
}

/// The throughput publisher's result line.
inline void print_sender(uint64_t t0, uint64_t t_sent, uint64_t cpu) {
  std::printf("result t0=%llu t_sent=%llu cpu=%llu\n", static_cast<unsigned long long>(t0),
              static_cast<unsigned long long>(t_sent), static_cast<unsigned long long>(cpu));
  std::fflush(stdout);
}

/// The throughput subscriber's result line.
inline void print_receiver(uint64_t t_last, uint64_t count, bool ok, uint64_t cpu) {
  std::printf("result t_last=%llu count=%llu ok=%d cpu=%llu\n",
              static_cast<unsigned long long>(t_last), static_cast<unsigned long long>(count), ok,
              static_cast<unsigned long long>(cpu));
  std::fflush(stdout);
}

}  // namespace bench_shm
