// Start-up time of an HTTP server: from exec to the first 200 it answers. Each run forks, execs
// the server, and sends `GET PATH` over a fresh connection to 127.0.0.1:PORT until one is
// answered 200 (a refused connection is tried again at once), then stops it with SIGTERM.
// Runs alternate between the commands given, so that two builds are compared in one run.
//
//   bus_startup RUNS PORT PATH -- CMD [ARG...] [-- CMD2 [ARG...]]
//
// Prints every run, then per command the best and the median, in milliseconds.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

/// True when a GET of `path` on 127.0.0.1:`port` is answered 200.
bool answered_200(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bool ok = false;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
    std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if (::write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[64] = {};
      ssize_t n = ::read(fd, buf, sizeof buf - 1);
      ok = n >= 12 && std::strncmp(buf, "HTTP/1.1 200", 12) == 0;
    }
  }
  ::close(fd);
  return ok;
}

/// One run: milliseconds from fork to the first 200, or a negative value if the server exited.
double run_once(const std::vector<char*>& argv, int port, const std::string& path) {
  auto start = Clock::now();
  pid_t pid = ::fork();
  if (pid == 0) {
    int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execv(argv[0], argv.data());
    std::_Exit(127);
  }
  double ms = -1;
  while (true) {
    if (answered_200(port, path)) {
      ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      break;
    }
    int status;
    if (::waitpid(pid, &status, WNOHANG) == pid) return -1;  // it exited: nothing to time
  }
  ::kill(pid, SIGTERM);
  int status;
  ::waitpid(pid, &status, 0);
  return ms;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6 || std::strcmp(argv[4], "--") != 0) {
    std::fprintf(stderr, "usage: %s RUNS PORT PATH -- CMD [ARG...] [-- CMD2 [ARG...]]\n", argv[0]);
    return 2;
  }
  int runs = std::atoi(argv[1]);
  int port = std::atoi(argv[2]);
  std::string path = argv[3];
  std::vector<std::vector<char*>> commands(1);
  for (int i = 5; i < argc; ++i) {
    if (std::strcmp(argv[i], "--") == 0) {
      commands.emplace_back();
      continue;
    }
    commands.back().push_back(argv[i]);
  }
  for (auto& c : commands) c.push_back(nullptr);
  std::vector<std::vector<double>> times(commands.size());
  for (int r = 0; r < runs; ++r) {
    for (std::size_t c = 0; c < commands.size(); ++c) {
      double ms = run_once(commands[c], port, path);
      if (ms < 0) {
        std::fprintf(stderr, "bus_startup: %s exited before answering\n", commands[c][0]);
        return 1;
      }
      times[c].push_back(ms);
      std::printf("run %d  %-60s %8.2f ms\n", r + 1, commands[c][0], ms);
    }
  }
  for (std::size_t c = 0; c < commands.size(); ++c) {
    std::sort(times[c].begin(), times[c].end());
    std::printf("%-60s best %8.2f ms  median %8.2f ms  (%d runs)\n", commands[c][0], times[c][0],
                times[c][times[c].size() / 2], runs);
  }
  return 0;
}
