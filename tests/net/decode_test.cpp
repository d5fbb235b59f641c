// How the bridge turns a payload from the network into a Message: an honest one-segment payload
// is taken as it is once a walk of its pointers finds it safe to read unchecked; anything else is
// copied through Cap'n Proto's checked reader, in one traversal into a buffer the payload's size
// bounds, or in the exact two-pass copy when that bound does not hold.
#include <bus/schemas/demo.capnp.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <bus/message.hpp>
#include <bus/net/detail/channels.hpp>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

namespace {

using bus::net::detail::decode;
using bus::net::detail::Limits;
using bus::net::detail::readable_unchecked;
using StatsMessage = bus::Message<demo::StatsReply>;

constexpr Limits kLimits{/*max_message_bytes=*/1 << 20, /*traversal_limit_words=*/1 << 20,
                         /*nesting_limit=*/16};

std::vector<capnp::word> words_of(const bus::Message<demo::StatsReply>& m) {
  auto w = m.words();
  return {w.begin(), w.end()};
}

bus::Message<demo::StatsReply> stats(unsigned sensors, const std::string& name) {
  return bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
    r.setReadings(7);
    auto list = r.initSensors(sensors);
    for (unsigned i = 0; i < sensors; ++i) {
      list[i].setSensor(name + std::to_string(i));
      list[i].setCount(i);
    }
  });
}

// Word offsets inside a one-segment StatsReply in stream framing (segment table first): the
// pointer of sensor i's `sensor` text, and the offset of the word a list pointer at `at` targets.
struct Layout {
  std::vector<std::size_t> text_pointer;
};
uint64_t word(const std::vector<capnp::word>& w, std::size_t i) {
  uint64_t v;
  std::memcpy(&v, &w[i], sizeof v);
  return v;
}
void set_word(std::vector<capnp::word>& w, std::size_t i, uint64_t v) {
  std::memcpy(&w[i], &v, sizeof v);
}
std::size_t target(const std::vector<capnp::word>& w, std::size_t at) {
  int32_t offset = static_cast<int32_t>(static_cast<uint32_t>(word(w, at))) >> 2;
  return at + 1 + offset;
}
Layout layout(const std::vector<capnp::word>& w, unsigned sensors) {
  const std::size_t root = 1;              // after the one-segment table
  std::size_t reply = target(w, root);     // StatsReply: 2 data words, 1 pointer
  std::size_t tag = target(w, reply + 2);  // sensors: an inline-composite list's tag
  uint64_t tag_word = word(w, tag);
  uint16_t data_words = static_cast<uint16_t>(tag_word >> 32);
  uint16_t pointers = static_cast<uint16_t>(tag_word >> 48);
  EXPECT_EQ(pointers, 1u);
  Layout l;
  for (unsigned i = 0; i < sensors; ++i) {
    l.text_pointer.push_back(tag + 1 + i * (data_words + pointers) + data_words);
  }
  return l;
}

// A payload whose sensors all name sensor 0's text (legal Cap'n Proto: a pointer may share its
// target); the others' own texts are empty, so the unchecked copy, which holds the text once per
// sensor, needs more words than arrived.
std::vector<capnp::word> amplified(unsigned sensors, std::size_t name_bytes) {
  auto wire = words_of(bus::build<demo::StatsReply>([&](demo::StatsReply::Builder r) {
    auto list = r.initSensors(sensors);
    for (unsigned i = 0; i < sensors; ++i) {
      list[i].setSensor(i == 0 ? std::string(name_bytes, 'x') : std::string());
      list[i].setCount(i);
    }
  }));
  Layout l = layout(wire, sensors);
  std::size_t text0 = target(wire, l.text_pointer[0]);
  uint64_t upper = word(wire, l.text_pointer[0]) >> 32;  // element size and count
  for (unsigned i = 1; i < sensors; ++i) {
    int64_t offset = static_cast<int64_t>(text0) - static_cast<int64_t>(l.text_pointer[i] + 1);
    set_word(wire, l.text_pointer[i],
             (upper << 32) | static_cast<uint32_t>((static_cast<int32_t>(offset) << 2) | 1));
  }
  return wire;
}

TEST(Decode, APayloadBecomesAMessageWithTheSameContentAndNoSpareWords) {
  auto sent = stats(3, "sensor-");
  auto wire = words_of(sent);
  auto got =
      decode<bus::Message<demo::StatsReply>>(kj::arrayPtr(wire.data(), wire.size()), kLimits);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->getReadings(), 7u);
  ASSERT_EQ((*got)->getSensors().size(), 3u);
  EXPECT_EQ(std::string((*got)->getSensors()[2].getSensor().cStr()), "sensor-2");
  EXPECT_EQ((*got)->getSensors()[2].getCount(), 2u);
  // The stream form the message hands on (to subscribers, to other nodes) is exactly its words.
  ASSERT_EQ(got->words().size(), wire.size());
  EXPECT_EQ(std::memcmp(got->words().begin(), wire.data(), wire.size() * sizeof(capnp::word)), 0);
}

TEST(Decode, APayloadWhoseCopyOutgrowsItIsCopiedInFull) {
  constexpr unsigned kSensors = 8;
  auto wire = amplified(kSensors, 100);
  auto got =
      decode<bus::Message<demo::StatsReply>>(kj::arrayPtr(wire.data(), wire.size()), kLimits);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ((*got)->getSensors().size(), kSensors);
  for (unsigned i = 0; i < kSensors; ++i) {
    EXPECT_EQ(std::string((*got)->getSensors()[i].getSensor().cStr()), std::string(100, 'x'));
    EXPECT_EQ((*got)->getSensors()[i].getCount(), i);
  }
  EXPECT_GT(got->words().size(), wire.size());  // the bound did not hold: the exact copy ran
}

TEST(Decode, APointerOutOfItsSegmentIsAnErrorNotACopy) {
  auto wire = words_of(stats(2, "s"));
  Layout l = layout(wire, 2);
  uint64_t upper = word(wire, l.text_pointer[1]) >> 32;
  set_word(wire, l.text_pointer[1], (upper << 32) | static_cast<uint32_t>((1000 << 2) | 1));
  auto got =
      decode<bus::Message<demo::StatsReply>>(kj::arrayPtr(wire.data(), wire.size()), kLimits);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(got.status().message()).find("StatsReply"), std::string::npos)
      << got.status();
}

TEST(Decode, AnAmplifyingPayloadPastTheTraversalLimitIsAnError) {
  // 64 sensors sharing one 4 KiB text: 32 K words to copy from about 900 on the wire.
  auto wire = amplified(64, 4096);
  constexpr Limits kTight{/*max_message_bytes=*/1 << 20, /*traversal_limit_words=*/8 * 1024,
                          /*nesting_limit=*/16};
  auto got = decode<bus::Message<demo::StatsReply>>(kj::arrayPtr(wire.data(), wire.size()), kTight);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  // Within the default limit the same payload is legal, and arrives whole.
  auto whole =
      decode<bus::Message<demo::StatsReply>>(kj::arrayPtr(wire.data(), wire.size()), kLimits);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_EQ(std::string((*whole)->getSensors()[63].getSensor().cStr()), std::string(4096, 'x'));
}

// ---- the pointer walk that lets an honest payload skip the copy ------------------------------

kj::ArrayPtr<const capnp::word> view(const std::vector<capnp::word>& w) {
  return kj::arrayPtr(w.data(), w.size());
}

/// A hand-made payload: a one-segment table, then `segment`'s words.
std::vector<capnp::word> payload(std::initializer_list<uint64_t> segment) {
  std::vector<capnp::word> w(segment.size() + 1);
  set_word(w, 0, uint64_t{segment.size()} << 32);
  std::size_t i = 1;
  for (uint64_t v : segment) set_word(w, i++, v);
  return w;
}
uint32_t offset_bits(int32_t offset) { return static_cast<uint32_t>(offset) << 2; }
uint64_t struct_ptr(int32_t offset, uint16_t data, uint16_t pointers) {
  return (uint64_t{pointers} << 48) | (uint64_t{data} << 32) | offset_bits(offset);
}
uint64_t list_ptr(int32_t offset, unsigned element_size, uint32_t count) {
  return (uint64_t{count} << 35) | (uint64_t{element_size} << 32) | offset_bits(offset) | 1;
}

TEST(Decode, AnHonestPayloadIsTakenAsItIsAfterAWalkOfItsPointers) {
  auto wire = words_of(stats(3, "sensor-"));
  auto segment = readable_unchecked(view(wire), kLimits);
  ASSERT_EQ(segment.size(), wire.size() - 1);
  EXPECT_EQ(segment.begin(), wire.data() + 1);  // the segment after its table, not a copy
  auto reading = bus::build<demo::Reading>([](demo::Reading::Builder r) {
    r.setSensor("t1");
    r.setValue(21.5);
  });
  auto rw = std::vector<capnp::word>(reading.words().begin(), reading.words().end());
  EXPECT_EQ(readable_unchecked(view(rw), kLimits).size(), rw.size() - 1);
  // A null root is a default struct.
  auto empty = payload({0});
  EXPECT_EQ(readable_unchecked(view(empty), kLimits).size(), 1u);
  auto got = decode<StatsMessage>(view(empty), kLimits);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->getReadings(), 0u);
}

TEST(Decode, APayloadOfSeveralSegmentsIsCopiedThroughTheCheckedReader) {
  // A first segment too small for the message: the rest goes to other segments, behind far
  // pointers, which the unchecked layout cannot hold.
  capnp::MallocMessageBuilder builder(4, capnp::AllocationStrategy::FIXED_SIZE);
  auto r = builder.initRoot<demo::StatsReply>();
  r.setReadings(9);
  auto list = r.initSensors(2);
  list[1].setSensor("far away");
  ASSERT_GT(builder.getSegmentsForOutput().size(), 1u);
  kj::Array<capnp::word> flat = capnp::messageToFlatArray(builder);
  EXPECT_EQ(readable_unchecked(flat, kLimits).size(), 0u);
  auto got = decode<StatsMessage>(flat, kLimits);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ((*got)->getReadings(), 9u);
  EXPECT_EQ(std::string((*got)->getSensors()[1].getSensor().cStr()), "far away");
}

TEST(Decode, ThePointerWalkRefusesWhatAnUncheckedReaderCouldNotSurvive) {
  auto refused = [](const std::vector<capnp::word>& w) {
    return readable_unchecked(view(w), kLimits).size() == 0;
  };
  // The control: a root struct of one pointer to a list of two eight-byte elements.
  EXPECT_FALSE(refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 5, 2), 7, 8})));
  // A target past the segment's end, or before its start.
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 5, 3), 7, 8})));
  EXPECT_TRUE(refused(payload({struct_ptr(5, 1, 0), 0})));
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), struct_ptr(-4, 1, 0)})));
  // A root that is not a struct; a far pointer; a capability.
  EXPECT_TRUE(refused(payload({list_ptr(0, 2, 8), 0})));
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), 2})));
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), 3})));
  // An inline-composite list whose tag claims more elements than its words hold, and one whose
  // tag is not a struct pointer.
  EXPECT_FALSE(
      refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 7, 2), struct_ptr(2, 1, 0), 1, 2})));
  EXPECT_TRUE(
      refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 7, 2), struct_ptr(3, 1, 0), 1, 2})));
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 7, 2), list_ptr(2, 5, 1), 1, 2})));
  // A void list of a million elements: nothing on the wire, a million steps for a reader.
  EXPECT_TRUE(refused(payload({struct_ptr(0, 0, 1), list_ptr(0, 0, 1 << 20)})));
}

TEST(Decode, CyclesAndNestingPastTheLimitAreRefusedByTheWalkAndThenByTheCopy) {
  // A struct whose only pointer is itself.
  auto cycle = payload({struct_ptr(0, 0, 1), struct_ptr(-1, 0, 1)});
  EXPECT_EQ(readable_unchecked(view(cycle), kLimits).size(), 0u);
  auto got = decode<StatsMessage>(view(cycle), kLimits);
  EXPECT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kInvalidArgument);
  // A chain of structs, each pointing to the next: `depth` of them.
  auto chain = [](int depth) {
    std::vector<capnp::word> w(depth + 2);
    set_word(w, 0, uint64_t(depth + 1) << 32);
    for (int i = 0; i < depth; ++i) set_word(w, 1 + i, struct_ptr(0, 0, 1));
    set_word(w, 1 + depth, 0);
    return w;
  };
  EXPECT_EQ(readable_unchecked(view(chain(kLimits.nesting_limit)), kLimits).size(),
            std::size_t(kLimits.nesting_limit) + 1);
  EXPECT_EQ(readable_unchecked(view(chain(kLimits.nesting_limit + 1)), kLimits).size(), 0u);
  EXPECT_FALSE(decode<StatsMessage>(view(chain(kLimits.nesting_limit + 4)), kLimits).ok());
  // The walk recurses per level, so it stops at 256 levels even when the configured limit is
  // higher; a deeper payload within that limit is the checked copy's.
  constexpr Limits kDeep{/*max_message_bytes=*/1 << 20, /*traversal_limit_words=*/1 << 20,
                         /*nesting_limit=*/1000};
  EXPECT_EQ(readable_unchecked(view(chain(256)), kDeep).size(), 257u);
  EXPECT_EQ(readable_unchecked(view(chain(300)), kDeep).size(), 0u);
  auto deep = decode<StatsMessage>(view(chain(300)), kDeep);
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_EQ(deep->words().size(), 302u);  // stream header, then the 301 words of the chain
}

TEST(Decode, SharedTargetsPastThePayloadsOwnSizeAreLeftToTheCopy) {
  auto wire = amplified(8, 100);
  EXPECT_EQ(readable_unchecked(view(wire), kLimits).size(), 0u);
  // Two pointers to one small object in a payload with room to spare are within the budget.
  auto shared = payload({struct_ptr(0, 0, 2), list_ptr(1, 5, 1), list_ptr(0, 5, 1), 42, 0, 0});
  EXPECT_EQ(readable_unchecked(view(shared), kLimits).size(), 6u);
}

// Differential: random damage to honest payloads. Whatever the walk takes, Cap'n Proto's checked
// reader must take too, and the unchecked reading of the taken words must see the same message.
TEST(Decode, ThePointerWalkNeverTakesWhatTheCheckedReaderRefuses) {
  std::vector<std::vector<capnp::word>> seeds = {words_of(stats(3, "sensor-")),
                                                 words_of(stats(1, "")), words_of(stats(0, "")),
                                                 amplified(3, 10)};
  std::mt19937_64 rng(20261204);
  int taken = 0, refused = 0;
  for (int round = 0; round < 20000; ++round) {
    auto w = seeds[round % seeds.size()];
    int damage = 1 + static_cast<int>(rng() % 3);
    for (int d = 0; d < damage; ++d) {
      std::size_t at = 1 + rng() % (w.size() - 1);  // the segment, not its table
      uint64_t v = word(w, at);
      switch (rng() % 4) {
        case 0: v ^= uint64_t{1} << (rng() % 64); break;                         // one bit
        case 1: v ^= (rng() & 0xff) << (8 * (rng() % 8)); break;                 // one byte
        case 2: v += (static_cast<int64_t>(rng() % 9) - 4) * 4; break;           // an offset nudged
        default: v = (v & ~uint64_t{0xffffffff}) | (rng() & 0xffffffff); break;  // kind+offset
      }
      set_word(w, at, v);
    }
    auto segment = readable_unchecked(view(w), kLimits);
    if (segment.size() == 0) {
      ++refused;
      continue;
    }
    ++taken;
    uint64_t checked_words = 0;
    try {
      capnp::FlatArrayMessageReader reader(view(w), bus::net::detail::reader_options(kLimits));
      checked_words = reader.getRoot<demo::StatsReply>().totalSize().wordCount;
    } catch (const kj::Exception& e) {
      ADD_FAILURE() << "round " << round << ": the walk took a payload the checked reader refuses: "
                    << e.getDescription().cStr();
      continue;
    }
    auto got = decode<StatsMessage>(view(w), kLimits);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ((*got).reader().totalSize().wordCount, checked_words) << "round " << round;
  }
  // Both sides of the walk were exercised.
  EXPECT_GT(taken, 1000);
  EXPECT_GT(refused, 1000);
}

}  // namespace
