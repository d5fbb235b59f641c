// The raw ZeroMQ side of the bridge benchmark (see bench/bridge_bench.cpp): what a user writes
// with cppzmq instead of the bridge. One message per frame, the payload bytes only (8 bytes of
// sequence number, then a fixed pattern), default socket options except where noted.
//
//   bus_bridge_zmq pull   endpoint=E size=S count=N     PULL binds   <- push: PUSH connects
//   bus_bridge_zmq sub    endpoint=E size=S count=N     SUB binds    <- xpub: XPUB connects
//   bus_bridge_zmq router endpoint=E                    ROUTER binds, echoes every frame
//   bus_bridge_zmq rtt    endpoint=E size=S count=N     DEALER: one request at a time
//   bus_bridge_zmq pipe   endpoint=E size=S count=N [window=1000]   DEALER: `window` in flight
//
// The receivers bind so that a sender can wait for its connection before it starts the clock:
// PUSH with ZMQ_IMMEDIATE sends a sequence-0 message that blocks until the connection is up;
// XPUB waits for the subscription (the slow-joiner wait). XPUB sets ZMQ_XPUB_NODROP and ROUTER
// ZMQ_ROUTER_MANDATORY so that, as in the bridge, a full pipe blocks the sender instead of
// dropping.
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "bridge_common.hpp"

namespace {

using namespace bench_bridge;

/// One payload: the sequence number, then the data pattern (as bus_bridge_bus's Blob.data).
struct Payload {
  std::vector<uint8_t> bytes;
  explicit Payload(std::size_t size) : bytes(size) {
    if (size < 9) fail("size must be at least 9 (8 bytes of sequence number, then data)");
    for (std::size_t j = 8; j < size; ++j) bytes[j] = pattern(j - 8);
  }
  zmq::const_buffer with(uint64_t seq) {
    std::memcpy(bytes.data(), &seq, 8);
    return zmq::buffer(bytes);
  }
};

uint64_t seq_of(const zmq::message_t& m) {
  uint64_t seq = 0;
  if (m.size() >= 8) std::memcpy(&seq, m.data(), 8);
  return seq;
}

void print_sender(uint64_t t0, uint64_t t_sent, uint64_t cpu) {
  std::printf("result t0=%llu t_sent=%llu cpu=%llu\n", static_cast<unsigned long long>(t0),
              static_cast<unsigned long long>(t_sent), static_cast<unsigned long long>(cpu));
  std::fflush(stdout);
}

/// Receives `n` payloads of `size` bytes numbered 1..n (a sequence-0 probe is skipped), checks
/// order and the checksum, prints the result line.
int receive(zmq::socket_t& s, uint64_t n, std::size_t size, uint64_t c0) {
  s.set(zmq::sockopt::rcvtimeo, 120'000);
  const uint8_t last = pattern(size - 9);
  uint64_t count = 0, sum = 0, out_of_order = 0, t_first = 0;
  zmq::message_t m;
  while (count < n) {
    if (!s.recv(m)) fail("receive timed out after 120 s");
    uint64_t seq = seq_of(m);
    if (seq == 0) continue;  // the sender's connection probe
    if (count == 0) t_first = now_ns();
    if (seq != count + 1) ++out_of_order;
    ++count;
    sum += seq + (m.size() == size ? static_cast<const uint8_t*>(m.data())[size - 1] : 0);
  }
  uint64_t t_last = now_ns(), cpu = cpu_ns() - c0;
  uint64_t expect = n * (n + 1) / 2 + n * last;
  std::printf("result count=%llu ok=%d t_first=%llu t_last=%llu cpu=%llu out_of_order=%llu\n",
              static_cast<unsigned long long>(count), sum == expect && out_of_order == 0,
              static_cast<unsigned long long>(t_first), static_cast<unsigned long long>(t_last),
              static_cast<unsigned long long>(cpu), static_cast<unsigned long long>(out_of_order));
  std::fflush(stdout);
  return 0;
}

int role_pull(const Args& a) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::pull);
  s.bind(a.str("endpoint"));
  uint64_t c0 = cpu_ns();
  ready();
  return receive(s, a.num("count"), a.num("size"), c0);
}

int role_push(const Args& a) {
  uint64_t n = a.num("count");
  Payload p(a.num("size"));
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::push);
  s.set(zmq::sockopt::immediate, 1);
  s.set(zmq::sockopt::sndtimeo, 30'000);
  s.connect(a.str("endpoint"));
  if (!s.send(p.with(0))) fail("no connection within 30 s");
  uint64_t t0 = now_ns(), c0 = cpu_ns();
  for (uint64_t i = 1; i <= n; ++i) s.send(p.with(i));
  uint64_t t_sent = now_ns();
  wait_for_stdin_eof();
  print_sender(t0, t_sent, cpu_ns() - c0);
  return 0;
}

int role_sub(const Args& a) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::sub);
  s.set(zmq::sockopt::subscribe, "");
  s.bind(a.str("endpoint"));
  uint64_t c0 = cpu_ns();
  ready();
  return receive(s, a.num("count"), a.num("size"), c0);
}

int role_xpub(const Args& a) {
  uint64_t n = a.num("count");
  Payload p(a.num("size"));
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::xpub);
  s.set(zmq::sockopt::xpub_nodrop, 1);
  s.set(zmq::sockopt::rcvtimeo, 30'000);
  s.connect(a.str("endpoint"));
  zmq::message_t subscription;
  if (!s.recv(subscription)) fail("no subscriber within 30 s");
  uint64_t t0 = now_ns(), c0 = cpu_ns();
  for (uint64_t i = 1; i <= n; ++i) s.send(p.with(i));
  uint64_t t_sent = now_ns();
  wait_for_stdin_eof();
  print_sender(t0, t_sent, cpu_ns() - c0);
  return 0;
}

int role_router(const Args& a) {
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::router);
  // A ROUTER drops a reply when the pipe back to its requester looks full (the pipe's count of
  // messages read lags behind), which loses requests of the pipelined case; MANDATORY makes a
  // blocking send wait for room instead, as a user hitting this would set it.
  s.set(zmq::sockopt::router_mandatory, 1);
  s.bind(a.str("endpoint"));
  uint64_t c0 = cpu_ns();
  ready();
  uint64_t served = 0;
  zmq::pollitem_t items[] = {{s.handle(), 0, ZMQ_POLLIN, 0}, {nullptr, 0, POLLIN, 0}};
  zmq::message_t id, m;
  for (;;) {
    // Echo all that is there, then sleep in poll (the socket, or stdin closing: stop).
    while (s.recv(id, zmq::recv_flags::dontwait)) {
      if (!id.more() || !s.recv(m)) fail("router: expected identity + payload");
      s.send(id, zmq::send_flags::sndmore);
      s.send(m, zmq::send_flags::none);
      ++served;
    }
    zmq::poll(items, 2, std::chrono::milliseconds(-1));
    if (items[1].revents != 0) break;
  }
  std::printf("result served=%llu cpu=%llu\n", static_cast<unsigned long long>(served),
              static_cast<unsigned long long>(cpu_ns() - c0));
  std::fflush(stdout);
  return 0;
}

zmq::socket_t dealer(zmq::context_t& ctx, const Args& a) {
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::rcvtimeo, 30'000);
  s.connect(a.str("endpoint"));
  return s;
}

int role_rtt(const Args& a) {
  uint64_t n = a.num("count"), warm = a.num("warmup", 1000);
  Payload p(a.num("size"));
  zmq::context_t ctx;
  zmq::socket_t s = dealer(ctx, a);
  std::vector<uint64_t> ns;
  ns.reserve(n);
  uint64_t bad = 0, c0 = 0;
  zmq::message_t m;
  for (uint64_t i = 1; i <= warm + n; ++i) {
    if (i == warm + 1) c0 = cpu_ns();
    uint64_t t = now_ns();
    s.send(p.with(i));
    if (!s.recv(m)) fail("no reply within 30 s");
    uint64_t dt = now_ns() - t;
    if (seq_of(m) != i || m.size() != p.bytes.size()) ++bad;
    if (i > warm) ns.push_back(dt);
  }
  print_latency_result(n, bad == 0, ns, cpu_ns() - c0);
  return 0;
}

/// `n` requests with `window` in flight; returns the nanoseconds and whether all came back.
std::pair<uint64_t, bool> pipeline(zmq::socket_t& s, Payload& p, uint64_t n, uint64_t window,
                                   uint64_t base) {
  uint64_t t0 = now_ns(), issued = 0, sum = 0;
  zmq::message_t m;
  for (; issued < window && issued < n;) s.send(p.with(base + ++issued));
  for (uint64_t done = 0; done < n; ++done) {
    if (!s.recv(m)) fail("no reply within 30 s");
    sum += seq_of(m) - base;
    if (issued < n) s.send(p.with(base + ++issued));
  }
  return {now_ns() - t0, sum == n * (n + 1) / 2};
}

int role_pipe(const Args& a) {
  uint64_t n = a.num("count"), window = a.num("window", 1000);
  uint64_t warm = a.num("warmup", std::max<uint64_t>(window, n / 10));
  Payload p(a.num("size"));
  zmq::context_t ctx;
  zmq::socket_t s = dealer(ctx, a);
  pipeline(s, p, warm, window, 0);
  uint64_t c0 = cpu_ns();
  auto [ns, ok] = pipeline(s, p, n, window, warm);
  std::printf("result count=%llu ok=%d ns=%llu cpu=%llu\n", static_cast<unsigned long long>(n), ok,
              static_cast<unsigned long long>(ns), static_cast<unsigned long long>(cpu_ns() - c0));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) fail("usage: bus_bridge_zmq pull|push|sub|xpub|router|rtt|pipe key=value...");
  Args a(argc, argv);
  std::string role = argv[1];
  try {
    if (role == "pull") return role_pull(a);
    if (role == "push") return role_push(a);
    if (role == "sub") return role_sub(a);
    if (role == "xpub") return role_xpub(a);
    if (role == "router") return role_router(a);
    if (role == "rtt") return role_rtt(a);
    if (role == "pipe") return role_pipe(a);
  } catch (const zmq::error_t& e) {
    fail(role + ": " + e.what());
  }
  fail("unknown role " + role);
}
