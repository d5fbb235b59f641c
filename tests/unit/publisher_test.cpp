// bus::Publisher: Bus::publish() through a handle made once. The same deliveries, order, counts,
// overflow policy and stop behaviour, whichever way a message goes (one by one, in a Batch's
// runs, from an executor, to several inboxes).
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

inline const bus::Topic<uint64_t> numbers{"publisher_test.numbers"};
inline const bus::Topic<uint64_t> quiet{"publisher_test.quiet"};
inline const bus::Topic<uint64_t> failing{"publisher_test.failing", bus::Overflow::kFail};
inline const bus::Topic<std::string> texts{"publisher_test.texts"};

/// A 64-byte message: eight words per payload in a run.
struct Wide {
  uint64_t seq = 0;
  uint64_t pad[7] = {};
};
inline const bus::Topic<Wide> wide{"publisher_test.wide"};

/// A message whose copy throws when asked to.
struct Fussy {
  uint64_t v = 0;
  bool refuse = false;
  Fussy(uint64_t x, bool r) : v(x), refuse(r) {}
  Fussy(const Fussy& o) : v(o.v), refuse(o.refuse) {
    if (refuse) throw std::runtime_error("no copy");
  }
  Fussy(Fussy&& o) noexcept = default;
};
inline const bus::Topic<Fussy> fussy{"publisher_test.fussy"};

/// A subscriber's view, read once the bus has stopped.
struct Seen {
  std::vector<uint64_t> values;
  void take(uint64_t v) { values.push_back(v); }
};

std::vector<uint64_t> one_to(uint64_t n) {
  std::vector<uint64_t> v(n);
  for (uint64_t i = 0; i < n; ++i) v[i] = i + 1;
  return v;
}

uint64_t published(bus::Bus& bus, std::string_view name) {
  const bus::Stats stats = bus.stats();
  const bus::ChannelStats* c = stats.channel(name);
  return c ? c->published : 0;
}

TEST(Publisher, PublishesLikeBusPublishInOrderAndCounted) {
  constexpr uint64_t kN = 20'000;
  std::optional<Seen> seen;
  seen.emplace();
  bus::Bus bus(bus::Options().executors(1));
  auto sub = bus.subscribe(numbers, [&](const uint64_t& v) { seen->take(v); });
  bus::Publisher<uint64_t> pub = bus.publisher(numbers);
  EXPECT_EQ(pub.topic().id(), numbers.id());
  for (uint64_t v = 1; v <= kN / 2; ++v) ASSERT_TRUE(pub.publish(v).ok());
  // Bus::publish() and the handle share this thread's ring: one order.
  for (uint64_t v = kN / 2 + 1; v <= kN; v += 2) {
    ASSERT_TRUE(bus.publish(numbers, v).ok());
    const uint64_t next = v + 1;  // an lvalue, then an rvalue
    ASSERT_TRUE(pub.publish(next).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(seen->values, one_to(kN));
  EXPECT_EQ(published(bus, "publisher_test.numbers"), kN);
  EXPECT_EQ(bus.stats().channel("publisher_test.numbers")->delivered, kN);
}

TEST(Publisher, RunsInABatchAreCountedOnceEachAndKeepOrder) {
  // In a Batch the handle's messages join run records, counted when each run closes: at the
  // Batch's end, at a flush, at a record of another topic. (Runs that close at 256 payloads:
  // FromAnExecutorItsMessagesGoOutAtTheEndOfTheHandlerBatch.)
  constexpr uint64_t kRounds = 40, kPerRound = 700;
  Seen a, b;
  bus::Bus bus(bus::Options().executors(1));
  auto sa = bus.subscribe(numbers, [&](const uint64_t& v) { a.take(v); });
  auto sb = bus.subscribe(quiet, [&](const uint64_t& v) { b.take(v); });
  auto pub = bus.publisher(numbers);
  uint64_t next = 1, other = 1;
  for (uint64_t r = 0; r < kRounds; ++r) {
    bus::Batch batch(bus);
    ASSERT_TRUE(batch.accepted());
    for (uint64_t i = 0; i < kPerRound; ++i) {
      ASSERT_TRUE(pub.publish(next++).ok());
      if (i % 97 == 0) ASSERT_TRUE(bus.publish(quiet, other++).ok());  // closes the run
      if (i % 300 == 0) batch.flush();                                 // so does a flush
    }
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(a.values, one_to(kRounds * kPerRound));
  EXPECT_EQ(b.values, one_to(other - 1));
  EXPECT_EQ(published(bus, "publisher_test.numbers"), kRounds * kPerRound);
  EXPECT_EQ(published(bus, "publisher_test.quiet"), other - 1);
}

TEST(Publisher, HandlesAndBusPublishSharingOneInboxInABatchKeepEachTopicsOrder) {
  // Inside a Batch a handle holds its run's cursor (a lease on the ring). Two handles of one
  // topic, Bus::publish() to it, and sends of two other topics to the same inbox all take the
  // run from one another, in every order: each topic's messages arrive in the order they were
  // published, every one counted once.
  constexpr uint64_t kRounds = 30, kPerRound = 1'000;
  Seen a, b;
  std::vector<uint64_t> w;
  bool wide_intact = true;
  bus::Bus bus(bus::Options().executors(1));
  auto sa = bus.subscribe(numbers, [&](const uint64_t& v) { a.take(v); });
  auto sb = bus.subscribe(quiet, [&](const uint64_t& v) { b.take(v); });
  auto sw = bus.subscribe(wide, [&](const Wide& m) {
    w.push_back(m.seq);
    for (uint64_t p : m.pad) wide_intact &= p == m.seq * 3;
  });
  auto first = bus.publisher(numbers);
  auto second = bus.publisher(numbers);
  auto other = bus.publisher(quiet);
  auto big = bus.publisher(wide);
  uint64_t next = 1, next_quiet = 1, next_wide = 1;
  for (uint64_t r = 0; r < kRounds; ++r) {
    bus::Batch batch(bus);
    for (uint64_t i = 0; i < kPerRound; ++i) {
      // Runs of 1 to 7 messages through one way, then another (by the round and the position).
      const uint64_t way = ((i / (1 + (r + i / 50) % 7)) + r) % 5;
      if (way == 0) {
        ASSERT_TRUE(first.publish(next++).ok());
      } else if (way == 1) {
        ASSERT_TRUE(second.publish(next++).ok());
      } else if (way == 2) {
        ASSERT_TRUE(bus.publish(numbers, next++).ok());
      } else if (way == 3) {
        ASSERT_TRUE(other.publish(next_quiet++).ok());
      } else {
        Wide m;
        m.seq = next_wide++;
        for (uint64_t& p : m.pad) p = m.seq * 3;
        ASSERT_TRUE(big.publish(m).ok());
      }
    }
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(a.values, one_to(next - 1));
  EXPECT_EQ(b.values, one_to(next_quiet - 1));
  EXPECT_EQ(w, one_to(next_wide - 1));
  EXPECT_TRUE(wide_intact);
  EXPECT_EQ(next - 1 + next_quiet - 1 + next_wide - 1, kRounds * kPerRound);
  EXPECT_EQ(published(bus, "publisher_test.numbers"), next - 1);
  EXPECT_EQ(published(bus, "publisher_test.quiet"), next_quiet - 1);
  EXPECT_EQ(published(bus, "publisher_test.wide"), next_wide - 1);
  EXPECT_EQ(bus.stats().channel("publisher_test.numbers")->delivered, next - 1);
}

TEST(Publisher, AHandleMovedOrDestroyedInsideABatchGivesItsRunBack) {
  // The run a handle holds goes back to its ring when the handle is moved from or destroyed:
  // what is published after (through the new handle, another, or Bus::publish()) follows it in
  // the same run, and everything arrives once, in order, counted.
  Seen a;
  bus::Bus bus(bus::Options().executors(1));
  auto sub = bus.subscribe(numbers, [&](const uint64_t& v) { a.take(v); });
  uint64_t next = 1;
  for (int round = 0; round < 50; ++round) {
    bus::Batch batch(bus);
    std::optional<bus::Publisher<uint64_t>> held;
    {
      auto pub = bus.publisher(numbers);
      for (int i = 0; i < 10 + round; ++i) ASSERT_TRUE(pub.publish(next++).ok());
      held.emplace(std::move(pub));  // moved from mid-run
      ASSERT_TRUE(held->publish(next++).ok());
      auto again = bus.publisher(numbers);
      ASSERT_TRUE(again.publish(next++).ok());
      for (int i = 0; i < round; ++i) ASSERT_TRUE(held->publish(next++).ok());
      bus::Publisher<uint64_t> assigned = bus.publisher(numbers);
      ASSERT_TRUE(assigned.publish(next++).ok());
      assigned = std::move(*held);  // gives its own run back, takes none
      ASSERT_TRUE(assigned.publish(next++).ok());
      ASSERT_TRUE(assigned.publish(next++).ok());
    }  // destroyed holding a run
    ASSERT_TRUE(bus.publish(numbers, next++).ok());
    held.reset();
    auto last = bus.publisher(numbers);
    for (int i = 0; i < 300; ++i) ASSERT_TRUE(last.publish(next++).ok());  // past a run's 256
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(a.values, one_to(next - 1));
  EXPECT_EQ(published(bus, "publisher_test.numbers"), next - 1);
}

/// A handle publishes 4,000 messages to a ring that fills (the subscriber waits), one by one or
/// in Batches of 1,000: every one counts as published, the ones refused fail with
/// ResourceExhausted and count as failed, and those accepted all arrive, in order. (In a Batch, a
/// run the handle holds ends where the ring has no room known: the publish after it looks again.)
void fill_a_ring_under_the_fail_policy(bool in_batches) {
  bus::Bus bus(bus::Options().executors(1).ring_bytes(4096));
  bus_test::Gate gate;
  std::vector<uint64_t> got;
  auto sub = bus.subscribe(
      failing,
      [&](const uint64_t& v) {
        gate.wait();
        got.push_back(v);
      },
      bus::on_executor(0));
  auto pub = bus.publisher(failing);
  std::vector<uint64_t> accepted;
  uint64_t refused = 0;
  for (uint64_t round = 0; round < 4; ++round) {
    std::optional<bus::Batch> batch;
    if (in_batches) batch.emplace(bus);
    for (uint64_t i = 1; i <= 1'000; ++i) {
      const uint64_t v = round * 1'000 + i;
      absl::Status s = pub.publish(v);
      if (s.ok()) {
        accepted.push_back(v);
      } else {
        EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        ++refused;
      }
    }
  }
  gate.open();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_GT(refused, 0u);
  EXPECT_EQ(got, accepted);
  const bus::Stats stats = bus.stats();
  const bus::ChannelStats* c = stats.channel("publisher_test.failing");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->published, accepted.size() + refused);  // every message offered
  EXPECT_EQ(c->failed, refused);
  EXPECT_EQ(c->delivered, accepted.size());
}

TEST(Publisher, AFullRingUnderTheFailPolicyFailsAndCountsLikeBusPublish) {
  fill_a_ring_under_the_fail_policy(false);
}

TEST(Publisher, InABatchAFullRingUnderTheFailPolicyFailsAndLosesNothingItAccepted) {
  fill_a_ring_under_the_fail_policy(true);
}

TEST(Publisher, SeesSubscribersComeAndGo) {
  // A subscriber on another inbox gets what is published after subscribe() returned; after its
  // cancel() returned, nothing more. The handle resolves its route again each time.
  std::vector<uint64_t> first, second;
  std::atomic<uint64_t> second_count{0};
  bus::Bus bus(bus::Options().executors(2));
  auto pub = bus.publisher(numbers);
  EXPECT_TRUE(pub.publish(uint64_t{1}).ok());  // no subscriber yet: published to nobody, still OK
  auto s1 = bus.subscribe(
      numbers, [&](const uint64_t& v) { first.push_back(v); }, bus::on_executor(0));
  for (uint64_t v = 2; v <= 100; ++v) ASSERT_TRUE(pub.publish(v).ok());
  {
    bus::Subscription s2 = bus.subscribe(
        numbers,
        [&](const uint64_t& v) {
          second.push_back(v);
          ++second_count;
        },
        bus::on_executor(1));
    for (uint64_t v = 101; v <= 200; ++v) ASSERT_TRUE(pub.publish(v).ok());
    {
      bus::Batch batch(bus);  // to two inboxes inside a Batch: a run on each
      for (uint64_t v = 201; v <= 300; ++v) ASSERT_TRUE(pub.publish(v).ok());
    }
    s2.cancel();
  }
  const uint64_t after_cancel = second_count.load();
  for (uint64_t v = 301; v <= 400; ++v) ASSERT_TRUE(pub.publish(v).ok());
  ASSERT_TRUE(bus.stop().ok());
  std::vector<uint64_t> expected_first;
  for (uint64_t v = 2; v <= 400; ++v) expected_first.push_back(v);
  EXPECT_EQ(first, expected_first);
  std::vector<uint64_t> expected_second;
  for (uint64_t v = 101; v <= 300; ++v) expected_second.push_back(v);
  EXPECT_EQ(second, expected_second);
  EXPECT_EQ(after_cancel, 200u);
  EXPECT_EQ(published(bus, "publisher_test.numbers"), 400u);
}

TEST(Publisher, TheLastSubscriberLeavingDuringABatchRunsNoHandlerAndEveryMessageIsCounted) {
  // Another thread cancels the last subscription while this thread's Batch has a run open:
  // what joins the run after that reaches no handler, as what was in it already does (the
  // Batch had published none of it when cancel() returned). Every message counts as published,
  // as Bus::publish() counts one to a topic without subscribers. (The behaviour a user sees;
  // it is the same whether or not a message joining the run looks at the subscriber count.)
  std::atomic<uint64_t> got{0};
  bus::Bus bus(bus::Options().executors(1));
  auto pub = bus.publisher(numbers);
  bus::Subscription sub = bus.subscribe(
      numbers, [&](const uint64_t&) { ++got; }, bus::on_executor(0));
  {
    bus::Batch batch(bus);
    for (uint64_t v = 1; v <= 10; ++v) ASSERT_TRUE(pub.publish(v).ok());
    std::thread([&] { sub.cancel(); }).join();
    for (uint64_t v = 11; v <= 20; ++v) ASSERT_TRUE(pub.publish(v).ok());
  }
  for (uint64_t v = 21; v <= 30; ++v) ASSERT_TRUE(pub.publish(v).ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(got.load(), 0u);
  EXPECT_EQ(published(bus, "publisher_test.numbers"), 30u);
}

TEST(Publisher, FromAnExecutorItsMessagesGoOutAtTheEndOfTheHandlerBatch) {
  constexpr uint64_t kN = 30'000;
  std::optional<Seen> seen;
  seen.emplace();
  std::atomic<int> errors{0};
  bus::Bus bus(bus::Options().executors(2));
  auto sub = bus.subscribe(
      numbers, [&](const uint64_t& v) { seen->take(v); }, bus::on_executor(1));
  ASSERT_TRUE(bus.post(bus::on_executor(0),
                       [&] {
                         auto pub = bus.publisher(numbers);  // made on the executor's thread
                         for (uint64_t v = 1; v <= kN; ++v) {
                           if (!pub.publish(v).ok()) ++errors;
                         }
                       })
                  .ok());
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(seen->values, one_to(kN));
  EXPECT_EQ(published(bus, "publisher_test.numbers"), kN);
}

TEST(Publisher, AMessageWhoseCopyThrowsLeavesThePublisherAndStopUsable) {
  // The exception reaches the caller; the thread leaves the bus (stop() does not wait for it);
  // later messages, one by one and in a Batch, still go through, in order.
  std::vector<uint64_t> got;
  bus::Bus bus(bus::Options().executors(1));
  auto sub = bus.subscribe(fussy, [&](const Fussy& f) { got.push_back(f.v); });
  auto pub = bus.publisher(fussy);
  const Fussy ok1(1, false), bad(2, true), ok3(3, false);
  ASSERT_TRUE(pub.publish(ok1).ok());
  EXPECT_THROW((void)pub.publish(bad), std::runtime_error);
  ASSERT_TRUE(pub.publish(ok3).ok());
  {
    bus::Batch batch(bus);
    EXPECT_THROW((void)pub.publish(bad), std::runtime_error);
    ASSERT_TRUE(pub.publish(Fussy(4, false)).ok());
  }
  ASSERT_TRUE(bus.stop().ok());  // would wait forever for a thread left inside a publish
  EXPECT_EQ(got, (std::vector<uint64_t>{1, 3, 4}));
}

TEST(Publisher, MovesRefusesOnceTheBusStoppedAndMayBeDestroyedAfterIt) {
  std::vector<std::string> got;
  std::optional<bus::Publisher<std::string>> kept;
  {
    bus::Bus bus(bus::Options().executors(1));
    auto sub = bus.subscribe(texts, [&](const std::string& s) { got.push_back(s); });
    bus::Publisher<std::string> first = bus.publisher(texts);
    bus::Publisher<std::string> moved = std::move(first);    // before its first publish()
    ASSERT_TRUE(moved.publish(std::string(300, 'a')).ok());  // boxed: a heap payload
    const std::string b = "b";
    ASSERT_TRUE(moved.publish(b).ok());
    kept.emplace(std::move(moved));
    ASSERT_TRUE(kept->publish(std::string("c")).ok());
    ASSERT_TRUE(bus.stop().ok());
    EXPECT_EQ(kept->publish(std::string("after stop")).code(), absl::StatusCode::kUnavailable);
  }
  kept.reset();  // after its bus: touches nothing of it
  EXPECT_EQ(got, (std::vector<std::string>{std::string(300, 'a'), "b", "c"}));
}

TEST(Publisher, AHandlerHoldingOneDoesNotKeepItsBusAlive) {
  // A handler that holds a Publisher of its own bus: the bus's state, the handler and what it
  // holds all go when the bus does (a handle owning the bus would make a cycle and leak them).
  auto token = std::make_shared<int>(0);
  std::weak_ptr<int> watch = token;
  {
    bus::Bus bus(bus::Options().executors(1));
    auto pub = std::make_shared<bus::Publisher<uint64_t>>(bus.publisher(quiet));
    bus::Subscription sub =
        bus.subscribe(numbers, [pub, token = std::move(token)](const uint64_t&) { (void)*token; });
    ASSERT_TRUE(bus.publish(numbers, uint64_t{1}).ok());
    ASSERT_TRUE(bus.stop().ok());
    sub.cancel();  // after stop(): only staged, the handler stays with the bus's state
  }
  EXPECT_TRUE(watch.expired());
}

TEST(Publisher, ASecondInboxSubscribingDuringABatchIsCountedOnce) {
  // The one-inbox route opens a counted run; then a subscriber on another inbox makes the topic
  // go to several inboxes, whose sends are counted per publish(): each message counts once.
  std::atomic<uint64_t> first{0}, second{0};
  bus::Bus bus(bus::Options().executors(2));
  auto pub = bus.publisher(numbers);
  auto s1 = bus.subscribe(
      numbers, [&](const uint64_t&) { ++first; }, bus::on_executor(0));
  std::optional<bus::Subscription> s2;
  {
    bus::Batch batch(bus);
    for (uint64_t v = 1; v <= 10; ++v) ASSERT_TRUE(pub.publish(v).ok());
    std::thread([&] {
      s2.emplace(bus.subscribe(
          numbers, [&](const uint64_t&) { ++second; }, bus::on_executor(1)));
    }).join();
    for (uint64_t v = 11; v <= 20; ++v) ASSERT_TRUE(pub.publish(v).ok());
    for (uint64_t v = 21; v <= 30; ++v) ASSERT_TRUE(bus.publish(numbers, v).ok());
  }
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(first.load(), 30u);
  EXPECT_EQ(second.load(), 20u);
  EXPECT_EQ(published(bus, "publisher_test.numbers"), 30u);
}

TEST(Publisher, ThreadsWithHandlesOfTheirOwnKeepTheirOwnOrder) {
  constexpr uint64_t kPerThread = 20'000;
  constexpr int kThreads = 3;
  std::vector<uint64_t> last(kThreads, 0);
  std::atomic<int> out_of_order{0};
  std::atomic<uint64_t> got{0};
  bus::Bus bus(bus::Options().executors(1));
  auto sub = bus.subscribe(numbers, [&](const uint64_t& v) {
    uint64_t t = v >> 32, seq = v & 0xffffffff;
    if (seq != last[t] + 1) ++out_of_order;
    last[t] = seq;
    ++got;
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto pub = bus.publisher(numbers);
      for (uint64_t i = 1; i <= kPerThread; ++i) {
        if (t == 1 && i % 64 == 1) {  // one thread in Batches of 64
          bus::Batch batch(bus);
          for (uint64_t k = i; k < i + 64 && k <= kPerThread; ++k) {
            EXPECT_TRUE(pub.publish((uint64_t{1} << 32) | k).ok());
          }
          i += 63;
          continue;
        }
        EXPECT_TRUE(pub.publish((uint64_t(t) << 32) | i).ok());
      }
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(out_of_order.load(), 0);
  EXPECT_EQ(got.load(), kThreads * kPerThread);
  EXPECT_EQ(published(bus, "publisher_test.numbers"), kThreads * kPerThread);
}

}  // namespace
