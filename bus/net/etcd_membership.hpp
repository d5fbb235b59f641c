// A node's membership in etcd: it registers under the prefix with a lease and keeps the lease
// alive, reads every registered node and watches the prefix for changes; what it finds goes to
// the bridge as Bridge::found(kEtcdSource, peers). On the membership thread, in coroutines on
// its io_context (but channels_changed()).
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>

#include "bus/net/options.hpp"
#include "etcd_client.hpp"
#include "membership.hpp"

namespace bus::net::detail {

class Bridge;

class EtcdMembership {
 public:
  /// `publish`: what the registration says of this node's publisher (advertised_publish()).
  /// Throws std::invalid_argument for an etcd endpoint that is not `http://host:port`.
  EtcdMembership(boost::asio::io_context& io, Bridge& bridge, const NodeOptions& options,
                 std::string publish, MembershipCounters& counters);

  /// Starts the sessions with etcd (one after another, until stop()).
  void start();
  /// The node's channels changed: its registration is written again. Any thread.
  void channels_changed();
  /// Ends the session. Membership thread.
  void stop();
  /// Whether this node holds a lease, to revoke() when it stops.
  bool registered() const { return opt_.etcd_register() && lease_ != 0; }
  /// Revokes the lease, so that the other nodes drop this one at once.
  boost::asio::awaitable<void> revoke();

 private:
  /// A registered node, as its record says.
  struct Registered {
    Peer peer;
    absl::flat_hash_set<std::string> gives, takes;  // exports and serves; imports
    bool operator==(const Registered& o) const {
      return peer.address == o.peer.address && peer.public_key == o.peer.public_key &&
             gives == o.gives && takes == o.takes;
    }
  };

  void log(const std::string& what);

  // ---- registration ----
  std::string member_json();
  std::string own_key() const;
  boost::asio::awaitable<void> put_member(boost::beast::tcp_stream& s,
                                          boost::beast::flat_buffer& buf, const EtcdUrl& u);
  /// The lease's TTL after a keep-alive; 0 when it is gone (expired, or etcd lost it).
  boost::asio::awaitable<int64_t> keep_alive(boost::beast::tcp_stream& s,
                                             boost::beast::flat_buffer& buf, const EtcdUrl& u);

  // ---- what etcd says, to the bridge ----
  /// `m` and this node share a channel: one exports or serves what the other imports.
  bool related(const Registered& m) const;
  void found_members();
  /// A registration's value -> the node (false for our own, or one unreadable).
  bool member_peer(const std::string& key, const std::string& value, Registered& out);
  /// Reads the watch stream until it fails (or the session drops it).
  boost::asio::awaitable<void> watch_loop(std::shared_ptr<boost::beast::tcp_stream> s, EtcdUrl u,
                                          int64_t from);
  /// One WatchResponse; true when the members changed.
  bool on_watch_line(const std::string& line);

  // ---- the sessions ----
  /// Registers (when it should), reads the members, watches for changes and keeps the lease
  /// alive, until something fails (an exception) or the node stops.
  boost::asio::awaitable<void> session();
  boost::asio::awaitable<void> loop();

  Bridge& bridge_;
  const NodeOptions& opt_;
  const std::string publish_;  // what the registration says (advertised)
  MembershipCounters& counters_;
  std::atomic<uint64_t> changes_{0};  // of the node's channels (channels_changed())

  // ---- membership thread ----
  bool stopping_ = false;
  EtcdClient client_;
  int64_t lease_ = 0;
  int64_t ttl_seconds_;
  uint64_t registered_changes_ = 0;
  boost::asio::steady_timer tick_;  // the session's keep-alive period, or the wait between attempts
  std::shared_ptr<boost::beast::tcp_stream> watch_;
  std::exception_ptr watch_failed_;
  bool reachable_ = true;            // for the log: say once when etcd goes and when it comes back
  std::chrono::milliseconds retry_;  // the next wait between attempts
  absl::flat_hash_map<std::string, Registered> members_;  // by etcd key
  Registered self_;  // this node's record as last written (etcd_related_only())
};

}  // namespace bus::net::detail
