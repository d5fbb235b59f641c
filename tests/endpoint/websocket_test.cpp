// The WebSocket bridge: subscribe, publish and call over a real WebSocket on loopback, in JSON
// and in Cap'n Proto binary frames; permissions; bad frames; slow clients under both policies;
// keep-alive pings; shutdown.
#include <bus/schemas/websocket.capnp.h>
#include <capnp/serialize.h>
#include <gtest/gtest.h>

#include <atomic>
#include <bus/http/websocket.hpp>
#include <mutex>
#include <string>
#include <vector>

#include "endpoint/common.hpp"
#include "endpoint/ws_client.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using bus::http::Match;
using bus::http::Permit;
using bus::http::SlowClient;
using bus::http::WebSocketOptions;
using ws_test::field;

namespace {

// Topics of the bridge. `news` may be watched and published, `feed` only watched, `secret` is
// on the bridge but permitted to nobody; `unbridged` is not on the bridge at all.
const bus::Topic<Tagged> news{"test.ws.news"};
const bus::Topic<Tagged> feed{"test.ws.feed"};
const bus::Topic<Tagged> secret{"test.secret"};
const bus::Topic<Tagged> unbridged{"test.private"};

std::string tag_json(std::string_view tag) { return R"({"tag":")" + std::string(tag) + R"("})"; }

class WebSocket : public ::testing::Test {
 protected:
  void start(WebSocketOptions o = {}, ServerOptions so = ServerOptions()) {
    http = std::make_unique<Server>(bus, so);
    http->websocket(std::move(o))
        .topic(news)
        .topic(feed)
        .topic(secret)
        .endpoint(greet)
        .endpoint(blocking)
        .endpoint(echo)
        .permit(Permit::kSubscribe, "test.ws.")  // prefix: news, feed (secret is refused below)
        .permit(Permit::kPublish, "test.ws.news", Match::kExact)
        .permit(Permit::kRequest, "test.http.greet", Match::kExact)
        .permit(Permit::kRequest, "test.http.blocking", Match::kExact);
    http->start();
  }
  /// Subscribes `c` to `topic` and waits for the acknowledgement.
  void subscribe(ws_test::Client& c, std::string_view topic) {
    c.send_text(R"({"op":"sub","channel":")" + std::string(topic) + R"("})");
    auto ack = c.next_json();
    ASSERT_TRUE(ack) << c.error();
    ASSERT_EQ(*ack, R"({"op":"subscribed","channel":")" + std::string(topic) + R"("})");
  }
  /// Publishes `tag` on `topic` from the bus (kBlock: waits for room rather than dropping).
  void publish(const bus::Topic<Tagged>& topic, std::string_view tag) {
    ASSERT_TRUE(bus.publish(topic, tagged(tag)).ok());
  }
  /// Reads the next message and expects an error frame with `code`.
  void expect_error(ws_test::Client& c, std::string_view code) {
    auto m = c.next_json();
    ASSERT_TRUE(m) << c.error();
    EXPECT_EQ(field(*m, "op"), R"("error")") << *m;
    EXPECT_EQ(field(*m, "error"), "\"" + std::string(code) + "\"") << *m;
  }

  Services services;
  bus::Bus& bus = services.bus;
  std::unique_ptr<Server> http;
};

TEST_F(WebSocket, SubscribedClientReceivesTopicMessagesInOrder) {
  start();
  ws_test::Client c(http->port());
  subscribe(c, "test.ws.news");
  for (int i = 0; i < 100; ++i) publish(news, "n" + std::to_string(i));
  for (int i = 0; i < 100; ++i) {
    auto m = c.next_json();
    ASSERT_TRUE(m) << c.error();
    EXPECT_EQ(*m, R"({"op":"msg","channel":"test.ws.news","body":)" +
                      tag_json("n" + std::to_string(i)) + "}");
  }
  // Unsubscribed: the next messages do not come; the ack does.
  c.send_text(R"({"op":"unsub","channel":"test.ws.news"})");
  auto ack = c.next_json();
  ASSERT_TRUE(ack);
  EXPECT_EQ(*ack, R"({"op":"unsubscribed","channel":"test.ws.news"})");
  publish(news, "after");
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":1,"body":{"name":"x"}})");
  auto next = c.next_json();
  ASSERT_TRUE(next);
  EXPECT_EQ(field(*next, "op"), R"("reply")") << "a message came after unsub: " << *next;
}

TEST_F(WebSocket, TwoClientsOnTwoIoThreadsEachGetEveryMessage) {
  start({}, ServerOptions().io_threads(2));
  std::vector<std::unique_ptr<ws_test::Client>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<ws_test::Client>(http->port()));
    subscribe(*clients.back(), "test.ws.feed");
  }
  for (int i = 0; i < 50; ++i) publish(feed, std::to_string(i));
  for (auto& c : clients) {
    for (int i = 0; i < 50; ++i) {
      auto m = c->next_json();
      ASSERT_TRUE(m) << c->error();
      EXPECT_EQ(field(*m, "body"), tag_json(std::to_string(i)));
    }
  }
}

TEST_F(WebSocket, ClientPublishReachesBusSubscribers) {
  start();
  std::mutex mu;
  std::vector<std::string> got;
  auto sub = bus.subscribe(news, [&](const Tagged& t) {
    std::lock_guard lock(mu);
    got.emplace_back(t->getTag().cStr());
  });
  ws_test::Client c(http->port());
  c.send_text(R"({"op":"pub","channel":"test.ws.news","body":{"tag":"from-ws"}})");
  c.send_text(R"({"op":"pub","channel":"test.ws.news","body":{"tag":"second"}})");
  // A frame may carry several messages: an array, taken in order.
  c.send_text(R"([{"op":"pub","channel":"test.ws.news","body":{"tag":"a1"}},)"
              R"({"op":"pub","channel":"test.ws.news","body":{"tag":"a2"}}])");
  ASSERT_TRUE(bus_test::eventually([&] {
    std::lock_guard lock(mu);
    return got.size() == 4;
  }));
  EXPECT_EQ(got, (std::vector<std::string>{"from-ws", "second", "a1", "a2"}));
  EXPECT_EQ(http->websocket_stats().published, 4u);
}

TEST_F(WebSocket, CallsAreAnsweredWithTheirIdAndFailuresCarryTheStatus) {
  start();
  ws_test::Client c(http->port());
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":7,"body":{"name":"Sergio"}})");
  auto m = c.next_json();
  ASSERT_TRUE(m) << c.error();
  EXPECT_EQ(*m, R"({"op":"reply","id":7,"body":{"message":"Hello Sergio"}})");
  // String ids are echoed as they came.
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":"a-1","body":{"name":"Ada"}})");
  m = c.next_json();
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, R"({"op":"reply","id":"a-1","body":{"message":"Hello Ada"}})");
  // Past its deadline: the reply says so (nobody answers the blocking endpoint here).
  Blocker blocker;
  auto serving = bus.serve(blocking, std::ref(blocker), bus::on_executor(1));
  c.send_text(
      R"({"op":"call","channel":"test.http.blocking","id":8,"timeout_ms":50,"body":{"tag":"t"}})");
  m = c.next_json();
  ASSERT_TRUE(m);
  EXPECT_EQ(field(*m, "id"), "8");
  EXPECT_EQ(field(*m, "error"), R"("deadline_exceeded")") << *m;
  blocker.gate.open();
}

TEST_F(WebSocket, WhatIsNotPermittedIsRefusedAndCounted) {
  start();
  ws_test::Client c(http->port());
  c.send_text(R"({"op":"sub","channel":"test.secret"})");  // on the bridge, not permitted...
  expect_error(c, "forbidden");
  // ...prefix rules are per direction: subscribe "test.ws." does not permit publishing feed.
  c.send_text(R"({"op":"pub","channel":"test.ws.feed","body":{"tag":"x"}})");
  expect_error(c, "forbidden");
  c.send_text(R"({"op":"call","channel":"test.http.echo","id":1,"body":{}})");
  expect_error(c, "forbidden");
  c.send_text(R"({"op":"sub","channel":"test.private"})");  // not on the bridge at all
  expect_error(c, "unknown_channel");
  c.send_text(R"({"op":"call","channel":"test.ws.news","id":2,"body":{}})");  // a topic
  expect_error(c, "unknown_channel");
  EXPECT_EQ(http->websocket_stats().refused, 5u);
  // The connection still works.
  subscribe(c, "test.ws.feed");
}

TEST_F(WebSocket, BadFramesGetAnErrorAndTheConnectionGoesOn) {
  start();
  ws_test::Client c(http->port());
  c.send_text("not json");
  expect_error(c, "bad_frame");
  c.send_text(R"("a string")");
  expect_error(c, "bad_frame");
  c.send_text(R"({"op":"dance"})");
  expect_error(c, "bad_frame");
  c.send_text(R"({"op":"pub","channel":"test.ws.news","body":{"tga":"typo"}})");
  expect_error(c, "bad_frame");
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":3,"body":{"name":5}})");
  auto m = c.next_json();  // a body not of the type: the call's reply says so
  ASSERT_TRUE(m);
  EXPECT_EQ(field(*m, "id"), "3") << *m;
  EXPECT_EQ(field(*m, "error"), R"("invalid_argument")") << *m;
  c.send_text(R"({"op":"call","channel":"test.http.greet","body":{"name":"x"}})");  // no id
  expect_error(c, "bad_frame");
  EXPECT_EQ(http->websocket_stats().bad_frames, 5u);
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":4,"body":{"name":"Ok"}})");
  m = c.next_json();
  ASSERT_TRUE(m);
  EXPECT_EQ(*m, R"({"op":"reply","id":4,"body":{"message":"Hello Ok"}})");
}

TEST_F(WebSocket, BinaryFramesCarryCapnProtoMessages) {
  start();
  ws_test::Client c(http->port(), {.binary = true});
  EXPECT_EQ(c.subprotocol(), "bus.capnp");
  auto frame = [](auto fill) {
    capnp::MallocMessageBuilder b;
    fill(b.initRoot<bus::wire::Frame>());
    kj::Array<capnp::word> words = capnp::messageToFlatArray(b);
    return std::string(reinterpret_cast<const char*>(words.asBytes().begin()),
                       words.asBytes().size());
  };
  // Server frames hold one or more Frames back to back: read them one by one.
  std::vector<std::string> frames;
  auto next = [&]() -> std::optional<kj::Array<capnp::word>> {
    while (frames.empty()) {
      auto data = c.read();
      if (!data) return std::nullopt;
      EXPECT_TRUE(c.last_was_binary());
      kj::Array<capnp::word> all = kj::heapArray<capnp::word>(data->size() / 8);
      std::memcpy(all.begin(), data->data(), data->size());
      kj::ArrayPtr<const capnp::word> rest = all;
      while (rest.size() > 0) {
        capnp::FlatArrayMessageReader r(rest);
        auto end = r.getEnd();
        frames.emplace_back(reinterpret_cast<const char*>(rest.begin()),
                            (end - rest.begin()) * sizeof(capnp::word));
        rest = kj::arrayPtr(end, rest.end());
      }
    }
    std::string f = std::move(frames.front());
    frames.erase(frames.begin());
    auto words = kj::heapArray<capnp::word>(f.size() / 8);
    std::memcpy(words.begin(), f.data(), f.size());
    return words;
  };
  c.send_binary(frame([](bus::wire::Frame::Builder f) {
    f.setOp(bus::wire::Frame::Op::SUB);
    f.setChannel("test.ws.news");
  }));
  auto ack = next();
  ASSERT_TRUE(ack) << c.error();
  {
    capnp::FlatArrayMessageReader r(*ack);
    EXPECT_EQ(r.getRoot<bus::wire::Frame>().getOp(), bus::wire::Frame::Op::SUBSCRIBED);
  }
  publish(news, "bin");
  auto msg = next();
  ASSERT_TRUE(msg);
  {
    capnp::FlatArrayMessageReader r(*msg);
    auto f = r.getRoot<bus::wire::Frame>();
    EXPECT_EQ(f.getOp(), bus::wire::Frame::Op::MSG);
    EXPECT_EQ(std::string(f.getChannel().cStr()), "test.ws.news");
    auto body = kj::heapArray<capnp::word>(f.getBody().size() / 8);
    std::memcpy(body.begin(), f.getBody().begin(), f.getBody().size());
    capnp::FlatArrayMessageReader br(body);
    EXPECT_EQ(std::string(br.getRoot<endpoint_test::Tagged>().getTag().cStr()), "bin");
  }
  // A call with a Cap'n Proto body.
  GreetingRequest req = bus::build<greeting::GreetingRequest>(
      [](greeting::GreetingRequest::Builder b) { b.setName("Binary"); });
  c.send_binary(frame([&](bus::wire::Frame::Builder f) {
    f.setOp(bus::wire::Frame::Op::CALL);
    f.setChannel("test.http.greet");
    f.setId(42);
    f.setBody(req.bytes());
  }));
  auto rep = next();
  ASSERT_TRUE(rep);
  capnp::FlatArrayMessageReader r(*rep);
  auto f = r.getRoot<bus::wire::Frame>();
  ASSERT_EQ(f.getOp(), bus::wire::Frame::Op::REPLY)
      << f.getError().cStr() << ": " << f.getDetail().cStr();
  EXPECT_EQ(f.getId(), 42u);
  auto body = kj::heapArray<capnp::word>(f.getBody().size() / 8);
  std::memcpy(body.begin(), f.getBody().begin(), f.getBody().size());
  capnp::FlatArrayMessageReader br(body);
  EXPECT_EQ(std::string(br.getRoot<greeting::Greeting>().getMessage().cStr()), "Hello Binary");
}

/// Publishes `count` messages on `news` while `good` reads them, keeping at most `window`
/// unread (so the good client's own buffer never fills, however slow this machine is), and
/// checks that it got every one, in order.
void publish_to_reader(bus::Bus& bus, ws_test::Client& good, int count, const std::string& pad) {
  constexpr int kWindow = 16;
  std::atomic<int> read{0};
  std::thread reader([&] {
    for (int i = 0; i < count; ++i) {
      auto m = good.next_json();
      if (!m) {
        ADD_FAILURE() << "good client: " << good.error() << " at " << i;
        break;
      }
      if (field(*m, "body") != tag_json(std::to_string(i) + pad)) {
        ADD_FAILURE() << "good client: message " << i << " is " << m->substr(0, 80);
        break;
      }
      read.store(i + 1);
    }
    read.store(count + kWindow);  // done (or failed): stop holding the publisher back
  });
  for (int i = 0; i < count; ++i) {
    bus_test::eventually([&] { return read.load() > i - kWindow; });
    ASSERT_TRUE(bus.publish(news, tagged(std::to_string(i) + pad)).ok());
  }
  reader.join();
}

// A client that never reads, next to one that does: the stuck one loses its oldest messages
// (counted, and told when it reads again), the server's buffer for it stays bounded, and the
// other client gets every message.
TEST_F(WebSocket, SlowClientDropsOldestWithoutSlowingOthers) {
  constexpr std::size_t kMax = 64 * 1024;
  start(WebSocketOptions().max_outbound_bytes(kMax).slow_client(SlowClient::kDropOldest));
  ws_test::Client stuck(http->port(), {.receive_buffer = 4096});
  ws_test::Client good(http->port());
  subscribe(stuck, "test.ws.news");
  subscribe(good, "test.ws.news");
  const std::string pad(1000, 'x');
  // Far more than the kernel's socket buffers hold: the server's own buffer must fill.
  constexpr int kCount = 20'000;
  publish_to_reader(bus, good, kCount, pad);
  ASSERT_TRUE(bus_test::eventually([&] { return http->websocket_stats().dropped > 0; }));
  bus::http::WebSocketStats s = http->websocket_stats();
  EXPECT_EQ(s.closed_slow, 0u);
  EXPECT_LE(s.queued_bytes, kMax);  // the stuck client's buffer; the good one's is empty
  EXPECT_EQ(s.connections_open, 2u);
  // The stuck client reads again: notices say how many it lost, and the newest messages came.
  uint64_t notified = 0;
  int received = 0;
  std::string last;
  while (received + notified < static_cast<uint64_t>(kCount)) {
    auto m = stuck.next_json();
    ASSERT_TRUE(m) << stuck.error();
    if (field(*m, "op") == R"("dropped")") {
      notified += std::stoull(field(*m, "count"));
    } else {
      ++received;
      last = field(*m, "body");
    }
  }
  EXPECT_EQ(notified, s.dropped);
  EXPECT_EQ(last, tag_json(std::to_string(kCount - 1) + pad));  // the newest survived
}

TEST_F(WebSocket, SlowClientIsClosedUnderTheClosePolicy) {
  start(WebSocketOptions().max_outbound_bytes(32 * 1024).slow_client(SlowClient::kClose));
  ws_test::Client stuck(http->port(), {.receive_buffer = 4096});
  ws_test::Client good(http->port());
  subscribe(stuck, "test.ws.news");
  subscribe(good, "test.ws.news");
  publish_to_reader(bus, good, 20'000, std::string(1000, 'y'));
  ASSERT_TRUE(bus_test::eventually([&] { return http->websocket_stats().closed_slow == 1; }));
  // The stuck client finds the close (1008, policy) after what was already on its way.
  while (stuck.read()) {
  }
  EXPECT_EQ(stuck.close_code(), 1008) << stuck.error();
  EXPECT_EQ(http->websocket_stats().dropped, 0u);
  EXPECT_TRUE(bus_test::eventually([&] { return http->websocket_stats().connections_open == 1; }));
}

TEST_F(WebSocket, OversizedClientFrameClosesTheConnection) {
  start(WebSocketOptions().max_frame_bytes(1024));
  ws_test::Client c(http->port());
  c.send_text(R"({"op":"pub","channel":"test.ws.news","body":{"tag":")" + std::string(2000, 'z') +
              R"("}})");
  // Closed: with status 1009 (too big), or reset when the rest of the frame was still unread.
  EXPECT_FALSE(c.read());
  if (c.close_code() != 0) {
    EXPECT_EQ(c.close_code(), 1009) << c.error();
  }
  EXPECT_TRUE(bus_test::eventually([&] { return http->websocket_stats().connections_open == 0; }));
  EXPECT_EQ(http->websocket_stats().bad_frames, 1u);
}

TEST_F(WebSocket, IdleClientsArePingedAndSilentOnesClosed) {
  // Not much shorter: `alive` answers pings only while it reads, and it stops reading between
  // wait_for_pings() and subscribe() while the test waits for the silent one to go.
  start(WebSocketOptions().idle_timeout(1s));
  // A client that never reads never answers the pings: it is closed.
  ws_test::Client silent(http->port(), {.receive_buffer = 4096});
  // A client that reads answers them (Beast does) and stays, ping after ping.
  ws_test::Client alive(http->port());
  ASSERT_TRUE(alive.wait_for_pings(3)) << alive.error();
  ASSERT_TRUE(bus_test::eventually([&] { return http->websocket_stats().connections_open == 1; }));
  subscribe(alive, "test.ws.news");  // the one left is the one that answered
}

TEST_F(WebSocket, PlainGetIsUpgradeRequiredAndShutdownSaysGoingAway) {
  start();
  http_test::Connection plain(http->port());
  auto r = plain.request("GET", "/bus");
  EXPECT_EQ(r.status, 426u) << describe(r);
  EXPECT_TRUE(starts_with(r.body, error_prefix("upgrade_required"))) << r.body;
  ws_test::Client c(http->port());
  subscribe(c, "test.ws.news");
  http->shutdown();
  while (c.read()) {
  }
  EXPECT_EQ(c.close_code(), 1001) << c.error();  // going away
  http->wait();
}

}  // namespace
