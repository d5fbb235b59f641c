#include "integration/etcd.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "support/test_support.hpp"

namespace integ {
namespace {

/// A port nobody listens on now (bound to 0 and released: another process could take it in
/// between, which a test would see as etcd failing to start).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

}  // namespace

std::string fresh_prefix() {
  static std::atomic<int> n{0};
  return absl::StrCat("/bus-test/", ::getpid(), "-", n++, "/");
}

namespace {
std::string scratch_dir() {
  char tmpl[] = "/tmp/bus-etcd-XXXXXX";
  return ::mkdtemp(tmpl) == nullptr ? "" : tmpl;
}
}  // namespace

Etcd::Etcd() : dir_(scratch_dir()) {
  if (dir_.empty()) return;
  url_ = absl::StrCat("http://127.0.0.1:", free_port());
  peer_url_ = absl::StrCat("http://127.0.0.1:", free_port());
  start();
}

Etcd::Etcd(std::vector<std::string> prefix, const std::string& host)
    : prefix_(std::move(prefix)), dir_(scratch_dir()) {
  if (dir_.empty()) return;
  // The namespace is this test's alone: its ports are free.
  url_ = absl::StrCat("http://", host, ":2379");
  peer_url_ = absl::StrCat("http://", host, ":2380");
  start();
}

std::vector<std::string> Etcd::in_place(std::vector<std::string> argv) const {
  argv.insert(argv.begin(), prefix_.begin(), prefix_.end());
  return argv;
}

bool Etcd::healthy() const {
  std::string out;
  run_command(in_place({"curl", "-s", "--max-time", "30", absl::StrCat(url_, "/health")}), &out);
  return out.find("\"true\"") != std::string::npos;
}

Etcd::~Etcd() {
  kill();
  if (!dir_.empty()) std::filesystem::remove_all(dir_);
}

void Etcd::kill() { child_.reset(); }

bool Etcd::start() {
  kill();
  // Its log goes to a file: a test's output stays readable (it is printed when start fails).
  const std::string cmd =
      absl::StrCat("exec etcd --name bus-test --data-dir ", dir_, "/data --listen-client-urls ",
                   url_, " --advertise-client-urls ", url_, " --listen-peer-urls ", peer_url_,
                   " --initial-advertise-peer-urls ", peer_url_,
                   " --initial-cluster bus-test=", peer_url_, " >>", dir_, "/etcd.log 2>&1");
  child_ = std::make_unique<Child>(in_place({"sh", "-c", cmd}));
  if (!child_->running()) {
    child_.reset();
    return false;
  }
  // 60 s: a loaded CI machine under a sanitizer.
  if (bus_test::eventually([&] { return healthy(); }, std::chrono::seconds(60))) {
    return true;
  }
  std::string log;
  run_command({"tail", "-20", dir_ + "/etcd.log"}, &log);
  std::fprintf(stderr, "etcd did not start:\n%s\n", log.c_str());
  child_.reset();
  return false;
}

std::vector<std::string> Etcd::keys(const std::string& prefix) const {
  std::string out;
  run_command(in_place({"etcdctl", "--endpoints", url_, "get", prefix, "--prefix", "--keys-only"}),
              &out);
  std::vector<std::string> keys;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipWhitespace())) {
    keys.emplace_back(line);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::string Etcd::get(const std::string& key) const {
  std::string out;
  run_command(in_place({"etcdctl", "--endpoints", url_, "get", key, "--print-value-only"}), &out);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool Etcd::put(const std::string& key, const std::string& value) const {
  return run_command(in_place({"etcdctl", "--endpoints", url_, "put", key, value})) == 0;
}

}  // namespace integ
