#include "shm_link.hpp"

#include <absl/strings/str_cat.h>
#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string_view>

#include "shm_heap.hpp"

namespace bus::net::detail {

namespace {

using shm::FrameHeader;
using shm::FrameType;
using shm::LinkHeader;

/// What travels on a link's socket: a hello (each end, once), a heap extent, a goodbye. Fixed
/// size; descriptors ride along as SCM_RIGHTS.
struct SocketMessage {
  enum Kind : uint32_t { kHello = 1, kExtent = 2, kBye = 3 };
  uint64_t magic;
  uint32_t version;
  uint32_t kind;
  uint64_t node;     // hello: the sender's node id
  uint32_t role;     // hello
  uint32_t verdict;  // hello (the acceptor's answer)
  uint32_t extent;   // extent: its index
  uint32_t reason;   // bye
  uint64_t bytes;    // extent: its size
  uint32_t address_bytes;
  uint32_t reserved;
  char address[256];  // hello: where the sender's publisher listens
};

/// A failpoint for the crash tests: with BUS_NET_FAILPOINT=shm-die-mid-frame:N in its
/// environment, a process dies (SIGKILL: nothing is cleaned up) halfway through copying the
/// payload of the Nth data frame it writes to a link. Read once; inert without the variable.
bool die_here() {
  static const long at = [] {
    const char* f = std::getenv("BUS_NET_FAILPOINT");
    constexpr std::string_view kName = "shm-die-mid-frame:";
    if (f == nullptr || std::string_view(f).substr(0, kName.size()) != kName) return 0L;
    return std::strtol(f + kName.size(), nullptr, 10);
  }();
  static std::atomic<long> frames{0};
  return at > 0 && frames.fetch_add(1, std::memory_order_relaxed) + 1 == at;
}

long futex(std::atomic<uint32_t>* word, int op, uint32_t value) {
  // Not FUTEX_PRIVATE_FLAG: the word is in memory two processes map.
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, nullptr, nullptr, 0);
}

bool send_message(int sock, const SocketMessage& m, const int* fds, int nfds) {
  iovec iov{const_cast<SocketMessage*>(&m), sizeof m};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  if (nfds > 0) {
    h.msg_control = control;
    h.msg_controllen = CMSG_SPACE(static_cast<std::size_t>(nfds) * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(static_cast<std::size_t>(nfds) * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, static_cast<std::size_t>(nfds) * sizeof(int));
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &h, MSG_NOSIGNAL);
    if (n == static_cast<ssize_t>(sizeof m)) return true;
    if (n < 0 && errno == EINTR) continue;
    return false;
  }
}

/// Reads one message without waiting: 1 read, 0 none yet, -1 the other end closed (or sent
/// something that is not a message: dropped like a close).
int receive_message(int sock, SocketMessage& m, int* fds, int& nfds) {
  iovec iov{&m, sizeof m};
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))];
  h.msg_control = control;
  h.msg_controllen = sizeof control;
  nfds = 0;
  ssize_t n;
  do {
    n = ::recvmsg(sock, &h, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  } while (n < 0 && errno == EINTR);
  if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -1;
  for (cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr; c = CMSG_NXTHDR(&h, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      if (nfds < 2) {
        fds[nfds++] = fd;
      } else {
        ::close(fd);
      }
    }
  }
  auto drop_fds = [&] {
    for (int i = 0; i < nfds; ++i) ::close(fds[i]);
    nfds = 0;
  };
  if (n == 0) {
    drop_fds();
    return -1;
  }
  if (n != static_cast<ssize_t>(sizeof m) || m.magic != shm::kMagic || m.version != shm::kVersion) {
    drop_fds();
    return -1;
  }
  return 1;
}

}  // namespace

std::string shm_socket_name(uint64_t node) {
  return absl::StrCat(std::string(1, '\0'), "bus.shm/", absl::Hex(node, absl::kZeroPad16));
}

// ---- a hold on a block of theirs -----------------------------------------------------------

void ShmLink::Hold::release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  auto* h = reinterpret_cast<LinkHeader*>(ours_->data());
  // (7) release: our reads of the block come before the entry is free. Pairs with the acquire
  // loads of unpin_released() in the other process.
  h->hold[slot_].store(0, std::memory_order_release);
  h->holds_changed.fetch_add(1, std::memory_order_release);
  delete this;
}

// ---- making and attaching ------------------------------------------------------------------

absl::StatusOr<int> ShmLink::connect_to(uint64_t node) {
  int sock = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (sock < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string name = shm_socket_name(node);
  std::memcpy(addr.sun_path, name.data(), name.size());
  auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
  if (::connect(sock, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    int e = errno;
    ::close(sock);
    return absl::UnavailableError(absl::StrCat("connect: ", std::strerror(e)));
  }
  return sock;
}

absl::StatusOr<std::unique_ptr<ShmLink>> ShmLink::make(int sock, uint64_t self, Role role,
                                                       const ShmSettings& settings) {
  std::size_t ring =
      std::clamp(std::bit_ceil(settings.ring_bytes), shm::kMinRingBytes, shm::kMaxRingBytes);
  auto segment = OwnedSegment::create("bus.link", shm::kHeaderBytes + ring, settings.access);
  if (!segment.ok()) {
    ::close(sock);
    return segment.status();
  }
  std::shared_ptr<OwnedSegment> ours(std::move(*segment));
  auto* h = ::new (ours->data()) LinkHeader{};
  h->magic = shm::kMagic;
  h->version = shm::kVersion;
  h->header_bytes = shm::kHeaderBytes;
  h->ring_bytes = ring;
  h->node = self;
  h->holds = shm::kHolds;
  return std::unique_ptr<ShmLink>(new ShmLink(sock, self, role, std::move(ours)));
}

ShmLink::~ShmLink() {
  if (sock_ >= 0) ::close(sock_);
  if (peer_wake_fd_ >= 0) ::close(peer_wake_fd_);
}

absl::Status ShmLink::send_hello(Verdict verdict, const std::string& publish_address, int wake_fd) {
  SocketMessage m{};
  m.magic = shm::kMagic;
  m.version = shm::kVersion;
  m.kind = SocketMessage::kHello;
  m.node = self_;
  m.role = static_cast<uint32_t>(role_);
  m.verdict = static_cast<uint32_t>(verdict);
  m.address_bytes = static_cast<uint32_t>(std::min(publish_address.size(), sizeof m.address));
  if (m.address_bytes != 0) std::memcpy(m.address, publish_address.data(), m.address_bytes);
  int fds[2] = {-1, -1};
  int nfds = 0;
  if (verdict == Verdict::kWelcome) {
    fds[nfds] = ours_->read_only_fd();
    if (fds[nfds] < 0) {
      return absl::UnavailableError(
          absl::StrCat("bus.net: reopening our segment read-only: ", std::strerror(errno)));
    }
    ++nfds;
    if (wake_fd >= 0) fds[nfds++] = wake_fd;
  }
  bool sent = send_message(sock_, m, fds, nfds);
  int e = errno;
  if (nfds > 0) ::close(fds[0]);  // the read-only copy (the wake fd stays ours)
  if (!sent) {
    return absl::UnavailableError(absl::StrCat("bus.net: sending a hello: ", std::strerror(e)));
  }
  return absl::OkStatus();
}

absl::StatusOr<ShmLink::Hello> ShmLink::receive_hello() { return read_hello(sock_); }

absl::StatusOr<ShmLink::Hello> ShmLink::read_hello(int sock) {
  SocketMessage m{};
  int fds[2] = {-1, -1};
  int nfds = 0;
  int got = receive_message(sock, m, fds, nfds);
  if (got == 0) return absl::UnavailableError("no hello yet");
  if (got < 0 || m.kind != SocketMessage::kHello) {
    for (int i = 0; i < nfds; ++i) ::close(fds[i]);
    return absl::InvalidArgumentError("bus.net: the other end closed or did not say hello");
  }
  Hello h;
  h.node = m.node;
  h.role = m.role == static_cast<uint32_t>(Role::kLane) ? Role::kLane : Role::kBridge;
  h.verdict = static_cast<Verdict>(m.verdict);
  h.publish_address.assign(m.address, std::min<std::size_t>(m.address_bytes, sizeof m.address));
  h.segment_fd = nfds > 0 ? fds[0] : -1;
  h.wake_fd = nfds > 1 ? fds[1] : -1;
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0) {
    h.pid = cred.pid;
    h.uid = cred.uid;
    h.gid = cred.gid;
  }
  gid_t groups[64];
  len = sizeof groups;
  if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups, &len) == 0) {
    h.groups.assign(groups, groups + len / sizeof(gid_t));
  }
  return h;
}

absl::Status ShmLink::attach(Hello& hello) {
  auto close_fds = [&] {
    if (hello.segment_fd >= 0) ::close(hello.segment_fd);
    if (hello.wake_fd >= 0) ::close(hello.wake_fd);
    hello.segment_fd = hello.wake_fd = -1;
  };
  if (hello.segment_fd < 0) {
    close_fds();
    return absl::InvalidArgumentError("bus.net: the other end sent no segment");
  }
  auto theirs = PeerSegment::map(hello.segment_fd, shm::kHeaderBytes + shm::kMinRingBytes,
                                 shm::kHeaderBytes + shm::kMaxRingBytes);
  hello.segment_fd = -1;
  if (!theirs.ok()) {
    close_fds();
    return theirs.status();
  }
  // Read once and kept: what a later change to their header says is not believed.
  LinkHeader h;
  std::memcpy(static_cast<void*>(&h), (*theirs)->data(), offsetof(LinkHeader, tail));
  if (h.magic != shm::kMagic || h.version != shm::kVersion || h.header_bytes != shm::kHeaderBytes ||
      h.ring_bytes < shm::kMinRingBytes || !std::has_single_bit(h.ring_bytes) ||
      shm::kHeaderBytes + h.ring_bytes > (*theirs)->size() || h.node != hello.node) {
    close_fds();
    return absl::InvalidArgumentError("bus.net: the other end's segment header does not read");
  }
  theirs_ = std::move(*theirs);
  their_ring_ = theirs_->data() + shm::kHeaderBytes;
  their_ring_bytes_ = h.ring_bytes;
  // Where they start reading ours, and we theirs: both rings are new, at 0.
  head_ = 0;
  peer_ = hello.node;
  peer_role_ = hello.role;
  peer_pid_ = hello.pid;
  peer_publish_ = hello.publish_address;
  peer_wake_fd_ = hello.wake_fd;
  hello.wake_fd = -1;
  writer_ = shm::RingWriter(ours_header(), ours_->data() + shm::kHeaderBytes,
                            ours_header()->ring_bytes, theirs_header());
  return absl::OkStatus();
}

// ---- our ring ------------------------------------------------------------------------------

namespace {
/// `bytes` copied into a block of the shared-memory heap, held like a message (empty when the
/// heap has no room).
bus::detail::MessageRef heap_copy(std::string_view bytes) {
  using bus::detail::kStateBytes;
  const std::size_t words = (bytes.size() + 7) / 8;
  // Freed like a message buffer of this size, which must be one the heap made.
  const std::size_t total = std::max(kStateBytes + words * 8, bus::detail::kSharedBufferBytes);
  void* mem = ShmHeap::instance().allocate(total);
  if (mem == nullptr) return {};
  auto* data = reinterpret_cast<capnp::word*>(static_cast<char*>(mem) + kStateBytes);
  if (!bytes.empty()) std::memcpy(data, bytes.data(), bytes.size());
  auto* head = ::new (mem) bus::detail::BufferHead{
      {1}, static_cast<uint32_t>((total - kStateBytes) / 8 - words), words, data, nullptr};
  bus::detail::MessageRef ref(head);
  bus::detail::release_buffer(head);  // the ref holds it now
  return ref;
}
}  // namespace

ShmLink::Sent ShmLink::send(std::string_view channel, std::string_view envelope,
                            std::string_view payload, const bus::detail::MessageRef& large,
                            std::size_t quota) {
  ShmHeap& heap = ShmHeap::instance();
  std::optional<ShmHeap::Location> at;
  if (large && large.owns_words()) at = heap.locate(payload.data(), payload.size());
  // What fits the ring and is not a message of our heap is copied into it: cheaper than a block
  // for small payloads.
  if (!at && shm::frame_bytes(FrameType::kData, channel.size(), envelope.size(), payload.size()) <=
                 max_frame()) {
    if (write(FrameType::kData, channel, envelope, payload)) return Sent::kYes;
    return reader_corrupt() ? Sent::kBroken : Sent::kNoRoom;
  }
  // A reader that holds `quota` of our blocks is full, like a reader whose ring is: held, then
  // passed over, so that it cannot take the heap from the others.
  unpin_released();
  if (pinned_bytes() + payload.size() > quota) return Sent::kNoRoom;
  bus::detail::MessageRef block = large;
  if (!at) {
    block = heap_copy(payload);
    if (!block) return Sent::kNoHeap;
    payload = {reinterpret_cast<const char*>(block.words().begin()), payload.size()};
    at = heap.locate(payload.data(), payload.size());
    if (!at) return Sent::kNoHeap;
  }
  if (!share_extent(at->extent).ok()) return Sent::kBroken;
  shm::BlockRef ref{next_block_id(), at->extent, 0, at->offset};
  if (!write(FrameType::kBlock, channel, envelope, payload, &ref)) {
    return reader_corrupt() ? Sent::kBroken : Sent::kNoRoom;
  }
  pin(ref.id, std::move(block), written());
  return Sent::kYes;
}

bool ShmLink::write(FrameType type, std::string_view channel, std::string_view envelope,
                    std::string_view payload, const shm::BlockRef* block) {
  if (!attached()) return false;
  const bool data = type == FrameType::kData;
  std::size_t bytes =
      shm::frame_bytes(type, channel.size(), envelope.size(), data ? payload.size() : 0);
  if (bytes > max_frame()) return false;
  char* at = writer_.reserve(bytes);
  if (at == nullptr) return false;
  FrameHeader h{};
  h.size = static_cast<uint32_t>(bytes);
  h.type = static_cast<uint16_t>(type);
  h.channel_bytes = static_cast<uint32_t>(channel.size());
  h.envelope_bytes = static_cast<uint32_t>(envelope.size());
  h.payload_bytes = payload.size();
  char* p = at;
  std::memcpy(p, &h, sizeof h);
  p += sizeof h;
  if (type == FrameType::kBlock) {
    std::memcpy(p, block, sizeof *block);
    p += sizeof *block;
  }
  // An empty view may carry a null pointer, which memcpy must not be given even for 0 bytes.
  if (!channel.empty()) std::memcpy(p, channel.data(), channel.size());
  p += shm::round8(channel.size());
  if (!envelope.empty()) std::memcpy(p, envelope.data(), envelope.size());
  p += shm::round8(envelope.size());
  if (data && !payload.empty()) {
    // The payload is the long part: should this process die while copying it, the other end
    // finds `writing` set and counts the frame's messages as lost instead of reading them.
    writer_.writing();
    if (die_here()) {
      std::memcpy(p, payload.data(), payload.size() / 2);
      ::raise(SIGKILL);
    }
    std::memcpy(p, payload.data(), payload.size());
  }
  writer_.commit(bytes);
  written_ = ours_header()->tail.load(std::memory_order_relaxed);
  return true;
}

void ShmLink::wake() {
  if (!attached()) return;
  // (6) seq_cst: our tail's store comes before this read of their word. Pairs with (5): either
  // they see our tail before they sleep, or we see them asleep.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  uint32_t how = theirs_header()->sleeping.load(std::memory_order_relaxed);
  if (how == 1) {
    futex(const_cast<std::atomic<uint32_t>*>(&theirs_header()->sleeping), FUTEX_WAKE, 1);
  } else if (how == 2 && peer_wake_fd_ >= 0) {
    uint64_t one = 1;
    (void)!::write(peer_wake_fd_, &one, sizeof one);
  }
}

// ---- their ring ----------------------------------------------------------------------------

bool ShmLink::has_input() const {
  if (!attached()) return false;
  // Relaxed: a hint; read() reads the tail again with acquire before it reads any frame.
  return theirs_header()->tail.load(std::memory_order_relaxed) != head_;
}

bool ShmLink::sleep_on(uint32_t how) {
  ours_header()->sleeping.store(how, std::memory_order_relaxed);
  // (5) seq_cst: our word's store comes before this look at their tail. Pairs with (6).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (has_input()) {
    awake();
    return false;
  }
  return true;
}

void ShmLink::awake() { ours_header()->sleeping.store(0, std::memory_order_relaxed); }

// ---- heap blocks: theirs -------------------------------------------------------------------

absl::Status ShmLink::take_extent(int fd, uint32_t index, uint64_t bytes) {
  if (index > 1024 || index < their_extents_.size()) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat("bus.net: heap extent ", index, " out of order"));
  }
  auto mapped = PeerSegment::map(fd, bytes, bytes);
  if (!mapped.ok()) return mapped.status();
  their_extents_.resize(index + 1);
  their_extents_[index] = std::move(*mapped);
  return absl::OkStatus();
}

const char* ShmLink::block(const shm::BlockRef& ref, std::size_t bytes) {
  if (ref.extent >= their_extents_.size() || !their_extents_[ref.extent]) {
    bool bye = false;
    if (on_socket(bye) == SocketState::kClosed) return nullptr;  // extents come before blocks
  }
  if (ref.extent >= their_extents_.size() || !their_extents_[ref.extent]) return nullptr;
  const PeerSegment& e = *their_extents_[ref.extent];
  if (ref.offset % 8 != 0 || ref.offset > e.size() || bytes > e.size() - ref.offset) return nullptr;
  return e.data() + ref.offset;
}

ShmLink::Hold* ShmLink::hold(const shm::BlockRef& ref) {
  LinkHeader* h = ours_header();
  for (std::size_t i = 0; i < shm::kHolds; ++i) {
    std::size_t slot = (next_hold_ + i) % shm::kHolds;
    // Relaxed: only this thread sets entries; a release elsewhere only makes one free sooner.
    if (h->hold[slot].load(std::memory_order_relaxed) != 0) continue;
    // Relaxed: published by our head's release store (3) after the frame is read.
    h->hold[slot].store(ref.id, std::memory_order_relaxed);
    next_hold_ = slot + 1;
    return new Hold(ours_, their_extents_[ref.extent], slot);
  }
  return nullptr;
}

std::size_t ShmLink::holds() const {
  std::size_t n = 0;
  for (const auto& e : ours_header()->hold) n += e.load(std::memory_order_relaxed) != 0 ? 1 : 0;
  return n;
}

// ---- heap blocks: ours ---------------------------------------------------------------------

absl::Status ShmLink::share_extent(uint32_t extent) {
  if (extent < shared_extents_.size() && shared_extents_[extent]) return absl::OkStatus();
  // In order: an extent's index is its place in their list.
  for (auto next = static_cast<uint32_t>(shared_extents_.size()); next <= extent; ++next) {
    std::size_t bytes = 0;
    int fd = ShmHeap::instance().share(next, bytes);
    if (fd < 0) return absl::InternalError("bus.net: no such heap extent");
    SocketMessage m{};
    m.magic = shm::kMagic;
    m.version = shm::kVersion;
    m.kind = SocketMessage::kExtent;
    m.extent = next;
    m.bytes = bytes;
    bool sent = send_message(sock_, m, &fd, 1);
    ::close(fd);
    if (!sent) return absl::UnavailableError("bus.net: sending a heap extent failed");
    shared_extents_.push_back(true);
  }
  return absl::OkStatus();
}

void ShmLink::pin(uint64_t id, bus::detail::MessageRef message, uint64_t frame_end) {
  std::size_t bytes = message.buffer_bytes();
  pins_.emplace(id, Pin{std::move(message), frame_end, bytes});
  pinned_bytes_ += bytes;
}

void ShmLink::unpin_released() {
  if (pins_.empty() || !attached()) return;
  const LinkHeader& t = *theirs_header();
  // (4) acquire: pairs with their (3): holds they took for frames below it are visible.
  uint64_t head = t.head.load(std::memory_order_acquire);
  uint64_t changed = t.holds_changed.load(std::memory_order_acquire);
  if (head == unpin_head_ && changed == unpin_holds_) return;
  unpin_head_ = head;
  unpin_holds_ = changed;
  absl::flat_hash_map<uint64_t, bool> held;
  for (const auto& e : t.hold) {
    // Acquire: pairs with the release (7) of a hold: their reads of it are done.
    uint64_t id = e.load(std::memory_order_acquire);
    if (id != 0) held[id] = true;
  }
  for (auto it = pins_.begin(); it != pins_.end();) {
    auto next = std::next(it);
    if (it->second.frame_end <= head && !held.contains(it->first)) {
      pinned_bytes_ -= it->second.bytes;
      pins_.erase(it);
    }
    it = next;
  }
}

// ---- the socket ----------------------------------------------------------------------------

ShmLink::SocketState ShmLink::on_socket(bool& said_bye) {
  for (;;) {
    SocketMessage m{};
    int fds[2];
    int nfds = 0;
    int got = receive_message(sock_, m, fds, nfds);
    if (got == 0) return SocketState::kOpen;
    if (got < 0) return SocketState::kClosed;
    if (m.kind == SocketMessage::kExtent && nfds == 1) {
      if (!take_extent(fds[0], m.extent, m.bytes).ok()) return SocketState::kClosed;
      continue;
    }
    for (int i = 0; i < nfds; ++i) ::close(fds[i]);
    if (m.kind == SocketMessage::kBye) {
      said_bye = true;
      return SocketState::kClosed;
    }
    return SocketState::kClosed;  // nothing else may come once the link is up
  }
}

void ShmLink::send_bye(uint32_t reason) {
  SocketMessage m{};
  m.magic = shm::kMagic;
  m.version = shm::kVersion;
  m.kind = SocketMessage::kBye;
  m.reason = reason;
  (void)send_message(sock_, m, nullptr, 0);
}

bool ShmLink::torn_frame(std::string& channel, std::string& envelope) const {
  if (!attached()) return false;
  const LinkHeader& t = *theirs_header();
  uint64_t at = t.writing.load(std::memory_order_acquire);
  uint64_t tail = t.tail.load(std::memory_order_acquire);
  if (at == 0 || at - 1 < tail || at - 1 - tail > their_ring_bytes_ || (at - 1) % 8 != 0) {
    return false;
  }
  // Its header and envelope are complete (they were written before `writing` was set); the
  // payload is not. Read them as a frame that ends at the end of the ring.
  uint64_t start = at - 1;
  uint64_t offset = start & (their_ring_bytes_ - 1);
  FrameHeader h;
  if (their_ring_bytes_ - offset < sizeof h) return false;
  std::memcpy(&h, their_ring_ + offset, sizeof h);
  if (h.type != static_cast<uint16_t>(FrameType::kData)) return false;
  uint64_t need = sizeof h + shm::round8(h.channel_bytes) + shm::round8(h.envelope_bytes);
  if (need > their_ring_bytes_ - offset || need > h.size) return false;
  const char* p = their_ring_ + offset + sizeof h;
  channel.assign(p, h.channel_bytes);
  envelope.assign(p + shm::round8(h.channel_bytes), h.envelope_bytes);
  return true;
}

}  // namespace bus::net::detail
