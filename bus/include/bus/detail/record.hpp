// What a ring record is: a pointer to its Target, then the payload built in place.
#pragma once

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

/// Where a record goes once it reaches its inbox: a channel's subscribers there, a service's
/// handler, a pending request, or a posted closure. `invoke` consumes (and destroys) the payload.
struct Target {
  using InvokeFn = void (*)(Target* self, void* payload, Inbox& inbox);
  /// Optional: consumes `count` consecutive records of this target, `words` apart from the one
  /// at `record` (header included). A target with one can take a run in one call.
  using InvokeRunFn = void (*)(Target* self, uint64_t* record, uint32_t words, std::size_t count,
                               Inbox& inbox);
  InvokeFn invoke;
  const PayloadOps* ops;
  InvokeRunFn invoke_run = nullptr;
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
