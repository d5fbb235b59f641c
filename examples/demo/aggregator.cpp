// A stateful service: subscribes to the readings and serves "demo.stats" with its statistics.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>

#include <chrono>
#include <map>
#include <thread>

#include "../usage.hpp"
#include "demo.hpp"

ABSL_FLAG(std::string, publish, "tcp://127.0.0.1:7411", "where this node publishes");
ABSL_FLAG(std::string, requests, "tcp://127.0.0.1:7412", "where this node takes requests");
ABSL_FLAG(std::string, peers, "", "comma-separated publish addresses of the other nodes");

using namespace demo_app;
using namespace std::chrono_literals;

namespace {

// The service's state: touched only by its own handlers, one at a time, so it has no lock.
struct Aggregator {
  struct Sensor {
    uint64_t count = 0;
    double sum = 0, min = 1e300, max = -1e300, last = 0;
  };
  std::map<std::string, Sensor> sensors;
  uint64_t readings = 0;
  uint64_t last_seq = 0;
  uint64_t missed = 0;

  void on_reading(const Reading& r) {
    ++readings;
    if (last_seq != 0 && r->getSeq() > last_seq + 1) missed += r->getSeq() - last_seq - 1;
    last_seq = r->getSeq();
    Sensor& s = sensors[r->getSensor().cStr()];
    double v = r->getValue();
    ++s.count;
    s.sum += v;
    s.min = std::min(s.min, v);
    s.max = std::max(s.max, v);
    s.last = v;
  }

  StatsReply on_stats(const StatsRequest& req) {
    std::string only = req->getSensor().cStr();
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder b) {
      b.setReadings(readings);
      b.setMissed(missed);
      unsigned n = 0;
      for (auto& [name, s] : sensors) n += only.empty() || only == name;
      auto list = b.initSensors(n);
      unsigned i = 0;
      for (auto& [name, s] : sensors) {
        if (!only.empty() && only != name) continue;
        auto o = list[i++];
        o.setSensor(name);
        o.setCount(s.count);
        o.setMean(s.sum / static_cast<double>(s.count));
        o.setMin(s.min);
        o.setMax(s.max);
        o.setLast(s.last);
      }
    });
  }
};

}  // namespace

int main(int argc, char** argv) {
  examples::usage("the demo's aggregator: subscribes to the readings and serves \"demo.stats\"");
  absl::ParseCommandLine(argc, argv);
  handle_signals();
  bus::Bus bus(bus::Options().executors(2));
  auto agg = bus.service<Aggregator>();
  agg.subscribe(readings, &Aggregator::on_reading).serve(stats, &Aggregator::on_stats);

  bus::net::Node node(bus, node_options("aggregator", absl::GetFlag(FLAGS_publish),
                                        absl::GetFlag(FLAGS_requests), absl::GetFlag(FLAGS_peers)));
  node.import_topic(readings).export_endpoint(stats);
  std::printf("[aggregator] serving %s on %s\n", stats.name().c_str(),
              node.request_address().c_str());

  auto report = std::chrono::steady_clock::now() + 1s;
  while (!stop_requested) {
    std::this_thread::sleep_for(50ms);
    if (std::chrono::steady_clock::now() < report) continue;
    report += 1s;
    auto st = bus.stats();
    const bus::ChannelStats* c = st.channel(stats.name());
    std::printf("[aggregator] answered %llu stats requests; peers: %s\n",
                static_cast<unsigned long long>(c ? c->delivered : 0),
                peer_transports(node).c_str());
  }
  node.stop();
  (void)bus.stop();  // drains: every reading that arrived has been counted
  auto& s = agg.state();
  std::printf("[aggregator] stopped cleanly: %llu readings from %zu sensors, %llu missed\n",
              static_cast<unsigned long long>(s.readings), s.sensors.size(),
              static_cast<unsigned long long>(s.missed));
  return 0;
}
