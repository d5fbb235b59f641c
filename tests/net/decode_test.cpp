// How the bridge turns a payload from the network into a Message: one traversal that copies into
// a buffer the payload's size bounds, and the exact two-pass copy when that bound does not hold.
#include <bus/schemas/demo.capnp.h>
#include <gtest/gtest.h>

#include <bus/message.hpp>
#include <bus/net/detail/channels.hpp>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace {

using bus::net::detail::decode;
using bus::net::detail::Limits;

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

}  // namespace
