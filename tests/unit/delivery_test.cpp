// Topics fan out, queues deliver each message once, order holds per producer.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Seq {
  int producer;
  int n;
};
inline const bus::Topic<Seq> seqs{"delivery_test.seqs"};
inline const bus::Queue<Seq> jobs{"delivery_test.jobs"};
inline const bus::Topic<std::string> words{"delivery_test.words"};
struct Big {
  char bytes[4096];
  int n;
};
inline const bus::Topic<Big> bigs{"delivery_test.bigs"};

TEST(Delivery, EverySubscriberGetsEveryMessage) {
  bus::Bus bus(bus::Options().executors(3));
  constexpr int kN = 10000;
  std::atomic<long> sums[4] = {};
  std::vector<bus::Subscription> subs;
  for (int i = 0; i < 4; ++i) {
    subs.push_back(bus.subscribe(seqs, [&sums, i](const Seq& s) { sums[i] += s.n; }));
  }
  for (int n = 1; n <= kN; ++n) ASSERT_TRUE(bus.publish(seqs, Seq{0, n}).ok());
  ASSERT_TRUE(bus.stop().ok());
  for (auto& s : sums) EXPECT_EQ(s.load(), long{kN} * (kN + 1) / 2);
}

TEST(Delivery, SubscribersOnOneExecutorShareOneCopyAndKeepOrder) {
  bus::Bus bus(bus::Options().executors(2));
  std::vector<int> a, b;
  auto s1 = bus.subscribe(
      seqs, [&](const Seq& s) { a.push_back(s.n); }, bus::on_executor(1));
  auto s2 = bus.subscribe(
      seqs, [&](const Seq& s) { b.push_back(s.n); }, bus::on_executor(1));
  for (int n = 0; n < 5000; ++n) ASSERT_TRUE(bus.publish(seqs, Seq{0, n}).ok());
  ASSERT_TRUE(bus.stop().ok());
  ASSERT_EQ(a.size(), 5000u);
  EXPECT_EQ(a, b);
  for (int n = 0; n < 5000; ++n) ASSERT_EQ(a[n], n);
}

TEST(Delivery, QueueDeliversEachMessageToExactlyOneConsumer) {
  bus::Bus bus(bus::Options().executors(3));
  constexpr int kN = 30000;
  std::mutex mu;
  std::multiset<int> seen;
  std::atomic<int> per[3] = {};
  std::vector<bus::Subscription> subs;
  for (int i = 0; i < 3; ++i) {
    subs.push_back(bus.consume(jobs, [&, i](Seq&& s) {
      per[i]++;
      std::lock_guard lock(mu);
      seen.insert(s.n);
    }));
  }
  for (int n = 0; n < kN; ++n) ASSERT_TRUE(bus.send(jobs, Seq{0, n}).ok());
  ASSERT_TRUE(bus.stop().ok());
  ASSERT_EQ(seen.size(), static_cast<std::size_t>(kN));
  for (int n = 0; n < kN; ++n) ASSERT_EQ(seen.count(n), 1u) << n;
  for (auto& p : per) EXPECT_EQ(p.load(), kN / 3) << "round-robin from one producer is even";
}

TEST(Delivery, FifoPerProducerAcrossThreads) {
  bus::Bus bus(bus::Options().executors(2));
  constexpr int kProducers = 4, kN = 20000;
  std::vector<int> last(kProducers, -1);
  bool in_order = true;
  auto sub = bus.subscribe(seqs, [&](const Seq& s) {
    if (s.n != last[s.producer] + 1) in_order = false;
    last[s.producer] = s.n;
  });
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      for (int n = 0; n < kN; ++n) ASSERT_TRUE(bus.publish(seqs, Seq{p, n}).ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_TRUE(in_order);
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(last[p], kN - 1);
}

TEST(Delivery, NonTrivialMessagesArriveIntactAcrossRingWraps) {
  bus::Bus bus(bus::Options().executors(1).ring_bytes(4096));
  std::vector<std::string> got;
  auto sub = bus.subscribe(words, [&](const std::string& w) { got.push_back(w); });
  std::vector<std::string> sent;
  for (int i = 0; i < 3000; ++i)
    sent.push_back(std::string(static_cast<std::size_t>(i % 97), 'x') + std::to_string(i));
  for (auto& w : sent) ASSERT_TRUE(bus.publish(words, w).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got, sent);
}

TEST(Delivery, LargeMessagesAreBoxedAndDelivered) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<long> sum{0};
  auto sub = bus.subscribe(bigs, [&](const Big& b) { sum += b.n + b.bytes[4095]; });
  auto big = std::make_unique<Big>();
  big->bytes[4095] = 1;
  for (int i = 0; i < 1000; ++i) {
    big->n = i;
    ASSERT_TRUE(bus.publish(bigs, *big).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(sum.load(), 999L * 1000 / 2 + 1000);
}

TEST(Delivery, UnsubscribedHandlerIsNotCalledAgain) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<int> calls{0};
  auto sub = bus.subscribe(seqs, [&](const Seq&) { calls++; });
  for (int n = 0; n < 100; ++n) ASSERT_TRUE(bus.publish(seqs, Seq{0, n}).ok());
  sub.cancel();
  int after_cancel = calls.load();
  for (int n = 0; n < 100; ++n) ASSERT_TRUE(bus.publish(seqs, Seq{0, n}).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(calls.load(), after_cancel);
  EXPECT_EQ(after_cancel, 100) << "messages published before cancel() were delivered";
}

TEST(Delivery, RemovedQueueConsumerHandsItsMessagesToAnother) {
  bus::Bus bus(bus::Options().executors(2));
  std::atomic<int> a{0}, b{0};
  auto first = bus.consume(
      jobs, [&](Seq&&) { a++; }, bus::on_executor(0));
  auto second = bus.consume(
      jobs, [&](Seq&&) { b++; }, bus::on_executor(1));
  std::thread producer([&] {
    for (int n = 0; n < 20000; ++n) ASSERT_TRUE(bus.send(jobs, Seq{0, n}).ok());
  });
  first.cancel();
  producer.join();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(a.load() + b.load(), 20000) << "exactly once, even across the removal";
  EXPECT_EQ(bus.stats().channel("delivery_test.jobs")->unrouted, 0u);
}

}  // namespace

namespace {

// Two topics whose routes share a slot of a thread's route table (ids 64 apart): in a Batch and
// on an executor, Bus::publish() holds a run of one of them (the route's lease) and must give it
// back when the other takes the slot. Each topic keeps its order; every message arrives once
// and is counted once.
TEST(Delivery, TopicsSharingARouteSlotTakeRunsFromEachOtherInABatchAndOnAnExecutor) {
  std::vector<std::unique_ptr<bus::Topic<uint64_t>>> topics;
  for (int i = 0; i <= 64; ++i) {
    topics.push_back(std::make_unique<bus::Topic<uint64_t>>(
        "delivery_test.slot." + std::to_string(i), bus::Overflow::kBlock));
  }
  const bus::Topic<uint64_t>& a = *topics.front();
  const bus::Topic<uint64_t>* b = nullptr;
  for (auto& t : topics) {
    if (t->id() != a.id() && t->id() % 64 == a.id() % 64) b = t.get();
  }
  ASSERT_NE(b, nullptr);
  std::vector<uint64_t> got_a, got_b;
  // On two inboxes: a run one topic holds is not closed by a send of the other (it would be,
  // on one ring), so only the route giving it back stops the other topic's messages joining it.
  bus::Bus bus(bus::Options().executors(3));
  auto sa = bus.subscribe(
      a, [&](const uint64_t& v) { got_a.push_back(v); }, bus::on_executor(1));
  auto sb = bus.subscribe(
      *b, [&](const uint64_t& v) { got_b.push_back(v); }, bus::on_executor(2));
  uint64_t next_a = 1, next_b = 1;
  auto burst = [&](uint64_t round) -> bool {
    // Runs of 1 to 300 messages to one topic, then the other (past a run's 256).
    for (uint64_t k = 0; k < 20; ++k) {
      const uint64_t len = 1 + (round * 37 + k * 53) % 300;
      const bool to_a = (round + k) % 2 == 0;
      for (uint64_t i = 0; i < len; ++i) {
        if (!(to_a ? bus.publish(a, next_a++) : bus.publish(*b, next_b++)).ok()) return false;
      }
    }
    return true;
  };
  for (uint64_t round = 0; round < 10; ++round) {
    bus::Batch batch(bus);
    ASSERT_TRUE(burst(round));
  }
  // Where this thread's messages end and the executor's begin: each producer's order holds, not
  // one across the two (the subscriber's inbox reads both rings).
  const uint64_t main_a = next_a - 1, main_b = next_b - 1;
  std::atomic<bool> executor_ok{true};
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         for (uint64_t round = 10; round < 20; ++round) {
                           if (!burst(round)) executor_ok = false;
                         }
                       })
                  .ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_TRUE(executor_ok.load());
  // Per producer: 1..main, then main+1..last, each in order and complete.
  auto in_order = [](const std::vector<uint64_t>& got, uint64_t main, uint64_t last) {
    std::vector<uint64_t> mine, executors;
    for (uint64_t v : got) (v <= main ? mine : executors).push_back(v);
    std::vector<uint64_t> want_mine(main), want_executors(last - main);
    for (uint64_t i = 0; i < main; ++i) want_mine[i] = i + 1;
    for (uint64_t i = 0; i < last - main; ++i) want_executors[i] = main + i + 1;
    return mine == want_mine && executors == want_executors;
  };
  EXPECT_TRUE(in_order(got_a, main_a, next_a - 1));
  EXPECT_TRUE(in_order(got_b, main_b, next_b - 1));
  EXPECT_EQ(got_a.size(), next_a - 1);
  EXPECT_EQ(got_b.size(), next_b - 1);
  const bus::Stats stats = bus.stats();
  EXPECT_EQ(stats.channel(a.name())->published, next_a - 1);
  EXPECT_EQ(stats.channel(b->name())->published, next_b - 1);
  EXPECT_EQ(stats.channel(a.name())->delivered, next_a - 1);
}

}  // namespace
