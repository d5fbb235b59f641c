// Millions of messages through producers, executors, services and plain subscribers: each
// arrives exactly once and in per-producer order.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <thread>
#include <vector>

#ifndef BUS_STRESS_SCALE
#define BUS_STRESS_SCALE 1
#endif

namespace {

struct Msg {
  uint32_t producer;
  uint32_t seq;
};
inline const bus::Topic<Msg> fanout{"stress.fanout"};
inline const bus::Queue<Msg> work{"stress.work"};
inline const bus::Queue<Msg> keyed{"stress.keyed",
                                   +[](const Msg& m) -> uint64_t { return m.producer; }};
inline const bus::Topic<Msg> forwarded{"stress.forwarded"};

constexpr uint32_t kProducers = 4;
constexpr uint32_t kPerProducer = 1'500'000 / BUS_STRESS_SCALE;

/// Checks per-producer order and counts; touched by one executor only (a subscriber or service).
struct Checker {
  std::vector<int64_t> last = std::vector<int64_t>(kProducers, -1);
  uint64_t count = 0;
  uint64_t out_of_order = 0;
  void see(const Msg& m) {
    if (static_cast<int64_t>(m.seq) != last[m.producer] + 1) ++out_of_order;
    last[m.producer] = m.seq;
    ++count;
  }
};

/// A sharded service: each instance owns the producers that hash to it, so order holds there.
struct Shard {
  Checker checker;
  void on(Msg&& m) { checker.see(m); }
};

/// A service that checks what it gets and forwards it (executor -> executor traffic).
struct Forwarder {
  bus::Bus* bus;
  Checker checker;
  uint64_t refused = 0;
  void on(const Msg& m) {
    checker.see(m);
    if (!bus->publish(forwarded, m).ok()) ++refused;
  }
};

TEST(Stress, EveryMessageArrivesExactlyOnceAndInProducerOrder) {
  bus::Bus bus(bus::Options().executors(3).ring_bytes(16 * 1024));
  Checker plain_a, plain_b, after_forward;
  auto sa = bus.subscribe(
      fanout, [&](const Msg& m) { plain_a.see(m); }, bus::on_executor(0));
  auto sb = bus.subscribe(
      fanout, [&](const Msg& m) { plain_b.see(m); }, bus::on_executor(2));
  auto sf = bus.subscribe(
      forwarded, [&](const Msg& m) { after_forward.see(m); }, bus::on_executor(0));
  auto fwd = bus.service<Forwarder>(bus::on_executor(1), Forwarder{&bus, {}, 0});
  fwd.subscribe(fanout, &Forwarder::on);
  auto shards = bus.sharded<Shard>(3);
  shards.consume(keyed, &Shard::on);
  std::vector<std::atomic<uint64_t>> pooled(kProducers);
  std::vector<bus::Subscription> pool;
  for (unsigned e = 0; e < 3; ++e) {
    pool.push_back(bus.consume(
        work, [&](Msg&& m) { pooled[m.producer]++; }, bus::on_executor(e)));
  }

  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint32_t i = 0; i < kPerProducer; ++i) {
        ASSERT_TRUE(bus.publish(fanout, Msg{p, i}).ok());
        if (i % 4 == 0) {
          ASSERT_TRUE(bus.send(work, Msg{p, i / 4}).ok());
          ASSERT_TRUE(bus.send(keyed, Msg{p, i / 4}).ok());
        }
      }
    });
  }
  for (auto& t : producers) t.join();
  ASSERT_TRUE(bus.stop().ok());

  const uint64_t total = uint64_t{kProducers} * kPerProducer;
  for (Checker* c : {&plain_a, &plain_b, &fwd.state().checker, &after_forward}) {
    EXPECT_EQ(c->count, total);
    EXPECT_EQ(c->out_of_order, 0u);
    for (uint32_t p = 0; p < kProducers; ++p)
      EXPECT_EQ(c->last[p], static_cast<int64_t>(kPerProducer) - 1);
  }
  EXPECT_EQ(fwd.state().refused, 0u);
  uint64_t sharded_total = 0;
  for (auto& s : shards) {
    sharded_total += s.state().checker.count;
    EXPECT_EQ(s.state().checker.out_of_order, 0u);
  }
  const uint64_t per_queue = uint64_t{kProducers} * ((kPerProducer + 3) / 4);
  EXPECT_EQ(sharded_total, per_queue);
  uint64_t pooled_total = 0;
  for (auto& c : pooled) {
    EXPECT_EQ(c.load(), (kPerProducer + 3) / 4);
    pooled_total += c.load();
  }
  EXPECT_EQ(pooled_total, per_queue);
  const bus::Stats st = bus.stats();
  EXPECT_EQ(st.channel("stress.fanout")->published, total);
  EXPECT_EQ(st.channel("stress.fanout")->delivered, 3 * total);
  EXPECT_EQ(st.channel("stress.fanout")->dropped + st.channel("stress.fanout")->failed, 0u);
  EXPECT_EQ(st.held_records, 0u);
}

}  // namespace
