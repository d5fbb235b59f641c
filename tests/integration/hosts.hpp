// Hosts made of network namespaces, so that nodes reach each other only over a real network:
// two namespaces joined by a veth pair, or joined through a third that routes between them (and
// can then partition them, one way or both, silently, or slow the link down).
// Needs root and iproute2; create() says why not where the machine refuses.
#pragma once

#include <string>
#include <vector>

namespace integ {

class Hosts {
 public:
  enum class Layout {
    kPair,    // a 10.200.0.1/24 <-> b 10.200.0.2/24, one veth pair
    kRouted,  // a 10.200.1.1/24 <-> router <-> b 10.200.2.2/24; the router also holds
              // 10.200.9.9 (service()), for something both reach, like etcd
  };
  explicit Hosts(Layout layout);
  Hosts(const Hosts&) = delete;
  Hosts& operator=(const Hosts&) = delete;
  /// Deletes the namespaces (with their links): declare it before the processes started in
  /// them, so that it goes after them.
  ~Hosts();

  /// Sets them up. Empty when done, else what the machine refused.
  std::string create();

  /// The prefix that runs a program inside a namespace (`ip netns exec` execs it: same pid).
  std::vector<std::string> exec_in(const std::string& ns) const;
  const std::string& a() const { return a_; }
  const std::string& b() const { return b_; }
  const std::string& router() const { return r_; }  // kRouted only
  /// Each host's address.
  std::string address_a() const;
  std::string address_b() const;
  /// An address of the router that either host reaches without crossing a partition (kRouted).
  static std::string service() { return "10.200.9.9"; }

  // ---- what happens to the network (kRouted); each returns false when `ip` failed ---------

  /// Drops what a sends to b (`a_to_b`) and what b sends to a (`b_to_a`), silently: the router
  /// throws the packets away, neither host is told (its TCP retransmits, backing off).
  bool partition(bool a_to_b, bool b_to_a);
  /// Undoes partition().
  bool heal();
  /// The router's link toward b goes down (b's carrier with it), or up again.
  bool link_to_b(bool up);
  /// What the router sends toward b is limited to `rate` (tc's words: "1mbit"); "" undoes it.
  bool slow_to_b(const std::string& rate);
  /// `ns` can no longer send to `address` (a blackhole route: its packets fail at once), or can
  /// again.
  bool blackhole(const std::string& ns, const std::string& address, bool on);

 private:
  int ip(std::vector<std::string> args, std::string* out = nullptr) const;
  void remove_stale() const;

  Layout layout_;
  std::string ip_;
  std::string a_, b_, r_;
  std::vector<std::string> created_;
  std::vector<std::vector<std::string>> rules_;  // partition() rules in place, for heal()
};

}  // namespace integ
