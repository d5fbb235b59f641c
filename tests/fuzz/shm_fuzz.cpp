// libFuzzer target: a shared-memory link's ring as the other end left it (docs/wire-protocol.md
// §16), read the way the bridge reads it. The writer is another process that may be buggy,
// hostile or killed mid-write: no tail, frame header, size or part may make the reader touch a
// byte outside the ring, go backwards, or loop.
//
// Input: 8 bytes of tail, 8 of head, then the ring's bytes. The ring is the largest power of
// two that fits in the rest (at least 64 bytes), in a buffer of exactly that size, so that
// AddressSanitizer sees any read past its end.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "shm_ring.hpp"

namespace {

namespace shm = bus::net::detail::shm;

/// Touches every byte of [p, p + n): a part that points outside the ring is caught here.
uint8_t touch(const char* p, std::size_t n) {
  uint8_t x = 0;
  for (std::size_t i = 0; i < n; ++i) x ^= static_cast<uint8_t>(p[i]);
  return x;
}

void check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  if (size < 16 + 64) return 0;
  uint64_t tail, head;
  std::memcpy(&tail, data, 8);
  std::memcpy(&head, data + 8, 8);
  std::size_t ring_bytes = 64;
  while (ring_bytes * 2 <= size - 16) ring_bytes *= 2;
  auto ring = std::make_unique<char[]>(ring_bytes);
  std::memcpy(ring.get(), data + 16, ring_bytes);
  // Heads within a few laps of the start, unless the top bit asks for any value: the checks
  // are about positions relative to the ring, which small values reach far more often.
  if ((head >> 63) == 0) head = (head % (4 * ring_bytes)) & ~uint64_t{7};

  // The tail as the reader checks it, from a header whose tail is the fuzzer's.
  auto header = std::make_unique<shm::LinkHeader>();
  header->tail.store(tail, std::memory_order_relaxed);
  auto checked = shm::checked_tail(*header, head, ring_bytes);
  if (!checked.ok()) return 0;
  tail = *checked;
  check(tail >= head && tail - head <= ring_bytes);

  volatile uint8_t sink = 0;
  for (int frames = 0; head < tail; ++frames) {
    check(frames <= static_cast<int>(ring_bytes / 8));  // every frame moves the head on
    auto f = shm::parse_frame(ring.get(), ring_bytes, head, tail);
    if (!f.ok()) break;  // the link is dropped
    check(f->next > head && f->next <= tail && f->next % 8 == 0);
    sink = sink ^ touch(f->channel.data(), f->channel.size());
    if (f->envelope != nullptr) sink = sink ^ touch(f->envelope, f->envelope_bytes);
    if (f->type == shm::FrameType::kData && f->payload != nullptr) {
      sink = sink ^ touch(f->payload, f->payload_bytes);
    }
    if (f->type == shm::FrameType::kBlock) check(f->block.id != 0);
    head = f->next;
  }
  (void)sink;
  return 0;
}
