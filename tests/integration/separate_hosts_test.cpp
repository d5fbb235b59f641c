// Two nodes as two hosts: each in a network namespace of its own, joined by a veth pair
// (10.200.0.1/24 <-> 10.200.0.2/24), so they reach each other only over a real network link.
// Needs root and iproute2; skipped, saying why, where the machine does not allow it.
#include <gtest/gtest.h>

#include <string>

#include "integration/hosts.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::NodeProcess;

TEST(SeparateHosts, TopicsAndRequestsCrossBetweenNetworkNamespaces) {
  integ::Hosts hosts(integ::Hosts::Layout::kPair);  // declared first: deleted after the processes
                                                    // in them are killed
  if (std::string refused = hosts.create(); !refused.empty()) {
    GTEST_SKIP() << "this machine does not allow network namespaces here: " << refused;
  }

  // Host a binds its own address; host b binds every interface and advertises its address, as
  // a node behind a wildcard bind must. Fixed ports: each namespace has its own.
  NodeProcess a(
      {"--name=host-a", "--serve", "--export-readings", "--publish-on=tcp://10.200.0.1:7101",
       "--requests-on=tcp://10.200.0.1:7102", "--peer=tcp://10.200.0.2:7101"},
      hosts.exec_in(hosts.a()));
  NodeProcess b({"--name=host-b", "--import-readings", "--import-stats",
                 "--publish-on=tcp://*:7101", "--requests-on=tcp://*:7102",
                 "--advertise=tcp://10.200.0.2:7102", "--peer=tcp://10.200.0.1:7101"},
                hosts.exec_in(hosts.b()));
  ASSERT_TRUE(a.ready());
  ASSERT_TRUE(b.ready());

  // Requests from b to a.
  ASSERT_EQ(b.ask("wait-server").num("ok"), 1u);
  integ::Answer called = b.ask("call 50");
  EXPECT_EQ(called.num("ok"), 50u) << called.line;
  EXPECT_EQ(called.num("served_by.host-a"), 50u) << called.line;

  // Readings from a to b.
  ASSERT_EQ(a.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(a.ask("publish 1000").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return b.report().num("received") >= 1000; }, 60s));
  integ::Answer r = b.report();
  EXPECT_EQ(r.num("received"), 1000u) << r.line;
  EXPECT_EQ(r.num("sum"), 1000u * 1001u / 2) << r.line;
  EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;

  // Each heard the other across the link.
  EXPECT_EQ(a.ask("wait-peers 1").num("n"), 1u);
  EXPECT_TRUE(a.report().has("peer.host-b"));
  EXPECT_TRUE(r.has("peer.host-a")) << r.line;
  // One kernel, but not one network: the shared-memory link is for peers on the same host, and
  // a namespace of its own makes another host of it (ZeroMQ, whatever the transport option).
  EXPECT_EQ(r.str("transport.host-a"), "zmq") << r.line;
  EXPECT_EQ(r.num("shm_links"), 0u) << r.line;
  EXPECT_TRUE(b.quit());
  EXPECT_TRUE(a.quit());
}
