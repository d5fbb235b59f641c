// The ZeroMQ transport's sockets: made and bound, connected to the publishers listened to and
// to peers' request sockets, and who may connect (CURVE's ZAP handler). Sending:
// zmq_transport_send.cpp; polling and reading: zmq_transport_receive.cpp.
#include "zmq_transport.hpp"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <stdexcept>

#include "zmq_transport_senders.hpp"

namespace bus::net::detail {

namespace {

// Frames read from the subscriber socket after a peer's last one, past which its silence is its
// own even while more input waits: ZeroMQ's SUB takes one message from each peer's pipe in turn
// (and notices a pipe that filled again within about 100 reads), so a peer with anything queued
// would have been read by then.
constexpr uint64_t kFairFrames = 512;

std::string z85(const void* key32) {
  char out[41];
  zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32);
  return out;
}

}  // namespace

std::unique_ptr<zmq::socket_t> make_dealer(zmq::context_t& ctx, const NodeOptions& opt,
                                           const std::string& server_key) {
  auto d = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::dealer);
  d->set(zmq::sockopt::linger, 0);
  d->set(zmq::sockopt::connect_timeout, static_cast<int>(opt.connect_timeout().count()));
  d->set(zmq::sockopt::sndhwm, kPipeHwm);
  d->set(zmq::sockopt::rcvhwm, kPipeHwm);
  d->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(opt.largest_message()) * 4 + (1 << 20));
  if (opt.secure()) {
    d->set(zmq::sockopt::curve_publickey, opt.curve_keys().public_key);
    d->set(zmq::sockopt::curve_secretkey, opt.curve_keys().secret_key);
    d->set(zmq::sockopt::curve_serverkey, server_key);
  }
  return d;
}

// ---- lifecycle -----------------------------------------------------------------------------

ZmqTransport::ZmqTransport(const NodeOptions& options, uint64_t node_id, FrameSink& sink)
    : opt_(options), id_(node_id), sink_(sink), publisher_(std::make_unique<Publisher>(*this)) {}

ZmqTransport::~ZmqTransport() = default;

Subscribers& ZmqTransport::publisher() { return *publisher_; }

void ZmqTransport::start() {
  auto bind = [](zmq::socket_t& s, const std::string& address, const char* what) {
    try {
      s.bind(address);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error(absl::StrCat("bus.net: cannot bind the ", what, " socket to ",
                                            address, ": ", e.what(),
                                            " (is the address in use or malformed?)"));
    }
    return s.get(zmq::sockopt::last_endpoint);
  };
  if (opt_.secure()) {
    // The ZAP handler must be bound before any socket that uses it.
    zap_.emplace(ctx_, zmq::socket_type::rep);
    zap_->bind("inproc://zeromq.zap.01");
  }
  auto server = [this](zmq::socket_t& s) {
    if (!opt_.secure()) return;
    s.set(zmq::sockopt::curve_server, 1);
    s.set(zmq::sockopt::curve_secretkey, opt_.curve_keys().secret_key);
    s.set(zmq::sockopt::zap_domain, "bus");
  };
  xpub_.emplace(ctx_, zmq::socket_type::xpub);
  // NODROP: at the high-water mark send() says EAGAIN instead of dropping silently (the publish
  // gate holds the frame); VERBOSER: every (un)subscription is reported, so subscribers are
  // counted.
  xpub_->set(zmq::sockopt::xpub_nodrop, 1);
  xpub_->set(zmq::sockopt::xpub_verboser, 1);
  xpub_->set(zmq::sockopt::linger, kLingerMs);
  // Each subscriber's queue (frames): what it may fall behind by before it counts as full.
  // Small, so that a subscriber that merely reads slower than we publish gets room back often
  // (ZeroMQ reopens a full pipe once half of it was read): its waits stay far below
  // send_stall_limit and it is not cut; one that stops reading is.
  xpub_->set(zmq::sockopt::sndhwm, opt_.subscription_queue());
  if (auto timeout = opt_.subscriber_timeout(); timeout.count() > 0) {
    // ZMTP heartbeats: ZeroMQ pings each subscriber and closes a connection that stays silent
    // (a process stopped, a host gone), which frees its queue. A live subscriber's ZeroMQ
    // answers by itself, whatever its program is doing, as long as it reads its socket.
    // A ping every half timeout: a connection is closed after between one and one and a half
    // timeouts of silence. Pings are per connection, each on its own timer: every one wakes
    // ZeroMQ's I/O threads at both ends, the larger part of an idle node's wake-ups once its
    // heartbeats come together (Bridge::next_beat), so they are as few as the timeout allows.
    xpub_->set(zmq::sockopt::heartbeat_ivl,
               static_cast<int>(std::max<long>(timeout.count() / 2, 1)));
    xpub_->set(zmq::sockopt::heartbeat_timeout, static_cast<int>(timeout.count()));
  }
  server(*xpub_);
  publish_address_ = bind(*xpub_, opt_.publish_on(), "publisher");

  router_.emplace(ctx_, zmq::socket_type::router);
  // Without MANDATORY a reply to a requester that went away is dropped silently.
  router_->set(zmq::sockopt::router_mandatory, 1);
  // Room for a pipelining requester's whole window (1,000 requests in flight and more).
  router_->set(zmq::sockopt::sndhwm, kPipeHwm);
  router_->set(zmq::sockopt::rcvhwm, kPipeHwm);
  router_->set(zmq::sockopt::linger, kLingerMs);
  router_->set(zmq::sockopt::maxmsgsize,
               static_cast<int64_t>(opt_.largest_message()) * 4 + (1 << 20));
  server(*router_);
  if (!opt_.requests_on().empty()) {
    std::string bound = bind(*router_, opt_.requests_on(), "request");
    request_address_ = opt_.advertise().empty() ? bound : opt_.advertise();
  }

  sub_.emplace(ctx_, zmq::socket_type::sub);
  sub_->set(zmq::sockopt::linger, 0);
  // See NodeOptions::connect_timeout: what brings a peer back soon after a partition.
  sub_->set(zmq::sockopt::connect_timeout, static_cast<int>(opt_.connect_timeout().count()));
  // Per publisher: a reader that falls behind works through a short queue (then the socket
  // buffers, then the publisher's queue for it), not seconds of stale frames.
  sub_->set(zmq::sockopt::rcvhwm, opt_.subscription_queue());
  sub_->set(
      zmq::sockopt::maxmsgsize,
      static_cast<int64_t>(std::max<std::size_t>(opt_.largest_message(), kMaxBatchBytes)) * 4 +
          (1 << 20));
  sub_->set(zmq::sockopt::subscribe, kHeartbeatTopic);
  if (opt_.secure()) {
    sub_->set(zmq::sockopt::curve_publickey, opt_.curve_keys().public_key);
    sub_->set(zmq::sockopt::curve_secretkey, opt_.curve_keys().secret_key);
  }
}

void ZmqTransport::close() {
  if (router_) flush_replies();
  routes_.clear();  // closes the dealers
  sub_.reset();
  router_.reset();
  xpub_.reset();
  zap_.reset();
  ctx_.close();  // waits up to the linger for queued messages to leave
}

// ---- listening -----------------------------------------------------------------------------

void ZmqTransport::listen(const Peer& p) {
  if (opt_.secure()) {
    if (p.public_key.empty()) {
      throw std::invalid_argument(
          absl::StrCat("bus.net: CURVE is on but peer ", p.address,
                       " has no public key: give it as NodeOptions::peer(address, public_key)"));
    }
    if (!allowed(p.public_key)) {
      // The allowlist holds both ways: a peer we would not let in, we do not listen to either.
      ++sink_.counters().auth_denied;
      sink_.log_once(absl::StrCat("peer-key:", p.public_key),
                     absl::StrCat("not listening to peer ", p.address, ": its key '", p.public_key,
                                  "' is not in the allowlist"));
      return;
    }
    sub_->set(zmq::sockopt::curve_serverkey, p.public_key);
  }
  touched(sub_->handle());
  try {
    sub_->connect(p.address);
  } catch (const zmq::error_t& e) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: bad peer address ", p.address, ": ", e.what()));
  }
  listened_[p.address] = p.public_key;
}

void ZmqTransport::unlisten(const std::string& address) {
  listened_.erase(address);
  try {
    sub_->disconnect(address);
  } catch (const zmq::error_t&) {
    // Never connected (refused by the allowlist, or not listened to): nothing to undo.
  }
  touched(sub_->handle());
}

bool ZmqTransport::relisten(const std::string& address) {
  auto it = listened_.find(address);
  if (it == listened_.end()) return false;
  const Peer p{address, it->second};
  // zmq_disconnect ends the session, its pipe and its engine together: the new connection gets
  // a session of its own. (A reconnect inside one session after the engine failed while the
  // pipe was full is what aborts libzmq 4.3.4: see subscriber_timeout.) listen() cannot refuse
  // what it took before: same address, same key.
  unlisten(address);
  listen(p);
  return true;
}

void ZmqTransport::filter(const std::string& prefix, bool on) {
  touched(sub_->handle());
  if (on) {
    sub_->set(zmq::sockopt::subscribe, prefix);
  } else {
    sub_->set(zmq::sockopt::unsubscribe, prefix);
  }
}

bool ZmqTransport::behind() {
  touched(sub_->handle());
  return (sub_->get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
}

bool ZmqTransport::input_waiting(const PeerState& p, bool behind, uint64_t topic_frames) {
  return behind && topic_frames - p.frames_at_seen < kFairFrames;
}

// ---- routes to peers' request sockets -------------------------------------------------------

PeerRoute* ZmqTransport::open_route(uint64_t peer, const std::string& name,
                                    const std::string& address, const std::string& public_key) {
  auto dealer = make_dealer(ctx_, opt_, public_key);
  touched(dealer->handle());
  try {
    dealer->connect(address);
  } catch (const zmq::error_t& e) {
    sink_.log_once(
        absl::StrCat("connect:", address),
        absl::StrCat("cannot connect to node '", name, "' at ", address, ": ", e.what()));
    return nullptr;
  }
  auto& r = routes_[peer];
  r = std::make_unique<Route>(*this, std::move(dealer));
  return r.get();
}

PeerRoute* ZmqTransport::route(uint64_t peer) {
  auto it = routes_.find(peer);
  return it == routes_.end() ? nullptr : it->second.get();
}

void ZmqTransport::close_route(uint64_t peer) {
  auto it = routes_.find(peer);
  if (it == routes_.end()) return;
  if (!it->second->backlog.empty()) {
    // Queue messages and requests that never left: the requests fail (the bridge fails what was
    // in flight to the peer); count the rest.
    backlogged_ -= it->second->backlog.size();
    sink_.counters().send_refused += it->second->backlog.size();
  }
  routes_.erase(it);
}

// ---- CURVE: who may connect ------------------------------------------------------------------

void ZmqTransport::on_zap() {
  // ZAP (RFC 27): version, request id, domain, address, identity, mechanism, credentials.
  for (;;) {
    Parts parts;
    if (!recv(*zap_, parts, 8)) return;
    std::string status = "400", text = "not allowed";
    std::string key;
    if (parts.size() >= 7 && view(parts[5]) == "CURVE" && parts[6].size() == 32) {
      key = z85(parts[6].data());
      if (allowed(key)) {
        status = "200";
        text = "OK";
      }
    }
    if (status != "200") {
      ++sink_.counters().auth_denied;
      sink_.log_once(absl::StrCat("zap:", key), absl::StrCat("refused a connection from key '", key,
                                                             "': not in the allowlist"));
    }
    std::string request_id = parts.size() > 1 ? std::string(view(parts[1])) : "";
    zap_->send(zmq::buffer(std::string_view("1.0")), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(request_id), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(status), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(text), zmq::send_flags::sndmore);
    zap_->send(zmq::buffer(key), zmq::send_flags::sndmore);
    zap_->send(zmq::message_t(), zmq::send_flags::none);
  }
}

bool ZmqTransport::allowed(const std::string& key) const {
  return std::find(opt_.allow().begin(), opt_.allow().end(), key) != opt_.allow().end();
}

}  // namespace bus::net::detail
