#include "integration/node_process.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#ifndef BUS_FIXTURE_NODE
#error "BUS_FIXTURE_NODE must name the bus_fixture_node executable"
#endif

namespace integ {

using namespace std::chrono_literals;

// Starting a node under a sanitizer on a loaded machine can take a while: a missed bound is a
// failure, so it is generous.
constexpr auto kStartBound = 60s;

uint64_t Answer::num(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? 0 : std::strtoull(it->second.c_str(), nullptr, 10);
}

std::string Answer::str(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? "" : it->second;
}

Answer parse_answer(std::string_view line) {
  Answer a;
  a.line = std::string(line);
  std::vector<std::string> words = absl::StrSplit(a.line, ' ', absl::SkipEmpty());
  if (words.empty()) return a;
  a.word = words[0];
  for (std::size_t i = 1; i < words.size(); ++i) {
    std::vector<std::string> kv = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
    a.fields[kv[0]] = kv.size() > 1 ? kv[1] : "";
  }
  return a;
}

NodeProcess::NodeProcess(std::vector<std::string> flags, std::vector<std::string> prefix)
    : child_([&] {
        std::vector<std::string> argv = std::move(prefix);
        argv.push_back(BUS_FIXTURE_NODE);
        argv.push_back(absl::StrCat("--parent=", ::getpid()));
        for (auto& f : flags) argv.push_back(std::move(f));
        return argv;
      }()) {
  if (!child_.running()) return;
  auto line = child_.read_line(std::chrono::duration_cast<std::chrono::milliseconds>(kStartBound));
  if (!line) return;
  Answer a = parse_answer(*line);
  if (a.word != "ready") {
    std::fprintf(stderr, "integ: the fixture said '%s' instead of ready\n", line->c_str());
    return;
  }
  ready_ = true;
  id_ = a.num("id");
  publish_ = a.str("publish");
  requests_ = a.str("requests") == "-" ? "" : a.str("requests");
}

std::vector<std::string> NodeProcess::same_addresses() const {
  std::vector<std::string> f{absl::StrCat("--publish-on=", publish_)};
  if (!requests_.empty()) f.push_back(absl::StrCat("--requests-on=", requests_));
  return f;
}

std::string NodeProcess::as_peer(const std::string& public_key) const {
  return public_key.empty() ? absl::StrCat("--peer=", publish_)
                            : absl::StrCat("--peer=", publish_, ",", public_key);
}

Answer NodeProcess::ask(const std::string& command, std::chrono::milliseconds bound) {
  if (!send(command)) return {};
  return answer(bound);
}

Answer NodeProcess::answer(std::chrono::milliseconds bound) {
  auto line = child_.read_line(bound);
  if (!line) return {};
  return parse_answer(*line);
}

bool NodeProcess::signal(int sig) { return child_.running() && ::kill(child_.pid(), sig) == 0; }

bool NodeProcess::quit() {
  (void)child_.send("quit");
  int status = child_.wait(60s);
  return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

std::string to_string(Transport t) { return t == Transport::kTcp ? "tcp" : "ipc"; }
void PrintTo(Transport t, std::ostream* os) { *os << to_string(t); }

namespace {

constexpr char kScratchPrefix[] = "bus-integ-";

/// Scratch folders of test processes that are gone: one killed (a sanitizer halting it, a
/// timeout) had no chance to remove its own.
void remove_stale_scratch() {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/tmp", ec)) {
    std::string name = entry.path().filename().string();
    if (name.rfind(kScratchPrefix, 0) != 0) continue;
    long pid = std::strtol(name.c_str() + sizeof kScratchPrefix - 1, nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
      std::filesystem::remove_all(entry.path(), ec);
    }
  }
}

}  // namespace

Endpoints::Endpoints(Transport t) : transport_(t) {
  if (t == Transport::kIpc) {
    remove_stale_scratch();
    // Short: ipc paths are limited to ~100 bytes. The pid says whose it is.
    std::string tmpl = absl::StrCat("/tmp/", kScratchPrefix, ::getpid(), "-XXXXXX");
    if (::mkdtemp(tmpl.data()) != nullptr) dir_ = tmpl;
  }
}

Endpoints::~Endpoints() {
  std::error_code ec;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
}

std::string Endpoints::bind(const std::string& what) {
  if (transport_ == Transport::kTcp) return "tcp://127.0.0.1:*";
  return absl::StrCat("ipc://", dir_, "/", what, ".sock");
}

std::vector<std::string> Endpoints::flags(const std::string& node) {
  return {absl::StrCat("--publish-on=", bind(absl::StrCat(node, "-pub"))),
          absl::StrCat("--requests-on=", bind(absl::StrCat(node, "-req")))};
}

}  // namespace integ
