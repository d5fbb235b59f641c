// What the three demo programs share: their channels, node options and a clean stop on SIGTERM.
#pragma once

#include <absl/flags/flag.h>
#include <absl/strings/str_split.h>
#include <bus/schemas/demo.capnp.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

// Processes on one host link over shared memory; `--transport=zmq` keeps them on ZeroMQ (the
// run script passes $DEMO_TRANSPORT), to compare.
ABSL_FLAG(std::string, transport, "auto", "how peers are reached: auto, zmq or shm");

namespace demo_app {

using Reading = bus::Message<demo::Reading>;
using StatsRequest = bus::Message<demo::StatsRequest>;
using StatsReply = bus::Message<demo::StatsReply>;

// One declaration per channel, shared by every program: the Cap'n Proto schema id is what the
// nodes check on the wire.
inline const bus::Topic<Reading> readings{"demo.readings"};
inline const bus::Endpoint<StatsRequest, StatsReply> stats{"demo.stats"};

inline std::atomic<bool> stop_requested{false};

/// SIGTERM / SIGINT ask the main loop to stop; the program then stops its node and bus cleanly.
inline void handle_signals() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // one line at a time, interleaved readably
  auto on_signal = [](int) { stop_requested.store(true); };
  std::signal(SIGTERM, on_signal);
  std::signal(SIGINT, on_signal);
}

inline bus::net::NodeOptions node_options(const std::string& name, const std::string& publish,
                                          const std::string& requests, const std::string& peers) {
  auto o = bus::net::NodeOptions().name(name).publish_on(publish).heartbeat(
      std::chrono::milliseconds(200), 3);
  if (!requests.empty()) o.requests_on(requests);
  const std::string transport = absl::GetFlag(FLAGS_transport);
  o.transport(transport == "zmq"   ? bus::net::Transport::kZeroMq
              : transport == "shm" ? bus::net::Transport::kSharedMemory
                                   : bus::net::Transport::kAuto);
  for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty())) o.peer(std::string(p));
  return o;
}

/// "producer over shm, aggregator over zmq": how this node reaches each peer right now.
inline std::string peer_transports(const bus::net::Node& node) {
  std::string s;
  for (const auto& p : node.stats().peers) {
    if (!s.empty()) s += ", ";
    s += p.name + " over " + bus::net::transport_name(p.transport);
  }
  return s.empty() ? "none yet" : s;
}

}  // namespace demo_app
