// Request/reply across processes, over tcp and ipc: the test process is one node (its own
// bus::Bus and bus::net::Node), the fixture processes the others.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/net/node.hpp>
#include <optional>

#include "integration/channels.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;
using integ::Transport;

namespace {

class MultiProcessRequest : public testing::TestWithParam<Transport> {
 protected:
  /// This process's node: it calls the stats endpoint of the nodes it listens to.
  bus::net::Node& start_node(const std::vector<std::string>& peers) {
    auto options = bus::net::NodeOptions()
                       .name("test")
                       .publish_on(endpoints.bind("test-pub"))
                       .requests_on(endpoints.bind("test-req"))
                       .heartbeat(50ms, 100);
    for (const auto& p : peers) options.peer(p);
    node.emplace(bus, std::move(options));
    node->import_endpoint(integ::stats());
    return *node;
  }

  /// One call from this process; the name of the node that answered, or the failure.
  std::string call_once() {
    absl::StatusOr<integ::StatsReply> rep = bus.call(integ::stats(), integ::ask("test"), 30s);
    if (!rep.ok()) return rep.status().ToString();
    return (*rep)->getSensors()[0].getSensor().cStr();
  }

  integ::Endpoints endpoints{GetParam()};
  bus::Bus bus{bus::Options().executors(2)};
  std::optional<bus::net::Node> node;  // destroyed before the bus
};

}  // namespace

TEST_P(MultiProcessRequest, AServerProcessAnswersEveryRequest) {
  NodeProcess server(cat({"--name=server", "--serve"}, endpoints.flags("server")));
  ASSERT_TRUE(server.ready());
  start_node({server.publish_address()});
  ASSERT_TRUE(node->wait_for_server(integ::kStats, 30s));

  for (int i = 0; i < 200; ++i) ASSERT_EQ(call_once(), "server");
  // Concurrently, from executors, with callbacks.
  auto answered = std::make_shared<std::atomic<int>>(0);
  for (int i = 0; i < 200; ++i) {
    bus.request(integ::stats(), integ::ask("test"), 30s,
                [answered](absl::StatusOr<integ::StatsReply> r) {
                  if (r.ok()) answered->fetch_add(1);
                });
  }
  ASSERT_TRUE(bus_test::eventually([&] { return answered->load() == 200; }, 60s));

  EXPECT_EQ(server.report().num("handled"), 400u);
  auto st = node->stats().channel(integ::kStats);
  EXPECT_EQ(st.sent, 400u);
  EXPECT_EQ(st.received, 400u);
  EXPECT_EQ(st.rejected, 0u);
  EXPECT_TRUE(server.quit());
}

TEST_P(MultiProcessRequest, RequestsTakeTurnsOverTwoServerProcesses) {
  NodeProcess s1(cat({"--name=s1", "--serve"}, endpoints.flags("s1")));
  NodeProcess s2(cat({"--name=s2", "--serve"}, endpoints.flags("s2")));
  ASSERT_TRUE(s1.ready());
  ASSERT_TRUE(s2.ready());
  start_node({s1.publish_address(), s2.publish_address()});
  ASSERT_TRUE(bus_test::eventually([&] { return node->peers().size() == 2; }, 30s));

  std::map<std::string, int> served_by;
  for (int i = 0; i < 200; ++i) ++served_by[call_once()];
  EXPECT_EQ(served_by["s1"] + served_by["s2"], 200);
  EXPECT_GT(served_by["s1"], 0);
  EXPECT_GT(served_by["s2"], 0);
  EXPECT_EQ(s1.report().num("handled") + s2.report().num("handled"), 200u);
  EXPECT_TRUE(s1.quit());
  EXPECT_TRUE(s2.quit());
}

TEST_P(MultiProcessRequest, AServerProcessAnswersTwoCallerProcessesAtOnce) {
  NodeProcess server(cat({"--name=server", "--serve"}, endpoints.flags("server")));
  ASSERT_TRUE(server.ready());
  NodeProcess caller(
      cat({"--name=caller", "--import-stats", server.as_peer()}, endpoints.flags("caller")));
  ASSERT_TRUE(caller.ready());
  start_node({server.publish_address()});
  ASSERT_EQ(caller.ask("wait-server").num("ok"), 1u);
  ASSERT_TRUE(node->wait_for_server(integ::kStats, 30s));

  ASSERT_TRUE(caller.send("call 300"));  // runs while this process calls too
  for (int i = 0; i < 300; ++i) ASSERT_EQ(call_once(), "server");
  integ::Answer called = caller.answer();
  EXPECT_EQ(called.num("ok"), 300u) << called.line;
  EXPECT_EQ(called.num("served_by.server"), 300u) << called.line;
  EXPECT_EQ(server.report().num("handled"), 600u);
  EXPECT_TRUE(caller.quit());
  EXPECT_TRUE(server.quit());
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessRequest,
                         testing::Values(Transport::kTcp, Transport::kIpc),
                         [](const auto& info) { return integ::to_string(info.param); });
