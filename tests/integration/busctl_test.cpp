// busctl against the multi-process demo (producer -> aggregator <- monitor), each a real
// process on loopback TCP: every command, its output and its exit code, and the errors that
// say what to do. And busctl on a CURVE-secured bus, with its key pair in a --config file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "integration/etcd.hpp"
#include "integration/node_process.hpp"
#include "integration/process.hpp"
#include "support/test_support.hpp"

namespace {

class Busctl : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int base = 21000 + static_cast<int>(::getpid() % 400) * 10;
    auto ep = [&](int n) { return "tcp://127.0.0.1:" + std::to_string(base + n); };
    prod_ = ep(1);
    agg_ = ep(2);
    mon_ = ep(4);
    aggregator_ = new integ::Child({DEMO_AGGREGATOR, "--publish=" + agg_, "--requests=" + ep(3),
                                    "--peers=" + prod_ + "," + mon_});
    monitor_ =
        new integ::Child({DEMO_MONITOR, "--publish=" + mon_, "--peers=" + prod_ + "," + agg_});
    producer_ = new integ::Child(
        {DEMO_PRODUCER, "--publish=" + prod_, "--peers=" + agg_ + "," + mon_, "--rate=100"});
  }
  static void TearDownTestSuite() {
    delete producer_;
    delete monitor_;
    delete aggregator_;
  }

  /// Runs busctl with `args`; its exit code, and what it printed (stdout and stderr) in `out`.
  int busctl(std::vector<std::string> args, std::string* out, bool schema = true) {
    std::vector<std::string> argv = {BUSCTL, "--wait=20s"};
    if (schema) argv.push_back("--schema=" + std::string(DEMO_SCHEMA));
    argv.insert(argv.end(), args.begin(), args.end());
    return integ::run_command(argv, out);
  }
  static std::vector<std::string> lines(const std::string& s) {
    std::vector<std::string> out;
    std::size_t at = 0;
    while (at < s.size()) {
      std::size_t end = s.find('\n', at);
      if (end == std::string::npos) end = s.size();
      out.push_back(s.substr(at, end - at));
      at = end + 1;
    }
    return out;
  }
  static bool has(const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  }

  static inline std::string prod_, agg_, mon_;
  static inline integ::Child* aggregator_ = nullptr;
  static inline integ::Child* monitor_ = nullptr;
  static inline integ::Child* producer_ = nullptr;
};

TEST_F(Busctl, PeersListsTheNodesAndWhatTheyServe) {
  std::string out;
  ASSERT_EQ(busctl({"--peer=" + agg_ + "," + prod_ + "," + mon_, "peers"}, &out), 0) << out;
  EXPECT_TRUE(has(out, "aggregator  id=")) << out;
  EXPECT_TRUE(has(out, "producer  id=")) << out;
  EXPECT_TRUE(has(out, "monitor  id=")) << out;
  EXPECT_TRUE(
      has(out, "serves  endpoint demo.stats  type 0x97f4fe7cd884377b -> 0xb0c964ce97b266db"))
      << out;
  EXPECT_TRUE(has(out, "imports topic    demo.readings  type 0xec296e21d841688d")) << out;
}

TEST_F(Busctl, RepeatedPeerFlagsAreAllKept) {
  // As --help says: comma-separated or repeated, in either flag form.
  std::string out;
  ASSERT_EQ(busctl({"--peer", agg_, "--peer=" + prod_, "--peer=" + mon_, "peers"}, &out), 0) << out;
  EXPECT_TRUE(has(out, "aggregator  id=")) << out;
  EXPECT_TRUE(has(out, "producer  id=")) << out;
  EXPECT_TRUE(has(out, "monitor  id=")) << out;
}

TEST_F(Busctl, StatsTellsANodeThatCannotBeAskedFromOneThatIsNotLive) {
  // The producer and the monitor have no request socket: live (they are listed), but $bus.stats
  // cannot reach them. Exit 6 says so, after the aggregator's counters; a name nobody has is 2.
  std::string out;
  EXPECT_EQ(busctl({"--peer=" + agg_, "--peer=" + prod_, "--peer=" + mon_, "stats"}, &out), 6)
      << out;
  EXPECT_TRUE(has(out, "aggregator (id ")) << out;
  EXPECT_TRUE(has(out, "\n  node.peers ")) << out;
  EXPECT_TRUE(has(out, "busctl: producer (id ")) << out;
  EXPECT_TRUE(has(out, "busctl: monitor (id ")) << out;
  EXPECT_TRUE(has(out, "is live but cannot be asked: it has no request socket")) << out;
  EXPECT_FALSE(has(out, "not live")) << out;
  EXPECT_EQ(busctl({"--peer=" + prod_, "stats", "producer"}, &out), 6) << out;
  EXPECT_TRUE(has(out, "is live but cannot be asked")) << out;
  EXPECT_EQ(busctl({"--peer=" + prod_, "--wait=5s", "stats", "nobody"}, &out), 2) << out;
  EXPECT_TRUE(has(out, "no live node named 'nobody'")) << out;
}

TEST_F(Busctl, SubPrintsJsonLinesUpToCount) {
  std::string out;
  ASSERT_EQ(busctl({"--peer=" + prod_, "--count=3", "--timeout=30s", "sub", "demo.readings"}, &out),
            0)
      << out;
  auto ls = lines(out);
  ASSERT_EQ(ls.size(), 3u) << out;
  for (const auto& l : ls) {
    EXPECT_EQ(l.rfind(R"({"sensor":")", 0), 0u) << l;
    EXPECT_TRUE(has(l, R"("seq":")")) << l;
  }
}

TEST_F(Busctl, CallPrintsTheReply) {
  std::string out;
  ASSERT_EQ(busctl({"--peer=" + agg_, "call", "demo.stats", "{}"}, &out), 0) << out;
  EXPECT_EQ(out.rfind(R"({"readings":")", 0), 0u) << out;
  EXPECT_TRUE(has(out, R"("sensors":[)")) << out;
}

TEST_F(Busctl, PubReachesTheNodesThatSubscribe) {
  std::string out;
  ASSERT_EQ(busctl({"--peer=" + agg_, "pub", "demo.readings",
                    R"({"sensor":"from-busctl","value":42.5,"seq":"1"})"},
                   &out),
            0)
      << out;
  EXPECT_EQ(out, "published to 1 node\n");  // the aggregator (the one --peer heard)
  ASSERT_EQ(busctl({"--peer=" + agg_, "call", "demo.stats", "{}"}, &out), 0) << out;
  EXPECT_TRUE(has(out, R"({"sensor":"from-busctl","count":"1","mean":42.5)")) << out;
}

TEST_F(Busctl, StatsPrintsANodesCounters) {
  std::string out;
  // The per-channel node counters appear once the aggregator has received a reading (the demo
  // processes have just started): ask until it has.
  int code = -1;
  ASSERT_TRUE(bus_test::eventually([&] {
    code = busctl({"--peer=" + agg_, "stats", "aggregator"}, &out);
    return code != 0 || has(out, "\n  node.channel.demo.readings.received ");
  })) << out;
  ASSERT_EQ(code, 0) << out;
  EXPECT_EQ(out.rfind("aggregator (id ", 0), 0u) << out;
  EXPECT_TRUE(has(out, "\n  channel.demo.readings.delivered ")) << out;
  EXPECT_TRUE(has(out, "\n  node.channel.demo.readings.received ")) << out;
  EXPECT_TRUE(has(out, "\n  node.peers ")) << out;
  // --wait long enough for a heartbeat from the aggregator to reach a sanitized busctl (else it
  // says "no peer reachable" instead).
  EXPECT_EQ(busctl({"--peer=" + agg_, "--wait=5s", "stats", "nobody"}, &out), 2) << out;
  EXPECT_TRUE(has(out, "no live node named 'nobody'")) << out;
}

TEST_F(Busctl, TapShowsEveryMessageWithItsChannelAndSender) {
  std::string out;
  ASSERT_EQ(busctl({"--peer=" + prod_, "--count=2", "--timeout=30s", "tap"}, &out), 0) << out;
  auto ls = lines(out);
  ASSERT_EQ(ls.size(), 2u) << out;
  for (const auto& l : ls) EXPECT_EQ(l.rfind(R"(demo.readings producer {"sensor":")", 0), 0u) << l;
}

TEST_F(Busctl, ErrorsSayWhatToDoWithDistinctExitCodes) {
  std::string out;
  // Usage.
  EXPECT_EQ(busctl({"--peer=" + agg_, "frobnicate"}, &out), 1) << out;
  EXPECT_TRUE(has(out, "unknown command 'frobnicate'")) << out;
  EXPECT_EQ(busctl({"call", "demo.stats", "{}"}, &out), 1) << out;
  EXPECT_TRUE(has(out, "--peer or --etcd is required")) << out;
  // Nobody there.
  EXPECT_EQ(busctl({"--peer=tcp://127.0.0.1:1", "--wait=1s", "peers"}, &out), 2) << out;
  EXPECT_TRUE(has(out, "no peer reachable")) << out;
  EXPECT_EQ(busctl({"--peer=" + agg_, "--wait=5s", "call", "demo.nothing", "{}"}, &out), 2);
  EXPECT_TRUE(has(out, "no live node serves 'demo.nothing'")) << out;
  // A field the schema does not have.
  EXPECT_EQ(busctl({"--peer=" + agg_, "call", "demo.stats", R"({"sensr":"x"})"}, &out), 3);
  EXPECT_TRUE(has(out, "the JSON is not a StatsRequest")) << out;
  EXPECT_TRUE(has(out, "sensr")) << out;
  // No schema for the channel's type.
  EXPECT_EQ(busctl({"--peer=" + agg_, "call", "demo.stats", "{}"}, &out, /*schema=*/false), 3);
  EXPECT_TRUE(has(out, "carries type 0x97f4fe7cd884377b, which no --schema file defines")) << out;
  // A schema with a struct of the same name but another id: reported, not guessed around.
  std::string other = ::testing::TempDir() + "/other_demo.capnp";
  std::ofstream(other) << "@0xc1d2e3f405060708;\nstruct StatsRequest { sensor @0 :Text; }\n"
                          "struct StatsReply { readings @0 :UInt64; }\n";
  EXPECT_EQ(busctl({"--peer=" + agg_, "--schema=" + other, "call", "demo.stats", "{}"}, &out,
                   /*schema=*/false),
            3);
  EXPECT_TRUE(has(out, "carries type 0x97f4fe7cd884377b, which no --schema file defines")) << out;
  // An unreadable schema file.
  EXPECT_EQ(busctl({"--peer=" + agg_, "--schema=/nonexistent.capnp", "peers"}, &out, false), 3);
  EXPECT_TRUE(has(out, "cannot read schema /nonexistent.capnp")) << out;
}

struct Keys {
  std::string public_key, secret_key;
};

/// A key pair from `busctl keygen` (config lines `curve_public = K`, `curve_secret = K`).
Keys keygen() {
  std::string out;
  EXPECT_EQ(integ::run_command({BUSCTL, "keygen"}, &out), 0) << out;
  Keys k;
  std::size_t at = 0;
  while (at < out.size()) {
    std::size_t end = out.find('\n', at);
    if (end == std::string::npos) end = out.size();
    std::string line = out.substr(at, end - at);
    at = end + 1;
    if (line.rfind("curve_public = ", 0) == 0) k.public_key = line.substr(15);
    if (line.rfind("curve_secret = ", 0) == 0) k.secret_key = line.substr(15);
  }
  EXPECT_EQ(k.public_key.size(), 40u) << out;
  EXPECT_EQ(k.secret_key.size(), 40u) << out;
  return k;
}

/// A busctl --config file: one peer (with its public key) and busctl's key pair.
std::string write_config(const std::string& file, const std::string& peer,
                         const std::string& peer_key, const Keys& mine) {
  std::string path = ::testing::TempDir() + "/" + file;
  std::ofstream(path) << "# busctl on a secured bus\npeer = " << peer << " " << peer_key
                      << "\ncurve_public = " << mine.public_key
                      << "\ncurve_secret = " << mine.secret_key << "\n";
  return path;
}

TEST(BusctlCurve, JoinsASecuredBusWithAnAllowedKeyAndIsTurnedAwayWithout) {
  auto has = [](const std::string& s, const std::string& part) {
    return s.find(part) != std::string::npos;
  };
  Keys node = keygen(), mine = keygen(), stranger = keygen();
  ASSERT_NE(mine.public_key, stranger.public_key);
  integ::NodeProcess server({"--name=server", "--publish-on=tcp://127.0.0.1:*",
                             "--requests-on=tcp://127.0.0.1:*", "--curve-public=" + node.public_key,
                             "--curve-secret=" + node.secret_key, "--allow=" + mine.public_key,
                             "--serve"});
  ASSERT_TRUE(server.ready());
  std::string good =
      write_config("busctl-allowed.conf", server.publish_address(), node.public_key, mine);
  std::string bad =
      write_config("busctl-stranger.conf", server.publish_address(), node.public_key, stranger);
  auto busctl = [&](std::vector<std::string> args, std::string* out) {
    std::vector<std::string> argv = {BUSCTL, "--schema=" + std::string(DEMO_SCHEMA)};
    argv.insert(argv.end(), args.begin(), args.end());
    out->clear();
    return integ::run_command(argv, out);
  };

  // Its key is allowed: it hears the node, and its call is answered over CURVE.
  std::string out;
  ASSERT_EQ(busctl({"--config=" + good, "--wait=20s", "call", "integ.stats", "{}"}, &out), 0)
      << out;
  EXPECT_TRUE(has(out, R"("sensor":"server")")) << out;
  ASSERT_EQ(busctl({"--config=" + good, "--wait=20s", "peers"}, &out), 0) << out;
  EXPECT_EQ(out.rfind("server  id=", 0), 0u) << out;
  EXPECT_TRUE(has(out, "serves  endpoint integ.stats")) << out;

  // A key the node does not allow: nothing gets through, and the error says what to check.
  EXPECT_EQ(busctl({"--config=" + bad, "--wait=1s", "peers"}, &out), 2) << out;
  EXPECT_TRUE(has(out, "does the node allow busctl's public key")) << out;
  EXPECT_TRUE(bus_test::eventually([&] { return server.report().num("auth_denied") > 0; }));

  // With keys, a --peer without one cannot be used.
  EXPECT_EQ(busctl({"--config=" + good, "--peer=tcp://127.0.0.1:1", "peers"}, &out), 1) << out;
  EXPECT_TRUE(has(out, "every peer needs its public key")) << out;
  // ...and neither can a config peer without one.
  std::string keyless = write_config("busctl-keyless.conf", server.publish_address(), "", mine);
  EXPECT_EQ(busctl({"--config=" + keyless, "peers"}, &out), 1) << out;
  EXPECT_TRUE(has(out, "has no public key")) << out;
  // A config file that is not there.
  EXPECT_EQ(busctl({"--config=/nonexistent.conf", "peers"}, &out), 1) << out;
  EXPECT_TRUE(has(out, "/nonexistent.conf")) << out;
  EXPECT_TRUE(server.quit());
}

}  // namespace

TEST(BusctlEtcd, FindsTheNodesRegisteredUnderAPrefixWithoutPeerFlags) {
  integ::Etcd etcd;
  ASSERT_TRUE(etcd.running());
  const std::string prefix = integ::fresh_prefix();
  auto node = [&](const char* name) {
    return std::make_unique<integ::NodeProcess>(
        std::vector<std::string>{std::string("--name=") + name, "--etcd=" + etcd.url(),
                                 "--etcd-prefix=" + prefix, "--serve"});
  };
  auto a = node("alpha"), b = node("beta");
  ASSERT_TRUE(a->ready() && b->ready());
  ASSERT_EQ(a->ask("wait-peers 1").num("n"), 1u);
  std::string out;
  ASSERT_EQ(
      integ::run_command(
          {BUSCTL, "--etcd=" + etcd.url(), "--prefix=" + prefix, "--wait=20s", "peers"}, &out),
      0)
      << out;
  EXPECT_NE(out.find("alpha  id="), std::string::npos) << out;
  EXPECT_NE(out.find("beta  id="), std::string::npos) << out;
  // busctl only watches: it registers nothing.
  EXPECT_EQ(etcd.keys(prefix).size(), 2u);
  ASSERT_EQ(integ::run_command({BUSCTL, "--etcd=" + etcd.url(), "--prefix=" + prefix, "--wait=20s",
                                "stats", "beta"},
                               &out),
            0)
      << out;
  EXPECT_NE(out.find("beta (id "), std::string::npos) << out;
  // Another prefix holds nobody: nothing reachable (exit 2).
  EXPECT_EQ(
      integ::run_command(
          {BUSCTL, "--etcd=" + etcd.url(), "--prefix=/nobody-here/", "--wait=1s", "peers"}, &out),
      2)
      << out;
  EXPECT_TRUE(a->quit());
  EXPECT_TRUE(b->quit());
}
