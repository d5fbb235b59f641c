// Sixteen node processes (eight under a sanitizer) that know only etcd: full membership, one topic
// fanned out to all the others, and under traffic one subscriber killed and another added.
#include <absl/strings/str_cat.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "integration/etcd.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

#ifdef BUS_TEST_SANITIZED
constexpr std::size_t kNodes = 8;
#else
constexpr std::size_t kNodes = 16;
#endif

}  // namespace

TEST(EtcdMesh, NodesFromEtcdMeshFanOutAndRideOutAKillAndAJoinUnderTraffic) {
  integ::Etcd etcd;
  ASSERT_TRUE(etcd.running());
  const std::string prefix = integ::fresh_prefix();
  // Generous liveness: sixteen processes share two cores (and a sanitizer's slowdown).
  auto node = [&](const std::string& name, const char* role) {
    return std::make_unique<NodeProcess>(std::vector<std::string>{
        "--name=" + name, "--etcd=" + etcd.url(), "--etcd-prefix=" + prefix, "--heartbeat-ms=100",
        "--dead-after=30", role});
  };
  auto pub = node("pub", "--export-readings");
  std::vector<std::unique_ptr<NodeProcess>> subs;
  for (std::size_t i = 1; i < kNodes; ++i) {
    subs.push_back(node(absl::StrCat("sub", i), "--import-readings"));
  }
  ASSERT_TRUE(pub->ready());
  for (auto& s : subs) ASSERT_TRUE(s->ready());

  // Full membership: everyone hears everyone.
  const std::size_t others = kNodes - 1;
  EXPECT_EQ(pub->ask("wait-peers " + std::to_string(others)).num("n"), others);
  for (auto& s : subs) {
    integ::Answer a = s->ask("wait-peers " + std::to_string(others));
    EXPECT_EQ(a.num("n"), others) << a.line;
  }
  EXPECT_EQ(etcd.keys(prefix).size(), kNodes);

  // Fan-out to all.
  ASSERT_EQ(pub->ask("wait-subscribers " + std::to_string(others)).num("n"), others);
  ASSERT_EQ(pub->ask("publish 2000").num("refused"), 0u);
  for (auto& s : subs) EXPECT_EQ(s->ask("wait-received 2000").num("n"), 2000u);

  // Under traffic (3,000 readings over about 3 s): one subscriber killed, another started.
  ASSERT_TRUE(pub->send("publish-at 3000 1000"));
  subs.front()->kill();
  auto joiner = node("joiner", "--import-readings");
  ASSERT_TRUE(joiner->ready());
  integ::Answer sent = pub->answer();
  ASSERT_EQ(sent.word, "published") << sent.line;
  ASSERT_EQ(sent.num("refused"), 0u) << sent.line;

  // The killed one leaves etcd with its lease and the others' peer lists when found dead; the
  // joiner is everyone's peer. Then 1,000 more reach every subscriber, the joiner too.
  EXPECT_TRUE(bus_test::eventually([&] { return etcd.keys(prefix).size() == kNodes; }, 120s));
  EXPECT_EQ(pub->ask("wait-peer-count " + std::to_string(others)).num("n"), others);
  EXPECT_EQ(joiner->ask("wait-peers " + std::to_string(others)).num("n"), others);
  ASSERT_EQ(pub->ask("wait-subscribers " + std::to_string(others)).num("n"), others);
  ASSERT_EQ(pub->ask("publish 1000").num("refused"), 0u);
  for (std::size_t i = 1; i < subs.size(); ++i) {
    integ::Answer r = subs[i]->ask("wait-received 6000");
    EXPECT_EQ(r.num("n"), 6000u) << "sub" << i + 1 << ": " << r.line;
    integ::Answer rep = subs[i]->report();
    EXPECT_EQ(rep.num("readings.gaps"), 0u) << rep.line;
  }
  integ::Answer j = joiner->ask("wait-received 1000");
  EXPECT_GE(j.num("n"), 1000u) << j.line;
  EXPECT_EQ(joiner->report().num("readings.gaps"), 0u);
  EXPECT_GE(pub->report().num("members_dropped"), 1u);

  for (std::size_t i = 1; i < subs.size(); ++i) EXPECT_TRUE(subs[i]->quit());
  EXPECT_TRUE(joiner->quit());
  EXPECT_TRUE(pub->quit());
}
