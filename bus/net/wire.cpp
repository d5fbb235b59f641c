#include "wire.hpp"

#include <absl/strings/str_cat.h>
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstring>
#include <optional>

namespace bus::net::detail {

// Here, beside the decoder that reads it, so that whatever links the decoder (the fuzz target)
// links this too.
PayloadHold*& current_hold() {
  thread_local PayloadHold* hold = nullptr;
  return hold;
}

// ---- payload helpers used by the typed adapters ------------------------------------------------

void append_message(capnp::MessageBuilder& builder, std::string& out) {
  auto segments = builder.getSegmentsForOutput();
  std::size_t n = segments.size();
  // Stream framing: (segment count - 1), each segment's size in words, padded to a word.
  std::size_t table_words = (n + 2) / 2;
  std::size_t total = table_words;
  for (auto s : segments) total += s.size();
  std::size_t at = out.size();
  out.resize(at + total * sizeof(capnp::word));
  char* p = out.data() + at;
  std::memset(p, 0, table_words * sizeof(capnp::word));
  auto put32 = [&](std::size_t i, uint32_t v) { std::memcpy(p + 4 * i, &v, 4); };
  put32(0, static_cast<uint32_t>(n - 1));
  for (std::size_t i = 0; i < n; ++i) put32(i + 1, static_cast<uint32_t>(segments[i].size()));
  p += table_words * sizeof(capnp::word);
  for (auto s : segments) {
    std::memcpy(p, s.begin(), s.size() * sizeof(capnp::word));
    p += s.size() * sizeof(capnp::word);
  }
}

namespace {

constexpr int kMaxWalkNesting = 256;

/// Walks a one-segment message's pointers (encoding: capnproto.org/encoding.html) for
/// readable_unchecked(). Any doubt is a "no": the checked copy decides then.
class UncheckedWalk {
 public:
  UncheckedWalk(const capnp::word* segment, uint64_t words, uint64_t budget)
      : segment_(segment), words_(words), left_(budget) {}

  /// The pointer in word `at` of the segment, and everything it reaches.
  bool pointer(uint64_t at, int nesting) {
    uint64_t w = load(at);
    if (w == 0) return true;  // null
    if (nesting <= 0) return false;
    // The offset is signed, in words, from the end of the pointer.
    int64_t target = static_cast<int64_t>(at) + 1 + (static_cast<int32_t>(w & 0xffffffffu) >> 2);
    auto upper = static_cast<uint32_t>(w >> 32);
    switch (w & 3) {
      case 0: {  // struct: data words, then pointers
        uint64_t data = upper & 0xffffu, pointers = upper >> 16;
        return take(target, data + pointers) && each(target + data, pointers, nesting - 1);
      }
      case 1: {  // list: element size, then element count (words, for inline composite)
        uint32_t size = upper & 7u;
        uint64_t count = upper >> 3;
        if (size == 7) return composite(target, count, nesting - 1);
        if (size == 6) return take(target, count) && each(target, count, nesting - 1);
        static constexpr uint64_t kBits[] = {0, 1, 8, 16, 32, 64};
        uint64_t words = (count * kBits[size] + 63) / 64;
        // A void list costs nothing on the wire but a loop per element in the reader.
        return take(target, words) && charge(size == 0 ? count : 0);
      }
      default:  // far pointer (the unchecked layout has none) or capability
        return false;
    }
  }

 private:
  uint64_t load(uint64_t at) const {
    uint64_t w;
    std::memcpy(&w, segment_ + at, sizeof w);
    return w;
  }
  bool charge(uint64_t words) {
    if (words > left_) return false;
    left_ -= words;
    return true;
  }
  /// `words` words from `target` are inside the segment, and paid for.
  bool take(int64_t target, uint64_t words) {
    if (target < 0 || static_cast<uint64_t>(target) > words_) return false;
    if (words > words_ - static_cast<uint64_t>(target)) return false;
    return charge(words);
  }
  /// The `count` pointers from word `first` on.
  bool each(int64_t first, uint64_t count, int nesting) {
    for (uint64_t i = 0; i < count; ++i) {
      if (!pointer(static_cast<uint64_t>(first) + i, nesting)) return false;
    }
    return true;
  }
  /// An inline-composite list: a tag word (a struct pointer whose offset is the element count),
  /// then the elements, `words` words in all.
  bool composite(int64_t tag, uint64_t words, int nesting) {
    if (!take(tag, words + 1)) return false;
    uint64_t t = load(static_cast<uint64_t>(tag));
    if ((t & 3) != 0) return false;
    uint64_t count = (t & 0xffffffffu) >> 2;
    auto upper = static_cast<uint32_t>(t >> 32);
    uint64_t data = upper & 0xffffu, pointers = upper >> 16, step = data + pointers;
    if (count * step > words) return false;
    if (step == 0 && !charge(count)) return false;  // zero-sized elements, like a void list
    if (pointers == 0) return true;
    for (uint64_t i = 0; i < count; ++i) {
      if (!each(tag + 1 + static_cast<int64_t>(i * step + data), pointers, nesting)) {
        return false;
      }
    }
    return true;
  }

  const capnp::word* segment_;
  uint64_t words_;
  uint64_t left_;
};

}  // namespace

kj::ArrayPtr<const capnp::word> readable_unchecked(kj::ArrayPtr<const capnp::word> payload,
                                                   const Limits& limits) {
  if (payload.size() < 2) return nullptr;
  uint32_t table[2];
  std::memcpy(table, payload.begin(), sizeof table);
  // One segment (count - 1 = 0) that fills the rest of the payload and holds at least the root.
  if (table[0] != 0 || table[1] == 0 || table[1] != payload.size() - 1) return nullptr;
  const capnp::word* segment = payload.begin() + 1;
  uint64_t words = table[1];
  uint64_t root;
  std::memcpy(&root, segment, sizeof root);
  if ((root & 3) != 0) return nullptr;  // the root is a struct (or null)
  UncheckedWalk walk(segment, words, std::min<uint64_t>(words, limits.traversal_limit_words));
  // The walk recurses once per level: a payload nested deeper than kMaxWalkNesting (within a
  // larger configured limit) takes the checked copy.
  if (!walk.pointer(0, std::min(limits.nesting_limit, kMaxWalkNesting))) return nullptr;
  return kj::arrayPtr(segment, words);
}

capnp::ReaderOptions reader_options(const Limits& limits) {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = limits.traversal_limit_words;
  o.nestingLimit = limits.nesting_limit;
  return o;
}

std::string describe(const kj::Exception& e) { return std::string(e.getDescription().cStr()); }

// ---- envelope ------------------------------------------------------------------------------

std::string encode_envelope(const EnvelopeFields& f) {
  bus::detail::ScratchBuilder scratch;
  capnp::MessageBuilder& builder = scratch.get();
  auto e = builder.initRoot<wire::Envelope>();
  e.setKind(f.kind);
  e.setTypeId(f.type_id);
  e.setSender(f.sender);
  e.setSeq(f.seq);
  e.setCount(f.count);
  e.setCorrelation(f.correlation);
  e.setTimeoutUs(f.timeout_us);
  e.setCode(f.code);
  if (!f.detail.empty()) e.setDetail(f.detail);
  if (f.principal != nullptr) {
    auto p = e.initPrincipal();
    p.setSubject(f.principal->subject);
    p.setIssuer(f.principal->issuer);
    auto scopes = p.initScopes(static_cast<unsigned>(f.principal->scopes.size()));
    for (unsigned i = 0; i < scopes.size(); ++i) scopes.set(i, f.principal->scopes[i]);
    p.setClaims(f.principal->claims);
  }
  if (!f.items.empty()) {
    auto n = static_cast<unsigned>(f.items.size());
    if (f.kind == wire::Envelope::Kind::REQUEST) {
      auto list = e.initRequests(n);
      for (unsigned i = 0; i < n; ++i) {
        list[i].setCorrelation(f.items[i].correlation);
        list[i].setTimeoutUs(f.items[i].timeout_us);
      }
    } else {
      auto list = e.initReplies(n);
      for (unsigned i = 0; i < n; ++i) {
        list[i].setCorrelation(f.items[i].correlation);
        list[i].setCode(f.items[i].code);
        if (!f.items[i].detail.empty()) list[i].setDetail(f.items[i].detail);
      }
    }
  }
  std::string out;
  append_message(builder, out);
  return out;
}

absl::StatusOr<EnvelopeFields> decode_envelope(const void* bytes, std::size_t size) {
  // An envelope is small: a few words, a principal's names and claims (a few KiB at most), plus
  // up to kMaxBatchItems items of a batch (3 words and
  // a detail text each). Anything over the bound is not one.
  constexpr std::size_t kMaxBytes = 4096 + kMaxBatchItems * 64 + 32 * 1024;  // + a principal
  if (size < sizeof(capnp::word) || size % sizeof(capnp::word) != 0 || size > kMaxBytes) {
    return absl::InvalidArgumentError(absl::StrCat("envelope frame of ", size, " bytes"));
  }
  // Cap'n Proto reads aligned words only; ZeroMQ's frames mostly are not.
  constexpr std::size_t kStackWords = 4096 / sizeof(capnp::word);
  capnp::word stack[kStackWords];
  kj::Array<capnp::word> heap;
  capnp::word* aligned = stack;
  std::size_t words = size / sizeof(capnp::word);
  if (words > kStackWords) {
    heap = kj::heapArray<capnp::word>(words);
    aligned = heap.begin();
  }
  std::memcpy(aligned, bytes, size);
  try {
    capnp::ReaderOptions o;
    // Bounded by the frame's own size: no amplification through shared pointers.
    o.traversalLimitInWords = 1024 + 2 * words;
    o.nestingLimit = 4;
    capnp::FlatArrayMessageReader reader(kj::arrayPtr(aligned, words), o);
    auto e = reader.getRoot<wire::Envelope>();
    EnvelopeFields f;
    f.kind = e.getKind();
    f.type_id = e.getTypeId();
    f.sender = e.getSender();
    f.seq = e.getSeq();
    f.count = e.getCount();
    f.correlation = e.getCorrelation();
    f.timeout_us = e.getTimeoutUs();
    f.code = e.getCode();
    auto text = [](capnp::Text::Reader d) {
      return std::string(d.begin(), std::min<std::size_t>(d.size(), 1024));
    };
    if (e.hasDetail()) f.detail = text(e.getDetail());
    if (e.hasPrincipal()) {
      auto in = e.getPrincipal();
      constexpr std::size_t kMaxScopes = 256, kMaxClaims = 16 * 1024;
      if (in.getScopes().size() > kMaxScopes || in.getClaims().size() > kMaxClaims) {
        return absl::InvalidArgumentError("a principal over the size limits");
      }
      auto p = std::make_shared<Principal>();
      p->subject = text(in.getSubject());
      p->issuer = text(in.getIssuer());
      for (auto s : in.getScopes()) p->scopes.push_back(text(s));
      p->claims = std::string(in.getClaims().cStr(), in.getClaims().size());
      f.principal = std::move(p);
    }
    // A batch's items, each read by `item(reader, BatchItem&)`.
    auto items = [&](auto list, const char* what, auto item) -> absl::Status {
      if (list.size() > kMaxBatchItems) {
        return absl::InvalidArgumentError(absl::StrCat("a batch of ", list.size(), " ", what));
      }
      f.items.resize(list.size());
      for (unsigned i = 0; i < list.size(); ++i) item(list[i], f.items[i]);
      return absl::OkStatus();
    };
    absl::Status st;
    if (f.kind == wire::Envelope::Kind::REQUEST && e.hasRequests()) {
      st = items(e.getRequests(), "requests", [](auto r, BatchItem& b) {
        b.correlation = r.getCorrelation();
        b.timeout_us = r.getTimeoutUs();
      });
    } else if (f.kind == wire::Envelope::Kind::REPLY && e.hasReplies()) {
      st = items(e.getReplies(), "replies", [&](auto r, BatchItem& b) {
        b.correlation = r.getCorrelation();
        b.code = r.getCode();
        if (r.hasDetail()) b.detail = text(r.getDetail());
      });
    }
    if (!st.ok()) return st;
    return f;
  } catch (const kj::Exception& ex) {
    return absl::InvalidArgumentError(absl::StrCat("bad envelope: ", describe(ex)));
  }
}

// ---- payloads ------------------------------------------------------------------------------

absl::Status Payloads::parse(const void* bytes, std::size_t size, uint32_t count,
                             const Limits& limits) {
  items_.clear();
  if (size % sizeof(capnp::word) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload frame of ", size, " bytes is not a whole number of words"));
  }
  std::size_t words = size / sizeof(capnp::word);
  if (count == 0 || count > words / 2) {  // every payload takes at least two words
    return absl::InvalidArgumentError(
        absl::StrCat("payload count ", count, " does not fit a frame of ", size, " bytes"));
  }
  // ZeroMQ hands out small frames mostly not 8-byte aligned (large ones have their own
  // allocation); Cap'n Proto needs alignment.
  const capnp::word* at;
  if (reinterpret_cast<uintptr_t>(bytes) % alignof(capnp::word) == 0) {
    at = static_cast<const capnp::word*>(bytes);
  } else {
    if (buf_.size() < words) buf_ = kj::heapArray<capnp::word>(words);
    std::memcpy(buf_.begin(), bytes, size);
    at = buf_.begin();
  }
  const capnp::word* end = at + words;
  for (uint32_t i = 0; i < count; ++i) {
    if (end - at < 1) return absl::InvalidArgumentError("payload frame ends early");
    uint32_t first[2];
    std::memcpy(first, at, sizeof first);
    uint64_t segments = uint64_t{first[0]} + 1;
    if (segments > 512) {
      return absl::InvalidArgumentError(absl::StrCat("payload with ", segments, " segments"));
    }
    uint64_t table_words = (segments + 2) / 2;
    if (static_cast<uint64_t>(end - at) < table_words) {
      return absl::InvalidArgumentError("payload segment table ends early");
    }
    const auto* sizes = reinterpret_cast<const uint32_t*>(at) + 1;
    uint64_t body = 0;
    for (uint64_t s = 0; s < segments; ++s) body += sizes[s];
    uint64_t total = table_words + body;
    if (total * sizeof(capnp::word) > limits.max_message_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat("payload of ", total * sizeof(capnp::word),
                                                       " bytes is over the limit of ",
                                                       limits.max_message_bytes));
    }
    if (static_cast<uint64_t>(end - at) < total) {
      return absl::InvalidArgumentError("payload frame ends early");
    }
    items_.push_back(kj::arrayPtr(at, total));
    at += total;
  }
  if (at != end) {
    return absl::InvalidArgumentError(
        absl::StrCat((end - at) * sizeof(capnp::word), " bytes after the last payload"));
  }
  return absl::OkStatus();
}

}  // namespace bus::net::detail

namespace bus::detail {
namespace {
// 8 KiB (a default MallocMessageBuilder's first segment) covers most messages.
constexpr std::size_t kScratchWords = 1024;
thread_local capnp::word tls_scratch[kScratchWords];
thread_local bool tls_scratch_busy = false;
}  // namespace

kj::ArrayPtr<capnp::word> acquire_scratch() {
  if (tls_scratch_busy) return {};
  tls_scratch_busy = true;
  return kj::arrayPtr(tls_scratch, kScratchWords);
}

void release_scratch() { tls_scratch_busy = false; }

}  // namespace bus::detail
