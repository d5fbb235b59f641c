// CURVE across processes: a node whose key is not allowed receives nothing and delivers
// nothing, while an allowed node on the same topic gets everything.
#include <gtest/gtest.h>

#include <bus/net/options.hpp>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

/// `--name`, tcp endpoints and the CURVE flags of a node with `keys` that admits `allow`.
std::vector<std::string> secure(const std::string& name, const bus::net::CurveKeys& keys,
                                const std::vector<std::string>& allow) {
  std::vector<std::string> f{"--name=" + name, "--publish-on=tcp://127.0.0.1:*",
                             "--requests-on=tcp://127.0.0.1:*", "--curve-public=" + keys.public_key,
                             "--curve-secret=" + keys.secret_key};
  for (const auto& k : allow) f.push_back("--allow=" + k);
  return f;
}

class Curve : public testing::Test {
 protected:
  bus::net::CurveKeys ka = bus::net::CurveKeys::generate();  // the publisher
  bus::net::CurveKeys kb = bus::net::CurveKeys::generate();  // the allowed subscriber
  bus::net::CurveKeys kx = bus::net::CurveKeys::generate();  // the intruder

  /// a and an intruder both export readings and admit b; b allows only a's key and lists the
  /// intruder's endpoint as a peer under `key_for_intruder`. b must hear a and nothing of the
  /// intruder.
  void ExpectBHearsOnlyA(const std::string& key_for_intruder) {
    NodeProcess a(cat(secure("a", ka, {kb.public_key}), {"--export-readings"}));
    NodeProcess x(cat(secure("intruder", kx, {kb.public_key}), {"--export-readings"}));
    ASSERT_TRUE(a.ready());
    ASSERT_TRUE(x.ready());
    NodeProcess b(
        cat(secure("b", kb, {ka.public_key}),
            {"--import-readings", a.as_peer(ka.public_key), x.as_peer(key_for_intruder)}));
    ASSERT_TRUE(b.ready());

    // Every chance to get a subscriber (a correct node never gives it one, so this bound only
    // matters to a broken one), then publish anyway.
    EXPECT_EQ(x.ask("wait-subscribers 1 5000").num("n"), 0u);
    ASSERT_EQ(x.ask("publish 100").num("refused"), 0u);
    ASSERT_EQ(a.ask("wait-subscribers 1").num("n"), 1u);
    ASSERT_EQ(a.ask("publish 100").num("refused"), 0u);
    ASSERT_TRUE(bus_test::eventually([&] { return b.report().num("sensor.a") >= 100; }, 60s));

    integ::Answer r = b.report();
    EXPECT_EQ(r.num("received"), 100u) << r.line;
    EXPECT_FALSE(r.has("sensor.intruder")) << r.line;
    EXPECT_FALSE(r.has("peer.intruder")) << r.line;
    EXPECT_TRUE(b.quit());
    EXPECT_TRUE(x.quit());
    EXPECT_TRUE(a.quit());
  }
};

}  // namespace

TEST_F(Curve, ANodeNotAllowedReceivesNothingWhileAnAllowedOneReceivesAll) {
  NodeProcess a(cat(secure("a", ka, {kb.public_key}), {"--export-readings"}));
  ASSERT_TRUE(a.ready());
  NodeProcess b(
      cat(secure("b", kb, {ka.public_key}), {"--import-readings", a.as_peer(ka.public_key)}));
  NodeProcess x(cat(secure("intruder", kx, {ka.public_key}),
                    {"--import-readings", a.as_peer(ka.public_key)}));
  ASSERT_TRUE(b.ready());
  ASSERT_TRUE(x.ready());

  ASSERT_EQ(a.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(a.ask("publish 100").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return b.report().num("received") >= 100; }, 60s));
  // The intruder knocked and was turned away.
  ASSERT_TRUE(bus_test::eventually([&] { return a.report().num("auth_denied") > 0; }, 60s));

  integ::Answer rb = b.report(), rx = x.report();
  EXPECT_EQ(rb.num("received"), 100u) << rb.line;
  EXPECT_EQ(rb.num("sensor.a"), 100u) << rb.line;
  EXPECT_EQ(rx.num("received"), 0u) << rx.line;
  EXPECT_EQ(rx.num("readings.received"), 0u) << rx.line;
  EXPECT_EQ(rx.num("peers"), 0u) << rx.line;  // not even a's heartbeats
  EXPECT_EQ(a.ask("wait-subscribers 1 0").num("n"), 1u);
  EXPECT_TRUE(b.quit());
  EXPECT_TRUE(x.quit());
  EXPECT_TRUE(a.quit());
}

TEST_F(Curve, ANodeWithoutThePeersSecretKeyCannotDeliverInItsName) {
  // b believes the intruder's endpoint is a's: it expects a's public key there. The intruder
  // admits b, but cannot prove a key it has not the secret of.
  ExpectBHearsOnlyA(/*key_for_intruder=*/ka.public_key);
}

TEST_F(Curve, ANodeNotInTheAllowlistDeliversNothingEvenWhenListedAsAPeer) {
  // b listens to the intruder under its real key (a stale peer list, a revoked node) but does
  // not allow that key: "only nodes whose public key is in `allow`" may talk to b. The intruder
  // admits everyone.
  ExpectBHearsOnlyA(/*key_for_intruder=*/kx.public_key);
}
