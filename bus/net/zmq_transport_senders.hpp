// What the bridge sends through over ZeroMQ: the publisher (every subscriber at once) and a
// peer's request socket (its route). Shared by the transport's files; how they send is in
// zmq_transport_send.cpp.
#pragma once

#include <deque>
#include <memory>
#include <string_view>
#include <zmq.hpp>

#include "frames.hpp"
#include "zmq_transport.hpp"

namespace bus::net::detail {

// ---- the publisher: every ZeroMQ subscriber at once ----------------------------------------

class ZmqTransport::Publisher final : public Subscribers {
 public:
  explicit Publisher(ZmqTransport& t) : t_(t) {}

  bool offer(const OutFrame& f) override;
  void cut(const OutFrame& f) override;

 private:
  /// The frame's parts, made once however often it is offered (a refused send leaves them).
  Parts& parts_for(const OutFrame& f);
  ZmqTransport& t_;
  const OutFrame* pending_ = nullptr;
  Parts parts_;
};

// ---- a peer's request socket ---------------------------------------------------------------

class ZmqTransport::Route final : public PeerRoute {
 public:
  Route(ZmqTransport& t, std::unique_ptr<zmq::socket_t> d) : t_(t), dealer(std::move(d)) {}

  bool send(std::string_view channel, const EnvelopeFields& env, std::string_view payload,
            const bus::detail::MessageRef*) override;

  ZmqTransport& t_;
  std::unique_ptr<zmq::socket_t> dealer;  // requests and queue messages to it
  std::deque<Parts> backlog;              // what its full pipe did not take yet
};

}  // namespace bus::net::detail
