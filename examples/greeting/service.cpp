// The greeting service in its own process: serves "greeting" and "myservice.ping" to the bus
// over the bridge (greeting_server --peers <this node's publish address> calls it).
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/strings/str_split.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <thread>

#include "../usage.hpp"
#include "greeting.hpp"

ABSL_FLAG(std::string, publish, "tcp://127.0.0.1:7501", "where this node publishes");
ABSL_FLAG(std::string, requests, "tcp://127.0.0.1:7502", "where this node takes requests");
ABSL_FLAG(std::string, peers, "tcp://127.0.0.1:7500", "publish addresses of the other nodes");
ABSL_FLAG(unsigned, executors, 1, "bus executors");

using namespace greeting_app;

namespace {
std::atomic<bool> stop{false};
}

int main(int argc, char** argv) {
  examples::usage(
      "the greeting service in its own process, serving \"greeting\" and \"myservice.ping\" over "
      "the bridge");
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::signal(SIGTERM, [](int) { stop.store(true); });
  std::signal(SIGINT, [](int) { stop.store(true); });

  bus::Bus bus(bus::Options().executors(absl::GetFlag(FLAGS_executors)));
  bus.service<GreetingService>()
      .serve(greet, &GreetingService::hello)
      .serve(ping, &GreetingService::on_ping);
  auto o = bus::net::NodeOptions()
               .name("greeting-service")
               .publish_on(absl::GetFlag(FLAGS_publish))
               .requests_on(absl::GetFlag(FLAGS_requests));
  for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_peers), ',', absl::SkipEmpty())) {
    o.peer(std::string(p));
  }
  bus::net::Node node(bus, o);
  node.export_endpoint(greet).export_endpoint(ping);
  std::printf("[greeting-service] serving greeting and myservice.ping on %s\n",
              node.request_address().c_str());
  while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  node.stop();
  return 0;
}
