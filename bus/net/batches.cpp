#include "batches.hpp"

namespace bus::net::detail {

void ReplyBatcher::add(const RemoteCall& to, Bridged& channel, const absl::Status& status,
                       std::string_view payload, Send send) {
  auto [at, fresh] = at_.try_emplace(std::pair(to.to, &channel));
  if (fresh) {
    at->second = batches_.size();
    ReplyBatch& b = batches_.emplace_back();
    b.to = to.to;
    b.channel = &channel;
    b.peer = to.peer;
  }
  ReplyBatch& b = batches_[at->second];
  BatchItem& item = b.items.emplace_back();
  item.correlation = to.correlation;
  item.code = static_cast<uint16_t>(status.code());
  b.envelope_bytes += 3 * sizeof(capnp::word);
  if (status.ok()) {
    b.bytes.append(payload);
  } else {
    item.detail = std::string(status.message().substr(0, 1024));
    b.envelope_bytes += item.detail.size() + 8;
  }
  // Within what a receiver takes as an envelope (decode_envelope's bound).
  if (b.items.size() >= kSendBatchItems || b.bytes.size() >= kMaxBatchBytes ||
      b.envelope_bytes >= 32 * 1024) {
    send(b);
  }
}

void ReplyBatcher::flush(Send send) {
  if (batches_.empty()) return;
  for (ReplyBatch& b : batches_) send(b);
  batches_.clear();
  at_.clear();
}

}  // namespace bus::net::detail
