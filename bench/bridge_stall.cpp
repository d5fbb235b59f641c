// A subscriber that stops, and what it costs the others: one publisher process and three
// subscriber processes on one topic; in every other run the third subscriber is stopped
// (SIGSTOP) for a window in the middle of the publishing, then continued (SIGCONT).
//
//   build/bench/bus_bridge_stall [key=value...]      (bench/run_stall.sh builds and runs it)
//
// keys: runs=5 (runs of each kind, interleaved: without the stall, with it), size=64 (payload
// bytes), rate=0 (messages/s the publisher aims at; 0: as fast as it goes), before_ms=1000,
// stall_ms=3000, after_ms=1000 (the publishing: before the stop, stopped, after it),
// bucket_ms=10, port=27400 (the publisher's port; each run takes the next).
//
// Reported: the two healthy subscribers' delivery rate (messages handed to their handlers per
// second) over the stall window, in the runs with the stall and in the same window of the runs
// without it, and the ratio of the medians. Every subscriber must account for every message
// (received + counted gaps == published) at the end; its gaps and what the publisher learned it
// missed (peer_missed) are printed. Processes are not pinned: four of them share the cores.
//
// The same program is each role (the driver starts it again with one):
//   bus_bridge_stall pub endpoint=tcp://127.0.0.1:P peers=EP,EP,EP size= rate= ms=
//   bus_bridge_stall sub name=sub1 endpoint=tcp://127.0.0.1:P bucket_ms=10
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bus/bus.hpp>
#include <bus/message.hpp>
#include <bus/net/node.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.capnp.h"
#include "bridge_common.hpp"

using namespace std::chrono_literals;
using namespace bench_bridge;

namespace {

using Blob = bus::Message<bench::Blob>;
inline const bus::Topic<Blob> kBlobs{"bench.stall"};
const std::vector<std::string> kSubs = {"sub1", "sub2", "sub3"};  // sub3 is the one stopped

// ---- roles -------------------------------------------------------------------------------------

int role_pub(const Args& a) {
  const uint64_t rate = a.num("rate", 0), ms = a.num("ms");
  bus::Bus bus(bus::Options().executors(1));
  auto options = bus::net::NodeOptions().name("pub").publish_on(a.str("endpoint"));
  std::stringstream peers(a.str("peers"));  // to hear what the subscribers say they missed
  for (std::string p; std::getline(peers, p, ',');) options.peer(p);
  bus::net::Node node(bus, options);
  node.export_topic(kBlobs);
  if (!node.wait_for_subscribers(kBlobs.name(), kSubs, 30s)) fail("subscribers missing");
  bus::Builder<bench::Blob> b;
  b->initData(static_cast<unsigned>(std::max<uint64_t>(a.num("size"), 9) - 8));
  const uint64_t t0 = now_ns(), end = t0 + ms * 1'000'000;
  std::printf("started t0=%llu\n", static_cast<unsigned long long>(t0));
  std::fflush(stdout);
  uint64_t n = 0;
  for (uint64_t t = t0; t < end; t = now_ns()) {
    // Paced per millisecond when a rate is given; in runs of 64 between clock reads when not.
    uint64_t due = rate == 0 ? n + 64 : (t - t0) * rate / 1'000'000'000 + 1;
    if (due <= n) {
      std::this_thread::sleep_for(100us);
      continue;
    }
    for (; n < due; ++n) {
      b->setSeq(n + 1);
      if (!bus.publish(kBlobs, b.message()).ok()) fail("publish refused");
    }
  }
  std::printf("published n=%llu\n", static_cast<unsigned long long>(n));
  std::fflush(stdout);
  // Then the driver says what each subscriber counted missing ("missed sub1=N ..."): wait, within
  // a bound, until their heartbeats have told us the same.
  std::map<std::string, uint64_t> told;
  std::string line;
  if (std::getline(std::cin, line)) {
    std::istringstream in(line);
    for (std::string kv; in >> kv;) {
      if (auto eq = kv.find('='); eq != std::string::npos) {
        told[kv.substr(0, eq)] = std::strtoull(kv.c_str() + eq + 1, nullptr, 10);
      }
    }
  }
  auto missed_by = [&](const bus::net::NodeStats& st) {
    std::map<std::string, uint64_t> m;
    for (const auto& t : st.traffic) {
      if (t.channel == kBlobs.name() && t.peer != 0) m[t.peer_name] += t.peer_missed;
    }
    return m;
  };
  bus::net::NodeStats s = node.stats();
  for (auto until = std::chrono::steady_clock::now() + 10s;
       missed_by(s) != told && std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(10ms)) {
    s = node.stats();
  }
  std::string missed;
  for (const auto& [name, count] : missed_by(s)) {
    missed += " missed_by." + name + "=" + std::to_string(count);
  }
  std::printf("result published=%llu publish_cuts=%llu publish_stalls=%llu peers_lost=%llu%s\n",
              static_cast<unsigned long long>(s.published),
              static_cast<unsigned long long>(s.publish_cuts),
              static_cast<unsigned long long>(s.publish_stalls),
              static_cast<unsigned long long>(s.peers_lost), missed.c_str());
  std::fflush(stdout);
  wait_for_stdin_eof();
  return 0;
}

int role_sub(const Args& a) {
  const uint64_t bucket_ns = a.num("bucket_ms", 10) * 1'000'000, start = now_ns();
  bus::Bus bus(bus::Options().executors(1));
  bus::net::Node node(bus, bus::net::NodeOptions()
                               .name(a.str("name"))
                               .publish_on("tcp://127.0.0.1:*")
                               .peer(a.str("endpoint")));
  // The handler's thread only, until the counts are read after the subscription is cancelled.
  std::vector<uint32_t> buckets;
  uint64_t count = 0;
  auto sub = bus.subscribe(kBlobs, [&](const Blob&) {
    std::size_t i = (now_ns() - start) / bucket_ns;
    if (i >= buckets.size()) buckets.resize(i + 1);
    ++buckets[i];
    ++count;
  });
  node.import_topic(kBlobs);
  std::printf("ready publish=%s\n", node.publish_address().c_str());
  std::fflush(stdout);
  std::string line;
  if (!std::getline(std::cin, line) || line.rfind("expect ", 0) != 0) return 0;
  const uint64_t n = std::strtoull(line.c_str() + 7, nullptr, 10);
  // Everything published is received or counted as a gap once the tail is known (the
  // publisher's heartbeats say how far it went).
  auto until = std::chrono::steady_clock::now() + 60s;
  bus::net::ChannelTraffic t;
  for (;;) {
    t = node.stats().channel(kBlobs.name());
    if (t.received + t.gaps >= n || std::chrono::steady_clock::now() > until) break;
    std::this_thread::sleep_for(10ms);
  }
  const bool ok = t.received + t.gaps == n;
  // Waits for a running handler: the counts are ours now. The node stays (its heartbeats tell
  // the publisher what it missed) until the driver closes our stdin.
  sub.cancel();
  std::string counts;
  for (std::size_t i = 0; i < buckets.size(); ++i) {
    if (i > 0) counts += ',';
    counts += std::to_string(buckets[i]);
  }
  std::printf(
      "result ok=%d count=%llu received=%llu gaps=%llu start=%llu bucket_ns=%llu "
      "buckets=%s\n",
      ok, static_cast<unsigned long long>(count), static_cast<unsigned long long>(t.received),
      static_cast<unsigned long long>(t.gaps), static_cast<unsigned long long>(start),
      static_cast<unsigned long long>(bucket_ns), counts.c_str());
  std::fflush(stdout);
  wait_for_stdin_eof();
  return 0;
}

// ---- driver ------------------------------------------------------------------------------------

/// A role process, read line by line.
struct Proc {
  pid_t pid = -1;
  int in = -1;
  FILE* out = nullptr;

  static Proc start(const std::vector<std::string>& argv) {
    int to[2], from[2];
    if (::pipe2(to, O_CLOEXEC) != 0 || ::pipe2(from, O_CLOEXEC) != 0) fail("pipe2 failed");
    pid_t pid = ::fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
      ::dup2(to[0], 0);
      ::dup2(from[1], 1);
      std::vector<char*> args;
      for (const auto& s : argv) args.push_back(const_cast<char*>(s.c_str()));
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(to[0]);
    ::close(from[1]);
    return Proc{pid, to[1], ::fdopen(from[0], "r")};
  }
  /// The next line that starts with `word` (others are echoed to stderr), or fail.
  std::map<std::string, std::string> expect(const std::string& word) {
    char buf[1 << 16];
    std::string line;
    while (out != nullptr && std::fgets(buf, sizeof buf, out) != nullptr) {
      line += buf;
      if (line.empty() || line.back() != '\n') continue;  // a line longer than the buffer
      line.pop_back();
      if (line.rfind(word + " ", 0) == 0 || line == word) {
        std::map<std::string, std::string> kv;
        std::istringstream in(line.substr(word.size()));
        for (std::string f; in >> f;) {
          auto eq = f.find('=');
          if (eq != std::string::npos) kv[f.substr(0, eq)] = f.substr(eq + 1);
        }
        return kv;
      }
      std::fprintf(stderr, "  (%d said: %s)\n", pid, line.c_str());
      line.clear();
    }
    fail("a role process ended before saying '" + word + "'");
  }
  void say(const std::string& line) {
    std::string l = line + "\n";
    if (::write(in, l.data(), l.size()) != static_cast<ssize_t>(l.size())) fail("write failed");
  }
  void close_stdin() {
    if (in >= 0) ::close(in);
    in = -1;
  }
  void finish() {
    close_stdin();
    int st = 0;
    if (pid > 0) ::waitpid(pid, &st, 0);
    if (out != nullptr) std::fclose(out);
    out = nullptr;
    pid = -1;
  }
};

uint64_t u64(const std::map<std::string, std::string>& kv, const std::string& k) {
  auto it = kv.find(k);
  return it == kv.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

/// Messages delivered in [from, to) (ns, CLOCK_MONOTONIC), from a subscriber's buckets: only
/// whole buckets inside the window.
double rate_in(const std::map<std::string, std::string>& r, uint64_t from, uint64_t to) {
  const uint64_t start = u64(r, "start"), width = u64(r, "bucket_ns");
  std::stringstream in(r.at("buckets"));
  uint64_t sum = 0, first = 0, last = 0;
  std::size_t i = 0;
  for (std::string c; std::getline(in, c, ','); ++i) {
    uint64_t b0 = start + i * width;
    if (b0 < from || b0 + width > to) continue;
    if (first == 0) first = b0;
    last = b0 + width;
    sum += std::strtoull(c.c_str(), nullptr, 10);
  }
  return last > first ? static_cast<double>(sum) * 1e9 / static_cast<double>(last - first) : 0;
}

int drive(int argc, char** argv) {
  std::map<std::string, std::string> opt = driver_options(argc, argv,
                                                          {{"runs", "5"},
                                                           {"size", "64"},
                                                           {"rate", "0"},
                                                           {"before_ms", "1000"},
                                                           {"stall_ms", "3000"},
                                                           {"after_ms", "1000"},
                                                           {"bucket_ms", "10"},
                                                           {"port", "27400"}});
  auto n = [&](const char* k) { return std::strtoull(opt[k].c_str(), nullptr, 10); };
  const uint64_t before = n("before_ms") * 1'000'000, stall = n("stall_ms") * 1'000'000;
  const uint64_t total_ms = n("before_ms") + n("stall_ms") + n("after_ms");
  const std::string me = self_exe();
  std::string cmd;
  for (int i = 0; i < argc; ++i) {
    if (i > 0) cmd += ' ';
    cmd += argv[i];
  }
  std::time_t now = std::time(nullptr);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S %Z", std::localtime(&now));
  std::ifstream la("/proc/loadavg");
  std::string l1, l5, l15;
  la >> l1 >> l5 >> l15;
  std::printf(
      "bus_bridge_stall: one publisher, three subscribers; sub3 stopped in every other run\n");
  std::printf("command:  %s\ndate:     %s\nmachine:  nproc %ld; load average at start: %s %s %s\n",
              cmd.c_str(), date, ::sysconf(_SC_NPROCESSORS_ONLN), l1.c_str(), l5.c_str(),
              l15.c_str());
  std::printf(
      "setup:    %s B payloads, rate %s; publishing %llu ms: sub3 stopped from %s ms for "
      "%s ms in the stall runs; processes not pinned; default NodeOptions\n\n",
      opt["size"].c_str(), n("rate") == 0 ? "as fast as it goes" : opt["rate"].c_str(),
      static_cast<unsigned long long>(total_ms), opt["before_ms"].c_str(), opt["stall_ms"].c_str());

  std::map<bool, std::vector<double>> healthy;  // by "stalled": each run's mean of sub1, sub2
  int port = static_cast<int>(n("port")), failed = 0;
  for (uint64_t run = 0; run < 2 * n("runs"); ++run) {
    const bool stalled = run % 2 == 1;
    const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(port++);
    std::vector<Proc> subs;
    std::string peers;
    for (const std::string& name : kSubs) {
      subs.push_back(Proc::start(
          {me, "sub", "name=" + name, "endpoint=" + endpoint, "bucket_ms=" + opt["bucket_ms"]}));
      if (!peers.empty()) peers += ',';
      peers += subs.back().expect("ready").at("publish");
    }
    Proc pub =
        Proc::start({me, "pub", "endpoint=" + endpoint, "peers=" + peers, "size=" + opt["size"],
                     "rate=" + opt["rate"], "ms=" + std::to_string(total_ms)});
    const uint64_t t0 = u64(pub.expect("started"), "t0");
    uint64_t from = t0 + before, to = t0 + before + stall;
    if (stalled) {
      std::this_thread::sleep_for(std::chrono::nanoseconds(from - std::min(from, now_ns())));
      ::kill(subs[2].pid, SIGSTOP);
      from = now_ns();
      std::this_thread::sleep_for(std::chrono::nanoseconds(to - std::min(to, now_ns())));
      to = now_ns();
      ::kill(subs[2].pid, SIGCONT);
    }
    const uint64_t published = u64(pub.expect("published"), "n");
    std::vector<std::map<std::string, std::string>> results;
    for (Proc& s : subs) s.say("expect " + std::to_string(published));
    for (Proc& s : subs) results.push_back(s.expect("result"));
    std::string gaps = "missed";
    for (std::size_t i = 0; i < subs.size(); ++i) gaps += " " + kSubs[i] + "=" + results[i]["gaps"];
    pub.say(gaps);
    auto pr = pub.expect("result");
    pub.finish();
    for (Proc& s : subs) s.finish();
    double h1 = rate_in(results[0], from, to), h2 = rate_in(results[1], from, to);
    bool ok = true;
    std::printf("run %llu %-8s published %llu; healthy in the window: sub1 %.0f, sub2 %.0f msgs/s",
                static_cast<unsigned long long>(run / 2 + 1), stalled ? "stall" : "no-stall",
                static_cast<unsigned long long>(published), h1, h2);
    for (std::size_t i = 0; i < subs.size(); ++i) {
      ok = ok && u64(results[i], "ok") == 1;
      std::printf("; %s received %llu gaps %llu (publisher: missed %llu)", kSubs[i].c_str(),
                  static_cast<unsigned long long>(u64(results[i], "received")),
                  static_cast<unsigned long long>(u64(results[i], "gaps")),
                  static_cast<unsigned long long>(u64(pr, "missed_by." + kSubs[i])));
    }
    std::printf("; publish_cuts %llu%s\n", static_cast<unsigned long long>(u64(pr, "publish_cuts")),
                ok ? "" : "; FAILED: received + gaps != published");
    std::fflush(stdout);
    if (!ok) {
      ++failed;
      continue;
    }
    healthy[stalled].push_back((h1 + h2) / 2);
  }
  double base = median(healthy[false]), during = median(healthy[true]);
  std::printf("\nhealthy subscribers' rate over the stall window, median of %zu runs each:\n",
              healthy[true].size());
  std::printf("  without the stall  %12.0f msgs/s\n  sub3 stopped       %12.0f msgs/s\n", base,
              during);
  std::printf("  ratio              %12.2fx  (>= 0.90x: %s)\n", base > 0 ? during / base : 0,
              base > 0 && during / base >= 0.9 ? "met" : "MISSED");
  if (failed > 0) std::printf("  %d runs failed the accounting and are left out\n", failed);
  std::printf("load average at the end: %s\n",
              [] {
                std::ifstream in("/proc/loadavg");
                std::string a, b, c;
                in >> a >> b >> c;
                return a + " " + b + " " + c;
              }()
                  .c_str());
  return failed > 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  std::string role = argc > 1 ? argv[1] : "";
  if (role == "pub" || role == "sub") {
    Args a(argc, argv);
    return role == "pub" ? role_pub(a) : role_sub(a);
  }
  return drive(argc, argv);
}
