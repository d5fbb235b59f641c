// Compositions (bus::Reactor) and stopping a service: several requests under one deadline, the
// continuation on the caller's executor, bounded pending work, nothing after the caller went.
#include <gtest/gtest.h>

#include <atomic>
#include <bus/bus.hpp>
#include <bus/compose.hpp>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;

inline const bus::Endpoint<int, int> twice{"compose_test.twice"};
inline const bus::Endpoint<int, std::string> named{"compose_test.named"};
inline const bus::Endpoint<int, int> thrower{"compose_test.thrower"};
inline const bus::Endpoint<int, int> nobody{"compose_test.nobody"};
inline const bus::Endpoint<int, int> held{"compose_test.held"};
inline const bus::Endpoint<int, int> held2{"compose_test.held2"};
inline const bus::Endpoint<int, unsigned> whoami{"compose_test.whoami"};
inline const bus::Endpoint<int, unsigned> shard_of{
    "compose_test.shard_of", [](const int& k) -> uint64_t { return static_cast<uint64_t>(k); }};
inline const bus::Topic<int> go{"compose_test.go"};

/// An endpoint handler that blocks until released (a call "slower than the deadline").
struct Gate {
  bus_test::Gate door;
  std::atomic<int> entered{0};
  int pass(int v) {
    entered.fetch_add(1);
    door.wait();
    return v;
  }
  void open() { door.open(); }
};

/// A service composing calls: records what its continuations saw.
struct Composer {
  explicit Composer(bus::Bus& bus, bus::ReactorOptions o = {}) : reactor(bus, o) {}
  bus::Reactor reactor;
  std::vector<std::string> seen;
  std::atomic<int> done{0};
  std::optional<unsigned> ran_on;
};

std::string show(const absl::StatusOr<int>& r) {
  return r.ok() ? std::to_string(*r) : std::string(absl::StatusCodeToString(r.status().code()));
}

/// Three executors: `held` waits at a gate on executor 2, `twice` answers on executor 0, and the
/// composing service runs on executor 1.
class Composing : public testing::Test {
 protected:
  ~Composing() override { gate.open(); }  // no handler may stay blocked as the bus stops

  bus::Bus bus{bus::Options().executors(3)};
  Gate gate;
  bus::Subscription slow = bus.serve(
      held, [this](int&& v) { return gate.pass(v); }, bus::on_executor(2));
  bus::Subscription fast = bus.serve(
      twice, [](int&& v) { return 2 * v; }, bus::on_executor(0));
  bus::Service<Composer> svc = bus.service<Composer>(bus::on_executor(1), bus);
};

TEST(Reactor, AllGathersEveryOutcomeInOrderOnTheCallersExecutor) {
  bus::Bus bus(bus::Options().executors(3));
  auto s1 = bus.serve(
      twice, [](int&& v) { return 2 * v; }, bus::on_executor(0));
  auto s2 = bus.serve(
      named, [](int&& v) { return "n" + std::to_string(v); }, bus::on_executor(2));
  auto s3 = bus.serve(
      thrower, [](int&&) -> int { throw std::runtime_error("boom"); }, bus::on_executor(0));
  auto svc = bus.service<Composer>(bus::on_executor(1), bus);
  svc.subscribe(go, [&bus](Composer& c, const int& v) {
    c.reactor
        .all(5s, bus::call(twice, v), bus::call(named, v), bus::call(thrower, v),
             bus::call(nobody, v))
        .then([&c, &bus](absl::StatusOr<int> a, absl::StatusOr<std::string> b,
                         absl::StatusOr<int> t, absl::StatusOr<int> n) {
          c.ran_on = bus.current_executor();
          c.seen = {show(a), b.ok() ? *b : "error", show(t), show(n)};
          c.done = 1;
        });
  });
  ASSERT_TRUE(bus.publish(go, 21).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(svc.state().ran_on, 1u);
  EXPECT_EQ(svc.state().seen, (std::vector<std::string>{"42", "n21", "INTERNAL", "UNAVAILABLE"}));
  auto st = svc.state().reactor.stats();
  EXPECT_EQ(st.started, 1u);
  EXPECT_EQ(st.completed, 1u);
  EXPECT_EQ(st.pending, 0u);
}

TEST_F(Composing, TheCompositionDeadlineCutsACallThatIsStillRunning) {
  svc.subscribe(go, [](Composer& c, const int& v) {
    c.reactor.all(1s, bus::call(held, v), bus::call(twice, v))
        .then([&c](absl::StatusOr<int> slow, absl::StatusOr<int> fast) {
          c.seen = {show(slow), show(fast)};
          c.done = 1;
        });
  });
  ASSERT_TRUE(bus.publish(go, 5).ok());
  // The continuation runs while the slow handler is still blocked: the deadline, not the
  // reply, ended the wait.
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(gate.entered.load(), 1);
  EXPECT_EQ(svc.state().seen, (std::vector<std::string>{"DEADLINE_EXCEEDED", "10"}));
  gate.open();
  ASSERT_TRUE(bus_test::eventually(
      [&] { return bus.stats().channel("compose_test.held")->late_replies == 1; }));
}

TEST_F(Composing, ACallCanHaveAShorterDeadlineOfItsOwn) {
  svc.subscribe(go, [](Composer& c, const int& v) {
    c.reactor.all(1h, bus::call(held, v).within(20ms), bus::call(twice, v))
        .then([&c](absl::StatusOr<int> slow, absl::StatusOr<int> fast) {
          c.seen = {show(slow), show(fast)};
          c.done = 1;
        });
  });
  ASSERT_TRUE(bus.publish(go, 4).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(svc.state().seen, (std::vector<std::string>{"DEADLINE_EXCEEDED", "8"}));
  gate.open();
}

TEST_F(Composing, FirstTakesTheFirstSuccessAndDropsTheRest) {
  svc.subscribe(go, [](Composer& c, const int& v) {
    c.reactor.first(5s, bus::call(held, v), bus::call(thrower, v), bus::call(twice, v))
        .then([&c](absl::StatusOr<int> r, std::size_t which) {
          c.seen = {show(r), std::to_string(which)};
          c.done.fetch_add(1);
        });
  });
  auto bad = bus.serve(thrower, [](int&&) -> int { throw std::runtime_error("boom"); });
  ASSERT_TRUE(bus.publish(go, 3).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(svc.state().seen, (std::vector<std::string>{"6", "2"}));
  EXPECT_EQ(svc.state().reactor.stats().pending, 1u);  // the held call is still out
  gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().reactor.stats().pending == 0; }));
  EXPECT_EQ(svc.state().done.load(), 1);  // the later reply ran nothing
}

TEST(Reactor, FirstReportsEveryFailureWhenAllFail) {
  bus::Bus bus(bus::Options().executors(2));
  auto bad = bus.serve(thrower, [](int&&) -> int { throw std::runtime_error("boom"); });
  auto svc = bus.service<Composer>(bus::on_executor(1), bus);
  std::string message;
  std::size_t which = 0;
  svc.subscribe(go, [&](Composer& c, const int& v) {
    c.reactor.first(5s, bus::call(thrower, v), bus::call(nobody, v))
        .then([&](absl::StatusOr<int> r, std::size_t w) {
          message = r.status().ToString();
          which = w;
          c.done = 1;
        });
  });
  ASSERT_TRUE(bus.publish(go, 1).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(which, SIZE_MAX);
  EXPECT_NE(message.find("all 2 calls failed"), std::string::npos) << message;
  EXPECT_NE(message.find("[0] INTERNAL"), std::string::npos) << message;
  EXPECT_NE(message.find("[1] UNAVAILABLE"), std::string::npos) << message;
}

struct Member {
  unsigned id = 0;
};

TEST(Reactor, EachAsksEveryInstanceOfAPoolAndEveryShard) {
  bus::Bus bus(bus::Options().executors(3));
  auto pool = bus.pool<Member>(3);
  auto shards = bus.sharded<Member>(4);
  for (unsigned i = 0; i < pool.size(); ++i) pool[i].state().id = 10 + i;
  for (unsigned i = 0; i < shards.size(); ++i) shards[i].state().id = 20 + i;
  pool.serve(whoami, [](Member& m, int&&) { return m.id; });
  shards.serve(shard_of, [](Member& m, int&&) { return m.id; });
  auto svc = bus.service<Composer>(bus, bus::ReactorOptions());
  std::multiset<unsigned> from_pool, from_shards;
  svc.subscribe(go, [&](Composer& c, const int&) {
    c.reactor.each(whoami, 0, 5s).then([&](std::vector<absl::StatusOr<unsigned>> r) {
      for (auto& x : r) from_pool.insert(x.value_or(0));
      c.reactor.each(shard_of, 7, 5s).then([&](std::vector<absl::StatusOr<unsigned>> r2) {
        for (auto& x : r2) from_shards.insert(x.value_or(0));
        c.done = 1;
      });
    });
  });
  ASSERT_TRUE(bus.publish(go, 0).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(from_pool, (std::multiset<unsigned>{10, 11, 12}));
  EXPECT_EQ(from_shards, (std::multiset<unsigned>{20, 21, 22, 23}));
}

TEST(Reactor, EachWithNoServerAnswersAnEmptyList) {
  bus::Bus bus(bus::Options().executors(1));
  auto svc = bus.service<Composer>(bus);
  std::optional<std::size_t> size;
  svc.subscribe(go, [&](Composer& c, const int&) {
    c.reactor.each(nobody, 0, 5s).then([&](std::vector<absl::StatusOr<int>> r) {
      size = r.size();
      c.done = 1;
    });
  });
  ASSERT_TRUE(bus.publish(go, 0).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == 1; }));
  EXPECT_EQ(size, 0u);
}

TEST(Reactor, ThousandsOfConcurrentCompositionsAllCompleteAndLeaveNothing) {
  constexpr int kCompositions = 5000;
  bus::Bus bus(bus::Options().executors(2));
  auto s1 = bus.serve(
      twice, [](int&& v) { return 2 * v; }, bus::on_executor(0));
  auto s2 = bus.serve(
      named, [](int&& v) { return std::to_string(v); }, bus::on_executor(0));
  auto svc = bus.service<Composer>(bus::on_executor(1), bus);
  std::atomic<long> sum{0};
  svc.subscribe(go, [&](Composer& c, const int&) {
    for (int i = 0; i < kCompositions; ++i) {
      c.reactor.all(30s, bus::call(twice, i), bus::call(named, i))
          .then([&, i](absl::StatusOr<int> a, absl::StatusOr<std::string> b) {
            if (a.ok() && b.ok() && *a == 2 * i && *b == std::to_string(i)) sum.fetch_add(i);
            c.done.fetch_add(1);
          });
    }
  });
  ASSERT_TRUE(bus.publish(go, 0).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return svc.state().done.load() == kCompositions; }));
  EXPECT_EQ(sum.load(), static_cast<long>(kCompositions) * (kCompositions - 1) / 2);
  auto st = svc.state().reactor.stats();
  EXPECT_EQ(st.started, static_cast<uint64_t>(kCompositions));
  EXPECT_EQ(st.completed, static_cast<uint64_t>(kCompositions));
  EXPECT_EQ(st.pending, 0u);
  EXPECT_EQ(st.rejected, 0u);
}

TEST_F(Composing, PendingCompositionsAreBoundedAndTheRefusedAreCounted) {
  auto bounded = bus.service<Composer>(bus::on_executor(1), bus,
                                       bus::ReactorOptions().max_pending_compositions(10));
  std::atomic<int> ok{0}, refused{0};
  bounded.subscribe(go, [&](Composer& c, const int&) {
    for (int i = 0; i < 30; ++i) {
      c.reactor.all(30s, bus::call(held, i)).then([&](absl::StatusOr<int> r) {
        (r.ok() ? ok : refused).fetch_add(1);
        if (!r.ok()) EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
      });
    }
  });
  ASSERT_TRUE(bus.publish(go, 0).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return refused.load() == 20; }));
  auto st = bounded.state().reactor.stats();
  EXPECT_EQ(st.pending, 10u);
  EXPECT_EQ(st.rejected, 20u);
  EXPECT_EQ(ok.load(), 0);
  gate.open();
  ASSERT_TRUE(bus_test::eventually([&] { return ok.load() == 10; }));
  EXPECT_EQ(bounded.state().reactor.stats().pending, 0u);
}

/// A service whose destruction is observable, composing against a held endpoint.
struct Watched {
  Watched(bus::Bus& bus, std::shared_ptr<std::atomic<int>> gone,
          std::shared_ptr<std::atomic<int>> ran)
      : reactor(bus), gone_(std::move(gone)), ran_(std::move(ran)) {}
  ~Watched() { gone_->store(1); }
  bus::Reactor reactor;
  std::shared_ptr<std::atomic<int>> gone_, ran_;
  int value = 7;
};

TEST(Reactor, AStoppedServiceGetsNoContinuationAndNoReplyCallback) {
  bus::Bus bus(bus::Options().executors(3));
  Gate gate;
  auto slow = bus.serve(
      held, [&](int&& v) { return gate.pass(v); }, bus::on_executor(2));
  auto slow2 = bus.serve(
      held2, [&](int&& v) { return gate.pass(v); }, bus::on_executor(0));
  auto gone = std::make_shared<std::atomic<int>>(0);
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto svc = bus.service<Watched>(bus::on_executor(1), bus, gone, ran);
  svc.subscribe(go, [](Watched& w, const int& v) {
    // Both continuations read the state: after stop() they would read freed memory.
    w.reactor.all(30s, bus::call(held, v)).then([&w](absl::StatusOr<int>) {
      w.ran_->fetch_add(w.value);
    });
  });
  // And a plain Service::request, whose callback must not run either.
  svc.request(held2, 1, 30s, [](Watched& w, absl::StatusOr<int>) { w.ran_->fetch_add(w.value); });
  ASSERT_TRUE(bus.publish(go, 1).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return gate.entered.load() == 2; }));
  svc.stop();
  EXPECT_EQ(gone->load(), 1);  // destroyed on its executor before stop() returned
  EXPECT_FALSE(svc.running());
  gate.open();
  ASSERT_TRUE(bus.stop().ok());  // every reply has come back and been handled
  EXPECT_EQ(ran->load(), 0);
  svc.stop();  // idempotent
}

TEST(Reactor, AReactorBelongsToOneThread) {
  bus::Bus bus(bus::Options().executors(2));
  bus::Reactor reactor(bus);
  EXPECT_THROW((void)reactor.all(1s, bus::call(twice, 1)).then([](absl::StatusOr<int>) {}),
               std::logic_error);
}

// ---- Service::stop ------------------------------------------------------------------------------

struct Counter {
  std::atomic<int> n{0};
  unsigned id = 0;
};

TEST(ServiceStop, HandlersStopAndTrafficGoesToTheOtherInstances) {
  bus::Bus bus(bus::Options().executors(2));
  auto pool = bus.pool<Counter>(2);
  pool[0].state().id = 0;
  pool[1].state().id = 1;
  pool.serve(whoami, [](Counter& c, int&&) {
    c.n.fetch_add(1);
    return c.id;
  });
  pool[0].stop();
  for (int i = 0; i < 20; ++i) {
    auto r = bus.call(whoami, 0, 5s);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(*r, 1u);
  }
  pool.stop();
  auto r = bus.call(whoami, 0, 5s);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
}

TEST(ServiceStop, FromItsOwnHandlerTheStateGoesAfterTheHandlerReturns) {
  bus::Bus bus(bus::Options().executors(1));
  auto gone = std::make_shared<std::atomic<int>>(0);
  auto ran = std::make_shared<std::atomic<int>>(0);
  auto svc = bus.service<Watched>(bus, gone, ran);
  svc.subscribe(go, [svc](Watched& w, const int&) mutable {
    svc.stop();
    w.ran_->fetch_add(w.value);  // still valid: the handler is running
  });
  svc.every(1ms, [](Watched& w) { w.ran_->fetch_add(1000); });
  ASSERT_TRUE(bus.publish(go, 1).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return gone->load() == 1; }));
  int after = ran->load();
  EXPECT_EQ(after % 1000, 7);
  ASSERT_TRUE(bus.publish(go, 1).ok());  // no handler any more
  ASSERT_TRUE(bus.stop().ok());
  EXPECT_EQ(ran->load(), after);
}

}  // namespace
