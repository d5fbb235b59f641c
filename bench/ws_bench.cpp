// WebSocket bridge throughput against the same server's HTTP requests/s, in one run.
//
//   bench_ws [--seconds 5] [--runs 5]        (wrk must be installed: bench/run_ws.sh does it)
//
// One process, one HTTP I/O thread pinned to CPU 0, one bus executor (the greeting service).
// Measured in turn, interleaved over the runs:
//   http  wrk -t1 -c100 against GET /greeting/{name} (HTTP -> bus request -> service -> HTTP)
//   push  server -> client: a thread publishes greetings on a topic, at most 4,096 ahead of
//         what a Beast client (CPU 1) subscribed over the WebSocket has counted (so none is
//         dropped)
//   pub   client -> server: the Beast client sends pub frames (64 messages each) as fast as
//         the socket takes them; a bus subscriber counts what arrives
// The client only counts messages (a substring scan), so it is not the bottleneck.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <bus/schemas/greeting.capnp.h>
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>
#include <bus/http/server.hpp>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

ABSL_FLAG(int, seconds, 5, "seconds per measurement");
ABSL_FLAG(int, runs, 5, "runs (medians are reported)");

namespace {

using Greeting = bus::Message<greeting::Greeting>;
using GreetingRequest = bus::Message<greeting::GreetingRequest>;
const bus::Endpoint<GreetingRequest, Greeting> greet{"greeting", bus::Overflow::kFail};
const bus::Topic<Greeting> pushed{"bench.push", bus::Overflow::kBlock};
const bus::Topic<Greeting> published{"bench.pub", bus::Overflow::kBlock};

namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = boost::asio::ip::tcp;

void pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu % std::max(1u, std::thread::hardware_concurrency()), &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

struct Client {
  boost::asio::io_context ioc;
  websocket::stream<tcp::socket> ws{ioc};
  explicit Client(uint16_t port) {
    ws.next_layer().connect(tcp::endpoint(boost::asio::ip::make_address("127.0.0.1"), port));
    ws.handshake("127.0.0.1", "/bus");
  }
};

std::size_t count(std::string_view s, std::string_view part) {
  std::size_t n = 0;
  for (std::size_t at = s.find(part); at != std::string_view::npos; at = s.find(part, at + 1)) ++n;
  return n;
}

double http_rps(uint16_t port, int seconds) {
  std::string cmd = "taskset -c 1 wrk -t1 -c100 -d" + std::to_string(seconds) +
                    "s http://127.0.0.1:" + std::to_string(port) + "/greeting/Sergio 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return 0;
  char line[512];
  double rps = 0;
  while (std::fgets(line, sizeof line, p) != nullptr) {
    std::fputs(line, stdout);
    std::sscanf(line, "Requests/sec: %lf", &rps);
  }
  pclose(p);
  return rps;
}

double push_rate(bus::Bus& bus, uint16_t port, int seconds) {
  Client c(port);
  c.ws.write(boost::asio::buffer(std::string(R"({"op":"sub","channel":"bench.push"})")));
  beast::flat_buffer buf;
  c.ws.read(buf);  // the acknowledgement
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> received{0};
  Greeting g = bus::build<greeting::Greeting>(
      [](greeting::Greeting::Builder b) { b.setMessage("Hello Sergio"); });
  std::thread publisher([&] {
    pin(0);
    // Closed loop: at most kWindow messages ahead of the client, so the server's buffer for it
    // never fills and nothing is dropped: what is measured is what it can deliver.
    constexpr uint64_t kWindow = 4096;
    uint64_t sent = 0;
    while (!stop.load(std::memory_order_relaxed)) {
      if (sent - received.load(std::memory_order_relaxed) >= kWindow) {
        std::this_thread::yield();
        continue;
      }
      (void)bus.publish(pushed, g);
      ++sent;
    }
  });
  pin(1);
  auto start = std::chrono::steady_clock::now();
  auto end = start + std::chrono::seconds(seconds);
  std::size_t n = 0;
  while (std::chrono::steady_clock::now() < end) {
    buf.clear();
    c.ws.read(buf);
    auto d = buf.data();
    n += count(std::string_view(static_cast<const char*>(d.data()), d.size()), R"("op":"msg")");
    received.store(n, std::memory_order_relaxed);
  }
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  stop = true;
  publisher.join();
  return static_cast<double>(n) / secs;
}

double pub_rate(bus::Bus& bus, uint16_t port, int seconds) {
  std::atomic<uint64_t> got{0};
  auto sub = bus.subscribe(
      published, [&](const Greeting&) { got.fetch_add(1, std::memory_order_relaxed); },
      bus::on_executor(0));
  Client c(port);
  pin(1);
  c.ws.text(true);
  // 64 messages per frame (a JSON array), as the server batches its own.
  std::string frame = "[";
  for (int i = 0; i < 64; ++i) {
    if (i > 0) frame += ",";
    frame += R"({"op":"pub","channel":"bench.pub","body":{"message":"Hello Sergio"}})";
  }
  frame += "]";
  auto start = std::chrono::steady_clock::now();
  auto end = start + std::chrono::seconds(seconds);
  uint64_t sent = 0;
  while (std::chrono::steady_clock::now() < end) {
    c.ws.write(boost::asio::buffer(frame));
    sent += 64;
  }
  // Counted when they arrived: wait for the last one (the socket holds a few).
  while (got.load() < sent) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(sent) / secs;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  int seconds = absl::GetFlag(FLAGS_seconds);
  int runs = absl::GetFlag(FLAGS_runs);
  bus::Bus bus(bus::Options().executors(1).spin(std::chrono::microseconds(0)));
  auto service = bus.serve(
      greet,
      [](GreetingRequest&& r) {
        return bus::build<greeting::Greeting>([&](greeting::Greeting::Builder b) {
          b.setMessage(std::string("Hello ") + r->getName().cStr());
        });
      },
      bus::on_executor(0));
  bus::http::Server http(bus, bus::http::ServerOptions().io_threads(1));
  http.route(bus::http::Method::kGet, "/greeting/{name}", greet);
  http.websocket()
      .topic(pushed)
      .topic(published)
      .permit(bus::http::Permit::kSubscribe, "bench.push")
      .permit(bus::http::Permit::kPublish, "bench.pub");
  http.start();
  // The I/O thread shares CPU 0 with the executor; the clients (wrk, Beast) run on CPU 1.
  std::vector<double> h, push, pub;
  for (int r = 0; r < runs; ++r) {
    h.push_back(http_rps(http.port(), seconds));
    push.push_back(push_rate(bus, http.port(), seconds));
    pub.push_back(pub_rate(bus, http.port(), seconds));
    std::printf("run %d: http %.0f req/s, ws push %.0f msg/s, ws pub %.0f msg/s\n", r + 1, h.back(),
                push.back(), pub.back());
  }
  auto mm = [](const std::vector<double>& v) {
    return std::make_pair(*std::min_element(v.begin(), v.end()),
                          *std::max_element(v.begin(), v.end()));
  };
  double mh = median(h), mp = median(push), mb = median(pub);
  std::printf("\n%-28s %12s %12s %12s %8s\n", "measure", "median", "min", "max", "x http");
  std::printf("%-28s %12.0f %12.0f %12.0f %8s\n", "http req/s (wrk -c100)", mh, mm(h).first,
              mm(h).second, "1.00");
  std::printf("%-28s %12.0f %12.0f %12.0f %8.2f\n", "ws push msg/s (server->client)", mp,
              mm(push).first, mm(push).second, mp / mh);
  std::printf("%-28s %12.0f %12.0f %12.0f %8.2f\n", "ws pub msg/s (client->server)", mb,
              mm(pub).first, mm(pub).second, mb / mh);
  bus::http::WebSocketStats s = http.websocket_stats();
  std::printf("\nws frames out %llu for %llu messages; dropped %llu\n",
              static_cast<unsigned long long>(s.frames_out),
              static_cast<unsigned long long>(s.messages_out),
              static_cast<unsigned long long>(s.dropped));
  http.shutdown();
  http.wait();
  return 0;
}
