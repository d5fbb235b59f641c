// A server process killed with kill -9 while requests wait on it, restarted on the same
// endpoints, again and again: requests in flight fail at once with "peer gone", the restarted
// server serves with nobody else restarted, and the long-lived nodes keep nothing of the dead.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <bus/net/node.hpp>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>

#include "integration/channels.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

#ifdef BUS_TEST_SANITIZED
// The sanitizers' allocators count live heap bytes; RSS would also count their quarantine and
// shadow memory, which grow with churn, not with leaks.
extern "C" std::size_t __sanitizer_get_current_allocated_bytes();
#endif

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;
using integ::Transport;
using testing::HasSubstr;

namespace {

/// Memory this process holds: its resident set, or under a sanitizer its live heap.
std::size_t memory_in_use() {
#ifdef BUS_TEST_SANITIZED
  return __sanitizer_get_current_allocated_bytes();
#else
  std::ifstream statm("/proc/self/statm");
  std::size_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
#endif
}

bool has_peer(const bus::net::Node& node, uint64_t id) {
  for (const auto& p : node.peers()) {
    if (p.id == id) return true;
  }
  return false;
}

/// This process as one long-lived node (heartbeat 50 ms, dead after 4 missed).
class PeerRestart : public testing::TestWithParam<Transport> {
 protected:
  bus::net::Node& start_node(std::vector<std::string> peers, bool serve = false) {
    auto options = bus::net::NodeOptions()
                       .name("test")
                       .publish_on(endpoints.bind("test-pub"))
                       .requests_on(endpoints.bind("test-req"))
                       .heartbeat(50ms, 4);
    for (const auto& p : peers) options.peer(p);
    node.emplace(bus, std::move(options));
    if (serve) {
      server = bus.serve(integ::stats(), [](integ::StatsRequest&&) {
        return bus::build<demo::StatsReply>(
            [](demo::StatsReply::Builder r) { r.initSensors(1)[0].setSensor("test"); });
      });
      node->export_endpoint(integ::stats());
    } else {
      node->import_endpoint(integ::stats());
    }
    return *node;
  }

  /// A call from this process that succeeds, within a generous bound. A node under a sanitizer
  /// on a loaded machine may miss heartbeats and be given up on for a moment: such a call fails
  /// (and is counted in `refused_calls`) and is made again.
  bool call_succeeds() {
    return bus_test::eventually(
        [&] {
          auto rep = bus.call(integ::stats(), integ::ask("test"), 30s);
          if (!rep.ok()) ++refused_calls;
          return rep.ok();
        },
        60s);
  }

  integ::Endpoints endpoints{GetParam()};
  bus::Bus bus{bus::Options().executors(2)};
  bus::Subscription server;
  std::optional<bus::net::Node> node;  // destroyed before the bus
  int refused_calls = 0;
};

std::vector<std::string> server_flags() {
  return {"--name=server", "--serve", "--heartbeat-ms=50", "--dead-after=4"};
}

}  // namespace

TEST_P(PeerRestart, RequestsInFlightFailWithPeerGoneAndTheRestartedServerServesAgain) {
  auto server = std::make_unique<NodeProcess>(
      cat(server_flags(), {"--hold-requests"}, endpoints.flags("server")));
  ASSERT_TRUE(server->ready());
  start_node({server->publish_address()});
  ASSERT_TRUE(node->wait_for_server(integ::kStats, 30s));

  // Requests with a deadline far beyond every bound below: whatever ends them, it is not the
  // deadline (that would be DeadlineExceeded).
  constexpr int kInFlight = 8;
  struct Results {
    std::mutex mu;
    std::vector<absl::Status> statuses;
  };
  auto results = std::make_shared<Results>();
  for (int i = 0; i < kInFlight; ++i) {
    bus.request(integ::stats(), integ::ask("test"), 60s,
                [results](absl::StatusOr<integ::StatsReply> r) {
                  std::lock_guard lock(results->mu);
                  results->statuses.push_back(r.status());
                });
  }
  // All of them left for the server, and its handler holds one.
  ASSERT_TRUE(bus_test::eventually(
      [&] { return node->stats().channel(integ::kStats).sent == kInFlight; }, 30s));
  ASSERT_GE(server->ask("wait-handled 1").num("n"), 1u);

  server->kill();
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        std::lock_guard lock(results->mu);
        return results->statuses.size() == kInFlight;
      },
      30s));
  {
    std::lock_guard lock(results->mu);
    for (const absl::Status& st : results->statuses) {
      EXPECT_EQ(st.code(), absl::StatusCode::kAborted) << st;
      EXPECT_THAT(std::string(st.message()), HasSubstr("peer gone"));
    }
  }
  EXPECT_GE(node->stats().calls_peer_gone, static_cast<uint64_t>(kInFlight));

  // The same endpoints; this node is not restarted.
  auto again = std::make_unique<NodeProcess>(cat(server_flags(), server->same_addresses()));
  ASSERT_TRUE(again->ready());
  ASSERT_TRUE(bus_test::eventually([&] { return has_peer(*node, again->id()); }, 30s));
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(call_succeeds());
  EXPECT_GE(again->report().num("handled"), 20u);
  EXPECT_EQ(node->peers().size(), 1u);
  EXPECT_TRUE(again->quit());
}

TEST_P(PeerRestart, FiftyServerRestartsLeaveNothingBehindInTheCaller) {
  constexpr int kRestarts = 50, kBaselineAt = 5;
  auto server = std::make_unique<NodeProcess>(cat(server_flags(), endpoints.flags("server")));
  ASSERT_TRUE(server->ready());
  const std::vector<std::string> same = server->same_addresses();
  start_node({server->publish_address()});

  std::size_t baseline = 0;
  for (int round = 1; round <= kRestarts; ++round) {
    if (round > 1) {
      server->kill();
      server = std::make_unique<NodeProcess>(cat(server_flags(), same));
      ASSERT_TRUE(server->ready()) << "round " << round;
    }
    ASSERT_TRUE(bus_test::eventually([&] { return has_peer(*node, server->id()); }, 30s))
        << "round " << round;
    ASSERT_TRUE(call_succeeds()) << "round " << round;
    bus::net::NodeStats st = node->stats();
    // At most the live server; traffic rows: one channel, for the live server and for the
    // folded dead ones (peer 0).
    ASSERT_LE(st.peers.size(), 1u) << "round " << round;
    ASSERT_LE(st.traffic.size(), 2u) << "round " << round;
    if (round == kBaselineAt) baseline = memory_in_use();
  }
  auto st = node->stats();
  EXPECT_GE(st.channel(integ::kStats).received, static_cast<uint64_t>(kRestarts));
  std::size_t grown = memory_in_use() - std::min(baseline, memory_in_use());
  EXPECT_LT(grown, std::size_t{50} << 20)
      << "grew by " << grown << " bytes over " << kRestarts - kBaselineAt << " restarts";
  RecordProperty("refused_calls", refused_calls);
  EXPECT_TRUE(server->quit());
}

TEST_P(PeerRestart, FiftyClientRestartsLeaveNothingBehindInTheServer) {
  // This process serves and does not listen to its callers (they find it, it never learns of
  // them from heartbeats): what it keeps about a caller must go when the caller does.
  constexpr int kRestarts = 50, kBaselineAt = 5;
  start_node({}, /*serve=*/true);
  std::vector<std::string> client_flags =
      cat({"--name=client", "--import-stats", "--heartbeat-ms=50", "--dead-after=4",
           "--peer=" + node->publish_address()},
          endpoints.flags("client"));

  std::size_t baseline = 0;
  std::unique_ptr<NodeProcess> client;
  for (int round = 1; round <= kRestarts; ++round) {
    if (client) client->kill();
    client = std::make_unique<NodeProcess>(
        round == 1 ? client_flags : cat(client_flags, client->same_addresses()));
    ASSERT_TRUE(client->ready()) << "round " << round;
    ASSERT_EQ(client->ask("wait-server").num("ok"), 1u) << "round " << round;
    // Made again if it fails: a sanitized client on a loaded machine may miss the server's
    // heartbeats and give it up for a moment (as call_succeeds() allows for this process).
    integ::Answer called;
    ASSERT_TRUE(bus_test::eventually(
        [&] {
          called = client->ask("call 1");
          return called.num("ok") == 1u;
        },
        60s))
        << "round " << round << ": " << called.line;
    if (round == kBaselineAt) baseline = memory_in_use();
  }
  // One channel: a row for callers gone (peer 0) and at most one for the live one.
  bus::net::NodeStats st = node->stats();
  EXPECT_LE(st.traffic.size(), 2u) << "traffic rows after " << kRestarts << " callers";
  std::size_t grown = memory_in_use() - std::min(baseline, memory_in_use());
  EXPECT_LT(grown, std::size_t{50} << 20) << "grew by " << grown << " bytes";
  EXPECT_TRUE(client->quit());
}

INSTANTIATE_TEST_SUITE_P(Transports, PeerRestart, testing::Values(Transport::kTcp, Transport::kIpc),
                         [](const auto& info) { return integ::to_string(info.param); });
