// When the network between hosts fails: each "host" is a network namespace, and the hosts are
// joined through a third that routes between them (integ::Hosts), where a partition drops
// packets silently, one way or both, and a link can be slowed down. Every case asserts on
// counts (what arrived, what was counted missing, how often a peer was declared dead), never on
// how long anything took: the times are bench/run_partition.sh's.
// Needs root and iproute2; skipped, saying why, where the machine does not allow it.
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "integration/etcd.hpp"
#include "integration/hosts.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::Answer;
using integ::Hosts;
using integ::NodeProcess;

namespace {

// Declared dead after 3 s of silence: far from what a loaded machine running sanitizers makes
// of 100 ms heartbeats, so that every death counted is the partition's. ZeroMQ between the two
// nodes on host a too: the case where the healthy subscriber shares the publisher's socket with
// the partitioned one.
std::vector<std::string> node(const std::string& name, const std::string& address, int port,
                              std::vector<std::string> more) {
  std::vector<std::string> flags = {
      "--name=" + name,
      "--publish-on=tcp://" + address + ":" + std::to_string(port),
      "--requests-on=tcp://" + address + ":" + std::to_string(port + 1),
      "--heartbeat-ms=100",
      "--dead-after=30",
      "--stall-limit-ms=100",
      "--transport=zmq"};
  flags.insert(flags.end(), more.begin(), more.end());
  return flags;
}

std::string peer(const std::string& address, int port) {
  return "--peer=tcp://" + address + ":" + std::to_string(port);
}

/// A publisher and a healthy subscriber on host a, a subscriber across the network on host b.
struct ThreeNodes {
  explicit ThreeNodes(Hosts& hosts, std::vector<std::string> publisher_flags = {})
      : pub(node("pub", hosts.address_a(), 7101,
                 integ::cat({"--export-readings", peer(hosts.address_a(), 7111),
                             peer(hosts.address_b(), 7121)},
                            publisher_flags)),
            hosts.exec_in(hosts.a())),
        near(node("near", hosts.address_a(), 7111,
                  {"--import-readings", peer(hosts.address_a(), 7101)}),
             hosts.exec_in(hosts.a())),
        far(node("far", hosts.address_b(), 7121,
                 {"--import-readings", peer(hosts.address_a(), 7101)}),
            hosts.exec_in(hosts.b())) {}

  bool ready() { return pub.ready() && near.ready() && far.ready(); }

  /// Readings flow to both at `rate` a second (until stop()).
  void start(int rate) {
    // Each hears the others first: a death counted later is the test's.
    ASSERT_EQ(pub.ask("wait-peers 2").num("n"), 2u);
    ASSERT_EQ(far.ask("wait-peers 1").num("n"), 1u);
    ASSERT_EQ(pub.ask("wait-subscribers 2").num("n"), 2u);
    ASSERT_EQ(pub.ask("pace " + std::to_string(rate)).word, "pacing");
    ASSERT_GE(near.ask("wait-received 200").num("n"), 200u);
    ASSERT_GE(far.ask("wait-received 200").num("n"), 200u);
  }
  /// `who` receives `more` readings beyond what it has now.
  uint64_t receives(NodeProcess& who, uint64_t more) {
    uint64_t want = who.report().num("received") + more;
    return who.ask("wait-received " + std::to_string(want)).num("n") >= want;
  }
  /// Stops publishing; then every reading is received or counted missing, at both. Returns how
  /// many were published.
  uint64_t stop() {
    Answer stopped = pub.ask("pace-stop");
    EXPECT_EQ(stopped.num("refused"), 0u) << stopped.line;  // every reading was published
    uint64_t total = stopped.num("total");
    auto settled = [&](NodeProcess& n) {
      return bus_test::eventually(
          [&] {
            Answer r = n.report();
            return r.num("received") + r.num("readings.gaps") >= total;
          },
          60s);
    };
    EXPECT_TRUE(settled(near)) << near.report().line;
    EXPECT_TRUE(settled(far)) << far.report().line;
    return total;
  }
  /// The publisher's count of what `far` missed is what far counted, and nothing reached the
  /// healthy subscriber twice or was lost to it.
  void check_accounting(uint64_t total) {
    Answer n = near.report(), f = far.report(), p = pub.report();
    EXPECT_EQ(n.num("received"), total) << n.line;
    EXPECT_EQ(n.num("readings.gaps"), 0u) << n.line;
    EXPECT_EQ(f.num("received") + f.num("readings.gaps"), total) << f.line;
    EXPECT_EQ(f.num("sensor.pub"), f.num("received")) << f.line;
    EXPECT_TRUE(bus_test::eventually(
        [&] { return pub.report().num("missed_by.far") == far.report().num("readings.gaps"); },
        30s))
        << pub.report().line << "\n"
        << far.report().line;
  }

  /// Once the network is whole again: each hears the other, readings reach far again, then
  /// publishing stops and every reading is accounted for (check_accounting).
  void back_and_settled() {
    EXPECT_EQ(far.ask("wait-peers 1").num("n"), 1u);
    EXPECT_EQ(pub.ask("wait-peers 2").num("n"), 2u);
    EXPECT_TRUE(receives(far, 1000));
    check_accounting(stop());
  }

  NodeProcess pub, near, far;
};

#define CREATE_HOSTS(hosts)                                                             \
  Hosts hosts(Hosts::Layout::kRouted); /* first: deleted after the processes in it */   \
  if (std::string refused = hosts.create(); !refused.empty()) {                         \
    GTEST_SKIP() << "this machine does not allow network namespaces here: " << refused; \
  }

}  // namespace

TEST(Partition, APartitionedSubscriberCostsOnlyItselfAndComesBack) {
  CREATE_HOSTS(hosts);
  ThreeNodes n(hosts);
  ASSERT_TRUE(n.ready());
  ASSERT_NO_FATAL_FAILURE(n.start(2000));

  ASSERT_TRUE(hosts.partition(true, true));
  // Each side declares the other dead; the healthy subscriber meanwhile takes readings.
  EXPECT_EQ(n.far.ask("wait-peer-count 0").num("n"), 0u);
  EXPECT_EQ(n.pub.ask("wait-peer-count 1").num("n"), 1u);
  EXPECT_TRUE(n.receives(n.near, 2000));
  Answer during = n.pub.report();
  ASSERT_TRUE(hosts.heal());

  n.back_and_settled();

  Answer f = n.far.report(), p = n.pub.report();
  EXPECT_GT(f.num("readings.gaps"), 0u) << "nothing lost across a partition? " << f.line;
  // One death and one return per partition, at each end, and a new connection for each.
  EXPECT_EQ(f.num("peers_lost"), 1u) << f.line;
  EXPECT_EQ(f.num("peers_returned"), 1u) << f.line;
  EXPECT_GE(f.num("reconnects"), 1u) << f.line;
  EXPECT_EQ(p.num("peers_lost"), 1u) << p.line;
  EXPECT_EQ(p.num("peers_returned"), 1u) << p.line;
  // The publisher waited for far's full queue once at most, then went on without it: the
  // healthy subscriber was held back no longer than one send_stall_limit.
  EXPECT_LE(during.num("publish_stalls"), 1u) << during.line;
  EXPECT_LE(p.num("publish_stalls"), 1u) << p.line;
  EXPECT_LE(p.num("publish_cuts"), 1u) << p.line;
}

TEST(Partition, AOneWayPartitionIsOneDeathAndOneReturn) {
  CREATE_HOSTS(hosts);
  ThreeNodes n(hosts);
  ASSERT_TRUE(n.ready());
  ASSERT_NO_FATAL_FAILURE(n.start(2000));

  // far no longer hears pub; pub still hears far (but TCP needs both ways: what far sends
  // stops too once nothing of it is acknowledged).
  ASSERT_TRUE(hosts.partition(/*a_to_b=*/true, /*b_to_a=*/false));
  EXPECT_EQ(n.far.ask("wait-peer-count 0").num("n"), 0u);
  EXPECT_TRUE(n.receives(n.near, 2000));
  ASSERT_TRUE(hosts.heal());

  n.back_and_settled();

  Answer f = n.far.report(), p = n.pub.report();
  EXPECT_EQ(f.num("peers_lost"), 1u) << f.line;
  EXPECT_EQ(f.num("peers_returned"), 1u) << f.line;
  // pub may or may not have heard far's last heartbeats for long enough: once at most.
  EXPECT_LE(p.num("peers_lost"), 1u) << p.line;
  EXPECT_EQ(p.num("peers_returned"), p.num("peers_lost")) << p.line;
  EXPECT_LE(p.num("publish_stalls"), 1u) << p.line;
  EXPECT_LE(p.num("publish_cuts"), 1u) << p.line;
}

TEST(Partition, ASubscriberBehindASlowLinkIsASlowSubscriber) {
  CREATE_HOSTS(hosts);
  // 1 KiB readings at 2,000 a second: 16 Mbit/s into a 1 Mbit/s link.
  ThreeNodes n(hosts, {"--reading-bytes=1024"});
  ASSERT_TRUE(n.ready());
  ASSERT_NO_FATAL_FAILURE(n.start(2000));

  if (!hosts.slow_to_b("1mbit")) GTEST_SKIP() << "this kernel has no tbf queueing discipline (tc)";
  // Held, then cut, like any slow subscriber; the healthy one goes on meanwhile.
  EXPECT_TRUE(bus_test::eventually([&] { return n.pub.report().num("publish_cuts") >= 2; }, 120s))
      << n.pub.report().line;
  EXPECT_TRUE(n.receives(n.near, 2000));
  ASSERT_TRUE(hosts.slow_to_b(""));
  n.back_and_settled();

  Answer f = n.far.report(), p = n.pub.report();
  EXPECT_GT(f.num("readings.gaps"), 0u) << f.line;
  // Slow is not dead: at most one false death, and back from it.
  EXPECT_LE(f.num("peers_lost"), 1u) << f.line;
  EXPECT_EQ(f.num("peers_returned"), f.num("peers_lost")) << f.line;
  EXPECT_LE(p.num("peers_lost"), 1u) << p.line;
  EXPECT_EQ(p.num("peers_returned"), p.num("peers_lost")) << p.line;
}

TEST(Partition, CallsEndByTheirDeadlineAndThenGoToTheLiveServer) {
  CREATE_HOSTS(hosts);
  NodeProcess caller(
      node("caller", hosts.address_a(), 7101,
           {"--import-stats", peer(hosts.address_a(), 7111), peer(hosts.address_b(), 7121)}),
      hosts.exec_in(hosts.a()));
  NodeProcess near(node("near", hosts.address_a(), 7111, {"--serve"}), hosts.exec_in(hosts.a()));
  NodeProcess far(node("far", hosts.address_b(), 7121, {"--serve"}), hosts.exec_in(hosts.b()));
  ASSERT_TRUE(caller.ready() && near.ready() && far.ready());
  ASSERT_EQ(caller.ask("wait-peers 2").num("n"), 2u);
  ASSERT_EQ(caller.ask("wait-server").num("ok"), 1u);
  Answer before = caller.ask("call 20");
  EXPECT_EQ(before.num("ok"), 20u) << before.line;
  EXPECT_GT(before.num("served_by.far"), 0u) << before.line;

  ASSERT_TRUE(hosts.partition(true, true));
  // Round-robin sends every other call to far until it is declared dead: each of those ends by
  // its deadline (DEADLINE_EXCEEDED) or when far is declared dead (ABORTED, "peer gone").
  Answer during = caller.ask("call 10 2000");
  EXPECT_EQ(during.num("ok") + during.num("failed"), 10u) << during.line;
  EXPECT_GE(during.num("failed"), 1u) << during.line;
  EXPECT_EQ(during.num("code.4") + during.num("code.10"), during.num("failed")) << during.line;
  EXPECT_EQ(during.num("served_by.far"), 0u) << during.line;
  // Once far is declared dead, every call goes to near.
  EXPECT_EQ(caller.ask("wait-peer-count 1").num("n"), 1u);
  Answer dead = caller.ask("call 20 5000");
  EXPECT_EQ(dead.num("ok"), 20u) << dead.line;
  EXPECT_EQ(dead.num("served_by.near"), 20u) << dead.line;

  ASSERT_TRUE(hosts.heal());
  EXPECT_EQ(caller.ask("wait-peer-count 2").num("n"), 2u);
  Answer after = caller.ask("call 20");
  EXPECT_EQ(after.num("ok"), 20u) << after.line;
  EXPECT_GT(after.num("served_by.far"), 0u) << after.line;
  Answer c = caller.report();
  EXPECT_EQ(c.num("peers_lost"), 1u) << c.line;
  EXPECT_EQ(c.num("peers_returned"), 1u) << c.line;
}

// Membership through a real etcd, on the router (both hosts reach it whatever the partition
// between them does).
class PartitionedMembership : public testing::Test {
 protected:
  void SetUp() override {
    if (std::string refused = hosts.create(); !refused.empty()) {
      GTEST_SKIP() << "this machine does not allow network namespaces here: " << refused;
    }
    etcd.emplace(hosts.exec_in(hosts.router()), Hosts::service());
    ASSERT_TRUE(etcd->running()) << "could not start etcd";
    a.emplace(node("a", hosts.address_a(), 7101, member({"--export-readings"})),
              hosts.exec_in(hosts.a()));
    b.emplace(node("b", hosts.address_b(), 7121, member({"--import-readings"})),
              hosts.exec_in(hosts.b()));
    ASSERT_TRUE(a->ready() && b->ready());
    ASSERT_EQ(a->ask("wait-peers 1").num("n"), 1u);
    ASSERT_EQ(b->ask("wait-peers 1").num("n"), 1u);
    ASSERT_EQ(a->ask("wait-subscribers 1").num("n"), 1u);
    ASSERT_EQ(a->ask("pace 1000").word, "pacing");
    ASSERT_GE(b->ask("wait-received 200").num("n"), 200u);
  }
  std::vector<std::string> member(std::vector<std::string> flags) {
    return integ::cat({"--etcd=" + etcd->url(), "--etcd-prefix=" + prefix}, flags);
  }
  bool receives(NodeProcess& who, uint64_t more) {
    uint64_t want = who.report().num("received") + more;
    return who.ask("wait-received " + std::to_string(want)).num("n") >= want;
  }
  /// b received or counted every reading a published.
  void settle() {
    uint64_t total = a->ask("pace-stop").num("total");
    EXPECT_TRUE(bus_test::eventually(
        [&] {
          Answer r = b->report();
          return r.num("received") + r.num("readings.gaps") == total;
        },
        60s))
        << b->report().line << " published " << total;
  }

  Hosts hosts{Hosts::Layout::kRouted};  // first: deleted after the processes in it
  std::optional<integ::Etcd> etcd;
  std::string prefix = integ::fresh_prefix();
  std::optional<NodeProcess> a, b;
};

TEST_F(PartitionedMembership, ANodeCutOffFromEtcdButNotFromItsPeersKeepsThemAndTheyKeepIt) {
  ASSERT_EQ(etcd->keys(prefix).size(), 2u);
  ASSERT_TRUE(hosts.blackhole(hosts.a(), Hosts::service(), true));
  // Its lease runs out and etcd deletes its key; b hears a all the while, and keeps it.
  EXPECT_TRUE(bus_test::eventually([&] { return etcd->keys(prefix).size() == 1; }, 60s));
  EXPECT_TRUE(bus_test::eventually([&] { return a->report().num("etcd_errors") >= 1; }, 60s));
  EXPECT_TRUE(bus_test::eventually([&] { return b->report().num("members_kept") == 1; }, 60s))
      << b->report().line;
  EXPECT_TRUE(receives(*b, 2000));
  ASSERT_TRUE(hosts.blackhole(hosts.a(), Hosts::service(), false));
  // Back: a registers again.
  EXPECT_TRUE(bus_test::eventually([&] { return etcd->keys(prefix).size() == 2; }, 60s));
  EXPECT_TRUE(receives(*b, 1000));
  settle();

  Answer ra = a->report(), rb = b->report();
  EXPECT_EQ(rb.num("readings.gaps"), 0u) << rb.line;
  EXPECT_EQ(ra.num("peers_lost"), 0u) << ra.line;
  EXPECT_EQ(rb.num("peers_lost"), 0u) << rb.line;
  EXPECT_EQ(rb.num("members_dropped"), 0u) << rb.line;
  EXPECT_EQ(ra.num("members_dropped"), 0u) << ra.line;
  EXPECT_GE(ra.num("etcd_registrations"), 2u) << ra.line;
  EXPECT_EQ(ra.num("peers"), 1u) << ra.line;
  EXPECT_EQ(rb.num("peers"), 1u) << rb.line;
}

TEST_F(PartitionedMembership, NodesCutOffFromEachOtherButNotFromEtcdAreDroppedByLivenessAndReturn) {
  ASSERT_TRUE(hosts.partition(true, true));
  // Both keep their leases (etcd still lists both), yet each declares the other dead.
  EXPECT_EQ(a->ask("wait-peer-count 0").num("n"), 0u);
  EXPECT_EQ(b->ask("wait-peer-count 0").num("n"), 0u);
  EXPECT_EQ(etcd->keys(prefix).size(), 2u);
  ASSERT_TRUE(hosts.heal());
  EXPECT_EQ(a->ask("wait-peers 1").num("n"), 1u);
  EXPECT_EQ(b->ask("wait-peers 1").num("n"), 1u);
  EXPECT_TRUE(receives(*b, 1000));
  settle();

  Answer ra = a->report(), rb = b->report();
  EXPECT_GT(rb.num("readings.gaps"), 0u) << rb.line;
  // a learns it from b's next heartbeats.
  EXPECT_TRUE(bus_test::eventually(
      [&] { return a->report().num("missed_by.b") == b->report().num("readings.gaps"); }, 30s))
      << a->report().line;
  for (const Answer& r : {ra, rb}) {
    EXPECT_EQ(r.num("peers_lost"), 1u) << r.line;
    EXPECT_EQ(r.num("peers_returned"), 1u) << r.line;
    EXPECT_EQ(r.num("members_dropped"), 0u) << r.line;
  }
}

TEST_F(PartitionedMembership, AKeptNodeThatDiesIsDroppedByLiveness) {
  ASSERT_TRUE(hosts.blackhole(hosts.a(), Hosts::service(), true));
  EXPECT_TRUE(bus_test::eventually([&] { return etcd->keys(prefix).size() == 1; }, 60s));
  EXPECT_TRUE(bus_test::eventually([&] { return b->report().num("members_kept") == 1; }, 60s))
      << b->report().line;
  // Kept because it was heard; once it is silent, liveness drops it, and b stops listening.
  a->kill();
  EXPECT_EQ(b->ask("wait-peer-count 0").num("n"), 0u);
  Answer rb = b->report();
  EXPECT_EQ(rb.num("peers_lost"), 1u) << rb.line;
  EXPECT_EQ(rb.num("members_dropped"), 1u) << rb.line;
  EXPECT_EQ(rb.num("reconnects"), 0u) << rb.line;  // a kept one is dropped, not re-connected
}
