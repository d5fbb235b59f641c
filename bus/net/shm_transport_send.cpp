// The shared-memory transport's send path: topic frames to the links that take them (through
// each link's publisher), requests over a link's route, replies, subscriptions, and what waited
// for room in a ring.
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "shm_heap.hpp"
#include "shm_transport.hpp"
#include "shm_transport_links.hpp"

namespace bus::net::detail {

using shm::FrameType;

// ---- a link's publisher and route ------------------------------------------------------------

bool ShmTransport::Publisher::offer(const OutFrame& f) {
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

void ShmTransport::Publisher::cut(const OutFrame&) {
  l_.cut = true;
  t_.sink_.log_once(absl::StrCat("shm-cut:", l_.node),
                    absl::StrCat("node ", absl::Hex(l_.node), "'s ring stayed full for ",
                                 t_.opt_.send_stall_limit().count(),
                                 " ms: sending on without it (it counts what it misses)"));
}

bool ShmTransport::Route::send(std::string_view channel, const EnvelopeFields& env,
                               std::string_view payload, const bus::detail::MessageRef* large) {
  return t_.send_or_keep(l_, FrameType::kData, channel, encode_envelope(env), payload,
                         large != nullptr ? *large : bus::detail::MessageRef(), 0);
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
