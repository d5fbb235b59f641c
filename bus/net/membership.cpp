// Membership: DNS names re-resolved (DnsMembership), and etcd (EtcdMembership, through
// EtcdClient). Both run on the membership thread, in coroutines on one io_context; the bridge is
// reached only through Bridge::post() and Bridge::query().
#include "membership.hpp"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/post.hpp>
#include <optional>
#include <thread>

#include "dns_membership.hpp"
#include "etcd_membership.hpp"

namespace bus::net::detail {
namespace {

namespace asio = boost::asio;

/// The first non-loopback IPv4 address of this host, or 127.0.0.1.
std::string primary_address() {
  std::string best = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return best;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    if (!absl::StartsWith(buf, "127.")) {
      best = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  return best;
}

}  // namespace

bool split_tcp(const std::string& address, std::string& host, std::string& port) {
  if (!absl::StartsWith(address, "tcp://")) return false;
  absl::string_view rest = absl::string_view(address).substr(6);
  auto colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return false;
  host = std::string(rest.substr(0, colon));
  port = std::string(rest.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return true;
}

bool is_wildcard(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host.empty();
}

bool split_host_name(const std::string& address, std::string& host, std::string& port) {
  if (!split_tcp(address, host, port) || is_wildcard(host)) return false;
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return static_cast<bool>(ec);  // not an address: a name
}

std::string advertised_publish(const NodeOptions& opt, const std::string& bound) {
  std::string publish = opt.advertise_publish().empty() ? bound : opt.advertise_publish();
  std::string host, port;
  if (split_tcp(publish, host, port) && is_wildcard(host)) {
    std::string adv_host, adv_port;
    std::string to = split_tcp(opt.advertise(), adv_host, adv_port) && !is_wildcard(adv_host)
                         ? adv_host
                         : primary_address();
    publish =
        absl::StrCat("tcp://", to.find(':') != std::string::npos ? "[" + to + "]" : to, ":", port);
  }
  return publish;
}

struct Membership::Impl {
  Impl(Bridge& bridge, const NodeOptions& options, const std::string& publish_address,
       MembershipCounters& counters)
      : opt(options), dns(io, bridge, opt, publish_address, counters) {
    if (!opt.etcd().empty()) {
      etcd.emplace(io, bridge, opt, advertised_publish(opt, publish_address), counters);
    }
  }

  // First: destroyed last, after the sockets and timers below that use it.
  asio::io_context io{1};
  const NodeOptions opt;
  DnsMembership dns;
  std::optional<EtcdMembership> etcd;  // with NodeOptions::etcd() only
  std::thread thread;
};

Membership::Membership(Bridge& bridge, const NodeOptions& options,
                       const std::string& publish_address, MembershipCounters& counters)
    : impl_(std::make_unique<Impl>(bridge, options, publish_address, counters)) {
  Impl& m = *impl_;
  for (const Peer& p : options.peers()) m.dns.add(p);
  if (m.etcd) m.etcd->start();
  m.thread = std::thread([&m] {
    auto guard = asio::make_work_guard(m.io);  // stays up for add_name() with nothing to do
    m.io.run();
  });
}

Membership::~Membership() { stop(); }

void Membership::add_name(const Peer& peer) {
  asio::post(impl_->io, [m = impl_.get(), peer] { m->dns.add(peer); });
}

void Membership::channels_changed() {
  if (impl_->etcd) impl_->etcd->channels_changed();
}

void Membership::stop() {
  Impl& m = *impl_;
  if (!m.thread.joinable()) return;
  asio::post(m.io, [&m] {
    if (m.etcd) m.etcd->stop();
    m.dns.stop();
    if (m.etcd && m.etcd->registered()) {
      asio::co_spawn(m.io, m.etcd->revoke(), [&m](std::exception_ptr) { m.io.stop(); });
    } else {
      m.io.stop();
    }
  });
  m.thread.join();
}

}  // namespace bus::net::detail
