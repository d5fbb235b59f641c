// Publishes sensor readings at a steady rate on "demo.readings".
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "../usage.hpp"
#include "demo.hpp"

ABSL_FLAG(std::string, publish, "tcp://127.0.0.1:7401", "where this node publishes");
ABSL_FLAG(std::string, peers, "", "comma-separated publish addresses of the other nodes");
ABSL_FLAG(int, rate, 200, "readings per second");
ABSL_FLAG(int, sensors, 3, "number of sensors");

using namespace demo_app;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  examples::usage("the demo's producer: publishes sensor readings on \"demo.readings\"");
  absl::ParseCommandLine(argc, argv);
  handle_signals();
  bus::Bus bus(bus::Options().executors(1));
  bus::net::Node node(
      bus, node_options("producer", absl::GetFlag(FLAGS_publish), "", absl::GetFlag(FLAGS_peers)));
  node.export_topic(readings);

  // Slow joiner: a subscriber that is not connected yet would miss the first readings. Wait for
  // the two programs of the demo by name: another subscriber (a `busctl sub`) does not count.
  std::printf("[producer] waiting for the aggregator and the monitor\n");
  while (!stop_requested &&
         !node.wait_for_subscribers(readings.name(), {"aggregator", "monitor"}, 100ms)) {
  }
  const char* names[] = {"kitchen", "garage", "attic", "cellar", "porch"};
  int sensors = std::clamp(absl::GetFlag(FLAGS_sensors), 1, 5);
  auto period = std::chrono::nanoseconds(1'000'000'000 / std::max(1, absl::GetFlag(FLAGS_rate)));
  auto next = std::chrono::steady_clock::now();
  auto report = next + 1s;
  uint64_t seq = 0, refused = 0;
  while (!stop_requested) {
    ++seq;
    const char* sensor = names[seq % sensors];
    double value = 20 + 5 * std::sin(seq / 50.0) + static_cast<double>(seq % sensors);
    auto r = bus::build<demo::Reading>([&](demo::Reading::Builder b) {
      b.setSensor(sensor);
      b.setValue(value);
      b.setSeq(seq);
      b.setUnixNanos(std::chrono::system_clock::now().time_since_epoch().count());
    });
    if (!bus.publish(readings, std::move(r)).ok()) ++refused;
    next += period;
    std::this_thread::sleep_until(next);
    if (std::chrono::steady_clock::now() >= report) {
      std::printf("[producer] published %llu readings (%d/s, %llu refused)\n",
                  static_cast<unsigned long long>(seq), absl::GetFlag(FLAGS_rate),
                  static_cast<unsigned long long>(refused));
      report += 1s;
    }
  }
  node.stop();  // what was published goes out before the node says goodbye
  (void)bus.stop();
  std::printf("[producer] stopped cleanly after %llu readings\n",
              static_cast<unsigned long long>(seq));
  return 0;
}
