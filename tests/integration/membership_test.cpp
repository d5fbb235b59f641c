// Membership without a peer list, against the real thing: node processes that find each other
// through a real etcd (started here, stopped and restarted under them), and through real name
// resolution (/etc/hosts entries for one name with three addresses, taken away and given back).
#include <absl/strings/str_cat.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <random>
#include <sstream>

#include "integration/etcd.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;
using testing::HasSubstr;

namespace {

// Heartbeats 50 ms, dead after 20 missed (1 s): the lease's TTL is the shortest, 5 s.
const std::vector<std::string> kLiveness = {"--heartbeat-ms=50", "--dead-after=20"};

class EtcdMembership : public testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd.running()) << "could not start etcd"; }

  /// A node that knows only etcd.
  std::unique_ptr<NodeProcess> node(const std::string& name, std::vector<std::string> flags) {
    return std::make_unique<NodeProcess>(cat(
        {"--name=" + name, "--etcd=" + etcd.url(), "--etcd-prefix=" + prefix}, kLiveness, flags));
  }
  bool all_see(std::vector<NodeProcess*> nodes, std::size_t n) {
    for (NodeProcess* p : nodes) {
      if (p->ask("wait-peers " + std::to_string(n)).num("n") < n) return false;
    }
    return true;
  }

  integ::Etcd etcd;
  std::string prefix = integ::fresh_prefix();
};

}  // namespace

TEST_F(EtcdMembership, NodesFindEachOtherAndATopicCrossesWithoutPeerLists) {
  auto pub = node("pub", {"--export-readings"});
  auto sub1 = node("sub1", {"--import-readings"});
  auto sub2 = node("sub2", {"--import-readings", "--serve"});
  ASSERT_TRUE(pub->ready() && sub1->ready() && sub2->ready());
  ASSERT_TRUE(all_see({pub.get(), sub1.get(), sub2.get()}, 2));

  // Each registered under the prefix, with what it does.
  EXPECT_EQ(etcd.keys(prefix).size(), 3u);
  const std::string sub2_key = absl::StrCat(prefix, absl::Hex(sub2->id(), absl::kZeroPad16));
  const std::string value = etcd.get(sub2_key);
  EXPECT_THAT(value, HasSubstr("\"name\":\"sub2\"")) << value;
  EXPECT_THAT(value, HasSubstr("\"serves\":[\"integ.stats\"]")) << value;
  EXPECT_THAT(value, HasSubstr(sub2->publish_address())) << value;

  ASSERT_EQ(pub->ask("wait-subscribers 2").num("n"), 2u);
  ASSERT_EQ(pub->ask("publish 1000").num("refused"), 0u);
  for (auto* s : {sub1.get(), sub2.get()}) {
    integ::Answer r = s->ask("wait-received 1000");
    EXPECT_EQ(r.num("n"), 1000u) << r.line;
    integ::Answer rep = s->report();
    EXPECT_EQ(rep.num("readings.gaps"), 0u) << rep.line;
    EXPECT_EQ(rep.num("etcd_registrations"), 1u) << rep.line;
    EXPECT_EQ(rep.num("members_found"), 2u) << rep.line;
    EXPECT_EQ(rep.num("etcd_errors"), 0u) << rep.line;
  }
  EXPECT_TRUE(sub1->quit());
  EXPECT_TRUE(sub2->quit());
  EXPECT_TRUE(pub->quit());
}

TEST_F(EtcdMembership, ANodeThatStopsLeavesAtOnceAndOneKilledWhenItsLeaseRunsOut) {
  auto a = node("a", {});
  auto b = node("b", {});
  auto c = node("c", {});
  ASSERT_TRUE(a->ready() && b->ready() && c->ready());
  ASSERT_TRUE(all_see({a.get(), b.get(), c.get()}, 2));

  // A clean stop revokes the lease: its key is gone when quit() returns.
  ASSERT_TRUE(c->quit());
  EXPECT_EQ(etcd.keys(prefix).size(), 2u);
  EXPECT_TRUE(bus_test::eventually([&] { return a->report().num("members_dropped") == 1; }, 60s))
      << a->report().line;

  // kill -9: nothing said; etcd deletes the key when the lease's 5 s run out.
  b->kill();
  EXPECT_TRUE(bus_test::eventually([&] { return etcd.keys(prefix).size() == 1; }, 60s));
  EXPECT_TRUE(bus_test::eventually([&] { return a->report().num("members_dropped") == 2; }, 60s))
      << a->report().line;
  EXPECT_EQ(a->ask("wait-peer-count 0").num("n"), 0u);
  EXPECT_TRUE(a->quit());
}

TEST_F(EtcdMembership, TheClusterRidesOutAnEtcdOutageAndANodeStartedDuringItJoinsAfter) {
  auto pub = node("pub", {"--export-readings"});
  auto sub = node("sub", {"--import-readings"});
  ASSERT_TRUE(pub->ready() && sub->ready());
  ASSERT_TRUE(all_see({pub.get(), sub.get()}, 1));
  ASSERT_EQ(pub->ask("wait-subscribers 1").num("n"), 1u);

  etcd.kill();
  // Traffic goes on without etcd: the nodes keep the peers they had.
  ASSERT_EQ(pub->ask("publish 500").num("refused"), 0u);
  EXPECT_EQ(sub->ask("wait-received 500").num("n"), 500u);
  // A node started now cannot register; it keeps trying.
  auto late = node("late", {"--import-readings"});
  ASSERT_TRUE(late->ready());
  EXPECT_TRUE(bus_test::eventually([&] { return late->report().num("etcd_errors") >= 2; }, 60s));
  EXPECT_TRUE(bus_test::eventually([&] { return pub->report().num("etcd_errors") >= 1; }, 60s));
  EXPECT_EQ(pub->report().num("peers"), 1u);

  ASSERT_TRUE(etcd.start());
  // The late node registers and everyone finds everyone; the old ones keep (or renew) theirs.
  ASSERT_TRUE(all_see({pub.get(), sub.get(), late.get()}, 2));
  EXPECT_TRUE(bus_test::eventually([&] { return etcd.keys(prefix).size() == 3; }, 60s));
  ASSERT_EQ(pub->ask("wait-subscribers 2").num("n"), 2u);
  ASSERT_EQ(pub->ask("publish 500").num("refused"), 0u);
  EXPECT_EQ(sub->ask("wait-received 1000").num("n"), 1000u);
  EXPECT_GE(late->ask("wait-received 500").num("n"), 500u);
  integ::Answer r = sub->report();
  EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;
  EXPECT_GE(late->report().num("etcd_registrations"), 1u);
  EXPECT_TRUE(late->quit());
  EXPECT_TRUE(sub->quit());
  EXPECT_TRUE(pub->quit());
}

TEST_F(EtcdMembership, AKeyThatIsNotANodesRegistrationIsCountedAndIgnored) {
  ASSERT_TRUE(etcd.put(prefix + "garbage", "{not json"));
  auto a = node("a", {});
  auto b = node("b", {});
  ASSERT_TRUE(a->ready() && b->ready());
  ASSERT_TRUE(all_see({a.get(), b.get()}, 1));
  EXPECT_GE(a->report().num("etcd_errors"), 1u);
  // One written while they run reaches them through the watch.
  ASSERT_TRUE(etcd.put(prefix + "garbage2", "[]"));
  EXPECT_TRUE(bus_test::eventually([&] { return b->report().num("etcd_errors") >= 2; }, 60s));
  EXPECT_EQ(a->report().num("peers"), 1u);
  EXPECT_TRUE(a->quit());
  EXPECT_TRUE(b->quit());
}

// ---- DNS --------------------------------------------------------------------------------------

namespace {

/// Lines of /etc/hosts for one name, added and taken away by the test and removed at the end.
class HostsFile {
 public:
  explicit HostsFile(std::string name) : name_(std::move(name)) { remove_all(); }
  ~HostsFile() { remove_all(); }
  static bool writable() { return ::access("/etc/hosts", W_OK) == 0; }
  const std::string& name() const { return name_; }

  void add(const std::string& address) {
    std::ofstream out("/etc/hosts", std::ios::app);
    out << address << " " << name_ << "  # " << kMark << "\n";
  }
  void remove(const std::string& address) {
    rewrite([&](const std::string& line) {
      return line.find(kMark) != std::string::npos && line.rfind(address + " ", 0) == 0;
    });
  }

 private:
  static constexpr char kMark[] = "bus membership test";
  void remove_all() {
    rewrite([&](const std::string& line) {
      return line.find(kMark) != std::string::npos &&
             line.find(" " + name_ + " ") != std::string::npos;
    });
  }
  // In place (no rename: /etc/hosts may be a bind mount).
  template <class F>
  void rewrite(F drop) {
    std::ifstream in("/etc/hosts");
    std::stringstream kept;
    for (std::string line; std::getline(in, line);) {
      if (!drop(line)) kept << line << "\n";
    }
    in.close();
    std::ofstream out("/etc/hosts", std::ios::trunc);
    out << kept.str();
  }
  std::string name_;
};

/// A port free on 127.0.0.2, .3 and .4 alike (the nodes of one name share a port).
int port_free_on_three() {
  std::mt19937 rng(static_cast<unsigned>(::getpid()));
  for (int attempt = 0; attempt < 100; ++attempt) {
    int port = 20000 + static_cast<int>(rng() % 20000);
    bool ok = true;
    for (int host = 2; host <= 4 && ok; ++host) {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(port));
      a.sin_addr.s_addr = htonl(0x7f000000u | static_cast<uint32_t>(host));
      ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
      ::close(fd);
    }
    if (ok) return port;
  }
  return 0;
}

}  // namespace

TEST(DnsMembership, EveryAddressOfANameIsAPeerAndOneTakenAwayIsDroppedAfterDeadAfter) {
  if (!HostsFile::writable()) {
    GTEST_SKIP() << "needs to write /etc/hosts (run as root, as CI does)";
  }
  HostsFile hosts(absl::StrCat("bus-dns-test-", ::getpid()));
  const int port = port_free_on_three();
  ASSERT_NE(port, 0);
  for (const char* a : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) hosts.add(a);
  const std::string peer = absl::StrCat("--peer=tcp://", hosts.name(), ":", port);
  auto node = [&](int host) {
    return std::make_unique<NodeProcess>(
        cat({absl::StrCat("--name=n", host),
             absl::StrCat("--publish-on=tcp://127.0.0.", host, ":", port), peer,
             "--resolve-every-ms=100"},
            kLiveness));
  };
  auto n2 = node(2), n3 = node(3), n4 = node(4);
  ASSERT_TRUE(n2->ready() && n3->ready() && n4->ready());
  for (auto* n : {n2.get(), n3.get(), n4.get()}) {
    integ::Answer a = n->ask("wait-peers 2");
    EXPECT_EQ(a.num("n"), 2u) << a.line;
    // Every address but its own.
    EXPECT_EQ(n->report().num("members_found"), 2u);
  }

  // The name stops giving .4: after dead_after the others stop listening to it (and, no longer
  // hearing it, declare it dead); it still listens to them (its name still gives their addresses).
  hosts.remove("127.0.0.4");
  for (auto* n : {n2.get(), n3.get()}) {
    integ::Answer a = n->ask("wait-peer-count 1");
    EXPECT_EQ(a.num("n"), 1u) << a.line;
    EXPECT_EQ(n->report().num("members_dropped"), 1u) << n->report().line;
  }
  EXPECT_EQ(n4->report().num("peers"), 2u);

  // Given back, it is a peer again.
  hosts.add("127.0.0.4");
  for (auto* n : {n2.get(), n3.get()}) EXPECT_EQ(n->ask("wait-peers 2").num("n"), 2u);
  EXPECT_EQ(n2->report().num("members_found"), 3u);
  EXPECT_EQ(n2->report().num("dns_errors"), 0u);
  for (auto* n : {n2.get(), n3.get(), n4.get()}) EXPECT_TRUE(n->quit());
}

TEST(DnsMembership, ANameThatDoesNotResolveIsCountedAndTheNodeKeepsRunning) {
  NodeProcess a(cat({"--name=a", "--peer=tcp://no-such-host.invalid:7001", "--resolve-every-ms=50"},
                    kLiveness));
  ASSERT_TRUE(a.ready());
  EXPECT_TRUE(bus_test::eventually([&] { return a.report().num("dns_errors") >= 2; }, 60s));
  EXPECT_EQ(a.report().num("peers"), 0u);
  EXPECT_TRUE(a.quit());
}

TEST_F(EtcdMembership, RelatedOnlyListensToTheNodesThatShareAChannel) {
  // Two pairs that share nothing across: a topic's publisher and subscriber, an endpoint's
  // server and caller.
  auto pub = node("pub", {"--export-readings", "--etcd-related-only"});
  auto sub = node("sub", {"--import-readings", "--etcd-related-only"});
  auto server = node("server", {"--serve", "--etcd-related-only"});
  auto caller = node("caller", {"--import-stats", "--etcd-related-only"});
  ASSERT_TRUE(pub->ready() && sub->ready() && server->ready() && caller->ready());
  ASSERT_TRUE(all_see({pub.get(), sub.get(), server.get(), caller.get()}, 1));
  EXPECT_TRUE(bus_test::eventually([&] { return etcd.keys(prefix).size() == 4; }, 60s));

  ASSERT_EQ(pub->ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(pub->ask("publish 100").num("refused"), 0u);
  EXPECT_EQ(sub->ask("wait-received 100").num("n"), 100u);
  ASSERT_EQ(caller->ask("wait-server").num("ok"), 1u);
  integ::Answer called = caller->ask("call 1");
  EXPECT_EQ(called.num("ok"), 1u) << called.line;
  // Each listens to its partner only.
  for (const auto& [n, partner] :
       std::vector<std::pair<NodeProcess*, const char*>>{{pub.get(), "sub"},
                                                         {sub.get(), "pub"},
                                                         {server.get(), "caller"},
                                                         {caller.get(), "server"}}) {
    integ::Answer r = n->report();
    EXPECT_EQ(r.num("peers"), 1u) << r.line;
    EXPECT_EQ(r.num("peer." + std::string(partner)), 1u) << r.line;
    EXPECT_EQ(r.num("members_found"), 1u) << r.line;
  }
  for (auto* n : {pub.get(), sub.get(), server.get(), caller.get()}) EXPECT_TRUE(n->quit());
}
