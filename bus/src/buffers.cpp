#include "bus/detail/buffers.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <mutex>
#include <new>
#include <vector>

namespace bus::detail {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kRecycling = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kRecycling = false;
#else
constexpr bool kRecycling = true;
#endif
#else
constexpr bool kRecycling = true;
#endif

constexpr std::size_t kMinClass = 64;  // class c holds buffers of kMinClass << c bytes
constexpr std::size_t kClasses = std::bit_width(kRecycledMax / kMinClass);  // 64 B .. 64 KiB
constexpr std::size_t kMagazine = 64;                                       // buffers, at most
constexpr std::size_t kMagazineBytes = 256 * 1024;  // and bytes, at most (two for big classes)
constexpr std::size_t kDepotBytes = std::size_t{8} << 20;  // idle bytes kept per class, about

std::size_t class_of(std::size_t bytes) {
  return bytes <= kMinClass ? 0 : static_cast<std::size_t>(std::bit_width((bytes - 1) / kMinClass));
}
std::size_t class_bytes(std::size_t c) { return kMinClass << c; }
/// Buffers in a full magazine of class c: idle memory per thread stays under about
/// kMagazineBytes per class.
std::size_t magazine_of(std::size_t c) {
  return std::clamp<std::size_t>(kMagazineBytes / class_bytes(c), 2, kMagazine);
}

using Buffers = std::array<void*, kMagazine>;

/// Full magazines of one size class, shared by every thread.
struct Depot {
  std::mutex mu;
  std::vector<Buffers> full;  // under mu; at most `max`
  std::size_t max = 0;
  // full.size(), written under mu: a thread whose magazine is empty looks here before it locks,
  // so an empty depot costs no lock per allocation.
  std::atomic<std::size_t> count{0};
};

/// Never destroyed: threads may free messages while statics are being destroyed.
Depot* depots() {
  static Depot* d = [] {
    auto* d = new Depot[kClasses];
    for (std::size_t c = 0; c < kClasses; ++c) {
      d[c].max = std::max<std::size_t>(2, kDepotBytes / (magazine_of(c) * class_bytes(c)));
    }
    return d;
  }();
  return d;
}

/// A thread's one magazine per class: frees fill it, allocations empty it.
struct Magazine {
  std::size_t n = 0;
  Buffers items;
};
struct Cache {
  std::array<Magazine, kClasses> mags;
};

thread_local Cache* t_cache = nullptr;
thread_local bool t_exited = false;

struct CacheGuard {
  bool armed = false;
  ~CacheGuard() {
    if (t_cache != nullptr) {
      for (Magazine& m : t_cache->mags) {
        for (std::size_t i = 0; i < m.n; ++i) ::operator delete(m.items[i]);
      }
      delete t_cache;
      t_cache = nullptr;
    }
    t_exited = true;  // a message freed later on this thread goes straight to operator delete
  }
};
thread_local CacheGuard t_guard;

/// This thread's cache; nullptr while the thread exits (or if there is no memory for one).
Cache* local() noexcept {
  if (t_cache != nullptr || t_exited) return t_cache;
  t_guard.armed = true;  // registers its destructor for this thread
  t_cache = new (std::nothrow) Cache();
  return t_cache;
}

}  // namespace

void* alloc_recycled(std::size_t bytes) {
  if (!kRecycling || bytes > kRecycledMax) return ::operator new(bytes);
  std::size_t c = class_of(bytes);
  if (Cache* cache = local()) {
    Magazine& m = cache->mags[c];
    if (m.n == 0) {
      Depot& d = depots()[c];
      if (d.count.load(std::memory_order_relaxed) != 0) {
        std::lock_guard lock(d.mu);
        if (!d.full.empty()) {
          m.items = d.full.back();
          m.n = magazine_of(c);
          d.full.pop_back();
          d.count.store(d.full.size(), std::memory_order_relaxed);
        }
      }
    }
    if (m.n > 0) return m.items[--m.n];
  }
  return ::operator new(class_bytes(c));
}

void free_recycled(void* p, std::size_t bytes) noexcept {
  if (!kRecycling || bytes > kRecycledMax) return ::operator delete(p);
  std::size_t c = class_of(bytes);
  Cache* cache = local();
  if (cache == nullptr) return ::operator delete(p);
  Magazine& m = cache->mags[c];
  if (m.n == magazine_of(c)) {
    Depot& d = depots()[c];
    bool kept = false;
    {
      std::lock_guard lock(d.mu);
      if (d.full.size() < d.max) {
        try {
          d.full.push_back(m.items);
          d.count.store(d.full.size(), std::memory_order_relaxed);
          kept = true;
        } catch (const std::bad_alloc&) {
          // no room to keep them: they go back to operator delete below
        }
      }
    }
    if (!kept) {
      for (std::size_t i = 0; i < m.n; ++i) ::operator delete(m.items[i]);
    }
    m.n = 0;
  }
  m.items[m.n++] = p;
}

}  // namespace bus::detail
