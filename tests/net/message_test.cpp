// bus::Builder: a builder kept from one message to the next. Each message() is a snapshot of what
// the builder held then, in the same words build() would have made.
#include <bus/schemas/demo.capnp.h>
#include <gtest/gtest.h>

#include <bus/message.hpp>
#include <cstring>
#include <string>
#include <vector>

namespace {

TEST(Builder, EachMessageIsWhatTheBuilderHeldWhenItWasMade) {
  bus::Builder<demo::Reading> b;
  b->setSensor("attic");
  std::vector<bus::Message<demo::Reading>> made;
  for (uint64_t seq = 1; seq <= 3; ++seq) {
    b->setSeq(seq);
    b->setValue(20.0 + static_cast<double>(seq));
    made.push_back(b.message());
  }
  b->setSeq(99);  // changes the builder, not the messages already made
  for (uint64_t i = 0; i < made.size(); ++i) {
    EXPECT_EQ(made[i]->getSeq(), i + 1);
    EXPECT_EQ(made[i]->getValue(), 21.0 + static_cast<double>(i));
    EXPECT_EQ(std::string(made[i]->getSensor().cStr()), "attic");
  }
  // The same bytes as bus::build makes for that content.
  auto built = bus::build<demo::Reading>([](demo::Reading::Builder r) {
    r.setSensor("attic");
    r.setValue(23.0);
    r.setSeq(3);
  });
  ASSERT_EQ(made[2].words().size(), built.words().size());
  EXPECT_EQ(std::memcmp(made[2].words().begin(), built.words().begin(), built.bytes().size()), 0);
}

TEST(Builder, APointerFieldSetAgainLeavesItsOldWordsUntilClear) {
  bus::Builder<demo::Reading> b;
  b->setSensor("a");
  std::size_t first = b.message().words().size();
  b->setSensor("b");
  auto again = b.message();
  EXPECT_EQ(std::string(again->getSensor().cStr()), "b");
  EXPECT_GT(again.words().size(), first);  // the old text is still in the words
  b.clear();
  EXPECT_EQ(std::string(b.message()->getSensor().cStr()), "");
  b->setSensor("b");
  EXPECT_EQ(b.message().words().size(), first);
}

TEST(Builder, ABuilderGrownPastItsFirstSegmentIsCopiedWhole) {
  bus::Builder<demo::StatsReply> b;
  auto sensors = b->initSensors(2);
  sensors[0].setSensor(std::string(64 * 1024, 'x'));  // past the first segment's 8 KiB
  sensors[1].setSensor("last");
  b->setReadings(5);
  auto m = b.message();
  EXPECT_EQ(m->getReadings(), 5u);
  EXPECT_EQ(m->getSensors()[0].getSensor().size(), 64u * 1024);
  EXPECT_EQ(std::string(m->getSensors()[1].getSensor().cStr()), "last");
  // One segment in the message, whatever the builder's were.
  uint32_t segments_minus_one;
  std::memcpy(&segments_minus_one, m.words().begin(), sizeof segments_minus_one);
  EXPECT_EQ(segments_minus_one, 0u);
}

}  // namespace
