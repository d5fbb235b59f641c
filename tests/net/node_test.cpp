// Two or three nodes in one process, each on its own bus, talking over real sockets.
#include <absl/strings/str_cat.h>
#include <bus/schemas/demo.capnp.h>
#include <bus/schemas/envelope.capnp.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "support/node_support.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using bus::Message;
using bus::net::Node;
using bus::net::NodeOptions;

namespace {

using Reading = Message<demo::Reading>;
using StatsRequest = Message<demo::StatsRequest>;
using StatsReply = Message<demo::StatsReply>;

inline const bus::Topic<Reading> readings{"test.net.readings"};
inline const bus::Endpoint<StatsRequest, StatsReply> stats_ep{"test.net.stats"};
inline const bus::Queue<Reading> jobs{"test.net.jobs"};
inline const bus::Endpoint<StatsRequest, StatsReply> failing_ep{"test.net.failing"};
inline const bus::Endpoint<StatsRequest, StatsReply> slow_ep{"test.net.slow"};
inline const bus::Topic<Reading> alerts{"test.net.alerts"};

Reading reading(uint64_t seq, double v) {
  return bus::build<demo::Reading>([&](demo::Reading::Builder r) {
    r.setSensor("s1");
    r.setSeq(seq);
    r.setValue(v);
  });
}

StatsRequest ask(const char* sensor = "") {
  return bus::build<demo::StatsRequest>([&](auto r) { r.setSensor(sensor); });
}

using bus_test::local_node;
using Pair = bus_test::NodePair;

/// Makes `n` requests to stats_ep at once, from executor 0 of `bus`: request i asks for sensor
/// `sensor(i)` within `timeout(i)`. Returns the answers in request order once all came (one that
/// never came keeps "no answer yet"; late callbacks find the state still alive).
std::vector<absl::StatusOr<StatsReply>> pipeline(
    bus::Bus& bus, int n, std::function<std::string(int)> sensor,
    std::function<std::chrono::milliseconds(int)> timeout) {
  struct State {
    std::mutex mu;
    std::vector<absl::StatusOr<StatsReply>> results;
    std::atomic<int> answered{0};
  };
  auto st = std::make_shared<State>();
  st->results.assign(n, absl::UnknownError("no answer yet"));
  EXPECT_TRUE(bus.post(bus::on_executor(0),
                       [&bus, st, n, sensor, timeout] {
                         for (int i = 0; i < n; ++i) {
                           bus.request(stats_ep, ask(sensor(i).c_str()), timeout(i),
                                       [st, i](absl::StatusOr<StatsReply> r) {
                                         std::lock_guard lock(st->mu);
                                         st->results[i] = std::move(r);
                                         st->answered.fetch_add(1);
                                       });
                         }
                       })
                  .ok());
  EXPECT_TRUE(bus_test::eventually([&] { return st->answered.load() == n; }, 60s));
  std::lock_guard lock(st->mu);
  return st->results;
}

}  // namespace

TEST(Node, TopicMessagesCrossInOrderWithNothingLost) {
  Pair p;
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  std::mutex mu;
  std::vector<uint64_t> seen;
  double sum = 0;
  auto sub = p.bus_b.subscribe(readings, [&](const Reading& r) {
    std::lock_guard lock(mu);
    seen.push_back(r->getSeq());
    sum += r->getValue();
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
  constexpr uint64_t kN = 20000;
  double expect = 0;
  for (uint64_t i = 1; i <= kN; ++i) {
    ASSERT_TRUE(p.bus_a.publish(readings, reading(i, 0.5 * i)).ok());
    expect += 0.5 * i;
  }
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() == kN;
      },
      30s));
  std::lock_guard lock(mu);
  for (uint64_t i = 0; i < kN; ++i) ASSERT_EQ(seen[i], i + 1);
  EXPECT_DOUBLE_EQ(sum, expect);
  auto st = p.b.stats().channel(readings.name());
  EXPECT_EQ(st.received, kN);
  EXPECT_EQ(st.gaps, 0u);
  EXPECT_EQ(st.rejected, 0u);
}

// A publisher's frame holds what several drains of its bridge's inbox took (up to 32 KiB), not
// one drain's batch of 256 records: the receiver pays per frame.
TEST(Node, APublisherFillsItsFramesFromSeveralDrainBatches) {
  bus_test::Gate gate;  // outlives the nodes: A's bridge thread may still be leaving it
  Pair p;
  bus_test::OpenOnExit open_on_exit{gate};  // however the test ends, A's bridge thread goes on
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  p.b.export_topic(alerts);
  std::atomic<uint64_t> got{0};
  auto sub = p.bus_b.subscribe(readings, [&](const Reading&) { got.fetch_add(1); });
  // A handler on A's bridge thread holds that thread while A's publisher fills its ring.
  std::atomic<bool> holding{false};
  p.a.subscribe(alerts, [&](const Reading&) {
    holding = true;
    gate.wait();
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
  ASSERT_TRUE(p.b.wait_for_subscribers(alerts.name(), 1, 10s));
  uint64_t frames_before = p.a.stats().publish_frames;  // (asked of A's bridge thread: not later)
  ASSERT_TRUE(p.bus_b.publish(alerts, reading(1, 1.0)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return holding.load(); }));
  // 1,024 readings of 56 bytes on the wire (one ring of 64 KiB holds them): 56 KiB, two frames.
  constexpr uint64_t kN = 4 * bus::ExternalInbox::kBatch;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(p.bus_a.publish(readings, reading(i, 1.0)).ok());
  gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return got.load() == kN; }, 30s));
  bus::net::NodeStats a = p.a.stats();
  EXPECT_EQ(a.published, kN);
  EXPECT_LE(a.publish_frames - frames_before, 2u) << "one drain per frame would take 4";
}

TEST(Node, RequestReplyCrossesNodes) {
  Pair p;
  auto server = p.bus_a.serve(stats_ep, [](StatsRequest&& req) {
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
      r.setReadings(42);
      auto s = r.initSensors(1);
      s[0].setSensor(req->getSensor());
    });
  });
  p.a.export_endpoint(stats_ep);
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<StatsReply> rep = p.bus_b.call(stats_ep, ask("kitchen"), 5s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ((*rep)->getReadings(), 42u);
    EXPECT_EQ(std::string((*rep)->getSensors()[0].getSensor().cStr()), "kitchen");
  }
  // From an executor, with a callback on the caller's executor.
  std::atomic<int> ok{0};
  for (int i = 0; i < 100; ++i) {
    (void)p.bus_b.post(bus::on_executor(0), [&] {
      p.bus_b.request(stats_ep, ask("x"), 5s, [&](absl::StatusOr<StatsReply> r) {
        if (r.ok() && p.bus_b.current_executor() == 0u) ok.fetch_add(1);
      });
    });
  }
  ASSERT_TRUE(bus_test::eventually([&] { return ok.load() == 100; }, 30s));
}

TEST(Node, HandlerErrorsKeepTheirStatusAcrossNodes) {
  Pair p;
  auto server = p.bus_a.serve(failing_ep, [](StatsRequest&&) -> absl::StatusOr<StatsReply> {
    return absl::NotFoundError("no such sensor");
  });
  p.a.export_endpoint(failing_ep);
  p.b.import_endpoint(failing_ep);
  ASSERT_TRUE(p.b.wait_for_server(failing_ep.name(), 10s));
  auto rep = p.bus_b.call(failing_ep, ask(), 5s);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(rep.status().message(), "no such sensor");
}

TEST(Node, PipelinedRequestsTravelInBatchesAndEachGetsItsOwnAnswer) {
  // 600 requests from one handler: they leave in a few frames (request batches) and come back
  // in a few (reply batches) with, each, its own outcome: a reply, a handler error, or its own
  // deadline (the held ones ask for 300 ms, the others for 30 s, in the same batches).
  Pair p;
  std::mutex held_mu;
  std::vector<bus::Replier<StatsReply>> held;
  auto server =
      p.bus_a.serve_async(stats_ep, [&](StatsRequest&& req, bus::Replier<StatsReply> reply) {
        std::string s = req->getSensor().cStr();
        if (s == "hold") {
          std::lock_guard lock(held_mu);
          held.push_back(std::move(reply));  // answered only after the test looked
          return;
        }
        uint64_t n = std::stoull(s.substr(s.find(':') + 1));
        if (s.starts_with("err:")) return reply(absl::NotFoundError(absl::StrCat("no ", n)));
        reply(bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) { r.setReadings(n); }));
      });
  p.a.export_endpoint(stats_ep);
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  ASSERT_TRUE(bus_test::eventually([&] { return !p.b.peers().empty(); }, 10s));

  constexpr int kN = 600;
  std::vector<absl::StatusOr<StatsReply>> results = pipeline(
      p.bus_b, kN,
      [](int i) {
        return i % 3 == 0   ? absl::StrCat("ok:", i)
               : i % 3 == 1 ? absl::StrCat("err:", i)
                            : std::string("hold");
      },
      [](int i) -> std::chrono::milliseconds { return i % 3 == 2 ? 300ms : 30s; });
  {
    for (int i = 0; i < kN; ++i) {
      const auto& r = results[i];
      if (i % 3 == 0) {
        ASSERT_TRUE(r.ok()) << i << ": " << r.status();
        EXPECT_EQ((*r)->getReadings(), static_cast<uint64_t>(i));
      } else if (i % 3 == 1) {
        ASSERT_EQ(r.status().code(), absl::StatusCode::kNotFound) << i << ": " << r.status();
        EXPECT_EQ(r.status().message(), absl::StrCat("no ", i));
      } else {
        EXPECT_EQ(r.status().code(), absl::StatusCode::kDeadlineExceeded)
            << i << ": " << r.status();
      }
    }
  }
  // Node A may still be taking held requests (its deadline runs from when it received them), and
  // under load one may expire before A's executor reaches it: A then answers DeadlineExceeded
  // without the handler and counts it expired. Every held request is one or the other.
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(held_mu);
    return held.size() + p.bus_a.stats().channel(stats_ep.name())->expired ==
           static_cast<std::size_t>(kN / 3);
  }));
  {
    std::lock_guard lock(held_mu);
    held.clear();  // answered now (Internal): late, and counted so by the caller's node
  }
  bus::net::NodeStats client = p.b.stats(), srv = p.a.stats();
  EXPECT_EQ(client.channel(stats_ep.name()).sent, static_cast<uint64_t>(kN));
  EXPECT_EQ(srv.channel(stats_ep.name()).received, static_cast<uint64_t>(kN));
  // Batched: far fewer frames than requests (one per message without batching).
  EXPECT_GE(client.request_frames, 1u);
  EXPECT_LT(client.request_frames, static_cast<uint64_t>(kN / 4));
  EXPECT_GE(srv.reply_frames, 1u);
  EXPECT_LT(srv.reply_frames, static_cast<uint64_t>(kN / 4));
}

TEST(Node, AnEndpointServedOnTheBridgeThreadAnswersEveryCallerInline) {
  // Node A serves the endpoint on its bridge thread: remote requests (one by one, and pipelined
  // in batches) and in-process ones all run there, never on an executor, each with its own
  // outcome, and the bus counts them as it counts any server's.
  Pair p;
  std::atomic<uint64_t> ran{0}, on_executor{0};
  std::mutex ids_mu;
  std::set<std::thread::id> threads;
  p.a.serve(stats_ep, [&](StatsRequest&& req) -> absl::StatusOr<StatsReply> {
    ran.fetch_add(1);
    if (p.bus_a.current_executor()) on_executor.fetch_add(1);
    {
      std::lock_guard lock(ids_mu);
      threads.insert(std::this_thread::get_id());
    }
    std::string s = req->getSensor().cStr();
    if (s == "boom") throw std::runtime_error("sensor on fire");
    if (s.starts_with("err:")) return absl::NotFoundError(s);
    uint64_t n = s.empty() ? 0 : std::stoull(s.substr(s.find(':') + 1));
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) { r.setReadings(n); });
  });
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));

  for (uint64_t i = 0; i < 50; ++i) {
    auto rep = p.bus_b.call(stats_ep, ask(absl::StrCat("ok:", i).c_str()), 10s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    EXPECT_EQ((*rep)->getReadings(), i);
  }
  auto nf = p.bus_b.call(stats_ep, ask("err:7"), 10s);
  EXPECT_EQ(nf.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(nf.status().message(), "err:7");
  auto boom = p.bus_b.call(stats_ep, ask("boom"), 10s);
  EXPECT_EQ(boom.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(boom.status().message().find("sensor on fire"), std::string::npos) << boom.status();

  // Pipelined from an executor of B: they reach A in batches and are answered in one pass each.
  constexpr int kN = 500;
  std::vector<absl::StatusOr<StatsReply>> results = pipeline(
      p.bus_b, kN, [](int i) { return absl::StrCat(i % 2 == 0 ? "ok:" : "err:", i); },
      [](int) -> std::chrono::milliseconds { return 30s; });
  {
    for (int i = 0; i < kN; ++i) {
      if (i % 2 == 0) {
        ASSERT_TRUE(results[i].ok()) << i << ": " << results[i].status();
        EXPECT_EQ((*results[i])->getReadings(), static_cast<uint64_t>(i));
      } else {
        EXPECT_EQ(results[i].status().code(), absl::StatusCode::kNotFound) << i;
        EXPECT_EQ(results[i].status().message(), absl::StrCat("err:", i));
      }
    }
  }

  // In-process callers of A reach the same handler, through the bridge's inbox.
  auto local = p.bus_a.call(stats_ep, ask("ok:99"), 10s);
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ((*local)->getReadings(), 99u);

  constexpr uint64_t kCalls = 50 + 2 + kN + 1;
  EXPECT_EQ(ran.load(), kCalls);
  EXPECT_EQ(on_executor.load(), 0u);
  {
    std::lock_guard lock(ids_mu);
    EXPECT_EQ(threads.size(), 1u);  // the bridge thread, for every caller
  }
  const bus::Stats bus_stats = p.bus_a.stats();  // channel() points into it
  const bus::ChannelStats* st = bus_stats.channel(stats_ep.name());
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->published, kCalls);
  EXPECT_EQ(st->delivered, kCalls - 1);
  EXPECT_EQ(st->handler_failed, 1u);
  EXPECT_EQ(p.a.stats().channel(stats_ep.name()).received, kCalls - 1);
  EXPECT_LT(p.a.stats().reply_frames, static_cast<uint64_t>(50 + 2 + kN / 4));

  // A stopped node serves no more: in-process callers find no handler.
  p.a.stop();
  auto after = p.bus_a.call(stats_ep, ask("ok:1"), 10s);
  EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << after.status();
}

TEST(Node, ServingAnAlreadyExportedEndpointAddsTheBridgeServer) {
  // export_endpoint() then serve() on the same endpoint: the second adds its handler to the
  // export the first made (the bridge keeps one export per name).
  Pair p;
  std::atomic<int> executor_calls{0}, bridge_calls{0};
  auto on_executor = p.bus_a.serve(stats_ep, [&](StatsRequest&&) {
    executor_calls.fetch_add(1);
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) { r.setReadings(1); });
  });
  p.a.export_endpoint(stats_ep);
  p.a.serve(stats_ep, [&](StatsRequest&&) {
    bridge_calls.fetch_add(1);
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) { r.setReadings(2); });
  });
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  // Routing takes turns between the two local servers of A, remote requests included.
  uint64_t sum = 0;
  for (int i = 0; i < 40; ++i) {
    auto rep = p.bus_b.call(stats_ep, ask(), 10s);
    ASSERT_TRUE(rep.ok()) << rep.status();
    sum += (*rep)->getReadings();
  }
  EXPECT_EQ(executor_calls.load() + bridge_calls.load(), 40);
  EXPECT_GT(executor_calls.load(), 0);
  EXPECT_GT(bridge_calls.load(), 0);
  EXPECT_EQ(sum, static_cast<uint64_t>(executor_calls.load() + 2 * bridge_calls.load()));
}

TEST(Node, ATopicSubscribedOnTheBridgeThreadTakesRemoteAndLocalMessagesInline) {
  // Node B subscribes on its bridge thread: A's messages reach the handler there, in order, never
  // on an executor; B's own publishes reach it too; a throw is counted and the rest go on.
  Pair p;
  p.a.export_topic(readings);
  std::mutex mu;
  std::vector<uint64_t> seen;
  std::set<std::thread::id> threads;
  std::atomic<uint64_t> on_executor{0};
  p.b.subscribe(readings, [&](const Reading& r) {
    if (p.bus_b.current_executor()) on_executor.fetch_add(1);
    {
      std::lock_guard lock(mu);
      seen.push_back(r->getSeq());
      threads.insert(std::this_thread::get_id());
    }
    if (r->getSeq() == 13) throw std::runtime_error("unlucky reading");
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
  constexpr uint64_t kN = 5000;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(p.bus_a.publish(readings, reading(i, 1.0)).ok());
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() == kN;
      },
      30s));
  constexpr uint64_t kLocal = 5;
  for (uint64_t i = 1; i <= kLocal; ++i) {
    ASSERT_TRUE(p.bus_b.publish(readings, reading(kN + i, 2.0)).ok());
  }
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() == kN + kLocal;
      },
      30s));
  {
    std::lock_guard lock(mu);
    for (uint64_t i = 0; i < kN + kLocal; ++i) ASSERT_EQ(seen[i], i + 1);
    EXPECT_EQ(threads.size(), 1u);  // the bridge thread, for remote and local messages alike
  }
  EXPECT_EQ(on_executor.load(), 0u);
  const bus::Stats bus_stats = p.bus_b.stats();  // channel() points into it
  const bus::ChannelStats* st = bus_stats.channel(readings.name());
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(st->delivered, kN + kLocal - 1);
  EXPECT_EQ(st->handler_failed, 1u);
  auto net = p.b.stats().channel(readings.name());
  EXPECT_EQ(net.received, kN);
  EXPECT_EQ(net.gaps, 0u);
}

TEST(Node, ABridgeSubscriberAndExecutorSubscribersOfOneImportEachGetEveryMessage) {
  // import_topic() and an executor subscriber first, then subscribe() on the bridge: the second
  // adds its handler to the import the first made, and neither takes messages from the other.
  Pair p;
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  std::atomic<uint64_t> on_executor{0}, on_bridge{0}, bridge_sum{0};
  auto sub = p.bus_b.subscribe(readings, [&](const Reading&) { on_executor.fetch_add(1); });
  p.b.subscribe(readings, [&](const Reading& r) {
    on_bridge.fetch_add(1);
    bridge_sum.fetch_add(r->getSeq());
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
  constexpr uint64_t kN = 1000;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(p.bus_a.publish(readings, reading(i, 1.0)).ok());
  ASSERT_TRUE(bus_test::eventually(
      [&] { return on_executor.load() == kN && on_bridge.load() == kN; }, 30s));
  EXPECT_EQ(bridge_sum.load(), kN * (kN + 1) / 2);
  EXPECT_EQ(p.bus_b.stats().channel(readings.name())->delivered, 2 * kN);
}

TEST(Node, HandlersOnTheBridgeThreadPublishAndCallAcrossNodes) {
  // What a bridge-thread handler publishes, sends or requests is the handler's own: it reaches
  // other nodes like anything published on an executor (only what the bridge hands on from
  // another node stays local).
  Pair p;
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  std::mutex mu;
  std::vector<uint64_t> seen;
  auto sub = p.bus_b.subscribe(readings, [&](const Reading& r) {
    std::lock_guard lock(mu);
    seen.push_back(r->getSeq());
  });
  // A's server publishes a reading per request, on A's bridge thread.
  p.a.serve(stats_ep, [&](StatsRequest&& req) {
    uint64_t n = std::stoull(req->getSensor().cStr());
    EXPECT_TRUE(p.bus_a.publish(readings, reading(n, 1.0)).ok());
    // Blocking the bridge thread is refused: a reply from another node could never be read.
    EXPECT_EQ(p.bus_a.call(failing_ep, ask(), 10s).status().code(),
              absl::StatusCode::kFailedPrecondition);
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) { r.setReadings(n); });
  });
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
  auto remote = p.bus_b.call(stats_ep, ask("1"), 10s);  // served inline on A's bridge
  ASSERT_TRUE(remote.ok()) << remote.status();
  auto local = p.bus_a.call(stats_ep, ask("2"), 10s);  // through A's bridge inbox
  ASSERT_TRUE(local.ok()) << local.status();
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return seen.size() == 2;
      },
      30s));
  {
    std::lock_guard lock(mu);
    EXPECT_EQ(seen, (std::vector<uint64_t>{1, 2}));
  }

  // B's bridge-thread subscriber calls an endpoint that only A serves.
  auto failing = p.bus_a.serve(failing_ep, [](StatsRequest&&) -> absl::StatusOr<StatsReply> {
    return absl::NotFoundError("answered by A");
  });
  p.a.export_endpoint(failing_ep).export_topic(alerts);
  p.b.import_endpoint(failing_ep);
  ASSERT_TRUE(p.b.wait_for_server(failing_ep.name(), 10s));
  std::atomic<int> answers{0};
  absl::Status answer;
  p.b.subscribe(alerts, [&](const Reading&) {
    p.bus_b.request(failing_ep, ask(), 10s, [&](absl::StatusOr<StatsReply> r) {
      {
        std::lock_guard lock(mu);
        answer = r.status();
      }
      answers.fetch_add(1);
    });
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(alerts.name(), 1, 10s));
  ASSERT_TRUE(p.bus_a.publish(alerts, reading(1, 1.0)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return answers.load() == 1; }, 30s));
  std::lock_guard lock(mu);
  EXPECT_EQ(answer.code(), absl::StatusCode::kNotFound) << answer;
  EXPECT_EQ(answer.message(), "answered by A");
}

TEST(Node, ARequestBatchFromARawPeerIsAnsweredWithAReplyBatch) {
  // What a peer in another language does (docs/wire-protocol.md, section 7): three requests in
  // one frame, one of them of the wrong type, answered in one reply frame.
  Pair p;
  auto server = p.bus_a.serve(stats_ep, [](StatsRequest&& req) {
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
      r.setReadings(std::string(req->getSensor().cStr()).size());
    });
  });
  p.a.export_endpoint(stats_ep);
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.connect(p.a.request_address());
  std::string payloads;
  for (const char* s : {"a", "bbb"}) {
    StatsRequest m = ask(s);
    auto b = m.bytes();
    payloads.append(reinterpret_cast<const char*>(b.begin()), b.size());
  }
  auto envelope = [](uint64_t type_id, uint32_t count, std::vector<uint64_t> correlations) {
    capnp::MallocMessageBuilder m;
    auto e = m.initRoot<bus::wire::Envelope>();
    e.setKind(bus::wire::Envelope::Kind::REQUEST);
    e.setTypeId(type_id);
    e.setSender(77);
    e.setCount(count);
    auto items = e.initRequests(static_cast<unsigned>(correlations.size()));
    for (unsigned i = 0; i < correlations.size(); ++i) {
      items[i].setCorrelation(correlations[i]);
      items[i].setTimeoutUs(5'000'000);
    }
    auto words = capnp::messageToFlatArray(m);
    return std::string(reinterpret_cast<const char*>(words.begin()), words.size() * 8);
  };
  auto send = [&](const std::string& env, const std::string& body) {
    raw.send(zmq::buffer(std::string_view("test.net.stats")), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(env), zmq::send_flags::sndmore);
    raw.send(zmq::buffer(body), zmq::send_flags::none);
  };
  uint64_t req_type = capnp::typeId<demo::StatsRequest>();
  send(envelope(req_type, 2, {11, 12}), payloads);
  send(envelope(req_type + 1, 1, {13}), payloads.substr(0, ask("a").bytes().size()));
  // The answers: the two replies in one batch frame, with the mistyped one's or in a frame of
  // their own.
  std::map<uint64_t, std::pair<uint16_t, uint64_t>> got;  // correlation -> code, readings
  int frames = 0;
  std::size_t largest_batch = 0;
  raw.set(zmq::sockopt::rcvtimeo, 10'000);
  while (got.size() < 3) {
    std::vector<zmq::message_t> parts;
    ASSERT_TRUE(zmq::recv_multipart(raw, std::back_inserter(parts)).has_value());
    ASSERT_EQ(parts.size(), 3u);
    ++frames;
    kj::Array<capnp::word> env_words = kj::heapArray<capnp::word>(parts[1].size() / 8);
    std::memcpy(env_words.begin(), parts[1].data(), parts[1].size());
    capnp::FlatArrayMessageReader env_reader(env_words);
    auto e = env_reader.getRoot<bus::wire::Envelope>();
    ASSERT_EQ(e.getKind(), bus::wire::Envelope::Kind::REPLY);
    kj::Array<capnp::word> body = kj::heapArray<capnp::word>(parts[2].size() / 8);
    std::memcpy(body.begin(), parts[2].data(), parts[2].size());
    kj::ArrayPtr<const capnp::word> rest = body;
    auto take = [&] {
      capnp::FlatArrayMessageReader r(rest);
      uint64_t readings = r.getRoot<demo::StatsReply>().getReadings();
      rest = kj::arrayPtr(r.getEnd(), rest.end());
      return readings;
    };
    if (e.hasReplies()) {
      largest_batch = std::max<std::size_t>(largest_batch, e.getReplies().size());
      for (auto item : e.getReplies()) {
        got[item.getCorrelation()] = {item.getCode(), item.getCode() == 0 ? take() : 0};
      }
    } else {
      got[e.getCorrelation()] = {e.getCode(), e.getCode() == 0 ? take() : 0};
    }
  }
  EXPECT_LE(frames, 2);
  EXPECT_GE(largest_batch, 2u);
  EXPECT_EQ(got[11], std::make_pair(uint16_t{0}, uint64_t{1}));
  EXPECT_EQ(got[12], std::make_pair(uint16_t{0}, uint64_t{3}));
  EXPECT_EQ(got[13].first, static_cast<uint16_t>(absl::StatusCode::kInvalidArgument));
}

TEST(Node, RequestWithoutALiveServerIsUnavailable) {
  Pair p;
  p.b.import_endpoint(slow_ep);
  auto rep = p.bus_b.call(slow_ep, ask(), 2s);
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kUnavailable);
}

TEST(Node, SlowRemoteHandlerGivesDeadlineExceededOnTime) {
  Pair p;
  bus_test::Gate gate;
  auto server = p.bus_a.serve(slow_ep, [&](StatsRequest&&) {
    gate.wait();
    return StatsReply();
  });
  p.a.export_endpoint(slow_ep);
  p.b.import_endpoint(slow_ep);
  ASSERT_TRUE(p.b.wait_for_server(slow_ep.name(), 10s));
  auto rep = p.bus_b.call(slow_ep, ask(), 200ms);
  gate.open();
  ASSERT_FALSE(rep.ok());
  EXPECT_EQ(rep.status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST(Node, QueueMessagesReachARemoteConsumerOnce) {
  Pair p;
  std::atomic<uint64_t> count{0}, sum{0};
  auto consumer = p.bus_a.consume(jobs, [&](Reading&& r) {
    sum.fetch_add(r->getSeq());
    count.fetch_add(1);
  });
  p.a.export_queue(jobs);
  p.b.import_queue(jobs);
  ASSERT_TRUE(p.b.wait_for_server(jobs.name(), 10s));
  constexpr uint64_t kN = 2000;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(p.bus_b.send(jobs, reading(i, 1)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return count.load() == kN; }, 30s))
      << count.load() << " of " << kN;
  EXPECT_EQ(sum.load(), kN * (kN + 1) / 2);
}

TEST(Node, ThreeNodesFanOutAndRoundRobinRequests) {
  bus::Bus ba{bus::Options().executors(1)}, bb{bus::Options().executors(1)},
      bc{bus::Options().executors(1)};
  Node a{ba, local_node("a")}, b{bb, local_node("b")}, c{bc, local_node("c")};
  for (Node* n : {&a, &b, &c}) {
    for (Node* m : {&a, &b, &c}) {
      if (n != m) n->peer(m->publish_address());
    }
  }
  std::atomic<int> served_b{0}, served_c{0};
  auto sb = bb.serve(stats_ep, [&](StatsRequest&&) {
    served_b.fetch_add(1);
    return StatsReply();
  });
  auto sc = bc.serve(stats_ep, [&](StatsRequest&&) {
    served_c.fetch_add(1);
    return StatsReply();
  });
  b.export_endpoint(stats_ep).import_topic(readings);
  c.export_endpoint(stats_ep).import_topic(readings);
  a.import_endpoint(stats_ep).export_topic(readings);
  std::atomic<int> got_b{0}, got_c{0};
  auto rb = bb.subscribe(readings, [&](const Reading&) { got_b.fetch_add(1); });
  auto rc = bc.subscribe(readings, [&](const Reading&) { got_c.fetch_add(1); });
  ASSERT_TRUE(a.wait_for_subscribers(readings.name(), 2, 10s));
  ASSERT_TRUE(bus_test::eventually([&] { return a.peers().size() == 2; }, 10s));
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(ba.publish(readings, reading(i + 1, 1)).ok());
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(ba.call(stats_ep, ask(), 5s).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return got_b == 100 && got_c == 100; }, 30s));
  EXPECT_EQ(served_b + served_c, 100);
  EXPECT_GT(served_b.load(), 0);
  EXPECT_GT(served_c.load(), 0);
}

TEST(Node, MalformedFramesAreCountedAndDoNotDisturbTraffic) {
  Pair p;
  auto server = p.bus_a.serve(stats_ep, [](StatsRequest&&) { return StatsReply(); });
  p.a.export_endpoint(stats_ep);
  p.b.import_endpoint(stats_ep);
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::dealer);
  raw.connect(p.a.request_address());
  std::string junk(64, '\x7f');
  raw.send(zmq::buffer(std::string_view("test.net.stats")), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(junk), zmq::send_flags::sndmore);
  raw.send(zmq::buffer(junk), zmq::send_flags::none);
  raw.send(zmq::buffer(std::string_view("only one part")), zmq::send_flags::none);
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.stats().malformed_frames >= 2; }, 10s));
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  EXPECT_TRUE(p.bus_b.call(stats_ep, ask(), 5s).ok());
}

TEST(Node, CurveAllowsListedKeysOnly) {
  auto ka = bus::net::CurveKeys::generate(), kb = bus::net::CurveKeys::generate(),
       kx = bus::net::CurveKeys::generate();
  bus::Bus ba{bus::Options().executors(1)}, bb{bus::Options().executors(1)},
      bx{bus::Options().executors(1)};
  Node a{ba, local_node("a").curve(ka, {kb.public_key})};
  Node b{bb, local_node("b").curve(kb, {ka.public_key}).peer(a.publish_address(), ka.public_key)};
  Node x{
      bx,
      local_node("intruder").curve(kx, {ka.public_key}).peer(a.publish_address(), ka.public_key)};
  // And a node without keys at all.
  bus::Bus by{bus::Options().executors(1)};
  Node y{by, local_node("plain").peer(a.publish_address())};
  a.export_topic(readings);
  b.import_topic(readings);
  x.import_topic(readings);
  y.import_topic(readings);
  std::atomic<int> got_b{0}, got_x{0}, got_y{0};
  auto sy = by.subscribe(readings, [&](const Reading&) { got_y.fetch_add(1); });
  auto sb = bb.subscribe(readings, [&](const Reading&) { got_b.fetch_add(1); });
  auto sx = bx.subscribe(readings, [&](const Reading&) { got_x.fetch_add(1); });
  ASSERT_TRUE(a.wait_for_subscribers(readings.name(), 1, 10s));
  for (int i = 0; i < 50; ++i) ASSERT_TRUE(ba.publish(readings, reading(i + 1, 1)).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return got_b.load() == 50; }, 10s));
  ASSERT_TRUE(bus_test::eventually([&] { return a.stats().auth_denied > 0; }, 10s));
  EXPECT_EQ(got_x.load(), 0);
  EXPECT_EQ(got_y.load(), 0);
  EXPECT_EQ(a.subscribers(readings.name()), 1u);
}

TEST(Node, StoppingAPublisherDeliversEverythingItAccepted) {
  bus::Bus ba{bus::Options().executors(1)}, bb{bus::Options().executors(1)};
  auto a = std::make_unique<Node>(ba, local_node("a"));
  Node b{bb, local_node("b").peer(a->publish_address())};
  a->peer(b.publish_address());
  a->export_topic(readings);
  b.import_topic(readings);
  std::atomic<uint64_t> got{0};
  auto sub = bb.subscribe(readings, [&](const Reading&) { got.fetch_add(1); });
  ASSERT_TRUE(a->wait_for_subscribers(readings.name(), 1, 10s));
  ASSERT_TRUE(bus_test::eventually([&] { return a->peers().size() == 1; }, 10s));
  constexpr uint64_t kN = 50000;
  for (uint64_t i = 1; i <= kN; ++i) ASSERT_TRUE(ba.publish(readings, reading(i, 1)).ok());
  a.reset();  // the goodbye handshake holds the stop until b has confirmed everything before it
  ASSERT_TRUE(bus_test::eventually([&] { return got.load() == kN; }, 30s));
  EXPECT_EQ(b.stats().channel(readings.name()).gaps, 0u);
}

namespace {
/// CPU time of this process (every thread), user and system.
std::chrono::microseconds process_cpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto us = [](const timeval& t) {
    return std::chrono::seconds(t.tv_sec) + std::chrono::microseconds(t.tv_usec);
  };
  return us(u.ru_utime) + us(u.ru_stime);
}
}  // namespace

TEST(Node, AStalledSubscriberHoldsThePublisherBackWithoutSpinningThenIsSentPast) {
  // A subscriber that stops reading (a raw SUB socket here) fills ZeroMQ's pipe and the socket
  // buffers. The publishing node then holds the frame it could not send, and local publishers
  // wait on the full ring; nothing may spin meanwhile. After send_stall_limit the publisher
  // sends on without that subscriber (a cut, counted; the subscriber sees the gap in the
  // sequence numbers) and traffic moves again. (No ZMTP timeout here: that would disconnect the
  // stalled socket, which ends the stall another way.)
  const bus::Topic<Reading> bulky{"test.net.bulky"};
  bus::Bus ba{bus::Options().executors(1)};
  Node a{ba, local_node("a").send_stall_limit(1s).subscriber_timeout(0ms)};
  a.export_topic(bulky);
  zmq::context_t ctx;
  zmq::socket_t raw(ctx, zmq::socket_type::sub);
  raw.set(zmq::sockopt::rcvhwm, 1);
  raw.set(zmq::sockopt::rcvbuf, 4096);
  raw.set(zmq::sockopt::linger, 0);
  raw.connect(a.publish_address());
  raw.set(zmq::sockopt::subscribe, bulky.name());
  ASSERT_TRUE(a.wait_for_subscribers(bulky.name(), 1, 10s));

  const Reading big = bus::build<demo::Reading>(
      [](demo::Reading::Builder r) { r.setSensor(std::string(16 << 10, 's')); });
  std::atomic<bool> stop{false};
  std::thread producer([&] {
    // Blocks in publish() while the node holds its input back.
    while (!stop.load() && ba.publish(bulky, big).ok()) {
    }
  });
  // Stalled: a batch the subscriber's pipe had no room for is held (counted once).
  ASSERT_TRUE(bus_test::eventually([&] { return a.stats().publish_stalls > 0; }, 60s));
  bus::net::NodeStats at_stall = a.stats();
  ASSERT_EQ(at_stall.publish_cuts, 0u);
  auto cpu0 = process_cpu();
  auto wall0 = std::chrono::steady_clock::now();
  // Until the stall limit passes nothing more leaves (local input is held back); then the held
  // frame goes on without the stalled subscriber, and that is counted.
  uint64_t published_while_held = at_stall.published;
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        bus::net::NodeStats s = a.stats();
        if (s.publish_cuts > 0) return true;
        published_while_held = s.published;
        return false;
      },
      30s));
  auto busy = process_cpu() - cpu0;
  auto wall = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::steady_clock::now() - wall0);
  EXPECT_LT(busy, wall / 2) << "the stalled publisher used " << busy.count() << " us of CPU in "
                            << wall.count() << " us";
  EXPECT_EQ(published_while_held, at_stall.published) << "local input is held back while stalled";
  // Traffic moves again.
  ASSERT_TRUE(bus_test::eventually([&] { return a.stats().published > at_stall.published; }, 30s));
  stop.store(true);
  raw.close();  // the node's pipe to it goes: a producer still blocked is let through
  producer.join();
}

TEST(Node, ALeavingNodeIsForgottenWithoutWaitingForItsHeartbeats) {
  // Heartbeats so rare that only the goodbye can explain the peer disappearing in time.
  auto slow = [](const char* name) { return local_node(name).heartbeat(10s, 100); };
  bus::Bus ba{bus::Options().executors(1)}, bb{bus::Options().executors(1)};
  auto a = std::make_unique<Node>(ba, slow("a"));
  Node b{bb, slow("b").peer(a->publish_address())};
  ASSERT_TRUE(bus_test::eventually([&] { return b.peers().size() == 1; }, 30s));
  EXPECT_EQ(b.peers()[0].name, "a");
  a.reset();
  ASSERT_TRUE(bus_test::eventually([&] { return b.peers().empty(); }, 30s));
  EXPECT_EQ(b.stats().peers_lost, 0u);  // it left; it was not declared dead
}

TEST(Node, SubscribesToAnImportedTopicOnlyWhileItHasLocalSubscribers) {
  Pair p;
  p.a.export_topic(readings);
  p.b.import_topic(readings);
  // b's heartbeat lists what it subscribes to: nothing yet.
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.peers().size() == 1; }, 10s));
  EXPECT_TRUE(p.a.peers()[0].imports.empty());
  EXPECT_EQ(p.a.subscribers(readings.name()), 0u);
  {
    auto sub = p.bus_b.subscribe(readings, [](const Reading&) {});
    ASSERT_TRUE(p.a.wait_for_subscribers(readings.name(), 1, 10s));
    ASSERT_TRUE(bus_test::eventually([&] { return p.a.peers()[0].imports.size() == 1; }, 10s));
  }
  ASSERT_TRUE(bus_test::eventually([&] { return p.a.subscribers(readings.name()) == 0; }, 10s));
}

// A plain C++ type crosses processes through a codec onto a Cap'n Proto struct.
struct PlainReading {
  std::string sensor;
  double value = 0;
};
template <>
struct bus::Codec<PlainReading> {
  using Schema = demo::Reading;
  static void encode(const PlainReading& r, demo::Reading::Builder b) {
    b.setSensor(r.sensor);
    b.setValue(r.value);
  }
  static PlainReading decode(demo::Reading::Reader r) {
    return {r.getSensor().cStr(), r.getValue()};
  }
};
static_assert(bus::Bridgeable<PlainReading>);
static_assert(bus::Bridgeable<Reading>);
static_assert(!bus::Bridgeable<std::string>);
static_assert(bus::schema_id<PlainReading>() == bus::schema_id<Reading>());

inline const bus::Topic<PlainReading> plain_readings{"test.net.plain"};

TEST(Node, APlainTypeWithACodecCrossesNodes) {
  Pair p;
  p.a.export_topic(plain_readings);
  p.b.import_topic(plain_readings);
  std::mutex mu;
  std::vector<PlainReading> got;
  auto sub = p.bus_b.subscribe(plain_readings, [&](const PlainReading& r) {
    std::lock_guard lock(mu);
    got.push_back(r);
  });
  ASSERT_TRUE(p.a.wait_for_subscribers(plain_readings.name(), 1, 10s));
  std::string big(5000, 'x');  // larger than the builder's reused first segment
  ASSERT_TRUE(p.bus_a.publish(plain_readings, PlainReading{"porch", 1.5}).ok());
  ASSERT_TRUE(p.bus_a.publish(plain_readings, PlainReading{big, 2.5}).ok());
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(mu);
        return got.size() == 2;
      },
      10s));
  EXPECT_EQ(got[0].sensor, "porch");
  EXPECT_EQ(got[0].value, 1.5);
  EXPECT_EQ(got[1].sensor, big);
  EXPECT_EQ(got[1].value, 2.5);
}

TEST(Message, CopiesShareOneBufferAndReadTheSame) {
  Reading a = reading(7, 3.25);
  Reading b = a;
  EXPECT_EQ(a.bytes().begin(), b.bytes().begin());
  EXPECT_EQ(b->getSeq(), 7u);
  EXPECT_EQ(std::string(b->getSensor().cStr()), "s1");
  // The bytes are a standard Cap'n Proto stream message.
  capnp::FlatArrayMessageReader r(a.words());
  EXPECT_EQ(r.getRoot<demo::Reading>().getValue(), 3.25);
}

TEST(NodeOptions, ParsesASmallConfig) {
  auto o = NodeOptions::parse(R"(
    # the aggregator
    name = aggregator
    publish = tcp://*:7411
    requests = tcp://*:7412
    advertise = tcp://10.0.0.5:7412
    peer = tcp://10.0.0.4:7401
    peer = tcp://10.0.0.6:7401   # another
    heartbeat_ms = 100
    dead_after = 5
    max_message_bytes = 4096
  )");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->name(), "aggregator");
  EXPECT_EQ(o->publish_on(), "tcp://*:7411");
  EXPECT_EQ(o->advertise(), "tcp://10.0.0.5:7412");
  ASSERT_EQ(o->peers().size(), 2u);
  EXPECT_EQ(o->peers()[1].address, "tcp://10.0.0.6:7401");
  EXPECT_EQ(o->heartbeat(), 100ms);
  EXPECT_EQ(o->dead_after(), 5u);
  EXPECT_EQ(o->max_message_bytes(), 4096u);
  EXPECT_FALSE(o->secure());
  // Unset: no ZMTP heartbeats (libzmq 4.3.4 can abort the far end of a connection they reset).
  EXPECT_EQ(o->subscriber_timeout(), 0ms);
}

TEST(NodeOptions, SlowSubscriberSettingsComeFromTheConfigToo) {
  auto o = NodeOptions::parse(
      "publish = tcp://*:1\nsend_stall_limit_ms = 50\nsubscription_queue = 128\n"
      "subscriber_timeout_ms = 0\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->send_stall_limit(), 50ms);
  EXPECT_EQ(o->subscription_queue(), 128);
  EXPECT_EQ(o->subscriber_timeout(), 0ms);  // never
  EXPECT_FALSE(NodeOptions::parse("publish = tcp://*:1\nsubscription_queue = 0\n").ok());
}

TEST(NodeOptions, ConnectTimeoutComesFromTheConfigToo) {
  EXPECT_EQ(NodeOptions().connect_timeout(), 1000ms);
  auto o = NodeOptions::parse("publish = tcp://*:1\nconnect_timeout_ms = 3000\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->connect_timeout(), 3000ms);
  auto bad = NodeOptions::parse("publish = tcp://*:1\nconnect_timeout_ms = soon\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("connect_timeout_ms"), std::string::npos) << bad.status();
}

TEST(NodeOptions, KeysKeepTheirHashSignsAndCommentsStillEndLines) {
  // Z85 (CURVE keys in text) has '#' in its alphabet: only a '#' after a blank starts a comment.
  std::string pub = "ojCYLeL7vfLPw]#d.wgS9KEt4c>QfqMrrOIpn?eJ";
  std::string sec = "#1cyxiMsiSf)QDgb-Ui{yA7njnvD0g.!dq=<0nYn<";
  std::string peer = "a#Z85key.wgS9KEt4c>QfqMrrOIpn?eJojCYLeL7v";
  auto o = NodeOptions::parse("publish = tcp://*:1  # ours\ncurve_public = " + pub +
                              "\ncurve_secret = " + sec + "\t# secret\npeer = tcp://h:2 " + peer +
                              " # a peer\nallow = " + peer + "\n# allow = nobody\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->publish_on(), "tcp://*:1");
  EXPECT_EQ(o->curve_keys().public_key, pub);
  EXPECT_EQ(o->curve_keys().secret_key, sec);
  ASSERT_EQ(o->peers().size(), 1u);
  EXPECT_EQ(o->peers()[0].public_key, peer);
  EXPECT_EQ(o->allow(), std::vector<std::string>{peer});
}

TEST(NodeOptions, MembershipComesFromTheConfigToo) {
  auto o = NodeOptions::parse(
      "publish = tcp://*:7411\nadvertise_publish = tcp://10.0.0.5:7411\n"
      "peer = tcp://bus.default.svc:7411\nresolve_every_ms = 250\n"
      "etcd = http://10.0.0.9:2379\netcd = http://10.0.0.10:2379\netcd_prefix = /shop/\n"
      "etcd_register = false\netcd_related_only = true\n");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->advertise_publish(), "tcp://10.0.0.5:7411");
  EXPECT_EQ(o->resolve_every(), 250ms);
  EXPECT_EQ(o->etcd(), (std::vector<std::string>{"http://10.0.0.9:2379", "http://10.0.0.10:2379"}));
  EXPECT_EQ(o->etcd_prefix(), "/shop/");
  EXPECT_FALSE(o->etcd_register());
  EXPECT_TRUE(o->etcd_related_only());
  EXPECT_EQ(NodeOptions::parse("publish = tcp://*:1\netcd = http://e:2379\n")->etcd_prefix(),
            "/bus/");
  EXPECT_FALSE(NodeOptions::parse("publish = tcp://*:1\netcd_prefix = /x/\n").ok());
  EXPECT_FALSE(NodeOptions::parse("publish = tcp://*:1\netcd_register = maybe\n").ok());
  EXPECT_FALSE(NodeOptions::parse("publish = tcp://*:1\nresolve_every_ms = 0\n").ok());
}

TEST(NodeOptions, AnEtcdEndpointThatCannotBeUsedStopsTheNodeFromStarting) {
  bus::Bus b;
  try {
    Node n(b, local_node("n").etcd({"https://127.0.0.1:2379"}));
    ADD_FAILURE() << "a node started with an https etcd endpoint";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("https is not supported"), std::string::npos) << e.what();
  }
  // The bus is usable, and a good node starts on it afterwards.
  Node ok(b, local_node("ok"));
  EXPECT_NE(ok.id(), 0u);
}

TEST(NodeOptions, ConfigErrorsNameTheLine) {
  auto bad = NodeOptions::parse("publish = tcp://*:1\nheartbeat_ms = soon\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  auto unknown = NodeOptions::parse("publish = tcp://*:1\ncolour = blue\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("unknown key 'colour'"), std::string::npos);
  EXPECT_FALSE(NodeOptions::parse("name = x\n").ok());  // no publish address
  EXPECT_EQ(NodeOptions::load("/nonexistent/node.conf").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Node, ThePrincipalOfARequestReachesTheHandlerOnAnotherNode) {
  Pair p;
  auto server = p.bus_a.serve(stats_ep, [](StatsRequest&&) {
    const bus::Principal* who = bus::principal();
    return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
      r.initSensors(1)[0].setSensor(who == nullptr ? "nobody"
                                                   : who->subject + "/" + who->issuer + "/" +
                                                         who->scopes.at(1) + "/" + who->claims);
    });
  });
  p.a.export_endpoint(stats_ep);
  p.b.import_endpoint(stats_ep);
  ASSERT_TRUE(p.b.wait_for_server(stats_ep.name(), 10s));
  auto ada = std::make_shared<bus::Principal>(
      bus::Principal{"ada", "https://id.test", {"a", "b"}, R"({"sub":"ada"})"});
  // Through the bridge thread (request), and on the calling thread's own socket (call).
  std::promise<std::string> got;
  {
    bus::PrincipalPtr who = ada;
    bus::PrincipalScope acting_for(who);
    p.bus_b.request(stats_ep, ask(), 5s, [&](absl::StatusOr<StatsReply> r) {
      got.set_value(r.ok() ? (*r)->getSensors()[0].getSensor().cStr()
                           : std::string(r.status().message()));
    });
    auto direct = p.bus_b.call(stats_ep, ask(), 5s);
    ASSERT_TRUE(direct.ok()) << direct.status();
    EXPECT_EQ(std::string((*direct)->getSensors()[0].getSensor().cStr()),
              R"(ada/https://id.test/b/{"sub":"ada"})");
  }
  EXPECT_EQ(got.get_future().get(), R"(ada/https://id.test/b/{"sub":"ada"})");
  auto nobody = p.bus_b.call(stats_ep, ask(), 5s);
  ASSERT_TRUE(nobody.ok()) << nobody.status();
  EXPECT_EQ(std::string((*nobody)->getSensors()[0].getSensor().cStr()), "nobody");
}
