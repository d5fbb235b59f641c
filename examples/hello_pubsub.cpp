// Typed pub/sub, a stateful service and a request/reply on one in-process bus.
#include <bus/bus.hpp>
#include <chrono>
#include <cstdio>
#include <string>

struct Tick {
  std::string symbol;
  double price;
};
struct Quote {
  std::string symbol;
};

inline const bus::Topic<Tick> ticks{"market.ticks"};
inline const bus::Endpoint<Quote, double> last_price{"market.last_price"};

// A service: its state is touched only by its own handlers, one at a time, so it needs no lock.
struct PriceBook {
  std::string last_symbol;
  double last = 0;
  int seen = 0;
  void on_tick(const Tick& t) {
    last_symbol = t.symbol;
    last = t.price;
    ++seen;
  }
  double quote(const Quote& q) { return q.symbol == last_symbol ? last : -1; }
};

int main() {
  using namespace std::chrono_literals;
  bus::Bus bus(bus::Options().executors(2));

  auto printer = bus.subscribe(ticks, [](const Tick& t) {
    std::printf("subscriber: %s at %.2f\n", t.symbol.c_str(), t.price);
  });
  auto book = bus.service<PriceBook>();
  book.subscribe(ticks, &PriceBook::on_tick).serve(last_price, &PriceBook::quote);

  for (double p : {101.5, 102.25, 101.75}) {
    if (auto s = bus.publish(ticks, Tick{"ACME", p}); !s.ok())
      std::printf("publish: %s\n", s.ToString().c_str());
  }

  // Blocking call from a plain thread; every request carries a deadline.
  absl::StatusOr<double> price = bus.call(last_price, Quote{"ACME"}, 1s);
  std::printf("request: last ACME price = %s\n",
              price.ok() ? std::to_string(*price).c_str() : price.status().ToString().c_str());

  (void)bus.stop();  // drains: everything published above has been delivered
  std::printf("service saw %d ticks; stats: published=%llu delivered=%llu\n", book.state().seen,
              static_cast<unsigned long long>(bus.stats().channel("market.ticks")->published),
              static_cast<unsigned long long>(bus.stats().channel("market.ticks")->delivered));
}
