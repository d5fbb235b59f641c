#include "integration/hosts.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "integration/process.hpp"

namespace integ {
namespace {

constexpr char kPrefix[] = "bus-integ-";

std::string ip_command() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "ip";  // through PATH
}

std::string tc_command() {
  for (const char* p : {"/usr/sbin/tc", "/sbin/tc"}) {
    if (::access(p, X_OK) == 0) return p;
  }
  return "tc";
}

}  // namespace

Hosts::Hosts(Layout layout) : layout_(layout), ip_(ip_command()) {
  std::string stem = absl::StrCat(kPrefix, ::getpid(), "-");
  a_ = stem + "a";
  b_ = stem + "b";
  if (layout_ == Layout::kRouted) r_ = stem + "r";
}

Hosts::~Hosts() {
  for (const std::string& ns : created_) ip({"netns", "del", ns});
}

std::string Hosts::address_a() const {
  return layout_ == Layout::kPair ? "10.200.0.1" : "10.200.1.1";
}
std::string Hosts::address_b() const {
  return layout_ == Layout::kPair ? "10.200.0.2" : "10.200.2.2";
}

std::string Hosts::create() {
  if (::geteuid() != 0) return "network namespaces need root";
  std::string out;
  if (ip({"-V"}, &out) != 0) return "iproute2 ('ip') is not installed: " + out;
  remove_stale();
  std::vector<std::string> names = {a_, b_};
  if (layout_ == Layout::kRouted) names.push_back(r_);
  for (const std::string& ns : names) {
    out.clear();
    if (ip({"netns", "add", ns}, &out) != 0) return "'ip netns add' failed: " + out;
    created_.push_back(ns);
  }
  // Links are made inside the namespaces: no interface ever shows in the host's.
  std::vector<std::vector<std::string>> steps;
  if (layout_ == Layout::kPair) {
    steps = {
        {"-n", a_, "link", "add", "veth0", "type", "veth", "peer", "name", "veth1", "netns", b_},
        {"-n", a_, "addr", "add", "10.200.0.1/24", "dev", "veth0"},
        {"-n", b_, "addr", "add", "10.200.0.2/24", "dev", "veth1"},
        {"-n", a_, "link", "set", "veth0", "up"},
        {"-n", b_, "link", "set", "veth1", "up"},
    };
  } else {
    steps = {
        {"-n", a_, "link", "add", "veth0", "type", "veth", "peer", "name", "to-a", "netns", r_},
        {"-n", b_, "link", "add", "veth0", "type", "veth", "peer", "name", "to-b", "netns", r_},
        {"-n", a_, "addr", "add", "10.200.1.1/24", "dev", "veth0"},
        {"-n", b_, "addr", "add", "10.200.2.2/24", "dev", "veth0"},
        {"-n", r_, "addr", "add", "10.200.1.254/24", "dev", "to-a"},
        {"-n", r_, "addr", "add", "10.200.2.254/24", "dev", "to-b"},
        {"-n", r_, "addr", "add", "10.200.9.9/32", "dev", "lo"},
        {"-n", a_, "link", "set", "veth0", "up"},
        {"-n", b_, "link", "set", "veth0", "up"},
        {"-n", r_, "link", "set", "to-a", "up"},
        {"-n", r_, "link", "set", "to-b", "up"},
        {"-n", r_, "link", "set", "lo", "up"},
        {"-n", a_, "route", "add", "default", "via", "10.200.1.254"},
        {"-n", b_, "route", "add", "default", "via", "10.200.2.254"},
        {"netns", "exec", r_, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"},
    };
  }
  steps.push_back({"-n", a_, "link", "set", "lo", "up"});
  steps.push_back({"-n", b_, "link", "set", "lo", "up"});
  for (const auto& step : steps) {
    out.clear();
    if (ip(step, &out) != 0)
      return absl::StrCat("'ip ", absl::StrJoin(step, " "), "' failed: ", out);
  }
  return "";
}

std::vector<std::string> Hosts::exec_in(const std::string& ns) const {
  return {ip_, "netns", "exec", ns};
}

bool Hosts::partition(bool a_to_b, bool b_to_a) {
  // Rules on what the router forwards, by the interface it came in on: what a host sends to the
  // router itself (service()) still arrives.
  std::vector<std::vector<std::string>> rules;
  if (a_to_b) rules.push_back({"iif", "to-a", "to", "10.200.2.0/24", "blackhole"});
  if (b_to_a) rules.push_back({"iif", "to-b", "to", "10.200.1.0/24", "blackhole"});
  bool ok = true;
  for (auto& rule : rules) {
    std::vector<std::string> args = {"-n", r_, "rule", "add"};
    args.insert(args.end(), rule.begin(), rule.end());
    if (ip(args) == 0) {
      rules_.push_back(std::move(rule));
    } else {
      ok = false;
    }
  }
  return ok;
}

bool Hosts::heal() {
  bool ok = true;
  for (const auto& rule : rules_) {
    std::vector<std::string> args = {"-n", r_, "rule", "del"};
    args.insert(args.end(), rule.begin(), rule.end());
    ok = ip(args) == 0 && ok;
  }
  rules_.clear();
  return ok;
}

bool Hosts::link_to_b(bool up) {
  return ip({"-n", r_, "link", "set", "to-b", up ? "up" : "down"}) == 0;
}

bool Hosts::slow_to_b(const std::string& rate) {
  std::vector<std::string> tc = {ip_, "netns", "exec", r_, tc_command(), "qdisc"};
  if (rate.empty()) {
    tc.insert(tc.end(), {"del", "dev", "to-b", "root"});
  } else {
    // A token bucket: at most `rate`, a burst of 32 kbit, and what waits longer than 400 ms is
    // dropped (a slow link with a short queue, as a congested WAN link behaves).
    tc.insert(tc.end(), {"replace", "dev", "to-b", "root", "tbf", "rate", rate, "burst", "32kbit",
                         "latency", "400ms"});
  }
  std::string out;
  return run_command(tc, &out) == 0;
}

bool Hosts::blackhole(const std::string& ns, const std::string& address, bool on) {
  return ip({"-n", ns, "route", on ? "add" : "del", "blackhole", address + "/32"}) == 0;
}

int Hosts::ip(std::vector<std::string> args, std::string* out) const {
  args.insert(args.begin(), ip_);
  return run_command(args, out);
}

void Hosts::remove_stale() const {
  // Namespaces left by a run that was killed before it could clean up (its pid is gone).
  std::string list;
  if (ip({"netns", "list"}, &list) != 0) return;
  for (absl::string_view line : absl::StrSplit(list, '\n', absl::SkipEmpty())) {
    std::string name(line.substr(0, line.find(' ')));
    if (name.rfind(kPrefix, 0) != 0) continue;
    std::string pid_part = name.substr(sizeof kPrefix - 1);
    long pid = std::strtol(pid_part.c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      ip({"netns", "del", name});
    }
  }
}

}  // namespace integ
