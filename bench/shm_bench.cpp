// Two processes on one host: the bus over shared memory, against the bus over ZeroMQ (tcp and
// ipc), Eclipse iceoryx, a Unix socket and the spinning floor, in one interleaved run.
//
//   build/bench/bus_shm [key=value...]     (bench/run_shm.sh builds it and starts RouDi)
//
// keys: runs=5, warmup=1, scale=1 (multiplies every case's count), filter= (only the cases whose
// id contains it), port=27600 (the first of the tcp ports), iceoryx=1 (0: RouDi is not running,
// skip iceoryx).
//
// Every case is processes started from the programs beside this one (bus_bridge_bus,
// bus_shm_iceoryx, bus_shm_raw): receivers (subscribers, server, pong) under `taskset -c 1`, the
// sender (publisher, client, ping) under `taskset -c 0`; see bench/process_driver.hpp. Round
// trips are one at a time, measured by the sender; throughput is messages delivered to each
// subscriber's handler per second, from the first publish to the last delivery in any
// subscriber. Large messages are built once and sent again (a Message copy is a reference), as
// iceoryx's roles loan a chunk and write only its first 8 bytes.
#include <sys/utsname.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "process_driver.hpp"

using namespace bench_driver;

namespace {

std::string bytes_name(uint64_t b) {
  if (b >= (1u << 20)) return num(b >> 20) + " MiB";
  return size_name(b);
}

/// The size in a case id: 64B, 1KiB, 4MiB.
std::string tag(uint64_t b) {
  std::string s = bytes_name(b);
  s.erase(std::remove(s.begin(), s.end(), ' '), s.end());
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> opt = bench_bridge::driver_options(argc, argv,
                                                                        {{"runs", "5"},
                                                                         {"warmup", "1"},
                                                                         {"scale", "1"},
                                                                         {"filter", ""},
                                                                         {"port", "27600"},
                                                                         {"iceoryx", "1"}});
  auto n = [&](const char* k) { return std::strtoull(opt[k].c_str(), nullptr, 10); };
  const int runs = static_cast<int>(n("runs")), warmup = static_cast<int>(n("warmup"));
  const double scale = std::strtod(opt["scale"].c_str(), nullptr);
  if (runs < 1 || scale <= 0) fail("runs must be at least 1 and scale above 0");
  const std::string dir = self_dir();
  const std::string bus = dir + "/bus_bridge_bus", raw = dir + "/bus_shm_raw",
                    ice = dir + "/bus_shm_iceoryx";
  const std::string ice_missing = ::access(ice.c_str(), X_OK) != 0
                                      ? "bus_shm_iceoryx not built (libiceoryx-posh-dev missing)"
                                  : n("iceoryx") == 0 ? "RouDi not running (iceoryx=0)"
                                                      : "";
  auto count = [&](uint64_t base) {
    return std::max<uint64_t>(200, static_cast<uint64_t>(static_cast<double>(base) * scale));
  };
  int next_port = static_cast<int>(n("port"));
  int next_name = 0;
  const std::string stem = "busshm" + num(static_cast<uint64_t>(::getpid()));
  auto tcp = [&] { return "tcp://127.0.0.1:" + num(static_cast<uint64_t>(next_port++)); };
  auto ipc = [&] { return "ipc:///tmp/" + stem + "-" + num(static_cast<uint64_t>(next_name++)); };
  auto unique = [&] { return "name=" + stem + "_" + num(static_cast<uint64_t>(next_name++)); };

  std::vector<Case> cases;
  auto add = [&](std::string id, std::string name, std::string section, Kind kind,
                 std::vector<std::string> receiver, std::vector<std::string> sender, uint64_t cnt,
                 int receivers = 1, std::string skipped = "") {
    sender.push_back("count=" + num(cnt));
    if (kind == Kind::kThroughput) receiver.push_back("count=" + num(cnt));
    cases.push_back(Case{std::move(id),
                         std::move(name),
                         std::move(section),
                         kind,
                         std::move(receiver),
                         std::move(sender),
                         cnt,
                         std::move(skipped),
                         {},
                         receivers});
  };

  // Round trips, one at a time. Counts: about a second each here, fewer for 4 MiB over ZeroMQ
  // (each copies the whole message through the kernel twice).
  for (uint64_t size : {64u, 1024u, 65536u, 4194304u}) {
    const std::string sz = "size=" + num(size), p = "rtt" + tag(size) + ".";
    const std::string section =
        "round trip, one at a time, spinning, " + bytes_name(size) + " request and reply";
    const bool huge = size >= 65536;
    const uint64_t k = huge ? 2'000 : 20'000;
    std::string e = tcp();
    add(p + "bus-shm", "bus call, shared memory", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=auto", "reply=prebuilt", sz},
        {bus, "rtt", "endpoint=" + e, "transport=auto", "reuse=1", sz}, count(k));
    e = tcp();
    add(p + "bus-shm-bridge", "bus call, shm, served on the bridge", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=auto", "reply=prebuilt", "on=bridge", sz},
        {bus, "rtt", "endpoint=" + e, "transport=auto", "reuse=1", sz}, count(k));
    e = tcp();
    add(p + "bus-zmq-tcp", "bus call, ZeroMQ tcp", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=zmq", "reply=prebuilt", sz},
        {bus, "rtt", "endpoint=" + e, "transport=zmq", "reuse=1", sz}, count(huge ? 500 : 5'000));
    e = ipc();
    add(p + "bus-zmq-ipc", "bus call, ZeroMQ ipc://", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "requests=" + ipc(), "transport=zmq", "reply=prebuilt",
         sz},
        {bus, "rtt", "endpoint=" + e, "transport=zmq", "reuse=1", sz}, count(huge ? 500 : 5'000));
    std::string u = unique();
    add(p + "iceoryx", "iceoryx 2.0 ping-pong", section, Kind::kRoundTrip,
        {ice, "pong", u, sz, "mode=spin"}, {ice, "ping", u, sz, "mode=spin"}, count(k), 1,
        ice_missing);
    u = unique();
    add(p + "uds", "Unix socket ping-pong", section, Kind::kRoundTrip,
        {raw, "pong", "kind=uds", u, sz, "mode=block"},
        {raw, "ping", "kind=uds", u, sz, "mode=block"}, count(huge ? 2'000 : 20'000));
    if (size == 64) {
      u = unique();
      add(p + "floor", "spinning floor (one cache line)", section, Kind::kRoundTrip,
          {raw, "pong", "kind=floor", u, sz, "mode=spin"},
          {raw, "ping", "kind=floor", u, sz, "mode=spin"}, count(200'000));
    }
  }
  for (uint64_t size : {64u, 1024u}) {
    const std::string sz = "size=" + num(size), p = "block" + tag(size) + ".";
    const std::string section =
        "round trip, one at a time, waiting asleep (no spin), " + bytes_name(size);
    std::string e = tcp();
    add(p + "bus-shm", "bus call, shared memory, spin 0", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=auto", "shm_spin_us=0", "spin_us=0", sz},
        {bus, "rtt", "endpoint=" + e, "transport=auto", "shm_spin_us=0", "spin_us=0", "reuse=1",
         sz},
        count(10'000));
    e = tcp();
    add(p + "bus-shm-bridge", "bus call, shm, spin 0, on the bridge", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=auto", "shm_spin_us=0", "spin_us=0",
         "on=bridge", sz},
        {bus, "rtt", "endpoint=" + e, "transport=auto", "shm_spin_us=0", "spin_us=0", "reuse=1",
         sz},
        count(10'000));
    e = tcp();
    add(p + "bus-zmq-tcp", "bus call, ZeroMQ tcp, spin 0", section, Kind::kRoundTrip,
        {bus, "server", "endpoint=" + e, "transport=zmq", "spin_us=0", sz},
        {bus, "rtt", "endpoint=" + e, "transport=zmq", "spin_us=0", "reuse=1", sz}, count(5'000));
    std::string u = unique();
    add(p + "iceoryx", "iceoryx 2.0 ping-pong, WaitSet", section, Kind::kRoundTrip,
        {ice, "pong", u, sz, "mode=block"}, {ice, "ping", u, sz, "mode=block"}, count(10'000), 1,
        ice_missing);
    u = unique();
    add(p + "uds", "Unix socket ping-pong", section, Kind::kRoundTrip,
        {raw, "pong", "kind=uds", u, sz, "mode=block"},
        {raw, "ping", "kind=uds", u, sz, "mode=block"}, count(10'000));
    u = unique();
    add(p + "floor", "futex floor (one cache line)", section, Kind::kRoundTrip,
        {raw, "pong", "kind=floor", u, sz, "mode=block"},
        {raw, "ping", "kind=floor", u, sz, "mode=block"}, count(10'000));
  }

  // One-way throughput, 1 -> 1 and 1 -> 3 (the three subscribers share core 1).
  struct Counts {
    uint64_t size, shm, zmq, ice;
  };
  for (int subs : {1, 3}) {
    for (const Counts& k :
         {Counts{64, 8'000'000, 2'000'000, 1'000'000}, Counts{1024, 3'000'000, 600'000, 1'000'000},
          Counts{65536, 50'000, 20'000, 200'000}}) {
      if (subs == 3 && k.size == 65536) continue;
      const std::string sz = "size=" + num(k.size), s = "subs=" + num(static_cast<uint64_t>(subs));
      const std::string p = "tp" + num(static_cast<uint64_t>(subs)) + "x" + tag(k.size) + ".";
      const std::string section = "throughput, publisher -> " + num(static_cast<uint64_t>(subs)) +
                                  " subscriber process" + (subs > 1 ? "es" : "") + ", " +
                                  bytes_name(k.size) + " payloads";
      const uint64_t scale_subs = static_cast<uint64_t>(subs);
      std::string e = tcp();
      add(p + "bus-shm", "bus publish, shared memory", section, Kind::kThroughput,
          {bus, "sub", "endpoint=" + e, "transport=auto", sz},
          {bus, "pub", "endpoint=" + e, "transport=auto", sz, s}, count(k.shm / scale_subs), subs);
      e = tcp();
      add(p + "bus-shm-batch", "bus publish, shm, Batch of 256", section, Kind::kThroughput,
          {bus, "sub", "endpoint=" + e, "transport=auto", sz},
          {bus, "pub", "endpoint=" + e, "transport=auto", sz, s, "batch=256"},
          count(k.shm / scale_subs), subs);
      e = tcp();
      add(p + "bus-zmq-tcp", "bus publish, ZeroMQ tcp", section, Kind::kThroughput,
          {bus, "sub", "endpoint=" + e, "transport=zmq", sz},
          {bus, "pub", "endpoint=" + e, "transport=zmq", sz, s}, count(k.zmq / scale_subs), subs);
      std::string u = unique();
      add(p + "iceoryx", "iceoryx 2.0 publish/subscribe", section, Kind::kThroughput,
          {ice, "sub", u, sz, s, "mode=spin"}, {ice, "pub", u, sz, s}, count(k.ice / scale_subs),
          subs, ice_missing);
    }
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
  std::printf("bus_shm: two processes on one host: the bus over shared memory and its peers\n");
  std::printf("command:  %s\n", cmd.c_str());
  std::printf("date:     %s\n", date);
  std::printf("machine:  nproc %ld, %s, %s %s; load average at start: %s\n",
              ::sysconf(_SC_NPROCESSORS_ONLN), cpu_model().c_str(), un.sysname, un.release,
              loadavg().c_str());
  std::printf(
      "setup:    %d interleaved runs after %d warm-up round(s); sender on core %d, "
      "receivers on core %d (taskset); bus: one executor per process, a plain thread "
      "calls, default options unless the row says\n\n",
      runs, warmup, kSenderCore, kReceiverCore);

  run_interleaved(cases, runs, warmup, [](const Case&) { return pid_t{0}; });
  std::printf(
      "\n# samples: sample|run|case|ok|value (msgs/s or p50 ns)|p50 ns|p99 ns|p99.9 ns|"
      "gaps|sender CPU ns per msg|receiver CPU ns per msg|the processes' result lines\n");
  for (const auto& c : cases) {
    for (std::size_t i = 0; i < c.samples.size(); ++i) {
      const Sample& s = c.samples[i];
      std::printf("sample|%zu|%s|%d|%.1f|%.0f|%.0f|%.0f|%llu|%.0f|%.0f|%s\n", i + 1, c.id.c_str(),
                  s.ok, s.value, s.p50, s.p99, s.p999, static_cast<unsigned long long>(s.gaps),
                  s.tx_cpu, s.rx_cpu, s.lines.c_str());
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
    return c ? stat_of(*c, what).median : 0.0;
  };

  std::printf("\n%d interleaved runs; median (min-max)\n", runs);
  std::string section;
  for (const auto& c : cases) {
    if (c.section != section) {
      section = c.section;
      std::printf("\n== %s\n", section.c_str());
      if (c.kind == Kind::kRoundTrip) {
        std::printf("%-38s %7s %8s %17s %8s %17s %9s %7s\n", "", "rt/run", "p50 us", "min-max",
                    "p99 us", "min-max", "p99.9 us", "x shm");
      } else {
        std::printf("%-38s %9s %9s %15s %7s %9s %9s %5s\n", "", "msgs/run", "M msgs/s", "min-max",
                    "shm/x", "tx ns/msg", "rx ns/msg", "gaps");
      }
    }
    if (!c.skipped.empty()) {
      std::printf("  %-36s skipped: %s\n", c.name.c_str(), c.skipped.c_str());
      continue;
    }
    Stat st = stat_of(c, &Sample::value);
    if (st.n == 0) {
      std::printf("  %-36s every run failed\n", c.name.c_str());
      continue;
    }
    std::string failed = st.n < static_cast<int>(c.samples.size())
                             ? "  (" + num(c.samples.size() - st.n) + " of " +
                                   num(c.samples.size()) + " runs failed)"
                             : "";
    const std::string prefix = c.id.substr(0, c.id.find('.') + 1);
    char range[64], ratio[32] = "-";
    if (c.kind == Kind::kRoundTrip) {
      Stat p99 = stat_of(c, &Sample::p99), p999 = stat_of(c, &Sample::p999);
      char r99[64];
      std::snprintf(range, sizeof range, "(%.2f-%.2f)", st.min / 1e3, st.max / 1e3);
      std::snprintf(r99, sizeof r99, "(%.2f-%.2f)", p99.min / 1e3, p99.max / 1e3);
      const double shm = med(prefix + "bus-shm");
      if (shm > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", st.median / shm);
      std::printf("  %-36s %7llu %8.2f %17s %8.2f %17s %9.2f %7s%s\n", c.name.c_str(),
                  static_cast<unsigned long long>(c.count), st.median / 1e3, range,
                  p99.median / 1e3, r99, p999.median / 1e3, ratio, failed.c_str());
    } else {
      uint64_t gaps = 0;
      for (const auto& s : c.samples) gaps += s.gaps + s.publish_cuts;
      std::snprintf(range, sizeof range, "(%.2f-%.2f)", st.min / 1e6, st.max / 1e6);
      const double shm = med(prefix + "bus-shm");
      if (shm > 0) std::snprintf(ratio, sizeof ratio, "%.2fx", shm / st.median);
      std::printf("  %-36s %9llu %9.3f %15s %7s %9.0f %9.0f %5llu%s\n", c.name.c_str(),
                  static_cast<unsigned long long>(c.count), st.median / 1e6, range, ratio,
                  stat_of(c, &Sample::tx_cpu).median, stat_of(c, &Sample::rx_cpu).median,
                  static_cast<unsigned long long>(gaps), failed.c_str());
    }
  }
  std::printf(
      "\nx shm: this row's p50 over the bus-over-shared-memory row's (higher: the bus is faster). "
      "shm/x: the shared-memory row's rate over this row's (higher: the bus is faster).\n"
      "tx, rx: CPU time of the whole sending / receiving processes (all receivers together), "
      "every thread, per message. gaps: messages counted lost plus publisher cuts, all runs.\n");

  std::printf("\n== targets, from the medians above\n");
  auto target = [&](const std::string& what, double v, bool higher_better, double goal,
                    const char* unit) {
    if (v <= 0) {
      std::printf("  %-60s     -   (not measured)\n", what.c_str());
      return;
    }
    bool met = higher_better ? v >= goal : v <= goal;
    std::printf("  %-60s %7.2f%s  (%s %.2f%s: %s)\n", what.c_str(), v, unit,
                higher_better ? ">=" : "<=", goal, unit, met ? "met" : "MISSED");
  };
  auto best = [&](std::initializer_list<const char*> ids, double Sample::*f, bool lower) {
    double v = 0;
    for (const char* id : ids) {
      double x = med(id, f);
      if (x > 0 && (v == 0 || (lower ? x < v : x > v))) v = x;
    }
    return v;
  };
  // The bus's best placement for a round trip: served on an executor or on the bridge thread.
  const double rtt64 = best({"rtt64B.bus-shm", "rtt64B.bus-shm-bridge"}, &Sample::p50, true);
  const double rtt4m = best({"rtt4MiB.bus-shm", "rtt4MiB.bus-shm-bridge"}, &Sample::p50, true);
  auto over = [](double a, double b) { return a > 0 && b > 0 ? a / b : 0.0; };
  target("64 B round trip p50, spinning: bus shm / iceoryx", over(rtt64, med("rtt64B.iceoryx")),
         false, 1.0, "x");
  target("64 B round trip p50, spinning: bus shm / spinning floor",
         over(rtt64, med("rtt64B.floor")), false, 2.0, "x");
  const double block64 = best({"block64B.bus-shm", "block64B.bus-shm-bridge"}, &Sample::p50, true);
  target("64 B round trip p50, asleep: bus shm / Unix socket", over(block64, med("block64B.uds")),
         false, 1.0, "x");
  target("4 MiB round trip p50 / 64 B round trip p50 (bus shm)", over(rtt4m, rtt64), false, 2.0,
         "x");
  const double tp64 = best({"tp1x64B.bus-shm", "tp1x64B.bus-shm-batch"}, &Sample::value, false);
  const double tp1k = best({"tp1x1KiB.bus-shm", "tp1x1KiB.bus-shm-batch"}, &Sample::value, false);
  target("1 -> 1 at 64 B, bus shm (M msgs/s)", tp64 / 1e6, true, 20.0, "");
  target("1 -> 1 at 64 B: bus shm / bus over ZeroMQ tcp", over(tp64, med("tp1x64B.bus-zmq-tcp")),
         true, 10.0, "x");
  target("1 -> 1 at 1 KiB, bus shm (M msgs/s)", tp1k / 1e6, true, 5.0, "");
  std::printf("  (bus shm: the better of its two rows, executor or bridge, plain or Batch)\n");
  return 0;
}
