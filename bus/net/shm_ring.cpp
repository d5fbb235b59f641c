#include "shm_ring.hpp"

#include <absl/strings/str_cat.h>

#include <cstring>

namespace bus::net::detail::shm {

absl::StatusOr<uint64_t> checked_tail(const LinkHeader& writer, uint64_t head,
                                      uint64_t ring_bytes) {
  // (2) acquire: pairs with (1): the frames below the tail are complete.
  uint64_t tail = writer.tail.load(std::memory_order_acquire);
  if (tail < head || tail - head > ring_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("its ring's tail ", tail, " is not within a ring of our head ", head));
  }
  return tail;
}

absl::StatusOr<ParsedFrame> parse_frame(const char* ring, uint64_t ring_bytes, uint64_t head,
                                        uint64_t tail) {
  auto bad = [&](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("frame at ", head, ": ", what));
  };
  if (head % 8 != 0 || head >= tail || tail - head > ring_bytes) return bad("outside the ring");
  const uint64_t offset = head & (ring_bytes - 1);
  const uint64_t to_end = ring_bytes - offset;
  ParsedFrame f;
  if (to_end < sizeof(FrameHeader)) {
    // Too little room for a header before the end: the writer went on at the start.
    f.type = FrameType::kPad;
    f.next = head + to_end;
    if (f.next > tail) return bad("a short end of the ring past the tail");
    return f;
  }
  FrameHeader h;
  // Copied out: the checks below hold for what is used, whatever the memory says meanwhile.
  std::memcpy(&h, ring + offset, sizeof h);
  const uint64_t available = std::min<uint64_t>(to_end, tail - head);
  if (h.size % 8 != 0 || h.size < sizeof(FrameHeader) || h.size > available) {
    return bad("its size is not a multiple of 8 within the written part of the ring");
  }
  f.next = head + h.size;
  f.type = static_cast<FrameType>(h.type);
  switch (f.type) {
    case FrameType::kPad:
      if (h.size != to_end) return bad("padding that does not end the ring");
      return f;
    case FrameType::kData:
    case FrameType::kBlock:
    case FrameType::kSubscribe:
    case FrameType::kUnsubscribe: break;
    default: return bad("unknown frame type");
  }
  const bool block = f.type == FrameType::kBlock;
  const bool data = f.type == FrameType::kData;
  // Sums in 64 bits from 32-bit parts (and one checked 64-bit one): no overflow.
  uint64_t need = sizeof(FrameHeader) + (block ? sizeof(BlockRef) : 0) + round8(h.channel_bytes) +
                  round8(h.envelope_bytes);
  if (need > h.size) return bad("its parts are larger than the frame");
  // Compared before it is rounded: a length near 2^64 would round up to a small number.
  if (data && (h.payload_bytes > h.size - need || round8(h.payload_bytes) > h.size - need)) {
    return bad("its payload is past its end");
  }
  if (!data && !block && (h.envelope_bytes != 0 || h.payload_bytes != 0)) {
    return bad("a subscription with an envelope or payload");
  }
  const char* p = ring + offset + sizeof(FrameHeader);
  if (block) {
    std::memcpy(&f.block, p, sizeof f.block);
    p += sizeof(BlockRef);
    if (f.block.id == 0) return bad("a block without an id");
  }
  f.channel = absl::string_view(p, h.channel_bytes);
  p += round8(h.channel_bytes);
  f.envelope = p;
  f.envelope_bytes = h.envelope_bytes;
  p += round8(h.envelope_bytes);
  f.payload_bytes = h.payload_bytes;
  if (data) f.payload = p;
  return f;
}

char* RingWriter::reserve(std::size_t bytes) {
  const uint64_t offset = tail_ & (bytes_ - 1);
  const uint64_t to_end = bytes_ - offset;
  const uint64_t need = bytes <= to_end ? bytes : to_end + bytes;
  if (bytes_ - (tail_ - head_seen_) < need) {
    if (!see_head() || bytes_ - (tail_ - head_seen_) < need) return nullptr;
  }
  if (bytes > to_end) {
    if (to_end >= sizeof(FrameHeader)) {
      FrameHeader pad{};
      pad.size = static_cast<uint32_t>(to_end);
      pad.type = static_cast<uint16_t>(FrameType::kPad);
      std::memcpy(ring_ + offset, &pad, sizeof pad);
    }
    tail_ += to_end;
  }
  frame_at_ = tail_;
  return ring_ + (tail_ & (bytes_ - 1));
}

bool RingWriter::see_head() {
  // (4) acquire: pairs with (3): the reader is done with what lies below its head.
  uint64_t head = reader_->head.load(std::memory_order_acquire);
  if (head < head_seen_ || head > tail_ || head % 8 != 0) {
    corrupt_ = true;
    return false;
  }
  head_seen_ = head;
  return true;
}

void RingWriter::commit(std::size_t bytes) {
  tail_ = frame_at_ + bytes;
  // (1) release: pairs with (2): the frame's bytes are written.
  own_->tail.store(tail_, std::memory_order_release);
  own_->writing.store(0, std::memory_order_relaxed);  // after the tail: a reader sees one or both
}

}  // namespace bus::net::detail::shm
