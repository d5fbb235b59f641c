// The chaos driver: every public operation of the core at once, at random, from plain threads
// and from handlers on every executor (publish in every form, send, request, call, subscribe and
// cancel from inside and outside handlers, services started and stopped, timers set and
// cancelled, Batches, Publishers, repliers answered late or never), then stop() at a random
// moment. Afterwards the README's guarantees are checked as invariants:
//
// - no hang: a watchdog fails the run;
// - steady subscribers got every message accepted for them exactly once and in each producer's
//   order (under the drop policy: an in-order subsequence, the rest counted as dropped);
// - every queue message accepted was consumed exactly once;
// - every request and call ended exactly once, with the right answer or a status, no later than
//   its deadline plus kLateBound;
// - no handler, timer or service handler started after the cancel or stop of it returned, and
//   churned subscribers got each producer's messages in order;
// - the counters: every message offered has one outcome per subscriber (docs/core.md, Stats).
//
// Random choices come from a seed (printed); by hand, longer:
//   BUS_CHAOS_SEED=7 BUS_CHAOS_ROUNDS=200 BUS_CHAOS_OPS=20000 build/tests/chaos_test
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bus/detail/sync.hpp"
#include "support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

struct Msg {
  uint32_t producer;
  uint32_t seq;  // from 1, per (producer, channel)
};

// Channels whose subscribers stay for the whole run (the exact checks), and the churned ones.
inline const bus::Topic<Msg> blocking{"chaos.blocking"};
inline const bus::Topic<Msg> dropping{"chaos.dropping", bus::Overflow::kDropNewest};
inline const bus::Topic<Msg> failing{"chaos.failing", bus::Overflow::kFail};
inline const bus::Topic<Msg> churned{"chaos.churned"};
inline const bus::Topic<uint32_t> kicks{"chaos.kicks"};  // an executor's agent: do something
inline const bus::Queue<Msg> jobs{"chaos.jobs"};
inline const bus::Endpoint<uint32_t, uint32_t> asks{"chaos.asks"};  // answer: 2 * id + 1

constexpr int kExecutors = 3;
constexpr int kPlainThreads = 3;
constexpr int kProducers = kPlainThreads + kExecutors;  // plain threads first, then executors
enum Stream { kBlocking, kDropping, kFailing, kChurned, kJobs, kStreams };
const bus::Topic<Msg>* const kTopics[] = {&blocking, &dropping, &failing, &churned};

/// How late a request may end after its deadline. The design bound is the handler running on
/// the requester's own thread when the deadline comes (a callback never preempts one) plus a
/// timer pass; handlers here run for microseconds, so this only absorbs a loaded 2-core machine
/// (and the sanitizers): a request that waits on anything unbounded misses it by far.
constexpr auto kLateBound = std::chrono::seconds(2);

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::strtoull(v, nullptr, 10) : fallback;
}

/// How an offer ended, as the publisher saw it.
enum class Fate : uint8_t { kAccepted, kPartly, kRefused };  // OK; ResourceExhausted; other
Fate fate_of(const absl::Status& s) {
  if (s.ok()) return Fate::kAccepted;
  return s.code() == absl::StatusCode::kResourceExhausted ? Fate::kPartly : Fate::kRefused;
}
struct Offer {
  uint32_t seq;
  Fate fate;
};

struct Violations {
  std::atomic<int> started_after_cancel{0};
  std::atomic<int> started_after_stop{0};
  std::atomic<int> timer_after_cancel{0};
  std::atomic<int> churned_out_of_order{0};
  std::atomic<int> wrong_answer{0};
  std::atomic<int> call_on_executor_not_refused{0};
};

struct RequestLog {
  std::atomic<int> completions{0};
  std::atomic<int> code{-1};
  Clock::time_point deadline;
  std::atomic<int64_t> late_ns{0};
  bool from_service = false;  // Service::request: no callback once the service stopped
};

/// A registration someone may cancel: whoever takes `sub` out cancels it.
struct Registration {
  std::mutex mu;
  std::optional<bus::Subscription> sub;
  std::atomic<bool> cancel_returned{false};
  uint32_t last_seq[kProducers] = {};  // the handler's thread only: per-producer order
};

struct Run;

/// A service that runs, serves and ticks until someone stops it.
struct Worker {
  Run* run;
  struct ServiceRecord* record;
  uint64_t seen = 0;
  void on_churned(const Msg& m);
  uint32_t answer(uint32_t&& id);
  void tick();
};
struct ServiceRecord {
  std::mutex mu;
  std::optional<bus::Service<Worker>> service;
  std::atomic<bool> stop_returned{false};
};

struct TimerRecord {
  bus::TimerId id;
  bool periodic = false;
  std::atomic<bool> taken{false};
  std::atomic<bool> cancel_returned{false};
  std::atomic<int> fired{0};
};

/// One round: a bus, its steady subscribers, and every log the checks read.
struct Run {
  explicit Run(uint64_t seed, std::size_t ops)
      : seed(seed),
        ops(ops),
        bus(bus::Options()
                .executors(kExecutors)
                .ring_bytes(std::size_t{512} << (seed % 4))  // full rings, often
                .executor_backlog(64 + seed % 512)),
        requests(std::make_unique<RequestLog[]>(kMaxRequests)) {}

  static constexpr std::size_t kMaxRequests = 1 << 17;
  const uint64_t seed;
  const std::size_t ops;
  bus::Bus bus;
  Violations bad;
  std::atomic<uint64_t> ops_done{0};

  // Offers per producer and stream, in order. A plain thread writes its own; an executor's are
  // written on that executor only (read after stop(), once the executors are joined).
  std::vector<Offer> offers[kProducers][kStreams];
  uint32_t next_seq[kProducers][kStreams] = {};

  // Steady subscribers' receipts (each written by its handler's thread only).
  struct Steady {
    const bus::Topic<Msg>* topic;
    Stream stream;
    std::vector<Msg> got;
  };
  std::deque<Steady> steady;
  std::vector<Msg> consumed_steady;  // the steady consumer of `jobs`

  // Churned registrations, cancelled by anyone; kept for the run (a handler in its last call may
  // still look at its record after the cancel returned: see Subscription).
  std::mutex mu;  // guards the lists below; never held across a bus call
  std::vector<std::shared_ptr<Registration>> live;
  std::vector<std::shared_ptr<Registration>> all;
  std::vector<std::shared_ptr<ServiceRecord>> services_live;
  std::vector<std::shared_ptr<ServiceRecord>> services_all;
  std::vector<std::shared_ptr<TimerRecord>> timers_live;
  std::vector<std::shared_ptr<TimerRecord>> timers_all;
  std::deque<std::pair<uint32_t, bus::Replier<uint32_t>>> kept;  // the async server's, unanswered
  std::vector<std::vector<Msg>*> consumer_logs;  // every churned consumer's receipts

  std::atomic<uint32_t> next_request{0};
  std::unique_ptr<RequestLog[]> requests;

  std::mt19937_64 executor_rng[kExecutors];

  uint32_t producer_of_this_thread(int plain_index) const {
    if (auto e = bus.current_executor()) return kPlainThreads + *e;
    return static_cast<uint32_t>(plain_index);
  }

  // ---- operations, from any thread ----------------------------------------------------------

  void offer(uint32_t producer, Stream s, uint32_t seq, const absl::Status& st) {
    offers[producer][s].push_back({seq, fate_of(st)});
  }
  void publish(uint32_t producer, Stream s, std::mt19937_64& rng,
               bus::Publisher<Msg>* handle = nullptr) {
    uint32_t seq = ++next_seq[producer][s];
    absl::Status st = handle != nullptr && rng() % 2 == 0
                          ? handle->publish(Msg{producer, seq})
                          : bus.publish(*kTopics[s], Msg{producer, seq});
    offer(producer, s, seq, st);
  }
  void publish_bulk(uint32_t producer, std::mt19937_64& rng) {
    std::vector<Msg> msgs(1 + rng() % 40);
    for (auto& m : msgs) m = Msg{producer, ++next_seq[producer][kBlocking]};
    absl::Status st = bus.publish_bulk(blocking, std::span<const Msg>(msgs));
    for (const auto& m : msgs) offer(producer, kBlocking, m.seq, st);
  }
  void send(uint32_t producer) {
    uint32_t seq = ++next_seq[producer][kJobs];
    offer(producer, kJobs, seq, bus.send(jobs, Msg{producer, seq}));
  }

  uint32_t new_request(Clock::duration timeout, bool from_service = false) {
    uint32_t id = next_request.fetch_add(1);
    if (id >= kMaxRequests) return UINT32_MAX;
    requests[id].deadline = Clock::now() + timeout;
    requests[id].from_service = from_service;
    return id;
  }
  void complete(uint32_t id, const absl::StatusOr<uint32_t>& r) {
    RequestLog& log = requests[id];
    log.late_ns.store(std::max<int64_t>(
        0,
        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - log.deadline).count()));
    log.code.store(static_cast<int>(r.status().code()));
    if (r.ok() && *r != 2 * id + 1) bad.wrong_answer++;
    log.completions++;
  }
  Clock::duration random_timeout(std::mt19937_64& rng) {
    switch (rng() % 4) {
      case 0: return std::chrono::microseconds(rng() % 500);  // expires, often at the server
      case 1: return std::chrono::milliseconds(1 + rng() % 20);
      default: return std::chrono::milliseconds(200 + rng() % 800);
    }
  }
  void request(std::mt19937_64& rng) {
    uint32_t id = new_request(random_timeout(rng));
    if (id == UINT32_MAX) return;
    bus.request(asks, id, requests[id].deadline - Clock::now(),
                [this, id](absl::StatusOr<uint32_t> r) { complete(id, r); });
  }
  void call(std::mt19937_64& rng) {
    uint32_t id = new_request(random_timeout(rng));
    if (id == UINT32_MAX) return;
    absl::StatusOr<uint32_t> r = bus.call(asks, id, requests[id].deadline - Clock::now());
    if (bus.current_executor()) {
      // Refused on an executor (it would block it): still one completion.
      if (r.status().code() != absl::StatusCode::kFailedPrecondition) {
        bad.call_on_executor_not_refused++;
      }
    }
    complete(id, r);
  }

  bus::Placement anywhere(std::mt19937_64& rng) { return bus::on_executor(rng() % kExecutors); }

  void add_live(std::shared_ptr<Registration> r) {
    std::lock_guard lock(mu);
    live.push_back(r);
    all.push_back(std::move(r));
  }
  /// A churned subscriber, consumer or server, on a random executor; its handler may cancel
  /// itself or others, publish, or request.
  void register_one(std::mt19937_64& rng) {
    auto r = std::make_shared<Registration>();
    Registration* raw = r.get();
    std::lock_guard hold(r->mu);  // its handler cancels itself only once `sub` is set
    switch (rng() % 3) {
      case 0:
        r->sub.emplace(bus.subscribe(
            churned,
            [this, raw](const Msg& m) {
              if (raw->cancel_returned.load()) bad.started_after_cancel++;
              if (m.seq <= raw->last_seq[m.producer]) bad.churned_out_of_order++;
              raw->last_seq[m.producer] = m.seq;
              act_in_handler(raw);
            },
            anywhere(rng)));
        break;
      case 1: {
        auto* log = new std::vector<Msg>;  // owned by consumer_logs' run
        {
          std::lock_guard lock(mu);
          consumer_logs.push_back(log);
        }
        r->sub.emplace(bus.consume(
            jobs,
            [this, raw, log](Msg&& m) {
              if (raw->cancel_returned.load()) bad.started_after_cancel++;
              log->push_back(m);
              act_in_handler(raw);
            },
            anywhere(rng)));
        break;
      }
      default:
        r->sub.emplace(bus.serve(
            asks,
            [this, raw](uint32_t&& id) {
              if (raw->cancel_returned.load()) bad.started_after_cancel++;
              act_in_handler(raw);
              return 2 * id + 1;
            },
            anywhere(rng)));
        break;
    }
    add_live(std::move(r));
  }
  static void cancel(Registration& r) {
    std::optional<bus::Subscription> s;
    {
      std::lock_guard lock(r.mu);
      s.swap(r.sub);
    }
    if (!s) return;
    s->cancel();
    r.cancel_returned.store(true);
  }
  void cancel_random(std::mt19937_64& rng) {
    std::shared_ptr<Registration> r;
    {
      std::lock_guard lock(mu);
      if (live.empty()) return;
      std::size_t i = rng() % live.size();
      r = live[i];
      live[i] = live.back();
      live.pop_back();
    }
    cancel(*r);
  }

  void start_service(std::mt19937_64& rng) {
    auto rec = std::make_shared<ServiceRecord>();
    auto s = bus.service<Worker>(anywhere(rng), Worker{this, rec.get()});
    s.subscribe(churned, &Worker::on_churned)
        .serve(asks, &Worker::answer)
        .every(std::chrono::microseconds(200 + rng() % 2000), [](Worker& w) { w.tick(); });
    {
      std::lock_guard lock(rec->mu);
      rec->service.emplace(s);
    }
    std::lock_guard lock(mu);
    services_live.push_back(rec);
    services_all.push_back(std::move(rec));
  }
  static void stop(ServiceRecord& rec) {
    std::optional<bus::Service<Worker>> s;
    {
      std::lock_guard lock(rec.mu);
      s.swap(rec.service);
    }
    if (!s) return;
    s->stop();
    rec.stop_returned.store(true);
  }
  void stop_random_service(std::mt19937_64& rng) {
    std::shared_ptr<ServiceRecord> rec;
    {
      std::lock_guard lock(mu);
      if (services_live.empty()) return;
      std::size_t i = rng() % services_live.size();
      rec = services_live[i];
      services_live[i] = services_live.back();
      services_live.pop_back();
    }
    stop(*rec);
  }

  void set_timer(std::mt19937_64& rng) {
    auto t = std::make_shared<TimerRecord>();
    t->periodic = rng() % 2 == 0;
    TimerRecord* raw = t.get();
    auto fn = [this, raw] {
      if (raw->cancel_returned.load()) bad.timer_after_cancel++;
      raw->fired++;
    };
    auto delay = std::chrono::microseconds(rng() % 3000);
    t->id = t->periodic ? bus.every(anywhere(rng), delay + 100us, fn)
                        : bus.after(anywhere(rng), delay, fn);
    std::lock_guard lock(mu);
    timers_live.push_back(t);
    timers_all.push_back(std::move(t));
  }
  void cancel_random_timer(std::mt19937_64& rng) {
    std::shared_ptr<TimerRecord> t;
    {
      std::lock_guard lock(mu);
      if (timers_live.empty()) return;
      std::size_t i = rng() % timers_live.size();
      t = timers_live[i];
      timers_live[i] = timers_live.back();
      timers_live.pop_back();
    }
    if (t->taken.exchange(true)) return;
    bus.cancel(t->id);
    t->cancel_returned.store(true);
  }

  /// Answers one request the async server kept, or drops its replier unanswered (Internal).
  void answer_kept(std::mt19937_64& rng) {
    std::optional<std::pair<uint32_t, bus::Replier<uint32_t>>> r;
    {
      std::lock_guard lock(mu);
      if (kept.empty()) return;
      r.emplace(std::move(kept.front()));
      kept.pop_front();
    }
    if (rng() % 4 != 0) r->second(2 * r->first + 1);
  }

  // ---- what handlers do ------------------------------------------------------------------------

  /// A churned handler: now and then cancels itself or another registration, or sends.
  void act_in_handler(Registration* self) {
    auto e = bus.current_executor();
    if (!e) return;
    std::mt19937_64& rng = executor_rng[*e];
    switch (rng() % 16) {
      case 0: cancel(*self); break;  // from its own handler: no call after this one
      case 1: cancel_random(rng); break;
      case 2: publish(kPlainThreads + *e, kChurned, rng); break;
      case 3: request(rng); break;
      default: break;
    }
  }

  /// An executor's agent, kicked by the plain threads: any operation an executor may make.
  void agent(uint32_t) {
    unsigned e = *bus.current_executor();
    std::mt19937_64& rng = executor_rng[e];
    uint32_t producer = kPlainThreads + e;
    switch (rng() % 14) {
      case 0: publish(producer, kBlocking, rng); break;
      case 1: publish(producer, kDropping, rng); break;
      case 2: publish(producer, kFailing, rng); break;
      case 3: publish(producer, kChurned, rng); break;
      case 4: send(producer); break;
      case 5: request(rng); break;
      case 6: register_one(rng); break;
      case 7: cancel_random(rng); break;
      case 8: stop_random_service(rng); break;
      case 9: set_timer(rng); break;
      case 10: cancel_random_timer(rng); break;
      case 11: answer_kept(rng); break;
      case 12: call(rng); break;  // refused on an executor
      default: {
        bus::Batch batch(bus);  // a Batch on an executor: published at its end, as usual
        for (int i = 0; i < 4; ++i) publish(producer, kBlocking, rng);
        break;
      }
    }
  }

  // ---- the plain threads ---------------------------------------------------------------------

  void plain_thread(int index) {
    std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(index));
    const auto producer = static_cast<uint32_t>(index);
    std::optional<bus::Publisher<Msg>> handles[3];
    for (int s = 0; s < 3; ++s) handles[s].emplace(bus.publisher(*kTopics[s]));
    std::optional<bus::Batch> batch;
    for (std::size_t op = 0; op < ops; ++op, ops_done++) {
      switch (rng() % 20) {
        case 0:
        case 1:
        case 2: {
          auto s = static_cast<Stream>(rng() % 3);
          publish(producer, s, rng, &*handles[s]);
          break;
        }
        case 3: publish(producer, kChurned, rng); break;
        case 4: send(producer); break;
        case 5: publish_bulk(producer, rng); break;
        case 6:
          if (!batch) break;
          batch.reset();  // what the Batch held is published now
          break;
        case 7:
          if (batch) break;
          batch.emplace(bus);
          break;
        case 8:
          batch.reset();  // a request made in a Batch leaves when the Batch ends
          request(rng);
          break;
        case 9:
          batch.reset();  // a call inside a Batch publishes the Batch first; either is fine
          call(rng);
          break;
        case 10: register_one(rng); break;
        case 11: cancel_random(rng); break;
        case 12: start_service(rng); break;
        case 13: stop_random_service(rng); break;
        case 14: set_timer(rng); break;
        case 15: cancel_random_timer(rng); break;
        case 16: answer_kept(rng); break;
        default: {
          uint32_t to = static_cast<uint32_t>(rng());
          (void)bus.publish(kicks, to);
          break;
        }
      }
    }
  }
};

void Worker::on_churned(const Msg&) {
  if (record->stop_returned.load()) run->bad.started_after_stop++;
  ++seen;
}
uint32_t Worker::answer(uint32_t&& id) {
  if (record->stop_returned.load()) run->bad.started_after_stop++;
  return 2 * id + 1;
}
void Worker::tick() {
  if (record->stop_returned.load()) run->bad.started_after_stop++;
  auto e = run->bus.current_executor();
  std::mt19937_64& rng = run->executor_rng[*e];
  switch (rng() % 8) {
    case 0: Run::stop(*record); break;  // a service stopping itself from its own timer
    case 1: run->stop_random_service(rng); break;
    case 2: {
      std::optional<bus::Service<Worker>> self;
      {
        std::lock_guard lock(record->mu);
        self = record->service;
      }
      uint32_t id = run->new_request(run->random_timeout(rng), /*from_service=*/true);
      if (!self || id == UINT32_MAX) break;
      Run* r = run;
      self->request(asks, id, r->requests[id].deadline - Clock::now(),
                    [r, id](Worker&, absl::StatusOr<uint32_t> rep) { r->complete(id, rep); });
      break;
    }
    default: break;
  }
}

/// The offers a subscriber had to get, against what it got (one producer's stream, in order).
struct StreamCheck {
  int missing = 0;       // accepted, not received (not for the drop policy)
  int unexpected = 0;    // received, never offered (or refused outright)
  int out_of_order = 0;  // received out of the producer's order, or twice
};
StreamCheck check_stream(const std::vector<Offer>& offered, const std::vector<uint32_t>& got,
                         bool accepted_means_received) {
  StreamCheck c;
  std::size_t i = 0;
  uint32_t last = 0;
  for (uint32_t seq : got) {
    if (seq <= last) {
      c.out_of_order++;
      continue;
    }
    last = seq;
    // Offers before this one that were accepted must have arrived.
    for (; i < offered.size() && offered[i].seq < seq; ++i) {
      if (accepted_means_received && offered[i].fate == Fate::kAccepted) c.missing++;
    }
    if (i == offered.size() || offered[i].seq != seq || offered[i].fate == Fate::kRefused) {
      c.unexpected++;
      continue;
    }
    ++i;
  }
  for (; i < offered.size(); ++i) {
    if (accepted_means_received && offered[i].fate == Fate::kAccepted) c.missing++;
  }
  return c;
}

void run_round(uint64_t seed, std::size_t ops) {
  SCOPED_TRACE("reproduce with BUS_CHAOS_SEED=" + std::to_string(seed) +
               " BUS_CHAOS_ROUNDS=1 BUS_CHAOS_OPS=" + std::to_string(ops));
  bus_test::Watchdog watchdog("chaos round with seed " + std::to_string(seed), 300s);
  auto run = std::make_unique<Run>(seed, ops);
  Run& r = *run;
  std::mt19937_64 rng(seed);
  for (int e = 0; e < kExecutors; ++e) r.executor_rng[e].seed(seed * 7919 + e);

  // Steady subscribers, consumer and servers: there for the whole run.
  std::vector<bus::Subscription> steady_subs;
  auto add_steady = [&](const bus::Topic<Msg>& t, Stream s, unsigned e) {
    auto& st = r.steady.emplace_back(Run::Steady{&t, s, {}});
    steady_subs.push_back(r.bus.subscribe(
        t, [&st](const Msg& m) { st.got.push_back(m); }, bus::on_executor(e)));
  };
  add_steady(blocking, kBlocking, 0);
  add_steady(blocking, kBlocking, 1);
  {
    auto& st = r.steady.emplace_back(Run::Steady{&blocking, kBlocking, {}});
    steady_subs.push_back(r.bus.subscribe_bulk(
        blocking,
        [&st](std::span<const Msg> ms) { st.got.insert(st.got.end(), ms.begin(), ms.end()); },
        bus::on_executor(2)));
  }
  add_steady(dropping, kDropping, 0);
  add_steady(dropping, kDropping, 2);
  add_steady(failing, kFailing, 1);
  add_steady(failing, kFailing, 2);
  for (unsigned e = 0; e < kExecutors; ++e) {
    steady_subs.push_back(r.bus.subscribe(
        kicks, [&r](const uint32_t& k) { r.agent(k); }, bus::on_executor(e)));
  }
  steady_subs.push_back(r.bus.consume(
      jobs, [&r](Msg&& m) { r.consumed_steady.push_back(m); }, bus::on_executor(1)));
  steady_subs.push_back(r.bus.serve(
      asks, [](uint32_t&& id) { return 2 * id + 1; }, bus::on_executor(0)));
  steady_subs.push_back(r.bus.serve_async(
      asks,
      [&r](uint32_t&& id, bus::Replier<uint32_t> reply) {
        if (r.executor_rng[2]() % 3 == 0) return reply(2 * id + 1);  // now
        std::lock_guard lock(r.mu);
        r.kept.emplace_back(id, std::move(reply));  // later, by anyone, or never
      },
      bus::on_executor(2)));

  // The plain threads, and stop() once a random share of their work is done.
  std::vector<std::thread> threads;
  for (int t = 0; t < kPlainThreads; ++t) threads.emplace_back([&r, t] { r.plain_thread(t); });
  const uint64_t stop_after = rng() % (ops * kPlainThreads + 1);
  while (r.ops_done.load() < stop_after) std::this_thread::yield();
  ASSERT_TRUE(r.bus.stop().ok());
  for (auto& t : threads) t.join();
  // Repliers still kept answer nobody now (the bus stopped); their callers were told.
  {
    std::lock_guard lock(r.mu);
    r.kept.clear();
  }

  // ---- the invariants ------------------------------------------------------------------------
  EXPECT_EQ(r.bad.started_after_cancel.load(), 0) << "a handler started after its cancel returned";
  EXPECT_EQ(r.bad.started_after_stop.load(), 0)
      << "a service handler started after stop() returned";
  EXPECT_EQ(r.bad.timer_after_cancel.load(), 0) << "a timer fired after its cancel returned";
  EXPECT_EQ(r.bad.churned_out_of_order.load(), 0) << "a churned subscriber lost a producer's order";
  EXPECT_EQ(r.bad.wrong_answer.load(), 0);
  EXPECT_EQ(r.bad.call_on_executor_not_refused.load(), 0);

  for (const auto& st : r.steady) {
    for (int p = 0; p < kProducers; ++p) {
      std::vector<uint32_t> got;
      for (const Msg& m : st.got) {
        if (m.producer == static_cast<uint32_t>(p)) got.push_back(m.seq);
      }
      StreamCheck c = check_stream(r.offers[p][st.stream], got, st.stream != kDropping);
      EXPECT_EQ(c.missing, 0) << st.topic->name() << ", producer " << p;
      EXPECT_EQ(c.unexpected, 0) << st.topic->name() << ", producer " << p;
      EXPECT_EQ(c.out_of_order, 0) << st.topic->name() << ", producer " << p;
    }
  }

  // Every job accepted was consumed once, by one consumer.
  std::vector<std::pair<uint32_t, uint32_t>> consumed;
  for (const Msg& m : r.consumed_steady) consumed.emplace_back(m.producer, m.seq);
  for (auto* log : r.consumer_logs) {
    for (const Msg& m : *log) consumed.emplace_back(m.producer, m.seq);
    delete log;
  }
  std::sort(consumed.begin(), consumed.end());
  EXPECT_EQ(std::adjacent_find(consumed.begin(), consumed.end()), consumed.end())
      << "a job was consumed twice";
  std::vector<std::pair<uint32_t, uint32_t>> accepted_jobs;
  for (int p = 0; p < kProducers; ++p) {
    for (const Offer& o : r.offers[p][kJobs]) {
      if (o.fate == Fate::kAccepted) accepted_jobs.emplace_back(p, o.seq);
    }
  }
  std::sort(accepted_jobs.begin(), accepted_jobs.end());
  EXPECT_TRUE(
      std::includes(consumed.begin(), consumed.end(), accepted_jobs.begin(), accepted_jobs.end()))
      << "an accepted job was not consumed";

  // Every request ended once, by its deadline (plus kLateBound).
  const uint32_t issued = std::min<uint32_t>(r.next_request.load(), Run::kMaxRequests);
  int never = 0, twice = 0, late = 0;
  int64_t latest_ns = 0;
  for (uint32_t id = 0; id < issued; ++id) {
    const RequestLog& log = r.requests[id];
    int n = log.completions.load();
    if (n == 0 && !log.from_service) never++;
    if (n > 1) twice++;
    if (n > 0 && log.late_ns.load() > std::chrono::nanoseconds(kLateBound).count()) late++;
    latest_ns = std::max<int64_t>(latest_ns, log.late_ns.load());
  }
  EXPECT_EQ(never, 0) << "requests that never ended, of " << issued;
  EXPECT_EQ(twice, 0) << "requests that ended twice";
  EXPECT_EQ(late, 0) << "requests that ended later than their deadline + kLateBound (latest: "
                     << latest_ns / 1000000 << " ms)";

  for (const auto& t : r.timers_all) {
    if (!t->periodic) EXPECT_LE(t->fired.load(), 1);
  }

  // The counters: one outcome per message offered and subscriber (docs/core.md, Stats).
  bus::Stats stats = r.bus.stats();
  auto counters = [&](const char* name) {
    const bus::ChannelStats* c = stats.channel(name);
    return c != nullptr ? *c : bus::ChannelStats{};
  };
  auto topic_identity = [&](const char* name, uint64_t subscribers) {
    bus::ChannelStats c = counters(name);
    EXPECT_EQ(c.published * subscribers, c.delivered + c.handler_failed + c.dropped + c.failed)
        << name;
  };
  topic_identity("chaos.blocking", 3);
  topic_identity("chaos.dropping", 2);
  topic_identity("chaos.failing", 2);
  topic_identity("chaos.kicks", kExecutors);
  bus::ChannelStats j = counters("chaos.jobs");
  EXPECT_EQ(j.published, j.delivered + j.handler_failed + j.dropped + j.failed + j.unrouted);
  bus::ChannelStats a = counters("chaos.asks");
  EXPECT_EQ(a.published,
            a.delivered + a.handler_failed + a.expired + a.unrouted + a.dropped + a.failed);
  uint64_t offered_blocking = 0;
  for (int p = 0; p < kProducers; ++p) {
    for (const Offer& o : r.offers[p][kBlocking]) offered_blocking += o.fate != Fate::kRefused;
  }
  EXPECT_EQ(counters("chaos.blocking").published, offered_blocking);

  if (env_or("BUS_CHAOS_VERBOSE", 0) != 0) {
    std::printf(
        "chaos: seed %llu: stop after %llu ops; blocking %llu published, %llu delivered; jobs "
        "%llu; "
        "asks %llu published, %llu expired, %llu late, %llu unrouted; %u requests; %zu "
        "registrations, %zu services, %zu timers\n",
        static_cast<unsigned long long>(seed), static_cast<unsigned long long>(stop_after),
        static_cast<unsigned long long>(counters("chaos.blocking").published),
        static_cast<unsigned long long>(counters("chaos.blocking").delivered),
        static_cast<unsigned long long>(j.published), static_cast<unsigned long long>(a.published),
        static_cast<unsigned long long>(a.expired), static_cast<unsigned long long>(a.late_replies),
        static_cast<unsigned long long>(a.unrouted), issued, r.all.size(), r.services_all.size(),
        r.timers_all.size());
  }

  // The bus goes first (its handlers look at the records); the records after.
  steady_subs.clear();
  run.reset();
}

TEST(Chaos, EveryGuaranteeHoldsUnderRandomUseOfEveryOperation) {
  const uint64_t seed0 = env_or("BUS_CHAOS_SEED", std::random_device{}());
  // The same size in every build (15 s under ThreadSanitizer here, 11 s without): each round
  // is a few thousand operations, which the sanitizers slow less than the stress test's millions.
  const uint64_t rounds = env_or("BUS_CHAOS_ROUNDS", 30);
  const std::size_t ops = env_or("BUS_CHAOS_OPS", 5000);
  std::printf("chaos: seed %llu, %llu rounds of %zu operations per plain thread\n",
              static_cast<unsigned long long>(seed0), static_cast<unsigned long long>(rounds), ops);
  for (uint64_t round = 0; round < rounds && !HasFailure(); ++round) {
    run_round(seed0 + round, ops);
  }
}

}  // namespace
