// The shared-memory transport's receive path: what one pass of the bridge loop polls, sleeping
// and waking with the links' readers, and reading the links' frames within the read budget.
#include <absl/strings/str_cat.h>
#include <poll.h>

#include "shm_transport.hpp"
#include "shm_transport_links.hpp"

namespace bus::net::detail {

using shm::FrameType;

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

}  // namespace bus::net::detail
