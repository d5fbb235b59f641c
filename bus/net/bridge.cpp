#include "bridge.hpp"

#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdio>
#include <random>
#include <stdexcept>

namespace bus::net::detail {
namespace {

using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// A topic batch is handed to ZeroMQ once it reaches this size (or when the drain that filled
// it ends): one frame carries many messages, which is what beats one-message-per-frame ZeroMQ.
constexpr std::size_t kMaxBatchBytes = 32 * 1024;
// Messages read from one socket before the loop looks at the others (fairness).
constexpr int kReadBudget = 256;
constexpr int kLingerMs = 1000;
// Messages kept per peer while its pipe is full, and the total at which local input pauses.
constexpr std::size_t kMaxPeerBacklog = 1 << 16;
constexpr std::size_t kPauseBacklog = 1024;
constexpr int kPipeHwm = 10000;
// Senders whose sequence numbers are tracked before unknown ones are dropped.
constexpr std::size_t kMaxSenders = 1024;
// How long the loop keeps polling without blocking after its last work.
constexpr auto kSpin = std::chrono::microseconds(50);

uint64_t random_id() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

// absl::string_view: Debian's Abseil does not alias it to std::string_view, and its hash maps
// look it up without a copy.
absl::string_view view(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

absl::Status status_from(uint16_t code, std::string detail) {
  if (code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) code = 2;  // unknown
  return absl::Status(static_cast<absl::StatusCode>(code), detail);
}

std::string z85(const void* key32) {
  char out[41];
  zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32);
  return out;
}

}  // namespace

// ---- lifecycle -----------------------------------------------------------------------------

Bridge::Bridge(Bus& bus, NodeOptions options)
    : bus_(bus),
      opt_(std::move(options)),
      limits_{opt_.max_message_bytes(), opt_.traversal_limit_words(), opt_.nesting_limit()},
      id_(random_id()) {
  if (opt_.publish_on().empty()) {
    throw std::invalid_argument("bus.net: NodeOptions::publish_on() is required");
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("bus.net: eventfd() failed");
  std::promise<void> ready;
  auto started = ready.get_future();
  thread_ = std::thread([this, &ready] { run(ready); });
  try {
    started.get();
  } catch (...) {
    thread_.join();
    ::close(wake_fd_);
    throw;
  }
}

Bridge::~Bridge() {
  stop();
  ::close(wake_fd_);
}

void Bridge::stop() {
  stopping_.store(true);
  wake();
  if (thread_.joinable()) thread_.join();
}

void Bridge::wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof one);
}

void Bridge::add(std::unique_ptr<Bridged> channel) {
  query([this, &channel] {
    if (!inbox_) return 0;  // stopped
    for (auto& have : channels_) {
      if (have->role == channel->role && have->name == channel->name) return 0;
    }
    Bridged* ch = channel.get();
    channels_.push_back(std::move(channel));
    ch->start(*this);
    switch (ch->role) {
      case Bridged::Role::kExportTopic: break;
      case Bridged::Role::kImportTopic:
        import_topics_[ch->name] = ch;
        update_subscriptions();
        break;
      case Bridged::Role::kExportEndpoint: export_endpoints_[ch->name] = ch; break;
      case Bridged::Role::kExportQueue: export_queues_[ch->name] = ch; break;
      case Bridged::Role::kImportEndpoint:
      case Bridged::Role::kImportQueue: imported_calls_.push_back(ch); break;
    }
    update_reachability();
    next_heartbeat_ = Clock::now();  // tell the peers now
    return 0;
  });
}

void Bridge::run(std::promise<void>& ready) {
  try {
    setup();
  } catch (...) {
    ready.set_exception(std::current_exception());
    return;
  }
  {
    std::lock_guard lock(cmd_mu_);
    running_ = true;
  }
  ready.set_value();
  loop();
  shutdown();
  std::lock_guard lock(cmd_mu_);
  running_ = false;
  // Commands that arrived after the loop ended run here, against the stopped bridge.
  for (auto& c : cmds_) c();
  cmds_.clear();
}

void Bridge::setup() {
  inbox_ = std::make_unique<ExternalInbox>(bus_);
  BusAccess::mark_bridge_thread(bus_);
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
  // NODROP: at the high-water mark send() says EAGAIN instead of dropping silently (handled in
  // flush_publishes); VERBOSER: every (un)subscription is reported, so subscribers are counted.
  xpub_->set(zmq::sockopt::xpub_nodrop, 1);
  xpub_->set(zmq::sockopt::xpub_verboser, 1);
  xpub_->set(zmq::sockopt::linger, kLingerMs);
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
               static_cast<int64_t>(opt_.max_message_bytes()) * 4 + (1 << 20));
  server(*router_);
  if (!opt_.requests_on().empty()) {
    std::string bound = bind(*router_, opt_.requests_on(), "request");
    request_endpoint_ = opt_.advertise().empty() ? bound : opt_.advertise();
  }

  sub_.emplace(ctx_, zmq::socket_type::sub);
  sub_->set(zmq::sockopt::linger, 0);
  sub_->set(
      zmq::sockopt::maxmsgsize,
      static_cast<int64_t>(std::max<std::size_t>(opt_.max_message_bytes(), kMaxBatchBytes)) * 4 +
          (1 << 20));
  sub_->set(zmq::sockopt::subscribe, kHeartbeatTopic);
  if (opt_.secure()) {
    sub_->set(zmq::sockopt::curve_publickey, opt_.curve_keys().public_key);
    sub_->set(zmq::sockopt::curve_secretkey, opt_.curve_keys().secret_key);
  }
  for (const Peer& p : opt_.peers()) connect(p);
  counters_.id = id_;
}

void Bridge::connect(const Peer& p) {
  if (!inbox_) return;                                                             // stopped
  if (p.endpoint == publish_endpoint_ || p.endpoint == opt_.publish_on()) return;  // us
  if (opt_.secure()) {
    if (p.public_key.empty()) {
      throw std::invalid_argument(
          absl::StrCat("bus.net: CURVE is on but peer ", p.endpoint,
                       " has no public key: give it as NodeOptions::peer(endpoint, public_key)"));
    }
    if (!allowed(p.public_key)) {
      // The allowlist holds both ways: a peer we would not let in, we do not listen to either.
      ++counters_.auth_denied;
      log_once(absl::StrCat("peer-key:", p.public_key),
               absl::StrCat("not listening to peer ", p.endpoint, ": its key '", p.public_key,
                            "' is not in the allowlist"));
      return;
    }
    sub_->set(zmq::sockopt::curve_serverkey, p.public_key);
  }
  try {
    sub_->connect(p.endpoint);
  } catch (const zmq::error_t& e) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: bad peer endpoint ", p.endpoint, ": ", e.what()));
  }
}

void Bridge::loop() {
  std::vector<zmq::pollitem_t> items;
  std::vector<uint64_t> dealers;
  Parts parts;
  bool awake = false;
  Clock::time_point last_work{};
  while (!stopping_.load(std::memory_order_relaxed)) {
    run_commands();
    items.clear();
    dealers.clear();
    items.push_back({nullptr, wake_fd_, ZMQ_POLLIN, 0});
    items.push_back({nullptr, inbox_->fd(), ZMQ_POLLIN, 0});
    items.push_back(
        {xpub_->handle(), 0, static_cast<short>(ZMQ_POLLIN | (stall_ ? ZMQ_POLLOUT : 0)), 0});
    items.push_back({sub_->handle(), 0, ZMQ_POLLIN, 0});
    items.push_back({router_->handle(), 0, ZMQ_POLLIN, 0});
    if (zap_) items.push_back({zap_->handle(), 0, ZMQ_POLLIN, 0});
    const std::size_t first_dealer = items.size();
    for (auto& [id, peer] : peers_) {
      if (!peer.dealer) continue;
      dealers.push_back(id);
      short events = ZMQ_POLLIN | (peer.backlog.empty() ? 0 : ZMQ_POLLOUT);
      items.push_back({peer.dealer->handle(), 0, events, 0});
    }

    auto now = Clock::now();
    Clock::time_point until = std::min(next_heartbeat_, next_check_);
    if (auto t = inbox_->next_timer()) until = std::min(until, *t);
    if (stall_ || backlogged_ > 0 || !reply_backlog_.empty()) {
      until = std::min(until, now + milliseconds(1));
    }
    long timeout = awake || until <= now
                       ? 0
                       : std::max<long>(1, duration_cast<milliseconds>(until - now).count());
    zmq::poll(items, std::chrono::milliseconds(timeout));
    std::size_t work = 0;

    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof v);
    }
    {
      // Everything arriving in one pass is published to local subscribers at once.
      Batch batch(bus_);
      // Only sockets poll reported readable: a recv() that finds nothing still costs libzmq
      // a poll() and a getpid().
      if (items[3].revents & ZMQ_POLLIN) {
        for (int i = 0; i < kReadBudget && recv(*sub_, parts); ++i, ++work) on_sub(parts);
      }
      // Requests wait in the ROUTER while replies wait for room (back-pressure on requesters).
      if (items[4].revents & ZMQ_POLLIN) {
        for (int i = 0;
             i < kReadBudget && reply_backlog_.size() < kPauseBacklog && recv(*router_, parts, 5);
             ++i, ++work) {
          on_router(parts);
        }
      }
      for (std::size_t d = 0; d < dealers.size(); ++d) {
        if (!(items[first_dealer + d].revents & ZMQ_POLLIN)) continue;
        // Reading may add or forget peers: look the peer up again each time.
        for (int i = 0; i < kReadBudget; ++i) {
          auto it = peers_.find(dealers[d]);
          if (it == peers_.end() || !it->second.dealer || !recv(*it->second.dealer, parts)) break;
          on_dealer(parts);
          ++work;
        }
      }
    }
    if (items[2].revents & ZMQ_POLLIN) {
      for (int i = 0; i < kReadBudget; ++i) {
        zmq::message_t m;
        if (!xpub_->recv(m, zmq::recv_flags::dontwait)) break;
        on_xpub(m);
      }
    }
    if (zap_ && (items[5].revents & ZMQ_POLLIN)) on_zap();
    if (backlogged_ > 0) flush_peer_backlogs();
    if (!reply_backlog_.empty()) flush_reply_backlog();
    bool paused = (stall_ && !retry_stall()) || backlogged_ >= kPauseBacklog;
    if (paused) {
      // A subscriber or a peer is not keeping up: hold local input back (local publishers feel
      // the back-pressure through the bounded rings).
    } else {
      work += awake ? inbox_->drain_awake() : inbox_->drain();
      flush_publishes();
    }
    // While traffic flows, stay awake: poll without blocking and keep the inbox awake, so local
    // publishers do not pay an eventfd write (and we a wake-up) per message, and what arrives
    // between passes goes out together. After kSpin without work, drain once more the normal
    // way (re-arming the eventfd) and block in poll again.
    if (work > 0) {
      awake = true;
      last_work = Clock::now();
    } else if (awake) {
      if (Clock::now() - last_work > kSpin) {
        awake = false;
        if (!paused && inbox_->drain() > 0) awake = true;
        flush_publishes();
      } else {
        std::this_thread::yield();  // on a shared core, let the publishers run
      }
    }
    now = Clock::now();
    if (now >= next_heartbeat_) {
      heartbeat(false);
      next_heartbeat_ = now + opt_.heartbeat();
    }
    if (now >= next_check_) {
      update_subscriptions();
      check_peers();
      sweep_pending();
      next_check_ = now + opt_.heartbeat() / 2;
    }
  }
}

void Bridge::shutdown() {
  run_commands();
  // What local publishers handed over before the stop still goes out: drain until nothing is
  // left (one drain takes a bounded batch per ring), then stop the channels (their cancels are
  // records too) and drain again.
  auto drain_all = [this] {
    // Bounded: local publishers that keep going during the stop do not hold it forever.
    auto until = Clock::now() + 2 * opt_.send_stall_limit();
    while (Clock::now() < until) {
      auto give_up = Clock::now() + opt_.send_stall_limit();
      while (stall_ && Clock::now() < give_up) {
        zmq::pollitem_t item{xpub_->handle(), 0, ZMQ_POLLOUT, 0};
        zmq::poll(&item, 1, std::chrono::milliseconds(10));
        retry_stall();
      }
      if (stall_) {
        counters_.publish_dropped += stall_->count;
        stall_.reset();
      }
      if (inbox_->drain() == 0 && queued_.empty()) break;
      flush_publishes();
    }
  };
  drain_all();
  for (auto& ch : channels_) ch->stop(*this);
  drain_all();
  flush_peer_backlogs();
  flush_reply_backlog();
  heartbeat(/*leaving=*/true);
  // End-of-stream handshake: LINGER alone does not guarantee that what was queued is delivered
  // before the process exits (libzmq #4660), so wait, within a bound, until every peer that
  // imports one of our topics confirms our goodbye (and so everything published before it).
  absl::flat_hash_set<uint64_t> waiting;
  for (auto& [id, p] : peers_) {
    for (const auto& imp : p.imports) {
      for (auto& ch : channels_) {
        if (ch->role == Bridged::Role::kExportTopic && ch->name == imp.name) waiting.insert(id);
      }
    }
  }
  auto handshake_until = Clock::now() + milliseconds(kLingerMs);
  Parts parts;
  while (!waiting.empty() && Clock::now() < handshake_until) {
    zmq::pollitem_t item{sub_->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10));
    while (recv(*sub_, parts)) on_sub(parts);
    for (uint64_t id : goodbye_acks_) waiting.erase(id);
  }
  for (auto& [corr, p] : pending_) {
    p.call->finish(absl::CancelledError("bus.net: the node stopped"), {});
  }
  pending_.clear();
  // Requests from other nodes still waiting for a local reply are answered Cancelled by the
  // inbox as it closes (their callbacks reply through the router, still open here).
  inbox_.reset();
  for (auto& [id, peer] : peers_) {
    if (peer.dealer) peer.dealer->close();
  }
  peers_.clear();
  sub_->close();
  router_->close();
  xpub_->close();
  if (zap_) zap_->close();
  ctx_.close();  // waits up to the linger for queued messages to leave
}

void Bridge::run_commands() {
  std::vector<absl::AnyInvocable<void()>> cmds;
  {
    std::lock_guard lock(cmd_mu_);
    cmds.swap(cmds_);
  }
  for (auto& c : cmds) c();
}

// ---- incoming ------------------------------------------------------------------------------

bool Bridge::recv(zmq::socket_t& s, Parts& parts, std::size_t max_parts) {
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

void Bridge::malformed(absl::string_view from, const absl::Status& why) {
  ++counters_.malformed_frames;
  log_once(absl::StrCat("malformed:", from),
           absl::StrCat("dropped a malformed frame from the ", from, " socket: ", why.message()));
}

void Bridge::on_sub(Parts& parts) {
  if (parts.size() != 3)
    return malformed("subscriber",
                     absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  absl::StatusOr<EnvelopeFields> env = decode_envelope(parts[1].data(), parts[1].size());
  if (!env.ok()) return malformed("subscriber", env.status());
  if (env->sender == id_) return;
  absl::string_view name = view(parts[0]);
  Payloads& payloads = payloads_;
  if (absl::Status st = payloads.parse(parts[2].data(), parts[2].size(), env->count, limits_);
      !st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++counters_.oversized;
      log_once(absl::StrCat("oversized:", name),
               absl::StrCat("dropped oversized messages on '", name, "': ", st.message()));
      return;
    }
    return malformed("subscriber", st);
  }
  if (env->kind == wire::Envelope::Kind::HEARTBEAT && name == absl::string_view(kHeartbeatTopic)) {
    if (env->count == 1) on_heartbeat(*env, payloads.items()[0]);
    return;
  }
  if (env->kind != wire::Envelope::Kind::PUBLISH) {
    return malformed("subscriber", absl::InvalidArgumentError("not a publish"));
  }
  auto it = import_topics_.find(name);
  if (it == import_topics_.end()) {
    // A longer name that shares our subscription's prefix: ZeroMQ filters by prefix only.
    ++counters_.unknown_channel;
    return;
  }
  deliver(*it->second, *env, payloads);
}

void Bridge::deliver(Bridged& ch, const EnvelopeFields& env, const Payloads& payloads) {
  ChannelTraffic& t = traffic(ch.name, known(env.sender));
  // Per-sender sequence numbers: what was skipped was lost on the way (at-most-once), and is
  // counted rather than silent. A rejected frame
  // advances them too: it arrived.
  if (next_seq_.size() >= kMaxSenders && !next_seq_.contains(env.sender)) {
    // Bounded: senders this node does not hear heartbeats from (a queue sender it does not
    // listen to, or made-up ids) are forgotten first.
    absl::erase_if(next_seq_, [&](const auto& e) { return !peers_.contains(e.first); });
  }
  uint64_t& expected = next_seq_[env.sender][ch.name];
  if (expected != 0 && env.seq > expected) t.gaps += env.seq - expected;
  if (env.seq + env.count > expected) expected = env.seq + env.count;
  if (env.type_id != ch.type_id) {
    t.rejected += env.count;
    auto peer = peers_.find(env.sender);
    log_once(absl::StrCat("type:", ch.name, ":", env.sender),
             absl::StrCat("rejected messages on '", ch.name, "' from node ",
                          peer != peers_.end() ? peer->second.name : "?", " (", env.sender,
                          "): their type id is ", absl::Hex(env.type_id), ", this node's is ",
                          absl::Hex(ch.type_id), " (the two programs disagree on the type)"));
    return;
  }
  for (auto payload : payloads.items()) {
    if (absl::Status st = ch.deliver(*this, payload); !st.ok()) {
      ++t.rejected;
      log_once(absl::StrCat("decode:", ch.name),
               absl::StrCat("rejected a message on '", ch.name, "': ", st.message()));
    } else {
      ++t.received;
    }
  }
}

void Bridge::on_router(Parts& parts) {
  if (parts.size() != 4)
    return malformed("request",
                     absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 4")));
  absl::StatusOr<EnvelopeFields> env = decode_envelope(parts[2].data(), parts[2].size());
  if (!env.ok()) return malformed("request", env.status());
  std::string name(view(parts[1]));
  RemoteCall call{std::string(view(parts[0])), env->correlation, env->sender};
  bool request = env->kind == wire::Envelope::Kind::REQUEST;
  if (!request && env->kind != wire::Envelope::Kind::SEND) {
    return malformed("request", absl::InvalidArgumentError("neither a request nor a send"));
  }
  auto& table = request ? export_endpoints_ : export_queues_;
  auto it = table.find(name);
  if (it == table.end()) {
    ++counters_.unknown_channel;
    log_once(absl::StrCat("unexported:", name),
             absl::StrCat("node ", env->sender, " sent to '", name,
                          "', which this node does not export"));
    if (request) {
      EnvelopeFields r;
      r.kind = wire::Envelope::Kind::REPLY;
      r.sender = id_;
      r.correlation = env->correlation;
      r.code = static_cast<uint16_t>(absl::StatusCode::kUnavailable);
      r.detail = absl::StrCat("bus.net: '", name, "' is not exported by node ", opt_.name());
      zmq::message_t id(parts[0].data(), parts[0].size());
      try {
        if (router_->send(id, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          send_parts(*router_, name, r, {});
        }
      } catch (const zmq::error_t&) {
        ++counters_.unroutable_replies;
      }
    }
    return;
  }
  Bridged& ch = *it->second;
  Payloads& payloads = payloads_;
  absl::Status st = payloads.parse(parts[3].data(), parts[3].size(), env->count, limits_);
  if (st.ok() && request && env->count != 1) st = absl::InvalidArgumentError("request count != 1");
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++counters_.oversized;
    } else {
      malformed("request", st);
    }
    if (request) reply(ch, call, st, {});  // ResourceExhausted (oversized) or InvalidArgument
    return;
  }
  if (!request) return deliver(ch, *env, payloads);
  ChannelTraffic& t = traffic(name, known(env->sender));
  if (env->type_id != ch.type_id) {
    ++t.rejected;
    reply(ch, call,
          absl::InvalidArgumentError(absl::StrCat("bus.net: request type id ",
                                                  absl::Hex(env->type_id), " is not the type of '",
                                                  name, "' here (", absl::Hex(ch.type_id), ")")),
          {});
    return;
  }
  ++t.received;
  // Bounded: a peer may send any 64-bit value (UINT64_MAX for "no deadline", say).
  constexpr uint64_t kMaxTimeoutUs = uint64_t{24} * 3600 * 1'000'000;
  ch.serve(*this, std::move(call), payloads.items()[0],
           microseconds(std::min(env->timeout_us, kMaxTimeoutUs)));
}

void Bridge::on_dealer(Parts& parts) {
  if (parts.size() != 3)
    return malformed("reply",
                     absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  absl::StatusOr<EnvelopeFields> env = decode_envelope(parts[1].data(), parts[1].size());
  if (!env.ok()) return malformed("reply", env.status());
  if (env->kind != wire::Envelope::Kind::REPLY) {
    return malformed("reply", absl::InvalidArgumentError("not a reply"));
  }
  auto it = pending_.find(env->correlation);
  if (it == pending_.end()) {
    ++counters_.late_replies;  // its deadline passed, or its node was given up on
    return;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  ChannelTraffic& t = traffic(p.channel->name, p.peer);
  if (env->code != 0) {
    ++t.received;
    p.call->finish(status_from(env->code, env->detail), {});
    return;
  }
  Payloads& payloads = payloads_;
  absl::Status st = payloads.parse(parts[2].data(), parts[2].size(), 1, limits_);
  if (st.ok() && env->type_id != p.channel->reply_type_id) {
    st = absl::InvalidArgumentError(absl::StrCat("reply type id ", absl::Hex(env->type_id),
                                                 " is not the endpoint's (",
                                                 absl::Hex(p.channel->reply_type_id), ")"));
  }
  if (!st.ok()) {
    ++t.rejected;
    p.call->finish(absl::InternalError(absl::StrCat("bus.net: bad reply from node ", p.peer,
                                                    " on '", p.channel->name, "': ", st.message())),
                   {});
    return;
  }
  ++t.received;
  p.call->finish(absl::OkStatus(), payloads.items()[0]);
}

void Bridge::on_xpub(const zmq::message_t& m) {
  if (m.size() < 1) return;
  const char* d = static_cast<const char*>(m.data());
  std::string topic(d + 1, m.size() - 1);
  if (d[0] == 1) {
    ++subscribers_[topic];
    // A node just subscribed to heartbeats: tell it about us now rather than a period later.
    if (topic == kHeartbeatTopic) next_heartbeat_ = Clock::now();
  } else if (d[0] == 0) {
    auto it = subscribers_.find(topic);
    if (it != subscribers_.end() && --it->second == 0) subscribers_.erase(it);
  }
}

void Bridge::on_zap() {
  // ZAP (RFC 27): version, request id, domain, address, identity, mechanism, credentials.
  for (;;) {
    Parts parts;
    if (!recv(*zap_, parts, 8)) return;
    std::string status = "400", text = "not allowed";
    std::string key;
    if (parts.size() >= 7 && view(parts[5]) == "CURVE" && parts[6].size() == 32) {
      key = z85(parts[6].data());
      for (const auto& k : opt_.allow()) {
        if (k == key) {
          status = "200";
          text = "OK";
        }
      }
    }
    if (status != "200") {
      ++counters_.auth_denied;
      log_once(absl::StrCat("zap:", key),
               absl::StrCat("refused a connection from key '", key, "': not in the allowlist"));
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

void Bridge::on_heartbeat(const EnvelopeFields& env, kj::ArrayPtr<const capnp::word> payload) {
  try {
    capnp::FlatArrayMessageReader reader(payload, reader_options(limits_));
    auto hb = reader.getRoot<wire::Heartbeat>();
    uint64_t id = hb.getNode();
    if (id != env.sender || id == id_) return;
    for (uint64_t acked : hb.getGoodbyes()) {
      if (acked == id_) goodbye_acks_.insert(id);
    }
    if (hb.getLeaving()) {
      forget_peer(id, absl::AbortedError(absl::StrCat("bus.net: peer gone: node '",
                                                      hb.getName().cStr(), "' stopped")));
      // Confirm at once: SUB delivers in order, so everything it sent before arrived.
      goodbyes_.emplace_back(id, Clock::now());
      next_heartbeat_ = Clock::now();
      return;
    }
    if (opt_.secure() && !peers_.contains(id) && !allowed(hb.getPublicKey().cStr())) {
      ++counters_.auth_denied;
      log_once(absl::StrCat("hb-key:", hb.getPublicKey().cStr()),
               absl::StrCat("ignoring node '", hb.getName().cStr(), "': its key '",
                            hb.getPublicKey().cStr(), "' is not in the allowlist"));
      return;
    }
    auto [it, fresh] = peers_.try_emplace(id);
    PeerState& p = it->second;
    p.last_seen = Clock::now();
    auto channels = [](auto list) {
      std::vector<ChannelDesc> out;
      for (auto c : list) {
        out.push_back({c.getName().cStr(), c.getTypeId(), c.getReplyTypeId(), c.getKind()});
      }
      return out;
    };
    std::vector<ChannelDesc> serves = channels(hb.getServes());
    bool changed = fresh || serves != p.serves;
    p.serves = std::move(serves);
    p.imports = channels(hb.getImports());
    p.interval = milliseconds(std::clamp<uint32_t>(hb.getIntervalMs(), 1, 60'000));
    if (fresh) {
      p.id = id;
      p.name = hb.getName().cStr();
      p.request_endpoint = hb.getRequestEndpoint().cStr();
      p.public_key = hb.getPublicKey().cStr();
      if (!p.request_endpoint.empty()) {
        p.dealer = std::make_unique<zmq::socket_t>(ctx_, zmq::socket_type::dealer);
        p.dealer->set(zmq::sockopt::linger, 0);
        p.dealer->set(zmq::sockopt::sndhwm, kPipeHwm);
        p.dealer->set(zmq::sockopt::rcvhwm, kPipeHwm);
        p.dealer->set(zmq::sockopt::maxmsgsize,
                      static_cast<int64_t>(opt_.max_message_bytes()) * 4 + (1 << 20));
        if (opt_.secure()) {
          p.dealer->set(zmq::sockopt::curve_publickey, opt_.curve_keys().public_key);
          p.dealer->set(zmq::sockopt::curve_secretkey, opt_.curve_keys().secret_key);
          p.dealer->set(zmq::sockopt::curve_serverkey, p.public_key);
        }
        try {
          p.dealer->connect(p.request_endpoint);
        } catch (const zmq::error_t& e) {
          log_once(absl::StrCat("connect:", p.request_endpoint),
                   absl::StrCat("cannot connect to node '", p.name, "' at ", p.request_endpoint,
                                ": ", e.what()));
          p.dealer.reset();
        }
      }
      next_heartbeat_ = Clock::now();  // answer a newcomer at once: it learns about us sooner
      // A node that restarted on the same address is a new node: the old one is gone. (After
      // the new one's dealer exists, so the endpoint stays routable throughout.)
      std::vector<uint64_t> replaced;
      for (auto& [other, q] : peers_) {
        if (other != id && !p.request_endpoint.empty() &&
            q.request_endpoint == p.request_endpoint) {
          replaced.push_back(other);
        }
      }
      std::string name = p.name;  // forget_peer() may move the table
      for (uint64_t other : replaced) {
        forget_peer(other, absl::AbortedError(
                               absl::StrCat("bus.net: peer gone: node '", name, "' restarted")));
      }
    }
    if (changed) update_reachability();
  } catch (const kj::Exception& e) {
    malformed("subscriber", absl::InvalidArgumentError(describe(e)));
  }
}

// ---- outgoing ------------------------------------------------------------------------------

bool Bridge::send_parts(zmq::socket_t& s, std::string_view channel, const EnvelopeFields& env,
                        std::string_view payload) {
  std::string e = encode_envelope(env);
  // ZeroMQ queues a multipart message atomically: once the first part is accepted, the others
  // are too (they go to the same pipe), so only the first send can say EAGAIN.
  if (!s.send(zmq::buffer(channel), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    return false;
  }
  s.send(zmq::buffer(e), zmq::send_flags::sndmore);
  s.send(zmq::buffer(payload), zmq::send_flags::none);
  return true;
}

bool Bridge::send_to_peer(PeerState& peer, std::string_view channel, const EnvelopeFields& env,
                          std::string_view payload) {
  if (peer.backlog.empty() && send_parts(*peer.dealer, channel, env, payload)) return true;
  // The pipe to it is full (its high-water mark): keep the message, in order, until it drains.
  // Bounded; while any peer holds a long backlog the node stops taking local input.
  if (peer.backlog.size() >= kMaxPeerBacklog) return false;
  std::string e = encode_envelope(env);
  Parts parts;
  parts.emplace_back(channel.data(), channel.size());
  parts.emplace_back(e.data(), e.size());
  parts.emplace_back(payload.data(), payload.size());
  peer.backlog.push_back(std::move(parts));
  ++backlogged_;
  return true;
}

void Bridge::flush_peer_backlogs() {
  for (auto& [id, peer] : peers_) {
    while (!peer.backlog.empty()) {
      Parts& parts = peer.backlog.front();
      if (!peer.dealer->send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        break;
      }
      peer.dealer->send(parts[1], zmq::send_flags::sndmore);
      peer.dealer->send(parts[2], zmq::send_flags::none);
      peer.backlog.pop_front();
      --backlogged_;
    }
  }
}

bool Bridge::oversized(const Bridged& channel, std::size_t bytes) {
  if (bytes <= limits_.max_message_bytes) return false;
  ++counters_.oversized;
  log_once(absl::StrCat("oversized-out:", channel.name),
           absl::StrCat("did not send a ", bytes, "-byte message on '", channel.name,
                        "': over max_message_bytes (", limits_.max_message_bytes, ")"));
  return true;
}

void Bridge::queue_publish(Bridged& channel, Outbox& out) {
  if (!out.queued) {
    out.queued = true;
    queued_.emplace_back(&channel, &out);
  }
  if (out.bytes.size() >= kMaxBatchBytes && !stall_) flush_publishes();
}

void Bridge::flush_publishes() {
  std::size_t i = 0;
  for (; i < queued_.size() && !stall_; ++i) {
    auto [ch, out] = queued_[i];
    out->queued = false;
    if (out->count == 0) continue;
    EnvelopeFields env;
    env.kind = wire::Envelope::Kind::PUBLISH;
    env.type_id = ch->type_id;
    env.sender = id_;
    env.seq = out->next_seq;
    env.count = out->count;
    out->next_seq += out->count;
    counters_.published += out->count;
    if (subscribers_.contains(ch->name)) {
      ChannelTraffic& t = traffic(ch->name, 0);
      t.sent += out->count;
    }
    std::string e = encode_envelope(env);
    Stall stall;
    stall.parts.emplace_back(ch->name.data(), ch->name.size());
    stall.parts.emplace_back(e.data(), e.size());
    stall.parts.emplace_back(out->bytes.data(), out->bytes.size());
    stall.count = out->count;
    out->bytes.clear();
    out->count = 0;
    stall_ = std::move(stall);
    stall_->since = Clock::now();
    retry_stall();
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool Bridge::retry_stall() {
  if (!stall_) return true;
  if (xpub_->send(stall_->parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    xpub_->send(stall_->parts[1], zmq::send_flags::sndmore);
    xpub_->send(stall_->parts[2], zmq::send_flags::none);
    stall_.reset();
    return true;
  }
  if (Clock::now() - stall_->since > opt_.send_stall_limit()) {
    // A subscriber has not taken anything for the whole limit: drop this batch (its receivers
    // count the gap) rather than hold every local publisher back forever.
    counters_.publish_dropped += stall_->count;
    log_once("stall", absl::StrCat("a subscriber stalled the publisher for over ",
                                   opt_.send_stall_limit().count(), " ms; dropped ", stall_->count,
                                   " messages (receivers count them as gaps)"));
    stall_.reset();
    return true;
  }
  return false;
}

void Bridge::heartbeat(bool leaving) {
  capnp::MallocMessageBuilder builder;
  auto hb = builder.initRoot<wire::Heartbeat>();
  hb.setNode(id_);
  hb.setName(opt_.name());
  hb.setRequestEndpoint(request_endpoint_);
  hb.setIntervalMs(static_cast<uint32_t>(opt_.heartbeat().count()));
  hb.setLeaving(leaving);
  hb.setPublicKey(opt_.curve_keys().public_key);
  auto now = Clock::now();
  std::erase_if(goodbyes_, [&](const auto& g) { return now - g.second > std::chrono::seconds(5); });
  auto acks = hb.initGoodbyes(static_cast<unsigned>(goodbyes_.size()));
  for (unsigned i = 0; i < goodbyes_.size(); ++i) acks.set(i, goodbyes_[i].first);
  std::vector<Bridged*> serves, imports;
  for (auto& ch : channels_) {
    if (ch->role == Bridged::Role::kExportEndpoint || ch->role == Bridged::Role::kExportQueue) {
      serves.push_back(ch.get());
    } else if (ch->role == Bridged::Role::kImportTopic && subscribed_.contains(ch->name)) {
      imports.push_back(ch.get());
    }
  }
  auto fill = [](auto list, const std::vector<Bridged*>& from) {
    for (unsigned i = 0; i < from.size(); ++i) {
      auto c = list[i];
      c.setName(from[i]->name);
      c.setTypeId(from[i]->type_id);
      c.setReplyTypeId(from[i]->reply_type_id);
      switch (from[i]->role) {
        case Bridged::Role::kExportEndpoint: c.setKind(wire::Channel::Kind::ENDPOINT); break;
        case Bridged::Role::kExportQueue: c.setKind(wire::Channel::Kind::QUEUE); break;
        default: c.setKind(wire::Channel::Kind::TOPIC); break;
      }
    }
  };
  fill(hb.initServes(static_cast<unsigned>(serves.size())), serves);
  fill(hb.initImports(static_cast<unsigned>(imports.size())), imports);
  std::string payload;
  append_message(builder, payload);
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::HEARTBEAT;
  env.type_id = capnp::typeId<wire::Heartbeat>();
  env.sender = id_;
  env.count = 1;
  // Not while a batch is stalled: it would overtake it. A missed heartbeat is fine.
  if (!stall_) (void)send_parts(*xpub_, kHeartbeatTopic, env, payload);
}

void Bridge::call(Bridged& channel, std::string payload, Clock::time_point deadline,
                  std::unique_ptr<PendingCall> pending) {
  if (oversized(channel, payload.size())) {
    pending->finish(
        absl::ResourceExhaustedError(absl::StrCat("bus.net: request of ", payload.size(),
                                                  " bytes is over max_message_bytes")),
        {});
    return;
  }
  PeerState* peer = pick_peer(channel, /*endpoint=*/true);
  if (peer == nullptr) {
    pending->finish(
        absl::UnavailableError(absl::StrCat("bus.net: no live node serves '", channel.name, "'")),
        {});
    return;
  }
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::REQUEST;
  env.type_id = channel.type_id;
  env.sender = id_;
  env.count = 1;
  env.correlation = ++last_correlation_;
  auto left = deadline - Clock::now();
  env.timeout_us = left > Clock::duration::zero()
                       ? static_cast<uint64_t>(duration_cast<microseconds>(left).count())
                       : 0;
  if (!send_to_peer(*peer, channel.name, env, payload)) {
    ++counters_.send_refused;
    pending->finish(absl::ResourceExhaustedError(absl::StrCat(
                        "bus.net: no room toward node '", peer->name, "' for '", channel.name,
                        "' (it is not taking requests as fast as they come)")),
                    {});
    return;
  }
  ++traffic(channel.name, peer->id).sent;
  pending_.emplace(env.correlation, Pending{peer->id, &channel, deadline, std::move(pending)});
}

absl::Status Bridge::send(Bridged& channel, std::string payload) {
  PeerState* peer = pick_peer(channel, /*endpoint=*/false);
  absl::Status st;
  if (oversized(channel, payload.size())) {
    st = absl::ResourceExhaustedError("bus.net: queue message over max_message_bytes");
  } else if (peer == nullptr) {
    st =
        absl::UnavailableError(absl::StrCat("bus.net: no live node consumes '", channel.name, "'"));
  } else {
    EnvelopeFields env;
    env.kind = wire::Envelope::Kind::SEND;
    env.type_id = channel.type_id;
    env.sender = id_;
    env.count = 1;
    // Numbered per destination: each receiver counts gaps in what was sent to it.
    uint64_t& seq = peer->send_seq[channel.name];
    env.seq = seq + 1;
    if (send_to_peer(*peer, channel.name, env, payload)) {
      ++seq;
      ++traffic(channel.name, peer->id).sent;
      return absl::OkStatus();
    }
    st = absl::ResourceExhaustedError(
        absl::StrCat("bus.net: no room toward node '", peer->name, "' for '", channel.name, "'"));
  }
  ++counters_.send_refused;
  log_once(absl::StrCat("send:", channel.name),
           absl::StrCat("a queue message was not sent: ", st.message()));
  return st;
}

void Bridge::reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
                   std::string payload) {
  if (!router_) return;
  if (status.ok() && oversized(channel, payload.size())) {
    return reply(channel, to, absl::ResourceExhaustedError("bus.net: reply over max_message_bytes"),
                 {});
  }
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::REPLY;
  env.type_id = status.ok() ? channel.reply_type_id : 0;
  env.sender = id_;
  env.count = status.ok() ? 1 : 0;
  env.correlation = to.correlation;
  env.code = static_cast<uint16_t>(status.code());
  if (!status.ok()) env.detail = std::string(status.message());
  std::string e = encode_envelope(env);
  Parts parts;
  parts.emplace_back(to.identity.data(), to.identity.size());
  parts.emplace_back(channel.name.data(), channel.name.size());
  parts.emplace_back(e.data(), e.size());
  parts.emplace_back(payload.data(), payload.size());
  ++traffic(channel.name, known(to.peer)).sent;
  if (reply_backlog_.size() >= kMaxPeerBacklog) {
    ++counters_.unroutable_replies;
    return;
  }
  // In order behind what is waiting already; the ROUTER takes it when the requester's pipe has
  // room (its high-water mark: the requester is not reading as fast as it asks).
  reply_backlog_.push_back(std::move(parts));
  flush_reply_backlog();
}

void Bridge::flush_reply_backlog() {
  while (!reply_backlog_.empty()) {
    Parts& parts = reply_backlog_.front();
    try {
      if (!router_->send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return;  // EAGAIN: that requester's pipe is full; keep the order, retry later
      }
      router_->send(parts[1], zmq::send_flags::sndmore);
      router_->send(parts[2], zmq::send_flags::sndmore);
      router_->send(parts[3], zmq::send_flags::none);
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH (ROUTER_MANDATORY): the requester disconnected.
      ++counters_.unroutable_replies;
    }
    reply_backlog_.pop_front();
  }
}

// ---- peers ---------------------------------------------------------------------------------

void Bridge::update_subscriptions() {
  // Only topics with local subscribers are subscribed to, so other nodes' publishers (and
  // ZeroMQ's filtering) do not send us what nobody here reads.
  for (auto& [name, ch] : import_topics_) {
    bool want = ch->wanted(*this);
    if (want == subscribed_.contains(name)) continue;
    if (want) {
      sub_->set(zmq::sockopt::subscribe, name);
      subscribed_.insert(name);
    } else {
      sub_->set(zmq::sockopt::unsubscribe, name);
      subscribed_.erase(name);
    }
    next_heartbeat_ = Clock::now();  // our imports changed: tell the peers
  }
}

void Bridge::check_peers() {
  auto now = Clock::now();
  std::vector<uint64_t> dead;
  for (auto& [id, p] : peers_) {
    if (now - p.last_seen > p.interval * opt_.dead_after()) dead.push_back(id);
  }
  for (uint64_t id : dead) {
    ++counters_.peers_lost;
    auto& p = peers_[id];
    forget_peer(id, absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", p.name,
                                                    "' missed ", opt_.dead_after(),
                                                    " heartbeats with the request in flight")));
  }
}

void Bridge::forget_peer(uint64_t id, const absl::Status& why) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  // Fail what was in flight on it now, not at the deadline.
  std::vector<uint64_t> failed;
  for (auto& [corr, p] : pending_) {
    if (p.peer == id) failed.push_back(corr);
  }
  for (uint64_t corr : failed) {
    auto node = pending_.extract(corr);
    ++counters_.calls_peer_gone;
    node.mapped().call->finish(why, {});
  }
  if (!it->second.backlog.empty()) {
    // Queue messages and requests that never left: the requests failed above; count the rest.
    backlogged_ -= it->second.backlog.size();
    counters_.send_refused += it->second.backlog.size();
  }
  peers_.erase(it);
  next_seq_.erase(id);
  // Fold its traffic into the "gone" rows so the table stays bounded as nodes come and go.
  std::vector<std::pair<std::string, uint64_t>> rows;
  for (auto& [key, t] : traffic_) {
    if (key.second == id) rows.push_back(key);
  }
  for (auto& key : rows) {
    ChannelTraffic t = traffic_[key];
    traffic_.erase(key);
    ChannelTraffic& gone = traffic(key.first, 0);
    gone.sent += t.sent;
    gone.received += t.received;
    gone.gaps += t.gaps;
    gone.rejected += t.rejected;
  }
  update_reachability();
}

PeerState* Bridge::pick_peer(const Bridged& ch, bool endpoint) {
  std::vector<PeerState*> live;
  for (auto& [id, p] : peers_) {
    if (!p.dealer) continue;
    auto kind = endpoint ? wire::Channel::Kind::ENDPOINT : wire::Channel::Kind::QUEUE;
    for (const auto& s : p.serves) {
      if (s.name == ch.name && s.kind == kind && s.type_id == ch.type_id &&
          (!endpoint || s.reply_type_id == ch.reply_type_id)) {
        live.push_back(&p);
        break;
      }
    }
  }
  if (live.empty()) return nullptr;
  return live[round_robin_[ch.name]++ % live.size()];
}

void Bridge::update_reachability() {
  for (Bridged* ch : imported_calls_) {
    bool endpoint = ch->role == Bridged::Role::kImportEndpoint;
    bool reachable = pick_peer(*ch, endpoint) != nullptr;
    if (!reachable) {
      for (auto& [id, p] : peers_) {
        for (const auto& s : p.serves) {
          if (s.name == ch->name &&
              (s.type_id != ch->type_id || (endpoint && s.reply_type_id != ch->reply_type_id))) {
            log_once(absl::StrCat("serves-type:", ch->name),
                     absl::StrCat("node '", p.name, "' serves '", ch->name,
                                  "' with other types than this node: not routing to it"));
          }
        }
      }
    }
    ch->set_reachable(*this, reachable);
  }
}

void Bridge::sweep_pending() {
  // The requester's own deadline timer has answered it already; drop what is left of it.
  auto now = Clock::now();
  std::vector<uint64_t> expired;
  for (auto& [corr, p] : pending_) {
    if (p.deadline < now) expired.push_back(corr);
  }
  for (uint64_t corr : expired) pending_.erase(corr);
}

// ---- observation ---------------------------------------------------------------------------

bool Bridge::allowed(const std::string& key) const {
  for (const auto& k : opt_.allow()) {
    if (k == key) return true;
  }
  return false;
}

uint64_t Bridge::known(uint64_t sender) const { return peers_.contains(sender) ? sender : 0; }

ChannelTraffic& Bridge::traffic(const std::string& channel, uint64_t peer) {
  auto [it, fresh] = traffic_.try_emplace(std::make_pair(channel, peer));
  if (fresh) {
    it->second.channel = channel;
    it->second.peer = peer;
  }
  return it->second;
}

void Bridge::log_once(const std::string& key, const std::string& what) {
  if (logged_.size() > 4096 || !logged_.insert(key).second) return;
  std::fprintf(stderr, "bus.net[%s]: %s\n", opt_.name().c_str(), what.c_str());
}

std::vector<PeerInfo> Bridge::peers() const {
  std::vector<PeerInfo> out;
  auto now = Clock::now();
  for (const auto& [id, p] : peers_) {
    PeerInfo i;
    i.id = id;
    i.name = p.name;
    i.request_endpoint = p.request_endpoint;
    for (const auto& s : p.serves) i.serves.push_back(s.name);
    for (const auto& s : p.imports) i.imports.push_back(s.name);
    i.since_heartbeat = duration_cast<milliseconds>(now - p.last_seen);
    out.push_back(std::move(i));
  }
  return out;
}

NodeStats Bridge::stats() const {
  NodeStats s = counters_;
  s.peers = peers();
  for (const auto& [key, t] : traffic_) {
    ChannelTraffic row = t;
    auto p = peers_.find(key.second);
    row.peer_name = p != peers_.end() ? p->second.name : (key.second == 0 ? "" : "?");
    s.traffic.push_back(std::move(row));
  }
  return s;
}

std::size_t Bridge::subscribers(std::string_view topic) const {
  auto it = subscribers_.find(absl::string_view(topic.data(), topic.size()));
  return it == subscribers_.end() ? 0 : it->second;
}

bool Bridge::serves(std::string_view channel) const {
  for (const auto& [id, p] : peers_) {
    if (!p.dealer) continue;
    for (const auto& s : p.serves) {
      if (s.name == channel) return true;
    }
  }
  return false;
}

}  // namespace bus::net::detail

// ---- the public Node -------------------------------------------------------------------------

namespace bus::net {

CurveKeys CurveKeys::generate() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    throw std::runtime_error("bus.net: zmq_curve_keypair failed (libzmq built without CURVE?)");
  }
  return CurveKeys{pub, sec};
}

Node::Node(Bus& bus, NodeOptions options)
    : bridge_(std::make_unique<detail::Bridge>(bus, std::move(options))) {}
Node::~Node() { stop(); }
void Node::stop() { bridge_->stop(); }
Node& Node::peer(std::string endpoint, std::string public_key) {
  Peer p{std::move(endpoint), std::move(public_key)};
  std::exception_ptr error;
  bridge_->query([&] {
    try {
      bridge_->connect(p);
    } catch (...) {
      error = std::current_exception();
    }
    return 0;
  });
  if (error) std::rethrow_exception(error);
  return *this;
}
Node& Node::add(std::unique_ptr<detail::Bridged> channel) {
  bridge_->add(std::move(channel));
  return *this;
}
uint64_t Node::id() const { return bridge_->id(); }
std::string Node::publish_endpoint() const { return bridge_->publish_endpoint(); }
std::string Node::request_endpoint() const { return bridge_->request_endpoint(); }
std::vector<PeerInfo> Node::peers() const {
  return bridge_->query([this] { return bridge_->peers(); });
}
NodeStats Node::stats() const {
  return bridge_->query([this] { return bridge_->stats(); });
}
std::size_t Node::subscribers(std::string_view topic) const {
  return bridge_->query([this, topic] { return bridge_->subscribers(topic); });
}
bool Node::wait_for_subscribers(std::string_view topic, std::size_t n,
                                std::chrono::milliseconds timeout) const {
  auto until = Clock::now() + timeout;
  while (subscribers(topic) < n) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}
bool Node::wait_for_server(std::string_view channel, std::chrono::milliseconds timeout) const {
  auto until = Clock::now() + timeout;
  while (!bridge_->query([this, channel] { return bridge_->serves(channel); })) {
    if (Clock::now() >= until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace bus::net
