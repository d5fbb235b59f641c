// What the bridge and its transports hand each other: frames in the protocol's three parts
// (channel name, envelope, payloads: docs/wire-protocol.md), whichever transport carries them.
#pragma once

#include <absl/status/status.h>
#include <absl/strings/string_view.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "bus/net/stats.hpp"
#include "wire.hpp"

namespace bus::net::detail {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// ---- tuning shared by the bridge and its transports ----------------------------------------

// A topic batch is handed to a transport once it reaches this size (or when the drain that
// filled it ends): one frame carries many messages, which is what beats one message per frame.
inline constexpr std::size_t kMaxBatchBytes = kLargeMessageBytes;
// Requests or replies sent in one frame, at most: a batch that is too long serialises the two
// nodes (one waits while the other works through it); a short one pipelines them.
inline constexpr std::size_t kSendBatchItems = 256;
// Messages (not frames: one frame may hold a batch) read from one source in one pass of the
// loop. Small passes pipeline: what a pass hands to local executors runs, and its answers go
// out, while the peer works on the next part, instead of whole windows crossing in turn.
inline constexpr std::size_t kReadBudget = 256;
// Drains of the inbox in one pass while each takes a full batch (ExternalInbox::kBatch records
// from a ring): fuller frames are cheaper for the receiver, which pays per frame (a read, a
// wake-up, an envelope).
inline constexpr int kDrainRounds = 4;
inline constexpr int kLingerMs = 1000;
// Frames kept per peer while there is no room toward it, and the total at which local input
// pauses.
inline constexpr std::size_t kMaxPeerBacklog = 1 << 16;
inline constexpr std::size_t kPauseBacklog = 1024;
inline constexpr int kPipeHwm = 10000;
// Senders whose sequence numbers are tracked before unknown ones are dropped.
inline constexpr std::size_t kMaxSenders = 1024;
// Entries in a heartbeat's `missed` list, at most.
inline constexpr std::size_t kMaxMissedReports = 1024;

inline uint64_t random_id() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

inline absl::Status status_from(uint16_t code, std::string detail) {
  if (code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) code = 2;  // unknown
  return absl::Status(static_cast<absl::StatusCode>(code), detail);
}

/// Which of a peer's streams a frame came in on. Each takes its own kinds of frames.
enum class Stream {
  kTopics,    // a publisher's topic messages and heartbeats (ZeroMQ: our SUB)
  kRequests,  // requests, queue messages, topic messages sent straight here (our ROUTER)
  kReplies,   // replies to our requests (a DEALER of ours)
  kLink,      // all of those, over one shared-memory link
};

/// A frame as read, valid during the call that hands it over.
struct InFrame {
  Stream stream = Stream::kTopics;
  absl::string_view channel;
  const void* envelope = nullptr;
  std::size_t envelope_size = 0;
  const void* payload = nullptr;  // 8-byte aligned or not; Payloads::parse copies when not
  std::size_t payload_size = 0;
  ReplyTo reply_to;  // requests
};

/// A published frame (topic messages or a heartbeat) on its way to every subscriber.
struct OutFrame {
  std::string channel;
  std::string envelope;
  std::string payload;
  bus::detail::MessageRef large;  // a large message, as it is, in place of `payload`
  std::string_view payload_view() const {
    if (!large) return payload;
    auto w = large.words();
    return {reinterpret_cast<const char*>(w.begin()), w.size() * sizeof(capnp::word)};
  }
  uint32_t count = 0;              // messages (0: a heartbeat)
  const Bridged* topic = nullptr;  // a topic batch's channel
  std::vector<uint64_t> handover;  // a heartbeat: the nodes its `handover` names
};

/// What a transport hands the bridge, on the bridge thread.
class FrameSink {
 public:
  /// A frame read from a peer.
  virtual void on_frame(const InFrame& frame) = 0;
  /// A frame that does not read as one (wrong part count, say): dropped and counted.
  virtual void on_malformed(absl::string_view from, const absl::Status& why) = 0;
  /// A remote subscription to `topic` on this node came or went, over a shared-memory link
  /// (`link`) or ZeroMQ.
  virtual void on_subscription(const std::string& topic, bool added, bool link) = 0;
  /// A peer died writing a frame (`channel`, `envelope`; its payload never came): what it held
  /// is lost, and counted.
  virtual void on_torn(absl::string_view channel, const std::string& envelope) = 0;
  /// Messages read so far (the read budget counts them, not frames).
  virtual std::size_t messages_read() const = 0;
  virtual NodeStats& counters() = 0;
  virtual void log_once(const std::string& key, const std::string& what) = 0;

 protected:
  ~FrameSink() = default;
};

/// Where published frames go: the subscribers a transport reaches.
class Subscribers {
 public:
  virtual ~Subscribers() = default;
  /// Takes `frame` for every one of its subscribers of the frame's channel, or for none: false
  /// when one of them is full (the frame is offered again later).
  virtual bool offer(const OutFrame& frame) = 0;
  /// Takes `frame` for the subscribers with room and passes over the full ones, which count what
  /// they miss, until they read again.
  virtual void cut(const OutFrame& frame) = 0;
};

/// The way to one peer's requests: point-to-point frames (requests, queue messages, topic
/// messages sent straight to it), in order, kept while there is no room.
class PeerRoute {
 public:
  virtual ~PeerRoute() = default;
  /// Sends, or keeps the frame in the route's backlog while there is no room. False only when
  /// the backlog is full too. `large`: the message `payload` is, when it is one (a peer that
  /// shares memory reads it in place).
  virtual bool send(std::string_view channel, const EnvelopeFields& env, std::string_view payload,
                    const bus::detail::MessageRef* large = nullptr) = 0;
};

}  // namespace bus::net::detail
