// The process's shared-memory heap: where large message buffers are made once a node that
// shares memory runs, so that sending one to a peer on this host copies nothing: the peer reads
// the very bytes the builder wrote (bus::Message's buffer), in place, and says when it is done.
#pragma once

#include <absl/status/status.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "shm_segment.hpp"

namespace bus::net::detail {

class ShmHeap {
 public:
  /// The one heap of this process (never destroyed: message buffers may be freed at exit).
  static ShmHeap& instance();

  /// Turns the heap on (the first node that shares memory does), growing to at most `limit`
  /// bytes of extents; a larger limit from a later node raises it. Extents are reserved as they
  /// are made, from a few MiB up, each twice the last: there is no pool table to size.
  void enable(std::size_t limit, ShmAccess access);
  bool enabled() const;

  /// A buffer of `bytes` (64-byte aligned) in shared memory; null when the heap is off or full
  /// (the caller takes ordinary memory).
  void* allocate(std::size_t bytes);
  /// Frees `p` if it is a block of this heap: false when it is not.
  bool deallocate(void* p);

  struct Location {
    uint32_t extent;
    uint64_t offset;
  };
  /// Where `bytes` at `p` are, when they lie in one extent of this heap.
  std::optional<Location> locate(const void* p, std::size_t bytes) const;
  /// A read-only descriptor of extent `extent`, for a peer (close it after sending), with its
  /// size; -1 when there is no such extent.
  int share(uint32_t extent, std::size_t& bytes) const;

  /// Bytes of blocks in use, and of extents reserved.
  std::size_t in_use() const;
  std::size_t reserved() const;
  /// Why the last extent could not be made (OK while none failed).
  absl::Status last_error() const;

 private:
  ShmHeap() = default;
  struct Extent {
    std::unique_ptr<OwnedSegment> segment;
    std::map<uint64_t, uint64_t> free;  // offset -> bytes, coalesced
    std::map<uint64_t, uint64_t> used;  // offset -> bytes
  };
  void* take(Extent& e, std::size_t bytes);  // under mu_
  bool grow(std::size_t bytes);              // under mu_

  mutable std::mutex mu_;
  std::vector<Extent> extents_;  // under mu_; never shrinks (indices are names on the wire)
  std::size_t limit_ = 0;
  std::size_t reserved_ = 0;
  std::size_t in_use_ = 0;
  ShmAccess access_;
  bool enabled_ = false;
  std::atomic<bool> on_{false};  // enabled_, read without the lock
  absl::Status error_;
};

}  // namespace bus::net::detail
