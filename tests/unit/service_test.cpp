// A Service runs its handlers one at a time on its own executor; pool() and sharded() spread
// instances over the queues and endpoints they consume.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::eventually;

struct Item {
  uint64_t key;
  int seq;
};

inline const bus::Topic<int> flood_ticks{"service_test.flood.ticks"};
inline const bus::Queue<int> flood_jobs{"service_test.flood.jobs"};
inline const bus::Endpoint<int, int> flood_asks{"service_test.flood.asks"};
inline const bus::Topic<int> placed_ticks{"service_test.placed.ticks"};
inline const bus::Queue<int> placed_jobs{"service_test.placed.jobs"};
inline const bus::Endpoint<int, int> placed_asks{"service_test.placed.asks"};
inline const bus::Queue<int> pool_jobs{"service_test.pool.jobs"};
inline const bus::Queue<int> pool_jobs_many{"service_test.pool.jobs_many"};
inline const bus::Endpoint<int, int> pool_asks{"service_test.pool.asks"};
inline const bus::Queue<Item> sharded_items{"service_test.sharded.items",
                                            +[](const Item& m) -> uint64_t { return m.key; }};
inline const bus::Endpoint<Item, int> sharded_asks{
    "service_test.sharded.asks", +[](const Item& m) -> uint64_t { return m.key; }};
inline const bus::Queue<Item> unkeyed_items{"service_test.unkeyed.items"};
inline const bus::Endpoint<Item, int> unkeyed_asks{"service_test.unkeyed.asks"};
inline const bus::Endpoint<int, int> doubler{"service_test.doubler"};
inline const bus::Endpoint<int, int> nobody{"service_test.nobody"};
inline const bus::Topic<int> subscribed_late{"service_test.subscribed_late"};

// ---- one at a time ------------------------------------------------------------------------------

/// State that counts without a lock: its totals are exact only if handlers never overlap.
struct Exclusive {
  int ticks = 0;
  int jobs = 0;
  int asks = 0;
  long tick_sum = 0;
  std::atomic<bool> inside{false};
  std::atomic<int> overlaps{0};

  void enter() {
    if (inside.exchange(true)) overlaps.fetch_add(1);
  }
  void leave() { inside.store(false); }
  /// A read-modify-write with a window wide enough for an overlap to lose an update.
  static void bump(int& n) {
    int seen = n;
    // Compiler-only fences: the read and the write stay apart, with a few steps between them.
    for (int i = 0; i < 16; ++i) std::atomic_signal_fence(std::memory_order_seq_cst);
    n = seen + 1;
  }
};

TEST(Service, HandlersNeverRunConcurrently) {
  bus::Bus bus(bus::Options().executors(3));
  auto svc = bus.service<Exclusive>();
  svc.subscribe(flood_ticks,
                [](Exclusive& s, const int& v) {
                  s.enter();
                  Exclusive::bump(s.ticks);
                  s.tick_sum += v;
                  s.leave();
                })
      .consume(flood_jobs,
               [](Exclusive& s, int) {
                 s.enter();
                 Exclusive::bump(s.jobs);
                 s.leave();
               })
      .serve(flood_asks, [](Exclusive& s, int) {
        s.enter();
        Exclusive::bump(s.asks);
        int n = s.asks;
        s.leave();
        return n;
      });

  constexpr int kThreads = 3;
  constexpr int kPerThread = 20000;
  constexpr int kAskEvery = 50;
  std::atomic<int> refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        if (!bus.publish(flood_ticks, i).ok()) refused.fetch_add(1);
        if (!bus.send(flood_jobs, i).ok()) refused.fetch_add(1);
        if (i % kAskEvery == 0 && !bus.call(flood_asks, i, 30s).ok()) refused.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(bus.stop().ok());

  const Exclusive& s = svc.state();
  EXPECT_EQ(refused.load(), 0);
  EXPECT_EQ(s.overlaps.load(), 0);
  EXPECT_EQ(s.ticks, kThreads * kPerThread);
  EXPECT_EQ(s.jobs, kThreads * kPerThread);
  EXPECT_EQ(s.asks, kThreads * kPerThread / kAskEvery);
  EXPECT_EQ(s.tick_sum, long{kThreads} * kPerThread * (kPerThread - 1) / 2);
}

// ---- on its executor ----------------------------------------------------------------------------

struct Placed {
  int ran = 0;
  int elsewhere = 0;  // handler invocations that ran off the service's executor
};

TEST(Service, AllHandlersRunOnTheServiceExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto svc = bus.service<Placed>(bus::on_executor(2));
  ASSERT_EQ(svc.executor(), 2u);
  auto check = [&bus, e = svc.executor()](Placed& s) {
    ++s.ran;
    if (bus.current_executor() != e) ++s.elsewhere;
  };
  svc.subscribe(placed_ticks, [check](Placed& s, const int&) { check(s); })
      .consume(placed_jobs, [check](Placed& s, int) { check(s); })
      .serve(placed_asks, [check](Placed& s, int v) {
        check(s);
        return v;
      });

  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(bus.publish(placed_ticks, i).ok());
    ASSERT_TRUE(bus.send(placed_jobs, i).ok());
    ASSERT_TRUE(svc.post([check](Placed& s) { check(s); }).ok());
  }
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(bus.call(placed_asks, i, 30s).ok());
  ASSERT_TRUE(bus.stop().ok());

  EXPECT_EQ(svc.state().ran, 310);
  EXPECT_EQ(svc.state().elsewhere, 0);
}

TEST(Service, ServicesWithoutPlacementSpreadOverTheExecutors) {
  bus::Bus bus(bus::Options().executors(3));
  std::set<unsigned> used;
  for (int i = 0; i < 3; ++i) {
    auto svc = bus.service<Placed>();
    ASSERT_LT(svc.executor(), bus.executors());
    used.insert(svc.executor());
  }
  EXPECT_EQ(used.size(), 3u);
}

TEST(Service, PlacementOnAMissingExecutorThrows) {
  bus::Bus bus(bus::Options().executors(2));
  EXPECT_THROW((void)bus.service<Placed>(bus::on_executor(2)), std::out_of_range);
}

// ---- post and request ---------------------------------------------------------------------------

struct Asker {
  std::atomic<int> callbacks{0};
  std::optional<unsigned> ran_on;
  absl::StatusCode code = absl::StatusCode::kUnknown;
  int reply = 0;
  const Asker* self = nullptr;  // the state the callback was handed
};

TEST(Service, PostRunsOnTheServiceExecutorWithItsState) {
  bus::Bus bus(bus::Options().executors(3));
  auto svc = bus.service<Placed>(bus::on_executor(1));
  auto check = [&bus, e = svc.executor()](Placed& s) {
    ++s.ran;
    if (bus.current_executor() != e) ++s.elsewhere;
  };
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(svc.post(check).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(svc.state().ran, 1000);
  EXPECT_EQ(svc.state().elsewhere, 0);
}

TEST(Service, RequestCallbackRunsOnTheServiceExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto server = bus.serve(
      doubler, [](int v) { return 2 * v; }, bus::on_executor(0));
  auto svc = bus.service<Asker>(bus::on_executor(2));
  // From a plain thread (the request is posted to the service's executor) ...
  svc.request(doubler, 21, 30s, [&bus](Asker& s, absl::StatusOr<int> r) {
    s.ran_on = bus.current_executor();
    s.code = r.status().code();
    if (r.ok()) s.reply = *r;
    s.self = &s;
    s.callbacks.fetch_add(1);
  });
  ASSERT_TRUE(eventually([&] { return svc.state().callbacks.load() == 1; }));
  ASSERT_TRUE(bus.stop().ok());
  const Asker& s = svc.state();
  EXPECT_EQ(s.code, absl::StatusCode::kOk);
  EXPECT_EQ(s.reply, 42);
  EXPECT_EQ(s.ran_on, std::optional<unsigned>(2));
  EXPECT_EQ(s.self, &s);
  EXPECT_EQ(s.callbacks.load(), 1);
}

TEST(Service, RequestFromItsOwnHandlerCallsBackOnTheServiceExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto server = bus.serve(
      doubler, [](int v) { return 2 * v; }, bus::on_executor(0));
  auto svc = bus.service<Asker>(bus::on_executor(1));
  // ... and from the service's own executor (the request is made in place).
  ASSERT_TRUE(svc.post([&bus, svc](Asker&) mutable {
                   svc.request(doubler, 5, 30s, [&bus](Asker& s, absl::StatusOr<int> r) {
                     s.ran_on = bus.current_executor();
                     s.code = r.status().code();
                     if (r.ok()) s.reply = *r;
                     s.callbacks.fetch_add(1);
                   });
                 })
                  .ok());
  ASSERT_TRUE(eventually([&] { return svc.state().callbacks.load() == 1; }));
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(svc.state().code, absl::StatusCode::kOk);
  EXPECT_EQ(svc.state().reply, 10);
  EXPECT_EQ(svc.state().ran_on, std::optional<unsigned>(1));
  EXPECT_EQ(svc.state().callbacks.load(), 1);
}

TEST(Service, RequestWithoutAHandlerFailsOnTheServiceExecutor) {
  bus::Bus bus(bus::Options().executors(2));
  auto svc = bus.service<Asker>(bus::on_executor(1));
  svc.request(nobody, 1, 30s, [&bus](Asker& s, absl::StatusOr<int> r) {
    s.ran_on = bus.current_executor();
    s.code = r.status().code();
    s.callbacks.fetch_add(1);
  });
  ASSERT_TRUE(eventually([&] { return svc.state().callbacks.load() == 1; }));
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(svc.state().code, absl::StatusCode::kUnavailable);
  EXPECT_EQ(svc.state().ran_on, std::optional<unsigned>(1));
  EXPECT_EQ(svc.state().callbacks.load(), 1);
}

struct Seen {
  std::vector<int> got;
};

TEST(Service, SubscriptionMadeInItsOwnHandlerGetsMessagesPublishedAfterIt) {
  bus::Bus bus(bus::Options().executors(2));
  auto svc = bus.service<Seen>(bus::on_executor(0));
  std::atomic<int> step{0};
  std::thread publisher([&] {
    ASSERT_TRUE(bus.post(bus::on_executor(0), [] {}).ok());  // this thread's ring to executor 0
    step.store(1);
    step.notify_all();
    while (step.load() != 2) step.wait(1);
    EXPECT_TRUE(bus.publish(subscribed_late, 7).ok());  // after subscribe() below returned
    step.store(3);
    step.notify_all();
  });
  while (step.load() != 1) step.wait(0);
  ASSERT_TRUE(svc.post([svc, &step](Seen&) mutable {
                   svc.subscribe(subscribed_late,
                                 [](Seen& s, const int& v) { s.got.push_back(v); });
                   step.store(2);
                   step.notify_all();
                   while (step.load() != 3) step.wait(2);
                 })
                  .ok());
  publisher.join();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(svc.state().got, std::vector<int>{7});
  bus::Stats stats = bus.stats();
  const bus::ChannelStats* c = stats.channel("service_test.subscribed_late");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->published, 1u);
  EXPECT_EQ(c->delivered + c->dropped + c->failed + c->unrouted, 1u);  // lost, it would say so
}

// ---- pool ---------------------------------------------------------------------------------------

struct Worker {
  int got = 0;
  int elsewhere = 0;
};

TEST(ServicePool, InstancesTakeTurnsOnAQueue) {
  bus::Bus bus(bus::Options().executors(2));
  auto pool = bus.pool<Worker>(3);
  ASSERT_EQ(pool.size(), 3u);
  pool.consume(pool_jobs, [](Worker& w, int) { ++w.got; });
  constexpr int kSent = 3000;
  for (int i = 0; i < kSent; ++i) ASSERT_TRUE(bus.send(pool_jobs, i).ok());
  ASSERT_TRUE(bus.stop().ok());
  // One sender taking turns over three instances: each gets exactly a third.
  for (auto& m : pool) EXPECT_EQ(m.state().got, kSent / 3);
}

TEST(ServicePool, EveryInstanceGetsAShareFromManySenders) {
  bus::Bus bus(bus::Options().executors(3));
  auto pool = bus.pool<Worker>(4);
  pool.consume(pool_jobs_many, [](Worker& w, int) { ++w.got; });
  constexpr int kThreads = 3;
  constexpr int kPerThread = 5000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) EXPECT_TRUE(bus.send(pool_jobs_many, i).ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(bus.stop().ok());
  int total = 0;
  for (auto& m : pool) {
    EXPECT_GT(m.state().got, 0);
    total += m.state().got;
  }
  EXPECT_EQ(total, kThreads * kPerThread);
}

TEST(ServicePool, InstancesTakeTurnsOnAnEndpointEachOnItsExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto pool = bus.pool<Worker>(3);
  std::set<unsigned> executors;
  for (auto& m : pool) executors.insert(m.executor());
  EXPECT_EQ(executors.size(), 3u);  // as many distinct executors as there are

  pool.serve(pool_asks, [&bus](Worker& w, int) {
    ++w.got;
    return static_cast<int>(*bus.current_executor());
  });
  std::map<int, int> answered_by;
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<int> r = bus.call(pool_asks, i, 30s);
    ASSERT_TRUE(r.ok()) << r.status();
    ++answered_by[*r];
  }
  ASSERT_TRUE(bus.stop().ok());
  for (auto& m : pool) EXPECT_EQ(m.state().got, 100);
  ASSERT_EQ(answered_by.size(), 3u);
  for (auto& [executor, n] : answered_by) EXPECT_EQ(n, 100) << "executor " << executor;
}

// ---- sharded ------------------------------------------------------------------------------------

struct Shard {
  std::map<uint64_t, int> count;     // messages per key
  std::map<uint64_t, int> last_seq;  // per key, to check order
  int out_of_order = 0;
  void take(const Item& m) {
    auto it = last_seq.find(m.key);
    if (it != last_seq.end() && m.seq != it->second + 1) ++out_of_order;
    last_seq[m.key] = m.seq;
    ++count[m.key];
  }
};

TEST(ServiceSharded, EveryMessageWithOneKeyGoesToOneInstance) {
  bus::Bus bus(bus::Options().executors(3));
  auto shards = bus.sharded<Shard>(3);
  shards.consume(sharded_items, [](Shard& s, Item m) { s.take(m); });
  constexpr uint64_t kKeys = 64;
  constexpr int kPerKey = 100;
  for (int seq = 0; seq < kPerKey; ++seq) {
    for (uint64_t k = 0; k < kKeys; ++k) ASSERT_TRUE(bus.send(sharded_items, Item{k, seq}).ok());
  }
  ASSERT_TRUE(bus.stop().ok());

  std::map<uint64_t, int> owners;  // key -> instances that saw it
  int used = 0;
  int total = 0;
  for (auto& m : shards) {
    const Shard& s = m.state();
    EXPECT_EQ(s.out_of_order, 0);
    if (!s.count.empty()) ++used;
    for (auto& [key, n] : s.count) {
      ++owners[key];
      EXPECT_EQ(n, kPerKey) << "key " << key << " was split between instances";
      total += n;
    }
  }
  EXPECT_EQ(owners.size(), kKeys);
  for (auto& [key, n] : owners) EXPECT_EQ(n, 1) << "key " << key;
  EXPECT_EQ(total, static_cast<int>(kKeys) * kPerKey);
  EXPECT_GE(used, 2);  // 64 keys over 3 shards: all on one would mean no sharding at all
}

TEST(ServiceSharded, RequestsWithOneKeyGoToOneInstance) {
  bus::Bus bus(bus::Options().executors(2));
  auto shards = bus.sharded<Shard>(2);
  shards.serve(sharded_asks, [&bus](Shard& s, Item m) {
    s.take(m);
    return static_cast<int>(*bus.current_executor());
  });
  std::map<uint64_t, std::set<int>> served_by;
  for (int seq = 0; seq < 20; ++seq) {
    for (uint64_t k = 0; k < 16; ++k) {
      absl::StatusOr<int> r = bus.call(sharded_asks, Item{k, seq}, 30s);
      ASSERT_TRUE(r.ok()) << r.status();
      served_by[k].insert(*r);
    }
  }
  ASSERT_TRUE(bus.stop().ok());
  for (auto& [key, executors] : served_by) EXPECT_EQ(executors.size(), 1u) << "key " << key;
}

TEST(ServiceSharded, UnkeyedChannelIsRefused) {
  bus::Bus bus(bus::Options().executors(2));
  auto shards = bus.sharded<Shard>(2);
  EXPECT_THROW(shards.consume(unkeyed_items, [](Shard& s, Item m) { s.take(m); }),
               std::invalid_argument);
  EXPECT_THROW(shards.serve(unkeyed_asks, [](Shard&, Item) { return 0; }), std::invalid_argument);
  // Refused as a whole: no instance was registered, so nothing consumes the queue.
  EXPECT_EQ(bus.send(unkeyed_items, Item{1, 0}).code(), absl::StatusCode::kUnavailable);
  // A pool takes the same queue.
  auto pool = bus.pool<Shard>(2);
  pool.consume(unkeyed_items, [](Shard& s, Item m) { s.take(m); });
  EXPECT_TRUE(bus.send(unkeyed_items, Item{1, 0}).ok());
}

}  // namespace
