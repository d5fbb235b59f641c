// Helpers shared by the bridge's tests: nodes on 127.0.0.1, each on its own bus.
#pragma once

#include <bus/bus.hpp>
#include <bus/net/node.hpp>
#include <chrono>
#include <cstdlib>
#include <string>

#include "support/test_support.hpp"

namespace bus_test {

/// The transport tests ask for: $BUS_TEST_TRANSPORT (auto, zmq or shm; ctest runs the bridge's
/// suites once with each of auto and zmq), else auto.
inline std::string transport_name_from_env() {
  const char* t = std::getenv("BUS_TEST_TRANSPORT");
  return t != nullptr && *t != '\0' ? t : "auto";
}
inline bus::net::Transport transport_of(const std::string& name) {
  if (name == "zmq") return bus::net::Transport::kZeroMq;
  if (name == "shm") return bus::net::Transport::kSharedMemory;
  return bus::net::Transport::kAuto;
}

/// A node on 127.0.0.1 with ports the system picks.
inline bus::net::NodeOptions local_node(const char* name) {
  using namespace std::chrono_literals;
  return bus::net::NodeOptions()
      .name(name)
      .publish_on("tcp://127.0.0.1:*")
      .requests_on("tcp://127.0.0.1:*")
      .heartbeat(50ms, 40)  // no test here needs a quick death; a sanitized node misses beats
      .transport(transport_of(transport_name_from_env()));
}

/// Waits until `node` reaches its peer `peer` over the transport the tests asked for (shared
/// memory unless ZeroMQ was forced: the nodes of a test share a host). A test whose outcome
/// depends on the path a call takes waits for it first: a call made while the link is still
/// coming up goes over ZeroMQ.
inline bool settled(const bus::net::Node& node, const std::string& peer) {
  using namespace std::chrono_literals;
  const auto want = transport_name_from_env() == "zmq" ? bus::net::Transport::kZeroMq
                                                       : bus::net::Transport::kSharedMemory;
  return eventually(
      [&] {
        for (const auto& p : node.stats().peers) {
          if (p.name == peer) return p.transport == want;
        }
        return false;
      },
      30s);
}

/// Two nodes that listen to each other, "a" on bus_a and "b" on bus_b.
struct NodePair {
  explicit NodePair(unsigned executors = 2)
      : bus_a(bus::Options().executors(executors)),
        bus_b(bus::Options().executors(executors)),
        a(bus_a, local_node("a")),
        b(bus_b, local_node("b")) {
    a.peer(b.publish_address());
    b.peer(a.publish_address());
  }
  bus::Bus bus_a;
  bus::Bus bus_b;
  bus::net::Node a;
  bus::net::Node b;
};

}  // namespace bus_test
