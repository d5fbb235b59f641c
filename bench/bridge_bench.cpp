// The bridge across processes, against raw ZeroMQ and NATS, in one interleaved run.
//
//   build/bench/bus_bridge [key=value...]     (bench/run_bridge.sh builds it and starts NATS)
//
// keys: runs=5, warmup=1 (unreported rounds first), scale=1 (multiplies every case's message
// count: each is set for a run of about 1-2 s here), window=1000 (pipelined requests outstanding),
// rr_size=16 (request and reply payload bytes), nats=nats://127.0.0.1:4222 (empty: skip NATS),
// nats_pid= (the broker's pid: its CPU is reported too), port=27300 (the first of the ports
// used; below Linux's ephemeral range, 32768-60999, where a connection's own local port could
// already hold one), filter= (only the cases whose id contains it).
//
// Every case is two processes, started from the programs beside this one (bus_bridge_bus,
// bus_bridge_zmq, bus_bridge_nats): the receiving side (subscriber, server) under
// `taskset -c 1`, the sending side (publisher, client) under `taskset -c 0`. The driver waits
// for the receiver's "ready", starts the sender, waits for the side that measures to print its
// "result", then closes both stdins (the stop signal) and collects the other result. Run r of
// every case comes before run r + 1 of any.
//
// Throughput is counted as the user counts it: messages delivered to the subscriber's handler
// (callback, recv) per second, from the publisher's first publish to the subscriber's last
// delivery (both CLOCK_MONOTONIC, one clock across processes). Every receiver checks the count,
// the order and a checksum; a run that fails a check is reported and left out.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "process_driver.hpp"

#ifndef BUS_BRIDGE_BUILD_TYPE
#define BUS_BRIDGE_BUILD_TYPE "unknown"
#endif

using namespace bench_driver;

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = bench_bridge::driver_options(argc, argv,
                                                                        {{"runs", "5"},
                                                                         {"warmup", "1"},
                                                                         {"scale", "1"},
                                                                         {"nats", ""},
                                                                         {"port", "27300"},
                                                                         {"filter", ""},
                                                                         {"window", "1000"},
                                                                         {"rr_size", "16"},
                                                                         {"nats_pid", "0"}});
  auto n = [&](const char* k) { return std::strtoull(opt[k].c_str(), nullptr, 10); };
  const int runs = static_cast<int>(n("runs")), warmup = static_cast<int>(n("warmup"));
  const double scale = std::strtod(opt["scale"].c_str(), nullptr);
  const uint64_t window = n("window"), rr_size = n("rr_size");
  const std::string nats = opt["nats"], dir = self_dir();
  const std::string bus = dir + "/bus_bridge_bus", zmq = dir + "/bus_bridge_zmq",
                    natsp = dir + "/bus_bridge_nats";
  const bool have_nats = ::access(natsp.c_str(), X_OK) == 0;
  const std::string nats_missing = !have_nats ? "bus_bridge_nats not built (libnats-dev missing)"
                                   : nats.empty() ? "no NATS server given (nats=URL)"
                                                  : "";
  if (runs < 1 || scale <= 0) fail("runs must be at least 1 and scale above 0");
  // Messages per run: about 1-2 s each on the machine this was written on (2 cores, shared).
  auto count = [&](uint64_t base) {
    return std::max<uint64_t>(1000, static_cast<uint64_t>(static_cast<double>(base) * scale));
  };

  // Each case gets its own port: a process still in TIME_WAIT never holds up the next one.
  int next_port = static_cast<int>(n("port"));
  auto endpoint = [&] {
    return "endpoint=tcp://127.0.0.1:" + num(static_cast<uint64_t>(next_port++));
  };

  std::vector<Case> cases;
  auto add = [&](std::string id, std::string name, std::string section, Kind kind,
                 std::vector<std::string> receiver, std::vector<std::string> sender, uint64_t cnt,
                 std::string skipped = "") {
    sender.push_back("count=" + num(cnt));
    if (kind == Kind::kThroughput) receiver.push_back("count=" + num(cnt));
    // This benchmark is about the ZeroMQ path (bench/run_shm.sh compares the shared-memory
    // one): the bus's processes share a host, and would otherwise link over shared memory.
    if (receiver.front() == bus) {
      receiver.push_back("transport=zmq");
      sender.push_back("transport=zmq");
    }
    cases.push_back(Case{std::move(id),
                         std::move(name),
                         std::move(section),
                         kind,
                         std::move(receiver),
                         std::move(sender),
                         cnt,
                         std::move(skipped),
                         {},
                         1});
  };
  // Messages per run. The bus's receiver warms up over its first million or so 16 B messages
  // (3-4 M msgs/s over the first 0.5 M, 7-10 M/s once it runs behind and every read finds
  // full frames): both bus publish rows move the same count, so they pay the same warm-up.
  // ZeroMQ's rate does not depend on its count (4.5 M/s for 1.5 M and for 8 M here).
  struct Counts {
    uint64_t size, bus, batch, pushpull, pubsub, nats;
  };
  for (const Counts& k : {Counts{16, 4'000'000, 4'000'000, 8'000'000, 6'000'000, 2'000'000},
                          Counts{64, 3'000'000, 3'000'000, 6'000'000, 5'000'000, 2'000'000},
                          Counts{1024, 400'000, 400'000, 1'000'000, 1'000'000, 500'000}}) {
    std::string sz = "size=" + num(k.size), tag = "tp" + num(k.size) + ".";
    std::string section = "throughput, publisher process -> subscriber process, " +
                          size_name(k.size) + " payloads, tcp 127.0.0.1";
    std::string e = endpoint();
    add(tag + "bus", "bus publish", section, Kind::kThroughput, {bus, "sub", e, sz},
        {bus, "pub", e, sz}, count(k.bus));
    e = endpoint();
    add(tag + "bus-batch", "bus publish, Batch of 256", section, Kind::kThroughput,
        {bus, "sub", e, sz}, {bus, "pub", e, sz, "batch=256"}, count(k.batch));
    e = endpoint();
    add(tag + "bus-bridge", "bus Batch of 256, subscriber on the bridge", section,
        Kind::kThroughput, {bus, "sub", e, sz, "on=bridge"}, {bus, "pub", e, sz, "batch=256"},
        count(k.batch));
    e = endpoint();
    add(tag + "zmq-pushpull", "ZeroMQ PUSH/PULL", section, Kind::kThroughput, {zmq, "pull", e, sz},
        {zmq, "push", e, sz}, count(k.pushpull));
    e = endpoint();
    add(tag + "zmq-pubsub", "ZeroMQ XPUB/SUB", section, Kind::kThroughput, {zmq, "sub", e, sz},
        {zmq, "xpub", e, sz}, count(k.pubsub));
    add(tag + "nats", "NATS pub/sub", section, Kind::kThroughput, {natsp, "sub", "url=" + nats, sz},
        {natsp, "pub", "url=" + nats, sz}, count(k.nats), nats_missing);
  }
  {
    std::string sz = "size=" + num(rr_size);
    std::string section = "request/reply round trip, one at a time, " + size_name(rr_size) +
                          " request and reply, tcp 127.0.0.1";
    std::string e = endpoint();
    add("rtt.bus", "bus call (plain thread)", section, Kind::kRoundTrip, {bus, "server", e},
        {bus, "rtt", e, sz}, count(10'000));
    e = endpoint();
    add("rtt.bus-spin0", "bus call, executors spin(0)", section, Kind::kRoundTrip,
        {bus, "server", e, "spin_us=0"}, {bus, "rtt", e, sz, "spin_us=0"}, count(10'000));
    e = endpoint();
    add("rtt.bus-bridge", "bus call, served on the bridge thread", section, Kind::kRoundTrip,
        {bus, "server", e, "on=bridge"}, {bus, "rtt", e, sz}, count(10'000));
    e = endpoint();
    add("rtt.zmq", "ZeroMQ DEALER/ROUTER ping-pong", section, Kind::kRoundTrip, {zmq, "router", e},
        {zmq, "rtt", e, sz}, count(10'000));
    add("rtt.nats", "NATS request (SendAsap)", section, Kind::kRoundTrip,
        {natsp, "responder", "url=" + nats, "asap=1"}, {natsp, "rtt", "url=" + nats, sz},
        count(10'000), nats_missing);
  }
  {
    std::string sz = "size=" + num(rr_size), w = "window=" + num(window);
    std::string section =
        "pipelined requests, " + size_name(rr_size) + " request and reply, tcp 127.0.0.1";
    std::string e = endpoint();
    // A lost reply fails its request at the deadline: 2 s keeps such a run short.
    add("pipe.bus", "bus request, " + num(window) + " outstanding", section, Kind::kPipelined,
        {bus, "server", e}, {bus, "pipe", e, sz, w, "timeout_ms=2000"}, count(300'000));
    e = endpoint();
    add("pipe.bus-500", "bus request, 500 outstanding", section, Kind::kPipelined,
        {bus, "server", e}, {bus, "pipe", e, sz, "window=500", "timeout_ms=2000"}, count(300'000));
    e = endpoint();
    add("pipe.bus-bridge", "bus request, " + num(window) + " outstanding, served on the bridge",
        section, Kind::kPipelined, {bus, "server", e, "on=bridge"},
        {bus, "pipe", e, sz, w, "timeout_ms=2000"}, count(300'000));
    e = endpoint();
    add("pipe.zmq", "ZeroMQ DEALER/ROUTER, " + num(window) + " outstanding", section,
        Kind::kPipelined, {zmq, "router", e}, {zmq, "pipe", e, sz, w}, count(1'000'000));
    add("pipe.nats", "NATS PublishRequest, " + num(window) + " outstanding", section,
        Kind::kPipelined, {natsp, "responder", "url=" + nats, "asap=0"},
        {natsp, "pipe", "url=" + nats, sz, w}, count(500'000), nats_missing);
  }
  const std::string filter = opt["filter"];
  std::erase_if(cases, [&](const Case& c) {
    return !filter.empty() && c.id.find(filter) == std::string::npos;
  });

  std::string cmd;
  for (int i = 0; i < argc; ++i) cmd += (i ? " " : "") + std::string(argv[i]);
  struct utsname un {};
  ::uname(&un);
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  std::printf("bus_bridge: the bridge across processes, against raw ZeroMQ and NATS\n");
  std::printf("command:  %s\n", cmd.c_str());
  std::printf("date:     %s\n", date);
  std::printf("machine:  nproc %ld, %s, %s %s; load average at start: %s\n",
              ::sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), un.sysname, un.release,
              loadavg().c_str());
  std::printf("build:    %s, compiler %s\n", BUS_BRIDGE_BUILD_TYPE, __VERSION__);
  std::printf(
      "setup:    %d interleaved runs after %d warm-up round(s); every case is two processes, "
      "sender (publisher, client) on core %d, receiver (subscriber, server) on core %d "
      "(taskset); bus: one executor per process, default options unless the row says; "
      "NATS: %s\n",
      runs, warmup, kSenderCore, kReceiverCore,
      nats.empty() ? "not run" : (nats + " (nats-server, not pinned)").c_str());
  std::printf("\n");

  run_interleaved(cases, runs, warmup, [&](const Case& c) {
    return c.id.find("nats") != std::string::npos ? static_cast<pid_t>(n("nats_pid")) : 0;
  });
  std::printf(
      "\n# samples: sample|run|case|ok|value (msgs/s, req/s or p50 ns)|p50 ns|p99 ns|p99.9 ns|"
      "gaps|publish_cuts|lost replies|sender CPU ns per msg|receiver CPU ns per msg|broker "
      "CPU ns per msg|the processes' result lines\n");
  for (const auto& c : cases) {
    for (std::size_t i = 0; i < c.samples.size(); ++i) {
      const Sample& s = c.samples[i];
      std::printf("sample|%zu|%s|%d|%.1f|%.0f|%.0f|%.0f|%llu|%llu|%llu|%.0f|%.0f|%.0f|%s\n", i + 1,
                  c.id.c_str(), s.ok, s.value, s.p50, s.p99, s.p999,
                  static_cast<unsigned long long>(s.gaps),
                  static_cast<unsigned long long>(s.publish_cuts),
                  static_cast<unsigned long long>(s.lost), s.tx_cpu, s.rx_cpu, s.broker_cpu,
                  s.lines.c_str());
    }
  }

  auto find = [&](const std::string& id) -> const Case* {
    for (const auto& c : cases) {
      if (c.id == id && c.skipped.empty()) return &c;
    }
    return nullptr;
  };
  auto med = [&](const std::string& id, double Sample::*what = &Sample::value) {
    const Case* c = find(id);
    return c ? stat_of(*c, what) : Stat{};
  };
  auto x = [](double a, double b) -> std::string {
    if (a <= 0 || b <= 0) return "-";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2fx", a / b);
    return buf;
  };

  std::printf("\n%d interleaved runs; median (min-max); ratios are of medians\n", runs);
  std::string section;
  for (const auto& c : cases) {
    if (c.section != section) {
      section = c.section;
      std::printf("\n== %s\n", section.c_str());
      switch (c.kind) {
        case Kind::kThroughput:
          std::printf("%-32s %9s %9s %15s %7s %7s %9s %9s %5s\n", "", "msgs/run", "M msgs/s",
                      "min-max", "bus/x", "batch/x", "tx ns/msg", "rx ns/msg", "gaps");
          break;
        case Kind::kRoundTrip:
          std::printf("%-32s %7s %7s %13s %7s %13s %8s %7s %7s %9s %9s\n", "", "rt/run", "p50 us",
                      "min-max", "p99 us", "min-max", "p99.9 us", "p50 x/z", "p99 x/z", "cli us/rt",
                      "srv us/rt");
          break;
        case Kind::kPipelined:
          std::printf("%-40s %8s %8s %15s %7s %10s %10s\n", "", "req/run", "k req/s", "min-max",
                      "x/zmq", "cli us/req", "srv us/req");
          break;
      }
    }
    if (!c.skipped.empty()) {
      std::printf("  %-30s skipped: %s\n", c.name.c_str(), c.skipped.c_str());
      continue;
    }
    std::string prefix = c.id.substr(0, c.id.find('.') + 1);
    Stat st = stat_of(c, &Sample::value);
    Stat tx = stat_of(c, &Sample::tx_cpu), rx = stat_of(c, &Sample::rx_cpu);
    std::string failed = st.n < static_cast<int>(c.samples.size())
                             ? "  (" + num(c.samples.size() - st.n) + " of " +
                                   num(c.samples.size()) + " runs failed)"
                             : "";
    if (st.n == 0) {
      uint64_t lo = UINT64_MAX, hi = 0;
      for (const auto& smp : c.samples) {
        lo = std::min(lo, smp.lost);
        hi = std::max(hi, smp.lost);
      }
      std::printf("  %-30s every run failed", c.name.c_str());
      if (hi > 0) {
        std::printf(": %llu-%llu replies lost per run (the server's unroutable_replies)",
                    static_cast<unsigned long long>(lo), static_cast<unsigned long long>(hi));
      }
      std::printf("\n");
      continue;
    }
    Stat broker = stat_of(c, &Sample::broker_cpu);
    if (broker.median > 0) {
      failed += "  (+ broker " + num(static_cast<uint64_t>(broker.median + 0.5)) +
                (c.kind == Kind::kThroughput ? " ns/msg)" : " ns/req)");
    }
    char range[64];
    switch (c.kind) {
      case Kind::kThroughput: {
        uint64_t gaps = 0;
        for (const auto& s : c.samples) gaps += s.gaps + s.publish_cuts;
        std::snprintf(range, sizeof range, "(%.2f-%.2f)", st.min / 1e6, st.max / 1e6);
        std::string g = c.id.find("bus") != std::string::npos ? num(gaps) : "-";
        std::printf("  %-30s %9llu %9.2f %15s %7s %7s %9.0f %9.0f %5s%s\n", c.name.c_str(),
                    static_cast<unsigned long long>(c.count), st.median / 1e6, range,
                    x(med(prefix + "bus").median, st.median).c_str(),
                    x(med(prefix + "bus-batch").median, st.median).c_str(), tx.median, rx.median,
                    g.c_str(), failed.c_str());
        break;
      }
      case Kind::kRoundTrip: {
        Stat p99 = stat_of(c, &Sample::p99), p999 = stat_of(c, &Sample::p999);
        char r99[64];
        std::snprintf(range, sizeof range, "(%.0f-%.0f)", st.min / 1e3, st.max / 1e3);
        std::snprintf(r99, sizeof r99, "(%.0f-%.0f)", p99.min / 1e3, p99.max / 1e3);
        std::printf("  %-30s %7llu %7.1f %13s %7.1f %13s %8.1f %7s %7s %9.1f %9.1f%s\n",
                    c.name.c_str(), static_cast<unsigned long long>(c.count), st.median / 1e3,
                    range, p99.median / 1e3, r99, p999.median / 1e3,
                    x(st.median, med("rtt.zmq", &Sample::p50).median).c_str(),
                    x(p99.median, med("rtt.zmq", &Sample::p99).median).c_str(), tx.median / 1e3,
                    rx.median / 1e3, failed.c_str());
        break;
      }
      case Kind::kPipelined:
        std::snprintf(range, sizeof range, "(%.1f-%.1f)", st.min / 1e3, st.max / 1e3);
        std::printf("  %-38s %8llu %8.1f %15s %7s %10.2f %10.2f%s\n", c.name.c_str(),
                    static_cast<unsigned long long>(c.count), st.median / 1e3, range,
                    x(st.median, med("pipe.zmq").median).c_str(), tx.median / 1e3, rx.median / 1e3,
                    failed.c_str());
        break;
    }
  }
  std::printf(
      "\nbus/x, batch/x: the bus row's median over this row's (higher: the bus is faster); x/z, "
      "x/zmq: this row over raw ZeroMQ's (latency: lower is better; rate: higher).\n"
      "tx, rx, cli, srv: CPU time of the whole sending / receiving (client / server) process, "
      "every thread, per message or request; NATS's broker (nats-server) is not in them: its CPU "
      "per message or request is shown after the row when its pid is known.\n"
      "gaps: messages the subscriber's bridge counted as lost plus times the publisher sent on "
      "without it (publish_cuts), summed over all runs.\n");

  std::printf("\n== targets, from the medians above\n");
  // goal 0: the ratio alone, beside the targets.
  auto target = [&](const std::string& what, const std::string& a, const std::string& b,
                    double Sample::*field, bool higher_better, double goal) {
    if (!find(a) || !find(b)) return;  // filtered out or skipped
    double va = med(a, field).median, vb = med(b, field).median;
    if (va <= 0 || vb <= 0) {
      std::printf("  %-52s     -   (%s %.2fx: not measured, every run failed)\n", what.c_str(),
                  higher_better ? ">=" : "<=", goal);
      return;
    }
    double v = va / vb;
    if (goal == 0) {
      std::printf("  %-52s %5.2fx\n", what.c_str(), v);
      return;
    }
    bool met = higher_better ? v >= goal : v <= goal;
    std::printf("  %-52s %5.2fx  (%s %.2fx: %s)\n", what.c_str(), v,
                higher_better ? ">=" : "<=", goal, met ? "met" : "MISSED");
  };
  for (uint64_t size : {16, 64, 1024}) {
    std::string p = "tp" + num(size) + ".", sz = size_name(size);
    for (auto [id, name] : {std::pair<std::string, std::string>{"bus", "bus"},
                            {"bus-batch", "bus Batch"},
                            {"bus-bridge", "bus Batch, sub on bridge"}}) {
      target(name + " " + sz + " / ZeroMQ PUSH/PULL", p + id, p + "zmq-pushpull", &Sample::value,
             true, 0.9);
      target(name + " " + sz + " / ZeroMQ XPUB/SUB", p + id, p + "zmq-pubsub", &Sample::value, true,
             0.9);
      target(name + " " + sz + " / NATS pub/sub", p + id, p + "nats", &Sample::value, true, 2.0);
    }
  }
  target("pipelined, " + num(window) + " outstanding: bus / ZeroMQ", "pipe.bus", "pipe.zmq",
         &Sample::value, true, 0.5);
  target("pipelined, " + num(window) + " outstanding: bus on the bridge / ZeroMQ",
         "pipe.bus-bridge", "pipe.zmq", &Sample::value, true, 0.5);
  // The raw server answers on the thread that reads its socket; so does Node::serve. A server
  // on an executor adds two thread hops on the server (bridge -> executor -> bridge): shown
  // beside, for what that placement costs, not held to the target.
  target("round trip p50, bus on the bridge / ZeroMQ DEALER/ROUTER", "rtt.bus-bridge", "rtt.zmq",
         &Sample::p50, false, 1.2);
  target("round trip p99, bus on the bridge / ZeroMQ DEALER/ROUTER", "rtt.bus-bridge", "rtt.zmq",
         &Sample::p99, false, 1.25);
  if (find("rtt.bus") && find("rtt.zmq")) {
    std::printf(
        "  the same with the server on an executor (two more thread hops on the server):\n");
  }
  for (auto [id, name] :
       {std::pair<std::string, std::string>{"rtt.bus", "bus"}, {"rtt.bus-spin0", "bus spin(0)"}}) {
    target("round trip p50, " + name + " / ZeroMQ DEALER/ROUTER", id, "rtt.zmq", &Sample::p50,
           false, 0);
    target("round trip p99, " + name + " / ZeroMQ DEALER/ROUTER", id, "rtt.zmq", &Sample::p99,
           false, 0);
  }
  return 0;
}
