// Quick throughput of the bus itself: 1 producer -> 1 subscriber on another executor, 8-byte
// messages, from a plain thread (publish per message) and from an executor (sends batched per
// handler batch). The comparison with other queues is bench/queues (issue: internal throughput).
//
//   ./build/bench/bus_throughput [messages] [runs] [idle seconds, 0: skip]
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <thread>
#include <vector>

namespace {

inline const bus::Topic<uint64_t> numbers{"bench.numbers"};

double run(bool from_executor, uint64_t n) {
  bus::Bus bus(bus::Options().executors(2).pin_executors(true));
  uint64_t sum = 0, count = 0;
  std::atomic<bool> done{false};
  auto sub = bus.subscribe(
      numbers,
      [&](const uint64_t& v) {
        sum += v;
        if (++count == n) {
          done.store(true, std::memory_order_release);
          done.notify_one();
        }
      },
      bus::on_executor(1));
  // From an executor, a handler sends a chunk and posts itself again: sends are published once
  // per handler batch, the way executors talk to each other. (One handler sending millions at
  // once would exceed the executor backlog bound and get ResourceExhausted.)
  uint64_t next = 1;
  std::function<void()> chunk;
  auto start = std::chrono::steady_clock::now();
  if (from_executor) {
    chunk = [&] {
      for (uint64_t end = std::min(n, next + 1023); next <= end; ++next) {
        if (!bus.publish(numbers, next).ok()) std::abort();
      }
      if (next <= n) (void)bus.post(bus::on_executor(0), chunk);
    };
    (void)bus.post(bus::on_executor(0), chunk);
  } else {
    // The plain producer takes executor 0's core (that executor stays parked).
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
    for (uint64_t i = 1; i <= n; ++i) (void)bus.publish(numbers, i);
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    CPU_SET(1, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
  done.wait(false, std::memory_order_acquire);  // not a spin: the waiter must not steal a core
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  (void)bus.stop();
  if (sum != n * (n + 1) / 2) {
    std::fprintf(stderr, "lost messages: sum %llu\n", static_cast<unsigned long long>(sum));
    std::exit(1);
  }
  return static_cast<double>(n) / secs;
}

/// CPU used by an idle bus (two parked executors) over `secs` seconds, in % of one core.
double idle_cpu_percent(double secs) {
  bus::Bus bus(bus::Options().executors(2));
  auto cpu = [] {
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_utime.tv_sec + ru.ru_stime.tv_sec +
           (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // let the executors park
  double before = cpu();
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
  return 100.0 * (cpu() - before) / secs;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t n = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 50'000'000;
  int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  std::vector<double> plain, batched;
  for (int r = 0; r < runs; ++r) {  // interleaved: both modes see the same machine noise
    plain.push_back(run(false, n));
    batched.push_back(run(true, n));
  }
  std::printf("bus 1->1, 8-byte messages, %llu per run, %d runs (median, min-max), M msg/s\n",
              static_cast<unsigned long long>(n), runs);
  auto show = [](const char* what, std::vector<double> v) {
    std::printf("  %-34s %8.1f  (%.1f-%.1f)\n", what, median(v) / 1e6,
                *std::min_element(v.begin(), v.end()) / 1e6,
                *std::max_element(v.begin(), v.end()) / 1e6);
  };
  show("plain thread, publish per message", plain);
  show("executor -> executor (batched)", batched);
  if (argc <= 3 || std::atoi(argv[3]) != 0) {
    double secs = argc > 3 ? std::atof(argv[3]) : 10;
    std::printf("  idle bus, 2 executors, %.0f s: %.3f%% of one core\n", secs,
                idle_cpu_percent(secs));
  }
}
