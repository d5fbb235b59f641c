// The channels the integration tests and bus_fixture_node share, and their mistyped twins.
//
// The channel registry is per process and refuses one name with two types, so each channel is
// created on first use: a process that touches `readings()` must never touch
// `mistyped_readings()`. Across processes nothing stops two programs from disagreeing, which is
// what the mistyped twins stand for (a program built against another schema).
#pragma once

#include <bus/schemas/demo.capnp.h>

#include <bus/bus.hpp>
#include <bus/message.hpp>

namespace integ {

using Reading = bus::Message<demo::Reading>;
using StatsRequest = bus::Message<demo::StatsRequest>;
using StatsReply = bus::Message<demo::StatsReply>;

inline constexpr char kReadings[] = "integ.readings";
inline constexpr char kStats[] = "integ.stats";

inline const bus::Topic<Reading>& readings() {
  static const bus::Topic<Reading> topic{kReadings};
  return topic;
}
inline const bus::Endpoint<StatsRequest, StatsReply>& stats() {
  static const bus::Endpoint<StatsRequest, StatsReply> endpoint{kStats};
  return endpoint;
}
/// The readings topic's name with another message type.
inline const bus::Topic<StatsRequest>& mistyped_readings() {
  static const bus::Topic<StatsRequest> topic{kReadings};
  return topic;
}
/// The stats endpoint's name with another request type.
inline const bus::Endpoint<Reading, StatsReply>& mistyped_stats() {
  static const bus::Endpoint<Reading, StatsReply> endpoint{kStats};
  return endpoint;
}

inline Reading reading(const std::string& sensor, uint64_t seq) {
  return bus::build<demo::Reading>([&](demo::Reading::Builder r) {
    r.setSensor(sensor);
    r.setSeq(seq);
    r.setValue(static_cast<double>(seq));
  });
}

inline StatsRequest ask(const std::string& sensor) {
  return bus::build<demo::StatsRequest>(
      [&](demo::StatsRequest::Builder r) { r.setSensor(sensor); });
}

}  // namespace integ
