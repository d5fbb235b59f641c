// Instructions per message, publish + dispatch on one thread: the regression figure of the
// internal queue issue that does not move with the machine's noise. bench/run_instructions.sh
// runs each case under `valgrind --tool=callgrind` at two message counts and divides the
// difference in instructions by the difference in messages (setup and teardown cancel out).
//
//   bus_instructions CASE N
//
// Cases (8-byte integers, 64 messages per round, then the consumer takes the round):
//   ring64     the plain reference ring, tail published once per 64 items
//   ring1      the plain reference ring, tail published per item
//   bus        Bus::publish per message from the thread that owns the subscriber's inbox
//              (an ExternalInbox), then drain()
//   busbatch   the same publishes inside a bus::Batch (one release per round), then drain()
//   pub        `bus` through a bus::Publisher made once (Publisher::publish per message)
//   pubbatch   `busbatch` through a bus::Publisher
//   busbulk    one publish_bulk() of the round to a subscribe_bulk() handler, then drain()
//   busalt     `busbatch` to two topics in turn, both subscribed on the inbox: every message
//              closes the other topic's run and opens one of its own
//   pubalt     `busalt` through two bus::Publishers (one per topic)
//   rtt        request/reply round trips on one executor that serves the endpoint too: each
//              reply's callback makes the next request (both sides of a round trip counted)
// Each consumer checks the count and the sum; a mismatch exits with status 1.
#include "instructions.hpp"

#include <atomic>
#include <bus/bus.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>

#include "plain_ring.hpp"

namespace {

using bench::kRound;
using bench::Sum;
const bus::Topic<uint64_t> numbers{"bench.instructions", bus::Overflow::kBlock};

template <uint64_t kEvery>
int ring(uint64_t n) {
  auto q = std::make_unique<bench::PlainRing<uint64_t, kEvery>>();
  Sum s;
  for (uint64_t i = 1; i <= n;) {
    for (uint64_t end = std::min(n, i + kRound - 1); i <= end; ++i) q->push(i);
    q->flush();
    q->pop_some([&](uint64_t v) { s.take(v); });
  }
  return s.verify(n);
}

// `publish(i)` is Bus::publish or a Publisher's.
template <bool kHandle>
int bus_case(uint64_t n, bool batch) {
  bus::Bus b(bus::Options().executors(1));
  bus::ExternalInbox inbox(b);
  inbox.bind_to_this_thread();
  Sum s;
  auto sub = inbox.subscribe(numbers, [&](const uint64_t& v) { s.take(v); });
  auto pub = b.publisher(numbers);
  for (uint64_t i = 1; i <= n;) {
    {
      std::optional<bus::Batch> scope;
      if (batch) scope.emplace(b);
      for (uint64_t end = std::min(n, i + kRound - 1); i <= end; ++i) {
        if constexpr (kHandle) {
          if (!pub.publish(i).ok()) return 2;
        } else {
          if (!b.publish(numbers, i).ok()) return 2;
        }
      }
    }
    inbox.drain_awake();
  }
  inbox.drain();
  return s.verify(n);
}

int bulk_case(uint64_t n) {
  bus::Bus b(bus::Options().executors(1));
  bus::ExternalInbox inbox(b);
  inbox.bind_to_this_thread();
  Sum s;
  auto sub = inbox.subscribe_bulk(numbers, [&](std::span<const uint64_t> msgs) {
    for (uint64_t v : msgs) s.take(v);
  });
  uint64_t round[kRound];
  for (uint64_t i = 1; i <= n;) {
    uint64_t k = std::min(kRound, n - i + 1);
    for (uint64_t j = 0; j < k; ++j) round[j] = i + j;
    if (!b.publish_bulk(numbers, std::span<const uint64_t>(round, k)).ok()) return 2;
    i += k;
    inbox.drain_awake();
  }
  inbox.drain();
  return s.verify(n);
}

const bus::Endpoint<uint64_t, uint64_t> echo{"bench.instructions.echo"};

int rtt_case(uint64_t n) {
  bus::Bus b(bus::Options().executors(1));
  auto server = b.serve(
      echo, [](uint64_t&& r) { return r + 1; }, bus::on_executor(0));
  struct Chain {
    bus::Bus* bus;
    uint64_t n;
    uint64_t i = 0;
    Sum s{};
    std::atomic<bool> done{false};
    void next() {
      uint64_t req = ++i;
      bus->request(echo, req, std::chrono::seconds(10), [this, req](absl::StatusOr<uint64_t> r) {
        s.take(r.ok() && *r == req + 1 ? req : 0);
        if (i < n) {
          next();
        } else {
          done.store(true);
          done.notify_one();
        }
      });
    }
  } chain{&b, n};
  if (!b.post(bus::on_executor(0), [&chain] { chain.next(); }).ok()) return 2;
  chain.done.wait(false);
  (void)b.stop();
  return chain.s.verify(n);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: %s ring64|ring1|bus|busbatch|pub|pubbatch|busbulk|busalt|pubalt|rtt N\n",
                 argv[0]);
    return 2;
  }
  std::string c = argv[1];
  uint64_t n = std::strtoull(argv[2], nullptr, 10);
  if (c == "ring64") return ring<64>(n);
  if (c == "ring1") return ring<1>(n);
  if (c == "bus") return bus_case<false>(n, false);
  if (c == "busbatch") return bus_case<false>(n, true);
  if (c == "pub") return bus_case<true>(n, false);
  if (c == "pubbatch") return bus_case<true>(n, true);
  if (c == "busbulk") return bulk_case(n);
  if (c == "busalt") return bench::alternate_case(n, false);
  if (c == "pubalt") return bench::alternate_case(n, true);
  if (c == "rtt") return rtt_case(n);
  std::fprintf(stderr, "bus_instructions: unknown case '%s'\n", c.c_str());
  return 2;
}
