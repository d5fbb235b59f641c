#include "integration/process.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

extern char** environ;

namespace integ {
namespace {

using Clock = std::chrono::steady_clock;

// A child that died makes writes to its stdin raise SIGPIPE: this process takes the EPIPE
// instead. Children get the default back (POSIX_SPAWN_SETSIGDEF below).
const bool kIgnoreSigpipe = [] {
  std::signal(SIGPIPE, SIG_IGN);
  return true;
}();

/// Spawns `argv` with `in` as its stdin and `out` as its stdout (and its stderr too when
/// `out_err`). -1 on failure.
pid_t spawn(const std::vector<std::string>& argv, int in, int out, bool out_err) {
  (void)kIgnoreSigpipe;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in, STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out, STDOUT_FILENO);
  if (out_err) posix_spawn_file_actions_adddup2(&actions, out, STDERR_FILENO);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t defaults;
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
  pid_t pid = -1;
  int rc = posix_spawnp(&pid, args[0], &actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    std::fprintf(stderr, "integ: cannot start %s: %s\n", args[0], std::strerror(rc));
    return -1;
  }
  return pid;
}

}  // namespace

Child::Child(const std::vector<std::string>& argv) {
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0) return;
  if (pipe2(out, O_CLOEXEC) != 0) {
    ::close(in[0]);
    ::close(in[1]);
    return;
  }
  pid_ = spawn(argv, in[0], out[1], /*out_err=*/false);
  ::close(in[0]);
  ::close(out[1]);
  to_ = in[1];
  from_ = out[0];
  if (pid_ <= 0) close_pipes();
}

bool Child::send(std::string_view line) {
  if (to_ < 0) return false;
  std::string data(line);
  data += '\n';
  std::size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(to_, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

std::optional<std::string> Child::read_line(std::chrono::milliseconds bound) {
  auto until = Clock::now() + bound;
  for (;;) {
    if (auto nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string line = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return line;
    }
    if (from_ < 0) return std::nullopt;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{from_, POLLIN, 0};
    int r = ::poll(&p, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return std::nullopt;
    char buf[4096];
    ssize_t n = ::read(from_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return std::nullopt;  // closed: it exited
    buffered_.append(buf, static_cast<std::size_t>(n));
  }
}

void Child::kill() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    int status;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
  close_pipes();
}

int Child::wait(std::chrono::milliseconds bound) {
  if (pid_ <= 0) return -1;
  if (to_ >= 0) {
    ::close(to_);
    to_ = -1;
  }
  auto until = Clock::now() + bound;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      close_pipes();
      return status;
    }
    if (r < 0 && errno != EINTR) break;
    if (Clock::now() > until) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  kill();
  return -1;
}

void Child::close_pipes() {
  if (to_ >= 0) ::close(to_);
  if (from_ >= 0) ::close(from_);
  to_ = from_ = -1;
}

int run_command(const std::vector<std::string>& argv, std::string* output) {
  int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int out[2];
  if (null < 0 || pipe2(out, O_CLOEXEC) != 0) {
    if (null >= 0) ::close(null);
    return -1;
  }
  pid_t pid = spawn(argv, null, out[1], /*out_err=*/true);
  ::close(null);
  ::close(out[1]);
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output) output->append(buf, static_cast<std::size_t>(n));
  }
  ::close(out[0]);
  if (pid <= 0) return -1;
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string curl(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {"curl", "-s", "--max-time", "30"};
  argv.insert(argv.end(), args.begin(), args.end());
  std::string out;
  run_command(argv, &out);
  return out;
}

std::string printed_base_url(Child& server, std::string_view path) {
  std::optional<std::string> line = server.read_line(std::chrono::seconds(30));
  if (!line) return {};
  auto at = line->find("http://");
  if (at == std::string::npos) at = line->find("https://");
  auto end = line->find(path);
  if (at == std::string::npos || end == std::string::npos || end < at) return {};
  return line->substr(at, end - at);
}

}  // namespace integ
