// The compose example: GET /quote/{item} asks two services at once and answers with what they
// said within one deadline.
//
//   shop_server --port 8080 [--stock_delay_ms 500] [--deadline_ms 200] [--limit 100]
//   curl http://127.0.0.1:8080/quote/tea
//   {"item":"tea","priceCents":250,"available":12,"priceStatus":"ok","stockStatus":"ok"}
//
// Threads (docs/compose.md has the diagram): the HTTP I/O thread makes the bus request
// `shop.quote`; the Quoter service takes it on its executor and, with its Reactor, asks
// `shop.price` and `shop.stock` at once. Their replies come back to the Quoter's executor, where
// the continuation builds the Quote and answers through the Replier; the answer goes back to the
// I/O thread, which writes it. No thread waits for a reply anywhere.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <bus/schemas/shop.capnp.h>

#include <bus/compose.hpp>
#include <bus/http/server.hpp>
#include <bus/net/limiter.hpp>
#include <bus/statsd.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "../usage.hpp"

ABSL_FLAG(std::string, address, "127.0.0.1", "address to listen on");
ABSL_FLAG(uint16_t, port, 8080, "HTTP port (0: any free port)");
ABSL_FLAG(int, deadline_ms, 200, "the quote's deadline: both calls must answer within it");
ABSL_FLAG(int, price_delay_ms, 0, "how long the price service takes");
ABSL_FLAG(int, stock_delay_ms, 0, "how long the stock service takes");
ABSL_FLAG(uint64_t, limit, 0, "quotes per API key (X-Api-Key) per minute; 0: no limit");
ABSL_FLAG(std::string, statsd, "", "host:port to push StatsD figures to every second");

namespace {

using ItemRequest = bus::Message<shop::ItemRequest>;
using Price = bus::Message<shop::Price>;
using Stock = bus::Message<shop::Stock>;
using Quote = bus::Message<shop::Quote>;

// Served over HTTP: kFail, so a full ring answers at once instead of blocking the I/O thread.
inline const bus::Endpoint<ItemRequest, Quote> quote{"shop.quote", bus::Overflow::kFail};
inline const bus::Endpoint<ItemRequest, Price> price{"shop.price"};
inline const bus::Endpoint<ItemRequest, Stock> stock{"shop.stock"};

ItemRequest item_request(kj::StringPtr item) {
  return bus::build<shop::ItemRequest>([&](shop::ItemRequest::Builder b) { b.setItem(item); });
}

/// Answers after `delay` (a timer on its executor: a slow service that blocks nobody).
template <class Rep, class Make>
void answer_after(bus::Bus& bus, std::chrono::milliseconds delay, bus::Replier<Rep> reply,
                  Make make) {
  if (delay.count() <= 0) return reply(make());
  (void)bus.after(bus::on_executor(*bus.current_executor()), delay,
                  [reply = std::move(reply), make = std::move(make)]() mutable { reply(make()); });
}

/// The quote service: one Reactor, on the service's executor; it dies with the service.
struct Quoter {
  Quoter(bus::Bus& bus, std::chrono::milliseconds deadline) : reactor(bus), deadline(deadline) {}
  bus::Reactor reactor;
  std::chrono::milliseconds deadline;

  void on_quote(ItemRequest&& req, bus::Replier<Quote> reply) {
    std::string item = req->getItem().cStr();
    reactor
        .all(deadline, bus::call(price, item_request(req->getItem())),
             bus::call(stock, item_request(req->getItem())))
        .then([item, reply = std::move(reply)](absl::StatusOr<Price> p,
                                               absl::StatusOr<Stock> s) mutable {
          // Runs here, on the Quoter's executor, once both answered or the deadline passed.
          if (!p.ok() && !s.ok()) return reply(p.status());  // nothing to say: the price's error
          reply(bus::build<shop::Quote>([&](shop::Quote::Builder q) {
            q.setItem(item);
            q.setPriceStatus(p.ok() ? "ok" : p.status().ToString());
            q.setStockStatus(s.ok() ? "ok" : s.status().ToString());
            if (p.ok()) q.setPriceCents((*p)->getCents());
            if (s.ok()) q.setAvailable((*s)->getAvailable());
          }));
        });
  }
};

}  // namespace

int main(int argc, char** argv) {
  examples::usage(
      "the compose example: GET /quote/{item} asks two services at once under one deadline");
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bus::Bus bus(bus::Options().executors(2));

  // The two backends, each a service of its own; the delays make one slower than the deadline.
  auto price_delay = std::chrono::milliseconds(absl::GetFlag(FLAGS_price_delay_ms));
  auto stock_delay = std::chrono::milliseconds(absl::GetFlag(FLAGS_stock_delay_ms));
  struct Backend {};
  bus.service<Backend>(bus::on_executor(0))
      .serve_async(price,
                   [&bus, price_delay](Backend&, ItemRequest&& r, bus::Replier<Price> reply) {
                     std::string item = r->getItem().cStr();
                     answer_after(bus, price_delay, std::move(reply), [item] {
                       return bus::build<shop::Price>([&](shop::Price::Builder b) {
                         b.setItem(item);
                         b.setCents(static_cast<uint32_t>(
                             100 + 50 * item.size()));  // the finest pricing model
                       });
                     });
                   })
      .serve_async(stock,
                   [&bus, stock_delay](Backend&, ItemRequest&& r, bus::Replier<Stock> reply) {
                     std::string item = r->getItem().cStr();
                     answer_after(bus, stock_delay, std::move(reply), [item] {
                       return bus::build<shop::Stock>([&](shop::Stock::Builder b) {
                         b.setItem(item);
                         b.setAvailable(static_cast<uint32_t>(4 * item.size()));
                       });
                     });
                   });
  bus.service<Quoter>(bus::on_executor(1), bus,
                      std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms)))
      .serve_async(quote, &Quoter::on_quote);

  std::optional<bus::net::RateLimiter> limiter;
  if (uint64_t n = absl::GetFlag(FLAGS_limit); n > 0) {
    limiter.emplace(bus, "shop.quotes",
                    bus::net::LimiterOptions().limit(n).window(std::chrono::minutes(1)));
  }

  bus::http::Server http(bus, bus::http::ServerOptions()
                                  .address(absl::GetFlag(FLAGS_address))
                                  .port(absl::GetFlag(FLAGS_port)));
  // The path parameter fills ItemRequest.item; the Quote is written as JSON. The HTTP deadline
  // is longer than the quote's, so a slow backend gives a partial quote rather than a 504.
  auto route = http.route(bus::http::Method::kGet, "/quote/{item}", quote)
                   .timeout(std::chrono::milliseconds(absl::GetFlag(FLAGS_deadline_ms) + 1000));
  if (limiter) {
    route.limit(*limiter, [](const bus::http::Request& r) {
      return std::string(r.header("X-Api-Key").value_or("anonymous"));
    });
  }
  http.start();

  std::optional<bus::StatsdExporter> statsd;
  if (std::string at = absl::GetFlag(FLAGS_statsd); !at.empty()) {
    statsd.emplace(bus, bus::StatsdOptions().address(at).interval(std::chrono::seconds(1)));
    statsd->add_source(http.statsd_source());
    if (limiter) statsd->add_source(limiter->statsd_source());
  }

  std::printf("[shop] http://%s:%u/quote/tea\n", absl::GetFlag(FLAGS_address).c_str(), http.port());
  http.run_until_signal();
  statsd.reset();
  std::printf("[shop] stopped: %llu requests\n",
              static_cast<unsigned long long>(http.stats().requests));
  return 0;
}
