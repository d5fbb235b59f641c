// One end of a shared-memory link between two processes of one host.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bus/message.hpp"
#include "bus/net/detail/channels.hpp"
#include "shm_ring.hpp"
#include "shm_segment.hpp"

namespace bus::net::detail {

/// Settings of a node's links.
struct ShmSettings {
  std::size_t ring_bytes = 256 * 1024;  // each end's ring (a power of two)
  ShmAccess access;
  std::size_t heap_limit = std::size_t{512} << 20;
  std::chrono::microseconds spin{50};
};

/// The abstract Unix socket name a node listens on for links ("\0bus.shm/<id in hex>").
std::string shm_socket_name(uint64_t node);

/// A link's end: our segment (our ring, our read position in theirs, our wake-up word, the
/// blocks of theirs we hold), theirs mapped read-only, and the Unix socket (SOCK_SEQPACKET) the
/// link was made over. The socket stays open: it carries heap extents, and its end tells that
/// the other process is gone (or left). One thread uses a link (the bridge's, or a lane's
/// caller), but holds of theirs are released from any thread.
class ShmLink {
 public:
  enum class Role : uint32_t { kBridge = 1, kLane = 2 };
  /// Handshake answers.
  enum class Verdict : uint32_t { kWelcome = 0, kDuplicate = 1, kRefused = 2 };

  /// Our end over `sock` (taken; connected or accepted, non-blocking): our segment is made now.
  static absl::StatusOr<std::unique_ptr<ShmLink>> make(int sock, uint64_t self, Role role,
                                                       const ShmSettings& settings);
  /// Connects to `node`'s listening socket (non-blocking): the socket, or an error.
  static absl::StatusOr<int> connect_to(uint64_t node);
  ~ShmLink();
  ShmLink(const ShmLink&) = delete;
  ShmLink& operator=(const ShmLink&) = delete;

  // ---- handshake ---------------------------------------------------------------------------

  /// What one end tells the other: who it is, and its segment and wake-up eventfd (a bridge's;
  /// a lane sleeps on its futex word instead).
  struct Hello {
    uint64_t node = 0;
    Role role = Role::kBridge;
    Verdict verdict = Verdict::kWelcome;
    std::string publish_address;  // where its publisher listens (bridges)
    int segment_fd = -1;          // taken by attach()
    int wake_fd = -1;             // taken by attach()
    pid_t pid = 0;                // the kernel's word (SO_PEERCRED), not the peer's
    uid_t uid = 0;
    gid_t gid = 0;
    std::vector<gid_t> groups;  // supplementary (SO_PEERGROUPS)
  };
  /// Sends our hello (or, acceptor, our answer) with our segment and `wake_fd` (-1: none).
  absl::Status send_hello(Verdict verdict, const std::string& publish_address, int wake_fd);
  /// Reads the other end's hello, without waiting: Unavailable when none came yet.
  absl::StatusOr<Hello> receive_hello();
  /// receive_hello() on a socket that has no link yet (an acceptor's, before it makes one).
  static absl::StatusOr<Hello> read_hello(int sock);
  /// Maps the other end's segment, checks its header and takes its wake-up eventfd. Closes the
  /// descriptors of `hello` in every case.
  absl::Status attach(Hello& hello);
  bool attached() const { return theirs_ != nullptr; }

  uint64_t self() const { return self_; }
  uint64_t peer() const { return peer_; }
  Role peer_role() const { return peer_role_; }
  pid_t peer_pid() const { return peer_pid_; }
  int socket() const { return sock_; }
  const std::string& peer_publish_address() const { return peer_publish_; }

  // ---- our ring ----------------------------------------------------------------------------

  /// Writes one frame; false when there is no room now (or the link is broken). `block`:
  /// kBlock's reference. The other end is not woken: wake() after a pass's writes.
  bool write(shm::FrameType type, std::string_view channel, std::string_view envelope,
             std::string_view payload, const shm::BlockRef* block = nullptr);
  enum class Sent { kYes, kNoRoom, kNoHeap, kBroken };
  /// Writes a data frame: its payload in the ring when it fits, else in a block of our heap (a
  /// large message that is there already goes as it is, read in place). kNoRoom: the ring, or
  /// the blocks they hold (`quota` bytes at most), are full; kNoHeap: the heap has no room for
  /// a copy; kBroken: drop the link.
  Sent send(std::string_view channel, std::string_view envelope, std::string_view payload,
            const bus::detail::MessageRef& large, std::size_t quota);
  /// The largest frame write() takes (a quarter of the ring).
  std::size_t max_frame() const { return writer_.capacity() / 4; }
  /// Bytes free in our ring (as last seen).
  std::size_t ring_free() const { return writer_.free(); }
  /// Bytes free in our ring, reading their head again.
  std::size_t free_now() { return writer_.free_now(); }
  std::size_t ring_capacity() const { return writer_.capacity(); }
  /// Wakes the other end if it sleeps (after writes).
  void wake();
  /// The other end's reader moved its head backwards, or past what we wrote.
  bool reader_corrupt() const { return writer_.reader_corrupt(); }

  // ---- their ring --------------------------------------------------------------------------

  /// True when their ring holds frames we have not read.
  bool has_input() const;
  /// Reads up to `budget` frames, each to `on(const shm::ParsedFrame&)`; our head moves past
  /// each after `on` returns. An error means the other end wrote something that does not read
  /// as a frame: drop the link.
  template <class F>
  absl::Status read(std::size_t budget, F&& on);
  /// Before sleeping: `how` 1 (on our futex word) or 2 (in poll, woken through our eventfd).
  /// False when input came meanwhile (then do not sleep).
  bool sleep_on(uint32_t how);
  /// After waking (or to spin).
  void awake();
  /// Our segment's header: what the other end reads (tests write into it as a corrupt peer
  /// would).
  shm::LinkHeader* header_for_tests() const { return ours_header(); }
  /// Our futex word, for a lane to sleep on (FUTEX_WAIT while it reads `1`).
  std::atomic<uint32_t>& sleeping_word() { return ours_header()->sleeping; }

  // ---- heap blocks: theirs, that we read -----------------------------------------------------

  /// The bytes of their block, mapped; null when the reference does not lie in an extent they
  /// shared (extents waiting on the socket are taken first).
  const char* block(const shm::BlockRef& ref, std::size_t bytes);
  /// One block of theirs that messages read in place, counted: whoever holds a reference calls
  /// release() once (any thread); the last frees our hold entry, and the mappings it keeps alive
  /// outlive the link if they must.
  class Hold;
  /// Keeps the block of frame `ref` (being read now) for messages that read it in place: one
  /// reference, for the caller; null when our hold table is full (the caller copies).
  Hold* hold(const shm::BlockRef& ref);
  /// Holds we have.
  std::size_t holds() const;

  // ---- heap blocks: ours, that they read ---------------------------------------------------

  /// Sends them extent `extent` of our heap if they do not have it yet.
  absl::Status share_extent(uint32_t extent);
  /// A new block id, for the frame that references a block.
  uint64_t next_block_id() { return next_pin_++; }
  /// Keeps `message` (block `id`) alive while they may read it: until their head passes the
  /// frame that references it (`frame_end`) and they hold it no more.
  void pin(uint64_t id, bus::detail::MessageRef message, uint64_t frame_end);
  /// The position right after the last frame write() took.
  uint64_t written() const { return written_; }
  /// Lets go of the blocks they are done with.
  void unpin_released();
  std::size_t pinned_bytes() const { return pinned_bytes_; }

  // ---- the socket --------------------------------------------------------------------------

  /// Reads what came on the socket (heap extents, a goodbye). kClosed: the other end left
  /// (`said_bye`) or its process is gone; drop the link.
  enum class SocketState { kOpen, kClosed };
  SocketState on_socket(bool& said_bye);
  /// Tells the other end we are closing the link on purpose (`reason`, logged there).
  void send_bye(uint32_t reason);
  /// A frame whose header and envelope they wrote but whose payload they did not commit (they
  /// died writing): its channel and envelope, to count what it held as lost.
  bool torn_frame(std::string& channel, std::string& envelope) const;

 private:
  ShmLink(int sock, uint64_t self, Role role, std::shared_ptr<OwnedSegment> ours)
      : sock_(sock), self_(self), role_(role), ours_(std::move(ours)) {}
  shm::LinkHeader* ours_header() const { return reinterpret_cast<shm::LinkHeader*>(ours_->data()); }
  const shm::LinkHeader* theirs_header() const {
    return reinterpret_cast<const shm::LinkHeader*>(theirs_->data());
  }
  absl::Status take_extent(int fd, uint32_t index, uint64_t bytes);

  int sock_;
  const uint64_t self_;
  const Role role_;
  std::shared_ptr<OwnedSegment> ours_;  // shared: keepers of holds outlive the link
  std::shared_ptr<PeerSegment> theirs_;
  uint64_t peer_ = 0;
  Role peer_role_ = Role::kBridge;
  pid_t peer_pid_ = 0;
  std::string peer_publish_;
  int peer_wake_fd_ = -1;
  shm::RingWriter writer_;
  uint64_t written_ = 0;
  // Their ring: read once from their header at attach, then ours to keep.
  const char* their_ring_ = nullptr;
  uint64_t their_ring_bytes_ = 0;
  uint64_t head_ = 0;  // ours in their ring
  std::vector<std::shared_ptr<PeerSegment>> their_extents_;
  std::size_t next_hold_ = 0;  // where the search for a free hold entry starts
  // Ours that they read.
  std::vector<bool> shared_extents_;
  struct Pin {
    bus::detail::MessageRef message;
    uint64_t frame_end;
    std::size_t bytes;
  };
  absl::flat_hash_map<uint64_t, Pin> pins_;  // by block id
  uint64_t next_pin_ = 1;
  std::size_t pinned_bytes_ = 0;
  uint64_t unpin_head_ = 0, unpin_holds_ = ~uint64_t{0};  // what unpin_released() last saw
};

class ShmLink::Hold final : public bus::detail::WordsKeeper {
 public:
  Hold(std::shared_ptr<OwnedSegment> ours, std::shared_ptr<PeerSegment> extent, std::size_t slot)
      : ours_(std::move(ours)), extent_(std::move(extent)), slot_(slot) {}
  void retain() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void release() noexcept override;

 private:
  std::shared_ptr<OwnedSegment> ours_;
  std::shared_ptr<PeerSegment> extent_;  // where the words are
  std::size_t slot_;
  std::atomic<uint32_t> refs_{1};
};

template <class F>
absl::Status ShmLink::read(std::size_t budget, F&& on) {
  const shm::LinkHeader& t = *theirs_header();
  absl::StatusOr<uint64_t> tail = shm::checked_tail(t, head_, their_ring_bytes_);
  if (!tail.ok()) return tail.status();
  std::size_t frames = 0;
  while (head_ < *tail && frames < budget) {
    absl::StatusOr<shm::ParsedFrame> f =
        shm::parse_frame(their_ring_, their_ring_bytes_, head_, *tail);
    if (!f.ok()) return f.status();
    if (f->type != shm::FrameType::kPad) {
      on(*f);
      ++frames;
    }
    head_ = f->next;
    // (3) release: pairs with (4) in their writer: we are done with these bytes (and the holds
    // we took while reading them are set).
    ours_header()->head.store(head_, std::memory_order_release);
  }
  return absl::OkStatus();
}

/// The block a kBlock frame's payloads lie in, while they are read (set as current_hold()): the
/// first message that keeps it takes a hold on it, the others share that hold, and the frame lets
/// go of its own reference when it is read.
class BlockHold final : public PayloadHold {
 public:
  BlockHold(ShmLink& link, const shm::BlockRef& ref, const char* data, std::size_t bytes,
            uint64_t* in_place)
      : link_(link), ref_(ref), data_(data), bytes_(bytes), in_place_(in_place) {}
  BlockHold(const BlockHold&) = delete;
  BlockHold& operator=(const BlockHold&) = delete;
  ~BlockHold() {
    if (hold_ != nullptr) hold_->release();
  }
  bool covers(kj::ArrayPtr<const capnp::word> words) const override {
    auto* begin = reinterpret_cast<const char*>(words.begin());
    auto* end = reinterpret_cast<const char*>(words.end());
    return begin >= data_ && end <= data_ + bytes_;
  }
  bus::detail::WordsKeeper* keep() override {
    if (hold_ == nullptr && (hold_ = link_.hold(ref_)) == nullptr) return nullptr;
    hold_->retain();
    if (in_place_ != nullptr) ++*in_place_;
    return hold_;
  }

 private:
  ShmLink& link_;
  shm::BlockRef ref_;
  const char* data_;
  std::size_t bytes_;
  uint64_t* in_place_;  // counted here, when given
  ShmLink::Hold* hold_ = nullptr;
};

}  // namespace bus::net::detail
