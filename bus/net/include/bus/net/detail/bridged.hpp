// What the typed adapters and the bridge see of each other: `Bridged`, one channel crossing the
// bridge in one direction, and `Link`, the bridge as the adapters see it; and what passes between
// them (outgoing batches, forwarded requests and where their replies go).
#pragma once

#include <absl/hash/hash.h>
#include <absl/status/status.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "bus/bus.hpp"
#include "bus/message.hpp"
#include "bus/net/detail/payload.hpp"

namespace bus::net::detail {

/// Outgoing topic messages not yet handed to a transport (per exported topic): the open batch,
/// and, when a large message came, what waits in order before the batch (a large message goes
/// as it is, in a frame of its own).
struct Outbox {
  std::string bytes;  // the open batch
  uint32_t count = 0;
  uint64_t next_seq = 1;
  bool queued = false;
  struct Piece {
    std::string bytes;  // a closed batch of `count` messages, or:
    uint32_t count = 0;
    bus::detail::MessageRef large;  // one large message
  };
  std::deque<Piece> pieces;
};

/// The end of a request forwarded to another node: completed once, by the reply or a failure.
struct PendingCall {
  virtual ~PendingCall() = default;
  /// `payload` is the reply when `status` is OK.
  virtual void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) = 0;
};

/// Requests sent and answered on the calling thread, for Bus::call from a plain thread: each
/// caller borrows a lane (a DEALER per serving node) and waits on it for the reply, so the
/// request does not pass through the bridge thread on its way out nor the reply on its way back.
class DirectCalls {
 public:
  virtual ~DirectCalls() = default;
  /// Sends `payload` to a live node that serves endpoint `name` with these types, then waits
  /// here for its answer until `deadline`. `done` gets the answer or a failure (no live node,
  /// peer gone, the node stopped) on this thread, and true is returned; false when `deadline`
  /// passed first (`done` is not called). Any thread.
  virtual bool call(std::string_view name, uint64_t type_id, uint64_t reply_type_id,
                    const OutPayload& payload, Clock::time_point deadline, PendingCall& done) = 0;
};

/// Where the reply to a request goes: back through the ROUTER to `identity` (ZeroMQ), or over
/// shared-memory link `link`.
struct ReplyTo {
  std::string identity;
  uint64_t link = 0;
  bool operator==(const ReplyTo&) const = default;
  template <class H>
  friend H AbslHashValue(H h, const ReplyTo& r) {
    return H::combine(std::move(h), r.identity, r.link);
  }
};

/// A request that came from another node, for the reply.
struct RemoteCall {
  ReplyTo to;
  uint64_t correlation = 0;
  uint64_t peer = 0;
  bool batched = false;  // the requester reads reply batches
};

class Bridged;

/// The bridge as the adapters see it (bridge thread only).
class Link {
 public:
  virtual ~Link() = default;
  virtual Bus& bus() = 0;
  virtual ExternalInbox& inbox() = 0;
  virtual const Limits& limits() const = 0;
  /// `out` of `channel` has new messages: publish them when this drain ends.
  virtual void queue_publish(Bridged& channel, Outbox& out) = 0;
  /// A large message of `channel`, published as it is (after what `out` holds).
  virtual void publish_large(Bridged& channel, Outbox& out, bus::detail::MessageRef message) = 0;
  /// A message of `bytes` for `channel` is over max_message_bytes: counts and logs it (no
  /// receiver would take it) and returns true.
  virtual bool oversized(const Bridged& channel, std::size_t bytes) = 0;
  /// Sends a request, for `principal` (or nobody), to a live node serving `channel`. Takes
  /// `pending` and finishes it (now with a failure, or later with the reply, a timeout or "peer
  /// gone").
  virtual void call(Bridged& channel, OutPayload payload, Clock::time_point deadline,
                    PrincipalPtr principal, std::unique_ptr<PendingCall> pending) = 0;
  /// Calls from other threads that do not pass through the bridge thread (see DirectCalls). It
  /// may outlive the link.
  virtual std::shared_ptr<DirectCalls> direct_calls() = 0;
  /// Sends a queue message to a live node consuming `channel`.
  virtual absl::Status send(Bridged& channel, OutPayload payload) = 0;
  virtual void reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
                     OutPayload payload) = 0;
};

/// One channel crossing the bridge in one direction.
class Bridged {
 public:
  enum class Role {
    kExportTopic,
    kImportTopic,
    kExportEndpoint,
    kImportEndpoint,
    kExportQueue,
    kImportQueue
  };
  Bridged(Role r, const bus::detail::ChannelBase& ch, uint64_t type, uint64_t reply_type)
      : role(r), name(ch.name()), type_id(type), reply_type_id(reply_type) {}
  /// A channel known by name only (untyped access: Node::call_raw).
  Bridged(Role r, std::string n, uint64_t type, uint64_t reply_type)
      : role(r), name(std::move(n)), type_id(type), reply_type_id(reply_type) {}
  virtual ~Bridged() = default;

  /// On the bridge thread, once registered / when the node stops.
  virtual void start(Link&) {}
  virtual void stop(Link&) {}
  /// On the bridge thread: the same channel added again (Node::serve() after export_endpoint(),
  /// say). Takes what `again` adds; it is then dropped.
  virtual void merge(Link&, Bridged& /*again*/) {}
  /// Import topic, export queue: one payload from another node, for local delivery.
  virtual absl::Status deliver(Link&, kj::ArrayPtr<const capnp::word>) {
    return absl::InternalError("not a receiving channel");
  }
  /// Export endpoint: a request from another node.
  virtual void serve(Link&, RemoteCall, kj::ArrayPtr<const capnp::word>, Clock::duration) {}
  /// Import endpoint or queue: whether some live node serves it.
  virtual void set_reachable(Link&, bool) {}
  /// Import topic: whether it has local subscribers (the node subscribes only then).
  virtual bool wanted(Link&) { return false; }

  const Role role;
  const std::string name;
  const uint64_t type_id;
  const uint64_t reply_type_id;  // endpoints
  Outbox out;                    // export topic
};

}  // namespace bus::net::detail
