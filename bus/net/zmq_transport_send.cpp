// The ZeroMQ transport's send path: topic frames through the publisher, requests and queue
// messages through a peer's route (kept in order while its pipe is full), replies through the
// ROUTER, and what waited for room.
#include <absl/strings/str_cat.h>

#include <cstring>
#include <limits>

#include "bus/detail/buffers.hpp"
#include "zmq_transport.hpp"
#include "zmq_transport_senders.hpp"

namespace bus::net::detail {

namespace {

#if defined(__SANITIZE_THREAD__)
#define BUS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BUS_TSAN 1
#endif
#endif
#if defined(BUS_TSAN)
// ZeroMQ hands frames to its I/O thread through pipes TSan cannot see (tests/tsan.supp): a
// recycled buffer freed there and reused here would be reported as a race. Under TSan, frames are
// ZeroMQ's own copies (allocated and freed inside libzmq, which the suppressions cover).
constexpr std::size_t kRecycledFrom = std::numeric_limits<std::size_t>::max();
#else
constexpr std::size_t kRecycledFrom = 256;
#endif

zmq::message_t frame(std::string_view bytes) {
  // Small frames: ZeroMQ keeps them inside the message itself.
  if (bytes.size() < kRecycledFrom) return zmq::message_t(bytes.data(), bytes.size());
  // The rest: a recycled buffer that ZeroMQ's I/O thread frees once sent, so the buffers cycle
  // between the two threads instead of growing and trimming the heap (see bus/detail/buffers.hpp).
  void* p = bus::detail::alloc_recycled(bytes.size());
  std::memcpy(p, bytes.data(), bytes.size());
  return zmq::message_t(
      p, bytes.size(),
      [](void* data, void* size) {
        bus::detail::free_recycled(data, reinterpret_cast<std::size_t>(size));
      },
      reinterpret_cast<void*>(bytes.size()));
}

}  // namespace

// ---- the publisher: every ZeroMQ subscriber at once ----------------------------------------

bool ZmqTransport::Publisher::offer(const OutFrame& f) {
  // NODROP: a full subscriber queue refuses the frame for everyone (ZeroMQ cannot tell which
  // subscriber is full), which holds the frame back: the back-pressure that keeps a
  // subscriber that is only a little slower, or pauses briefly, from losing anything.
  Parts& parts = parts_for(f);
  if (!t_.send_all(*t_.xpub_, parts)) return false;
  pending_ = nullptr;
  return true;
}

void ZmqTransport::Publisher::cut(const OutFrame& f) {
  t_.sink_.log_once("cut", absl::StrCat("a subscriber's queue stayed full for ",
                                        t_.opt_.send_stall_limit().count(),
                                        " ms: sending on without it (it counts what it misses)"));
  // Without NODROP, ZeroMQ writes the frame to every subscriber with room and skips a full
  // one. It then leaves that one out of every send, NODROP or not, until half of its queue is
  // read: a stopped subscriber is passed over from now on, while the others still hold the
  // publisher back when they are full (and are waited for, up to the limit).
  Parts& parts = parts_for(f);
  t_.xpub_->set(zmq::sockopt::xpub_nodrop, 0);
  (void)t_.send_all(*t_.xpub_, parts);  // never refused without NODROP
  t_.xpub_->set(zmq::sockopt::xpub_nodrop, 1);
  pending_ = nullptr;
}

Parts& ZmqTransport::Publisher::parts_for(const OutFrame& f) {
  if (pending_ != &f || parts_.size() != 3) {
    parts_.clear();
    parts_.emplace_back(f.channel.data(), f.channel.size());
    parts_.emplace_back(f.envelope.data(), f.envelope.size());
    parts_.push_back(frame(f.payload_view()));
    pending_ = &f;
  }
  return parts_;
}

// ---- a peer's request socket ---------------------------------------------------------------

bool ZmqTransport::Route::send(std::string_view channel, const EnvelopeFields& env,
                               std::string_view payload, const bus::detail::MessageRef*) {
  std::string e = encode_envelope(env);
  if (backlog.empty()) {
    t_.touched(dealer->handle());
    // As send_all(): only the first part can be refused.
    if (dealer->send(zmq::buffer(channel), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
      dealer->send(zmq::buffer(e), zmq::send_flags::sndmore);
      dealer->send(frame(payload), zmq::send_flags::none);
      return true;
    }
  }
  // The pipe to it is full (its high-water mark): keep the message, in order, until it
  // drains. Bounded; while any peer holds a long backlog the node stops taking local input.
  if (backlog.size() >= kMaxPeerBacklog) return false;
  Parts parts;
  parts.emplace_back(channel.data(), channel.size());
  parts.emplace_back(e.data(), e.size());
  parts.push_back(frame(payload));
  backlog.push_back(std::move(parts));
  ++t_.backlogged_;
  return true;
}

// ---- sending -------------------------------------------------------------------------------

// ZeroMQ queues a multipart message atomically: once the first part is accepted, the others are
// too (they go to the same pipe), so only the first send can say EAGAIN (false here). A ROUTER
// with MANDATORY throws EHOSTUNREACH on the first part for a requester that is gone.
bool ZmqTransport::send_all(zmq::socket_t& s, Parts& parts) {
  touched(s.handle());
  if (!s.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    s.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return true;
}

void ZmqTransport::reply(const std::string& identity, std::string_view channel,
                         const std::string& envelope, std::string_view payload,
                         std::size_t replies) {
  if (!router_) return;  // closed
  if (reply_backlog_.size() >= kMaxPeerBacklog) {
    sink_.counters().unroutable_replies += replies;
    return;
  }
  Parts parts;
  parts.emplace_back(identity.data(), identity.size());
  parts.emplace_back(channel.data(), channel.size());
  parts.emplace_back(envelope.data(), envelope.size());
  parts.push_back(frame(payload));
  // In order behind what is waiting already; the ROUTER takes it when the requester's pipe has
  // room (its high-water mark: the requester is not reading as fast as it asks).
  ++sink_.counters().reply_frames;
  reply_backlog_.push_back({std::move(parts), replies});
  flush_replies();
}

void ZmqTransport::flush_replies() {
  while (!reply_backlog_.empty()) {
    try {
      // EAGAIN: that requester's pipe is full; keep the order, retry later.
      if (!send_all(*router_, reply_backlog_.front().first)) return;
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH (ROUTER_MANDATORY): the requester disconnected.
      sink_.counters().unroutable_replies += reply_backlog_.front().second;
    }
    reply_backlog_.pop_front();
  }
}

void ZmqTransport::flush() {
  if (backlogged_ > 0) {
    for (auto& [id, r] : routes_) {
      while (!r->backlog.empty()) {
        if (!send_all(*r->dealer, r->backlog.front())) break;
        r->backlog.pop_front();
        --backlogged_;
      }
    }
  }
  if (!reply_backlog_.empty()) flush_replies();
}

std::size_t ZmqTransport::subscribers(std::string_view topic) const {
  auto it = subscribers_.find(absl::string_view(topic.data(), topic.size()));
  return it == subscribers_.end() ? 0 : it->second;
}

}  // namespace bus::net::detail
