// A message's payload on the wire: encoded on its way out (a large Message goes as it is, for a
// peer that shares memory to read in place), decoded on its way in (kept in place where its words
// allow it, copied through Cap'n Proto's checked reader otherwise).
#pragma once

#include <absl/status/status.h>
#include <absl/status/statusor.h>
#include <absl/strings/str_cat.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "bus/bus.hpp"
#include "bus/message.hpp"

namespace bus::net::detail {

struct Limits {
  std::size_t max_message_bytes;
  uint64_t traversal_limit_words;
  int nesting_limit;
};

/// Appends the builder's message to `out` in Cap'n Proto stream framing.
void append_message(capnp::MessageBuilder& builder, std::string& out);
/// Reader options for `limits`.
capnp::ReaderOptions reader_options(const Limits& limits);
std::string describe(const kj::Exception& e);

/// Messages this large or larger go alone in their frame, as they are (a peer that shares memory
/// reads them in place); smaller ones are batched, many to a frame of up to this size.
inline constexpr std::size_t kLargeMessageBytes = bus::detail::kSharedBufferBytes;

/// One message on its way out: its bytes, or, for a large Message (kLargeMessageBytes and more),
/// the message itself, which a peer that shares memory with this process reads in place.
struct OutPayload {
  std::string bytes;
  bus::detail::MessageRef large;
  std::string_view view() const {
    if (!large) return bytes;
    auto w = large.words();
    return {reinterpret_cast<const char*>(w.begin()), w.size() * sizeof(capnp::word)};
  }
  std::size_t size() const { return view().size(); }
};

/// Words that lie in a peer's shared memory while the bridge hands them over: a decoder may
/// keep them (a Message that reads them in place) instead of copying them.
class PayloadHold {
 public:
  /// True when `words` lie in the held block.
  virtual bool covers(kj::ArrayPtr<const capnp::word> words) const = 0;
  /// A keeper for one more message on the block (released with its last copy); null when
  /// none can be had (the decoder copies).
  virtual bus::detail::WordsKeeper* keep() = 0;

 protected:
  ~PayloadHold() = default;
};
/// The hold of the payload being handed over on this thread (the bridge's), or null.
PayloadHold*& current_hold();
/// Sets current_hold() for a scope.
class HoldScope {
 public:
  explicit HoldScope(PayloadHold* h) : was_(current_hold()) { current_hold() = h; }
  HoldScope(const HoldScope&) = delete;
  HoldScope& operator=(const HoldScope&) = delete;
  ~HoldScope() { current_hold() = was_; }

 private:
  PayloadHold* was_;
};

/// Appends `v` as one Cap'n Proto message to `out`.
template <Bridgeable T>
void encode(const T& v, std::string& out) {
  if constexpr (bus::detail::IsMessage<T>::value) {
    auto b = v.bytes();
    out.append(reinterpret_cast<const char*>(b.begin()), b.size());
  } else {
    bus::detail::ScratchBuilder builder;
    Codec<T>::encode(v, builder.get().initRoot<typename Codec<T>::Schema>());
    append_message(builder.get(), out);
  }
}

/// `v` on its way out: a large Message as it is, anything else encoded.
template <Bridgeable T>
OutPayload encode_out(const T& v) {
  OutPayload out;
  if constexpr (bus::detail::IsMessage<T>::value) {
    if (v.bytes().size() >= kLargeMessageBytes) {
      out.large = bus::detail::MessageAccess::ref(v);
      return out;
    }
  }
  encode(v, out.bytes);
  return out;
}

/// The segment of `payload` (one message in stream framing, aligned) when Cap'n Proto may read it
/// as it is without bounds checks, the way a Message keeps its words: one segment, the root a
/// struct; every struct and list inside the segment; no far or capability pointers; no deeper
/// than the nesting limit (nor 256 levels); and no more words reached, counting each time a pointer
/// reaches them, than the segment holds (nor the traversal limit), so shared targets cannot amplify
/// and cycles end. Otherwise an empty array: decode() then copies the payload through Cap'n Proto's
/// checked reader, which takes the rest of what is legal and says what is wrong with what is not.
/// Cap'n Proto has no such check short of isCanonical(), which builders' own output fails.
kj::ArrayPtr<const capnp::word> readable_unchecked(kj::ArrayPtr<const capnp::word> payload,
                                                   const Limits& limits);

/// Reads one payload (aligned words in stream framing, already bounds-checked) as a `T`.
/// Malformed input is an InvalidArgument status, never an exception.
template <Bridgeable T>
absl::StatusOr<T> decode(kj::ArrayPtr<const capnp::word> words, const Limits& limits) {
  using S = typename Codec<T>::Schema;
  try {
    if constexpr (bus::detail::IsMessage<T>::value) {
      // What an honest sender writes: its words become the message's with one copy and a walk
      // of its pointers, no reader or builder.
      if (auto segment = readable_unchecked(words, limits); segment.size() != 0) {
        // In a peer's shared memory: read in place, kept until the message's last copy goes.
        if (PayloadHold* hold = current_hold(); hold != nullptr && hold->covers(words)) {
          if (bus::detail::WordsKeeper* keeper = hold->keep()) {
            return bus::detail::MessageAccess::view<S>(words, keeper);
          }
        }
        return bus::detail::MessageAccess::from_segment<S>(segment);
      }
    }
    capnp::FlatArrayMessageReader reader(words, reader_options(limits));
    auto root = reader.getRoot<S>();
    if constexpr (bus::detail::IsMessage<T>::value) {
      // Copied into the unchecked layout, traversing (and checking) it all; the payload's size
      // bounds the copy's.
      return bus::detail::MessageAccess::copy<S>(root, words.size());
    } else {
      root.totalSize();  // checks the whole message before the codec reads any of it
      return Codec<T>::decode(root);
    }
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "undecodable ", std::string(bus::detail::type_name<S>()), " payload: ", describe(e)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("codec of ", std::string(bus::detail::type_name<T>()), " failed: ", e.what()));
  }
}

}  // namespace bus::net::detail
