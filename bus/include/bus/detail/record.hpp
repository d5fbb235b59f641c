// What a ring record is: a header word (its Target, and how many payloads follow), then the
// payloads built in place.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>

namespace bus::detail {

class Inbox;

/// Payloads up to this size live inside the record; larger or over-aligned ones are boxed (one
/// heap allocation), so a record never exceeds a small fraction of a ring.
inline constexpr std::size_t kMaxInlineBytes = 192;

struct PayloadOps {
  uint32_t words;  // record size, header included
  void (*destroy)(void* payload);
  void (*relocate)(void* from, void* to);  // move-construct at `to`, destroy `from`
};

template <class P>
struct Payload {
  static constexpr bool kInline =
      alignof(P) <= 8 && sizeof(P) <= kMaxInlineBytes && std::is_nothrow_move_constructible_v<P>;
  static constexpr uint32_t kWords = 1 + (kInline ? (sizeof(P) + 7) / 8 : 1);

  static P* get(void* at) {
    if constexpr (kInline) {
      return std::launder(static_cast<P*>(at));
    } else {
      return *static_cast<P**>(at);
    }
  }
  template <class... A>
  static void construct(void* at, A&&... a) {
    if constexpr (kInline) {
      ::new (at) P(std::forward<A>(a)...);
    } else {
      *static_cast<P**>(at) = new P(std::forward<A>(a)...);
    }
  }
  static void destroy(void* at) {
    if constexpr (kInline) {
      get(at)->~P();
    } else {
      delete get(at);
    }
  }
  static void relocate(void* from, void* to) {
    if constexpr (kInline) {
      ::new (to) P(std::move(*get(from)));
      get(from)->~P();
    } else {
      *static_cast<P**>(to) = get(from);
    }
  }
  static constexpr PayloadOps kOps{kWords, &destroy, &relocate};
};

/// A record's header: the Target's address in the low 48 bits (user-space x86-64 and AArch64
/// addresses fit), and in the high 16 bits how many payloads beyond the first follow it back to
/// back (a run: one header for a batch of sends to one target). Three values are not headers (a
/// Target is 8-byte aligned): kEmpty, the word after the last published record; kWrapMarker, the
/// rest of the buffer skipped; kSkipLine, the rest of the cache line skipped (see Ring).
inline constexpr uint64_t kEmpty = 0;
inline constexpr uint64_t kWrapMarker = 1;
inline constexpr uint64_t kSkipLine = 2;
inline constexpr unsigned kRunShift = 48;
inline constexpr uint64_t kTargetBits = (uint64_t{1} << kRunShift) - 1;
inline constexpr uint64_t kRunOne = uint64_t{1} << kRunShift;
/// Payloads per run record at most: a consumer takes a run in one call, so this bounds how long
/// one target can hold its inbox before the next ring gets a turn.
inline constexpr uint32_t kMaxRun = 256;

/// True for payloads someone waits on as they cross (a request, a reply): their records do not
/// cross a cache line when they fit in one (Ring::try_reserve_in_line).
template <class P>
inline constexpr bool kLatencyBound = false;

/// True for records an executor may not be refused when its backlog is full (see
/// Options::executor_backlog): replies, whose requests were counted already and wait for them,
/// and the closures of cancels, which another thread waits for. Both are as many as requests
/// and cancels in flight, which bounds them.
template <class P>
inline constexpr bool kEssential = false;

struct Target;
inline Target* target_of(uint64_t header) {
  return reinterpret_cast<Target*>(header & kTargetBits);
}
inline uint32_t payloads_of(uint64_t header) {
  return static_cast<uint32_t>(header >> kRunShift) + 1;
}

/// Where a record goes once it reaches its inbox: a channel's subscribers there, a service's
/// handler, a pending request, or a posted closure. `invoke` consumes (and destroys) the payload.
struct Target {
  using InvokeFn = void (*)(Target* self, void* payload, Inbox& inbox);
  /// Optional: consumes `count` payloads of this target, `stride` words apart from the first
  /// at `payload`. A target with one can take a run in one call, and only such a target is
  /// sent run records.
  using InvokeRunFn = void (*)(Target* self, uint64_t* payload, uint32_t stride, std::size_t count,
                               Inbox& inbox);
  InvokeFn invoke;
  const PayloadOps* ops;
  InvokeRunFn invoke_run = nullptr;
  /// A topic's target: its live subscriptions. A copy of a message dropped or refused on its
  /// way to this target counts once per subscriber (see Stats); any other target counts once.
  const std::atomic<int>* subscribers = nullptr;

  uint32_t payload_words() const { return ops->words - 1; }
  /// How many subscribers a copy of a message to this target stands for.
  uint64_t copies() const {
    if (subscribers == nullptr) return 1;
    int n = subscribers->load(std::memory_order_relaxed);
    return n > 0 ? static_cast<uint64_t>(n) : 0;
  }
  /// The size in words of a record with this header.
  static uint32_t record_words(uint64_t header) {
    return 1 + payloads_of(header) * target_of(header)->payload_words();
  }
};

/// A closure posted to an inbox: runs once on the inbox's thread.
template <class F>
struct ClosureTarget {
  static void run(Target*, void* payload, Inbox&) {
    F* f = Payload<F>::get(payload);
    struct Done {
      void* p;
      ~Done() { Payload<F>::destroy(p); }
    } done{payload};
    (*f)();
  }
  static inline Target kTarget{&run, &Payload<F>::kOps};
};

}  // namespace bus::detail
