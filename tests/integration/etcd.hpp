// A real etcd for the membership tests: its own data folder and free ports on 127.0.0.1, stopped
// (SIGKILL: an outage the nodes are not told about) and started again on the same data.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "integration/process.hpp"

namespace integ {

class Etcd {
 public:
  /// Starts it and waits until it answers /health. Check running().
  Etcd();
  /// The same, run through `prefix` (`ip netns exec NS`) and listening on `host` (an address in
  /// that namespace) at etcd's usual ports; etcdctl runs there too.
  Etcd(std::vector<std::string> prefix, const std::string& host);
  ~Etcd();
  Etcd(const Etcd&) = delete;
  Etcd& operator=(const Etcd&) = delete;

  bool running() const { return child_ != nullptr; }
  /// `http://127.0.0.1:PORT`, what nodes take as NodeOptions::etcd().
  const std::string& url() const { return url_; }
  /// kill -9 (the data folder stays).
  void kill();
  /// Starts it again on the same data and ports; true once it answers.
  bool start();
  /// The keys under `prefix` (etcdctl get --prefix --keys-only), sorted.
  std::vector<std::string> keys(const std::string& prefix) const;
  /// The value of `key`, empty when absent.
  std::string get(const std::string& key) const;
  /// etcdctl put.
  bool put(const std::string& key, const std::string& value) const;

 private:
  /// `argv` run through prefix_.
  std::vector<std::string> in_place(std::vector<std::string> argv) const;
  bool healthy() const;

  std::vector<std::string> prefix_;
  std::string dir_, url_, peer_url_;
  std::unique_ptr<Child> child_;
};

/// A fresh key prefix for one test: `/bus-test/<pid>-<n>/`.
std::string fresh_prefix();

}  // namespace integ
