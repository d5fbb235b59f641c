#include "shm_transport.hpp"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "shm_heap.hpp"

namespace bus::net::detail {

using shm::FrameType;

namespace {}  // namespace

struct ShmTransport::Link {
  uint64_t id = 0;
  State state = State::kAccepted;
  bool initiated = false;
  uint64_t node = 0;  // the other end's node id (known from its hello, or the heartbeat)
  int sock = -1;      // kAccepted: the socket, before the link is made
  std::unique_ptr<ShmLink> link;
  ShmLink::Role role = ShmLink::Role::kBridge;
  // The prefixes it takes topic frames of, and what they say of each channel sent so far.
  absl::flat_hash_set<std::string> prefixes;
  absl::flat_hash_map<std::string, bool> wants;
  // Passed over after a stall: topic frames are dropped (it counts them as gaps) until half of
  // its ring is free again.
  bool cut = false;
  // It subscribed to our heartbeats over the link and takes nothing on it until a heartbeat
  // that names it in `handover` (it reads ZeroMQ until that heartbeat comes there too).
  bool handover = false;
  struct Waiting {
    FrameType type;
    std::string channel, envelope, payload;
    bus::detail::MessageRef large;  // in place of `payload`
    std::size_t replies;            // replies it holds (counted unroutable if it never goes)
  };
  std::deque<Waiting> backlog;  // point-to-point frames waiting for room, in order
  std::unique_ptr<Publisher> publisher;
  std::unique_ptr<Route> route;
  bool written = false;  // since the last wake_written()
  bool dead = false;

  bool takes(const std::string& channel) {
    auto [it, fresh] = wants.try_emplace(channel, false);
    if (fresh) {
      for (const auto& p : prefixes) it->second = it->second || absl::StartsWith(channel, p);
    }
    return it->second;
  }
};

/// A link's subscriber, as the publish gate sees it.
class ShmTransport::Publisher final : public Subscribers {
 public:
  Publisher(ShmTransport& t, Link& l) : t_(t), l_(l) {}
  bool offer(const OutFrame& f) override {
    if (l_.dead || l_.state != State::kUp || !l_.takes(f.channel)) return true;
    if (l_.handover) {
      if (std::find(f.handover.begin(), f.handover.end(), l_.node) == f.handover.end()) return true;
      if (!t_.write(l_, f.channel, f.envelope, f.payload_view(), f.large)) return false;
      l_.handover = false;  // the heartbeat that names it went first: everything follows
      // It lets go of its ZeroMQ subscriptions now: until they are gone, it is not counted twice.
      for (const auto& p : l_.prefixes) ++t_.leaving_[p];
      return true;
    }
    if (l_.cut) {
      if (l_.link->free_now() < l_.link->ring_capacity() / 2) return true;  // passed over
      l_.cut = false;
    }
    return t_.write(l_, f.channel, f.envelope, f.payload_view(), f.large);
  }
  void cut(const OutFrame&) override {
    l_.cut = true;
    t_.sink_.log_once(absl::StrCat("shm-cut:", l_.node),
                      absl::StrCat("node ", absl::Hex(l_.node), "'s ring stayed full for ",
                                   t_.opt_.send_stall_limit().count(),
                                   " ms: sending on without it (it counts what it misses)"));
  }

 private:
  ShmTransport& t_;
  Link& l_;
};

/// A link to a bridge node, as its requests' route.
class ShmTransport::Route final : public PeerRoute {
 public:
  Route(ShmTransport& t, Link& l) : t_(t), l_(l) {}
  bool send(std::string_view channel, const EnvelopeFields& env, std::string_view payload,
            const bus::detail::MessageRef* large) override {
    return t_.send_or_keep(l_, FrameType::kData, channel, encode_envelope(env), payload,
                           large != nullptr ? *large : bus::detail::MessageRef(), 0);
  }

 private:
  ShmTransport& t_;
  Link& l_;
};

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

void ShmTransport::start(int wake_fd, std::string publish_endpoint) {
  wake_fd_ = wake_fd;
  publish_endpoint_ = std::move(publish_endpoint);
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

ShmTransport::Link* ShmTransport::find(uint64_t id) {
  auto it = links_.find(id);
  return it == links_.end() || it->second->dead ? nullptr : it->second.get();
}

ShmTransport::Link* ShmTransport::by_node(uint64_t node) const {
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return nullptr;
  auto l = links_.find(it->second);
  return l == links_.end() || l->second->dead ? nullptr : l->second.get();
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
  if (absl::Status st =
          (*link)->send_hello(ShmLink::Verdict::kWelcome, publish_endpoint_, wake_fd_);
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
    (void)l.link->send_hello(verdict, publish_endpoint_, -1);
    l.dead = true;
    dead_.push_back(l.id);
    return;
  }
  if (absl::Status st = l.link->attach(*hello); !st.ok()) {
    (void)l.link->send_hello(ShmLink::Verdict::kRefused, publish_endpoint_, -1);
    ++sink_.counters().shm_corrupt;
    sink_.log_once(absl::StrCat("shm-attach:", l.node),
                   absl::StrCat("refused node ", absl::Hex(l.node), "'s link: ", st.message()));
    l.dead = true;
    dead_.push_back(l.id);
    return;
  }
  if (!l.link->send_hello(ShmLink::Verdict::kWelcome, publish_endpoint_, wake_fd_).ok()) {
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
  events_.on_link_up(l.id, l.node, l.link->peer_publish_endpoint());
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

// ---- the loop ------------------------------------------------------------------------------

bool ShmTransport::prepare(PollSet& set) {
  polled_.clear();
  if (!on()) return false;
  at_listener_ = set.add(listener_, POLLIN);
  for (auto& [id, l] : links_) {
    if (l->dead) continue;
    polled_.emplace_back(id, set.add(l->sock >= 0 ? l->sock : l->link->socket(), POLLIN));
  }
  return has_input();
}

bool ShmTransport::has_input() const {
  if (up_ == 0) return false;
  for (const auto& [id, l] : links_) {
    if (!l->dead && l->state == State::kUp && l->link->has_input()) return true;
  }
  return false;
}

bool ShmTransport::input_waiting(uint64_t node) const {
  const Link* l = by_node(node);
  return l != nullptr && l->link->has_input();
}

bool ShmTransport::sleep() {
  for (auto& [id, l] : links_) {
    if (l->dead || l->state != State::kUp) continue;
    if (!l->link->sleep_on(2)) {
      awake();
      return false;
    }
  }
  return true;
}

void ShmTransport::awake() {
  for (auto& [id, l] : links_) {
    if (!l->dead && l->state == State::kUp) l->link->awake();
  }
}

void ShmTransport::on_socket(Link& l) {
  switch (l.state) {
    case State::kAccepted: return finish_accept(l);
    case State::kHello: return finish_connect(l);
    case State::kUp: {
      bool bye = false;
      if (l.link->on_socket(bye) == ShmLink::SocketState::kClosed) {
        read_frames(l);  // what it committed before it went is still ours
        std::string channel, envelope;
        if (!bye && !l.dead && l.link->torn_frame(channel, envelope)) {
          // Its process ended while writing a frame: never read (it is torn), and what it held
          // is counted as lost.
          ++sink_.counters().shm_torn_frames;
          sink_.on_torn(channel, envelope);
        }
        drop(l, !bye, bye ? "it left" : "its process is gone");
      }
      return;
    }
  }
}

void ShmTransport::read(const PollSet& set) {
  if (!on()) return;
  if (set.in(at_listener_)) accept();
  for (auto [id, at] : polled_) {
    if (set.fds[at].revents == 0) continue;
    if (Link* l = find(id)) on_socket(*l);
  }
  if (up_ > 0) {
    for (auto& [id, l] : links_) {
      if (!l->dead && l->state == State::kUp) read_frames(*l);
    }
  }
  reap();
}

void ShmTransport::read_links() {
  for (auto& [id, l] : links_) {
    if (!l->dead && l->state == State::kUp) read_frames(*l);
  }
  reap();
}

void ShmTransport::read_frames(Link& l) {
  absl::Status st = l.link->read(kReadBudget, [&](const shm::ParsedFrame& f) {
    if (l.dead) return;
    switch (f.type) {
      case FrameType::kSubscribe:
      case FrameType::kUnsubscribe: {
        std::string prefix(f.channel);
        const bool on = f.type == FrameType::kSubscribe;
        if (on ? !l.prefixes.insert(prefix).second : l.prefixes.erase(prefix) == 0) return;
        l.wants.clear();
        if (prefix == kHeartbeatTopic) l.handover = on;
        sink_.on_subscription(prefix, on, true);
        return;
      }
      case FrameType::kData:
      case FrameType::kBlock: {
        InFrame in;
        in.stream = Stream::kLink;
        in.channel = f.channel;
        in.envelope = f.envelope;
        in.envelope_size = f.envelope_bytes;
        in.payload = f.payload;
        in.payload_size = f.payload_bytes;
        in.reply_to.link = l.id;
        if (f.type == FrameType::kBlock) {
          const char* block = l.link->block(f.block, f.payload_bytes);
          if (block == nullptr) {
            ++sink_.counters().shm_corrupt;
            drop(l, false, "a heap block outside what it shared");
            return;
          }
          in.payload = block;
          // Messages decoded from it read it in place (see PayloadHold).
          BlockHold hold(*l.link, f.block, block, f.payload_bytes, &sink_.counters().shm_in_place);
          HoldScope scope(&hold);
          sink_.on_frame(in);
          return;
        }
        sink_.on_frame(in);
        return;
      }
      case FrameType::kPad: return;
    }
  });
  if (!st.ok() && !l.dead) {
    ++sink_.counters().shm_corrupt;
    sink_.log_once(absl::StrCat("shm-corrupt:", l.node),
                   absl::StrCat("dropped the shared-memory link to node ", absl::Hex(l.node), ": ",
                                st.message()));
    drop(l, false, std::string(st.message()));
  }
}

// ---- sending -------------------------------------------------------------------------------

void ShmTransport::subscribe(uint64_t node, const std::string& prefix, bool on) {
  Link* l = by_node(node);
  if (l == nullptr) return;
  // Not dropped when the ring is full: subscriptions wait in the backlog, in order.
  (void)send_or_keep(*l, on ? FrameType::kSubscribe : FrameType::kUnsubscribe, prefix, {}, {}, {},
                     0);
}

void ShmTransport::subscribers_of(const OutFrame& frame, std::vector<Subscribers*>& out) {
  if (up_ == 0) return;
  for (auto& [id, l] : links_) {
    if (!l->dead && l->state == State::kUp && l->role == ShmLink::Role::kBridge &&
        l->takes(frame.channel)) {
      out.push_back(l->publisher.get());
    }
  }
}

PeerRoute* ShmTransport::route(uint64_t node) {
  Link* l = by_node(node);
  return l != nullptr ? l->route.get() : nullptr;
}

std::size_t ShmTransport::pinned_bytes() const {
  std::size_t n = 0;
  for (const auto& [id, l] : links_) {
    if (l->link) n += l->link->pinned_bytes();
  }
  return n;
}

std::vector<uint64_t> ShmTransport::handovers() const {
  // Every node that takes our heartbeats over a link, not only those whose handover is still to
  // come: it completes at the first heartbeat naming it that reaches it over ZeroMQ, which may
  // not be the first one (its subscriber may have connected after that one left).
  std::vector<uint64_t> out;
  for (const auto& [id, l] : links_) {
    if (!l->dead && l->prefixes.contains(kHeartbeatTopic)) out.push_back(l->node);
  }
  return out;
}

uint64_t ShmTransport::link_of(uint64_t node) const {
  const Link* l = by_node(node);
  return l != nullptr ? l->id : 0;
}

std::size_t ShmTransport::subscribers(std::string_view topic) const {
  std::size_t n = 0;
  for (const auto& [id, l] : links_) {
    // During its handover it is counted where it still reads (ZeroMQ).
    if (!l->dead && !l->handover &&
        l->prefixes.contains(absl::string_view(topic.data(), topic.size()))) {
      ++n;
    }
  }
  return n;
}

std::size_t ShmTransport::leaving(std::string_view topic) const {
  auto it = leaving_.find(absl::string_view(topic.data(), topic.size()));
  return it == leaving_.end() ? 0 : it->second;
}

void ShmTransport::left_zmq(const std::string& topic) {
  auto it = leaving_.find(topic);
  if (it != leaving_.end() && --it->second == 0) leaving_.erase(it);
}

void ShmTransport::reply(uint64_t link, std::string_view channel, const std::string& envelope,
                         std::string_view payload, const bus::detail::MessageRef& large,
                         std::size_t replies) {
  Link* l = find(link);
  if (l == nullptr || l->state != State::kUp) {
    sink_.counters().unroutable_replies += replies;
    return;
  }
  ++sink_.counters().reply_frames;
  if (!send_or_keep(*l, FrameType::kData, channel, envelope, payload, large, replies)) {
    sink_.counters().unroutable_replies += replies;
  }
}

bool ShmTransport::write(Link& l, std::string_view channel, const std::string& envelope,
                         std::string_view payload, const bus::detail::MessageRef& large) {
  switch (l.link->send(channel, envelope, payload, large, settings_.heap_limit / 4)) {
    case ShmLink::Sent::kYes: l.written = true; return true;
    case ShmLink::Sent::kNoRoom: return false;
    case ShmLink::Sent::kNoHeap:
      ++sink_.counters().shm_heap_full;
      sink_.log_once("shm-heap", std::string(ShmHeap::instance().last_error().message()));
      return false;
    case ShmLink::Sent::kBroken:
      ++sink_.counters().shm_corrupt;
      drop(l, false, "its read position is not one we wrote, or its socket failed");
      return true;
  }
  return false;
}

bool ShmTransport::send_or_keep(Link& l, FrameType type, std::string_view channel,
                                std::string envelope, std::string_view payload,
                                bus::detail::MessageRef large, std::size_t replies) {
  auto put = [&]() -> bool {
    if (type != FrameType::kData) {
      bool ok = l.link->write(type, channel, {}, {});
      l.written = l.written || ok;
      return ok;
    }
    return write(l, channel, envelope, payload, large);
  };
  if (l.backlog.empty() && put()) return true;
  if (l.dead) return false;
  if (l.backlog.size() >= kMaxPeerBacklog) return false;
  // Kept as it is: a large message stays the message (held), anything else is copied.
  l.backlog.push_back({type, std::string(channel), std::move(envelope),
                       large ? std::string() : std::string(payload), std::move(large), replies});
  ++backlogged_;
  return true;
}

void ShmTransport::flush() {
  if (up_ == 0) return;
  for (auto& [id, l] : links_) {
    if (l->dead || l->state != State::kUp) continue;
    l->link->unpin_released();
    while (!l->backlog.empty() && !l->dead) {
      auto& w = l->backlog.front();
      bool ok;
      if (w.type != FrameType::kData) {
        ok = l->link->write(w.type, w.channel, {}, {});
        l->written = l->written || ok;
      } else {
        std::string_view payload = w.payload;
        if (w.large) {
          auto words = w.large.words();
          payload = {reinterpret_cast<const char*>(words.begin()),
                     words.size() * sizeof(capnp::word)};
        }
        ok = write(*l, w.channel, w.envelope, payload, w.large);
      }
      if (!ok) break;
      l->backlog.pop_front();
      --backlogged_;
    }
  }
  reap();
}

void ShmTransport::wake_written() {
  if (up_ == 0) return;
  for (auto& [id, l] : links_) {
    if (!l->written) continue;
    l->written = false;
    if (!l->dead) l->link->wake();
  }
}

}  // namespace bus::net::detail
