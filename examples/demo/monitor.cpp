// Watches the readings and asks the aggregator for its statistics every second.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "../usage.hpp"
#include "demo.hpp"

ABSL_FLAG(std::string, publish, "tcp://127.0.0.1:7421", "where this node publishes");
ABSL_FLAG(std::string, peers, "", "comma-separated publish addresses of the other nodes");

using namespace demo_app;
using namespace std::chrono_literals;

int main(int argc, char** argv) {
  examples::usage(
      "the demo's monitor: watches the readings and asks the aggregator for its statistics");
  absl::ParseCommandLine(argc, argv);
  handle_signals();
  bus::Bus bus(bus::Options().executors(1));
  std::atomic<uint64_t> seen{0};
  auto sub = bus.subscribe(readings, [&](const Reading&) { seen.fetch_add(1); });
  bus::net::Node node(
      bus, node_options("monitor", absl::GetFlag(FLAGS_publish), "", absl::GetFlag(FLAGS_peers)));
  node.import_topic(readings).import_endpoint(stats);

  std::printf("[monitor] waiting for the aggregator\n");
  while (!stop_requested && !node.wait_for_server(stats.name(), 100ms)) {
  }
  std::printf("[monitor] peers: %s\n", peer_transports(node).c_str());
  int tick = 0;
  while (!stop_requested) {
    std::this_thread::sleep_for(1s);
    if (stop_requested) break;
    ++tick;
    // Every request has a deadline: a slow or dead aggregator costs at most this much.
    auto ask = bus::build<demo::StatsRequest>([](demo::StatsRequest::Builder) {});
    absl::StatusOr<StatsReply> rep = bus.call(stats, std::move(ask), 500ms);
    if (!rep.ok()) {
      std::printf("[monitor] t=%ds: stats call failed: %s\n", tick,
                  rep.status().ToString().c_str());
      continue;
    }
    std::printf("[monitor] t=%ds: I saw %llu readings; the aggregator has %llu (%llu missed):",
                tick, static_cast<unsigned long long>(seen.load()),
                static_cast<unsigned long long>((*rep)->getReadings()),
                static_cast<unsigned long long>((*rep)->getMissed()));
    for (auto s : (*rep)->getSensors()) {
      std::printf(" %s=%.2f (n=%llu)", s.getSensor().cStr(), s.getMean(),
                  static_cast<unsigned long long>(s.getCount()));
    }
    std::printf("\n");
    if (tick == 2) std::printf("[monitor] peers: %s\n", peer_transports(node).c_str());
  }
  auto st = node.stats().channel(readings.name());
  node.stop();
  (void)bus.stop();
  std::printf("[monitor] stopped cleanly: saw %llu readings, %llu lost in transit (gaps)\n",
              static_cast<unsigned long long>(seen.load()),
              static_cast<unsigned long long>(st.gaps));
  return 0;
}
