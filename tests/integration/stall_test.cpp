// A peer that stalls, in real processes on loopback TCP: one subscriber stopped with SIGSTOP
// while its publisher goes on at a high rate, a subscriber ten times slower than its publisher,
// a publisher stopped until it is declared dead and then continued. What is checked is what
// the bus promises: the others keep their pace, nobody is declared dead for being merely behind,
// a stopped node is, and every receiver accounts for every message published (received + counted
// missed == published), on its side and, through its heartbeats, on the publisher's.
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

// Heartbeats every 50 ms, dead after 20 silent ones: a second. Generous for a sanitized node on
// a loaded machine (it is not declared dead for running slowly: see the bridge's liveness), and
// short enough for the old faults to show (heartbeats held behind a stalled subscriber for its
// whole stall, a slow reader's queue several seconds long).
const std::vector<std::string> kLiveness = {"--heartbeat-ms=50", "--dead-after=20",
                                            "--stall-limit-ms=100"};

std::vector<std::string> node(const std::string& name, std::vector<std::string> flags) {
  flags.insert(flags.begin(), "--name=" + name);
  flags.push_back("--publish-on=tcp://127.0.0.1:*");
  flags.push_back("--requests-on=tcp://127.0.0.1:*");
  return cat(flags, kLiveness);
}

/// node(), dead after 5 silent heartbeats (a quarter of a second): a reader 10x slower than its
/// publisher reads a heartbeat of it only every 10 heartbeat periods of the publisher's.
std::vector<std::string> quick_death(const std::string& name, std::vector<std::string> flags) {
  flags = node(name, std::move(flags));
  flags.push_back("--dead-after=5");  // the last one counts
  return flags;
}

/// What a receiver accounts for: readings handed to its subscriber, plus gaps it counted.
uint64_t accounted(const integ::Answer& r) {
  return r.num("readings.received") + r.num("readings.gaps");
}

/// Waits until `sub` accounts for `published` readings and its subscriber has run for every one
/// its node accepted (a slow one works through its ring after the node took them).
bool accounts_for(NodeProcess& sub, uint64_t published, integ::Answer& last) {
  return bus_test::eventually(
      [&] {
        last = sub.report();
        return accounted(last) >= published &&
               last.num("received") >= last.num("readings.received");
      },
      120s);
}

/// The identity, and that the subscriber handed on what its node accepted.
void expect_every_message_accounted(const integ::Answer& r, uint64_t published) {
  EXPECT_EQ(accounted(r), published) << r.line;
  EXPECT_EQ(r.num("received"), r.num("readings.received")) << r.line;
  EXPECT_EQ(r.num("readings.rejected"), 0u) << r.line;
}

/// Waits until the publisher shows, per receiver, what that receiver says it missed.
bool publisher_sees_what_was_missed(NodeProcess& pub, const std::string& sub_name, uint64_t gaps) {
  return bus_test::eventually([&] { return pub.report().num("missed_by." + sub_name) == gaps; },
                              60s);
}

}  // namespace

TEST(Stall, AStoppedSubscriberCostsOnlyItselfAndItsLossIsCountedExactly) {
  // The demo's shape at a high rate: a producer, a healthy monitor and an aggregator that is
  // stopped while the producer publishes 40 MB. The producer listens to both (their heartbeats
  // report what they missed).
  NodeProcess producer(node("producer", {"--export-readings", "--reading-bytes=1024"}));
  ASSERT_TRUE(producer.ready());
  NodeProcess monitor(node("monitor", {"--import-readings", producer.as_peer()}));
  NodeProcess aggregator(node("aggregator", {"--import-readings", producer.as_peer()}));
  ASSERT_TRUE(monitor.ready());
  ASSERT_TRUE(aggregator.ready());
  ASSERT_EQ(producer.ask("peer " + monitor.publish_address()).word, "peered");
  ASSERT_EQ(producer.ask("peer " + aggregator.publish_address()).word, "peered");
  ASSERT_EQ(producer.ask("wait-subscribers 2").num("n"), 2u);

  constexpr uint64_t kBefore = 2'000, kDuring = 40'000, kRate = 20'000;
  ASSERT_EQ(producer.ask("publish-at " + std::to_string(kBefore) + " 20000").num("refused"), 0u);
  ASSERT_EQ(monitor.ask("wait-received " + std::to_string(kBefore)).num("n"), kBefore);
  ASSERT_EQ(aggregator.ask("wait-received " + std::to_string(kBefore)).num("n"), kBefore);

  ASSERT_TRUE(aggregator.signal(SIGSTOP));
  // Published while the aggregator is stopped: the producer does not wait for it (beyond
  // send_stall_limit once), so this ends, and at its pace.
  integ::Answer sent =
      producer.ask("publish-at " + std::to_string(kDuring) + " " + std::to_string(kRate), 120s);
  ASSERT_EQ(sent.word, "published") << sent.line;
  EXPECT_EQ(sent.num("refused"), 0u) << sent.line;
  const uint64_t published = kBefore + kDuring;

  // Still while it is stopped: the monitor got the stall's readings (received or, had it fallen
  // behind, counted), the producer stayed live for it, and the stopped aggregator was declared
  // dead by the producer.
  integ::Answer mon;
  ASSERT_TRUE(accounts_for(monitor, published, mon)) << mon.line;
  expect_every_message_accounted(mon, published);
  EXPECT_GT(mon.num("readings.received"), kBefore + kDuring / 2) << mon.line;
  EXPECT_EQ(mon.num("peers_lost"), 0u) << mon.line;
  EXPECT_TRUE(mon.has("peer.producer")) << mon.line;
  integ::Answer prod;
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        prod = producer.report();
        return !prod.has("peer.aggregator");
      },
      60s))
      << prod.line;
  EXPECT_GE(prod.num("peers_lost"), 1u) << prod.line;
  EXPECT_GE(prod.num("publish_cuts"), 1u) << prod.line;
  EXPECT_EQ(prod.num("published"), published) << prod.line;

  ASSERT_TRUE(aggregator.signal(SIGCONT));
  integ::Answer agg;
  ASSERT_TRUE(accounts_for(aggregator, published, agg)) << agg.line;
  expect_every_message_accounted(agg, published);
  EXPECT_GT(agg.num("readings.gaps"), 0u) << "40 MB fit in its buffers? " << agg.line;
  // Behind on its input after the stop, it did not declare the producer dead.
  EXPECT_EQ(agg.num("peers_lost"), 0u) << agg.line;

  // Both sides see what each receiver missed; the aggregator came back as the same node.
  EXPECT_TRUE(publisher_sees_what_was_missed(producer, "aggregator", agg.num("readings.gaps")))
      << producer.report().line;
  EXPECT_TRUE(publisher_sees_what_was_missed(producer, "monitor", mon.num("readings.gaps")))
      << producer.report().line;
  EXPECT_GE(producer.report().num("peers_returned"), 1u);
  EXPECT_TRUE(monitor.quit());
  EXPECT_TRUE(aggregator.quit());
  EXPECT_TRUE(producer.quit());
}

TEST(Stall, ASlowReaderKeepsItsPublisherAliveAndCountsWhatItMisses) {
  // The reader takes 2 ms per 8 KiB reading (500/s); its publisher sends 5,000/s for a second.
  // What waits for the reader (its ring, ZeroMQ's queues, the socket buffers) takes it seconds
  // to work through: its publisher's heartbeats wait behind that, yet it is not declared dead,
  // and the reader accounts for every reading once it is through. Once, it stops for 1.5 s (six
  // times dead_after): its node's bridge thread, waiting for room in the full ring, reads
  // nothing meanwhile, and must not take that for its publisher's silence. (A small ring keeps
  // the test short: the socket buffers are the longest wait.)
  NodeProcess pub(quick_death("pub", {"--export-readings", "--reading-bytes=8192"}));
  ASSERT_TRUE(pub.ready());
  NodeProcess reader(
      quick_death("reader", {"--import-readings", "--slow-us=2000", "--ring-bytes=4096",
                             "--pause-at=300", "--pause-ms=1500", pub.as_peer()}));
  ASSERT_TRUE(reader.ready());
  ASSERT_EQ(pub.ask("peer " + reader.publish_address()).word, "peered");
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);

  constexpr uint64_t kPublished = 5'000;
  integ::Answer sent = pub.ask("publish-at " + std::to_string(kPublished) + " 5000", 120s);
  ASSERT_EQ(sent.num("refused"), 0u) << sent.line;

  integ::Answer r;
  ASSERT_TRUE(accounts_for(reader, kPublished, r)) << r.line;
  expect_every_message_accounted(r, kPublished);
  EXPECT_GT(r.num("readings.gaps"), 0u) << "a reader 10x slower lost nothing? " << r.line;
  EXPECT_EQ(r.num("peers_lost"), 0u) << r.line;
  EXPECT_TRUE(r.has("peer.pub")) << r.line;
  EXPECT_TRUE(publisher_sees_what_was_missed(pub, "reader", r.num("readings.gaps")))
      << pub.report().line;
  EXPECT_TRUE(reader.quit());
  EXPECT_TRUE(pub.quit());
}

TEST(Stall, AStoppedPublisherIsDeclaredDeadAndWhatWasLostBeforeIsCountedWhenItReturns) {
  // The subscriber is stopped until its publisher has sent past it (readings lost), then the
  // publisher is stopped and the subscriber continued: it works through what it had, hears
  // nothing more, and declares the publisher dead. The publisher is continued: the same node
  // (same id) speaks again, and the readings lost before its death are counted, though the
  // first frame after its return is the first since the loss.
  NodeProcess pub(node("pub", {"--export-readings", "--reading-bytes=8192"}));
  ASSERT_TRUE(pub.ready());
  NodeProcess sub(node("sub", {"--import-readings", pub.as_peer()}));
  ASSERT_TRUE(sub.ready());
  ASSERT_EQ(pub.ask("peer " + sub.publish_address()).word, "peered");
  ASSERT_EQ(pub.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(pub.ask("publish 100").num("refused"), 0u);
  ASSERT_EQ(sub.ask("wait-received 100").num("n"), 100u);

  ASSERT_TRUE(sub.signal(SIGSTOP));
  // 16 MB a round, until the publisher has sent past the stopped subscriber.
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        pub.ask("publish 2000");
        return pub.report().num("publish_cuts") > 0;
      },
      120s))
      << pub.report().line;
  integ::Answer sent = pub.ask("publish 100");
  const uint64_t before_death = sent.num("total");

  ASSERT_TRUE(pub.signal(SIGSTOP));
  ASSERT_TRUE(sub.signal(SIGCONT));
  integ::Answer s;
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        s = sub.report();
        return !s.has("peer.pub") && s.num("peers_lost") >= 1;
      },
      60s))
      << s.line;

  ASSERT_TRUE(pub.signal(SIGCONT));
  ASSERT_TRUE(bus_test::eventually(
      [&] {
        s = sub.report();
        return s.has("peer.pub");
      },
      60s))
      << s.line;
  EXPECT_EQ(s.num("peers_returned"), 1u) << s.line;
  const uint64_t published = pub.ask("publish 100").num("total");
  ASSERT_EQ(published, before_death + 100);

  ASSERT_TRUE(accounts_for(sub, published, s)) << s.line;
  expect_every_message_accounted(s, published);
  EXPECT_GT(s.num("readings.gaps"), 0u) << s.line;
  EXPECT_TRUE(publisher_sees_what_was_missed(pub, "sub", s.num("readings.gaps")))
      << pub.report().line;
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(pub.quit());
}
