// The shared rate limit across three processes: three bus_fixture_node processes, each with a
// RateLimiter named "fixture" on its node, all listening to each other.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

constexpr uint64_t kLimit = 100;
constexpr uint64_t kPerRound = 20;

std::vector<std::string> limiter_flags(const std::string& name) {
  // A window of a day (aligned on UTC midnight): the test runs inside one. Counts go out every
  // 20 ms, and also whenever the test says "exchange".
  return {"--name=" + name, "--limit=100", "--limit-window-ms=86400000", "--limit-exchange-ms=20"};
}

class SharedLimit : public testing::Test {
 protected:
  void SetUp() override {
    a.emplace(limiter_flags("a"));
    ASSERT_TRUE(a->ready());
    b.emplace(cat(limiter_flags("b"), {a->as_peer()}));
    ASSERT_TRUE(b->ready());
    c.emplace(cat(limiter_flags("c"), {a->as_peer(), b->as_peer()}));
    ASSERT_TRUE(c->ready());
    // Everyone listens to everyone.
    ASSERT_EQ(a->ask("peer " + b->publish_address()).word, "peered");
    ASSERT_EQ(a->ask("peer " + c->publish_address()).word, "peered");
    ASSERT_EQ(b->ask("peer " + c->publish_address()).word, "peered");
    for (auto* n : nodes()) ASSERT_EQ(n->ask("wait-peers 2").num("n"), 2u);
  }

  std::vector<NodeProcess*> nodes() { return {&*a, &*b, &*c}; }

  /// Until every node knows `total` for `key`. Each round every node publishes all its counts
  /// again (absolute counts: a publish lost to a subscription still being set up is repaired).
  bool agree(const std::string& key, uint64_t total) {
    return bus_test::eventually(
        [&] {
          bool all = true;
          for (auto* n : nodes()) {
            EXPECT_EQ(n->ask("exchange").word, "exchanged");
          }
          for (auto* n : nodes()) all = all && n->ask("known " + key).num("n") == total;
          return all;
        },
        60s);
  }

  std::optional<NodeProcess> a, b, c;
};

TEST_F(SharedLimit, WhatOneProcessAdmittedCountsInTheOthers) {
  EXPECT_EQ(a->ask("admit k1 150").num("n"), kLimit);
  ASSERT_TRUE(agree("k1", kLimit));
  EXPECT_EQ(b->ask("admit k1 50").num("n"), 0u);
  EXPECT_EQ(c->ask("admit k1 50").num("n"), 0u);
  // Another key is another count.
  EXPECT_EQ(c->ask("admit k9 5").num("n"), 5u);
}

TEST_F(SharedLimit, ConcurrentAdmissionsStayWithinTheDocumentedBound) {
  // Rounds: all three admit up to 20 at the same time, then their counts are exchanged. What a
  // node cannot know is what the other two admitted in the same round, so the total may pass
  // the limit by at most 2 x 20, and once exchanged nobody admits any more.
  uint64_t total = 0;
  for (int round = 0; round < 20; ++round) {
    for (auto* n : nodes()) ASSERT_TRUE(n->send("admit k2 " + std::to_string(kPerRound)));
    uint64_t admitted = 0;
    for (auto* n : nodes()) admitted += n->answer().num("n");
    total += admitted;
    ASSERT_TRUE(agree("k2", total)) << "round " << round << ", total " << total;
    EXPECT_LE(total, kLimit + 2 * kPerRound) << "round " << round;
    if (admitted == 0) break;
  }
  EXPECT_GE(total, kLimit);
  for (auto* n : nodes()) {
    EXPECT_EQ(n->ask("admit k2 1").num("n"), 0u);
    EXPECT_EQ(n->ask("known k2").num("over_admitted"), total - kLimit);
  }
}

}  // namespace
