// The bus side of the bridge benchmark: one role of one case per process, started by bus_bridge
// (bench/bridge_bench.cpp), which pins it, reads its "ready"/"result" lines and closes its stdin
// to end it.
//
//   bus_bridge_bus pub    endpoint=tcp://127.0.0.1:P size=64 count=N [batch=256]
//   bus_bridge_bus sub    endpoint=tcp://127.0.0.1:P size=64 count=N [on=bridge]
//   bus_bridge_bus server endpoint=tcp://127.0.0.1:P [on=bridge]
//   bus_bridge_bus rtt    endpoint=tcp://127.0.0.1:P size=16 count=N [warmup=W]
//   bus_bridge_bus pipe   endpoint=tcp://127.0.0.1:P size=16 count=N [window=1000] [warmup=W]
//                         [timeout_ms=30000]
// Every role also takes spin_us= (bus::Options::spin, how long an idle executor polls),
// transport=auto|zmq|shm (NodeOptions::transport; default auto: shared memory between processes
// on one host) and shm_spin_us= (NodeOptions::shm_spin; 0: sleep at once). The largest message
// a node takes is raised to fit size= (4 MiB payloads).
//
// Large messages as users send them again and again: `rtt reuse=1` sends one message built
// once (a copy of a Message is a reference, so nothing is copied per call) and checks each
// reply's size, and `server reply=prebuilt` answers with a message of the request's size built
// once, as iceoryx's roles loan a chunk and write its first 8 bytes only.
//
// Each process is what a user writes: a bus::Bus with one executor and a bus::net::Node. The
// publisher exports a Topic<Message<Blob>> and publishes from its main thread (with `batch`, in
// bus::Batch scopes of that many messages); the subscriber imports it and subscribes (on
// executor 0, or with on=bridge on the node's bridge thread: Node::subscribe). The
// server exports an Endpoint<Message<Blob>, Message<Blob>> that echoes (served on the executor,
// or with on=bridge on the node's bridge thread: Node::serve); `rtt` calls it from a plain
// thread, `pipe` keeps `window` requests outstanding from executor 0.
// Times are CLOCK_MONOTONIC nanoseconds (steady_clock), comparable across processes.
#include <absl/status/statusor.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bus/bus.hpp>
#include <bus/message.hpp>
#include <bus/net/node.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bench/bench.capnp.h"
#include "bridge_common.hpp"

using namespace std::chrono_literals;

namespace {

using namespace bench_bridge;

using Blob = bus::Message<bench::Blob>;

inline const bus::Topic<Blob> kBlobs{"bench.blobs"};
inline const bus::Endpoint<Blob, Blob> kEcho{"bench.echo"};

/// A reused builder (bus::Builder): the user's cheapest way to make many messages of one shape,
/// one copy of the builder's words per message.
struct BlobMaker {
  bus::Builder<bench::Blob> builder;
  explicit BlobMaker(std::size_t size) {
    if (size < 9) fail("size must be at least 9 (8 bytes of sequence number, then data)");
    auto d = builder->initData(static_cast<unsigned>(size - 8));
    for (std::size_t j = 0; j < d.size(); ++j) d[j] = pattern(j);
  }
  Blob make(uint64_t seq) {
    builder->setSeq(seq);
    return builder.message();
  }
};

/// One executor, as the benchmark's brief has it; `spin_us=` sets how long an idle executor
/// polls before it parks (the bus's default is 50 us).
bus::Options bus_options(const Args& a) {
  bus::Options o = bus::Options().executors(1);
  if (a.kv.contains("spin_us")) o.spin(std::chrono::microseconds(a.num("spin_us")));
  return o;
}

/// The node's options every role shares: the name, the transport, the link's spin and a size
/// limit that fits the case's messages.
bus::net::NodeOptions node_options(const Args& a, const char* name) {
  auto o = bus::net::NodeOptions().name(name);
  const std::string t = a.kv.contains("transport") ? a.str("transport") : "auto";
  o.transport(t == "zmq"   ? bus::net::Transport::kZeroMq
              : t == "shm" ? bus::net::Transport::kSharedMemory
                           : bus::net::Transport::kAuto);
  if (a.kv.contains("shm_spin_us")) o.shm_spin(std::chrono::microseconds(a.num("shm_spin_us")));
  const uint64_t size = a.num("size", 0);
  o.max_message_bytes(std::max<std::size_t>(std::size_t{1} << 20, 2 * size + 4096));
  return o;
}

int role_pub(const Args& a) {
  uint64_t n = a.num("count"), batch = a.num("batch", 0);
  BlobMaker maker(a.num("size"));
  bus::Bus bus(bus_options(a));
  bus::net::Node node(bus, node_options(a, "bench-pub").publish_on(a.str("endpoint")));
  node.export_topic(kBlobs);
  ready();
  const auto subs = static_cast<std::size_t>(a.num("subs", 1));
  if (!node.wait_for_subscribers(kBlobs.name(), subs, 30s)) fail("too few subscribers in 30 s");
  uint64_t t0 = now_ns(), c0 = cpu_ns();
  std::optional<bus::Batch> scope;
  for (uint64_t i = 1; i <= n; ++i) {
    if (batch > 0 && (i - 1) % batch == 0) {
      scope.reset();
      scope.emplace(bus);
    }
    absl::Status st = bus.publish(kBlobs, maker.make(i));
    if (!st.ok()) fail("publish: " + st.ToString());
  }
  scope.reset();
  uint64_t t_sent = now_ns();
  wait_for_stdin_eof();
  uint64_t cpu = cpu_ns() - c0;
  bus::net::NodeStats s = node.stats();
  std::printf("result t0=%llu t_sent=%llu cpu=%llu published=%llu publish_cuts=%llu\n",
              static_cast<unsigned long long>(t0), static_cast<unsigned long long>(t_sent),
              static_cast<unsigned long long>(cpu), static_cast<unsigned long long>(s.published),
              static_cast<unsigned long long>(s.publish_cuts));
  std::fflush(stdout);
  return 0;
}

int role_sub(const Args& a) {
  const uint64_t n = a.num("count");
  const std::size_t data_size = a.num("size") - 8;
  const uint8_t last = pattern(data_size - 1);
  bus::Bus bus(bus_options(a));
  bus::net::Node node(bus,
                      node_options(a, ("bench-sub" + std::to_string(a.num("index", 0))).c_str())
                          .publish_on("tcp://127.0.0.1:*")
                          .peer(a.str("endpoint")));
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  // Handler state: touched by the handler's thread only until `done` is set under `mu`.
  uint64_t count = 0, sum = 0, out_of_order = 0, t_first = 0, t_last = 0, c_last = 0;
  auto handler = [&](const Blob& m) {
    auto r = *m;
    uint64_t seq = r.getSeq();
    auto d = r.getData();
    if (count == 0) t_first = now_ns();
    if (seq != count + 1) ++out_of_order;
    ++count;
    sum += seq + (d.size() == data_size ? d[data_size - 1] : 0);
    if (count == n) {
      t_last = now_ns();
      c_last = cpu_ns();
      std::lock_guard lock(mu);
      done = true;
      cv.notify_one();
    }
  };
  bus::Subscription s;
  const bool on_bridge = a.kv.contains("on") && a.str("on") == "bridge";
  if (on_bridge) {
    node.subscribe(kBlobs, handler);  // on the bridge thread (Node::subscribe)
  } else {
    node.import_topic(kBlobs);
    s = bus.subscribe(kBlobs, handler);
  }
  uint64_t c0 = cpu_ns();
  ready();
  bool finished;
  {
    std::unique_lock lock(mu);
    finished = cv.wait_for(lock, 120s, [&] { return done; });
  }
  auto t = node.stats().channel(kBlobs.name());
  // After this the handler's state is ours (n messages came: no more are on their way).
  if (on_bridge) {
    node.stop();
  } else {
    s.cancel();
  }
  uint64_t expect = n * (n + 1) / 2 + n * last;
  std::printf(
      "result count=%llu ok=%d t_first=%llu t_last=%llu cpu=%llu gaps=%llu received=%llu "
      "rejected=%llu out_of_order=%llu\n",
      static_cast<unsigned long long>(count), finished && sum == expect && out_of_order == 0,
      static_cast<unsigned long long>(t_first), static_cast<unsigned long long>(t_last),
      static_cast<unsigned long long>(finished ? c_last - c0 : 0),
      static_cast<unsigned long long>(t.gaps), static_cast<unsigned long long>(t.received),
      static_cast<unsigned long long>(t.rejected), static_cast<unsigned long long>(out_of_order));
  std::fflush(stdout);
  return finished ? 0 : 1;
}

int role_server(const Args& a) {
  bus::Bus bus(bus_options(a));
  const std::string requests = a.kv.contains("requests") ? a.str("requests") : "tcp://127.0.0.1:*";
  bus::net::Node node(
      bus, node_options(a, "bench-server").publish_on(a.str("endpoint")).requests_on(requests));
  std::atomic<uint64_t> served{0};
  const bool prebuilt = a.kv.contains("reply") && a.str("reply") == "prebuilt";
  std::map<std::size_t, Blob> replies;  // by data size (the handler's thread only)
  auto echo = [&](Blob&& req) {
    served.fetch_add(1, std::memory_order_relaxed);  // read after the node and executor stopped
    if (!prebuilt) return std::move(req);
    const std::size_t size = req->getData().size() + 8;
    auto it = replies.find(size);
    if (it == replies.end()) it = replies.emplace(size, BlobMaker(size).make(0)).first;
    return it->second;
  };
  bus::Subscription s;
  if (a.kv.contains("on") && a.str("on") == "bridge") {
    node.serve(kEcho, echo);  // on the bridge thread (Node::serve)
  } else {
    s = bus.serve(kEcho, echo);
    node.export_endpoint(kEcho);
  }
  uint64_t c0 = cpu_ns();
  ready();
  wait_for_stdin_eof();
  uint64_t cpu = cpu_ns() - c0;
  bus::net::NodeStats st = node.stats();
  node.stop();
  // unroutable_replies: replies the node could not hand to its ROUTER (the requester gone, or
  // the pipe back to it full): each is a request that its caller sees time out.
  std::printf("result served=%llu cpu=%llu unroutable_replies=%llu\n",
              static_cast<unsigned long long>(served.load(std::memory_order_relaxed)),
              static_cast<unsigned long long>(cpu),
              static_cast<unsigned long long>(st.unroutable_replies));
  std::fflush(stdout);
  return 0;
}

/// A client node that reaches the server's echo endpoint.
struct Client {
  bus::Bus bus;
  bus::net::Node node;
  explicit Client(const Args& a)
      : bus(bus_options(a)),
        node(bus, node_options(a, "bench-client")
                      .publish_on("tcp://127.0.0.1:*")
                      .peer(a.str("endpoint"))) {
    node.import_endpoint(kEcho);
    if (!node.wait_for_server(kEcho.name(), 30s)) fail("no server within 30 s");
  }
};

int role_rtt(const Args& a) {
  uint64_t n = a.num("count"), warm = a.num("warmup", 1000);
  const std::size_t size = a.num("size");
  const bool reuse = a.num("reuse", 0) != 0;
  BlobMaker maker(size);
  Client c(a);
  // Built once the node runs: a large message built before comes from the ordinary heap, not the
  // shared one, and is copied into shared memory each time it is sent.
  const Blob once = maker.make(0);
  std::vector<uint64_t> ns;
  ns.reserve(n);
  uint64_t bad = 0, c0 = 0;
  for (uint64_t i = 1; i <= warm + n; ++i) {
    if (i == warm + 1) c0 = cpu_ns();
    Blob req = reuse ? once : maker.make(i);
    uint64_t t = now_ns();
    absl::StatusOr<Blob> rep = c.bus.call(kEcho, std::move(req), 5s);
    uint64_t dt = now_ns() - t;
    if (!rep.ok()) fail("call: " + rep.status().ToString());
    if (reuse ? (*rep)->getData().size() != size - 8 : (*rep)->getSeq() != i) ++bad;
    if (i > warm) ns.push_back(dt);
  }
  print_latency_result(n, bad == 0, ns, cpu_ns() - c0);
  return 0;
}

/// `window` requests in flight from executor 0: each reply issues the next request.
class Pipeline {
 public:
  Pipeline(bus::Bus& bus, std::size_t size, uint64_t window, std::chrono::milliseconds timeout)
      : bus_(bus), maker_(size), window_(window), timeout_(timeout) {}

  /// Runs `n` requests through; returns the nanoseconds from the first request to the last
  /// reply, and whether every reply was right.
  std::pair<uint64_t, bool> run(uint64_t n) {
    n_ = n;
    issued_ = done_ = sum_ = failed_ = 0;
    finished_ = false;
    uint64_t t0 = 0;
    absl::Status st = bus_.post(bus::on_executor(0), [this, &t0] {
      t0 = now_ns();
      for (uint64_t w = 0; w < window_ && issued_ < n_; ++w) issue();
    });
    if (!st.ok()) fail("post: " + st.ToString());
    std::unique_lock lock(mu_);
    if (!cv_.wait_for(lock, 120s, [&] { return finished_; })) fail("pipeline timed out");
    if (failed_ > 0) {
      std::fprintf(stderr, "bus_bridge_bus: pipe: %llu of %llu requests failed\n",
                   static_cast<unsigned long long>(failed_), static_cast<unsigned long long>(n));
    }
    return {t_end_ - t0, failed_ == 0 && sum_ == n * (n + 1) / 2};
  }

 private:
  void issue() {
    bus_.request(kEcho, maker_.make(++issued_), timeout_, [this](absl::StatusOr<Blob> rep) {
      if (rep.ok()) {
        sum_ += (*rep)->getSeq();
      } else if (++failed_ == 1) {
        std::fprintf(stderr, "bus_bridge_bus: pipe: first failed request: %s\n",
                     rep.status().ToString().c_str());
      }
      if (issued_ < n_) issue();
      if (++done_ == n_) {
        t_end_ = now_ns();
        std::lock_guard lock(mu_);
        finished_ = true;
        cv_.notify_one();
      }
    });
  }

  bus::Bus& bus_;
  BlobMaker maker_;
  const uint64_t window_;
  const std::chrono::milliseconds timeout_;
  // Executor 0 only while a run is going; published to the waiting thread under mu_.
  uint64_t n_ = 0, issued_ = 0, done_ = 0, sum_ = 0, failed_ = 0, t_end_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool finished_ = false;
};

int role_pipe(const Args& a) {
  uint64_t n = a.num("count"), window = a.num("window", 1000);
  uint64_t warm = a.num("warmup", std::max<uint64_t>(window, n / 10));
  Client c(a);
  // A request whose reply is lost fails at its deadline; a short one ends such a run sooner.
  Pipeline p(c.bus, a.num("size"), window, std::chrono::milliseconds(a.num("timeout_ms", 30000)));
  p.run(warm);
  uint64_t c0 = cpu_ns();
  auto [ns, ok] = p.run(n);
  uint64_t cpu = cpu_ns() - c0;
  bus::net::NodeStats st = c.node.stats();
  std::printf("result count=%llu ok=%d ns=%llu cpu=%llu send_refused=%llu late_replies=%llu\n",
              static_cast<unsigned long long>(n), ok, static_cast<unsigned long long>(ns),
              static_cast<unsigned long long>(cpu),
              static_cast<unsigned long long>(st.send_refused),
              static_cast<unsigned long long>(st.late_replies));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: bus_bridge_bus pub|sub|server|rtt|pipe key=value...");
  Args a(argc, argv);
  std::string role = argv[1];
  if (role == "pub") return role_pub(a);
  if (role == "sub") return role_sub(a);
  if (role == "server") return role_server(a);
  if (role == "rtt") return role_rtt(a);
  if (role == "pipe") return role_pipe(a);
  fail("unknown role " + role);
}
