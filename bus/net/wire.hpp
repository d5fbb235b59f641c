// Reading and writing the frames of the wire protocol (docs/wire-protocol.md). Everything read
// here comes from the network: it is bounds-checked and never trusted.
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <capnp/common.h>
#include <kj/array.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bus/net/detail/channels.hpp"
#include "bus/principal.hpp"
#include "bus/schemas/envelope.capnp.h"

namespace bus::net::detail {

inline constexpr char kHeartbeatTopic[] = "$bus.heartbeat";
/// Every node answers its figures here (wire::NodeStatsRequest -> wire::NodeStatsReply).
inline constexpr char kStatsEndpoint[] = "$bus.stats";

/// A request or a reply in a batch (Envelope.requests / Envelope.replies).
struct BatchItem {
  uint64_t correlation = 0;
  uint64_t timeout_us = 0;  // requests
  uint16_t code = 0;        // replies
  std::string detail;       // replies
};

/// Requests or replies in one batch, at most.
inline constexpr std::size_t kMaxBatchItems = 1024;

/// Envelope fields as plain values (frame 2).
struct EnvelopeFields {
  wire::Envelope::Kind kind = wire::Envelope::Kind::PUBLISH;
  uint64_t type_id = 0;
  uint64_t sender = 0;
  uint64_t seq = 0;
  uint32_t count = 0;
  uint64_t correlation = 0;
  uint64_t timeout_us = 0;
  uint16_t code = 0;
  std::string detail;
  // A request or reply batch (kind request or reply); empty for a single one.
  std::vector<BatchItem> items;
  PrincipalPtr principal;  // requests: who they are for, or null
};

/// Frame 2: the envelope as one Cap'n Proto message.
std::string encode_envelope(const EnvelopeFields& e);
/// InvalidArgument when `bytes` is not an envelope.
absl::StatusOr<EnvelopeFields> decode_envelope(const void* bytes, std::size_t size);

/// Frame 3, read: the `count` payloads it holds, in the frame itself when it is 8-byte aligned,
/// else in an aligned copy. They are valid until the next parse() and while the frame lives.
class Payloads {
 public:
  /// InvalidArgument when the framing is broken or the count is wrong; ResourceExhausted when a
  /// payload is larger than `limits.max_message_bytes`.
  absl::Status parse(const void* bytes, std::size_t size, uint32_t count, const Limits& limits);
  const std::vector<kj::ArrayPtr<const capnp::word>>& items() const { return items_; }

 private:
  kj::Array<capnp::word> buf_;
  std::vector<kj::ArrayPtr<const capnp::word>> items_;
};

}  // namespace bus::net::detail
