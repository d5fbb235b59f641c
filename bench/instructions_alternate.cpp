// The cases busalt and pubalt of bench/instructions.cpp: in a Batch, to two topics in turn,
// both subscribed on the inbox, so that every message closes the other topic's run and opens
// one of its own; through Bus::publish or through two Publishers. (A file of its own: a second
// topic declared beside instructions.cpp's cases changed the code GCC made for them, and their
// figures with it.)
#include <algorithm>
#include <bus/bus.hpp>
#include <cstdint>

#include "instructions.hpp"

namespace {

using bench::kRound;
const bus::Topic<uint64_t> numbers{"bench.instructions.alternate.numbers", bus::Overflow::kBlock};
const bus::Topic<uint64_t> others{"bench.instructions.alternate.others", bus::Overflow::kBlock};

template <bool kHandle>
int alternate(uint64_t n) {
  bus::Bus b(bus::Options().executors(1));
  bus::ExternalInbox inbox(b);
  inbox.bind_to_this_thread();
  bench::Sum s;
  auto sub = inbox.subscribe(numbers, [&](const uint64_t& v) { s.take(v); });
  auto sub2 = inbox.subscribe(others, [&](const uint64_t& v) { s.take(v); });
  auto pub = b.publisher(numbers);
  auto pub2 = b.publisher(others);
  for (uint64_t i = 1; i <= n;) {
    {
      bus::Batch scope(b);
      for (uint64_t end = std::min(n, i + kRound - 1); i <= end; i += 2) {
        if constexpr (kHandle) {
          if (!pub.publish(i).ok()) return 2;
          if (i + 1 <= end && !pub2.publish(i + 1).ok()) return 2;
        } else {
          if (!b.publish(numbers, i).ok()) return 2;
          if (i + 1 <= end && !b.publish(others, i + 1).ok()) return 2;
        }
      }
    }
    inbox.drain_awake();
  }
  inbox.drain();
  return s.verify(n);
}

}  // namespace

namespace bench {
int alternate_case(uint64_t n, bool handles) {
  return handles ? alternate<true>(n) : alternate<false>(n);
}
}  // namespace bench
