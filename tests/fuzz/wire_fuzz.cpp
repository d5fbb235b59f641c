// libFuzzer target: frames 2 and 3 of a bus message (docs/wire-protocol.md), read the way the
// bridge reads what arrives from the network. Nothing may crash, leak or throw out.
//
// Input: the envelope frame, then the payload frame. The envelope's own stream framing (its
// segment table) says where it ends, so a seed is just the two frames back to back, as
// `capnp encode` writes them (see make_corpus.sh). The payload count is the envelope's.
#include <bus/schemas/demo.capnp.h>
#include <bus/schemas/envelope.capnp.h>
#include <capnp/serialize.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "wire.hpp"

namespace {

using bus::net::detail::Limits;

// Small limits, so that the fuzzer reaches them rather than the memory limit.
constexpr Limits kLimits{/*max_message_bytes=*/64 * 1024, /*traversal_limit_words=*/16 * 1024,
                         /*nesting_limit=*/16};

/// Where a message in stream framing that starts at `data` ends (at most `size`).
std::size_t framed_size(const uint8_t* data, std::size_t size) {
  if (size < 4) return size;
  uint32_t last;
  std::memcpy(&last, data, 4);
  uint64_t segments = uint64_t{last} + 1;
  uint64_t bytes = (segments + 2) / 2 * 8;  // the table, padded to a word
  for (uint64_t i = 0; i < segments && bytes <= size; ++i) {
    if (4 * (i + 2) > size) return size;
    uint32_t words;
    std::memcpy(&words, data + 4 * (i + 1), 4);
    bytes += uint64_t{words} * 8;
  }
  return bytes < size ? static_cast<std::size_t>(bytes) : size;
}

template <class S>
void decode_as(kj::ArrayPtr<const capnp::word> payload) {
  auto m = bus::net::detail::decode<bus::Message<S>>(payload, kLimits);
  if (m.ok()) (void)m->reader().totalSize();  // read the copy through the unchecked layout too
}

/// A payload the pointer walk lets through uncopied must be one Cap'n Proto's checked reader
/// takes whole, and read unchecked it must be the same size.
void check_walk(kj::ArrayPtr<const capnp::word> payload) {
  if (bus::net::detail::readable_unchecked(payload, kLimits).size() == 0) return;
  uint64_t checked;
  try {
    capnp::FlatArrayMessageReader reader(payload, bus::net::detail::reader_options(kLimits));
    checked = reader.getRoot<demo::StatsReply>().totalSize().wordCount;
  } catch (const kj::Exception&) {
    __builtin_trap();  // the walk took what the checked reader refuses
  }
  auto m = bus::net::detail::decode<bus::Message<demo::StatsReply>>(payload, kLimits);
  if (!m.ok() || m->reader().totalSize().wordCount != checked) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  std::size_t envelope_size = framed_size(data, size);
  auto envelope = bus::net::detail::decode_envelope(data, envelope_size);
  uint32_t count = envelope.ok() ? envelope->count : 1;
  bus::net::detail::Payloads payloads;
  if (payloads.parse(data + envelope_size, size - envelope_size, count, kLimits).ok()) {
    for (auto payload : payloads.items()) {
      check_walk(payload);
      decode_as<demo::Reading>(payload);
      decode_as<demo::StatsReply>(payload);
      decode_as<bus::wire::Heartbeat>(payload);
    }
  }
  return 0;
}
