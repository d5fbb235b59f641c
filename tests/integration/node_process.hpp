// The test side of bus_fixture_node: starts one as a child process and talks to it over its
// stdin and stdout, one command and one answer at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "integration/process.hpp"

namespace integ {

/// One answer of a fixture node: `word key=value ...`. An empty word means no answer (the
/// process died, or the bound passed).
struct Answer {
  std::string line;
  std::string word;
  std::map<std::string, std::string> fields;

  bool has(const std::string& key) const { return fields.contains(key); }
  /// The number under `key`, 0 when absent.
  uint64_t num(const std::string& key) const;
  std::string str(const std::string& key) const;
};
Answer parse_answer(std::string_view line);

/// A bus_fixture_node process. Destroying it kills it.
class NodeProcess {
 public:
  /// Starts the fixture with `flags` and waits, within a generous bound, for its "ready" line.
  /// `prefix` runs it through another program, e.g. {"ip", "netns", "exec", "ns1"} (which must
  /// exec it, so that killing the child kills the node).
  explicit NodeProcess(std::vector<std::string> flags, std::vector<std::string> prefix = {});

  /// It started and said "ready".
  bool ready() const { return ready_; }
  uint64_t id() const { return id_; }
  pid_t pid() const { return child_.pid(); }
  const std::string& publish_address() const { return publish_; }
  const std::string& request_address() const { return requests_; }
  /// `--publish-on` and `--requests-on` for the endpoints it bound: a restart on the same
  /// addresses.
  std::vector<std::string> same_addresses() const;
  /// `--peer=` for this node (with its CURVE public key when given).
  std::string as_peer(const std::string& public_key = {}) const;

  /// Sends `command` and returns its answer.
  Answer ask(const std::string& command,
             std::chrono::milliseconds bound = std::chrono::seconds(120));
  Answer report() { return ask("report"); }
  /// ask() in two halves, for a command that runs while the test does something else.
  bool send(const std::string& command) { return child_.send(command); }
  Answer answer(std::chrono::milliseconds bound = std::chrono::seconds(120));

  /// kill -9, and reaped.
  void kill() { child_.kill(); }
  /// Sends `sig` (SIGSTOP, SIGCONT) to it. True when it was delivered.
  bool signal(int sig);
  /// Asks it to stop. True when it exited with status 0 (under a sanitizer: no report).
  bool quit();

 private:
  Child child_;
  bool ready_ = false;
  uint64_t id_ = 0;
  std::string publish_, requests_;
};

/// How nodes reach each other in a test.
enum class Transport { kTcp, kIpc };
std::string to_string(Transport t);
/// For gtest's test names and messages.
void PrintTo(Transport t, std::ostream* os);

/// Where nodes bind: `tcp://127.0.0.1:*` (the node reports the port), or a fresh ipc path in a
/// scratch folder removed with this object.
class Endpoints {
 public:
  explicit Endpoints(Transport t);
  Endpoints(const Endpoints&) = delete;
  Endpoints& operator=(const Endpoints&) = delete;
  ~Endpoints();

  std::string bind(const std::string& what);
  /// `--publish-on=... --requests-on=...` for a node called `node`.
  std::vector<std::string> flags(const std::string& node);

 private:
  Transport transport_;
  std::string dir_;
};

/// The flag lists one after the other.
inline std::vector<std::string> cat(std::vector<std::string> a, const std::vector<std::string>& b,
                                    const std::vector<std::string>& c = {}) {
  a.insert(a.end(), b.begin(), b.end());
  a.insert(a.end(), c.begin(), c.end());
  return a;
}

}  // namespace integ
