// What the cross-process benchmark drivers (bus_bridge: bench/bridge_bench.cpp, bus_shm:
// bench/shm_bench.cpp) share: role processes started pinned to a core and read line by line, a
// case run once (its receivers, then its sender, until the side that measures prints "result"),
// the samples and their medians, and what the report says about the machine.
//
// A role process prints "ready" when it can take traffic, one "result key=value..." line when
// done, and stops when its stdin closes.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "bridge_common.hpp"

namespace bench_driver {

using Clock = std::chrono::steady_clock;
using Fields = std::map<std::string, std::string>;

inline constexpr int kSenderCore = 0;
inline constexpr int kReceiverCore = 1;

[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, what.c_str());
  std::exit(2);
}

// ---- child processes ---------------------------------------------------------------------------

/// A role process: its stdin (closing it is the stop signal) and its stdout, read line by line.
struct Child {
  pid_t pid = -1;
  int in = -1;
  int out = -1;
  std::string pending;  // a partial line
  std::vector<std::string> lines;
  bool eof = false;
  std::optional<int> status;

  static Child start(int core, const std::vector<std::string>& argv) {
    int to_child[2], from_child[2];
    if (::pipe2(to_child, O_CLOEXEC) != 0 || ::pipe2(from_child, O_CLOEXEC) != 0) {
      fail("pipe2 failed");
    }
    std::vector<std::string> full = {"taskset", "-c", std::to_string(core)};
    full.insert(full.end(), argv.begin(), argv.end());
    pid_t pid = ::fork();
    if (pid < 0) fail("fork failed");
    if (pid == 0) {
      ::dup2(to_child[0], 0);
      ::dup2(from_child[1], 1);
      ::dup2(from_child[1], 2);  // its complaints come back with its results
      std::vector<char*> args;
      for (auto& a : full) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      std::fprintf(stderr, "%s: cannot run %s: %s\n", program_invocation_short_name, args[0],
                   std::strerror(errno));
      ::_exit(127);
    }
    ::close(to_child[0]);
    ::close(from_child[1]);
    Child c;
    c.pid = pid;
    c.in = to_child[1];
    c.out = from_child[0];
    return c;
  }

  void close_stdin() {
    if (in >= 0) ::close(in);
    in = -1;
  }

  /// Reads what is there; false at end of output.
  bool read_some() {
    char buf[4096];
    ssize_t n = ::read(out, buf, sizeof buf);
    if (n <= 0) {
      eof = true;
      return false;
    }
    pending.append(buf, static_cast<std::size_t>(n));
    for (std::size_t nl; (nl = pending.find('\n')) != std::string::npos;) {
      lines.push_back(pending.substr(0, nl));
      pending.erase(0, nl + 1);
    }
    return true;
  }

  std::optional<Fields> line(const std::string& word) const {
    for (const auto& l : lines) {
      if (l == word || l.rfind(word + " ", 0) == 0) {
        Fields f;
        std::istringstream in(l.substr(word.size()));
        std::string kv;
        while (in >> kv) {
          auto eq = kv.find('=');
          if (eq != std::string::npos) f[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
        return f;
      }
    }
    return std::nullopt;
  }

  void reap(bool block) {
    if (pid < 0 || status) return;
    int st = 0;
    if (::waitpid(pid, &st, block ? 0 : WNOHANG) == pid) status = st;
  }

  void kill_and_reap() {
    if (pid > 0 && !status) {
      ::kill(pid, SIGKILL);
      reap(true);
    }
    close_stdin();
    if (out >= 0) ::close(out);
    out = -1;
  }
};

/// Reads from every child with output left until `done()` or the deadline. False on timeout or
/// when a child ended while `done()` was still false.
template <class F>
bool pump(std::vector<Child*> children, Clock::time_point deadline, F done) {
  while (!done()) {
    std::vector<pollfd> fds;
    std::vector<Child*> who;
    for (Child* c : children) {
      if (!c->eof) {
        fds.push_back({c->out, POLLIN, 0});
        who.push_back(c);
      }
    }
    if (fds.empty()) return done();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<long>(left.count(), 1000)));
    if (n < 0 && errno != EINTR) fail("poll failed");
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents != 0 && !who[i]->read_some()) {
        who[i]->reap(true);
        if (!done() && who[i]->status && *who[i]->status != 0) return false;
      }
    }
  }
  return true;
}

// ---- cases -------------------------------------------------------------------------------------

enum class Kind { kThroughput, kRoundTrip, kPipelined };

struct Sample {
  bool ok = false;
  std::string why;
  double value = 0;                   // messages/s, or requests/s
  double p50 = 0, p99 = 0, p999 = 0;  // round trip, ns
  uint64_t gaps = 0;                  // bus subscriber: sequence gaps counted by the bridge
  uint64_t publish_cuts = 0;          // bus publisher: times it sent on without the subscriber
  // CPU of each process (all its threads) per message or request: sender/client ("tx") and
  // receiver/server ("rx"); ns.
  double tx_cpu = 0, rx_cpu = 0;
  double broker_cpu = 0;  // NATS: the broker's CPU per message or request, ns
  uint64_t lost = 0;      // bus server: replies it could not send (unroutable_replies)
  std::string lines;      // both processes' result lines and complaints, for the raw output
};

struct Case {
  std::string id, name, section;
  Kind kind;
  std::vector<std::string> receiver, sender;
  uint64_t count;
  std::string skipped;  // non-empty: why it does not run
  std::vector<Sample> samples;
  int receivers = 1;  // throughput: subscriber processes, each started with `receiver` + index=I
};

inline std::string num(uint64_t v) { return std::to_string(v); }

inline uint64_t field(const Fields& f, const char* k) {
  auto it = f.find(k);
  return it == f.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

/// CPU time (user + system) a process has used so far, ns; 0 when it cannot be read.
inline uint64_t process_cpu_ns(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto paren = text.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return 0;
  std::istringstream fields(text.substr(paren + 2));
  std::string f;
  uint64_t utime = 0, stime = 0;
  for (int i = 3; fields >> f && i <= 15; ++i) {  // fields 14 and 15: utime, stime (ticks)
    if (i == 14) utime = std::strtoull(f.c_str(), nullptr, 10);
    if (i == 15) stime = std::strtoull(f.c_str(), nullptr, 10);
  }
  return (utime + stime) * (1'000'000'000 / static_cast<uint64_t>(::sysconf(_SC_CLK_TCK)));
}

/// Runs one case once. `broker` (NATS cases): the broker's pid, whose CPU is counted too.
/// Every receiver runs on kReceiverCore, the sender on kSenderCore. Throughput with several
/// receivers: from the sender's first message to the last delivery in any receiver, each of
/// which must have taken every message.
inline Sample run_case(Case& c, pid_t broker) {
  Sample s;
  const uint64_t broker0 = broker > 0 ? process_cpu_ns(broker) : 0;
  std::vector<Child> rs(static_cast<std::size_t>(std::max(1, c.receivers)));
  for (std::size_t i = 0; i < rs.size(); ++i) {
    std::vector<std::string> argv = c.receiver;
    if (rs.size() > 1) argv.push_back("index=" + num(i));
    rs[i] = Child::start(kReceiverCore, argv);
  }
  Child snd;
  std::vector<Child*> all;
  for (Child& r : rs) all.push_back(&r);
  auto collect = [&] {
    s.lines.clear();
    for (const Child* ch : all) {
      for (const auto& l : ch->lines) {
        if (l == "ready") continue;
        std::string who = ch == &snd ? " sender" : " receiver";
        s.lines += l.rfind("result", 0) == 0 ? who + ":" + l.substr(6) : who + " said: " + l;
      }
    }
  };
  auto finish = [&](std::string why) {
    s.ok = false;
    for (Child* ch : all) ch->kill_and_reap();
    collect();
    s.why = std::move(why) + s.lines;
    return s;
  };
  auto all_say = [&](const std::vector<Child*>& who, const char* word) {
    return std::all_of(who.begin(), who.end(),
                       [&](const Child* ch) { return ch->line(word).has_value(); });
  };
  std::vector<Child*> receivers = all;
  if (!pump(receivers, Clock::now() + std::chrono::seconds(30),
            [&] { return all_say(receivers, "ready"); })) {
    return finish("a receiver never said ready");
  }
  snd = Child::start(kSenderCore, c.sender);
  // Roles that connect first and then wait to be told (bench/shm_common.hpp) start on this line;
  // the others read their stdin only for its end and skip it.
  if (::write(snd.in, "go\n", 3) != 3) return finish("cannot write to the sender");
  all.push_back(&snd);
  std::vector<Child*> measurers =
      c.kind == Kind::kThroughput ? receivers : std::vector<Child*>{&snd};
  if (!pump(all, Clock::now() + std::chrono::seconds(180),
            [&] { return all_say(measurers, "result"); })) {
    return finish("no result within 180 s, or a process failed");
  }
  for (Child* ch : all) ch->close_stdin();
  if (!pump(all, Clock::now() + std::chrono::seconds(30), [&] {
        return std::all_of(all.begin(), all.end(), [](const Child* ch) { return ch->eof; });
      })) {
    return finish("processes did not stop within 30 s of the stop signal");
  }
  for (Child* ch : all) {
    ch->reap(true);
    ::close(ch->out);
    ch->out = -1;
    if (!ch->status || !WIFEXITED(*ch->status) || WEXITSTATUS(*ch->status) != 0) {
      return finish("a process exited with an error");
    }
  }
  auto sr = snd.line("result");
  if (!sr) return finish("the sender printed no result");
  std::vector<Fields> rr;
  for (Child* r : receivers) {
    // A round trip's receiver (a server, a pong) may have nothing to report.
    auto f = r->line("result");
    if (!f && c.kind == Kind::kThroughput) return finish("a receiver printed no result");
    rr.push_back(f.value_or(Fields{}));
  }
  s.lost = field(rr[0], "unroutable_replies");
  for (const Fields& m : c.kind == Kind::kThroughput ? rr : std::vector<Fields>{*sr}) {
    if (field(m, "ok") != 1 || field(m, "count") != c.count) {
      return finish("check failed: count " + num(field(m, "count")) + " of " + num(c.count) +
                    ", ok=" + num(field(m, "ok")));
    }
  }
  switch (c.kind) {
    case Kind::kThroughput: {
      uint64_t t0 = field(*sr, "t0"), t_last = 0, cpu = 0;
      for (const Fields& m : rr) {
        t_last = std::max(t_last, field(m, "t_last"));
        s.gaps += field(m, "gaps");
        cpu += field(m, "cpu");
      }
      if (t_last <= t0) return finish("last delivery before the first publish?");
      s.value = static_cast<double>(c.count) * 1e9 / static_cast<double>(t_last - t0);
      s.publish_cuts = field(*sr, "publish_cuts");
      s.rx_cpu = static_cast<double>(cpu) / static_cast<double>(c.count);
      break;
    }
    case Kind::kRoundTrip:
      s.p50 = static_cast<double>(field(*sr, "p50"));
      s.p99 = static_cast<double>(field(*sr, "p99"));
      s.p999 = static_cast<double>(field(*sr, "p999"));
      s.value = s.p50;
      break;
    case Kind::kPipelined:
      s.value = static_cast<double>(c.count) * 1e9 / static_cast<double>(field(*sr, "ns"));
      break;
  }
  s.tx_cpu = static_cast<double>(field(*sr, "cpu")) / static_cast<double>(c.count);
  double per = static_cast<double>(c.count);
  if (c.kind != Kind::kThroughput && field(rr[0], "served") > 0) {
    per = static_cast<double>(field(rr[0], "served"));
    s.rx_cpu = static_cast<double>(field(rr[0], "cpu")) / per;
  }
  if (broker > 0) s.broker_cpu = static_cast<double>(process_cpu_ns(broker) - broker0) / per;
  collect();
  s.ok = true;
  return s;
}

// ---- report ------------------------------------------------------------------------------------

struct Stat {
  double median = 0, min = 0, max = 0;
  int n = 0;
};

inline Stat stat_of(const Case& c, double Sample::*what) {
  std::vector<double> v;
  for (const auto& s : c.samples) {
    if (s.ok) v.push_back(s.*what);
  }
  Stat st;
  st.n = static_cast<int>(v.size());
  if (v.empty()) return st;
  st.median = bench_bridge::median(v);
  st.min = *std::min_element(v.begin(), v.end());
  st.max = *std::max_element(v.begin(), v.end());
  return st;
}

inline std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      auto colon = line.find(':');
      return colon == std::string::npos ? line : line.substr(colon + 2);
    }
  }
  return "unknown";
}

inline std::string self_dir() {
  std::string p = bench_bridge::self_exe();
  return p.substr(0, p.rfind('/'));
}

inline std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

inline std::string size_name(uint64_t b) {
  return b >= 1024 ? num(b / 1024) + " KiB" : num(b) + " B";
}

/// Runs every case that is not skipped once per round, `warmup` unreported rounds then `runs`
/// kept ones (run r of every case before run r + 1 of any), saying each as it goes. `broker`
/// gives a case's broker pid (its CPU is counted too), 0 for none.
template <class Broker>
void run_interleaved(std::vector<Case>& cases, int runs, int warmup, Broker broker) {
  for (int run = -warmup; run < runs; ++run) {
    std::printf("%s %d:", run < 0 ? "warm-up round" : "run", run < 0 ? run + warmup + 1 : run + 1);
    std::fflush(stdout);
    for (auto& c : cases) {
      if (!c.skipped.empty()) continue;
      Sample s = run_case(c, broker(c));
      if (run >= 0) c.samples.push_back(s);
      std::printf(" %s%s", c.id.c_str(), s.ok ? "" : "(FAILED)");
      if (!s.ok) std::printf("\n  %s failed: %s\n", c.id.c_str(), s.why.c_str());
      std::fflush(stdout);
    }
    std::printf("\n");
  }
  std::printf("load average at the end: %s\n", loadavg().c_str());
}

}  // namespace bench_driver
