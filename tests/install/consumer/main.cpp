// A project of its own, built against the installed bus package.
#include <atomic>
#include <bus/bus.hpp>
#include <cstdio>

inline const bus::Topic<int> numbers{"consumer.numbers"};

int main() {
  std::atomic<int> got{0};
  {
    bus::Bus bus(bus::Options().executors(1));
    auto sub = bus.subscribe(numbers, [&](const int&) { got.fetch_add(1); });
    for (int i = 0; i < 100; ++i) (void)bus.publish(numbers, i);
    (void)bus.stop();
  }
  std::printf("delivered %d\n", got.load());
  return got.load() == 100 ? 0 : 1;
}
