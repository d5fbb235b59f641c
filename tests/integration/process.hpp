// Child processes for the integration tests: started with pipes on stdin and stdout, and killed
// (SIGKILL) and reaped however the test ends.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace integ {

/// A running child process. Destroying it kills it with SIGKILL and waits for it, so a failed
/// assertion never leaves a process behind.
class Child {
 public:
  /// Starts `argv` (argv[0] is looked up in PATH when it has no slash) with its stdin and
  /// stdout on pipes to this process; its stderr is ours. Check running() for failure.
  explicit Child(const std::vector<std::string>& argv);
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { kill(); }

  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  /// Writes one line to its stdin. False when it cannot take it (it died).
  bool send(std::string_view line);
  /// The next line of its stdout, or nothing when it closed stdout (died) or `bound` passed.
  std::optional<std::string> read_line(std::chrono::milliseconds bound);

  /// SIGKILL, then waits for it. Idempotent.
  void kill();
  /// Closes its stdin and waits for it to exit; kills it when `bound` passes first. Returns its
  /// wait status (see waitpid), or -1 when it was killed or not running.
  int wait(std::chrono::milliseconds bound);

 private:
  void close_pipes();
  pid_t pid_ = -1;
  int to_ = -1;    // its stdin
  int from_ = -1;  // its stdout
  std::string buffered_;
};

/// Runs a command to completion with stdin from /dev/null; its stdout and stderr go to
/// `output`. Returns its exit code, or -1 when it could not start or was killed by a signal.
int run_command(const std::vector<std::string>& argv, std::string* output = nullptr);

/// `curl -s --max-time 30 <args...>`: what it printed (the body, or what -w asked for).
std::string curl(const std::vector<std::string>& args);
/// The base URL ("http://host:port" or "https://...") a server printed on its first line, in front
/// of `path`
/// ("[shop] http://127.0.0.1:PORT/quote/tea" with path "/quote"); empty if it printed none.
std::string printed_base_url(Child& server, std::string_view path);

}  // namespace integ
