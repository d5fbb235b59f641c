// The bridge thread: starting and stopping it (what a stop still sends, the goodbye) and its
// loop, one step at a time.
#include "bridge.hpp"

#include <capnp/serialize.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <system_error>

namespace bus::net::detail {

using namespace std::chrono_literals;

namespace {
// How long the loop keeps polling without blocking after its last work.
constexpr auto kSpin = std::chrono::microseconds(50);
// How often every socket is asked for its events, whatever their ZMQ_FDs say (a safety net).
constexpr auto kAskAllEvery = std::chrono::seconds(1);
// While traffic flows over shared-memory links, most passes look at the links' rings only (no
// system call); a full pass (poll(2), ZeroMQ's sockets, the links' sockets) comes this often.
constexpr auto kFullPassEvery = std::chrono::microseconds(20);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

// ---- lifecycle -----------------------------------------------------------------------------

Bridge::Bridge(Bus& bus, NodeOptions options)
    : bus_(bus),
      opt_(std::move(options)),
      limits_{opt_.largest_message(), opt_.traversal_limit_words(), opt_.nesting_limit()},
      id_(random_id()),
      zmq_(opt_, id_, *this),
      shm_(opt_, id_, *this, *this),
      peers_(opt_.heartbeat(), opt_.dead_after()),
      ledger_([this](uint64_t id) { return peers_.contains(id); }),
      gate_(opt_.send_stall_limit()) {
  if (opt_.publish_on().empty()) {
    throw std::invalid_argument("bus.net: NodeOptions::publish_on() is required");
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw std::runtime_error("bus.net: eventfd() failed");
  lanes_ = std::make_shared<DirectLanes>(zmq_.context(), opt_, id_, limits_);
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
                                 [](const Peer& p) { return is_host_name(p.address); });
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
  zmq_.start();
  advertised_publish_ = advertised_publish(opt_, zmq_.publish_address());
  if (opt_.shares_memory() && !HostIdentity::self().boot_id.empty()) {
    shm_.start(wake_fd_, zmq_.publish_address());
  }
  for (const Peer& p : opt_.peers()) {
    if (is_host_name(p.address)) continue;  // the membership resolves it
    if (static_peers_.insert(p.address).second) listen(p);
  }
  counters_.id = id_;
}

// ---- the loop ------------------------------------------------------------------------------

void Bridge::loop() {
  while (!stopping_.load(std::memory_order_relaxed)) {
    run_commands();
    Pass pass;
    wait_for_work(pass);
    read_peers(pass);
    take_local_input(pass);
    flush_batches();  // what this pass read and drained goes out in as few frames as it fits in
    spin_or_rest(pass);
    beat_and_check();
  }
}

void Bridge::wait_for_work(Pass& pass) {
  if (awake_ && shm_.links() > 0 && !gate_.holding()) {
    // Spinning on shared memory: a frame on a link is a cache line away, a system call costs
    // more than the frame. The inbox is drained on every pass while awake, whatever its eventfd.
    auto now = Clock::now();
    if (now < next_full_pass_) {
      while (!shm_.has_input() && Clock::now() < next_full_pass_) cpu_relax();
      pass.quick = true;
      return;
    }
    next_full_pass_ = now + kFullPassEvery;
  }
  PollSet& set = pass.set;
  pass.at_wake = set.add(wake_fd_, POLLIN);
  // While a subscriber or a peer holds local input back, the inbox is not drained: its eventfd
  // would stay readable and make every poll return at once, a busy loop that takes the CPU from
  // the transport's own threads, the ones that make room. Wait for room (or the 1 ms retry).
  const bool holding = gate_.holding() || backlogged() >= kPauseBacklog;
  pass.at_inbox = set.add(inbox_->fd(), holding ? 0 : POLLIN);
  bool has_input = zmq_.prepare(set);
  has_input = shm_.prepare(set) || has_input;

  auto now = Clock::now();
  // A heartbeat due behind a held frame waits for it (the 1 ms retry below), not for nothing.
  Clock::time_point until = gate_.holding() ? next_check_ : std::min(next_heartbeat_, next_check_);
  const std::optional<Clock::time_point> timer = inbox_->next_timer();
  if (timer) until = std::min(until, *timer);
  if (gate_.holding() || backlogged() > 0 || zmq_.replies_waiting() > 0) {
    until = std::min(until, now + milliseconds(1));
  }
  // A stall just begun is retried at once (yielding to the transport's threads between tries):
  // the pipe usually has room again within microseconds. Past kSpin, once per poll timeout.
  pass.fresh_stall = gate_.holding() && now - gate_.since() < kSpin;
  // Rounded up: rounded down, a wait ends just before `until` and the loop wakes twice.
  int timeout = awake_ || pass.fresh_stall || has_input || until <= now
                    ? 0
                    : static_cast<int>(std::clamp<long>(
                          std::chrono::ceil<milliseconds>(until - now).count(), 1, 60'000));
  // Asking the XPUB for its events (in prepare) takes in the command that gave room without its
  // ZMQ_FD saying so again: retried only after the wait, the held frame would wait out the whole
  // timeout with room to spare (what that cost: docs/benchmarks.md, "The figures behind the
  // code").
  if (timeout > 0 && gate_.holding() && retry_held()) timeout = 0;
  // Links' writers wake this thread through its eventfd only while it says it sleeps.
  if (timeout != 0 && !shm_.sleep()) timeout = 0;
  if (::poll(set.fds.data(), set.fds.size(), timeout) < 0 && errno != EINTR) {
    throw std::system_error(errno, std::generic_category(), "bus.net: poll");
  }
  if (timeout != 0) shm_.awake();
  pass.inbox_due = timer && *timer <= Clock::now();
  if (set.in(pass.at_wake)) {
    uint64_t v;
    (void)!::read(wake_fd_, &v, sizeof v);
  }
}

void Bridge::read_peers(Pass& pass) {
  if (pass.quick) {
    Batch batch(bus_);
    std::size_t read_before = messages_read_;
    const uint64_t control_before = control_read_;
    shm_.read_links();
    if (!linked_.empty()) replay_handovers();
    pass.read_work = messages_read_ - read_before - (control_read_ - control_before);
    pass.work += pass.read_work;
    shm_.flush();
    return;
  }
  {
    // Everything arriving in one pass is published to local subscribers at once.
    Batch batch(bus_);
    std::size_t read_before = messages_read_;
    const uint64_t control_before = control_read_;
    zmq_.read_traffic(pass.set);
    shm_.read(pass.set);
    if (!linked_.empty()) replay_handovers();
    // Heartbeats are not traffic: nothing was handed over, and no stream is starting.
    pass.read_work = messages_read_ - read_before - (control_read_ - control_before);
    pass.work += pass.read_work;
  }
  // What this pass read is now in local executors' rings: on a shared CPU, let them run it now,
  // so their answers leave with this pass rather than after everything waiting was read.
  if (pass.read_work > 0) std::this_thread::yield();
  zmq_.read_control(pass.set);
  zmq_.flush();
  shm_.flush();
}

void Bridge::take_local_input(Pass& pass) {
  pass.paused = !retry_held() || backlogged() >= kPauseBacklog;
  if (pass.paused) {
    // A subscriber or a peer is not keeping up: hold local input back (local publishers feel
    // the back-pressure through the bounded rings).
    if (pass.fresh_stall) std::this_thread::yield();
    return;
  }
  if (!awake_ && armed_ && !pass.quick && !pass.set.in(pass.at_inbox) && !pass.inbox_due) return;
  // Armed (its last drain was a drain()), the inbox is drained only when its eventfd or a timer
  // says so: a drain costs a membarrier (end_drain's heavy barrier), and an idle node wakes for
  // its peers only. Not armed (a drain_awake() last, then a pause), producers do not write the
  // eventfd: it is drained on every pass until it is armed again.
  std::size_t drained = awake_ ? inbox_->drain_awake() : inbox_->drain();
  armed_ = !awake_;
  pass.work += drained;
  // A drain that took a full batch may have left more: take up to kDrainRounds batches, so
  // that a publisher's frame carries up to kMaxBatchBytes, not one batch of records.
  for (int more = 1; more < kDrainRounds && drained >= ExternalInbox::kBatch && !gate_.holding() &&
                     backlogged() < kPauseBacklog;
       ++more) {
    drained = inbox_->drain_awake();
    armed_ = false;
    pass.work += drained;
  }
}

void Bridge::spin_or_rest(const Pass& pass) {
  // While traffic flows, stay awake: poll without blocking and keep the inbox awake, so local
  // publishers do not pay an eventfd write (and we a wake-up) per message, and what arrives
  // between passes goes out together. After kSpin without work, drain once more the normal way
  // (re-arming the eventfd) and block in poll again. Any work from the inbox starts the spin
  // (local publishers are a stream more often than not, and a pass after the core ran other
  // threads may find just one of their messages); so does more than one message read, or one
  // within kSpin of the last work. A lone message read after a longer quiet does not: a request
  // served in the same pass (Node::serve), or a reply, is usually all there is, and on a core
  // shared with the transport's threads spinning only delays what it must send.
  // With shared-memory links, how long is theirs to say (shm_spin): a reader that polls gets a
  // frame a cache-line transfer after it is written; one that sleeps, a wake-up later.
  const Clock::duration spin = shm_.links() > 0 ? Clock::duration(opt_.shm_spin()) : kSpin;
  if (pass.work > 0) {
    const auto at = Clock::now();
    if (pass.work > 1 || pass.read_work < pass.work || at - last_work_ < spin) awake_ = true;
    last_work_ = at;
  } else if (awake_) {
    if (Clock::now() - last_work_ > spin) {
      awake_ = false;
      if (!pass.paused) {
        armed_ = true;
        if (inbox_->drain() > 0) awake_ = true;
      }
      flush_batches();
    } else {
      std::this_thread::yield();  // on a shared core, let the publishers run
    }
  }
}

void Bridge::beat_and_check() {
  auto now = Clock::now();
  // Behind a held frame, a heartbeat waits for the next pass (at most send_stall_limit).
  bool beat = false;
  if (now >= next_heartbeat_ && heartbeat(false)) {
    next_heartbeat_ = next_beat(now);
    beat = true;
  }
  // Checks come once a heartbeat, in the pass that sends it where they can: an idle node wakes
  // for its own heartbeat and its peers' frames, nothing else.
  if (now >= next_check_ || (beat && now >= next_check_ - opt_.heartbeat() / 2)) {
    update_subscriptions();
    check_peers();
    sweep_pending();
    next_check_ = now + peers_.check_every();
    // Every socket is asked for its events now and then: should ZeroMQ ever take a socket's
    // signal where the loop does not expect it, its input still waits no longer than this.
    // Not at every check: asking costs two syscalls per socket, and a node has one per peer.
    if (now >= next_ask_all_) {
      zmq_.ask_all();
      next_ask_all_ = now + kAskAllEvery;
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
    // wait for POLLOUT: an XPUB reports it even while full (see ZmqTransport::prepare).
    while (!retry_held()) std::this_thread::sleep_for(milliseconds(1));
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
  zmq_.flush();
  shm_.flush();
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
  while (!waiting.empty() && Clock::now() < handshake_until) {
    if (gate_.holding()) {
      (void)retry_held();  // the goodbye waits for room like a topic frame, then goes past
    } else if (Clock::now() >= again) {
      // A subscriber that had no room for the goodbye (it was passed over) may have caught up
      // since: say it again, after everything (a second goodbye changes nothing for others).
      (void)heartbeat(/*leaving=*/true);
      again = Clock::now() + milliseconds(100);
    }
    zmq_.read_topics_for(shm_.links() > 0 ? milliseconds(1) : milliseconds(10));
    shm_.read_links();
    shm_.flush();
    shm_.wake_written();
    for (uint64_t id : goodbye_acks_) waiting.erase(id);
  }
  resolve_stall();  // nobody waited for the goodbye: it still goes out
  for (auto& [corr, p] : pending_) {
    p.call->finish(absl::CancelledError("bus.net: the node stopped"), {});
  }
  pending_.clear();
  // Requests from other nodes still waiting for a local reply are answered Cancelled by the
  // inbox as it closes (their callbacks reply through the transports, still open here).
  inbox_.reset();
  replies_.flush([this](ReplyBatch& b) { send_reply_batch(b); });
  shm_.flush();
  shm_.wake_written();
  for (auto& [id, p] : peers_) zmq_.close_route(id);
  peers_.clear();
  shm_.close();
  zmq_.close();
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
