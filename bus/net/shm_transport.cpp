// The shared-memory transport's links made and ended: listening for them, the handshake (who
// may link, one link per pair of nodes), a link up, a link dropped. Sending:
// shm_transport_send.cpp; polling and reading: shm_transport_receive.cpp.
#include "shm_transport.hpp"

#include <absl/strings/str_cat.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "shm_heap.hpp"
#include "shm_transport_links.hpp"

namespace bus::net::detail {

ShmTransport::ShmTransport(const NodeOptions& options, uint64_t node_id, FrameSink& sink,
                           Events& events)
    : opt_(options), id_(node_id), sink_(sink), events_(events) {
  settings_.ring_bytes = options.shm_ring_bytes();
  settings_.heap_limit = options.shm_heap_limit();
  settings_.spin = options.shm_spin();
  settings_.access.group = options.shm_group();
}

ShmTransport::~ShmTransport() {
  links_.clear();
  if (listener_ >= 0) ::close(listener_);
}

void ShmTransport::start(int wake_fd, std::string publish_address) {
  wake_fd_ = wake_fd;
  publish_address_ = std::move(publish_address);
  int s = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (s < 0) throw std::runtime_error(absl::StrCat("bus.net: socket: ", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string name = shm_socket_name(id_);
  std::memcpy(addr.sun_path, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::bind(s, reinterpret_cast<sockaddr*>(&addr), len) != 0 || ::listen(s, 64) != 0) {
    int e = errno;
    ::close(s);
    throw std::runtime_error(absl::StrCat("bus.net: cannot listen for shared-memory links on @",
                                          name.substr(1), ": ", std::strerror(e)));
  }
  listener_ = s;
  ShmHeap::instance().enable(settings_.heap_limit, settings_.access);
}

void ShmTransport::close() {
  for (auto& [id, l] : links_) {
    if (l->state == State::kUp && !l->dead) l->link->send_bye(0);
  }
  links_.clear();
  by_node_.clear();
  up_ = 0;
  backlogged_ = 0;
  if (listener_ >= 0) ::close(listener_);
  listener_ = -1;
}

bool ShmTransport::linked(uint64_t node) const { return by_node(node) != nullptr; }

bool ShmTransport::allowed(const ShmLink::Hello& hello) const {
  if (hello.uid == ::geteuid()) return true;
  const int group = settings_.access.group;
  if (group < 0) return false;
  if (hello.gid == static_cast<gid_t>(group)) return true;
  return std::find(hello.groups.begin(), hello.groups.end(), static_cast<gid_t>(group)) !=
         hello.groups.end();
}

// ---- making links --------------------------------------------------------------------------

void ShmTransport::connect(uint64_t node, const std::string& name) {
  if (!on() || node == id_ || refused_.contains(node) || by_node(node) != nullptr) return;
  for (auto& [id, l] : links_) {
    if (!l->dead && l->node == node && l->role == ShmLink::Role::kBridge) return;  // on the way
  }
  if (name != shm_socket_name(node)) return;  // a name we would not listen on: not ours to try
  auto fail = [&](const absl::Status& why) {
    refused_.insert(node);
    ++sink_.counters().shm_refused;
    sink_.log_once(absl::StrCat("shm-connect:", node),
                   absl::StrCat("no shared-memory link to node ", absl::Hex(node),
                                " (ZeroMQ it is): ", why.message()));
  };
  absl::StatusOr<int> sock = ShmLink::connect_to(node);
  if (!sock.ok()) return fail(sock.status());
  auto link = ShmLink::make(*sock, id_, ShmLink::Role::kBridge, settings_);
  if (!link.ok()) return fail(link.status());
  if (absl::Status st = (*link)->send_hello(ShmLink::Verdict::kWelcome, publish_address_, wake_fd_);
      !st.ok()) {
    return fail(st);
  }
  auto l = std::make_unique<Link>();
  l->id = next_link_++;
  l->state = State::kHello;
  l->initiated = true;
  l->node = node;
  l->link = std::move(*link);
  links_.emplace(l->id, std::move(l));
}

void ShmTransport::accept() {
  for (;;) {
    int s = ::accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s < 0) return;
    auto l = std::make_unique<Link>();
    l->id = next_link_++;
    l->state = State::kAccepted;
    l->sock = s;
    links_.emplace(l->id, std::move(l));
  }
}

void ShmTransport::finish_accept(Link& l) {
  absl::StatusOr<ShmLink::Hello> hello = ShmLink::read_hello(l.sock);
  if (absl::IsUnavailable(hello.status())) return;  // not yet
  int sock = std::exchange(l.sock, -1);
  auto refuse = [&](const std::string& why, bool count) {
    if (count) ++sink_.counters().shm_refused;
    sink_.log_once(absl::StrCat("shm-accept:", why.substr(0, 40)),
                   absl::StrCat("refused a shared-memory link: ", why));
    ::close(sock);
    l.dead = true;
    dead_.push_back(l.id);
  };
  if (!hello.ok()) return refuse(std::string(hello.status().message()), false);
  auto close_fds = [&] {
    if (hello->segment_fd >= 0) ::close(hello->segment_fd);
    if (hello->wake_fd >= 0) ::close(hello->wake_fd);
  };
  if (!allowed(*hello)) {
    close_fds();
    ++sink_.counters().auth_denied;
    return refuse(absl::StrCat("process ", hello->pid, " runs as uid ", hello->uid,
                               ", not this node's (and not in shm_group)"),
                  false);
  }
  l.node = hello->node;
  l.role = hello->role;
  ShmLink::Verdict verdict = ShmLink::Verdict::kWelcome;
  if (l.role == ShmLink::Role::kBridge) {
    // One link per pair of nodes: when both made one at once, the one made by the node with
    // the lower id stays (each end decides the same).
    if (by_node(l.node) != nullptr) verdict = ShmLink::Verdict::kDuplicate;
    for (auto& [id, other] : links_) {
      if (other.get() == &l || other->dead || other->node != l.node ||
          other->state != State::kHello) {
        continue;
      }
      if (id_ < l.node) {
        verdict = ShmLink::Verdict::kDuplicate;  // ours stays
      } else {
        drop(*other, false, "the other node's link stays");  // theirs stays
      }
    }
  }
  auto link = ShmLink::make(sock, id_, ShmLink::Role::kBridge, settings_);
  if (!link.ok()) {
    close_fds();
    l.dead = true;
    dead_.push_back(l.id);
    ++sink_.counters().shm_refused;
    sink_.log_once("shm-make", absl::StrCat("no shared-memory link: ", link.status().message()));
    return;
  }
  l.link = std::move(*link);
  if (verdict != ShmLink::Verdict::kWelcome) {
    close_fds();
    (void)l.link->send_hello(verdict, publish_address_, -1);
    l.dead = true;
    dead_.push_back(l.id);
    return;
  }
  if (absl::Status st = l.link->attach(*hello); !st.ok()) {
    (void)l.link->send_hello(ShmLink::Verdict::kRefused, publish_address_, -1);
    ++sink_.counters().shm_corrupt;
    sink_.log_once(absl::StrCat("shm-attach:", l.node),
                   absl::StrCat("refused node ", absl::Hex(l.node), "'s link: ", st.message()));
    l.dead = true;
    dead_.push_back(l.id);
    return;
  }
  if (!l.link->send_hello(ShmLink::Verdict::kWelcome, publish_address_, wake_fd_).ok()) {
    l.dead = true;
    dead_.push_back(l.id);
    return;
  }
  up(l);
}

void ShmTransport::finish_connect(Link& l) {
  absl::StatusOr<ShmLink::Hello> hello = l.link->receive_hello();
  if (absl::IsUnavailable(hello.status())) return;  // not yet
  auto give_up = [&](const std::string& why) {
    refused_.insert(l.node);
    ++sink_.counters().shm_refused;
    sink_.log_once(absl::StrCat("shm-connect:", l.node),
                   absl::StrCat("no shared-memory link to node ", absl::Hex(l.node),
                                " (ZeroMQ it is): ", why));
    drop(l, false, why);
  };
  if (!hello.ok()) return give_up(std::string(hello.status().message()));
  if (hello->verdict == ShmLink::Verdict::kDuplicate) {
    if (hello->segment_fd >= 0) ::close(hello->segment_fd);
    if (hello->wake_fd >= 0) ::close(hello->wake_fd);
    return drop(l, false, "the other node's link stays");
  }
  if (hello->verdict != ShmLink::Verdict::kWelcome || hello->node != l.node || !allowed(*hello)) {
    if (hello->segment_fd >= 0) ::close(hello->segment_fd);
    if (hello->wake_fd >= 0) ::close(hello->wake_fd);
    return give_up(hello->verdict != ShmLink::Verdict::kWelcome
                       ? "it refused"
                       : "the process answering is not the node, or not allowed");
  }
  if (absl::Status st = l.link->attach(*hello); !st.ok()) {
    ++sink_.counters().shm_corrupt;
    return give_up(std::string(st.message()));
  }
  up(l);
}

void ShmTransport::up(Link& l) {
  l.state = State::kUp;
  ++up_;
  l.publisher = std::make_unique<Publisher>(*this, l);
  if (l.role != ShmLink::Role::kBridge) return;  // a lane: requests in, replies out
  if (by_node(l.node) != nullptr) {
    drop(l, false, "a link to that node is up already");
    return;
  }
  by_node_[l.node] = l.id;
  l.route = std::make_unique<Route>(*this, l);
  ++sink_.counters().shm_links;
  events_.on_link_up(l.id, l.node, l.link->peer_publish_address());
}

void ShmTransport::drop(Link& l, bool died, const std::string& why) {
  if (l.dead) return;
  l.dead = true;
  dead_.push_back(l.id);
  if (l.state != State::kUp) return;
  --up_;
  for (const auto& w : l.backlog) {
    if (w.replies > 0) {
      sink_.counters().unroutable_replies += w.replies;
    } else {
      ++sink_.counters().send_refused;
    }
  }
  backlogged_ -= l.backlog.size();
  l.backlog.clear();
  if (l.role != ShmLink::Role::kBridge) return;
  auto it = by_node_.find(l.node);
  if (it == by_node_.end() || it->second != l.id) return;
  by_node_.erase(it);
  for (const auto& p : l.prefixes) sink_.on_subscription(p, false, true);
  if (!died) l.link->send_bye(1);
  events_.on_link_down(l.id, l.node, died, why, l.publisher.get());
}

void ShmTransport::reap() {
  for (uint64_t id : dead_) links_.erase(id);
  dead_.clear();
}

}  // namespace bus::net::detail
