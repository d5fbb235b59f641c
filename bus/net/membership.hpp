// Peers found at run time: host names resolved again and again, and etcd.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bus/net/options.hpp"
#include "bus/net/stats.hpp"

namespace bus::net::detail {

class Bridge;

/// What a node registers in etcd about itself (schemas/membership.capnp Member), made by
/// Bridge::member_record() on the bridge thread.
struct MemberRecord {
  uint64_t id = 0;
  std::string name;
  std::string requests;  // as bound, or NodeOptions::advertise()
  std::string public_key;
  std::vector<std::string> exports, serves, imports;
};

/// The source name etcd's members are found under (Bridge::found).
inline constexpr char kEtcdSource[] = "etcd";

/// The publish address others should use for this node: advertise_publish() when set, else what
/// the publisher bound, a wildcard host replaced by advertise()'s host or this host's first
/// non-loopback IPv4 address. What etcd registers and heartbeats carry.
std::string advertised_publish(const NodeOptions& options, const std::string& bound);

/// The membership's counters, kept by the bridge (read without waiting for the membership).
struct MembershipCounters {
  std::atomic<uint64_t> etcd_registrations{0}, etcd_errors{0}, dns_errors{0};
  void add_to(NodeStats& s) const {
    s.etcd_registrations += etcd_registrations.load(std::memory_order_relaxed);
    s.etcd_errors += etcd_errors.load(std::memory_order_relaxed);
    s.dns_errors += dns_errors.load(std::memory_order_relaxed);
  }
};

/// Finds peers for a node: every address a peer's host name resolves to (DnsMembership: again
/// every NodeOptions::resolve_every(); an address no longer given is dropped after heartbeat x
/// dead_after), and every node registered under the etcd prefix (EtcdMembership, with
/// NodeOptions::etcd()), where it registers its own node too. One thread of its own runs an Asio
/// io_context for both: the resolver, the etcd calls (one keep-alive HTTP connection) and the
/// watch stream (another); what it finds goes to the bridge thread as Bridge::found(source,
/// peers), only when it changed. Idle, it costs a lease keep-alive every TTL/3 and a resolution
/// per name per resolve_every().
class Membership {
 public:
  /// `publish_address`: what the node's publisher bound (a wildcard host is replaced by the
  /// address others should use, see NodeOptions::advertise_publish()).
  Membership(Bridge& bridge, const NodeOptions& options, const std::string& publish_address,
             MembershipCounters& counters);
  ~Membership();
  Membership(const Membership&) = delete;
  Membership& operator=(const Membership&) = delete;

  /// From now on resolves `peer`'s host name again and again. Any thread.
  void add_name(const Peer& peer);
  /// The node's channels changed: its registration is written again. Any thread.
  void channels_changed();
  /// Revokes the lease, so that the other nodes drop this one at once (bounded: etcd may be
  /// down), and stops the thread. Idempotent.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// `tcp://host:port` -> host and port (false for other transports).
bool split_tcp(const std::string& address, std::string& host, std::string& port);
/// A host that stands for every interface (`*`, 0.0.0.0, ::, or none).
bool is_wildcard(const std::string& host);
/// `tcp://host:port` whose host is a name (not an address, not `*`), split into its parts.
bool split_host_name(const std::string& address, std::string& host, std::string& port);
/// split_host_name() without the parts.
inline bool is_host_name(const std::string& address) {
  std::string host, port;
  return split_host_name(address, host, port);
}

}  // namespace bus::net::detail
