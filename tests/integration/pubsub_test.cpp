// Topics across processes: one publisher process and one or two subscriber processes, over tcp
// and ipc. Every message arrives, once, and no gap is counted.
#include <gtest/gtest.h>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;
using integ::Transport;

namespace {

constexpr uint64_t kMessages = 10000;
constexpr uint64_t kSeqSum = kMessages * (kMessages + 1) / 2;

class MultiProcessPubSub : public testing::TestWithParam<Transport> {
 protected:
  integ::Endpoints endpoints{GetParam()};
};

/// Waits until `sub` holds `n` readings (or more: the check after it says so).
bool receives(NodeProcess& sub, uint64_t n) {
  return bus_test::eventually([&] { return sub.report().num("received") >= n; }, 60s);
}

void expect_everything_from(NodeProcess& sub, const std::string& publisher) {
  integ::Answer r = sub.report();
  EXPECT_EQ(r.num("received"), kMessages) << r.line;
  EXPECT_EQ(r.num("sum"), kSeqSum) << r.line;
  EXPECT_EQ(r.num("sensor." + publisher), kMessages) << r.line;
  EXPECT_EQ(r.num("readings.received"), kMessages) << r.line;
  EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;
  EXPECT_EQ(r.num("readings.rejected"), 0u) << r.line;
}

}  // namespace

TEST_P(MultiProcessPubSub, EveryMessageReachesASubscriberProcess) {
  NodeProcess pub(cat({"--name=pub", "--export-readings"}, endpoints.flags("pub")));
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(cat({"--name=sub", "--import-readings", pub.as_peer()}, endpoints.flags("sub")));
  ASSERT_TRUE(sub.ready());

  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  integ::Answer sent = pub.ask("publish " + std::to_string(kMessages));
  ASSERT_EQ(sent.word, "published") << sent.line;
  ASSERT_EQ(sent.num("refused"), 0u) << sent.line;

  ASSERT_TRUE(receives(sub, kMessages)) << sub.report().line;
  expect_everything_from(sub, "pub");
  EXPECT_EQ(pub.report().num("publish_cuts"), 0u);
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(pub.quit());
}

TEST_P(MultiProcessPubSub, EveryMessageReachesTwoSubscriberProcesses) {
  NodeProcess pub(cat({"--name=pub", "--export-readings"}, endpoints.flags("pub")));
  ASSERT_TRUE(pub.ready());
  NodeProcess sub1(
      cat({"--name=sub1", "--import-readings", pub.as_peer()}, endpoints.flags("sub1")));
  NodeProcess sub2(
      cat({"--name=sub2", "--import-readings", pub.as_peer()}, endpoints.flags("sub2")));
  ASSERT_TRUE(sub1.ready());
  ASSERT_TRUE(sub2.ready());

  ASSERT_EQ(pub.ask("wait-subscribers 2").num("n"), 2u);
  integ::Answer sent = pub.ask("publish " + std::to_string(kMessages));
  ASSERT_EQ(sent.num("refused"), 0u) << sent.line;

  ASSERT_TRUE(receives(sub1, kMessages)) << sub1.report().line;
  ASSERT_TRUE(receives(sub2, kMessages)) << sub2.report().line;
  expect_everything_from(sub1, "pub");
  expect_everything_from(sub2, "pub");
  EXPECT_EQ(pub.report().num("publish_cuts"), 0u);
  EXPECT_TRUE(sub1.quit());
  EXPECT_TRUE(sub2.quit());
  EXPECT_TRUE(pub.quit());
}

INSTANTIATE_TEST_SUITE_P(Transports, MultiProcessPubSub,
                         testing::Values(Transport::kTcp, Transport::kIpc),
                         [](const auto& info) { return integ::to_string(info.param); });
