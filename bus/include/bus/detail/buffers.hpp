// Recycled buffers for messages that one thread makes and another frees.
#pragma once

#include <cstddef>

namespace bus::detail {

/// A buffer of at least `bytes`, aligned for any scalar type. Sizes up to kRecycledMax come from a
/// per-thread magazine of recycled buffers of the size class, refilled from a shared depot;
/// larger ones, and everything under AddressSanitizer (so it still sees use after free), come
/// from operator new.
///
/// Why: a message is made on one thread (a publisher, the bridge decoding a frame) and freed on
/// another (the consumer that ran the last handler). With glibc's allocator alone the freed
/// chunks go back to the producer's arena, coalesce at its top and are trimmed away, and the
/// producer's next burst grows the heap again, page faults included: at small payloads, a large
/// part of the bridge's CPU (docs/benchmarks.md). Here the consumer's thread fills magazines, hands
/// them to the depot whole (a mutex per magazine of up to 64 buffers), and the producer's thread
/// takes them back. The bridge's outgoing frames come from here too (ZeroMQ's I/O thread frees
/// them).
void* alloc_recycled(std::size_t bytes);
/// Gives back a buffer from alloc_recycled(`bytes`), from any thread.
void free_recycled(void* p, std::size_t bytes) noexcept;

inline constexpr std::size_t kRecycledMax = 64 * 1024;

}  // namespace bus::detail
