// What bench/instructions.cpp and bench/instructions_alternate.cpp share.
#pragma once

#include <cstdint>
#include <cstdio>

namespace bench {

/// Messages per round: the producer publishes this many, then the consumer takes them.
inline constexpr uint64_t kRound = 64;

/// What a consumer received: the values 1..n, once each, or the case fails.
struct Sum {
  uint64_t count = 0, sum = 0;
  void take(uint64_t v) {
    ++count;
    sum += v;
  }
  int verify(uint64_t n) const {
    if (count == n && sum == n * (n + 1) / 2) return 0;
    std::fprintf(stderr, "bus_instructions: received %llu (sum %llu) of %llu\n",
                 static_cast<unsigned long long>(count), static_cast<unsigned long long>(sum),
                 static_cast<unsigned long long>(n));
    return 1;
  }
};

/// The cases busalt (`handles` false) and pubalt (true): instructions_alternate.cpp.
int alternate_case(uint64_t n, bool handles);

}  // namespace bench
