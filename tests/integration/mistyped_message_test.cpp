// Two programs that disagree on a channel's type (possible only across processes: the channel
// registry is per process). What the receiver cannot read as its own type is rejected and
// counted, never handed to a handler; a request of the wrong type gets an error status.
#include <bus/schemas/envelope.capnp.h>
#include <capnp/message.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <bus/net/node.hpp>
#include <cstring>
#include <iterator>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "integration/channels.hpp"
#include "integration/node_process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;
using integ::cat;
using integ::NodeProcess;

namespace {

std::vector<std::string> on_tcp(const std::string& name) {
  return {"--name=" + name, "--publish-on=tcp://127.0.0.1:*", "--requests-on=tcp://127.0.0.1:*"};
}

std::string bytes_of(kj::ArrayPtr<const capnp::word> words) {
  auto b = words.asBytes();
  return std::string(reinterpret_cast<const char*>(b.begin()), b.size());
}

}  // namespace

TEST(MistypedMessage, PublishesOfAnotherTypeAreRejectedCountedAndNeverHandled) {
  NodeProcess wrong(cat(on_tcp("wrong"), {"--export-mistyped-readings"}));
  NodeProcess right(cat(on_tcp("right"), {"--export-readings"}));
  ASSERT_TRUE(wrong.ready());
  ASSERT_TRUE(right.ready());
  NodeProcess sub(cat(on_tcp("sub"), {"--import-readings", wrong.as_peer(), right.as_peer()}));
  ASSERT_TRUE(sub.ready());

  // StatsRequests published as "integ.readings": each one is rejected by its type id.
  ASSERT_EQ(wrong.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(wrong.ask("publish 100").num("refused"), 0u);
  ASSERT_TRUE(
      bus_test::eventually([&] { return sub.report().num("readings.rejected") >= 100; }, 60s))
      << sub.report().line;

  // The channel still works for the right type, and the handler saw only that.
  ASSERT_EQ(right.ask("wait-subscribers 1").num("n"), 1u);
  ASSERT_EQ(right.ask("publish 100").num("refused"), 0u);
  ASSERT_TRUE(bus_test::eventually([&] { return sub.report().num("received") >= 100; }, 60s));
  integ::Answer r = sub.report();
  EXPECT_EQ(r.num("readings.rejected"), 100u) << r.line;
  EXPECT_EQ(r.num("received"), 100u) << r.line;
  EXPECT_EQ(r.num("sensor.right"), 100u) << r.line;
  EXPECT_FALSE(r.has("sensor.wrong")) << r.line;
  EXPECT_EQ(r.num("readings.received"), 100u) << r.line;
  EXPECT_EQ(r.num("readings.gaps"), 0u) << r.line;
  EXPECT_TRUE(sub.quit());
  EXPECT_TRUE(wrong.quit());
  EXPECT_TRUE(right.quit());
}

TEST(MistypedMessage, ARequestOfAnotherTypeGetsAnErrorAndNeverReachesTheHandler) {
  NodeProcess server(cat(on_tcp("server"), {"--serve"}));
  ASSERT_TRUE(server.ready());
  NodeProcess wrong(cat(on_tcp("wrong"), {"--import-mistyped-stats", server.as_peer()}));
  NodeProcess right(cat(on_tcp("right"), {"--import-stats", server.as_peer()}));
  ASSERT_TRUE(wrong.ready());
  ASSERT_TRUE(right.ready());

  // The caller knows the server and what it serves, yet its request (a Reading) matches no
  // server of "integ.stats": an error status, not a hang until the deadline.
  ASSERT_EQ(wrong.ask("wait-peers 1").num("n"), 1u);
  integ::Answer called = wrong.ask("call 1 30000");
  EXPECT_EQ(called.num("ok"), 0u) << called.line;
  EXPECT_EQ(called.num("failed"), 1u) << called.line;
  EXPECT_EQ(called.num("code"), static_cast<uint64_t>(absl::StatusCode::kUnavailable))
      << called.line;

  // The right type is served.
  ASSERT_EQ(right.ask("wait-server").num("ok"), 1u);
  EXPECT_EQ(right.ask("call 1").num("ok"), 1u);
  EXPECT_EQ(server.report().num("handled"), 1u);
  EXPECT_TRUE(wrong.quit());
  EXPECT_TRUE(right.quit());
  EXPECT_TRUE(server.quit());
}

TEST(MistypedMessage, ARequestOfAnotherTypeOnTheWireIsRefusedByTheServer) {
  // A peer that sends anyway (another implementation, or one that believes the types match):
  // the server checks the type id itself and answers InvalidArgument.
  NodeProcess server(cat(on_tcp("server"), {"--serve"}));
  ASSERT_TRUE(server.ready());

  capnp::MallocMessageBuilder builder;
  auto env = builder.initRoot<bus::wire::Envelope>();
  env.setKind(bus::wire::Envelope::Kind::REQUEST);
  env.setTypeId(bus::schema_id<integ::Reading>());  // the endpoint takes a StatsRequest
  env.setSender(0x5eed);
  env.setCount(1);
  env.setCorrelation(77);
  env.setTimeoutUs(30'000'000);
  std::string envelope = bytes_of(capnp::messageToFlatArray(builder));
  std::string payload = bytes_of(integ::reading("raw", 1).words());

  zmq::context_t ctx;
  zmq::socket_t dealer(ctx, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(server.request_address());
  dealer.send(zmq::buffer(std::string_view(integ::kStats)), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(envelope), zmq::send_flags::sndmore);
  dealer.send(zmq::buffer(payload), zmq::send_flags::none);

  zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(60'000)), 1) << "no reply";
  std::vector<zmq::message_t> parts;
  ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(parts)));
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[0].to_string(), integ::kStats);
  auto words = kj::heapArray<capnp::word>(parts[1].size() / sizeof(capnp::word));
  std::memcpy(words.begin(), parts[1].data(), words.size() * sizeof(capnp::word));
  capnp::FlatArrayMessageReader reader(words);
  auto reply = reader.getRoot<bus::wire::Envelope>();
  EXPECT_EQ(reply.getKind(), bus::wire::Envelope::Kind::REPLY);
  EXPECT_EQ(reply.getCorrelation(), 77u);
  EXPECT_EQ(reply.getCode(), static_cast<uint16_t>(absl::StatusCode::kInvalidArgument))
      << reply.getDetail().cStr();

  integ::Answer r = server.report();
  EXPECT_EQ(r.num("stats.rejected"), 1u) << r.line;
  EXPECT_EQ(r.num("handled"), 0u) << r.line;
  EXPECT_TRUE(server.quit());
}
