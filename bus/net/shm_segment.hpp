// Shared memory for the same-host transport: segments are memfds (no name in /dev/shm or
// anywhere else), their space reserved when they are made, sealed against resizing, and handed
// to peers as read-only descriptors over a Unix socket. Nothing outlives the processes that map
// them. docs/net.md has the layout and the trust model.
#pragma once

#include <absl/status/statusor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace bus::net::detail {

/// Who may map a segment besides its owner: nobody (0600), or a group (0640 with that group).
struct ShmAccess {
  int group = -1;  // -1: owner only
};

/// A segment this process writes: a memfd of `bytes`, all of it reserved (fallocate), so that
/// running out of memory is an error here and never a SIGBUS later; sealed so that no holder of
/// its descriptor can shrink or grow it under a reader. Mapped read-write.
class OwnedSegment {
 public:
  /// ResourceExhausted (with errno's text and what to do) when the memory cannot be reserved.
  static absl::StatusOr<std::unique_ptr<OwnedSegment>> create(const char* name, std::size_t bytes,
                                                              ShmAccess access);
  ~OwnedSegment();
  OwnedSegment(const OwnedSegment&) = delete;
  OwnedSegment& operator=(const OwnedSegment&) = delete;

  char* data() const { return data_; }
  std::size_t size() const { return size_; }
  int fd() const { return fd_; }
  /// A new read-only descriptor of the same memory, for a peer (close it after sending).
  int read_only_fd() const;

 private:
  OwnedSegment(int fd, char* data, std::size_t size) : fd_(fd), data_(data), size_(size) {}
  int fd_;
  char* data_;
  std::size_t size_;
};

/// A peer's segment, mapped read-only. Refused unless it is sealed against shrinking (a peer
/// that could shrink it could make this process fault on a read).
class PeerSegment {
 public:
  /// Takes `fd` (closed in every case). InvalidArgument says what was wrong with it.
  static absl::StatusOr<std::shared_ptr<PeerSegment>> map(int fd, std::size_t min_bytes,
                                                          std::size_t max_bytes);
  ~PeerSegment();
  PeerSegment(const PeerSegment&) = delete;
  PeerSegment& operator=(const PeerSegment&) = delete;

  const char* data() const { return data_; }
  std::size_t size() const { return size_; }

 private:
  PeerSegment(const char* data, std::size_t size) : data_(data), size_(size) {}
  const char* data_;
  std::size_t size_;
};

/// What tells two processes they share a kernel and can share memory: the kernel's boot id, and
/// the IPC and network namespaces (the listening socket is an abstract Unix name, which lives in
/// the network namespace). Containers that share none of them use ZeroMQ.
struct HostIdentity {
  std::string boot_id;
  uint64_t ipc_namespace = 0;
  uint64_t net_namespace = 0;
  bool operator==(const HostIdentity&) const = default;
  /// This process's; an empty boot id when /proc cannot tell (then nothing is shared).
  static const HostIdentity& self();
};

}  // namespace bus::net::detail
