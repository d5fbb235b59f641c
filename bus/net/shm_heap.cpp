#include "shm_heap.hpp"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstdio>

#include "bus/message.hpp"

namespace bus::net::detail {

namespace {
constexpr std::size_t kAlign = 64;
// The first extent; each later one is twice the last (or what one block needs), up to the limit.
constexpr std::size_t kFirstExtent = std::size_t{16} << 20;
}  // namespace

ShmHeap& ShmHeap::instance() {
  static ShmHeap* heap = new ShmHeap;  // never destroyed: buffers may be freed during exit
  return *heap;
}

void ShmHeap::enable(std::size_t limit, ShmAccess access) {
  std::lock_guard lock(mu_);
  if (!enabled_) access_ = access;
  enabled_ = true;
  on_.store(true, std::memory_order_relaxed);
  limit_ = std::max(limit_, limit);
}

bool ShmHeap::enabled() const {
  std::lock_guard lock(mu_);
  return enabled_;
}

void* ShmHeap::take(Extent& e, std::size_t bytes) {
  for (auto it = e.free.begin(); it != e.free.end(); ++it) {
    if (it->second < bytes) continue;
    uint64_t at = it->first;
    uint64_t left = it->second - bytes;
    e.free.erase(it);
    if (left > 0) e.free.emplace(at + bytes, left);
    e.used.emplace(at, bytes);
    in_use_ += bytes;
    return e.segment->data() + at;
  }
  return nullptr;
}

bool ShmHeap::grow(std::size_t bytes) {
  std::size_t want = extents_.empty() ? kFirstExtent : extents_.back().segment->size() * 2;
  want = std::max(want, (bytes + (std::size_t{1} << 20) - 1) & ~((std::size_t{1} << 20) - 1));
  if (reserved_ + want > limit_) want = limit_ > reserved_ ? limit_ - reserved_ : 0;
  if (want < bytes) {
    error_ = absl::ResourceExhaustedError(absl::StrCat(
        "bus.net: the shared-memory heap is full (", in_use_ >> 20, " MiB in use of ", limit_ >> 20,
        " MiB, shm_heap_limit): a message of ", bytes,
        " bytes is made in ordinary memory (sent to peers on this host by a copy, when there is "
        "room for one)"));
    return false;
  }
  auto segment = OwnedSegment::create("bus.heap", want, access_);
  if (!segment.ok()) {
    error_ = segment.status();
    return false;
  }
  Extent& e = extents_.emplace_back();
  e.segment = std::move(*segment);
  e.free.emplace(0, want);
  reserved_ += want;
  return true;
}

void* ShmHeap::allocate(std::size_t bytes) {
  // Relaxed: a buffer made just before the first node turned the heap on is ordinary memory.
  if (!on_.load(std::memory_order_relaxed)) return nullptr;
  bytes = (bytes + kAlign - 1) & ~(kAlign - 1);
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    if (void* p = take(extents_[i], bytes)) return p;
  }
  if (!grow(bytes)) return nullptr;
  return take(extents_.back(), bytes);
}

bool ShmHeap::deallocate(void* p) {
  // Relaxed: a block of the heap was made after it was turned on, on this thread or one that
  // handed the message over (which ordered it).
  if (!on_.load(std::memory_order_relaxed)) return false;
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(mu_);
  for (Extent& e : extents_) {
    const char* base = e.segment->data();
    if (c < base || c >= base + e.segment->size()) continue;
    auto at = static_cast<uint64_t>(c - base);
    auto used = e.used.find(at);
    if (used == e.used.end()) return true;  // not a block start: a bug, but not ours to free
    uint64_t bytes = used->second;
    e.used.erase(used);
    in_use_ -= bytes;
    // Back into the free list, merged with its neighbours.
    auto next = e.free.lower_bound(at);
    if (next != e.free.end() && at + bytes == next->first) {
      bytes += next->second;
      next = e.free.erase(next);
    }
    if (next != e.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        return true;
      }
    }
    e.free.emplace(at, bytes);
    return true;
  }
  return false;
}

std::optional<ShmHeap::Location> ShmHeap::locate(const void* p, std::size_t bytes) const {
  const char* c = static_cast<const char*>(p);
  std::lock_guard lock(mu_);
  for (std::size_t i = 0; i < extents_.size(); ++i) {
    const char* base = extents_[i].segment->data();
    std::size_t size = extents_[i].segment->size();
    if (c >= base && c < base + size && bytes <= static_cast<std::size_t>(base + size - c)) {
      return Location{static_cast<uint32_t>(i), static_cast<uint64_t>(c - base)};
    }
  }
  return std::nullopt;
}

int ShmHeap::share(uint32_t extent, std::size_t& bytes) const {
  std::lock_guard lock(mu_);
  if (extent >= extents_.size()) return -1;
  bytes = extents_[extent].segment->size();
  return extents_[extent].segment->read_only_fd();
}

std::size_t ShmHeap::in_use() const {
  std::lock_guard lock(mu_);
  return in_use_;
}

std::size_t ShmHeap::reserved() const {
  std::lock_guard lock(mu_);
  return reserved_;
}

absl::Status ShmHeap::last_error() const {
  std::lock_guard lock(mu_);
  return error_;
}

}  // namespace bus::net::detail

namespace bus::detail {

void* alloc_shared_buffer(std::size_t bytes) {
  if (void* p = net::detail::ShmHeap::instance().allocate(bytes)) return p;
  return alloc_recycled(bytes);
}

void free_shared_buffer(void* p, std::size_t bytes) {
  if (!net::detail::ShmHeap::instance().deallocate(p)) free_recycled(p, bytes);
}

}  // namespace bus::detail
