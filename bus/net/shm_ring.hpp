// The shared-memory link's layout: one segment per end of a link, written by that end only and
// mapped read-only by the other; in it a single-writer ring of frames (the other end's input),
// the end's read position in the other's ring, its wake-up word and the heap blocks it holds.
// docs/wire-protocol.md §16 describes it byte by byte for a peer in another language.
#pragma once

#include <absl/status/statusor.h>
#include <absl/strings/string_view.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace bus::net::detail::shm {

inline constexpr uint64_t kMagic = 0x316d68732e737562;  // "bus.shm1", little-endian
inline constexpr uint32_t kVersion = 1;
inline constexpr std::size_t kHeaderBytes = 4096;  // the ring starts here, page-aligned
inline constexpr std::size_t kHolds = 256;         // heap blocks one end may hold at once
// A quarter of the smallest ring takes a full batch of small messages (32 KiB) and its envelope.
inline constexpr std::size_t kMinRingBytes = 256 * 1024;
inline constexpr std::size_t kMaxRingBytes = std::size_t{1} << 30;

/// The start of an end's segment. Every field has one writer: the segment's owner.
struct alignas(64) LinkHeader {
  // Set once, before the segment is handed over; the other end reads them once (handshake).
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;
  uint64_t ring_bytes;  // a power of two
  uint64_t node;        // the owner's node id
  uint32_t holds;       // entries of `hold`
  uint32_t reserved;
  // The owner's ring (what it writes for the other end).
  // (1) release: the frames below `tail` are complete. Pairs with (2) in the reader.
  alignas(64) std::atomic<uint64_t> tail;
  // Start + 1 of a frame whose header and envelope are complete and whose payload is being
  // written, else 0: a reader that finds the writer gone with this set counts that frame's
  // messages as lost instead of reading them torn.
  std::atomic<uint64_t> writing;
  // How far the owner has read the other end's ring.
  // (3) release: the owner is done with every byte below `head` of the other's ring. Pairs with
  // (4) in the other end's writer, which reuses them.
  alignas(64) std::atomic<uint64_t> head;
  // The owner's wake-up word: 0 it polls (spins), 1 it sleeps on this futex, 2 it sleeps in
  // poll(2) and is woken through the eventfd it handed over. Set before the owner's last look at
  // the ring, read by the writer after each commit (the fences (5) and (6) pair).
  alignas(64) std::atomic<uint32_t> sleeping;
  // Bumped (release) after a hold below is released: the other end rescans (7).
  alignas(64) std::atomic<uint64_t> holds_changed;
  // Block ids of the other end's heap that the owner still reads (0: free entry). An id is set
  // before `head` passes the frame that brought it, so the writer never frees a block a reader
  // took.
  alignas(64) std::atomic<uint64_t> hold[kHolds];
};
static_assert(sizeof(LinkHeader) <= kHeaderBytes, "the header fits before the ring");
static_assert(std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "lock-free atomics are address-free: they work across processes");

enum class FrameType : uint16_t {
  kData = 1,         // channel, envelope and the payloads, in the ring
  kBlock = 2,        // channel and envelope in the ring; the payloads in a heap block (BlockRef)
  kSubscribe = 3,    // channel: a prefix the sender takes topic frames of from now on
  kUnsubscribe = 4,  // channel: a prefix it no longer takes
  kPad = 5,          // nothing: the rest of the ring up to its end
};

/// Every frame starts with this, 8-byte aligned; a frame never wraps around the ring's end.
struct FrameHeader {
  uint32_t size;  // the whole frame, a multiple of 8
  uint16_t type;
  uint16_t flags;  // 0
  uint32_t channel_bytes;
  uint32_t envelope_bytes;
  uint64_t payload_bytes;  // kData: in the frame; kBlock: in the block
  uint64_t reserved;
};
static_assert(sizeof(FrameHeader) == 32);

/// Where a kBlock frame's payloads are: in the sender's heap extent `extent` (shared over the
/// link's socket before the first frame that names it), at `offset`.
struct BlockRef {
  uint64_t id;  // the sender's name for this block on this link (never 0)
  uint32_t extent;
  uint32_t reserved;
  uint64_t offset;
};
static_assert(sizeof(BlockRef) == 24);

inline constexpr std::size_t round8(std::size_t n) { return (n + 7) & ~std::size_t{7}; }

/// The bytes a frame takes in a ring.
inline std::size_t frame_bytes(FrameType type, std::size_t channel, std::size_t envelope,
                               std::size_t inline_payload) {
  return sizeof(FrameHeader) + (type == FrameType::kBlock ? sizeof(BlockRef) : 0) +
         round8(channel) + round8(envelope) + round8(inline_payload);
}

/// A frame read from a ring, its parts pointing into the ring (valid until the reader's head
/// passes it).
struct ParsedFrame {
  FrameType type = FrameType::kPad;
  uint64_t next = 0;  // the reader's head after this frame
  absl::string_view channel;
  const char* envelope = nullptr;
  std::size_t envelope_bytes = 0;
  const char* payload = nullptr;  // kData
  std::size_t payload_bytes = 0;  // kData, kBlock
  BlockRef block{};               // kBlock
};

/// Reads the frame at `head` of a ring of `ring_bytes` (a power of two) at `ring`, whose writer
/// says `tail`. Everything is checked: the header is copied out before it is looked at, and no
/// field can point outside the ring or past `tail`. InvalidArgument says what was wrong (the
/// link is then dropped). A kPad frame only moves the head.
absl::StatusOr<ParsedFrame> parse_frame(const char* ring, uint64_t ring_bytes, uint64_t head,
                                        uint64_t tail);

/// Reads the other end's `tail` and checks it against `head` (ours): it never moves back and
/// never gets more than a ring ahead.
absl::StatusOr<uint64_t> checked_tail(const LinkHeader& writer, uint64_t head, uint64_t ring_bytes);

/// The writing side of an end's own ring. Single-threaded (its owner's thread).
class RingWriter {
 public:
  RingWriter() = default;
  RingWriter(LinkHeader* own, char* ring, uint64_t ring_bytes, const LinkHeader* reader)
      : own_(own), ring_(ring), bytes_(ring_bytes), reader_(reader) {}

  /// Room for a frame of `bytes` (frame_bytes()), padding the rest of the ring first when it
  /// does not fit before the end: the frame's start, or null when the reader has not freed
  /// enough yet. `bytes` must be at most a quarter of the ring.
  char* reserve(std::size_t bytes);
  /// Says the frame reserve() gave is being written: its header and envelope are complete.
  void writing() { own_->writing.store(frame_at_ + 1, std::memory_order_release); }
  /// Publishes the frame reserved last, of `bytes`.
  void commit(std::size_t bytes);
  /// Bytes free now (from the reader's last head this writer saw).
  std::size_t free() const { return bytes_ - (tail_ - head_seen_); }
  /// Bytes free, reading the reader's head again.
  std::size_t free_now() {
    (void)see_head();
    return free();
  }
  uint64_t capacity() const { return bytes_; }
  /// The reader's head moved back or past our tail: it is corrupt.
  bool reader_corrupt() const { return corrupt_; }

 private:
  LinkHeader* own_ = nullptr;
  char* ring_ = nullptr;
  uint64_t bytes_ = 0;
  const LinkHeader* reader_ = nullptr;
  /// Reads the reader's head (checked): false when it is corrupt.
  bool see_head();
  uint64_t tail_ = 0;       // ours: the next frame's position
  uint64_t frame_at_ = 0;   // the frame reserve() gave
  uint64_t head_seen_ = 0;  // the reader's, when last read (a cached index: read only when short)
  bool corrupt_ = false;
};

}  // namespace bus::net::detail::shm
