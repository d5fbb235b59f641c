// The greeting example's channels and service: the seeds' Quarkus service
// (GET /greeting/{name} -> "Hello {name}") and QBit service (GET /services/myservice/ping ->
// ["Hello World!"]), as bus endpoints that any process on the bus can serve.
#pragma once

#include <bus/schemas/greeting.capnp.h>

#include <bus/bus.hpp>
#include <bus/message.hpp>
#include <string>

namespace greeting_app {

using GreetingRequest = bus::Message<greeting::GreetingRequest>;
using Greeting = bus::Message<greeting::Greeting>;
using PingRequest = bus::Message<greeting::PingRequest>;
using PingReply = bus::Message<greeting::PingReply>;

// Fail rather than block when the service's ring is full: an HTTP I/O thread must not wait
// (the caller gets 503 and the request is counted as failed).
inline const bus::Endpoint<GreetingRequest, Greeting> greet{"greeting", bus::Overflow::kFail};
inline const bus::Endpoint<PingRequest, PingReply> ping{"myservice.ping", bus::Overflow::kFail};
// Every greeting the HTTP front answers, published for whoever watches (the web page, over the
// WebSocket bridge). Dropped rather than waited for when a subscriber's ring is full.
inline const bus::Topic<Greeting> greeted{"greeting.greeted", bus::Overflow::kDropNewest};

/// The service: stateless here, but pinned to an executor like any bus service.
struct GreetingService {
  uint64_t greeted = 0;

  Greeting hello(const GreetingRequest& req) {
    ++greeted;
    return bus::build<greeting::Greeting>([&](greeting::Greeting::Builder b) {
      b.setMessage(std::string("Hello ") + req->getName().cStr());
    });
  }
  PingReply on_ping(const PingRequest&) {
    return bus::build<greeting::PingReply>(
        [](greeting::PingReply::Builder b) { b.initGreetings(1).set(0, "Hello World!"); });
  }
};

}  // namespace greeting_app
