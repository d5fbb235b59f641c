// Two nodes as two hosts: each in a network namespace of its own, joined by a veth pair
// (10.200.0.1/24 <-> 10.200.0.2/24), so they reach each other only over a real network link.
// Needs root and iproute2; skipped, saying why, where the machine does not allow it.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::NodeProcess;

namespace {

constexpr char kPrefix[] = "bus-integ-";

std::string ip_command() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "ip";  // through PATH
}

/// Two network namespaces joined by a veth pair, deleted (with the link) when this goes.
class NetworkNamespaces {
 public:
  NetworkNamespaces() : ip_(ip_command()) {
    std::string stem = absl::StrCat(kPrefix, ::getpid(), "-");
    a_ = stem + "a";
    b_ = stem + "b";
  }
  NetworkNamespaces(const NetworkNamespaces&) = delete;
  NetworkNamespaces& operator=(const NetworkNamespaces&) = delete;
  ~NetworkNamespaces() {
    for (const std::string& ns : created_) run({"netns", "del", ns});
  }

  /// Sets them up. Empty when done, else what the machine refused.
  std::string create() {
    if (::geteuid() != 0) return "network namespaces need root";
    std::string out;
    if (run({"-V"}, &out) != 0) return "iproute2 ('ip') is not installed: " + out;
    remove_stale();
    for (const std::string& ns : {a_, b_}) {
      out.clear();
      if (run({"netns", "add", ns}, &out) != 0) return "'ip netns add' failed: " + out;
      created_.push_back(ns);
    }
    // The pair is made inside the namespaces: no interface ever shows in the host's.
    const std::vector<std::vector<std::string>> steps = {
        {"-n", a_, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", b_},
        {"-n", a_, "addr", "add", "10.200.0.1/24", "dev", "veth0"},
        {"-n", b_, "addr", "add", "10.200.0.2/24", "dev", "veth1"},
        {"-n", a_, "link", "set", "veth0", "up"},
        {"-n", b_, "link", "set", "veth1", "up"},
        {"-n", a_, "link", "set", "lo", "up"},
        {"-n", b_, "link", "set", "lo", "up"},
    };
    for (const auto& step : steps) {
      out.clear();
      if (run(step, &out) != 0) {
        return absl::StrCat("'ip ", absl::StrJoin(step, " "), "' failed: ", out);
      }
    }
    return "";
  }

  /// The prefix that runs a program inside a namespace (`ip netns exec` execs it: same pid).
  std::vector<std::string> exec_in(const std::string& ns) const {
    return {ip_, "netns", "exec", ns};
  }
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }

 private:
  int run(std::vector<std::string> args, std::string* out = nullptr) const {
    args.insert(args.begin(), ip_);
    return integ::run_command(args, out);
  }
  /// Namespaces left by a run that was killed before it could clean up (its pid is gone).
  void remove_stale() const {
    std::string list;
    if (run({"netns", "list"}, &list) != 0) return;
    for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
      std::string name(line.substr(0, line.find(' ')));
      if (name.rfind(kPrefix, 0) != 0) continue;
      std::string pid_part = name.substr(sizeof kPrefix - 1);
      long pid = std::strtol(pid_part.c_str(), nullptr, 10);
      if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
        run({"netns", "del", name});
      }
    }
  }

  std::string ip_;
  std::string a_, b_;
  std::vector<std::string> created_;
};

}  // namespace

TEST(SeparateHosts, TopicsAndRequestsCrossBetweenNetworkNamespaces) {
  NetworkNamespaces hosts;  // declared first: deleted after the processes in them are killed
  if (std::string refused = hosts.create(); !refused.empty()) {
    GTEST_SKIP() << "this machine does not allow network namespaces here: " << refused;
  }

  // Host a binds its own address; host b binds every interface and advertises its address, as
  // a node behind a wildcard bind must. Fixed ports: each namespace has its own.
  NodeProcess a(
      {"--name=host-a", "--serve", "--export-readings", "--publish-on=tcp://10.200.0.1:7101",
       "--requests-on=tcp://10.200.0.1:7102", "--peer=tcp://10.200.0.2:7101"},
      hosts.exec_in(hosts.a()));
  NodeProcess b({"--name=host-b", "--import-readings", "--import-stats",
                 "--publish-on=tcp://*:7101", "--requests-on=tcp://*:7102",
                 "--advertise=tcp://10.200.0.2:7102", "--peer=tcp://10.200.0.1:7101"},
                hosts.exec_in(hosts.b()));
  ASSERT_TRUE(a.ready());
  ASSERT_TRUE(b.ready());

  // Requests from b to a.
  ASSERT_EQ(b.ask("wait-server").num("ok"), 1u);
  integ::Answer called = b.ask("call 50");
  EXPECT_EQ(called.num("ok"), 50u) << called.line;
  EXPECT_EQ(called.num("served_by.host-a"), 50u) << called.line;

  // Readings from a to b.
  ASSERT_EQ(a.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(a.ask("publish 1000").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return b.report().num("received") >= 1000; }, 60s));
  integ::Answer r = b.report();
  EXPECT_EQ(r.num("received"), 1000u) << r.line;
  EXPECT_EQ(r.num("sum"), 1000u * 1001u / 2) << r.line;
  EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;

  // Each heard the other across the link.
  EXPECT_EQ(a.ask("wait-peers 1").num("n"), 1u);
  EXPECT_TRUE(a.report().has("peer.host-b"));
  EXPECT_TRUE(r.has("peer.host-a")) << r.line;
  // One kernel, but not one network: the shared-memory link is for peers on the same host, and
  // a namespace of its own makes another host of it (ZeroMQ, whatever the transport option).
  EXPECT_EQ(r.str("transport.host-a"), "zmq") << r.line;
  EXPECT_EQ(r.num("shm_links"), 0u) << r.line;
  EXPECT_TRUE(b.quit());
  EXPECT_TRUE(a.quit());
}
