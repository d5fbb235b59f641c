// The installed bridge: a node, and a Cap'n Proto message type of the consumer's own.
#include <bus/net/node.hpp>
#include <cstdio>

#include "reading.capnp.h"

using Reading = bus::Message<consumer::Reading>;
inline const bus::Topic<Reading> readings{"consumer.readings"};

int main() {
  bus::Bus bus(bus::Options().executors(1));
  bus::net::Node node(bus, bus::net::NodeOptions().publish_on("tcp://127.0.0.1:*"));
  node.export_topic(readings);
  auto r = bus::build<consumer::Reading>([](consumer::Reading::Builder b) { b.setValue(2.5); });
  bool ok = bus.publish(readings, r).ok() && r->getValue() == 2.5 &&
            node.publish_address().rfind("tcp://127.0.0.1:", 0) == 0;
  std::printf("net %s\n", ok ? "ok" : "failed");
  return ok ? 0 : 1;
}
