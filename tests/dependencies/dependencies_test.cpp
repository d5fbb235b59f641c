// The transport and schema libraries the bridge builds on are found, link and work.
#include <capnp/message.h>
#include <capnp/schema.capnp.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <zmq.hpp>

TEST(Dependencies, ZeroMqMovesAMessageOverInproc) {
  zmq::context_t ctx;
  zmq::socket_t pull(ctx, zmq::socket_type::pull);
  zmq::socket_t push(ctx, zmq::socket_type::push);
  pull.bind("inproc://deps");
  push.connect("inproc://deps");
  ASSERT_TRUE(push.send(zmq::buffer(std::string_view("hello")), zmq::send_flags::none));
  zmq::message_t m;
  ASSERT_TRUE(pull.recv(m, zmq::recv_flags::none));
  EXPECT_EQ(m.to_string(), "hello");
}

TEST(Dependencies, CapnProtoRoundTripsAStruct) {
  capnp::MallocMessageBuilder builder;
  auto node = builder.initRoot<capnp::schema::Node>();
  node.setId(0xabcdef);
  node.setDisplayName("bus.Test");
  auto words = capnp::messageToFlatArray(builder);
  capnp::FlatArrayMessageReader reader(words.asPtr());
  auto read = reader.getRoot<capnp::schema::Node>();
  EXPECT_EQ(read.getId(), 0xabcdefu);
  EXPECT_EQ(std::string(read.getDisplayName().cStr()), "bus.Test");
}
