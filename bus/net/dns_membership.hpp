// Peers given by host name: every address a name resolves to is a peer, resolved again every
// NodeOptions::resolve_every() (the Kubernetes headless-service pattern, where one name lists
// every pod); what changed goes to the bridge as Bridge::found("dns:host:port", peers). On the
// membership thread, one coroutine per name on its io_context.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <memory>
#include <string>
#include <vector>

#include "bus/net/options.hpp"
#include "membership.hpp"

namespace bus::net::detail {

class Bridge;

class DnsMembership {
 public:
  /// `publish_address`: what the node's publisher bound (its own address is not a peer).
  DnsMembership(boost::asio::io_context& io, Bridge& bridge, const NodeOptions& options,
                const std::string& publish_address, MembershipCounters& counters);

  /// Resolves `peer`'s host name again and again from now on (nothing when it is not a name).
  void add(const Peer& peer);
  /// Ends every name's resolving. Membership thread.
  void stop();

 private:
  void log(const std::string& what);
  /// A resolved address that is this node's own publisher.
  bool is_self(const boost::asio::ip::tcp::endpoint& e) const;
  boost::asio::awaitable<void> resolve_loop(Peer peer, std::string host, std::string port);

  boost::asio::io_context& io_;
  Bridge& bridge_;
  const NodeOptions& opt_;
  MembershipCounters& counters_;
  std::string bound_host_, bound_port_;
  absl::flat_hash_set<std::string> local_;  // this host's addresses (is a resolved peer us?)

  // ---- membership thread ----
  bool stopping_ = false;
  std::vector<std::unique_ptr<boost::asio::steady_timer>> timers_;
};

}  // namespace bus::net::detail
