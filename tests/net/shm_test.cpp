// The shared-memory transport, with nodes in one process (tests/integration/shm_test.cpp has
// the cases that need processes of their own: kills, users, namespaces). Nodes on one host are
// linked over shared memory by default; every guarantee of the ZeroMQ path is tested on it too
// (node_test runs with the default and again as ZeroMq.*); these are the cases of its own.
#include <bus/schemas/demo.capnp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../../bus/net/shm_link.hpp"
#include "support/node_support.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using bus::Message;
using bus::net::Node;
using bus::net::NodeOptions;
using bus::net::Transport;

namespace {

using Reading = Message<demo::Reading>;
using StatsRequest = Message<demo::StatsRequest>;
using StatsReply = Message<demo::StatsReply>;

inline const bus::Topic<Reading> readings{"test.shm.readings"};
inline const bus::Topic<Reading> other{"test.shm.other"};
inline const bus::Endpoint<StatsRequest, StatsReply> echo_ep{"test.shm.echo"};

/// A node of this test: shared memory unless told otherwise, large messages allowed.
NodeOptions node(const char* name, Transport t = Transport::kAuto) {
  return bus_test::local_node(name).transport(t).max_message_bytes(16 << 20);
}

/// Two nodes that listen to each other.
struct Pair {
  explicit Pair(Transport t = Transport::kAuto) : Pair(node("a", t), node("b", t)) {}
  Pair(NodeOptions oa, NodeOptions ob) : a(bus_a, oa), b(bus_b, ob) {
    a.peer(b.publish_address());
    b.peer(a.publish_address());
  }
  bus::Bus bus_a, bus_b;
  Node a, b;
};

Reading reading(uint64_t seq, std::size_t bytes = 0) {
  return bus::build<demo::Reading>([&](demo::Reading::Builder r) {
    r.setSeq(seq);
    r.setSensor(std::string(bytes, static_cast<char>('a' + seq % 26)));
  });
}

bool linked(const Node& n, std::size_t peers) {
  auto ps = n.peers();
  if (ps.size() != peers) return false;
  for (const auto& p : ps) {
    if (p.transport != Transport::kSharedMemory) return false;
  }
  return true;
}

}  // namespace

TEST(SharedMemory, PeersOnOneHostAreLinkedAndSaySo) {
  Pair p;
  ASSERT_TRUE(bus_test::eventually([&] { return linked(p.a, 1) && linked(p.b, 1); }, 30s));
  EXPECT_EQ(p.a.stats().shm_links, 1u);
  EXPECT_EQ(p.b.stats().shm_links, 1u);  // one link per pair, whoever made it
}

TEST(SharedMemory, ZeroMqForcedKeepsEveryPeerOnZeroMq) {
  Pair p(Transport::kZeroMq);
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.peers().size() == 1; }, 30s));
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  std::atomic<int> got{0};
  auto sub = p.bus_b.subscribe(readings, [&](const Reading&) { got.fetch_add(1); });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 30s));
  ASSERT_TRUE(p.bus_a.publish(readings, reading(1)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return got.load() == 1; }, 30s));
  EXPECT_EQ(p.a.peers()[0].transport, Transport::kZeroMq);
  EXPECT_EQ(p.b.peers()[0].transport, Transport::kZeroMq);
  EXPECT_EQ(p.a.stats().shm_links + p.b.stats().shm_links, 0u);
}

// A node that forces ZeroMQ takes no link; one that would share memory with it keeps ZeroMQ too.
TEST(SharedMemory, ANodeThatForcesZeroMqIsReachedOverZeroMq) {
  Pair p(node("a"), node("b", Transport::kZeroMq));
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.peers().size() == 1; }, 30s));
  EXPECT_EQ(p.a.peers()[0].transport, Transport::kZeroMq);
}

// A publisher that streams while its subscriber links to it: the subscriber's topics move from
// ZeroMQ to the link without one message lost, twice or out of order.
TEST(SharedMemory, APublisherMovesToTheLinkUnderTrafficWithNothingLostOrTwice) {
  bus::Bus bus_a, bus_b;
  Node a(bus_a, node("a"));
  a.export_topic(readings);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> sent{0};
  std::thread publisher([&] {
    while (!stop.load()) {
      if (bus_a.publish(readings, reading(sent.load() + 1)).ok()) sent.fetch_add(1);
      std::this_thread::sleep_for(50us);
    }
  });
  std::mutex mu;
  std::vector<uint64_t> seen;
  Node b(bus_b, node("b"));
  auto sub = bus_b.subscribe(readings, [&](const Reading& r) {
    std::lock_guard lock(mu);
    seen.push_back(r->getSeq());
  });
  b.import_topic(readings);
  b.peer(a.publish_address());
  ASSERT_TRUE(bus_test::eventually([&] { return b.stats().shm_handovers == 1; }, 30s));
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() > 200;
      },
      30s));
  stop.store(true);
  publisher.join();
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return !seen.empty() && seen.back() == sent.load();
      },
      30s));
  std::lock_guard lock(mu);
  for (std::size_t i = 1; i < seen.size(); ++i) ASSERT_EQ(seen[i], seen[i - 1] + 1) << i;
  auto t = b.stats().channel(readings.name());
  EXPECT_EQ(t.gaps, 0u);
  EXPECT_EQ(t.received, seen.size());
}

// Large messages are written once, into the publisher's shared-memory heap, and read in place
// by every subscriber on the host; the heap gets the space back when the last copy goes.
TEST(SharedMemory, ALargeMessageIsReadInPlaceByEverySubscriberAndFreedWhenAllAreDone) {
  bus::Bus bus_a, bus_b, bus_c;
  Node a(bus_a, node("a")), b(bus_b, node("b")), c(bus_c, node("c"));
  b.peer(a.publish_address());
  c.peer(a.publish_address());
  a.export_topic(readings);
  b.import_topic(readings);
  c.import_topic(readings);
  std::mutex mu;
  std::vector<Reading> kept;  // held by the subscribers: the blocks stay pinned
  auto keep = [&](const Reading& r) {
    std::lock_guard lock(mu);
    kept.push_back(r);
  };
  auto sb = bus_b.subscribe(readings, keep);
  auto sc = bus_c.subscribe(readings, keep);
  ASSERT_TRUE(bus_test::eventually(
      [&] { return b.stats().shm_handovers == 1 && c.stats().shm_handovers == 1; }, 30s));
  ASSERT_TRUE(a.wait_for_subscribers(readings.name(), 2, 30s));
  constexpr int kN = 8;
  for (int i = 1; i <= kN; ++i) ASSERT_TRUE(bus_a.publish(readings, reading(i, 4 << 20)).ok());
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return kept.size() == 2 * kN;
      },
      60s));
  {
    std::lock_guard lock(mu);
    for (const Reading& r : kept) {
      std::string s = r->getSensor().cStr();
      ASSERT_EQ(s.size(), 4u << 20);
      ASSERT_EQ(s.find_first_not_of(s[0]), std::string::npos);
    }
  }
  EXPECT_EQ(b.stats().shm_in_place, static_cast<uint64_t>(kN));
  EXPECT_EQ(c.stats().shm_in_place, static_cast<uint64_t>(kN));
  EXPECT_GE(a.stats().shm_pinned_bytes, uint64_t{kN} << 22);
  {
    std::lock_guard lock(mu);
    kept.clear();  // the subscribers are done: the publisher gets its blocks back
  }
  EXPECT_TRUE(bus_test::eventually([&] { return a.stats().shm_pinned_bytes == 0; }, 30s));
}

// A request and its reply of several MiB cross as they are, read in place at each end.
TEST(SharedMemory, LargeRequestsAndRepliesAreReadInPlace) {
  Pair p;
  const std::string big(3 << 20, 'r');
  auto server = p.bus_a.serve(echo_ep, [&](StatsRequest&& req) {
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
      r.initSensors(1)[0].setSensor(req->getSensor());  // as long as the request
    });
  });
  p.a.export_endpoint(echo_ep);
  p.b.import_endpoint(echo_ep);
  ASSERT_TRUE(bus_test::eventually([&] { return linked(p.b, 1); }, 30s));
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 30s));
  const StatsRequest req = bus::build<demo::StatsRequest>([&](auto r) { r.setSensor(big); });
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<StatsReply> rep = p.bus_b.call(echo_ep, req, 30s);  // from a plain thread
    ASSERT_TRUE(rep.ok()) << rep.status();
    ASSERT_EQ(std::string((*rep)->getSensors()[0].getSensor().cStr()), big);
  }
  EXPECT_GE(p.a.stats().shm_in_place, 4u);  // the requests, on the server's side
}

// A subscriber whose bridge thread is stuck stops reading its link: the publisher holds its
// frames for send_stall_limit, then sends on without it (a cut, counted), and every other
// subscriber keeps getting everything. When the stuck one reads again, what it missed is counted
// on both sides: received + gaps == published, and the publisher's peer_missed == its gaps.
TEST(SharedMemory, AStuckReaderIsHeldThenCutAndItsLossIsCountedOnBothSides) {
  bus::Bus bus_a, bus_b, bus_c;
  Node a(bus_a, node("a").send_stall_limit(50ms));
  Node b(bus_b, node("b")), c(bus_c, node("c"));
  for (Node* n : {&b, &c}) n->peer(a.publish_address());
  a.peer(b.publish_address());  // so that a hears b's reports of what it missed
  a.export_topic(readings);
  c.import_topic(readings);
  std::atomic<uint64_t> got_c{0}, got_b{0};
  auto sc = bus_c.subscribe(readings, [&](const Reading&) { got_c.fetch_add(1); });
  bus_test::Gate gate;
  bus_test::OpenOnExit open_on_exit{gate};
  std::atomic<bool> holding{false};
  b.subscribe(readings, [&](const Reading&) {  // on b's bridge thread: holding it holds b's link
    if (got_b.fetch_add(1) == 0) {
      holding.store(true);
      gate.wait();
    }
  });
  ASSERT_TRUE(bus_test::eventually(
      [&] { return b.stats().shm_handovers == 1 && c.stats().shm_handovers == 1; }, 30s));
  ASSERT_TRUE(a.wait_for_subscribers(readings.name(), 2, 30s));
  constexpr uint64_t kN = 20000;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(bus_a.publish(readings, reading(i, 100)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return got_c.load() == kN; }, 60s));
  EXPECT_TRUE(holding.load());
  EXPECT_GE(a.stats().publish_cuts, 1u);
  gate.open();
  // Its last heartbeat report comes a heartbeat after it counted (the tail: by a's heartbeat).
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        auto t = b.stats().channel(readings.name());
        return t.received + t.gaps == kN &&
               a.stats().channel(readings.name()).peer_missed == t.gaps;
      },
      60s))
      << "b: received " << b.stats().channel(readings.name()).received << " gaps "
      << b.stats().channel(readings.name()).gaps << "; a: peer_missed "
      << a.stats().channel(readings.name()).peer_missed;
  EXPECT_GT(b.stats().channel(readings.name()).gaps, 0u);
  EXPECT_EQ(c.stats().channel(readings.name()).gaps, 0u);
}

// A message over its channel's limit is not sent, with a counter, and the channel goes on; a
// larger limit on one channel lets that channel's larger messages through.
TEST(SharedMemory, AMessageOverItsChannelsLimitIsRefusedAndCounted) {
  Pair p(node("a").max_message_bytes(1 << 20).message_limit(other.name(), 8 << 20),
         node("b").max_message_bytes(1 << 20).message_limit(other.name(), 8 << 20));
  p.a.export_topic(readings).export_topic(other);
  p.b.import_topic(readings).import_topic(other);
  std::atomic<int> got_readings{0}, got_other{0};
  auto s1 = p.bus_b.subscribe(readings, [&](const Reading&) { got_readings.fetch_add(1); });
  auto s2 = p.bus_b.subscribe(other, [&](const Reading&) { got_other.fetch_add(1); });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 30s));
  ASSERT_TRUE(p.a.wait_for_subscribers(other.name(), 1, 30s));
  ASSERT_TRUE(p.bus_a.publish(readings, reading(1, 2 << 20)).ok());  // over 1 MiB: refused
  ASSERT_TRUE(p.bus_a.publish(readings, reading(2, 100)).ok());
  ASSERT_TRUE(p.bus_a.publish(other, reading(3, 2 << 20)).ok());  // under its 8 MiB
  ASSERT_TRUE(bus_test::eventually([&] { return got_readings == 1 && got_other == 1; }, 30s));
  EXPECT_EQ(p.a.stats().oversized, 1u);
}

// Bytes in a peer's segment that do not read as frames: the link is dropped and counted, the
// node goes on (here: a made-up peer that links to the node, then writes a frame header whose
// size runs past what it committed).
TEST(SharedMemory, ACorruptPeerIsDroppedAndCountedAndTheNodeGoesOn) {
  namespace d = bus::net::detail;
  Pair p;
  auto server = p.bus_a.serve(echo_ep, [&](StatsRequest&&) { return StatsReply(); });
  p.a.export_endpoint(echo_ep);
  p.b.import_endpoint(echo_ep);
  absl::StatusOr<int> sock = d::ShmLink::connect_to(p.a.id());
  ASSERT_TRUE(sock.ok()) << sock.status();
  auto link = d::ShmLink::make(*sock, 42, d::ShmLink::Role::kLane, d::ShmSettings{});
  ASSERT_TRUE(link.ok()) << link.status();
  ASSERT_TRUE((*link)->send_hello(d::ShmLink::Verdict::kWelcome, "", -1).ok());
  absl::StatusOr<d::ShmLink::Hello> hello;
  ASSERT_TRUE(bus_test::eventually(
      [&] { return !absl::IsUnavailable((hello = (*link)->receive_hello()).status()); }, 30s));
  ASSERT_TRUE(hello.ok()) << hello.status();
  ASSERT_TRUE((*link)->attach(*hello).ok());
  // A frame that claims more bytes than its writer committed: caught before anything is read.
  std::string junk(64, '\xff');
  ASSERT_TRUE((*link)->write(d::shm::FrameType::kData, "x", junk, junk));
  d::shm::LinkHeader* h = (*link)->header_for_tests();
  char* frame = reinterpret_cast<char*>(h) + d::shm::kHeaderBytes;
  uint32_t lie = 1 << 20;
  std::memcpy(frame, &lie, sizeof lie);
  (*link)->wake();
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.stats().shm_corrupt == 1; }, 30s));
  // The node goes on: the healthy peer's calls are answered.
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 30s));
  EXPECT_TRUE(p.bus_b.call(echo_ep, StatsRequest(), 30s).ok());
}

TEST(SharedMemory, TheConfigFileTakesTheTransportKeys) {
  auto o = NodeOptions::parse(
      "publish = tcp://127.0.0.1:7001\n"
      "transport = zmq\n"
      "shm_ring_bytes = 1048576\n"
      "shm_heap_limit = 1073741824\n"
      "shm_spin_us = 200\n"
      "message_limit = demo.images 67108864\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->transport(), Transport::kZeroMq);
  EXPECT_EQ(o->shm_ring_bytes(), 1u << 20);
  EXPECT_EQ(o->shm_heap_limit(), 1u << 30);
  EXPECT_EQ(o->shm_spin(), 200us);
  EXPECT_EQ(o->message_limit_of("demo.images"), 64u << 20);
  EXPECT_EQ(o->message_limit_of("demo.other"), o->max_message_bytes());
  auto bad = NodeOptions::parse("publish = tcp://127.0.0.1:7001\ntransport = pigeon\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("auto, zmq or shm"), std::string::npos);
  auto ring = NodeOptions::parse("publish = tcp://127.0.0.1:7001\nshm_ring_bytes = 1000\n");
  ASSERT_FALSE(ring.ok());
  EXPECT_NE(ring.status().message().find("power of two"), std::string::npos);
}
