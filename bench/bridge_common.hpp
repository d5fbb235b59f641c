// What the bridge benchmark's role programs (bridge_bus/zmq/nats.cpp) share: arguments, clocks,
// the payload pattern and the driver handshake (a "ready" line, then run until stdin closes).
#pragma once

#include <errno.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace bench_bridge {

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(1);
}

inline uint64_t now_ns() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

/// CPU time of the whole process (every thread, user and system): what a case costs besides
/// how long it takes.
inline uint64_t cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

/// The value at fraction `p` of `v` (reordered in place).
inline double percentile(std::vector<uint64_t>& v, double p) {
  std::size_t i = std::min(v.size() - 1, static_cast<std::size_t>(p * v.size()));
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(i), v.end());
  return static_cast<double>(v[i]);
}

/// The median of `v`; of an even count, the mean of the middle two.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

/// An rtt role's result line for the driver: `count` calls, `ok` when every reply matched its
/// request, the latencies after warm-up (`ns`, reordered) and the process's CPU time.
inline void print_latency_result(uint64_t count, bool ok, std::vector<uint64_t>& ns, uint64_t cpu) {
  uint64_t total = 0;
  for (uint64_t x : ns) total += x;
  double mean = static_cast<double>(total) / static_cast<double>(count);
  double p50 = percentile(ns, 0.50), p99 = percentile(ns, 0.99), p999 = percentile(ns, 0.999);
  std::printf("result count=%llu ok=%d p50=%.0f p99=%.0f p999=%.0f mean=%.0f cpu=%llu\n",
              static_cast<unsigned long long>(count), ok, p50, p99, p999, mean,
              static_cast<unsigned long long>(cpu));
  std::fflush(stdout);
}

/// A driver's `key=value` arguments over `opt` (every key it takes, with its default). A word
/// without '=' or an unknown key prints the keys and their defaults, and exits with 2.
inline std::map<std::string, std::string> driver_options(int argc, char** argv,
                                                         std::map<std::string, std::string> opt) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq == std::string::npos || !opt.contains(a.substr(0, eq))) {
      std::fprintf(stderr, "usage: %s [key=value...]; keys (defaults):", argv[0]);
      for (auto& [k, v] : opt) std::fprintf(stderr, " %s=%s", k.c_str(), v.c_str());
      std::fprintf(stderr, "\n");
      std::exit(2);
    }
    opt[a.substr(0, eq)] = a.substr(eq + 1);
  }
  return opt;
}

/// The running program's own path.
inline std::string self_exe() {
  char buf[4096];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) fail("readlink /proc/self/exe failed");
  return std::string(buf, static_cast<std::size_t>(n));
}

/// `role key=value...`: argv[1] is the role, the rest are key=value pairs.
struct Args {
  std::map<std::string, std::string> kv;
  Args(int argc, char** argv) {
    for (int i = 2; i < argc; ++i) {
      std::string a = argv[i];
      auto eq = a.find('=');
      if (eq == std::string::npos) fail("argument without '=': " + a);
      kv[a.substr(0, eq)] = a.substr(eq + 1);
    }
  }
  std::string str(const std::string& k) const {
    auto it = kv.find(k);
    if (it == kv.end()) fail("missing argument " + k + "=");
    return it->second;
  }
  uint64_t num(const std::string& k, std::optional<uint64_t> def = {}) const {
    auto it = kv.find(k);
    if (it != kv.end()) return std::strtoull(it->second.c_str(), nullptr, 10);
    if (!def) fail("missing argument " + k + "=");
    return *def;
  }
};

/// The data bytes every payload carries after its 8-byte sequence number (checked on receipt).
inline uint8_t pattern(std::size_t j) { return static_cast<uint8_t>(j * 31 + 7); }

/// Blocks until the driver closes our stdin (its "stop").
inline void wait_for_stdin_eof() {
  char buf[256];
  while (::read(0, buf, sizeof buf) > 0) {
  }
}

/// Tells the driver this role is set up.
inline void ready() {
  std::printf("ready\n");
  std::fflush(stdout);
}

}  // namespace bench_bridge
