// Bus::call from a plain thread to another node's server: the caller's thread sends the request
// and waits for the reply itself (a lane of the node), not through the bridge thread. Two nodes
// in one process, each on its own bus, over real sockets.
#include <bus/schemas/demo.capnp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/node_support.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using bus::Message;

namespace {

using StatsRequest = Message<demo::StatsRequest>;
using StatsReply = Message<demo::StatsReply>;

inline const bus::Endpoint<StatsRequest, StatsReply> echo_ep{"test.direct.echo"};

StatsRequest ask(const std::string& sensor) {
  return bus::build<demo::StatsRequest>([&](auto r) { r.setSensor(sensor); });
}

/// Answers with the request's sensor name, so that each caller can tell its own answer.
StatsReply echo(StatsRequest&& req) {
  return bus::build<demo::StatsReply>(
      [&](demo::StatsReply::Builder r) { r.initSensors(1)[0].setSensor(req->getSensor()); });
}

std::string sensor_of(const StatsReply& rep) {
  return rep->getSensors().size() == 1 ? rep->getSensors()[0].getSensor().cStr() : "";
}

/// "a" serves (one executor: its requests are answered in order), "b" calls.
struct Pair : bus_test::NodePair {
  Pair() : NodePair(1) {
    a.export_endpoint(echo_ep);
    b.import_endpoint(echo_ep);
  }
};

/// A call from a thread of its own to a server that holds it until the test ends; `interrupt`
/// runs once the server has the request. Returns what the call returned.
absl::StatusOr<StatsReply> interrupted_call(Pair& p, const std::function<void()>& interrupt) {
  bus_test::Gate gate;
  std::atomic<bool> started{false};
  auto server = p.bus_a.serve(echo_ep, [&](StatsRequest&& req) {
    started.store(true);
    gate.wait();
    return echo(std::move(req));
  });
  bus_test::OpenOnExit open{gate};
  EXPECT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  absl::StatusOr<StatsReply> rep = absl::UnknownError("not answered");
  std::thread caller([&] { rep = p.bus_b.call(echo_ep, ask("x"), 120s); });
  EXPECT_TRUE(bus_test::eventually([&] { return started.load(); }));
  interrupt();
  caller.join();
  return rep;
}

}  // namespace

TEST(DirectCall, APlainThreadsCallsGoStraightToTheServerAndAreCounted) {
  Pair p;
  auto server = p.bus_a.serve(echo_ep, echo);
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  constexpr int kN = 50;
  for (int i = 0; i < kN; ++i) {
    std::string sensor = "s" + std::to_string(i);
    absl::StatusOr<StatsReply> rep = p.bus_b.call(echo_ep, ask(sensor), 10s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(sensor_of(*rep), sensor);
  }
  bus::net::NodeStats s = p.b.stats();
  EXPECT_EQ(s.direct_calls, static_cast<uint64_t>(kN));
  EXPECT_EQ(s.request_frames, static_cast<uint64_t>(kN));
  bus::net::ChannelTraffic t = s.channel(echo_ep.name());
  EXPECT_EQ(t.sent, static_cast<uint64_t>(kN));
  EXPECT_EQ(t.received, static_cast<uint64_t>(kN));
  EXPECT_EQ(t.rejected, 0u);
  // The rows name the server, as the bridge's own rows do.
  bool named = false;
  for (const auto& row : s.traffic) {
    if (row.channel == echo_ep.name() && row.peer == p.a.id()) named = row.peer_name == "a";
  }
  EXPECT_TRUE(named);
  // The server saw them as requests from the client node.
  EXPECT_EQ(p.a.stats().channel(echo_ep.name()).received, static_cast<uint64_t>(kN));
  // Handler errors keep their status on this path too.
  auto failing = p.bus_a.serve(echo_ep, [](StatsRequest&&) -> absl::StatusOr<StatsReply> {
    return absl::NotFoundError("no such sensor");
  });
  bool saw_error = false;
  for (int i = 0; i < 20 && !saw_error; ++i) {  // round-robin with the echo server
    absl::StatusOr<StatsReply> rep = p.bus_b.call(echo_ep, ask("x"), 10s);
    if (!rep.ok()) {
      EXPECT_EQ(rep.status().code(), absl::StatusCode::kNotFound);
      EXPECT_EQ(rep.status().message(), "no such sensor");
      saw_error = true;
    }
  }
  EXPECT_TRUE(saw_error);
}

TEST(DirectCall, ALateReplyIsSkippedAndTheNextCallGetsItsOwnAnswer) {
  bus_test::Gate gate;
  Pair p;
  bus_test::OpenOnExit open{gate};  // (declared after the nodes: opens before they stop)
  std::atomic<int> handled{0};
  // Served on a's bridge thread: while the first request waits at the gate, a's node does
  // nothing else, so it answers "first" (with "first") after the caller gave up, then "second".
  p.a.serve(echo_ep, [&](StatsRequest&& req) {
    if (handled.fetch_add(1) == 0) gate.wait();
    return echo(std::move(req));
  });
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  ASSERT_TRUE(bus_test::settled(p.b, "a"));  // both calls take the same path
  absl::StatusOr<StatsReply> first = p.bus_b.call(echo_ep, ask("first"), 200ms);
  ASSERT_FALSE(first.ok());
  EXPECT_EQ(first.status().code(), absl::StatusCode::kDeadlineExceeded);
  gate.open();
  // The same thread, so the same lane: the answer to "first" comes before this one's and must
  // not be taken for it.
  absl::StatusOr<StatsReply> second = p.bus_b.call(echo_ep, ask("second"), 10s);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(sensor_of(*second), "second");
  EXPECT_EQ(p.b.stats().late_replies, 1u);
  absl::StatusOr<StatsReply> third = p.bus_b.call(echo_ep, ask("third"), 10s);
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(sensor_of(*third), "third");
}

TEST(DirectCall, ANodeThatComesBackAfterBeingGivenUpOnTakesCallsAgain) {
  bus_test::Gate gate;
  Pair p;
  bus_test::OpenOnExit open{gate};
  static const bus::Endpoint<StatsRequest, StatsReply> hold_ep{"test.direct.hold"};
  auto server = p.bus_a.serve(echo_ep, echo);
  // A handler on a's bridge thread that holds it: a sends no heartbeats until the gate opens,
  // so b gives it up (and fails the call waiting on it), then hears it again, same node id.
  p.a.serve(hold_ep, [&](StatsRequest&& req) {
    gate.wait();
    return echo(std::move(req));
  });
  p.b.import_endpoint(hold_ep);
  ASSERT_TRUE(p.b.wait_for_server(hold_ep.name(), 10s));
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  absl::StatusOr<StatsReply> held = p.bus_b.call(hold_ep, ask("held"), 120s);
  ASSERT_FALSE(held.ok());
  EXPECT_EQ(held.status().code(), absl::StatusCode::kAborted) << held.status();
  EXPECT_GE(p.b.stats().calls_peer_gone, 1u);
  gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return p.b.peers().size() == 1; }));
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  for (int i = 0; i < 10; ++i) {
    std::string sensor = "back" + std::to_string(i);
    absl::StatusOr<StatsReply> rep = p.bus_b.call(echo_ep, ask(sensor), 10s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(sensor_of(*rep), sensor);
  }
}

TEST(DirectCall, ManyThreadsCallAtOnceAndEachGetsItsOwnAnswers) {
  Pair p;
  auto server = p.bus_a.serve(echo_ep, echo);
  ASSERT_TRUE(p.b.wait_for_server(echo_ep.name(), 10s));
  constexpr int kThreads = 8, kCalls = 100;
  std::atomic<int> right{0}, wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < kThreads; ++t) {
    callers.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        std::string sensor = std::to_string(t) + "/" + std::to_string(i);
        absl::StatusOr<StatsReply> rep = p.bus_b.call(echo_ep, ask(sensor), 30s);
        (rep.ok() && sensor_of(*rep) == sensor ? right : wrong).fetch_add(1);
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(right.load(), kThreads * kCalls);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(p.b.stats().direct_calls, static_cast<uint64_t>(kThreads * kCalls));
}

TEST(DirectCall, StoppingTheCallersNodeCancelsACallInFlight) {
  Pair p;
  absl::StatusOr<StatsReply> rep = interrupted_call(p, [&] { p.b.stop(); });
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kCancelled) << rep.status();
  // A call after the stop does not go anywhere.
  EXPECT_FALSE(p.bus_b.call(echo_ep, ask("y"), 1s).ok());
}

TEST(DirectCall, StoppingTheCallersBusCancelsACallInFlight) {
  Pair p;
  absl::StatusOr<StatsReply> rep = interrupted_call(p, [&] { ASSERT_TRUE(p.bus_b.stop().ok()); });
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kCancelled) << rep.status();
}

TEST(DirectCall, ACallWaitingOnANodeThatLeavesFailsAtOnce) {
  Pair p;
  // The server node says goodbye while its handler is still busy.
  absl::StatusOr<StatsReply> rep = interrupted_call(p, [&] { p.a.stop(); });
  ASSERT_FALSE(rep.ok());
  // "peer gone" (its goodbye reached the client first) or the server's own Cancelled answer
  // for a request it could no longer serve: either way not the deadline.
  EXPECT_TRUE(rep.status().code() == absl::StatusCode::kAborted ||
              rep.status().code() == absl::StatusCode::kCancelled)
      << rep.status();
}

TEST(DirectCall, ALaneTalksCurveWithTheNodesKeys) {
  auto ka = bus::net::CurveKeys::generate(), kb = bus::net::CurveKeys::generate();
  bus::Bus ba{bus::Options().executors(1)}, bb{bus::Options().executors(1)};
  bus::net::Node a{ba, bus_test::local_node("a").curve(ka, {kb.public_key})};
  bus::net::Node b{bb, bus_test::local_node("b")
                           .curve(kb, {ka.public_key})
                           .peer(a.publish_address(), ka.public_key)};
  a.peer(b.publish_address(), kb.public_key);
  auto server = ba.serve(echo_ep, echo);
  a.export_endpoint(echo_ep);
  b.import_endpoint(echo_ep);
  ASSERT_TRUE(b.wait_for_server(echo_ep.name(), 10s));
  for (int i = 0; i < 20; ++i) {
    std::string sensor = "c" + std::to_string(i);
    absl::StatusOr<StatsReply> rep = bb.call(echo_ep, ask(sensor), 10s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ(sensor_of(*rep), sensor);
  }
  EXPECT_EQ(b.stats().direct_calls, 20u);
  EXPECT_EQ(a.stats().auth_denied, 0u);
}
