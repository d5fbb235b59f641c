#include "dns_membership.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cstdio>

#include "bridge.hpp"

namespace bus::net::detail {
namespace {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

/// The IPv4 and IPv6 addresses of this host's interfaces, as text.
absl::flat_hash_set<std::string> local_addresses() {
  absl::flat_hash_set<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf,
                  sizeof buf);
    } else {
      continue;
    }
    out.insert(buf);
  }
  ::freeifaddrs(list);
  return out;
}

std::string tcp_address(const tcp::endpoint& e) {
  const std::string a = e.address().to_string();
  return e.address().is_v6() ? absl::StrCat("tcp://[", a, "]:", e.port())
                             : absl::StrCat("tcp://", a, ":", e.port());
}

}  // namespace

DnsMembership::DnsMembership(asio::io_context& io, Bridge& bridge, const NodeOptions& options,
                             const std::string& publish_address, MembershipCounters& counters)
    : io_(io), bridge_(bridge), opt_(options), counters_(counters), local_(local_addresses()) {
  split_tcp(publish_address, bound_host_, bound_port_);
}

void DnsMembership::log(const std::string& what) {
  std::fprintf(stderr, "bus.net[%s]: %s\n", opt_.name().c_str(), what.c_str());
}

bool DnsMembership::is_self(const tcp::endpoint& e) const {
  if (std::to_string(e.port()) != bound_port_) return false;
  const std::string a = e.address().to_string();
  return a == bound_host_ || (is_wildcard(bound_host_) && local_.contains(a));
}

void DnsMembership::add(const Peer& p) {
  std::string host, port;
  if (!split_host_name(p.address, host, port)) return;
  asio::co_spawn(io_, resolve_loop(p, host, port), asio::detached);
}

void DnsMembership::stop() {
  stopping_ = true;
  for (auto& t : timers_) t->cancel();
}

awaitable<void> DnsMembership::resolve_loop(Peer peer, std::string host, std::string port) {
  const std::string source = absl::StrCat("dns:", host, ":", port);
  auto ex = co_await asio::this_coro::executor;
  tcp::resolver resolver(ex);
  auto& timer = *timers_.emplace_back(std::make_unique<asio::steady_timer>(ex));
  absl::flat_hash_map<std::string, std::chrono::steady_clock::time_point> seen;
  std::vector<std::string> told;  // what the bridge has, sorted
  bool failing = false;
  while (!stopping_) {
    boost::system::error_code ec;
    // No AI_ADDRCONFIG (asio's default): loopback-only hosts and test names in /etc/hosts.
    auto answer = co_await resolver.async_resolve(host, port, tcp::resolver::flags(),
                                                  asio::redirect_error(use_awaitable, ec));
    const auto now = std::chrono::steady_clock::now();
    if (ec) {
      // A name that has no address now is not a failure of ours to wait out: what it had
      // ages out below like any address it stopped giving.
      counters_.dns_errors.fetch_add(1, std::memory_order_relaxed);
      if (!failing) log(absl::StrCat("resolving ", host, ": ", ec.message()));
      failing = true;
    } else {
      if (failing) log(absl::StrCat("resolving ", host, " works again"));
      failing = false;
      for (const auto& entry : answer) {
        if (!is_self(entry.endpoint())) seen[tcp_address(entry.endpoint())] = now;
      }
    }
    absl::erase_if(seen, [&](const auto& s) { return now - s.second > opt_.dead_after_time(); });
    std::vector<std::string> have;
    for (const auto& [ep, when] : seen) have.push_back(ep);
    std::sort(have.begin(), have.end());
    if (have != told) {
      told = have;
      std::vector<Peer> peers;
      for (auto& ep : have) peers.push_back(Peer{ep, peer.public_key});
      bridge_.post([b = &bridge_, source, peers = std::move(peers)] { b->found(source, peers); });
    }
    timer.expires_after(opt_.resolve_every());
    co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
  }
}

}  // namespace bus::net::detail
