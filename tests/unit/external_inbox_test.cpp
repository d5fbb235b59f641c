// An ExternalInbox driven by a real poll() loop: what it subscribes to and the replies to what
// its thread asks for run inside drain(), on the loop's thread.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <bus/bus.hpp>
#include <cerrno>
#include <chrono>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using bus_test::eventually;
using bus_test::Gate;
using bus_test::OpenOnExit;

thread_local bool t_on_loop = false;        // the calling thread is a Loop's
thread_local bool t_in_drain = false;       // ... and is inside ExternalInbox::drain()
thread_local int t_last_poll_timeout = -2;  // ... whose last poll() had this timeout (ms)

/// An event loop that is not an executor: a thread owning an ExternalInbox, blocked in poll() on
/// its eventfd (and a quit eventfd) with a timeout taken from next_timer(), draining on wake-up.
class Loop {
 public:
  /// Runs on the loop thread, before its first poll: subscribe, make requests.
  using Setup = std::function<void(bus::ExternalInbox&, std::vector<bus::Subscription>&)>;

  Loop(bus::Bus& bus, Setup setup) : quit_(::eventfd(0, EFD_CLOEXEC)) {
    thread_ = std::thread([this, &bus, setup = std::move(setup)] { run(bus, setup); });
    while (!ready_.load()) ready_.wait(false);
  }
  Loop(const Loop&) = delete;
  Loop& operator=(const Loop&) = delete;
  ~Loop() {
    uint64_t one = 1;
    (void)!::write(quit_, &one, sizeof one);
    thread_.join();
    ::close(quit_);
  }

  std::thread::id id() const { return id_; }
  /// poll() calls begun so far.
  int polls() const { return polls_.load(); }

 private:
  void run(bus::Bus& bus, const Setup& setup) {
    id_ = std::this_thread::get_id();
    t_on_loop = true;
    bus::ExternalInbox inbox(bus);  // owned by this thread: its requests' replies come here
    std::vector<bus::Subscription> subs;
    setup(inbox, subs);
    drain(inbox);
    ready_.store(true);
    ready_.notify_all();
    while (true) {
      int timeout = -1;  // no timer: park until the eventfd is written
      if (auto next = inbox.next_timer()) {
        auto left = *next - bus::Clock::now();
        timeout =
            left <= bus::Clock::duration::zero()
                ? 0
                : static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(left).count());
      }
      pollfd fds[2] = {{inbox.fd(), POLLIN, 0}, {quit_, POLLIN, 0}};
      t_last_poll_timeout = timeout;
      polls_.fetch_add(1);
      int rc = ::poll(fds, 2, timeout);
      if (rc < 0 && errno == EINTR) continue;
      ASSERT_GE(rc, 0) << "poll: " << errno;
      if (fds[1].revents & POLLIN) break;
      drain(inbox);
    }
  }
  static void drain(bus::ExternalInbox& inbox) {
    t_in_drain = true;
    inbox.drain();
    t_in_drain = false;
  }

  int quit_;
  std::thread::id id_;  // written before ready_ is set
  std::atomic<bool> ready_{false};
  std::atomic<int> polls_{0};
  std::thread thread_;
};

struct Msg {
  int from;
  int seq;
};

inline const bus::Topic<Msg> remote{"external_inbox_test.remote"};
inline const bus::Topic<int> wakeups{"external_inbox_test.wakeups"};
inline const bus::Topic<int> triggers{"external_inbox_test.triggers"};
inline const bus::Endpoint<int, int> twice{"external_inbox_test.twice"};
inline const bus::Endpoint<int, int> stalled{"external_inbox_test.stalled"};
inline const bus::Topic<int> earlier{"external_inbox_test.earlier"};
inline const bus::Topic<int> later{"external_inbox_test.later"};
inline const bus::Topic<std::shared_ptr<int>> tokens{"external_inbox_test.tokens"};

TEST(ExternalInbox, SubscriberReceivesWhatOtherThreadsPublish) {
  constexpr int kThreads = 3;
  constexpr int kPerThread = 20000;
  std::atomic<int> received{0};
  std::atomic<int> out_of_order{0};
  std::atomic<int> off_loop{0};         // handler runs outside the loop's drain()
  std::vector<int> last(kThreads, -1);  // loop thread only
  bus::Bus bus(bus::Options().executors(2));
  Loop loop(bus, [&](bus::ExternalInbox& inbox, std::vector<bus::Subscription>& subs) {
    subs.push_back(inbox.subscribe(remote, [&](const Msg& m) {
      if (!t_on_loop || !t_in_drain) off_loop.fetch_add(1);
      if (m.seq != last[m.from] + 1) out_of_order.fetch_add(1);
      last[m.from] = m.seq;
      received.fetch_add(1);
    }));
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) EXPECT_TRUE(bus.publish(remote, Msg{t, i}).ok());
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(eventually([&] { return received.load() >= kThreads * kPerThread; }));
  EXPECT_EQ(received.load(), kThreads * kPerThread);
  EXPECT_EQ(out_of_order.load(), 0);  // each publisher's messages arrive in its order
  EXPECT_EQ(off_loop.load(), 0);
}

TEST(ExternalInbox, RequestFromTheLoopThreadIsAnsweredOnTheLoopThread) {
  struct Answer {
    std::atomic<bool> done{false};
    absl::StatusCode code = absl::StatusCode::kUnknown;
    int value = 0;
    std::thread::id thread;
    bool in_drain = false;
  };
  Answer answer;
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(
      twice, [](int v) { return 2 * v; }, bus::on_executor(0));
  Loop loop(bus, [&](bus::ExternalInbox&, std::vector<bus::Subscription>&) {
    bus.request(twice, 21, 30s, [&](absl::StatusOr<int> r) {
      answer.code = r.status().code();
      if (r.ok()) answer.value = *r;
      answer.thread = std::this_thread::get_id();
      answer.in_drain = t_in_drain;
      answer.done.store(true);
    });
  });
  ASSERT_TRUE(eventually([&] { return answer.done.load(); }));
  EXPECT_EQ(answer.code, absl::StatusCode::kOk);
  EXPECT_EQ(answer.value, 42);
  EXPECT_EQ(answer.thread, loop.id());
  EXPECT_TRUE(answer.in_drain);
}

TEST(ExternalInbox, RequestMadeInsideDrainIsAnsweredOnTheLoopThread) {
  std::atomic<int> answered{0};
  std::atomic<int> wrong{0};  // answers that are not 2*n, or arrive off the loop's drain()
  bus::Bus bus(bus::Options().executors(2));
  auto server = bus.serve(twice, [](int v) { return 2 * v; });
  Loop loop(bus, [&](bus::ExternalInbox& inbox, std::vector<bus::Subscription>& subs) {
    // Each trigger, handled inside drain(), asks the executor and is answered in a later drain().
    subs.push_back(inbox.subscribe(triggers, [&](const int& n) {
      bus.request(twice, n, 30s, [&, n](absl::StatusOr<int> r) {
        if (!r.ok() || *r != 2 * n || !t_on_loop || !t_in_drain) wrong.fetch_add(1);
        answered.fetch_add(1);
      });
    }));
  });
  for (int n = 0; n < 100; ++n) ASSERT_TRUE(bus.publish(triggers, n).ok());
  ASSERT_TRUE(eventually([&] { return answered.load() == 100; }));
  EXPECT_EQ(wrong.load(), 0);
}

TEST(ExternalInbox, DeadlineExceededIsDeliveredInsideDrain) {
  struct Answer {
    std::atomic<bool> done{false};
    absl::StatusCode code = absl::StatusCode::kUnknown;
    std::thread::id thread;
    bool in_drain = false;
  };
  Answer answer;
  Gate gate;
  bus::Bus bus(bus::Options().executors(2));
  // The handler replies only once the test saw the deadline pass: never in time.
  auto server = bus.serve(
      stalled,
      [&](int v) {
        gate.wait();
        return v;
      },
      bus::on_executor(0));
  OpenOnExit open_on_exit{gate};  // before `server` goes: its cancel waits for the handler
  Loop loop(bus, [&](bus::ExternalInbox&, std::vector<bus::Subscription>&) {
    bus.request(stalled, 1, 50ms, [&](absl::StatusOr<int> r) {
      answer.code = r.status().code();
      answer.thread = std::this_thread::get_id();
      answer.in_drain = t_in_drain;
      answer.done.store(true);
    });
  });
  ASSERT_TRUE(eventually([&] { return answer.done.load(); }));
  gate.open();
  EXPECT_EQ(answer.code, absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(answer.thread, loop.id());
  EXPECT_TRUE(answer.in_drain);
}

TEST(ExternalInbox, ParkedLoopIsWokenByAPublish) {
  std::atomic<int> received{0};
  std::atomic<int> woken_from_timeout{-2};  // the timeout of the poll() the message ended
  bus::Bus bus(bus::Options().executors(2));
  Loop loop(bus, [&](bus::ExternalInbox& inbox, std::vector<bus::Subscription>& subs) {
    subs.push_back(inbox.subscribe(wakeups, [&](const int&) {
      woken_from_timeout.store(t_last_poll_timeout);
      received.fetch_add(1);
    }));
  });
  // The loop has no timer: it polls with no timeout, and only the eventfd can end that poll.
  ASSERT_TRUE(eventually([&] { return loop.polls() >= 1; }));
  ASSERT_TRUE(bus.publish(wakeups, 7).ok());
  ASSERT_TRUE(eventually([&] { return received.load() == 1; }));
  EXPECT_EQ(woken_from_timeout.load(), -1);
}

TEST(ExternalInbox, SubscriptionGetsWhatAnotherThreadPublishesAfterItReturned) {
  bus::Bus bus(bus::Options().executors(2));
  bus::ExternalInbox inbox(bus);  // this thread is its loop: it drains by hand below
  std::vector<int> got;
  std::atomic<int> step{0};
  bus::Subscription first;
  std::thread publisher([&] {
    // This thread's ring to the inbox is created first, so drain() reads it first.
    first = inbox.subscribe(earlier, [](const int&) {});
    step.store(1);
    step.notify_all();
    while (step.load() != 2) step.wait(1);
    EXPECT_TRUE(bus.publish(later, 7).ok());  // published after subscribe() below returned
  });
  while (step.load() != 1) step.wait(0);
  auto second = inbox.subscribe(later, [&](const int& v) { got.push_back(v); });
  step.store(2);
  step.notify_all();
  publisher.join();
  while (inbox.drain() > 0) {
  }
  EXPECT_EQ(got, std::vector<int>{7});
  // Were it lost, the counters would have to say so.
  bus::Stats stats = bus.stats();
  const bus::ChannelStats* c = stats.channel("external_inbox_test.later");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->published, 1u);
  EXPECT_EQ(c->delivered + c->dropped + c->failed + c->unrouted, 1u);
}

TEST(ExternalInbox, UndrainedMessagesAreReleasedWhenTheBusGoes) {
  // A loop that never drains: what waits in its rings is destroyed with the bus, after the
  // executors stopped and before the channel state the records point to.
  auto token = std::make_shared<int>(7);
  {
    bus::Bus bus(bus::Options().executors(1));
    bus::ExternalInbox inbox(bus);
    auto sub = inbox.subscribe(tokens, [](const std::shared_ptr<int>&) {});
    std::thread producer([&] {
      for (int i = 0; i < 100; ++i) ASSERT_TRUE(bus.publish(tokens, token).ok());
    });
    producer.join();
    EXPECT_GT(token.use_count(), 1);
    sub.release();  // its cancel would go through the same undrained inbox
  }
  EXPECT_EQ(token.use_count(), 1);
}

}  // namespace
