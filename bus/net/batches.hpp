// Replies gathered during one pass of the bridge loop, sent as few frames as they fit in.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/functional/function_ref.h>
#include <absl/status/status.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "frames.hpp"

namespace bus::net::detail {

/// Replies to one requester on one endpoint, sent in one frame when the loop's pass ends.
struct ReplyBatch {
  ReplyTo to;
  Bridged* channel = nullptr;
  uint64_t peer = 0;
  std::vector<BatchItem> items;
  std::string bytes;               // the payloads of the items whose code is 0
  std::size_t envelope_bytes = 0;  // about what the items add to the envelope
};

/// The replies of one pass, per (requester, endpoint), for requesters that read reply batches.
/// A batch goes out when it is full or when the pass ends (flush).
class ReplyBatcher {
 public:
  using Send = absl::FunctionRef<void(ReplyBatch&)>;
  /// Adds the reply to `to`; sends its batch at once when that is full.
  void add(const RemoteCall& to, Bridged& channel, const absl::Status& status,
           std::string_view payload, Send send);
  /// Sends every batch of the pass.
  void flush(Send send);

 private:
  std::vector<ReplyBatch> batches_;
  absl::flat_hash_map<std::pair<ReplyTo, const Bridged*>, std::size_t> at_;
};

}  // namespace bus::net::detail
