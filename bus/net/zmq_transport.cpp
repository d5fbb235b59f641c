#include "zmq_transport.hpp"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "bus/detail/pool.hpp"

namespace bus::net::detail {

namespace {

// Frames read from the subscriber socket after a peer's last one, past which its silence is its
// own even while more input waits: ZeroMQ's SUB takes one message from each peer's pipe in turn
// (and notices a pipe that filled again within about 100 reads), so a peer with anything queued
// would have been read by then.
constexpr uint64_t kFairFrames = 512;

#if defined(__SANITIZE_THREAD__)
#define BUS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define BUS_TSAN 1
#endif
#endif
#if defined(BUS_TSAN)
// ZeroMQ hands frames to its I/O thread through pipes TSan cannot see (tests/tsan.supp): a
// pooled buffer freed there and reused here would be reported as a race. Under TSan, frames are
// ZeroMQ's own copies (allocated and freed inside libzmq, which the suppressions cover).
constexpr std::size_t kPooledFrame = std::numeric_limits<std::size_t>::max();
#else
constexpr std::size_t kPooledFrame = 256;
#endif

zmq::message_t frame(std::string_view bytes) {
  // Small frames: ZeroMQ keeps them inside the message itself.
  if (bytes.size() < kPooledFrame) return zmq::message_t(bytes.data(), bytes.size());
  // The rest: a pooled buffer that ZeroMQ's I/O thread frees once sent, so the buffers cycle
  // between the two threads instead of growing and trimming the heap (see bus/detail/pool.hpp).
  void* p = bus::detail::pool_alloc(bytes.size());
  std::memcpy(p, bytes.data(), bytes.size());
  return zmq::message_t(
      p, bytes.size(),
      [](void* data, void* size) {
        bus::detail::pool_free(data, reinterpret_cast<std::size_t>(size));
      },
      reinterpret_cast<void*>(bytes.size()));
}

std::string z85(const void* key32) {
  char out[41];
  zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32);
  return out;
}

}  // namespace

bool recv(zmq::socket_t& s, Parts& parts, std::size_t max_parts) {
  parts.clear();
  zmq::message_t m;
  if (!s.recv(m, zmq::recv_flags::dontwait)) return false;
  bool more = m.more();
  parts.push_back(std::move(m));
  // No bus message has more than 4 parts (identity, channel, envelope, payloads): keep at most
  // `max_parts` so a peer cannot make us hold an unbounded list; the caller rejects the rest.
  while (more) {
    zmq::message_t next;
    if (!s.recv(next, zmq::recv_flags::none)) break;  // the rest of a multipart is already here
    more = next.more();
    if (parts.size() < max_parts) parts.push_back(std::move(next));
  }
  return true;
}

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

// ---- the publisher: every ZeroMQ subscriber at once ----------------------------------------

class ZmqTransport::Publisher final : public Subscribers {
 public:
  explicit Publisher(ZmqTransport& t) : t_(t) {}

  bool offer(const OutFrame& f) override {
    // NODROP: a full subscriber queue refuses the frame for everyone (ZeroMQ cannot tell which
    // subscriber is full), which holds the frame back: the back-pressure that keeps a
    // subscriber that is only a little slower, or pauses briefly, from losing anything.
    Parts& parts = parts_for(f);
    if (!t_.send_all(*t_.xpub_, parts)) return false;
    pending_ = nullptr;
    return true;
  }

  void cut(const OutFrame& f) override {
    t_.sink_.log_once("cut", absl::StrCat("a subscriber's queue stayed full for ",
                                          t_.opt_.send_stall_limit().count(),
                                          " ms: sending on without it (it counts what it misses)"));
    // Without NODROP, ZeroMQ writes the frame to every subscriber with room and skips a full
    // one. It then leaves that one out of every send, NODROP or not, until half of its queue is
    // read: a stopped subscriber is passed over from now on, while the others still hold the
    // publisher back when they are full (and are waited for, up to the limit).
    Parts& parts = parts_for(f);
    t_.xpub_->set(zmq::sockopt::xpub_nodrop, 0);
    (void)t_.send_all(*t_.xpub_, parts);  // never refused without NODROP
    t_.xpub_->set(zmq::sockopt::xpub_nodrop, 1);
    pending_ = nullptr;
  }

 private:
  /// The frame's parts, made once however often it is offered (a refused send leaves them).
  Parts& parts_for(const OutFrame& f) {
    if (pending_ != &f || parts_.size() != 3) {
      parts_.clear();
      parts_.emplace_back(f.channel.data(), f.channel.size());
      parts_.emplace_back(f.envelope.data(), f.envelope.size());
      parts_.push_back(frame(f.payload_view()));
      pending_ = &f;
    }
    return parts_;
  }
  ZmqTransport& t_;
  const OutFrame* pending_ = nullptr;
  Parts parts_;
};

// ---- a peer's request socket ---------------------------------------------------------------

class ZmqTransport::Route final : public PeerRoute {
 public:
  Route(ZmqTransport& t, std::unique_ptr<zmq::socket_t> d) : t_(t), dealer(std::move(d)) {}

  bool send(std::string_view channel, const EnvelopeFields& env, std::string_view payload,
            const bus::detail::MessageRef*) override {
    std::string e = encode_envelope(env);
    if (backlog.empty()) {
      t_.touched(dealer->handle());
      // As send_all(): only the first part can be refused.
      if (dealer->send(zmq::buffer(channel),
                       zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        dealer->send(zmq::buffer(e), zmq::send_flags::sndmore);
        dealer->send(frame(payload), zmq::send_flags::none);
        return true;
      }
    }
    // The pipe to it is full (its high-water mark): keep the message, in order, until it
    // drains. Bounded; while any peer holds a long backlog the node stops taking local input.
    if (backlog.size() >= kMaxPeerBacklog) return false;
    Parts parts;
    parts.emplace_back(channel.data(), channel.size());
    parts.emplace_back(e.data(), e.size());
    parts.push_back(frame(payload));
    backlog.push_back(std::move(parts));
    ++t_.backlogged_;
    return true;
  }

  ZmqTransport& t_;
  std::unique_ptr<zmq::socket_t> dealer;  // requests and queue messages to it
  std::deque<Parts> backlog;              // what its full pipe did not take yet
};

// ---- lifecycle -----------------------------------------------------------------------------

ZmqTransport::ZmqTransport(const NodeOptions& options, uint64_t node_id, FrameSink& sink)
    : opt_(options), id_(node_id), sink_(sink), publisher_(std::make_unique<Publisher>(*this)) {}

ZmqTransport::~ZmqTransport() = default;

Subscribers& ZmqTransport::publisher() { return *publisher_; }

void ZmqTransport::start() {
  auto bind = [](zmq::socket_t& s, const std::string& endpoint, const char* what) {
    try {
      s.bind(endpoint);
    } catch (const zmq::error_t& e) {
      throw std::runtime_error(absl::StrCat("bus.net: cannot bind the ", what, " socket to ",
                                            endpoint, ": ", e.what(),
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
  publish_endpoint_ = bind(*xpub_, opt_.publish_on(), "publisher");

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
    request_endpoint_ = opt_.advertise().empty() ? bound : opt_.advertise();
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
          absl::StrCat("bus.net: CURVE is on but peer ", p.endpoint,
                       " has no public key: give it as NodeOptions::peer(endpoint, public_key)"));
    }
    if (!allowed(p.public_key)) {
      // The allowlist holds both ways: a peer we would not let in, we do not listen to either.
      ++sink_.counters().auth_denied;
      sink_.log_once(absl::StrCat("peer-key:", p.public_key),
                     absl::StrCat("not listening to peer ", p.endpoint, ": its key '", p.public_key,
                                  "' is not in the allowlist"));
      return;
    }
    sub_->set(zmq::sockopt::curve_serverkey, p.public_key);
  }
  touched(sub_->handle());
  try {
    sub_->connect(p.endpoint);
  } catch (const zmq::error_t& e) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: bad peer endpoint ", p.endpoint, ": ", e.what()));
  }
  listened_[p.endpoint] = p.public_key;
}

void ZmqTransport::unlisten(const std::string& endpoint) {
  listened_.erase(endpoint);
  try {
    sub_->disconnect(endpoint);
  } catch (const zmq::error_t&) {
    // Never connected (refused by the allowlist, or not listened to): nothing to undo.
  }
  touched(sub_->handle());
}

bool ZmqTransport::relisten(const std::string& endpoint) {
  auto it = listened_.find(endpoint);
  if (it == listened_.end()) return false;
  const Peer p{endpoint, it->second};
  // zmq_disconnect ends the session, its pipe and its engine together: the new connection gets
  // a session of its own. (A reconnect inside one session after the engine failed while the
  // pipe was full is what aborts libzmq 4.3.4: see subscriber_timeout.) listen() cannot refuse
  // what it took before: same endpoint, same key.
  unlisten(endpoint);
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

// ---- sending -------------------------------------------------------------------------------

// ZeroMQ queues a multipart message atomically: once the first part is accepted, the others are
// too (they go to the same pipe), so only the first send can say EAGAIN (false here). A ROUTER
// with MANDATORY throws EHOSTUNREACH on the first part for a requester that is gone.
bool ZmqTransport::send_all(zmq::socket_t& s, Parts& parts) {
  touched(s.handle());
  if (!s.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    s.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return true;
}

PeerRoute* ZmqTransport::open_route(uint64_t peer, const std::string& name,
                                    const std::string& endpoint, const std::string& public_key) {
  auto dealer = make_dealer(ctx_, opt_, public_key);
  touched(dealer->handle());
  try {
    dealer->connect(endpoint);
  } catch (const zmq::error_t& e) {
    sink_.log_once(
        absl::StrCat("connect:", endpoint),
        absl::StrCat("cannot connect to node '", name, "' at ", endpoint, ": ", e.what()));
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

void ZmqTransport::reply(const std::string& identity, std::string_view channel,
                         const std::string& envelope, std::string_view payload,
                         std::size_t replies) {
  if (!router_) return;  // closed
  if (reply_backlog_.size() >= kMaxPeerBacklog) {
    sink_.counters().unroutable_replies += replies;
    return;
  }
  Parts parts;
  parts.emplace_back(identity.data(), identity.size());
  parts.emplace_back(channel.data(), channel.size());
  parts.emplace_back(envelope.data(), envelope.size());
  parts.push_back(frame(payload));
  // In order behind what is waiting already; the ROUTER takes it when the requester's pipe has
  // room (its high-water mark: the requester is not reading as fast as it asks).
  ++sink_.counters().reply_frames;
  reply_backlog_.push_back({std::move(parts), replies});
  flush_replies();
}

void ZmqTransport::flush_replies() {
  while (!reply_backlog_.empty()) {
    try {
      // EAGAIN: that requester's pipe is full; keep the order, retry later.
      if (!send_all(*router_, reply_backlog_.front().first)) return;
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH (ROUTER_MANDATORY): the requester disconnected.
      sink_.counters().unroutable_replies += reply_backlog_.front().second;
    }
    reply_backlog_.pop_front();
  }
}

void ZmqTransport::flush() {
  if (backlogged_ > 0) {
    for (auto& [id, r] : routes_) {
      while (!r->backlog.empty()) {
        if (!send_all(*r->dealer, r->backlog.front())) break;
        r->backlog.pop_front();
        --backlogged_;
      }
    }
  }
  if (!reply_backlog_.empty()) flush_replies();
}

std::size_t ZmqTransport::subscribers(std::string_view topic) const {
  auto it = subscribers_.find(absl::string_view(topic.data(), topic.size()));
  return it == subscribers_.end() ? 0 : it->second;
}

// ---- the loop ------------------------------------------------------------------------------

bool ZmqTransport::prepare(PollSet& set) {
  // Polled on their ZMQ_FD with poll(2), not zmq_poll(): zmq_poll asks every ZeroMQ socket for
  // its events (a poll() and a getpid() each, twice when it waits) on every pass. A ZMQ_FD says
  // only that the socket has commands to process, which a send, a connect or asking for its
  // events also does: so a socket is read when its fd says so until a read finds it empty, and
  // one touched since is asked for its events before the loop waits.
  std::vector<zmq::socket_t*> sockets;  // by index - at_xpub_
  std::vector<bool> wants_room;         // by index - at_xpub_: a dealer holding a backlog
  auto watch = [&](zmq::socket_t& s, bool room = false) {
    std::size_t at = set.add(s.get(zmq::sockopt::fd), POLLIN);
    sockets.push_back(&s);
    wants_room.push_back(room);
    return at;
  };
  // XPUB: only subscriptions. It says POLLOUT even while a NODROP pipe is full (its
  // distributor always "has out"): room for a held frame comes as a command on its ZMQ_FD (a
  // subscriber's pipe read down to half), and a stall is retried when that fires, just before
  // the loop waits, and on the poll timeout (1 ms) at the latest.
  at_xpub_ = watch(*xpub_);
  at_sub_ = watch(*sub_);
  at_router_ = watch(*router_);
  at_zap_ = zap_ ? watch(*zap_) : 0;
  at_dealers_ = set.fds.size();
  dealers_.clear();
  for (auto& [id, r] : routes_) {
    dealers_.push_back(id);
    // A dealer holding a backlog is asked for room on every pass.
    const bool room = !r->backlog.empty();
    watch(*r->dealer, room);
    if (room) touched(r->dealer->handle());
  }
  // Requests wait in the ROUTER while replies wait for room (back-pressure on requesters): it
  // is asked on every pass, but what it holds does not keep the loop from waiting.
  router_held_ = reply_backlog_.size() >= kPauseBacklog;
  if (router_held_) touched(router_->handle());

  ready_.assign(sockets.size(), false);
  bool has_input = false;
  for (std::size_t i = 0; i < sockets.size() && (ask_all_ || !touched_.empty()); ++i) {
    zmq::socket_t& s = *sockets[i];
    if (!ask_all_ && std::find(touched_.begin(), touched_.end(), s.handle()) == touched_.end()) {
      continue;
    }
    const int events = s.get(zmq::sockopt::events);
    const bool in = (events & ZMQ_POLLIN) != 0;
    ready_[i] = in;
    if ((in && !(&s == &*router_ && router_held_)) ||
        (wants_room[i] && (events & ZMQ_POLLOUT) != 0)) {
      has_input = true;
    }
  }
  touched_.clear();
  ask_all_ = false;
  return has_input;
}

void ZmqTransport::read_traffic(const PollSet& set) {
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    if (set.fds[at_xpub_ + i].revents != 0) ready_[i] = true;
  }
  // Only sockets with input, and at most kReadBudget messages and frames from each: one left
  // before it was empty is asked again before the next poll.
  auto read = [&](zmq::socket_t& s, auto&& next, auto&& on) {
    void* handle = s.handle();  // reading may forget a peer and close its dealer
    std::size_t start = sink_.messages_read();
    for (std::size_t frames = 0;; ++frames) {
      if (frames == kReadBudget || sink_.messages_read() - start >= kReadBudget) {
        touched(handle);  // not read to the end: asked again before the next poll
        return;
      }
      if (!next()) return;
      on();
    }
  };
  if (ready_[at_sub_ - at_xpub_]) {
    read(
        *sub_, [&] { return recv(*sub_, parts_); }, [&] { on_sub(parts_); });
  }
  if (ready_[at_router_ - at_xpub_]) {
    read(
        *router_,
        [&] {
          if (reply_backlog_.size() < kPauseBacklog) return recv(*router_, parts_, 5);
          touched(router_->handle());
          return false;
        },
        [&] { on_router(parts_); });
  }
  for (std::size_t d = 0; d < dealers_.size(); ++d) {
    if (!ready_[at_dealers_ - at_xpub_ + d]) continue;
    // Reading may add or forget peers (and close their dealers): look the route up again
    // before each read.
    auto it = routes_.find(dealers_[d]);
    if (it == routes_.end()) continue;
    zmq::socket_t& dealer = *it->second->dealer;
    read(
        dealer,
        [&] {
          auto r = routes_.find(dealers_[d]);
          return r != routes_.end() && r->second->dealer.get() == &dealer && recv(dealer, parts_);
        },
        [&] { on_dealer(parts_); });
  }
}

void ZmqTransport::read_control(const PollSet&) {
  if (ready_[0]) {
    std::size_t i = 0;
    for (zmq::message_t m; i < kReadBudget && xpub_->recv(m, zmq::recv_flags::dontwait); ++i) {
      on_xpub(m);
    }
    if (i == kReadBudget) touched(xpub_->handle());
  }
  if (zap_ && ready_[at_zap_ - at_xpub_]) on_zap();  // reads until ZAP's socket is empty
}

void ZmqTransport::read_topics_for(std::chrono::milliseconds bound) {
  zmq::pollitem_t item{sub_->handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, bound);
  while (recv(*sub_, parts_)) on_sub(parts_);
}

// ---- incoming ------------------------------------------------------------------------------

void ZmqTransport::on_sub(Parts& parts) {
  if (parts.size() != 3) {
    return sink_.on_malformed(
        "subscriber", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  }
  sink_.on_frame(frame_of(parts, 0, Stream::kTopics));
}

void ZmqTransport::on_router(Parts& parts) {
  if (parts.size() != 4) {
    return sink_.on_malformed(
        "request", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 4")));
  }
  InFrame f = frame_of(parts, 1, Stream::kRequests);
  f.reply_to.identity = std::string(view(parts[0]));
  sink_.on_frame(f);
}

void ZmqTransport::on_dealer(Parts& parts) {
  if (parts.size() != 3) {
    return sink_.on_malformed(
        "reply", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  }
  sink_.on_frame(frame_of(parts, 0, Stream::kReplies));
}

void ZmqTransport::on_xpub(const zmq::message_t& m) {
  if (m.size() < 1) return;
  const char* d = static_cast<const char*>(m.data());
  std::string topic(d + 1, m.size() - 1);
  if (d[0] == 1) {
    ++subscribers_[topic];
    sink_.on_subscription(topic, true, false);
  } else if (d[0] == 0) {
    auto it = subscribers_.find(topic);
    if (it != subscribers_.end() && --it->second == 0) subscribers_.erase(it);
    sink_.on_subscription(topic, false, false);
  }
}

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
