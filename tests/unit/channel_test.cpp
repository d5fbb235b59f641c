// Channels are typed: the wrong message type does not compile, one name has one type.
#include <gtest/gtest.h>

#include <bus/bus.hpp>
#include <string>

namespace {

struct Tick {
  double price;
};
struct Order {
  int id;
};

inline const bus::Topic<Tick> ticks{"channel_test.ticks"};
inline const bus::Queue<Order> orders{"channel_test.orders"};
inline const bus::Endpoint<Order, std::string> lookup{"channel_test.lookup"};

template <class Ch, class M>
concept CanPublish = requires(bus::Bus& b, const Ch& ch, M m) {
  b.publish(ch, m);
};
template <class Ch, class M>
concept CanSend = requires(bus::Bus& b, const Ch& ch, M m) {
  b.send(ch, m);
};
template <class Ch, class M>
concept CanCall = requires(bus::Bus& b, const Ch& ch, M m) {
  b.call(ch, m, std::chrono::seconds(1));
};
template <class Ch, class F>
concept CanSubscribe = requires(bus::Bus& b, const Ch& ch, F f) {
  b.subscribe(ch, f);
};

TEST(Channel, PublishingTheWrongTypeDoesNotCompile) {
  static_assert(CanPublish<bus::Topic<Tick>, Tick>);
  static_assert(CanPublish<bus::Topic<Tick>, const Tick&>);
  static_assert(!CanPublish<bus::Topic<Tick>, Order>);
  static_assert(!CanPublish<bus::Topic<Tick>, double>, "no implicit conversions either");
  static_assert(!CanPublish<bus::Topic<int>, long>);
  static_assert(!CanPublish<bus::Queue<Order>, Order>, "a queue is sent to, not published on");
  static_assert(CanSend<bus::Queue<Order>, Order>);
  static_assert(!CanSend<bus::Queue<Order>, Tick>);
  static_assert(CanCall<bus::Endpoint<Order, std::string>, Order>);
  static_assert(!CanCall<bus::Endpoint<Order, std::string>, Tick>);
}

TEST(Channel, SubscribingWithAHandlerOfTheWrongTypeDoesNotCompile) {
  auto on_tick = [](const Tick&) {};
  auto on_order = [](const Order&) {};
  static_assert(CanSubscribe<bus::Topic<Tick>, decltype(on_tick)>);
  static_assert(!CanSubscribe<bus::Topic<Tick>, decltype(on_order)>);
}

TEST(Channel, OneNameWithTwoTypesIsARegistrationError) {
  try {
    bus::Topic<Order> clash{"channel_test.ticks"};
    FAIL() << "a second type for one name was accepted";
  } catch (const bus::ChannelTypeError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("channel_test.ticks"), std::string::npos) << what;
    EXPECT_NE(what.find("Topic<"), std::string::npos) << what;
    EXPECT_NE(what.find("Tick>"), std::string::npos) << what;
    EXPECT_NE(what.find("Order>"), std::string::npos) << what;
  }
}

TEST(Channel, OneNameWithTwoKindsIsARegistrationError) {
  EXPECT_THROW(bus::Queue<Tick> clash{"channel_test.ticks"}, bus::ChannelTypeError);
}

TEST(Channel, RedeclaringTheSameTypeIsTheSameChannel) {
  bus::Topic<Tick> again{"channel_test.ticks"};
  EXPECT_EQ(again.id(), ticks.id());
  EXPECT_EQ(again.name(), "channel_test.ticks");
}

TEST(Channel, PublishWithNoSubscribersIsAcceptedAndCounted) {
  bus::Bus bus(bus::Options().executors(1));
  EXPECT_TRUE(bus.publish(ticks, Tick{1.0}).ok());
  ASSERT_TRUE(bus.stop().ok());
  ASSERT_NE(bus.stats().channel("channel_test.ticks"), nullptr);
  EXPECT_EQ(bus.stats().channel("channel_test.ticks")->published, 1u);
}

TEST(Channel, SendingToAQueueWithNoConsumerIsUnavailable) {
  bus::Bus bus(bus::Options().executors(1));
  absl::Status s = bus.send(orders, Order{1});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(std::string(s.message()).find("channel_test.orders"), std::string::npos);
  EXPECT_EQ(bus.stats().channel("channel_test.orders")->failed, 1u);
}

}  // namespace
