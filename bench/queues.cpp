// Internal queue throughput: the bus against the queues a user would reach for instead, in one
// process and one run, interleaved (run r of every case, then run r + 1), pinned to two cores.
//
//   ./build/bench/bus_queues [items=20000000] [runs=5] [round_trips=200000] [filter]
//
// items: per throughput case per run; round_trips: per request/reply case per run (the parking
// case does a tenth); filter: run only the cases whose id or name contains it (several,
// comma-separated: any of them; "=id" selects the case of that id only).
// Every consumer checks what it received (count and sum; order where it applies, per producer
// for 2 -> 1); a mismatch exits with status 1. The peers are optional (see bench/queues.cmake):
// a peer missing at build time skips its cases with a line saying so.
// The last block ("chart|...") is what bench/queues.gnuplot draws.
#include <pthread.h>
#include <sched.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bus/bus.hpp>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#ifndef BUS_QUEUES_HAVE_ATOMIC_QUEUE
#if __has_include(<atomic_queue/atomic_queue.h>)
#define BUS_QUEUES_HAVE_ATOMIC_QUEUE 1
#else
#define BUS_QUEUES_HAVE_ATOMIC_QUEUE 0
#endif
#endif
#ifndef BUS_QUEUES_HAVE_BOOST_LOCKFREE
#if __has_include(<boost/lockfree/spsc_queue.hpp>)
#define BUS_QUEUES_HAVE_BOOST_LOCKFREE 1
#else
#define BUS_QUEUES_HAVE_BOOST_LOCKFREE 0
#endif
#endif
#ifndef BUS_QUEUES_HAVE_READERWRITERQUEUE
#if __has_include(<readerwriterqueue/readerwriterqueue.h>)
#define BUS_QUEUES_HAVE_READERWRITERQUEUE 1
#else
#define BUS_QUEUES_HAVE_READERWRITERQUEUE 0
#endif
#endif
#ifndef BUS_QUEUES_HAVE_CONCURRENTQUEUE
#if __has_include(<concurrentqueue/concurrentqueue.h>)
#define BUS_QUEUES_HAVE_CONCURRENTQUEUE 1
#else
#define BUS_QUEUES_HAVE_CONCURRENTQUEUE 0
#endif
#endif
#ifndef BUS_QUEUES_HAVE_ZMQ
#define BUS_QUEUES_HAVE_ZMQ 0  // needs libzmq at link time: only when CMake found cppzmq
#endif

#if BUS_QUEUES_HAVE_ATOMIC_QUEUE
#include <atomic_queue/atomic_queue.h>
#endif
#if BUS_QUEUES_HAVE_BOOST_LOCKFREE
#include <boost/lockfree/spsc_queue.hpp>
#endif
#if BUS_QUEUES_HAVE_READERWRITERQUEUE
#include <readerwriterqueue/readerwriterqueue.h>
#endif
#if BUS_QUEUES_HAVE_CONCURRENTQUEUE
#include <concurrentqueue/concurrentqueue.h>
#endif
#if BUS_QUEUES_HAVE_ZMQ
#include <zmq.hpp>
#endif

#ifndef BUS_QUEUES_BUILD_TYPE
#define BUS_QUEUES_BUILD_TYPE "unknown"
#endif

#include "plain_ring.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Every bounded queue gets the bus's ring size (Options::ring_bytes default): 64 KiB of items.
constexpr std::size_t kRingBytes = 64 * 1024;
constexpr std::size_t kBulk = 256;       // bulk push/pop of the peers that have it
constexpr uint64_t kChunk = 1024;        // the bus's batched mode: sends per handler run
constexpr uint64_t kBusBatch = 256;      // bus::Batch scope size (plain threads)
constexpr int kProducerCore = 0;         // producers (and bus executor 0)
constexpr int kConsumerCore = 1;         // consumers (and bus executor 1)
constexpr unsigned kProducerShift = 40;  // 2 -> 1: value = producer << 40 | sequence
constexpr uint64_t kSeqMask = (uint64_t{1} << kProducerShift) - 1;

/// The 64-byte message: eight words, all equal, so a torn or partial copy is caught.
struct Item64 {
  uint64_t w[8];
};
static_assert(sizeof(Item64) == 64);

template <class T>
T make(uint64_t v);
template <>
uint64_t make<uint64_t>(uint64_t v) {
  return v;
}
template <>
Item64 make<Item64>(uint64_t v) {
  return Item64{{v, v, v, v, v, v, v, v}};
}

using bench::cpu_relax;

unsigned cores() { return std::max(1u, std::thread::hardware_concurrency()); }

void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(static_cast<unsigned>(core) % cores(), &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

/// Pins the calling thread for a scope, then lets it run anywhere again.
struct PinScope {
  explicit PinScope(int core) { pin_to(core); }
  ~PinScope() {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (unsigned c = 0; c < cores(); ++c) CPU_SET(c, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  }
};

// ---- checking what arrived --------------------------------------------------------------------

std::string g_case;  // the case running, for error messages

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "\nFAILED in case '%s': %s\n", g_case.c_str(), what.c_str());
  std::fflush(stdout);
  std::_Exit(1);
}

/// One producer, values 1..n in order. On its own cache line: the consumer writes it per item.
struct alignas(64) Check {
  uint64_t next = 1, sum = 0, count = 0;
  bool ordered = true, intact = true;
  void take(uint64_t v) {
    ordered &= (v == next);
    ++next;
    sum += v;
    ++count;
  }
  void take(const Item64& it) {
    intact &= (it.w[7] == it.w[0]) & (it.w[3] == it.w[0]);
    take(it.w[0]);
  }
  void verify(uint64_t n) const {
    uint64_t want = n * (n + 1) / 2;
    if (count != n || sum != want || !ordered || !intact) {
      fail("received " + std::to_string(count) + " of " + std::to_string(n) + ", sum " +
           std::to_string(sum) + " (want " + std::to_string(want) + ")" +
           (ordered ? "" : ", out of order") + (intact ? "" : ", torn items"));
    }
  }
};

/// Two producers, values (p << 40 | seq), seq 1..m in order per producer.
struct alignas(64) Check2 {
  uint64_t last[2] = {0, 0};
  uint64_t sum = 0, count = 0;
  bool fifo = true, known = true;
  void take(uint64_t v) {
    uint64_t p = v >> kProducerShift;
    if (p > 1) {
      known = false;
      p = 0;
    }
    uint64_t seq = v & kSeqMask;
    fifo &= (seq == last[p] + 1);
    last[p] = seq;
    sum += v;
    ++count;
  }
  static uint64_t expected_sum(uint64_t m) {
    return 2 * (m * (m + 1) / 2) + (uint64_t{1} << kProducerShift) * m;
  }
  void verify(uint64_t m) const {
    if (count != 2 * m || sum != expected_sum(m) || !fifo || !known) {
      fail("received " + std::to_string(count) + " of " + std::to_string(2 * m) + ", sum " +
           std::to_string(sum) + " (want " + std::to_string(expected_sum(m)) + ")" +
           (fifo ? "" : ", per-producer FIFO broken") + (known ? "" : ", unknown producer"));
    }
  }
};

// ---- results ----------------------------------------------------------------------------------

struct Sample {
  double rate = 0;          // items (or round trips) per second
  double p50 = 0, p99 = 0;  // round trip, ns (latency cases)
};

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

Sample rate_sample(uint64_t items, Clock::time_point t0, Clock::time_point t1) {
  return Sample{static_cast<double>(items) / seconds(t0, t1)};
}

Sample latency_sample(std::vector<double>& ns, double total_seconds) {
  if (ns.empty()) fail("no round trips recorded");
  std::sort(ns.begin(), ns.end());
  Sample s;
  s.rate = static_cast<double>(ns.size()) / total_seconds;
  s.p50 = ns[ns.size() / 2];
  s.p99 = ns[std::min(ns.size() - 1, ns.size() * 99 / 100)];
  return s;
}

// Watchdog: a case that loses items would otherwise spin forever.
std::atomic<int64_t> g_deadline_ns{0};
void arm_watchdog(uint64_t items) {
  auto limit = std::chrono::seconds(60) + std::chrono::microseconds(2 * items);
  g_deadline_ns.store((Clock::now() + limit).time_since_epoch().count());
}
void watchdog() {
  while (true) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
    int64_t d = g_deadline_ns.load();
    if (d != 0 && Clock::now().time_since_epoch().count() > d) {
      fail("timed out (items lost, or the machine is far slower than expected)");
    }
  }
}

/// Runs `consume` on the consumer core and `produce` on the producer core; the time is from the
/// producer's start to the consumer's end.
template <class Produce, class Consume>
Sample run_pair(uint64_t items, Produce produce, Consume consume) {
  Clock::time_point t0, t1;
  std::atomic<bool> consumer_ready{false};
  std::thread c([&] {
    pin_to(kConsumerCore);
    consumer_ready.store(true);
    consume();
    t1 = Clock::now();
  });
  while (!consumer_ready.load()) std::this_thread::yield();
  std::thread p([&] {
    pin_to(kProducerCore);
    t0 = Clock::now();
    produce();
  });
  p.join();
  c.join();
  return rate_sample(items, t0, t1);
}

/// Two producers (both on the producer core), one consumer. Returns the start (both producers
/// released) and the consumer's end.
template <class Produce, class Consume>
std::pair<Clock::time_point, Clock::time_point> run_two_to_one(Produce produce, Consume consume) {
  Clock::time_point t0, t1;
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::thread c([&] {
    pin_to(kConsumerCore);
    ready.fetch_add(1);
    consume();
    t1 = Clock::now();
  });
  std::thread p[2];
  for (int i = 0; i < 2; ++i) {
    p[i] = std::thread([&, i] {
      pin_to(kProducerCore);
      ready.fetch_add(1);
      go.wait(false);
      produce(i);
    });
  }
  while (ready.load() != 3) std::this_thread::yield();
  t0 = Clock::now();
  go.store(true);
  go.notify_all();
  for (auto& t : p) t.join();
  c.join();
  return {t0, t1};
}

// ---- the plain reference ring (bench/plain_ring.hpp) ------------------------------------------

template <class T, uint64_t kEvery>
Sample plain_ring(uint64_t n) {
  auto q = std::make_unique<bench::PlainRing<T, kEvery>>();
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n; ++i) q->push(make<T>(i));
        q->flush();
      },
      [&] {
        while (chk.count < n) {
          if (q->pop_some([&](const T& v) { chk.take(v); }) == 0) cpu_relax();
        }
      });
  chk.verify(n);
  return s;
}

// ---- atomic_queue -----------------------------------------------------------------------------

#if BUS_QUEUES_HAVE_ATOMIC_QUEUE
// Upstream's "OptimistAtomicQueue" is AtomicQueue used through push/pop (busy-wait on the slot,
// no full/empty check); the template parameters in this header are
// <T, SIZE, NIL, MINIMIZE_CONTENTION, MAXIMIZE_THROUGHPUT, TOTAL_ORDER, SPSC> and
// AtomicQueue2<T, SIZE, MINIMIZE_CONTENTION, MAXIMIZE_THROUGHPUT, TOTAL_ORDER, SPSC>.
template <unsigned kSize>
using OptimistAQ = atomic_queue::AtomicQueue<uint64_t, kSize, uint64_t{0}, true, true, false, true>;
template <class T, unsigned kSize>
using OptimistAQ2 = atomic_queue::AtomicQueue2<T, kSize, true, true, false, true>;

template <class Q, class T>
Sample atomic_queue_spsc(uint64_t n) {
  auto q = std::make_unique<Q>();
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n; ++i) q->push(make<T>(i));
      },
      [&] {
        for (uint64_t i = 0; i < n; ++i) chk.take(q->pop());
      });
  chk.verify(n);
  return s;
}

/// Round trip reference: ping (producer core) pushes i, pong (consumer core) answers i + 1.
Sample atomic_queue_ping_pong(uint64_t trips) {
  auto to = std::make_unique<OptimistAQ<1024>>();
  auto back = std::make_unique<OptimistAQ<1024>>();
  uint64_t warm = std::min<uint64_t>(1000, trips / 10), total = trips + warm;
  std::vector<double> ns;
  ns.reserve(trips);
  uint64_t bad = 0;
  std::thread pong([&] {
    pin_to(kConsumerCore);
    for (uint64_t i = 0; i < total; ++i) back->push(to->pop() + 1);
  });
  Clock::time_point start;
  std::thread ping([&] {
    pin_to(kProducerCore);
    start = Clock::now();
    for (uint64_t i = 1; i <= total; ++i) {
      auto t = Clock::now();
      to->push(i);
      uint64_t r = back->pop();
      auto t2 = Clock::now();
      bad += (r != i + 1);
      if (i > warm) ns.push_back(std::chrono::duration<double, std::nano>(t2 - t).count());
    }
  });
  ping.join();
  pong.join();
  double secs = seconds(start, Clock::now());
  if (bad != 0 || ns.size() != trips) fail(std::to_string(bad) + " wrong replies");
  return latency_sample(ns, secs);
}
#endif

// ---- boost::lockfree::spsc_queue --------------------------------------------------------------

#if BUS_QUEUES_HAVE_BOOST_LOCKFREE
template <class T>
using BoostSpsc = boost::lockfree::spsc_queue<T, boost::lockfree::capacity<kRingBytes / sizeof(T)>>;

template <class T>
Sample boost_single(uint64_t n) {
  auto q = std::make_unique<BoostSpsc<T>>();
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n; ++i) {
          T v = make<T>(i);
          while (!q->push(v)) cpu_relax();
        }
      },
      [&] {
        T v;
        while (chk.count < n) {
          if (q->pop(v)) {
            chk.take(v);
          } else {
            cpu_relax();
          }
        }
      });
  chk.verify(n);
  return s;
}

template <class T>
Sample boost_bulk(uint64_t n) {
  auto q = std::make_unique<BoostSpsc<T>>();
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        T buf[kBulk];
        for (uint64_t i = 1; i <= n;) {
          std::size_t k = std::min<uint64_t>(kBulk, n - i + 1);
          for (std::size_t j = 0; j < k; ++j) buf[j] = make<T>(i + j);
          for (std::size_t done = 0; done < k;) {
            std::size_t pushed = q->push(buf + done, k - done);
            if (pushed == 0) cpu_relax();
            done += pushed;
          }
          i += k;
        }
      },
      [&] {
        T buf[kBulk];
        while (chk.count < n) {
          std::size_t got = q->pop(buf, kBulk);
          if (got == 0) cpu_relax();
          for (std::size_t j = 0; j < got; ++j) chk.take(buf[j]);
        }
      });
  chk.verify(n);
  return s;
}
#endif

// ---- moodycamel -------------------------------------------------------------------------------

#if BUS_QUEUES_HAVE_READERWRITERQUEUE
/// Bounded use (try_enqueue never allocates): the capacity is set at construction.
Sample rwq_single(uint64_t n) {
  moodycamel::ReaderWriterQueue<uint64_t> q(kRingBytes / sizeof(uint64_t));
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n; ++i) {
          while (!q.try_enqueue(i)) cpu_relax();
        }
      },
      [&] {
        uint64_t v;
        while (chk.count < n) {
          if (q.try_dequeue(v)) {
            chk.take(v);
          } else {
            cpu_relax();
          }
        }
      });
  chk.verify(n);
  return s;
}
#endif

#if BUS_QUEUES_HAVE_CONCURRENTQUEUE
// ConcurrentQueue is used the way its README suggests: explicit producer tokens and
// enqueue/enqueue_bulk, which allocate blocks as needed (it is unbounded; bounded use with
// try_enqueue and two explicit producers hung in earlier runs here).
Sample cq_single(uint64_t n) {
  moodycamel::ConcurrentQueue<uint64_t> q(kRingBytes / sizeof(uint64_t));
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        moodycamel::ProducerToken tok(q);
        for (uint64_t i = 1; i <= n; ++i) {
          if (!q.enqueue(tok, i)) fail("enqueue failed");
        }
      },
      [&] {
        moodycamel::ConsumerToken tok(q);
        uint64_t v;
        while (chk.count < n) {
          if (q.try_dequeue(tok, v)) {
            chk.take(v);
          } else {
            cpu_relax();
          }
        }
      });
  chk.verify(n);
  return s;
}

/// Producer p sends `count` values base | 1..count, in chunks of kBulk.
void cq_produce_bulk(moodycamel::ConcurrentQueue<uint64_t>& q, uint64_t base, uint64_t count) {
  moodycamel::ProducerToken tok(q);
  uint64_t buf[kBulk];
  for (uint64_t i = 1; i <= count;) {
    std::size_t k = std::min<uint64_t>(kBulk, count - i + 1);
    for (std::size_t j = 0; j < k; ++j) buf[j] = base | (i + j);
    if (!q.enqueue_bulk(tok, buf, k)) fail("enqueue_bulk failed");
    i += k;
  }
}

template <class C>
void cq_consume_bulk(moodycamel::ConcurrentQueue<uint64_t>& q, C& chk, uint64_t n) {
  moodycamel::ConsumerToken tok(q);
  uint64_t buf[kBulk];
  while (chk.count < n) {
    std::size_t got = q.try_dequeue_bulk(tok, buf, kBulk);
    if (got == 0) cpu_relax();
    for (std::size_t j = 0; j < got; ++j) chk.take(buf[j]);
  }
}

Sample cq_bulk(uint64_t n) {
  moodycamel::ConcurrentQueue<uint64_t> q(kRingBytes / sizeof(uint64_t));
  Check chk;
  Sample s = run_pair(
      n, [&] { cq_produce_bulk(q, 0, n); }, [&] { cq_consume_bulk(q, chk, n); });
  chk.verify(n);
  return s;
}

Sample cq_bulk_two_to_one(uint64_t n) {
  moodycamel::ConcurrentQueue<uint64_t> q(kRingBytes / sizeof(uint64_t));
  uint64_t m = n / 2;
  Check2 chk;
  auto [t0, t1] =
      run_two_to_one([&](int p) { cq_produce_bulk(q, uint64_t(p) << kProducerShift, m); },
                     [&] { cq_consume_bulk(q, chk, 2 * m); });
  chk.verify(m);
  return rate_sample(2 * m, t0, t1);
}
#endif

// ---- ZeroMQ -----------------------------------------------------------------------------------

#if BUS_QUEUES_HAVE_ZMQ
Sample zmq_inproc(uint64_t n) {
  zmq::context_t ctx(1);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  pull.bind("inproc://bus-queues");
  push.connect("inproc://bus-queues");
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n; ++i) {
          if (!push.send(zmq::const_buffer(&i, sizeof i), zmq::send_flags::none)) {
            fail("zmq send failed");
          }
        }
      },
      [&] {
        uint64_t v = 0;
        for (uint64_t i = 0; i < n; ++i) {
          auto r = pull.recv(zmq::mutable_buffer(&v, sizeof v), zmq::recv_flags::none);
          if (!r || r->size != sizeof v) fail("zmq recv: bad message");
          chk.take(v);
        }
      });
  chk.verify(n);
  push.set(zmq::sockopt::linger, 0);
  return s;
}
#endif

// ---- std::mutex + std::deque ------------------------------------------------------------------

Sample mutex_deque(uint64_t n) {
  std::mutex mu;
  std::deque<uint64_t> dq;
  constexpr std::size_t kCap = kRingBytes / sizeof(uint64_t);
  Check chk;
  Sample s = run_pair(
      n,
      [&] {
        for (uint64_t i = 1; i <= n;) {
          {
            std::lock_guard lock(mu);
            if (dq.size() < kCap) {
              dq.push_back(i);
              ++i;
              continue;
            }
          }
          cpu_relax();
        }
      },
      [&] {
        while (chk.count < n) {
          uint64_t v = 0;
          bool got = false;
          {
            std::lock_guard lock(mu);
            if (!dq.empty()) {
              v = dq.front();
              dq.pop_front();
              got = true;
            }
          }
          if (got) {
            chk.take(v);
          } else {
            cpu_relax();
          }
        }
      });
  chk.verify(n);
  return s;
}

// ---- the bus ----------------------------------------------------------------------------------

inline const bus::Topic<uint64_t> u64_topic{"bench.queues.u64"};
inline const bus::Topic<Item64> item64_topic{"bench.queues.item64"};
inline const bus::Endpoint<uint64_t, uint64_t> echo{"bench.queues.echo"};

bus::Options bus_options() { return bus::Options().executors(2).pin_executors(true); }

template <class T>
const bus::Topic<T>& topic_of();
template <>
const bus::Topic<uint64_t>& topic_of<uint64_t>() {
  return u64_topic;
}
template <>
const bus::Topic<Item64>& topic_of<Item64>() {
  return item64_topic;
}

/// Set by the last handler to finish; the waiting thread sleeps on it (no spinning).
struct Done {
  std::atomic<bool> flag{false};
  Clock::time_point at;
  void set() {
    at = Clock::now();
    flag.store(true, std::memory_order_release);
    flag.notify_all();
  }
  void wait() { flag.wait(false, std::memory_order_acquire); }
};

/// A plain thread (on executor 0's core; that executor stays parked) publishes per message to
/// one subscriber on executor 1: with Bus::publish, or (`kHandle`) a bus::Publisher; with
/// `kInBatch`, inside a bus::Batch of kBusBatch messages (the explicit batch scope).
template <class T, bool kHandle = false, bool kInBatch = false>
Sample bus_publish(uint64_t n) {
  bus::Bus b(bus_options());
  Check chk;
  Done done;
  auto sub = b.subscribe(
      topic_of<T>(),
      [&](const T& v) {
        chk.take(v);
        if (chk.count == n) done.set();
      },
      bus::on_executor(1));
  Clock::time_point t0;
  {
    PinScope pin(kProducerCore);
    bus::Publisher<T> pub = b.publisher(topic_of<T>());
    t0 = Clock::now();
    std::optional<bus::Batch> scope;
    for (uint64_t i = 1; i <= n; ++i) {
      if (kInBatch && (i - 1) % kBusBatch == 0) {
        scope.reset();
        scope.emplace(b);
      }
      if constexpr (kHandle) {
        if (!pub.publish(make<T>(i)).ok()) fail("publish refused");
      } else {
        if (!b.publish(topic_of<T>(), make<T>(i)).ok()) fail("publish refused");
      }
    }
  }
  done.wait();
  (void)b.stop();
  chk.verify(n);
  return rate_sample(n, t0, done.at);
}

/// The producer is a handler on executor 0 that publishes kChunk messages and posts itself
/// again: an executor's sends are published once per handler batch (see bus_throughput.cpp).
/// `subscribers` subscribers: the first on executor 1, then alternating.
template <class T, bool kHandle = false>
Sample bus_batched(uint64_t n, int subscribers = 1) {
  bus::Bus b(bus_options());
  std::vector<Check> chk(subscribers);
  std::atomic<int> finished{0};
  Done done;
  std::vector<bus::Subscription> subs;
  for (int s = 0; s < subscribers; ++s) {
    subs.push_back(b.subscribe(
        topic_of<T>(),
        [&, &mine = chk[s]](const T& v) {  // its own Check, as the peers' consumers hold theirs
          mine.take(v);
          if (mine.count == n && finished.fetch_add(1) + 1 == subscribers) done.set();
        },
        bus::on_executor(s % 2 == 0 ? 1 : 0)));
  }
  struct alignas(64) {  // the producer's, away from what the subscribers touch
    uint64_t next = 1;
    std::optional<bus::Publisher<T>> pub;  // made on executor 0, the thread that uses it
  } prod;
  std::function<void()> chunk = [&] {
    // The count in a local, as the peers' loops keep theirs: a uint64_t published may alias
    // prod.next, which would then be stored and loaded again around every publish.
    uint64_t next = prod.next;
    if (kHandle && !prod.pub) prod.pub.emplace(b.publisher(topic_of<T>()));
    for (uint64_t end = std::min(n, next + kChunk - 1); next <= end; ++next) {
      if constexpr (kHandle) {
        if (!prod.pub->publish(make<T>(next)).ok()) fail("publish from executor refused");
      } else {
        if (!b.publish(topic_of<T>(), make<T>(next)).ok()) fail("publish from executor refused");
      }
    }
    prod.next = next;
    if (next <= n && !b.post(bus::on_executor(0), chunk).ok()) fail("post refused");
  };
  Clock::time_point t0 = Clock::now();
  if (!b.post(bus::on_executor(0), chunk).ok()) fail("post refused");
  done.wait();
  (void)b.stop();
  for (auto& c : chk) c.verify(n);
  return rate_sample(n, t0, done.at);
}

/// The bus's bulk calls, as the peers' bulk rows: a handler on executor 0 publishes kChunk
/// messages with publish_bulk (kBulk at a time, from a local array) and posts itself again; a
/// bulk subscriber on executor 1 takes them in spans and checks each.
template <class T>
Sample bus_bulk(uint64_t n) {
  bus::Bus b(bus_options());
  Check chk;
  Done done;
  auto sub = b.subscribe_bulk(
      topic_of<T>(),
      [&](std::span<const T> msgs) {
        for (const T& v : msgs) chk.take(v);
        if (chk.count == n) done.set();
      },
      bus::on_executor(1));
  struct alignas(64) {
    uint64_t next = 1;
  } prod;
  std::function<void()> chunk = [&] {
    uint64_t& next = prod.next;
    T buf[kBulk];
    for (uint64_t end = std::min(n, next + kChunk - 1); next <= end;) {
      std::size_t k = std::min<uint64_t>(kBulk, end - next + 1);
      for (std::size_t j = 0; j < k; ++j) buf[j] = make<T>(next + j);
      if (!b.publish_bulk(topic_of<T>(), std::span<const T>(buf, k)).ok()) {
        fail("publish_bulk from executor refused");
      }
      next += k;
    }
    if (next <= n && !b.post(bus::on_executor(0), chunk).ok()) fail("post refused");
  };
  Clock::time_point t0 = Clock::now();
  if (!b.post(bus::on_executor(0), chunk).ok()) fail("post refused");
  done.wait();
  (void)b.stop();
  chk.verify(n);
  return rate_sample(n, t0, done.at);
}

/// Two plain threads (both on the producer core) publish_bulk kBulk at a time to one bulk
/// subscriber on executor 1 (per-producer FIFO checked).
Sample bus_bulk_two_to_one(uint64_t n) {
  bus::Bus b(bus_options());
  uint64_t m = n / 2;
  Check2 chk;
  Done done;
  auto sub = b.subscribe_bulk(
      u64_topic,
      [&](std::span<const uint64_t> msgs) {
        for (uint64_t v : msgs) chk.take(v);
        if (chk.count == 2 * m) done.set();
      },
      bus::on_executor(1));
  auto [t0, t1] = run_two_to_one(
      [&](int p) {
        uint64_t base = uint64_t(p) << kProducerShift;
        uint64_t buf[kBulk];
        for (uint64_t i = 1; i <= m;) {
          std::size_t k = std::min<uint64_t>(kBulk, m - i + 1);
          for (std::size_t j = 0; j < k; ++j) buf[j] = base | (i + j);
          if (!b.publish_bulk(u64_topic, std::span<const uint64_t>(buf, k)).ok()) {
            fail("publish_bulk refused");
          }
          i += k;
        }
      },
      [&] { done.wait(); });
  (void)t1;
  (void)b.stop();
  chk.verify(m);
  return rate_sample(2 * m, t0, done.at);
}

/// Two plain threads (both on the producer core) publish to one subscriber on executor 1,
/// per message or inside a bus::Batch of kBusBatch.
Sample bus_two_to_one(uint64_t n, bool batch, bool handle = false) {
  bus::Bus b(bus_options());
  uint64_t m = n / 2;
  Check2 chk;
  Done done;
  auto sub = b.subscribe(
      u64_topic,
      [&](const uint64_t& v) {
        chk.take(v);
        if (chk.count == 2 * m) done.set();
      },
      bus::on_executor(1));
  auto [t0, t1] = run_two_to_one(
      [&](int p) {
        uint64_t base = uint64_t(p) << kProducerShift;
        bus::Publisher<uint64_t> pub = b.publisher(u64_topic);  // this producer thread's
        auto publish = [&](uint64_t v) {
          if (!(handle ? pub.publish(v) : b.publish(u64_topic, v)).ok()) fail("publish refused");
        };
        if (!batch) {
          for (uint64_t i = 1; i <= m; ++i) publish(base | i);
          return;
        }
        for (uint64_t i = 1; i <= m;) {
          bus::Batch scope(b);
          if (!scope.accepted()) fail("batch refused");
          for (uint64_t end = std::min(m, i + kBusBatch - 1); i <= end; ++i) publish(base | i);
        }
      },
      [&] { done.wait(); });
  (void)t1;  // the "consumer" above only waited: the end is when the subscriber saw the last
  (void)b.stop();
  chk.verify(m);
  return rate_sample(2 * m, t0, done.at);
}

/// Request/reply between two executors: a server on executor 1 answers r + 1; a handler on
/// executor 0 sends the next request from the previous reply's callback.
Sample bus_round_trip(uint64_t trips, bool parking) {
  bus::Options o = bus_options();
  if (parking) o.spin(std::chrono::microseconds(0));
  bus::Bus b(o);
  auto server = b.serve(
      echo, [](uint64_t&& r) { return r + 1; }, bus::on_executor(1));
  struct Pinger {
    bus::Bus* bus;
    uint64_t warm, total, i = 0;
    uint64_t bad = 0;
    std::vector<double> ns;
    Clock::time_point sent, start;
    Done done;
    void next() {
      uint64_t req = i + 1;
      sent = Clock::now();
      bus->request(echo, req, std::chrono::seconds(10), [this, req](absl::StatusOr<uint64_t> r) {
        auto t = Clock::now();
        bad += (!r.ok() || *r != req + 1);
        if (i >= warm) {
          ns.push_back(std::chrono::duration<double, std::nano>(t - sent).count());
        }
        if (++i < total && bad == 0) {
          next();
        } else {
          done.set();
        }
      });
    }
  };
  Pinger p;
  p.bus = &b;
  p.warm = std::min<uint64_t>(1000, trips / 10);
  p.total = trips + p.warm;
  p.ns.reserve(trips);
  p.start = Clock::now();
  if (!b.post(bus::on_executor(0), [&p] { p.next(); }).ok()) fail("post refused");
  p.done.wait();
  (void)b.stop();
  if (p.bad != 0) fail("a request failed or got a wrong reply");
  if (p.ns.size() != trips) fail("round trips: " + std::to_string(p.ns.size()));
  return latency_sample(p.ns, seconds(p.start, p.done.at));
}

inline const bus::Topic<uint64_t> ping_topic{"bench.queues.ping"};
inline const bus::Topic<uint64_t> pong_topic{"bench.queues.pong"};
Sample bus_pub_ping_pong(uint64_t trips) {
  bus::Bus b(bus_options());
  uint64_t warm = std::min<uint64_t>(1000, trips / 10), total = trips + warm;
  std::vector<double> ns;
  ns.reserve(trips);
  Clock::time_point sent, start;
  uint64_t i = 0;
  Done done;
  auto s1 = b.subscribe(
      ping_topic, [&](const uint64_t& v) { (void)b.publish(pong_topic, v + 1); },
      bus::on_executor(1));
  auto s0 = b.subscribe(
      pong_topic,
      [&](const uint64_t&) {
        auto t = Clock::now();
        if (i >= warm) ns.push_back(std::chrono::duration<double, std::nano>(t - sent).count());
        if (++i < total) {
          sent = Clock::now();
          (void)b.publish(ping_topic, i);
        } else {
          done.set();
        }
      },
      bus::on_executor(0));
  start = Clock::now();
  if (!b.post(bus::on_executor(0), [&] {
          sent = Clock::now();
          (void)b.publish(ping_topic, uint64_t{0});
        }).ok())
    fail("post");
  done.wait();
  (void)b.stop();
  return latency_sample(ns, seconds(start, done.at));
}

// ---- the cases and the table ------------------------------------------------------------------

struct Case {
  std::string id, name;
  int cls;  // chart colour: 0 peer, 1 bus, 2 plain reference
  bool latency;
  std::function<Sample(uint64_t)> run;
  std::string skipped;   // why it does not run (a peer missing at build time)
  uint64_t divisor = 1;  // runs items / divisor (the parking round trip is slow)
  std::vector<Sample> samples;
};

struct Section {
  std::string title, tag;  // tag: the chart's short name for the section
  bool latency;
  std::vector<std::string> rows;
  std::vector<std::pair<std::string, std::string>> ratios;  // column title, bus case id
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t items = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 20'000'000;
  int runs = argc > 2 ? std::atoi(argv[2]) : 5;
  uint64_t trips = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 200'000;
  std::string filter = argc > 4 ? argv[4] : "";
  if (items < 2 || runs < 1 || trips < 10) {
    std::fprintf(stderr, "usage: %s [items>=2] [runs>=1] [round_trips>=10] [filter]\n", argv[0]);
    return 2;
  }
  items &= ~uint64_t{1};  // even: the 2 -> 1 cases split it between two producers

  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  struct utsname un {};
  uname(&un);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  std::printf("bus_queues: internal queue throughput, the bus against its peers\n");
  std::printf("command:  %s\n", cmd.c_str());
  std::printf("date:     %s\n", date);
  std::printf("machine:  nproc %ld, %s, %s %s\n", sysconf(_SC_NPROCESSORS_ONLN),
              cpu_model().c_str(), un.sysname, un.release);
  std::printf("build:    %s, compiler %s\n",
              *BUS_QUEUES_BUILD_TYPE ? BUS_QUEUES_BUILD_TYPE : "(no build type)", __VERSION__);
  std::printf(
      "setup:    %llu items per throughput case per run, %llu round trips per request/reply "
      "case (parking: a tenth), %d interleaved runs; producer on core %d, consumer on core %d "
      "(bus: executor i pinned to core i); bounded queues hold %zu KiB of items (the bus's "
      "ring_bytes)\n",
      static_cast<unsigned long long>(items), static_cast<unsigned long long>(trips), runs,
      kProducerCore, kConsumerCore, kRingBytes / 1024);
  if (const char* e = std::getenv("BUS_NO_MEMBARRIER"))
    std::printf("env:      BUS_NO_MEMBARRIER=%s\n", e);
  if (cores() < 2) std::printf("note:     fewer than 2 cores: producer and consumer share one\n");

  std::vector<Case> cases;
  auto add = [&](std::string id, std::string name, int cls, bool latency,
                 std::function<Sample(uint64_t)> fn, const char* missing = nullptr) {
    Case c{std::move(id), std::move(name), cls, latency, std::move(fn), "", 1, {}};
    if (missing != nullptr) c.skipped = missing;
    cases.push_back(std::move(c));
  };
  [[maybe_unused]] auto none = [](uint64_t) { return Sample{}; };
  const char* no_aq = "atomic_queue not found at build time (libatomic-queue-dev)";
  const char* no_boost = "boost/lockfree not found at build time (libboost-dev)";
  const char* no_rwq = "ReaderWriterQueue not found at build time (libreaderwriterqueue-dev)";
  const char* no_cq = "ConcurrentQueue not found at build time (libconcurrentqueue-dev)";
  const char* no_zmq = "cppzmq not found at build time (cppzmq-dev, libzmq3-dev)";
  (void)no_aq, (void)no_boost, (void)no_rwq, (void)no_cq, (void)no_zmq;

  // 1 -> 1, uint64
  add("ring64", "plain ring, tail per 64", 2, false, plain_ring<uint64_t, 64>);
  add("ring1024", "plain ring, tail per 1024", 2, false, plain_ring<uint64_t, 1024>);
#if BUS_QUEUES_HAVE_ATOMIC_QUEUE
  add("aq", "atomic_queue OptimistAtomicQueue SPSC", 0, false,
      atomic_queue_spsc<OptimistAQ<kRingBytes / 8>, uint64_t>);
  add("aq2", "atomic_queue OptimistAtomicQueue2 SPSC", 0, false,
      atomic_queue_spsc<OptimistAQ2<uint64_t, kRingBytes / 8>, uint64_t>);
#else
  add("aq", "atomic_queue OptimistAtomicQueue SPSC", 0, false, none, no_aq);
  add("aq2", "atomic_queue OptimistAtomicQueue2 SPSC", 0, false, none, no_aq);
#endif
#if BUS_QUEUES_HAVE_BOOST_LOCKFREE
  add("boost1", "boost spsc_queue, single", 0, false, boost_single<uint64_t>);
  add("boost256", "boost spsc_queue, bulk 256", 0, false, boost_bulk<uint64_t>);
#else
  add("boost1", "boost spsc_queue, single", 0, false, none, no_boost);
  add("boost256", "boost spsc_queue, bulk 256", 0, false, none, no_boost);
#endif
#if BUS_QUEUES_HAVE_READERWRITERQUEUE
  add("rwq", "moodycamel ReaderWriterQueue", 0, false, rwq_single);
#else
  add("rwq", "moodycamel ReaderWriterQueue", 0, false, none, no_rwq);
#endif
#if BUS_QUEUES_HAVE_CONCURRENTQUEUE
  add("cq1", "moodycamel ConcurrentQueue, single", 0, false, cq_single);
  add("cq256", "moodycamel ConcurrentQueue, bulk 256", 0, false, cq_bulk);
#else
  add("cq1", "moodycamel ConcurrentQueue, single", 0, false, none, no_cq);
  add("cq256", "moodycamel ConcurrentQueue, bulk 256", 0, false, none, no_cq);
#endif
#if BUS_QUEUES_HAVE_ZMQ
  add("zmq", "ZeroMQ inproc PUSH/PULL, 8-byte msgs", 0, false, zmq_inproc);
#else
  add("zmq", "ZeroMQ inproc PUSH/PULL, 8-byte msgs", 0, false, none, no_zmq);
#endif
  add("mutex", "std::mutex + std::deque", 0, false, mutex_deque);
  add("bus", "bus publish, plain thread", 1, false, bus_publish<uint64_t>);
  add("pub", "bus Publisher, plain thread", 1, false, bus_publish<uint64_t, true>);
  add("busbatch", "bus Batch of 256, plain thread", 1, false, bus_publish<uint64_t, false, true>);
  add("busb", "bus batched, executor -> executor", 1, false,
      [](uint64_t n) { return bus_batched<uint64_t>(n); });
  add("pubb", "bus Publisher batched, executor -> executor", 1, false,
      [](uint64_t n) { return bus_batched<uint64_t, true>(n); });
  add("busbulk", "bus bulk 256, executor -> executor", 1, false, bus_bulk<uint64_t>);
  // 1 -> 1, 64-byte struct
  add("ring64/64B", "plain ring, tail per 64", 2, false, plain_ring<Item64, 64>);
#if BUS_QUEUES_HAVE_ATOMIC_QUEUE
  add("aq2/64B", "atomic_queue OptimistAtomicQueue2 SPSC", 0, false,
      atomic_queue_spsc<OptimistAQ2<Item64, kRingBytes / 64>, Item64>);
#else
  add("aq2/64B", "atomic_queue OptimistAtomicQueue2 SPSC", 0, false, none, no_aq);
#endif
#if BUS_QUEUES_HAVE_BOOST_LOCKFREE
  add("boost1/64B", "boost spsc_queue, single", 0, false, boost_single<Item64>);
  add("boost256/64B", "boost spsc_queue, bulk 256", 0, false, boost_bulk<Item64>);
#else
  add("boost1/64B", "boost spsc_queue, single", 0, false, none, no_boost);
  add("boost256/64B", "boost spsc_queue, bulk 256", 0, false, none, no_boost);
#endif
  add("bus/64B", "bus publish, plain thread", 1, false, bus_publish<Item64>);
  add("pub/64B", "bus Publisher, plain thread", 1, false, bus_publish<Item64, true>);
  add("busb/64B", "bus batched, executor -> executor", 1, false,
      [](uint64_t n) { return bus_batched<Item64>(n); });
  add("pubb/64B", "bus Publisher batched, executor -> executor", 1, false,
      [](uint64_t n) { return bus_batched<Item64, true>(n); });
  add("busbulk/64B", "bus bulk 256, executor -> executor", 1, false, bus_bulk<Item64>);
  // 2 -> 1
#if BUS_QUEUES_HAVE_CONCURRENTQUEUE
  add("cq256/2to1", "moodycamel ConcurrentQueue, bulk 256", 0, false, cq_bulk_two_to_one);
#else
  add("cq256/2to1", "moodycamel ConcurrentQueue, bulk 256", 0, false, none, no_cq);
#endif
  add("bus/2to1", "bus publish, 2 plain threads", 1, false,
      [](uint64_t n) { return bus_two_to_one(n, false); });
  add("busbatch/2to1", "bus Batch of 256, 2 plain threads", 1, false,
      [](uint64_t n) { return bus_two_to_one(n, true); });
  add("pub/2to1", "bus Publisher, 2 plain threads", 1, false,
      [](uint64_t n) { return bus_two_to_one(n, false, true); });
  add("pubbatch/2to1", "bus Publisher in a Batch of 256, 2 plain threads", 1, false,
      [](uint64_t n) { return bus_two_to_one(n, true, true); });
  add("busbulk/2to1", "bus bulk 256, 2 plain threads", 1, false, bus_bulk_two_to_one);
  // 1 -> 4
  add("busb/fanout", "bus batched, 4 subscribers on 2 executors", 1, false,
      [](uint64_t n) { return bus_batched<uint64_t>(n, 4); });
  // round trips
#if BUS_QUEUES_HAVE_ATOMIC_QUEUE
  add("aq/rtt", "atomic_queue ping-pong, 2 threads", 0, true, atomic_queue_ping_pong);
#else
  add("aq/rtt", "atomic_queue ping-pong, 2 threads", 0, true, none, no_aq);
#endif
  add("bus/rtt", "bus request/reply, spinning executors", 1, true,
      [](uint64_t n) { return bus_round_trip(n, false); });
  add("bus/pingpong", "bus publish ping-pong, 2 executors", 1, true, bus_pub_ping_pong);
  add("bus/rtt-park", "bus request/reply, parking (spin 0)", 1, true,
      [](uint64_t n) { return bus_round_trip(n, true); });
  cases.back().divisor = 10;

  std::vector<Section> sections = {
      {"1 -> 1, 8-byte items (uint64)",
       "1 -> 1",
       false,
       {"ring64", "ring1024", "aq", "aq2", "boost1", "boost256", "rwq", "cq1", "cq256", "zmq",
        "mutex", "bus", "pub", "busbatch", "busb", "pubb", "busbulk"},
       {{"publish/x", "bus"},
        {"Publ./x", "pub"},
        {"Batch/x", "busbatch"},
        {"batched/x", "busb"},
        {"Pub.b/x", "pubb"},
        {"bulk/x", "busbulk"}}},
      {"1 -> 1, 64-byte struct",
       "1 -> 1, 64 B",
       false,
       {"ring64/64B", "aq2/64B", "boost1/64B", "boost256/64B", "bus/64B", "pub/64B", "busb/64B",
        "pubb/64B", "busbulk/64B"},
       {{"publish/x", "bus/64B"},
        {"Publ./x", "pub/64B"},
        {"batched/x", "busb/64B"},
        {"Pub.b/x", "pubb/64B"},
        {"bulk/x", "busbulk/64B"}}},
      {"2 -> 1, 8-byte items, per-producer FIFO checked (both producers on core 0)",
       "2 -> 1",
       false,
       {"cq256/2to1", "bus/2to1", "pub/2to1", "busbatch/2to1", "pubbatch/2to1", "busbulk/2to1"},
       {{"publish/x", "bus/2to1"},
        {"Publ./x", "pub/2to1"},
        {"Batch/x", "busbatch/2to1"},
        {"Pub.B/x", "pubbatch/2to1"},
        {"bulk/x", "busbulk/2to1"}}},
      {"1 -> 4 subscribers on 2 executors, 8-byte items (messages/s; deliveries are 4x)",
       "1 -> 4, msg/s",
       false,
       {"busb/fanout"},
       {}},
      {"request/reply round trip, 8-byte request and reply (ns; bus/x: lower is better)",
       "rtt",
       true,
       {"aq/rtt", "bus/rtt", "bus/pingpong", "bus/rtt-park"},
       {{"spin/x", "bus/rtt"}, {"park/x", "bus/rtt-park"}}},
  };

  // filter: comma-separated; a case runs when its id or name contains one of the parts, or its
  // id is a part's rest after '='.
  std::vector<std::string> parts;
  for (std::size_t at = 0; at <= filter.size();) {
    std::size_t comma = std::min(filter.find(',', at), filter.size());
    if (comma > at) parts.push_back(filter.substr(at, comma - at));
    at = comma + 1;
  }
  auto selected = [&](const Case& c) {
    return parts.empty() || std::any_of(parts.begin(), parts.end(), [&](const std::string& f) {
             if (f[0] == '=') return c.id == f.substr(1);
             return c.id.find(f) != std::string::npos || c.name.find(f) != std::string::npos;
           });
  };
  std::printf("\n");
  {
    std::map<std::string, std::string> skipped;  // reason -> case ids
    for (auto& c : cases) {
      if (!c.skipped.empty()) skipped[c.skipped] += (skipped[c.skipped].empty() ? "" : ", ") + c.id;
    }
    for (auto& [why, ids] : skipped) std::printf("skipped:  %s: %s\n", ids.c_str(), why.c_str());
  }

  std::thread(watchdog).detach();
  // A short untimed pass first (page faults, first allocations, thread start-up), then the
  // interleaved runs.
  for (int r = -1; r < runs; ++r) {
    std::printf("%s", r < 0 ? "warm-up" : (r == 0 ? " run 1" : ""));
    if (r > 0) std::printf(" %d", r + 1);
    std::fflush(stdout);
    for (auto& c : cases) {
      if (!c.skipped.empty() || !selected(c)) continue;
      uint64_t n = (c.latency ? trips : items) / c.divisor;
      if (r < 0) n = std::max<uint64_t>(c.latency ? 10 : 2, n / 20) & ~uint64_t{1};
      g_case = c.id + " (" + c.name + ")";
      arm_watchdog(c.latency ? n * 50 : n);
      Sample s = c.run(n);
      g_deadline_ns.store(0);
      if (r >= 0) c.samples.push_back(s);
    }
  }
  std::printf("\n");

  std::map<std::string, Case*> by_id;
  for (auto& c : cases) by_id[c.id] = &c;
  auto med = [&](const std::string& id, bool p50) -> double {
    Case* c = by_id.at(id);
    if (c->samples.empty()) return 0;
    std::vector<double> v;
    for (auto& s : c->samples) v.push_back(p50 ? s.p50 : s.rate);
    return median(v);
  };

  std::printf("\n%d interleaved runs; median (min-max); ratio = the bus case / the row\n", runs);
  for (auto& sec : sections) {
    std::printf("\n== %s\n", sec.title.c_str());
    if (sec.latency) {
      std::printf("  %-44s %9s %19s %9s", "", "p50 ns", "p50 min-max", "p99 ns");
    } else {
      std::printf("  %-44s %9s %19s", "", "M items/s", "min-max");
    }
    for (auto& [title, id] : sec.ratios) std::printf(" %10s", title.c_str());
    std::printf("\n");
    for (auto& id : sec.rows) {
      Case& c = *by_id.at(id);
      std::printf("  %-44s", c.name.c_str());
      if (!c.skipped.empty() || c.samples.empty()) {
        std::printf(" %9s  %s\n", "-", c.skipped.empty() ? "(not selected)" : "(skipped)");
        continue;
      }
      std::vector<double> v, p99;
      for (auto& s : c.samples) {
        v.push_back(sec.latency ? s.p50 : s.rate / 1e6);
        p99.push_back(s.p99);
      }
      char range[64];
      std::snprintf(range, sizeof range, "(%.1f-%.1f)", *std::min_element(v.begin(), v.end()),
                    *std::max_element(v.begin(), v.end()));
      std::printf(" %9.1f %19s", median(v), range);
      if (sec.latency) std::printf(" %9.1f", median(p99));
      for (auto& [title, bus_id] : sec.ratios) {
        double b = med(bus_id, sec.latency), x = med(id, sec.latency);
        if (b > 0 && x > 0) {
          std::printf(" %9.2fx", b / x);
        } else {
          std::printf(" %10s", "-");
        }
      }
      std::printf("\n");
    }
  }

  // The targets, from the medians above. The VM's two vCPUs move between placements
  // during a run, which shifts every figure 2-3x: the ratio within each run (the bus case and
  // its peer measured minutes apart, in one placement) is shown beside the ratio of medians.
  std::printf(
      "\n== targets (issue 3): ratio of the medians above; per run: the ratio within each "
      "interleaved run, median (min-max)\n");
  auto target = [&](const char* what, const std::string& a, const std::string& b, bool p50,
                    double bound, bool at_least) {
    double x = med(a, p50), y = med(b, p50);
    if (x <= 0 || y <= 0) {
      std::printf("  %-62s %8s\n", what, "n/a");
      return;
    }
    auto verdict = [&](double ratio) {
      return (at_least ? ratio >= bound : ratio <= bound) ? "met" : "MISSED";
    };
    double r = x / y;
    std::printf("  %-62s %7.2fx  (%s %.1fx: %s)", what, r, at_least ? ">=" : "<=", bound,
                verdict(r));
    const Case& ca = *by_id.at(a);
    const Case& cb = *by_id.at(b);
    std::vector<double> per_run;
    for (std::size_t i = 0; i < ca.samples.size() && i < cb.samples.size(); ++i) {
      double u = p50 ? ca.samples[i].p50 : ca.samples[i].rate;
      double v = p50 ? cb.samples[i].p50 : cb.samples[i].rate;
      if (u > 0 && v > 0) per_run.push_back(u / v);
    }
    if (!per_run.empty()) {
      double m = median(per_run);
      std::printf("  per run %.2fx (%.2f-%.2f): %s", m,
                  *std::min_element(per_run.begin(), per_run.end()),
                  *std::max_element(per_run.begin(), per_run.end()), verdict(m));
    }
    std::printf("\n");
  };
  // The batched mode three ways: a plain thread publishing one message per call inside a Batch
  // (published when it ends), an executor doing the same (flushed once per handler), and the
  // bulk calls (publish_bulk -> subscribe_bulk), as the peers' bulk rows.
  target("Batch(256) 1->1 / plain ring tail per 64", "busbatch", "ring64", false, 0.8, true);
  target("Batch(256) 1->1 / boost spsc bulk 256", "busbatch", "boost256", false, 1.0, true);
  target("batched 1->1 / plain ring tail per 64", "busb", "ring64", false, 0.8, true);
  target("batched 1->1 / boost spsc bulk 256", "busb", "boost256", false, 1.0, true);
  target("Publisher batched 1->1 / plain ring tail per 64", "pubb", "ring64", false, 0.8, true);
  target("Publisher batched 1->1 / boost spsc bulk 256", "pubb", "boost256", false, 1.0, true);
  target("bulk 256 1->1 / plain ring tail per 64", "busbulk", "ring64", false, 0.8, true);
  target("bulk 256 1->1 / boost spsc bulk 256", "busbulk", "boost256", false, 1.0, true);
  {
    // atomic_queue's fastest SPSC variant in this run
    std::string fastest = med("aq", false) >= med("aq2", false) ? "aq" : "aq2";
    target(("publish 1->1 / atomic_queue fastest (" + by_id.at(fastest)->name + ")").c_str(), "bus",
           fastest, false, 1.0, true);
    target("Publisher 1->1 / atomic_queue fastest", "pub", fastest, false, 1.0, true);
  }
  target("publish 2->1 / ConcurrentQueue bulk 256 2->1", "bus/2to1", "cq256/2to1", false, 1.0,
         true);
  target("Publisher 2->1 / ConcurrentQueue bulk 256 2->1", "pub/2to1", "cq256/2to1", false, 1.0,
         true);
  target("Batch(256) 2->1 / ConcurrentQueue bulk 256 2->1", "busbatch/2to1", "cq256/2to1", false,
         1.0, true);
  target("Publisher Batch(256) 2->1 / ConcurrentQueue bulk 256 2->1", "pubbatch/2to1", "cq256/2to1",
         false, 1.0, true);
  target("bulk 256 2->1 / ConcurrentQueue bulk 256 2->1", "busbulk/2to1", "cq256/2to1", false, 1.0,
         true);
  target("round trip p50, spinning / atomic_queue ping-pong", "bus/rtt", "aq/rtt", true, 1.5,
         false);

  // Data for bench/queues.gnuplot: class|label|median|min|max (M items/s, throughput cases).
  std::printf("\n# chart data: chart|class (0 peer, 1 bus, 2 plain ring)|label|median|min|max\n");
  for (auto& sec : sections) {
    if (sec.latency) continue;
    for (auto& id : sec.rows) {
      Case& c = *by_id.at(id);
      if (c.samples.empty()) continue;
      std::vector<double> v;
      for (auto& s : c.samples) v.push_back(s.rate / 1e6);
      std::printf("chart|%d|%s (%s)|%.2f|%.2f|%.2f\n", c.cls, c.name.c_str(), sec.tag.c_str(),
                  median(v), *std::min_element(v.begin(), v.end()),
                  *std::max_element(v.begin(), v.end()));
    }
  }
  return 0;
}
