// Cap'n Proto structs as bus messages, and the codec customisation point for other types.
// Part of bus::net (link it to use this header).
#pragma once

#include <capnp/any.h>
#include <capnp/generated-header-support.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/array.h>

#include <atomic>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "bus/detail/buffers.hpp"

namespace bus {

namespace detail {
/// The calling thread's reusable first segment (zeroed), or an empty array while it is in use.
kj::ArrayPtr<capnp::word> acquire_scratch();
void release_scratch();

/// A message builder whose first segment is a reused per-thread buffer, so building a small
/// message allocates nothing (a default MallocMessageBuilder callocs 8 KiB). Nested use on one
/// thread gets an ordinary builder.
class ScratchBuilder {
 public:
  ScratchBuilder() : scratch_(acquire_scratch()) {
    if (scratch_.size() != 0) {
      builder_.emplace(scratch_);
    } else {
      builder_.emplace();
    }
  }
  ~ScratchBuilder() {
    builder_.reset();  // zeroes the scratch segment again, ready for the next builder
    if (scratch_.size() != 0) release_scratch();
  }
  ScratchBuilder(const ScratchBuilder&) = delete;
  ScratchBuilder& operator=(const ScratchBuilder&) = delete;
  capnp::MessageBuilder& get() { return *builder_; }

 private:
  kj::ArrayPtr<capnp::word> scratch_;
  std::optional<capnp::MallocMessageBuilder> builder_;
};
}  // namespace detail

namespace detail {
struct MessageAccess;

/// Message buffers this large or larger come from the process's shared-memory heap once a node
/// that shares memory with peers on its host runs (bus/net/shm_heap.hpp): sending one to such a
/// peer then copies nothing, the peer reads the builder's bytes in place. Smaller ones are
/// batched, many to a frame, and copied through the link's ring, which costs less than sharing
/// a block.
inline constexpr std::size_t kSharedBufferBytes = 32 * 1024;
/// The shared-memory heap's block when it is on and has room, else a recycled one
/// (bus/detail/buffers.hpp).
void* alloc_shared_buffer(std::size_t bytes);
void free_shared_buffer(void* p, std::size_t bytes);
inline void* alloc_buffer(std::size_t bytes) {
  return bytes < kSharedBufferBytes ? alloc_recycled(bytes) : alloc_shared_buffer(bytes);
}
inline void free_buffer(void* p, std::size_t bytes) {
  if (bytes < kSharedBufferBytes) {
    free_recycled(p, bytes);
  } else {
    free_shared_buffer(p, bytes);
  }
}

/// Keeps alive words that a message reads but does not own (a peer's shared memory): released
/// once, when the last copy of the message goes, on whichever thread that is.
class WordsKeeper {
 public:
  virtual void release() noexcept = 0;

 protected:
  ~WordsKeeper() = default;
};

/// The untyped start of every message's State: what holding a message takes, whatever its type.
struct alignas(capnp::word) BufferHead {
  std::atomic<uint32_t> refs;
  uint32_t spare;           // words allocated after the message's own (copy_within's bound)
  std::size_t words;        // stream header included
  const capnp::word* data;  // the stream header, then the segment
  WordsKeeper* keeper;      // null: the words follow the State, in its own buffer
};
/// Every Message<S>'s State: the head, then a typed reader (the same size for every S).
inline constexpr std::size_t kStateBytes = sizeof(BufferHead) + sizeof(capnp::_::StructReader);
static_assert(kStateBytes % sizeof(capnp::word) == 0, "the words after a State stay aligned");

/// Drops one reference to `h`; the last frees the buffer (or lets its keeper go).
inline void release_buffer(BufferHead* h) noexcept {
  // acq_rel: the last owner must see every other owner's reads done before it frees.
  if (h->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  if (h->keeper != nullptr) {
    h->keeper->release();
    free_recycled(h, kStateBytes);
  } else {
    free_buffer(h, kStateBytes + (h->words + h->spare) * sizeof(capnp::word));
  }
}

/// A message held without its type: the bridge holds what a peer reads in place this way.
class MessageRef {
 public:
  MessageRef() = default;
  explicit MessageRef(BufferHead* h) noexcept : h_(h) {
    if (h_) h_->refs.fetch_add(1, std::memory_order_relaxed);  // a new owner only
  }
  MessageRef(const MessageRef& o) noexcept : MessageRef(o.h_) {}
  MessageRef(MessageRef&& o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
  MessageRef& operator=(MessageRef o) noexcept {
    std::swap(h_, o.h_);
    return *this;
  }
  ~MessageRef() {
    if (h_) release_buffer(h_);
  }
  explicit operator bool() const { return h_ != nullptr; }
  /// The message in stream framing.
  kj::ArrayPtr<const capnp::word> words() const { return kj::arrayPtr(h_->data, h_->words); }
  /// The allocation that holds it (the State, then the words), when it owns its words.
  const void* buffer() const { return h_; }
  std::size_t buffer_bytes() const {
    return kStateBytes + (h_->words + h_->spare) * sizeof(capnp::word);
  }
  bool owns_words() const { return h_->keeper == nullptr; }

 private:
  BufferHead* h_ = nullptr;
};
}  // namespace detail

/// An immutable, ref-counted Cap'n Proto message of struct `S`: the flat words plus a typed
/// reader. Copies share one buffer, so every local subscriber reads the same bytes, and the
/// bridge hands exactly those bytes to ZeroMQ.
///
///   auto m = bus::build<Reading>([](Reading::Builder r) { r.setValue(21.5); });
///   double v = m->getValue();
///
/// The buffer is kept in Cap'n Proto's "unchecked" layout (one segment, no far pointers: made by
/// copyToUnchecked, or a one-segment builder's words as they are) behind a one-segment stream
/// header: readers need no bounds checks and no traversal counter, so threads may read one message
/// concurrently.

template <class S>
class Message {
 public:
  using Schema = S;
  using Reader = typename S::Reader;

  /// A message with a default (empty) root struct.
  Message() : Message(typename S::Reader()) {}
  /// Copies `root` (and everything it points to) into a new message.
  explicit Message(Reader root) {
    std::size_t words = root.totalSize().wordCount + 1;  // + the root pointer
    void* mem = detail::alloc_buffer(buffer_bytes(words));
    std::memset(segment_of(mem), 0, words * sizeof(capnp::word));
    try {
      capnp::copyToUnchecked(root, kj::arrayPtr(segment_of(mem), words));
    } catch (...) {
      detail::free_buffer(mem, buffer_bytes(words));
      throw;
    }
    adopt(mem, words, 0);
  }
  Message(const Message& o) noexcept : state_(o.state_) {
    if (state_) state_->refs.fetch_add(1, std::memory_order_relaxed);  // a new owner only
  }
  Message(Message&& o) noexcept : state_(std::exchange(o.state_, nullptr)) {}
  Message& operator=(Message o) noexcept {
    std::swap(state_, o.state_);
    return *this;
  }
  ~Message() {
    if (state_) detail::release_buffer(state_);
  }

  const Reader* operator->() const { return &state_->root; }
  Reader operator*() const { return state_->root; }
  Reader reader() const { return state_->root; }

  /// The message in Cap'n Proto's stream framing (what `capnp decode` and every Cap'n Proto
  /// library read).
  kj::ArrayPtr<const capnp::word> words() const {
    return kj::arrayPtr(state_->data, state_->words);
  }
  kj::ArrayPtr<const kj::byte> bytes() const { return words().asBytes(); }

 private:
  friend struct detail::MessageAccess;
  /// Takes a builder's only segment as it is: a one-segment builder has no far pointers and its
  /// root pointer first, which is the unchecked layout. One copy, no traversal (build() uses it).
  static Message from_segment(kj::ArrayPtr<const capnp::word> segment) {
    void* mem = detail::alloc_buffer(buffer_bytes(segment.size()));
    std::memcpy(segment_of(mem), segment.begin(), segment.size() * sizeof(capnp::word));
    Message m(Adopt{});
    m.adopt(mem, segment.size(), 0);
    return m;
  }
  /// Copies `root` like Message(Reader), in one traversal instead of two (no totalSize() first),
  /// into a buffer of `bound` words plus the root pointer. Returns nothing, having allocated
  /// nothing, when the copy does not fit or the traversal throws: Message(root) then sizes it
  /// exactly (and reports what was wrong). A decoded payload's own size is such a bound: its
  /// unchecked copy drops the segment table and far pointers' landing pads, and only a message
  /// that points into one object more than once (bounded by the traversal limit) grows.
  static std::optional<Message> copy_within(Reader root, std::size_t bound) {
    std::size_t capacity = bound + 1;  // + the root pointer
    void* mem = detail::alloc_buffer(buffer_bytes(capacity));
    std::memset(segment_of(mem), 0, capacity * sizeof(capnp::word));  // a builder's is zeroed
    std::size_t words;
    try {
      capnp::FlatMessageBuilder builder(kj::arrayPtr(segment_of(mem), capacity));
      builder.setRoot(root);
      words = builder.getSegmentsForOutput()[0].size();
    } catch (const kj::Exception&) {
      detail::free_buffer(mem, buffer_bytes(capacity));
      return std::nullopt;
    }
    Message m(Adopt{});
    m.adopt(mem, words, capacity - words);
    return m;
  }
  /// A message that reads `payload` (stream framing, one segment, checked by the caller as
  /// readable unchecked) where it is, kept alive by `keeper` (released with the last copy).
  static Message view(kj::ArrayPtr<const capnp::word> payload, detail::WordsKeeper* keeper) {
    void* mem = detail::alloc_recycled(sizeof(State));
    Message m(Adopt{});
    m.state_ = ::new (mem) State{{{1}, 0, payload.size(), payload.begin(), keeper},
                                 capnp::readMessageUnchecked<S>(payload.begin() + 1)};
    return m;
  }
  /// One allocation per message: the State, then the stream header (one word), then room for
  /// `capacity` words of the segment.
  static std::size_t buffer_bytes(std::size_t capacity) {
    return sizeof(State) + (capacity + 1) * sizeof(capnp::word);
  }
  static capnp::word* segment_of(void* mem) {
    return reinterpret_cast<capnp::word*>(static_cast<char*>(mem) + sizeof(State)) + 1;
  }
  /// Takes `mem` (buffer_bytes(words + spare)), whose segment holds the message's `words` words
  /// in the unchecked layout: writes the one-segment stream header and the State.
  void adopt(void* mem, std::size_t words, std::size_t spare) {
    capnp::word* segment = segment_of(mem);
    auto* header = reinterpret_cast<uint32_t*>(segment - 1);
    header[0] = 0;  // one segment
    header[1] = static_cast<uint32_t>(words);
    state_ = ::new (mem) State{{{1}, static_cast<uint32_t>(spare), words + 1, segment - 1, nullptr},
                               capnp::readMessageUnchecked<S>(segment)};
  }
  struct Adopt {};
  explicit Message(Adopt) noexcept {}  // no buffer yet: adopt() sets it
  struct State : detail::BufferHead {
    Reader root;
  };
  static_assert(sizeof(State) == detail::kStateBytes, "every State is the same size");
  State* state_ = nullptr;
};

namespace detail {
struct MessageAccess {
  template <class S>
  static Message<S> from_segment(kj::ArrayPtr<const capnp::word> segment) {
    return Message<S>::from_segment(segment);
  }
  /// See Message::view.
  template <class S>
  static Message<S> view(kj::ArrayPtr<const capnp::word> payload, WordsKeeper* keeper) {
    return Message<S>::view(payload, keeper);
  }
  /// `m` held without its type.
  template <class S>
  static MessageRef ref(const Message<S>& m) {
    return MessageRef(m.state_);
  }
  /// What `builder` holds: its words as they are when it has one segment, else copied whole.
  template <class S>
  static Message<S> of_builder(capnp::MessageBuilder& builder) {
    auto segments = builder.getSegmentsForOutput();
    if (segments.size() == 1) return Message<S>::from_segment(segments[0]);
    return Message<S>(builder.getRoot<S>().asReader());
  }
  /// `root` copied in one traversal when it fits in `bound` words, else sized first.
  template <class S>
  static Message<S> copy(typename S::Reader root, std::size_t bound) {
    if (auto m = Message<S>::copy_within(root, bound)) return std::move(*m);
    return Message<S>(root);
  }
};
}  // namespace detail

/// Builds a Message<S>: `fill(S::Builder)` sets the fields.
template <class S, class F>
requires std::invocable<F&, typename S::Builder> Message<S> build(F&& fill) {
  detail::ScratchBuilder builder;
  fill(builder.get().initRoot<S>());
  return detail::MessageAccess::of_builder<S>(builder.get());
}

/// A builder kept from one message to the next, for many messages of one shape: set the fields
/// that change, then message() takes what the builder holds, as build() does (one copy of its
/// words, no traversal), without making and zeroing a builder each time.
///
///   bus::Builder<Reading> b;
///   b->setSensor("attic");
///   for (...) { b->setValue(v); bus.publish(readings, b.message()); }
///
/// Setting a pointer field (text, data, list, struct) again leaves its old object in the
/// builder, unreachable, and every later message carries those words: reuse a builder for
/// messages whose pointer fields are set once, and clear() it when the shape changes.
template <class S>
class Builder {
 public:
  Builder() : root_(builder_->template initRoot<S>()) {}
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  typename S::Builder* operator->() { return &root_; }
  typename S::Builder root() { return root_; }

  /// A message of the builder's current content.
  Message<S> message() { return detail::MessageAccess::of_builder<S>(*builder_); }

  /// Starts again from an empty root, with the words of the previous ones freed.
  void clear() {
    builder_.emplace();
    root_ = builder_->template initRoot<S>();
  }

 private:
  std::optional<capnp::MallocMessageBuilder> builder_{std::in_place};
  typename S::Builder root_;
};

/// How a C++ type crosses processes. Specialise it for your type with the Cap'n Proto struct
/// that carries it (the struct's schema id is the type's identity on the wire):
///
///   template <> struct bus::Codec<Point> {
///     using Schema = geo::Point;
///     static void encode(const Point& p, geo::Point::Builder b) { b.setX(p.x); b.setY(p.y); }
///     static Point decode(geo::Point::Reader r) { return {r.getX(), r.getY()}; }
///   };
///
/// Message<S> needs none: its bytes travel as they are.
template <class T>
struct Codec;

template <class S>
struct Codec<Message<S>> {
  using Schema = S;
};

namespace detail {
template <class T>
struct IsMessage : std::false_type {};
template <class S>
struct IsMessage<Message<S>> : std::true_type {};
}  // namespace detail

/// A type that can cross the bridge: a Message<S>, or a type with a Codec specialisation.
template <class T>
concept Bridgeable = detail::IsMessage<T>::value || requires(const T& v) {
  typename Codec<T>::Schema;
  Codec<T>::encode(v, std::declval<typename Codec<T>::Schema::Builder>());
  { Codec<T>::decode(std::declval<typename Codec<T>::Schema::Reader>()) } -> std::same_as<T>;
};

/// The 64-bit schema id that identifies `T` on the wire.
template <Bridgeable T>
constexpr uint64_t schema_id() {
  return capnp::typeId<typename Codec<T>::Schema>();
}

}  // namespace bus
