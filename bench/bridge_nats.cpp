// The NATS side of the bridge benchmark (see bench/bridge_bench.cpp): the system a user would
// pick instead of the bridge, through its C client (libnats). The broker (nats-server) is
// started by bench/run_bridge.sh; every role connects to it at `url`.
//
//   bus_bridge_nats sub       url=U size=S count=N     async subscription, callback per message
//   bus_bridge_nats pub       url=U size=S count=N     natsConnection_Publish, Flush at the end
//   bus_bridge_nats responder url=U [asap=1]           replies to each request with its payload
//   bus_bridge_nats rtt       url=U size=S count=N     natsConnection_Request, one at a time
//   bus_bridge_nats pipe      url=U size=S count=N [window=1000]   PublishRequest, `window` out
//
// The subscriber lifts the client's pending limits (a slow consumer would otherwise lose
// messages, which the count check would report as a failed run) and says "ready" after a Flush,
// when the server has its subscription. Round trips use SendAsap (each publish leaves at once,
// NATS's low-latency setting); the throughput and pipelined cases use the default buffering.
#include <nats/nats.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bridge_common.hpp"

namespace {

using namespace bench_bridge;

constexpr char kSubject[] = "bench.blobs";
constexpr char kEchoSubject[] = "bench.echo";

void check(natsStatus s, const char* what) {
  if (s != NATS_OK) fail(std::string(what) + ": " + natsStatus_GetText(s));
}

struct Payload {
  std::vector<uint8_t> bytes;
  explicit Payload(std::size_t size) : bytes(size) {
    if (size < 9) fail("size must be at least 9 (8 bytes of sequence number, then data)");
    for (std::size_t j = 8; j < size; ++j) bytes[j] = pattern(j - 8);
  }
  const void* with(uint64_t seq) {
    std::memcpy(bytes.data(), &seq, 8);
    return bytes.data();
  }
  int size() const { return static_cast<int>(bytes.size()); }
};

uint64_t seq_of(natsMsg* m) {
  uint64_t seq = 0;
  if (natsMsg_GetDataLength(m) >= 8) std::memcpy(&seq, natsMsg_GetData(m), 8);
  return seq;
}

/// A connection to `url`; `asap` sends every publish at once instead of buffering it.
natsConnection* connect(const Args& a, bool asap) {
  natsOptions* o = nullptr;
  check(natsOptions_Create(&o), "options");
  check(natsOptions_SetURL(o, a.str("url").c_str()), "url");
  check(natsOptions_SetSendAsap(o, asap), "send asap");
  natsConnection* nc = nullptr;
  check(natsConnection_Connect(&nc, o), "connect");
  natsOptions_Destroy(o);
  return nc;
}

/// A signal from a library thread to the main one.
struct Done {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void set() {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_one();
  }
  bool wait(std::chrono::seconds limit) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return done; });
  }
};

struct Receiver {
  uint64_t n;
  std::size_t size;
  uint8_t last;
  // Touched by the subscription's delivery thread only, until `done`.
  uint64_t count = 0, sum = 0, out_of_order = 0, t_first = 0, t_last = 0, c_last = 0;
  Done done;
};

void on_blob(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
  auto& r = *static_cast<Receiver*>(closure);
  uint64_t seq = seq_of(m);
  if (r.count == 0) r.t_first = now_ns();
  if (seq != r.count + 1) ++r.out_of_order;
  ++r.count;
  std::size_t len = static_cast<std::size_t>(natsMsg_GetDataLength(m));
  r.sum += seq + (len == r.size ? static_cast<uint8_t>(natsMsg_GetData(m)[r.size - 1]) : 0);
  natsMsg_Destroy(m);
  if (r.count == r.n) {
    r.t_last = now_ns();
    r.c_last = cpu_ns();
    r.done.set();
  }
}

int role_sub(const Args& a) {
  Receiver r;
  r.n = a.num("count");
  r.size = a.num("size");
  r.last = pattern(r.size - 9);
  natsConnection* nc = connect(a, false);
  natsSubscription* sub = nullptr;
  check(natsConnection_Subscribe(&sub, nc, kSubject, on_blob, &r), "subscribe");
  check(natsSubscription_SetPendingLimits(sub, -1, -1), "pending limits");
  check(natsConnection_Flush(nc), "flush");
  uint64_t c0 = cpu_ns();
  ready();
  bool finished = r.done.wait(std::chrono::seconds(120));
  int64_t dropped = 0;
  natsSubscription_GetDropped(sub, &dropped);
  natsSubscription_Unsubscribe(sub);
  // The callback may still run for a message past n; it never does here (the count is n).
  uint64_t expect = r.n * (r.n + 1) / 2 + r.n * r.last;
  std::printf(
      "result count=%llu ok=%d t_first=%llu t_last=%llu cpu=%llu dropped=%lld "
      "out_of_order=%llu\n",
      static_cast<unsigned long long>(r.count), finished && r.sum == expect && !r.out_of_order,
      static_cast<unsigned long long>(r.t_first), static_cast<unsigned long long>(r.t_last),
      static_cast<unsigned long long>(finished ? r.c_last - c0 : 0),
      static_cast<long long>(dropped), static_cast<unsigned long long>(r.out_of_order));
  std::fflush(stdout);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
  return finished ? 0 : 1;
}

int role_pub(const Args& a) {
  uint64_t n = a.num("count");
  Payload p(a.num("size"));
  natsConnection* nc = connect(a, false);
  uint64_t t0 = now_ns(), c0 = cpu_ns();
  for (uint64_t i = 1; i <= n; ++i) {
    check(natsConnection_Publish(nc, kSubject, p.with(i), p.size()), "publish");
  }
  check(natsConnection_Flush(nc), "flush");
  uint64_t t_sent = now_ns();
  wait_for_stdin_eof();
  std::printf("result t0=%llu t_sent=%llu cpu=%llu\n", static_cast<unsigned long long>(t0),
              static_cast<unsigned long long>(t_sent),
              static_cast<unsigned long long>(cpu_ns() - c0));
  std::fflush(stdout);
  natsConnection_Destroy(nc);
  return 0;
}

void on_request(natsConnection* nc, natsSubscription*, natsMsg* m, void* closure) {
  auto& served = *static_cast<std::atomic<uint64_t>*>(closure);
  natsConnection_Publish(nc, natsMsg_GetReply(m), natsMsg_GetData(m), natsMsg_GetDataLength(m));
  served.fetch_add(1, std::memory_order_relaxed);  // read once the subscription is gone
  natsMsg_Destroy(m);
}

int role_responder(const Args& a) {
  std::atomic<uint64_t> served{0};
  natsConnection* nc = connect(a, a.num("asap", 1) != 0);
  natsSubscription* sub = nullptr;
  check(natsConnection_Subscribe(&sub, nc, kEchoSubject, on_request, &served), "subscribe");
  check(natsSubscription_SetPendingLimits(sub, -1, -1), "pending limits");
  check(natsConnection_Flush(nc), "flush");
  uint64_t c0 = cpu_ns();
  ready();
  wait_for_stdin_eof();
  uint64_t cpu = cpu_ns() - c0;
  natsSubscription_Unsubscribe(sub);
  std::printf("result served=%llu cpu=%llu\n",
              static_cast<unsigned long long>(served.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(cpu));
  std::fflush(stdout);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(nc);
  return 0;
}

int role_rtt(const Args& a) {
  uint64_t n = a.num("count"), warm = a.num("warmup", 1000);
  Payload p(a.num("size"));
  natsConnection* nc = connect(a, true);
  std::vector<uint64_t> ns;
  ns.reserve(n);
  uint64_t bad = 0, c0 = 0;
  for (uint64_t i = 1; i <= warm + n; ++i) {
    if (i == warm + 1) c0 = cpu_ns();
    natsMsg* rep = nullptr;
    uint64_t t = now_ns();
    check(natsConnection_Request(&rep, nc, kEchoSubject, p.with(i), p.size(), 5000), "request");
    uint64_t dt = now_ns() - t;
    if (seq_of(rep) != i || natsMsg_GetDataLength(rep) != p.size()) ++bad;
    natsMsg_Destroy(rep);
    if (i > warm) ns.push_back(dt);
  }
  print_latency_result(n, bad == 0, ns, cpu_ns() - c0);
  natsConnection_Destroy(nc);
  return 0;
}

/// `window` requests outstanding: each reply (on the inbox subscription's delivery thread)
/// publishes the next request. The first window is issued on that thread too, by an empty
/// "start" message sent to the inbox, so the pipeline's state has a single owner.
struct Pipeline {
  natsConnection* nc;
  Payload p;
  uint64_t window;
  std::string inbox;
  std::atomic<uint64_t> next_count{0};  // set before the start message, read by its callback
  // The delivery thread's, until `done`.
  uint64_t n = 0, base = 0, issued = 0, replies = 0, sum = 0, t0 = 0, t_end = 0;
  Done* done = nullptr;

  void issue() {
    ++issued;
    check(natsConnection_PublishRequest(nc, kEchoSubject, inbox.c_str(), p.with(base + issued),
                                        p.size()),
          "publish request");
  }
  static void on_reply(natsConnection*, natsSubscription*, natsMsg* m, void* closure) {
    auto& self = *static_cast<Pipeline*>(closure);
    if (natsMsg_GetDataLength(m) == 0) {  // start
      natsMsg_Destroy(m);
      self.n = self.next_count.load(std::memory_order_acquire);  // pairs with run()'s store
      self.issued = self.replies = self.sum = 0;
      self.t0 = now_ns();
      for (uint64_t w = 0; w < self.window && w < self.n; ++w) self.issue();
      return;
    }
    self.sum += seq_of(m) - self.base;
    natsMsg_Destroy(m);
    if (self.issued < self.n) self.issue();
    if (++self.replies == self.n) {
      self.t_end = now_ns();
      self.done->set();
    }
  }
  std::pair<uint64_t, bool> run(uint64_t count) {
    Done d;
    done = &d;
    next_count.store(count, std::memory_order_release);  // pairs with on_reply's load
    check(natsConnection_Publish(nc, inbox.c_str(), nullptr, 0), "start");
    check(natsConnection_Flush(nc), "flush");
    if (!d.wait(std::chrono::seconds(120))) fail("pipeline timed out");
    // `done` (a mutex) orders the delivery thread's writes before these reads.
    std::pair<uint64_t, bool> r{t_end - t0, sum == n * (n + 1) / 2};
    base += n;
    return r;
  }
};

int role_pipe(const Args& a) {
  uint64_t n = a.num("count"), window = a.num("window", 1000);
  uint64_t warm = a.num("warmup", std::max<uint64_t>(window, n / 10));
  Pipeline pl{connect(a, false), Payload(a.num("size")), window,
              "bench.replies." + std::to_string(getpid())};
  natsSubscription* sub = nullptr;
  check(natsConnection_Subscribe(&sub, pl.nc, pl.inbox.c_str(), Pipeline::on_reply, &pl),
        "subscribe");
  check(natsSubscription_SetPendingLimits(sub, -1, -1), "pending limits");
  check(natsConnection_Flush(pl.nc), "flush");
  pl.run(warm);
  uint64_t c0 = cpu_ns();
  auto [ns, ok] = pl.run(n);
  std::printf("result count=%llu ok=%d ns=%llu cpu=%llu\n", static_cast<unsigned long long>(n), ok,
              static_cast<unsigned long long>(ns), static_cast<unsigned long long>(cpu_ns() - c0));
  std::fflush(stdout);
  natsSubscription_Unsubscribe(sub);
  natsSubscription_Destroy(sub);
  natsConnection_Destroy(pl.nc);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: bus_bridge_nats sub|pub|responder|rtt|pipe key=value...");
  Args a(argc, argv);
  std::string role = argv[1];
  if (role == "sub") return role_sub(a);
  if (role == "pub") return role_pub(a);
  if (role == "responder") return role_responder(a);
  if (role == "rtt") return role_rtt(a);
  if (role == "pipe") return role_pipe(a);
  fail("unknown role " + role);
}
