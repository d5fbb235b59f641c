// bus_fixture_node: one bridge node in a process of its own, for the integration tests. Flags
// set it up; each line on stdin is a command, answered by one line on stdout:
//
//   $ bus_fixture_node --name=server --serve --heartbeat-ms=50
//   ready id=4711 publish=tcp://127.0.0.1:40001 requests=tcp://127.0.0.1:40002
//   report
//   report received=0 sum=0 handled=0 readings.gaps=0 ...
//
// Answers are `word key=value ...` (values never hold spaces). The node stops at "quit" or when
// stdin closes, and the process dies with its parent (PR_SET_PDEATHSIG), so a test that crashes
// leaves nothing behind.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <atomic>
#include <bus/net/limiter.hpp>
#include <bus/net/node.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "integration/channels.hpp"
#include "support/node_support.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;

namespace {

constexpr char kUsage[] =
    "usage: bus_fixture_node [flags]\n"
    "  --name=N                 node name (also the sensor of its readings)\n"
    "  --publish-on=EP          publisher endpoint (default tcp://127.0.0.1:*)\n"
    "  --requests-on=EP         request endpoint (default tcp://127.0.0.1:*)\n"
    "  --advertise=EP           request endpoint told to peers\n"
    "  --peer=EP[,KEY]          a node to listen to (repeatable; a host name is re-resolved)\n"
    "  --etcd=URL --etcd-prefix=P  find the nodes through etcd (URL repeatable)\n"
    "  --etcd-related-only      listen only to nodes sharing a channel with this one\n"
    "  --advertise-publish=EP --resolve-every-ms=N\n"
    "  --heartbeat-ms=N --dead-after=N --stall-limit-ms=N\n"
    "  --transport=auto|zmq|shm  how peers are reached (default: $BUS_TEST_TRANSPORT, else auto)\n"
    "  --shm-ring-bytes=N --shm-heap-limit=N --max-message-bytes=N\n"
    "  --subscription-queue=N --subscriber-timeout-ms=N\n"
    "  --reading-bytes=N        pad each published reading to about N bytes\n"
    "  --slow-us=N              the readings subscriber takes N us per reading (a slow reader)\n"
    "  --ring-bytes=N           the bus's ring size (bus::Options::ring_bytes)\n"
    "  --pause-ms=N --pause-at=K  the readings subscriber stops for N ms at its K-th reading\n"
    "  --curve-public=K --curve-secret=K --allow=K (repeatable)\n"
    "  --export-readings        publish readings (commands: publish N, publish-at N RATE,\n"
    "                           pace RATE ... pace-stop)\n"
    "  --import-readings        subscribe to readings (command: report)\n"
    "  --keep-readings          keep every reading received (large ones hold their sender's\n"
    "                           shared memory until the command 'drop')\n"
    "  --export-mistyped-readings  publish StatsRequests under the readings name\n"
    "  --serve                  serve the stats endpoint\n"
    "  --hold-requests          the stats handler waits for the command 'release'\n"
    "  --import-stats           call the stats endpoint (command: call)\n"
    "  --import-mistyped-stats  call the stats name with a Reading request (command: call)\n"
    "  --limit=N                a shared rate limiter 'fixture', N per key per window (commands:\n"
    "                           admit KEY N, known KEY, exchange)\n"
    "  --limit-window-ms=N --limit-exchange-ms=N (0: only on the command 'exchange')\n"
    "  --parent=PID             exit at once if PID is no longer the parent\n";

struct Flags {
  std::string name = "node";
  std::string publish_on = "tcp://127.0.0.1:*";
  std::string requests_on = "tcp://127.0.0.1:*";
  std::string advertise;
  std::vector<bus::net::Peer> peers;
  long heartbeat_ms = 50;
  // Generous: a node under a sanitizer on a busy machine may miss a few beats while alive.
  long dead_after = 100;
  long stall_limit_ms = 60'000;
  long subscription_queue = 0, subscriber_timeout_ms = -1;  // 0, -1: the node's defaults
  long reading_bytes = 0, slow_us = 0, ring_bytes = 0, pause_ms = 0, pause_at = 0;
  bus::net::CurveKeys curve;
  std::vector<std::string> allow;
  std::vector<std::string> etcd;
  std::string etcd_prefix = "/bus/", advertise_publish;
  std::string transport = bus_test::transport_name_from_env();
  long shm_ring_bytes = 0, shm_heap_limit = 0, max_message_bytes = 0;
  long resolve_every_ms = 0;
  bool etcd_related_only = false;
  bool export_readings = false, import_readings = false, export_mistyped = false;
  bool serve = false, hold = false, import_stats = false, import_mistyped = false;
  bool keep_readings = false;
  long parent = 0;
  long limit = 0, limit_window_ms = 3'600'000, limit_exchange_ms = 0;
};

std::optional<Flags> parse(int argc, char** argv) {
  Flags f;
  const std::map<std::string_view, std::string*> text = {
      {"--name", &f.name},
      {"--publish-on", &f.publish_on},
      {"--requests-on", &f.requests_on},
      {"--advertise", &f.advertise},
      {"--etcd-prefix", &f.etcd_prefix},
      {"--advertise-publish", &f.advertise_publish},
      {"--curve-public", &f.curve.public_key},
      {"--curve-secret", &f.curve.secret_key},
      {"--transport", &f.transport}};
  const std::map<std::string_view, long*> numbers = {
      {"--heartbeat-ms", &f.heartbeat_ms},
      {"--resolve-every-ms", &f.resolve_every_ms},
      {"--dead-after", &f.dead_after},
      {"--stall-limit-ms", &f.stall_limit_ms},
      {"--subscription-queue", &f.subscription_queue},
      {"--subscriber-timeout-ms", &f.subscriber_timeout_ms},
      {"--reading-bytes", &f.reading_bytes},
      {"--slow-us", &f.slow_us},
      {"--ring-bytes", &f.ring_bytes},
      {"--pause-ms", &f.pause_ms},
      {"--pause-at", &f.pause_at},
      {"--parent", &f.parent},
      {"--limit", &f.limit},
      {"--limit-window-ms", &f.limit_window_ms},
      {"--limit-exchange-ms", &f.limit_exchange_ms},
      {"--shm-ring-bytes", &f.shm_ring_bytes},
      {"--shm-heap-limit", &f.shm_heap_limit},
      {"--max-message-bytes", &f.max_message_bytes}};
  const std::map<std::string_view, bool*> switches = {
      {"--export-readings", &f.export_readings},
      {"--import-readings", &f.import_readings},
      {"--keep-readings", &f.keep_readings},
      {"--export-mistyped-readings", &f.export_mistyped},
      {"--serve", &f.serve},
      {"--hold-requests", &f.hold},
      {"--import-stats", &f.import_stats},
      {"--import-mistyped-stats", &f.import_mistyped},
      {"--etcd-related-only", &f.etcd_related_only}};
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    std::string_view key = arg, value;
    if (auto eq = arg.find('='); eq != std::string_view::npos) {
      key = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    if (auto t = text.find(key); t != text.end()) {
      *t->second = value;
    } else if (auto n = numbers.find(key); n != numbers.end()) {
      *n->second = std::stol(std::string(value));
    } else if (auto s = switches.find(key); s != switches.end()) {
      *s->second = true;
    } else if (key == "--peer") {
      std::vector<std::string> p = absl::StrSplit(std::string(value), absl::MaxSplits(',', 1));
      f.peers.push_back({p[0], p.size() > 1 ? p[1] : ""});
    } else if (key == "--etcd") {
      f.etcd.emplace_back(value);
    } else if (key == "--allow") {
      f.allow.emplace_back(value);
    } else {
      std::fprintf(stderr, "bus_fixture_node: unknown flag %s\n%s", argv[i], kUsage);
      return std::nullopt;
    }
  }
  if ((f.export_readings || f.import_readings) && f.export_mistyped) {
    std::fprintf(stderr, "bus_fixture_node: readings and mistyped readings exclude each other\n");
    return std::nullopt;
  }
  if ((f.serve || f.import_stats) && f.import_mistyped) {
    std::fprintf(stderr, "bus_fixture_node: stats and mistyped stats exclude each other\n");
    return std::nullopt;
  }
  return f;
}

void say(const std::string& line) {
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

/// What arrived on the readings topic, per sensor.
struct Received {
  std::mutex mu;
  uint64_t count = 0;
  uint64_t seq_sum = 0;
  uint64_t bad = 0;  // readings whose padding is not what the publisher wrote (a torn message)
  std::map<std::string, uint64_t> by_sensor;
  std::vector<integ::Reading> kept;  // --keep-readings
};

/// Calls of one endpoint: how many answered, who answered, and the last failure.
struct CallResult {
  uint64_t ok = 0, failed = 0;
  int code = 0;
  std::map<std::string, uint64_t> served_by;
  std::map<int, uint64_t> codes;  // failures by absl::StatusCode
};

template <class Req, class Rep>
CallResult call(bus::Bus& bus, const bus::Endpoint<Req, Rep>& ep, const Req& req, long n,
                std::chrono::milliseconds timeout) {
  CallResult r;
  for (long i = 0; i < n; ++i) {
    absl::StatusOr<integ::StatsReply> rep = bus.call(ep, Req(req), timeout);
    if (rep.ok()) {
      ++r.ok;
      auto sensors = (*rep)->getSensors();
      if (sensors.size() > 0) ++r.served_by[sensors[0].getSensor().cStr()];
    } else {
      ++r.failed;
      r.code = static_cast<int>(rep.status().code());
      ++r.codes[r.code];
      std::fprintf(stderr, "bus_fixture_node: call failed: %s\n", rep.status().ToString().c_str());
    }
  }
  return r;
}

std::string describe(const CallResult& r) {
  std::string s = absl::StrCat("called ok=", r.ok, " failed=", r.failed, " code=", r.code);
  for (const auto& [name, n] : r.served_by) absl::StrAppend(&s, " served_by.", name, "=", n);
  for (const auto& [code, n] : r.codes) absl::StrAppend(&s, " code.", code, "=", n);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  // Dies with the test that started it, even when that test is killed.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  std::optional<Flags> flags = parse(argc, argv);
  if (!flags) return 2;
  if (flags->parent != 0 && getppid() != flags->parent) return 3;  // it died before prctl
  const Flags& f = *flags;

  bus::Options bus_options = bus::Options().executors(2);
  if (f.ring_bytes > 0) bus_options.ring_bytes(static_cast<std::size_t>(f.ring_bytes));
  bus::Bus bus{bus_options};
  auto options =
      bus::net::NodeOptions()
          .name(f.name)
          .publish_on(f.publish_on)
          .requests_on(f.requests_on)
          .heartbeat(std::chrono::milliseconds(f.heartbeat_ms), static_cast<unsigned>(f.dead_after))
          .send_stall_limit(std::chrono::milliseconds(f.stall_limit_ms));
  if (!f.advertise.empty()) options.advertise(f.advertise);
  options.transport(bus_test::transport_of(f.transport));
  if (f.shm_ring_bytes > 0) options.shm_ring_bytes(static_cast<std::size_t>(f.shm_ring_bytes));
  if (f.shm_heap_limit > 0) options.shm_heap_limit(static_cast<std::size_t>(f.shm_heap_limit));
  if (f.max_message_bytes > 0) {
    options.max_message_bytes(static_cast<std::size_t>(f.max_message_bytes));
  }
  if (f.subscription_queue > 0) options.subscription_queue(static_cast<int>(f.subscription_queue));
  if (f.subscriber_timeout_ms >= 0) {
    options.subscriber_timeout(std::chrono::milliseconds(f.subscriber_timeout_ms));
  }
  if (!f.curve.secret_key.empty()) options.curve(f.curve, f.allow);
  for (const auto& p : f.peers) options.peer(p.address, p.public_key);
  if (!f.etcd.empty()) options.etcd(f.etcd, f.etcd_prefix).etcd_related_only(f.etcd_related_only);
  if (!f.advertise_publish.empty()) options.advertise_publish(f.advertise_publish);
  if (f.resolve_every_ms > 0) options.resolve_every(std::chrono::milliseconds(f.resolve_every_ms));

  Received received;
  std::atomic<uint64_t> handled{0};
  bus_test::Gate gate;
  std::vector<bus::Subscription> subs;
  std::optional<bus::net::Node> node;
  try {
    node.emplace(bus, std::move(options));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bus_fixture_node: %s\n", e.what());
    return 4;
  }

  if (f.import_readings) {
    subs.push_back(bus.subscribe(integ::readings(), [&](const integ::Reading& r) {
      // A slow reader sleeps rather than spins: slow without taking a core from the others.
      if (f.slow_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(f.slow_us));
      if (f.pause_ms > 0 && received.count + 1 == static_cast<uint64_t>(f.pause_at)) {
        // Its ring fills meanwhile, and the node's bridge thread waits for room in it.
        std::this_thread::sleep_for(std::chrono::milliseconds(f.pause_ms));
      }
      std::string_view sensor = r->getSensor().cStr();
      const std::size_t hash = sensor.find('#');
      // The padding is one letter repeated: anything else is a message read torn.
      const bool whole = hash == std::string_view::npos ||
                         sensor.find_first_not_of('p', hash + 1) == std::string_view::npos;
      sensor = sensor.substr(0, hash);  // without the padding of --reading-bytes
      std::lock_guard lock(received.mu);
      if (!whole) ++received.bad;
      if (f.keep_readings) received.kept.push_back(r);
      ++received.count;
      received.seq_sum += r->getSeq();
      ++received.by_sensor[std::string(sensor)];
    }));
    node->import_topic(integ::readings());
  }
  if (f.export_readings) node->export_topic(integ::readings());
  if (f.export_mistyped) node->export_topic(integ::mistyped_readings());
  if (f.serve) {
    subs.push_back(bus.serve(integ::stats(), [&](integ::StatsRequest&&) {
      uint64_t n = handled.fetch_add(1) + 1;
      if (f.hold) gate.wait();
      return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
        r.setReadings(n);
        r.initSensors(1)[0].setSensor(f.name);  // who answered
      });
    }));
    node->export_endpoint(integ::stats());
  }
  if (f.import_stats) node->import_endpoint(integ::stats());
  if (f.import_mistyped) node->import_endpoint(integ::mistyped_stats());
  std::optional<bus::net::RateLimiter> limiter;
  if (f.limit > 0) {
    limiter.emplace(bus, *node, "fixture",
                    bus::net::LimiterOptions()
                        .limit(static_cast<uint64_t>(f.limit))
                        .window(std::chrono::milliseconds(f.limit_window_ms))
                        .exchange(std::chrono::milliseconds(f.limit_exchange_ms)));
  }

  say(absl::StrCat("ready id=", node->id(), " publish=", node->publish_address(),
                   " requests=", node->request_address().empty() ? "-" : node->request_address()));

  uint64_t next_seq = 0;
  // The sensor field carries the padding (after a '#'), so that readings are about
  // --reading-bytes long.
  const std::string sensor =
      f.reading_bytes > 64
          ? absl::StrCat(f.name, "#",
                         std::string(static_cast<std::size_t>(f.reading_bytes - 64), 'p'))
          : f.name;
  std::atomic<uint64_t> refused_total{0};  // read by `report` while `pace` publishes
  auto publish_one = [&] {
    uint64_t seq = ++next_seq;
    absl::Status st = f.export_mistyped
                          ? bus.publish(integ::mistyped_readings(), integ::ask(f.name))
                          : bus.publish(integ::readings(), integ::reading(sensor, seq));
    if (!st.ok()) ++refused_total;
    return st.ok();
  };
  // Before the i-th reading of a stream at `rate` a second from `start`: sleeps until it is due,
  // once a millisecond's worth (a late stream catches up).
  auto pace_to = [](std::chrono::steady_clock::time_point start, long i, long rate) {
    if (i % std::max(1L, rate / 1000) == 0) {
      std::this_thread::sleep_until(start + std::chrono::microseconds(i * 1'000'000 / rate));
    }
  };
  std::thread pacer;  // `pace`: the only publisher while it runs
  std::atomic<bool> pacing{false};
  uint64_t paced_refused = 0;
  std::string line;
  while (std::getline(std::cin, line)) {
    std::vector<std::string> w = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (w.empty()) continue;
    const std::string& cmd = w[0];
    auto arg = [&](std::size_t i, long fallback) {
      return w.size() > i ? std::stol(w[i]) : fallback;
    };
    auto bound = [&](std::size_t i) { return std::chrono::milliseconds(arg(i, 60'000)); };
    if (cmd == "quit") {
      break;
    } else if (cmd == "peer" && w.size() >= 2) {
      node->peer(w[1], w.size() > 2 ? w[2] : "");
      say("peered");
    } else if (cmd == "wait-subscribers") {
      (void)node->wait_for_subscribers(integ::kReadings, static_cast<std::size_t>(arg(1, 1)),
                                       bound(2));
      say(absl::StrCat("subscribers n=", node->subscribers(integ::kReadings)));
    } else if (cmd == "wait-server") {
      say(absl::StrCat("server ok=", node->wait_for_server(integ::kStats, bound(1)) ? 1 : 0));
    } else if (cmd == "wait-peers") {
      std::size_t want = static_cast<std::size_t>(arg(1, 1));
      (void)bus_test::eventually([&] { return node->peers().size() >= want; }, bound(2));
      say(absl::StrCat("peers n=", node->peers().size()));
    } else if (cmd == "wait-peer-count") {
      // `wait-peer-count N [bound]`: until exactly N peers are live (one dropped, say).
      std::size_t want = static_cast<std::size_t>(arg(1, 0));
      (void)bus_test::eventually([&] { return node->peers().size() == want; }, bound(2));
      say(absl::StrCat("peers n=", node->peers().size()));
    } else if (cmd == "wait-handled") {
      uint64_t want = static_cast<uint64_t>(arg(1, 1));
      (void)bus_test::eventually([&] { return handled.load() >= want; }, bound(2));
      say(absl::StrCat("handled n=", handled.load()));
    } else if (cmd == "release") {
      gate.open();
      say("released");
    } else if ((cmd == "publish" || cmd == "publish-at") && pacer.joinable()) {
      say("error pacing=1");  // one publisher at a time: `pace-stop` first
    } else if (cmd == "publish") {
      long n = arg(1, 1);
      uint64_t refused = 0;
      for (long i = 0; i < n; ++i) refused += publish_one() ? 0 : 1;
      say(absl::StrCat("published n=", n, " refused=", refused, " total=", next_seq));
    } else if (cmd == "publish-at" && w.size() >= 3) {
      // `publish-at N RATE`: N readings at RATE per second, paced per millisecond.
      long n = std::stol(w[1]), rate = std::max(1L, std::stol(w[2]));
      uint64_t refused = 0;
      auto start = std::chrono::steady_clock::now();
      for (long i = 0; i < n; ++i) {
        pace_to(start, i, rate);
        refused += publish_one() ? 0 : 1;
      }
      say(absl::StrCat("published n=", n, " refused=", refused, " total=", next_seq));
    } else if (cmd == "pace" && w.size() >= 2 && !pacer.joinable()) {
      // `pace RATE`: readings at RATE per second from a thread of their own until `pace-stop`,
      // so that the test can do things to the network meanwhile.
      const long rate = std::max(1L, std::stol(w[1]));
      pacing = true;
      paced_refused = 0;
      pacer = std::thread([&, rate] {
        auto start = std::chrono::steady_clock::now();
        for (long i = 0; pacing.load(); ++i) {
          pace_to(start, i, rate);
          paced_refused += publish_one() ? 0 : 1;
        }
      });
      say("pacing");
    } else if (cmd == "pace-stop" && pacer.joinable()) {
      pacing = false;
      pacer.join();
      say(absl::StrCat("published refused=", paced_refused, " total=", next_seq));
    } else if (cmd == "wait-received") {
      uint64_t want = static_cast<uint64_t>(arg(1, 1));
      auto count = [&] {
        std::lock_guard lock(received.mu);
        return received.count;
      };
      (void)bus_test::eventually([&] { return count() >= want; }, bound(2));
      say(absl::StrCat("received n=", count()));
    } else if (cmd == "call") {
      auto timeout = std::chrono::milliseconds(arg(2, 30'000));
      CallResult r =
          f.import_mistyped
              ? call(bus, integ::mistyped_stats(), integ::reading(f.name, 1), arg(1, 1), timeout)
              : call(bus, integ::stats(), integ::ask(f.name), arg(1, 1), timeout);
      say(describe(r));
    } else if (cmd == "admit" && limiter && w.size() >= 3) {
      long n = std::stol(w[2]);
      uint64_t admitted = 0;
      for (long i = 0; i < n; ++i) admitted += limiter->admit(w[1]).admitted ? 1 : 0;
      say(absl::StrCat("admitted n=", admitted, " known=", limiter->known(w[1])));
    } else if (cmd == "known" && limiter && w.size() >= 2) {
      bus::net::LimiterStats ls = limiter->stats();
      say(absl::StrCat("known n=", limiter->known(w[1]), " received=", ls.received,
                       " over_admitted=", ls.over_admitted));
    } else if (cmd == "exchange" && limiter) {
      limiter->exchange();
      say("exchanged");
    } else if (cmd == "drop") {
      std::lock_guard lock(received.mu);
      received.kept.clear();
      say("dropped");
    } else if (cmd == "report") {
      bus::net::NodeStats st = node->stats();
      auto rd = st.channel(integ::kReadings);
      auto sv = st.channel(integ::kStats);
      std::string s = absl::StrCat("report handled=", handled.load());
      {
        std::lock_guard lock(received.mu);
        absl::StrAppend(&s, " received=", received.count, " sum=", received.seq_sum,
                        " torn_readings=", received.bad, " kept=", received.kept.size());
        for (const auto& [sensor, n] : received.by_sensor) {
          absl::StrAppend(&s, " sensor.", sensor, "=", n);
        }
      }
      absl::StrAppend(&s, " readings.received=", rd.received, " readings.gaps=", rd.gaps,
                      " readings.rejected=", rd.rejected, " readings.peer_missed=", rd.peer_missed,
                      " stats.sent=", sv.sent, " stats.received=", sv.received,
                      " stats.rejected=", sv.rejected);
      absl::StrAppend(&s, " published=", st.published, " publish_cuts=", st.publish_cuts,
                      " publish_stalls=", st.publish_stalls, " refused=", refused_total.load(),
                      " auth_denied=", st.auth_denied, " malformed=", st.malformed_frames,
                      " peers_lost=", st.peers_lost, " peers_returned=", st.peers_returned,
                      " reconnects=", st.reconnects, " peers=", st.peers.size(),
                      " members_found=", st.members_found, " members_dropped=", st.members_dropped,
                      " members_kept=", st.members_kept,
                      " etcd_registrations=", st.etcd_registrations,
                      " etcd_errors=", st.etcd_errors, " dns_errors=", st.dns_errors,
                      " oversized=", st.oversized);
      absl::StrAppend(&s, " shm_links=", st.shm_links, " shm_handovers=", st.shm_handovers,
                      " shm_in_place=", st.shm_in_place, " shm_refused=", st.shm_refused,
                      " shm_corrupt=", st.shm_corrupt, " shm_torn_frames=", st.shm_torn_frames,
                      " shm_heap_full=", st.shm_heap_full, " shm_heap_bytes=", st.shm_heap_bytes,
                      " shm_pinned_bytes=", st.shm_pinned_bytes);
      for (const auto& p : st.peers) {
        absl::StrAppend(&s, " peer.", p.name, "=1 transport.", p.name, "=",
                        bus::net::transport_name(p.transport));
      }
      // Per peer, on the readings: what we missed of it, and what it says it missed of ours.
      for (const auto& t : st.traffic) {
        if (t.channel != integ::kReadings || t.peer == 0) continue;
        absl::StrAppend(&s, " gaps_from.", t.peer_name, "=", t.gaps, " missed_by.", t.peer_name,
                        "=", t.peer_missed);
      }
      say(s);
    } else {
      say(absl::StrCat("error unknown-command=", cmd));
    }
  }
  pacing = false;
  if (pacer.joinable()) pacer.join();
  gate.open();  // a held handler must return for the bus to stop
  limiter.reset();
  node->stop();
  subs.clear();
  node.reset();
  (void)bus.stop();
  say("bye");
  return 0;
}
