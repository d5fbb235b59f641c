#include "bridge.hpp"

#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <random>
#include <stdexcept>
#include <system_error>

namespace bus::net::detail {

using namespace std::chrono_literals;

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
  lanes_ = std::make_shared<DirectLanes>(ctx_, opt_, id_, limits_);
  // A call waiting on another node ends Cancelled when the bus stops, as one waiting in process.
  BusAccess::on_stop(bus_, [lanes = std::weak_ptr<DirectLanes>(lanes_)] {
    if (auto l = lanes.lock()) l->stop();
  });
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
  const bool names = std::any_of(opt_.peers().begin(), opt_.peers().end(),
                                 [](const Peer& p) { return is_host_name(p.endpoint); });
  if (names || !opt_.etcd().empty()) {
    try {
      std::lock_guard lock(membership_mu_);
      membership();
    } catch (...) {  // a bad etcd endpoint: the node does not start
      stop();
      ::close(wake_fd_);
      throw;
    }
  }
}

Bridge::~Bridge() {
  stop();
  ::close(wake_fd_);
}

void Bridge::stop() {
  {
    std::lock_guard lock(membership_mu_);
    if (membership_) membership_->stop();  // it posts to the bridge thread, which must outlive it
  }
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
    Bridged* ch = nullptr;
    for (auto& have : channels_) {
      if (have->role == channel->role && have->name == channel->name) {
        ch = have.get();
        ch->merge(*this, *channel);  // Node::subscribe() or serve() on a channel it has
        break;
      }
    }
    const bool fresh = ch == nullptr;
    if (fresh) {
      ch = channel.get();
      channels_.push_back(std::move(channel));
      ch->start(*this);
    }
    switch (ch->role) {
      case Bridged::Role::kExportTopic: break;
      case Bridged::Role::kImportTopic:
        import_topics_[ch->name] = ch;
        update_subscriptions();
        break;
      case Bridged::Role::kExportEndpoint: export_endpoints_[ch->name] = ch; break;
      case Bridged::Role::kExportQueue: export_queues_[ch->name] = ch; break;
      case Bridged::Role::kImportEndpoint:
      case Bridged::Role::kImportQueue:
        if (fresh) imported_calls_.push_back(ch);
        break;
    }
    update_reachability();
    next_heartbeat_ = Clock::now();  // tell the peers now
    return 0;
  });
  std::lock_guard lock(membership_mu_);
  if (membership_) membership_->channels_changed();
}

Membership& Bridge::membership() {
  if (!membership_) {
    membership_ =
        std::make_unique<Membership>(*this, opt_, publish_endpoint_, membership_counters_);
  }
  return *membership_;
}

void Bridge::add_peer(const Peer& p) {
  if (is_host_name(p.endpoint)) {
    std::lock_guard lock(membership_mu_);
    if (!stopping_.load()) membership().add_name(p);
    return;
  }
  std::exception_ptr error;
  query([&] {
    try {
      if (static_peers_.insert(p.endpoint).second) connect(p);
    } catch (...) {
      error = std::current_exception();
    }
    return 0;
  });
  if (error) std::rethrow_exception(error);
}

void Bridge::found(const std::string& source, const std::vector<Peer>& peers) {
  if (!inbox_) return;  // stopped
  absl::flat_hash_set<std::string> now;
  for (const Peer& p : peers) {
    if (p.endpoint == publish_endpoint_ || static_peers_.contains(p.endpoint)) continue;
    now.insert(p.endpoint);
    auto& sources = found_[p.endpoint];
    if (!sources.insert(source).second || sources.size() > 1) continue;  // already listened to
    try {
      connect(p);
      ++counters_.members_found;
    } catch (const std::exception& e) {
      log_once(absl::StrCat("found:", p.endpoint), e.what());
    }
  }
  for (auto it = found_.begin(); it != found_.end();) {
    auto next = std::next(it);
    auto& sources = it->second;
    if (!now.contains(it->first) && sources.erase(source) > 0 && sources.empty()) {
      try {
        sub_->disconnect(it->first);
      } catch (const zmq::error_t&) {
        // Never connected (refused by the allowlist): nothing to undo.
      }
      touched(sub_->handle());
      ++counters_.members_dropped;
      found_.erase(it);
    }
    it = next;
  }
}

MemberRecord Bridge::member_record() const {
  MemberRecord r;
  r.id = id_;
  r.name = opt_.name();
  r.requests = request_endpoint_;
  r.public_key = opt_.curve_keys().public_key;
  for (const auto& ch : channels_) {
    switch (ch->role) {
      case Bridged::Role::kExportTopic: r.exports.push_back(ch->name); break;
      case Bridged::Role::kExportEndpoint:
      case Bridged::Role::kExportQueue: r.serves.push_back(ch->name); break;
      default: r.imports.push_back(ch->name); break;
    }
  }
  return r;
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
               static_cast<int64_t>(opt_.max_message_bytes()) * 4 + (1 << 20));
  server(*router_);
  if (!opt_.requests_on().empty()) {
    std::string bound = bind(*router_, opt_.requests_on(), "request");
    request_endpoint_ = opt_.advertise().empty() ? bound : opt_.advertise();
  }

  sub_.emplace(ctx_, zmq::socket_type::sub);
  sub_->set(zmq::sockopt::linger, 0);
  // Per publisher: a reader that falls behind works through a short queue (then the socket
  // buffers, then the publisher's queue for it), not seconds of stale frames.
  sub_->set(zmq::sockopt::rcvhwm, opt_.subscription_queue());
  sub_->set(
      zmq::sockopt::maxmsgsize,
      static_cast<int64_t>(std::max<std::size_t>(opt_.max_message_bytes(), kMaxBatchBytes)) * 4 +
          (1 << 20));
  sub_->set(zmq::sockopt::subscribe, kHeartbeatTopic);
  if (opt_.secure()) {
    sub_->set(zmq::sockopt::curve_publickey, opt_.curve_keys().public_key);
    sub_->set(zmq::sockopt::curve_secretkey, opt_.curve_keys().secret_key);
  }
  for (const Peer& p : opt_.peers()) {
    if (is_host_name(p.endpoint)) continue;  // the membership resolves it
    if (static_peers_.insert(p.endpoint).second) connect(p);
  }
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
  touched(sub_->handle());
  try {
    sub_->connect(p.endpoint);
  } catch (const zmq::error_t& e) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: bad peer endpoint ", p.endpoint, ": ", e.what()));
  }
}

void Bridge::loop() {
  // Polled on their ZMQ_FD with poll(2), not zmq_poll(): zmq_poll asks every ZeroMQ socket for
  // its events (a poll() and a getpid() each, twice when it waits) on every pass. A ZMQ_FD says
  // only that the socket has commands to process, which a send, a connect or asking for its
  // events also does: so a socket is read when its fd says so until a read finds it empty, and
  // one touched since (touched_) is asked for its events before the loop waits.
  std::vector<pollfd> fds;
  std::vector<zmq::socket_t*> sockets;  // by fds index; null for the eventfds
  std::vector<bool> ready;              // by fds index: has input to read this pass
  std::vector<bool> wants_room;         // by fds index: a dealer holding a backlog
  std::vector<uint64_t> dealers;        // by fds index - first_dealer
  Parts parts;
  bool awake = false;
  bool ask_all = false;  // every socket is asked this pass, whatever touched_ says
  Clock::time_point last_work{};
  Clock::time_point next_ask_all{};
  bool armed = false;  // the inbox's producers write its eventfd (see the drain below)
  auto watch = [&](int fd, zmq::socket_t* s, short events, bool room = false) {
    fds.push_back({fd, events, 0});
    sockets.push_back(s);
    wants_room.push_back(room);
  };
  while (!stopping_.load(std::memory_order_relaxed)) {
    run_commands();
    fds.clear();
    sockets.clear();
    wants_room.clear();
    dealers.clear();
    watch(wake_fd_, nullptr, POLLIN);
    // While a subscriber or a peer holds local input back, the inbox is not drained: its eventfd
    // would stay readable and make every poll return at once, a busy loop that takes the CPU
    // from ZeroMQ's I/O thread, the one that makes room. Wait for room (or the 1 ms retry).
    const bool holding = stall_.has_value() || backlogged_ >= kPauseBacklog;
    watch(inbox_->fd(), nullptr, holding ? 0 : POLLIN);
    // XPUB: only subscriptions. It says POLLOUT even while a NODROP pipe is full (its
    // distributor always "has out"): room for a held frame comes as a command on its ZMQ_FD
    // (a subscriber's pipe read down to half), and a stall is retried when that fires, just
    // before the loop waits (below), and on the poll timeout (1 ms) at the latest.
    for (zmq::socket_t* s : {&*xpub_, &*sub_, &*router_}) {
      watch(s->get(zmq::sockopt::fd), s, POLLIN);
    }
    if (zap_) watch(zap_->get(zmq::sockopt::fd), &*zap_, POLLIN);
    const std::size_t first_dealer = fds.size();
    for (auto& [id, peer] : peers_) {
      if (!peer.dealer) continue;
      dealers.push_back(id);
      // A dealer holding a backlog is asked for room on every pass.
      const bool room = !peer.backlog.empty();
      watch(peer.dealer->get(zmq::sockopt::fd), peer.dealer.get(), POLLIN, room);
      if (room) touched(peer.dealer->handle());
    }
    // Requests wait in the ROUTER while replies wait for room (back-pressure on requesters):
    // it is asked on every pass, but what it holds does not keep the loop from waiting.
    const bool router_held = reply_backlog_.size() >= kPauseBacklog;
    if (router_held) touched(router_->handle());

    ready.assign(fds.size(), false);
    bool has_input = false;
    for (std::size_t i = 2; i < fds.size() && (ask_all || !touched_.empty()); ++i) {
      zmq::socket_t& s = *sockets[i];
      if (!ask_all && std::find(touched_.begin(), touched_.end(), s.handle()) == touched_.end()) {
        continue;
      }
      const int events = s.get(zmq::sockopt::events);
      const bool in = (events & ZMQ_POLLIN) != 0;
      ready[i] = in;
      if ((in && !(&s == &*router_ && router_held)) ||
          (wants_room[i] && (events & ZMQ_POLLOUT) != 0)) {
        has_input = true;
      }
    }
    touched_.clear();
    ask_all = false;

    auto now = Clock::now();
    // A heartbeat due behind a held frame waits for it (the 1 ms retry below), not for nothing.
    Clock::time_point until = stall_ ? next_check_ : std::min(next_heartbeat_, next_check_);
    const std::optional<Clock::time_point> timer = inbox_->next_timer();
    if (timer) until = std::min(until, *timer);
    if (stall_ || backlogged_ > 0 || !reply_backlog_.empty()) {
      until = std::min(until, now + milliseconds(1));
    }
    // A stall just begun is retried at once (yielding to ZeroMQ's I/O thread between tries): the
    // pipe usually has room again within microseconds. Past kSpin, once per poll timeout.
    const bool fresh_stall = stall_ && now - stall_->since < kSpin;
    // Rounded up: rounded down, a wait ends just before `until` and the loop wakes twice.
    int timeout = awake || fresh_stall || has_input || until <= now
                      ? 0
                      : static_cast<int>(std::clamp<long>(
                            std::chrono::ceil<milliseconds>(until - now).count(), 1, 60'000));
    // Asking the XPUB for its events (above) takes in the command that gave room without its
    // ZMQ_FD saying so again: retried only after the wait, the held frame would wait out the
    // whole timeout with room to spare (the 1 KiB publish benchmark lost a fifth of its rate).
    if (timeout > 0 && stall_ && retry_stall()) timeout = 0;
    if (::poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
      throw std::system_error(errno, std::generic_category(), "bus.net: poll");
    }
    for (std::size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ready[i] = true;
    }
    std::size_t work = 0;
    std::size_t read_work = 0;  // of `work`, messages read from the network
    bool handed_over = false;
    const bool inbox_due = timer && *timer <= Clock::now();

    if (fds[0].revents & POLLIN) {
      uint64_t v;
      (void)!::read(wake_fd_, &v, sizeof v);
    }
    {
      // Everything arriving in one pass is published to local subscribers at once.
      Batch batch(bus_);
      // Only sockets with input, and at most kReadBudget messages and frames from each: one
      // left before it was empty is asked again before the next poll.
      auto read = [&](zmq::socket_t& s, auto&& next, auto&& on) {
        void* handle = s.handle();  // reading may forget a peer and close its dealer
        std::size_t start = messages_read_;
        for (std::size_t frames = 0;; ++frames) {
          if (frames == kReadBudget || messages_read_ - start >= kReadBudget) {
            touched(handle);  // not read to the end: asked again before the next poll
            return;
          }
          if (!next()) return;
          on();
        }
      };
      std::size_t read_before = messages_read_;
      const uint64_t control_before = control_read_;
      if (ready[3]) {
        read(
            *sub_, [&] { return recv(*sub_, parts); }, [&] { on_sub(parts); });
      }
      if (ready[4]) {
        read(
            *router_,
            [&] {
              if (reply_backlog_.size() < kPauseBacklog) return recv(*router_, parts, 5);
              touched(router_->handle());
              return false;
            },
            [&] { on_router(parts); });
      }
      for (std::size_t d = 0; d < dealers.size(); ++d) {
        if (!ready[first_dealer + d]) continue;
        // Reading may add or forget peers (and close their dealers): look the peer up again
        // before each read.
        auto peer = peers_.find(dealers[d]);
        if (peer == peers_.end() || !peer->second.dealer) continue;
        zmq::socket_t& dealer = *peer->second.dealer;
        read(
            dealer,
            [&] {
              auto it = peers_.find(dealers[d]);
              return it != peers_.end() && it->second.dealer.get() == &dealer &&
                     recv(dealer, parts);
            },
            [&] { on_dealer(parts); });
      }
      // Heartbeats are not traffic: nothing was handed over, and no stream is starting.
      read_work = messages_read_ - read_before - (control_read_ - control_before);
      work += read_work;
      handed_over = read_work > 0;
    }
    // What this pass read is now in local executors' rings: on a shared CPU, let them run it
    // now, so their answers leave with this pass rather than after everything waiting was read.
    if (handed_over) std::this_thread::yield();
    if (ready[2]) {
      std::size_t i = 0;
      for (zmq::message_t m; i < kReadBudget && xpub_->recv(m, zmq::recv_flags::dontwait); ++i) {
        on_xpub(m);
      }
      if (i == kReadBudget) touched(xpub_->handle());
    }
    if (zap_ && ready[5]) on_zap();  // reads until ZAP's socket is empty
    if (backlogged_ > 0) flush_peer_backlogs();
    if (!reply_backlog_.empty()) flush_reply_backlog();
    bool paused = (stall_ && !retry_stall()) || backlogged_ >= kPauseBacklog;
    if (paused) {
      // A subscriber or a peer is not keeping up: hold local input back (local publishers feel
      // the back-pressure through the bounded rings).
      if (fresh_stall) std::this_thread::yield();
    } else if (awake || !armed || (fds[1].revents & POLLIN) != 0 || inbox_due) {
      // Armed (its last drain was a drain()), the inbox is drained only when its eventfd or a
      // timer says so: a drain costs a membarrier (end_drain's heavy barrier), and an idle node
      // wakes for its peers only. Not armed (a drain_awake() last, then a pause), producers do
      // not write the eventfd: it is drained on every pass until it is armed again.
      std::size_t drained = awake ? inbox_->drain_awake() : inbox_->drain();
      armed = !awake;
      work += drained;
      // A drain that took a full batch may have left more: take up to kDrainRounds batches, so
      // that a publisher's frame carries up to kMaxBatchBytes, not one batch of records.
      for (int more = 1; more < kDrainRounds && drained >= ExternalInbox::kBatch && !stall_ &&
                         backlogged_ < kPauseBacklog;
           ++more) {
        drained = inbox_->drain_awake();
        armed = false;
        work += drained;
      }
    }
    // What this pass read and drained goes out in as few frames as it fits in.
    flush_batches();
    // While traffic flows, stay awake: poll without blocking and keep the inbox awake, so local
    // publishers do not pay an eventfd write (and we a wake-up) per message, and what arrives
    // between passes goes out together. After kSpin without work, drain once more the normal
    // way (re-arming the eventfd) and block in poll again. Any work from the inbox starts the
    // spin (local publishers are a stream more often than not, and a pass after the core ran
    // other threads may find just one of their messages); so does more than one message read,
    // or one within kSpin of the last work. A lone message read after a longer quiet does not:
    // a request served in the same pass (Node::serve), or a reply, is usually all there is, and
    // on a core shared with ZeroMQ's I/O thread spinning only delays what it must send.
    if (work > 0) {
      const auto at = Clock::now();
      if (work > 1 || read_work < work || at - last_work < kSpin) awake = true;
      last_work = at;
    } else if (awake) {
      if (Clock::now() - last_work > kSpin) {
        awake = false;
        if (!paused) {
          armed = true;
          if (inbox_->drain() > 0) awake = true;
        }
        flush_batches();
      } else {
        std::this_thread::yield();  // on a shared core, let the publishers run
      }
    }
    now = Clock::now();
    // Behind a held frame, a heartbeat waits for the next pass (at most send_stall_limit).
    bool beat = false;
    if (now >= next_heartbeat_ && heartbeat(false)) {
      next_heartbeat_ = next_beat(now);
      beat = true;
    }
    // Checks come once a heartbeat, in the pass that sends it where they can: an idle node
    // wakes for its own heartbeat and its peers' frames, nothing else.
    if (now >= next_check_ || (beat && now >= next_check_ - opt_.heartbeat() / 2)) {
      update_subscriptions();
      check_peers();
      sweep_pending();
      next_check_ = now + opt_.heartbeat();
      // Every socket is asked for its events now and then: should ZeroMQ ever take a socket's
      // signal where the loop does not expect it, its input still waits no longer than this.
      // Not at every check: asking costs two syscalls per socket, and a node has one per peer.
      if (now >= next_ask_all) {
        ask_all = true;
        next_ask_all = now + kAskAllEvery;
      }
    }
  }
}

void Bridge::shutdown() {
  run_commands();
  // What local publishers handed over before the stop still goes out: drain until nothing is
  // left (one drain takes a bounded batch per ring), then stop the channels (their cancels are
  // records too) and drain again.
  auto resolve_stall = [this] {
    // Bounded by send_stall_limit: then the frame goes on without the full subscriber. Not a
    // wait for POLLOUT: an XPUB reports it even while full (see loop()).
    while (!retry_stall()) std::this_thread::sleep_for(milliseconds(1));
  };
  auto drain_all = [&] {
    // Bounded: local publishers that keep going during the stop do not hold it forever.
    auto until = Clock::now() + std::max<Clock::duration>(2 * opt_.send_stall_limit(), 2s);
    while (Clock::now() < until) {
      resolve_stall();
      std::size_t drained = inbox_->drain();
      flush_batches();
      if (drained == 0 && queued_.empty()) break;
    }
  };
  drain_all();
  for (auto& ch : channels_) ch->stop(*this);
  lanes_->stop();  // calls on their callers' threads end Cancelled, as pending_ below
  drain_all();
  flush_peer_backlogs();
  flush_reply_backlog();
  resolve_stall();
  (void)heartbeat(/*leaving=*/true);  // after everything published: nothing is held now
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
  auto again = Clock::now() + milliseconds(100);
  Parts parts;
  while (!waiting.empty() && Clock::now() < handshake_until) {
    if (stall_) {
      (void)retry_stall();  // the goodbye waits for room like a topic frame, then goes past
    } else if (Clock::now() >= again) {
      // A subscriber that had no room for the goodbye (it was passed over) may have caught up
      // since: say it again, after everything (a second goodbye changes nothing for others).
      (void)heartbeat(/*leaving=*/true);
      again = Clock::now() + milliseconds(100);
    }
    zmq::pollitem_t item{sub_->handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(10));
    while (recv(*sub_, parts)) on_sub(parts);
    for (uint64_t id : goodbye_acks_) waiting.erase(id);
  }
  resolve_stall();  // nobody waited for the goodbye: it still goes out
  for (auto& [corr, p] : pending_) {
    p.call->finish(absl::CancelledError("bus.net: the node stopped"), {});
  }
  pending_.clear();
  // Requests from other nodes still waiting for a local reply are answered Cancelled by the
  // inbox as it closes (their callbacks reply through the router, still open here).
  inbox_.reset();
  flush_replies();
  flush_reply_backlog();
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

void Bridge::changed() {
  {
    std::lock_guard lock(changed_mu_);
    ++changes_;
  }
  changed_cv_.notify_all();
}

void Bridge::run_commands() {
  std::vector<absl::AnyInvocable<void()>> cmds;
  {
    std::lock_guard lock(cmd_mu_);
    cmds.swap(cmds_);
  }
  for (auto& c : cmds) c();
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
  bridge_->add_peer(Peer{std::move(endpoint), std::move(public_key)});
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
  return bridge_->wait_until([&] { return bridge_->subscribers(topic) >= n; },
                             Clock::now() + timeout);
}
bool Node::wait_for_subscribers(std::string_view topic, const std::vector<std::string>& names,
                                std::chrono::milliseconds timeout) const {
  return bridge_->wait_until(
      [&] {
        std::size_t importers = 0, named = 0;
        for (const PeerInfo& p : bridge_->peers()) {
          if (std::find(p.imports.begin(), p.imports.end(), topic) == p.imports.end()) continue;
          ++importers;
          if (std::find(names.begin(), names.end(), p.name) != names.end()) ++named;
        }
        // Subscriptions come on another connection than heartbeats: one may be ahead.
        return named >= names.size() && bridge_->subscribers(topic) >= importers;
      },
      Clock::now() + timeout);
}
bool Node::wait_for_server(std::string_view channel, std::chrono::milliseconds timeout) const {
  return bridge_->wait_until([&] { return bridge_->serves(channel); }, Clock::now() + timeout);
}

}  // namespace bus::net
