// StatsD export: datagrams received on a real local UDP socket and read line by line.
#include <gtest/gtest.h>

#include <bus/bus.hpp>
#include <bus/statsd.hpp>
#include <map>
#include <string>
#include <vector>

#include "support/test_support.hpp"
#include "support/udp_listener.hpp"

namespace {

using namespace std::chrono_literals;

inline const bus::Topic<int> ticks{"statsd_test.ticks"};

/// A UDP socket the exporter sends to.
struct Listener : bus_test::UdpListener {
  Listener() { EXPECT_TRUE(bound()); }
};

/// name -> "value|type[|@rate]" for every line of the datagrams.
std::map<std::string, std::string> lines(const std::vector<std::string>& datagrams) {
  std::map<std::string, std::string> out;
  for (const auto& d : datagrams) {
    std::size_t at = 0;
    while (at < d.size()) {
      std::size_t end = d.find('\n', at);
      if (end == std::string::npos) end = d.size();
      std::string line = d.substr(at, end - at);
      auto colon = line.find(':');
      EXPECT_NE(colon, std::string::npos) << line;
      out[line.substr(0, colon)] = line.substr(colon + 1);
      at = end + 1;
    }
  }
  return out;
}

TEST(Statsd, PushesChannelCountersAsDeltasAndDepthsAsGauges) {
  Listener udp;
  bus::Bus bus(bus::Options().executors(1));
  std::atomic<int> got{0};
  auto sub = bus.subscribe(ticks, [&](const int&) { got.fetch_add(1); });
  bus::StatsdExporter statsd(bus, bus::StatsdOptions().address(udp.address()).interval(1h));
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(bus.publish(ticks, i).ok());
  // The handlers ran; the executor counts a run of messages once it ends, and frees their ring
  // space after it: wait for those figures too.
  auto settled = [&](uint64_t delivered) {
    bus::Stats s = bus.stats();
    const bus::ChannelStats* c = s.channel("statsd_test.ticks");
    return c != nullptr && c->delivered == delivered && s.inboxes.at(0).depth_bytes == 0;
  };
  ASSERT_TRUE(bus_test::eventually([&] { return got.load() == 5 && settled(5); }));
  statsd.push();
  auto first = lines(udp.take());
  EXPECT_EQ(first["bus.channel.statsd_test.ticks.published"], "5|c");
  EXPECT_EQ(first["bus.channel.statsd_test.ticks.delivered"], "5|c");
  EXPECT_EQ(first.count("bus.channel.statsd_test.ticks.dropped"), 0u);  // zero deltas are not sent
  EXPECT_EQ(first["bus.executor.0.depth_bytes"], "0|g");
  EXPECT_EQ(first["bus.held_records"], "0|g");

  for (int i = 0; i < 3; ++i) ASSERT_TRUE(bus.publish(ticks, i).ok());
  ASSERT_TRUE(bus_test::eventually([&] { return got.load() == 8 && settled(8); }));
  statsd.push();
  auto second = lines(udp.take());
  EXPECT_EQ(second["bus.channel.statsd_test.ticks.published"], "3|c");  // the delta
  auto st = statsd.stats();
  EXPECT_EQ(st.pushes, 2u);
  EXPECT_GE(st.datagrams, 2u);
  EXPECT_EQ(st.send_errors, 0u);
}

TEST(Statsd, SourcesAddTheirOwnFiguresWithNamesMadeSafe) {
  Listener udp;
  bus::Bus bus(bus::Options().executors(1));
  bus::StatsdExporter statsd(
      bus, bus::StatsdOptions().address(udp.address()).interval(1h).prefix("svc"));
  uint64_t requests = 0, latency_count = 0;
  double latency_sum = 0;
  statsd.add_source([&](bus::StatsdSink& out) {
    out.counter("http.requests.GET /x:y", requests);
    out.gauge("queue depth", 12.5);
    out.timing("http.latency", latency_count, latency_sum);
  });
  requests = 4;
  latency_count = 4;
  latency_sum = 10;  // ms: a mean of 2.5 over 4 requests
  statsd.push();
  auto l = lines(udp.take());
  EXPECT_EQ(l["svc.http.requests.GET__x_y"], "4|c");
  EXPECT_EQ(l["svc.queue_depth"], "12.5|g");
  EXPECT_EQ(l["svc.http.latency"], "2.500|ms|@0.25");
  latency_count = 5;
  latency_sum = 11;
  statsd.push();
  l = lines(udp.take());
  EXPECT_EQ(l["svc.http.latency"], "1.000|ms");  // one sample: no rate
  EXPECT_EQ(l.count("svc.http.requests.GET__x_y"), 0u);
}

TEST(Statsd, ManyLinesAreSplitIntoDatagramsUnderTheSizeLimit) {
  Listener udp;
  bus::Bus bus(bus::Options().executors(1));
  bus::StatsdExporter statsd(
      bus, bus::StatsdOptions().address(udp.address()).interval(1h).max_packet(200));
  statsd.add_source([](bus::StatsdSink& out) {
    for (int i = 0; i < 100; ++i) out.gauge("g" + std::to_string(i), i);
  });
  statsd.push();
  auto datagrams = udp.take();
  EXPECT_GT(datagrams.size(), 5u);
  for (const auto& d : datagrams) EXPECT_LE(d.size(), 200u);
  auto l = lines(datagrams);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(l["bus.g" + std::to_string(i)], std::to_string(i) + "|g");
}

TEST(Statsd, TheExportersOwnThreadPushesAtTheInterval) {
  Listener udp;
  bus::Bus bus(bus::Options().executors(1));
  bus::StatsdExporter statsd(bus, bus::StatsdOptions().address(udp.address()).interval(10ms));
  std::string d = udp.wait_one();  // blocks until the exporter's thread sends
  EXPECT_NE(d.find("bus.held_records:0|g"), std::string::npos) << d;
}

TEST(Statsd, NoListenerCostsACounterNotAnError) {
  int port;
  {
    Listener gone;  // a port that was free a moment ago, now closed
    port = std::stoi(gone.address().substr(10));
  }
  bus::Bus bus(bus::Options().executors(1));
  bus::StatsdExporter statsd(
      bus, bus::StatsdOptions().address("127.0.0.1:" + std::to_string(port)).interval(1h));
  for (int i = 0; i < 3; ++i) statsd.push();  // the ICMP refusal of one shows on a later send
  auto st = statsd.stats();
  EXPECT_EQ(st.pushes, 3u);
  EXPECT_EQ(st.datagrams + st.send_errors, 3u);
}

TEST(Statsd, RefusesABadAddress) {
  bus::Bus bus(bus::Options().executors(1));
  EXPECT_THROW(bus::StatsdOptions().address("nope"), std::invalid_argument);
  EXPECT_THROW(bus::StatsdOptions().address("127.0.0.1:99999"), std::invalid_argument);
  EXPECT_THROW(
      bus::StatsdExporter(bus, bus::StatsdOptions().address("127.0.0.1:8125").interval(0ms)),
      std::invalid_argument);
}

}  // namespace
