// The bridge thread of a Node: its ZeroMQ sockets, its peers and its pending remote calls.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/functional/any_invocable.h>
#include <absl/strings/str_cat.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "bus/net/node.hpp"
#include "direct.hpp"
#include "membership.hpp"
#include "wire.hpp"

namespace bus::net::detail {

// ---- tuning and small helpers shared by bridge*.cpp ------------------------------------------
using std::chrono::duration_cast;
using std::chrono::microseconds;
using std::chrono::milliseconds;

// A topic batch is handed to ZeroMQ once it reaches this size (or when the drain that filled
// it ends): one frame carries many messages, which is what beats one-message-per-frame ZeroMQ.
inline constexpr std::size_t kMaxBatchBytes = 32 * 1024;
// Requests or replies sent in one frame, at most: a batch that is too long serialises the two
// nodes (one waits while the other works through it); a short one pipelines them.
inline constexpr std::size_t kSendBatchItems = 256;
// Messages (not frames: one frame may hold a batch) read from one socket in one pass of the
// loop. Small passes pipeline: what a pass hands to local executors runs, and its answers go
// out, while the peer works on the next part, instead of whole windows crossing in turn.
inline constexpr std::size_t kReadBudget = 256;
// Drains of the inbox in one pass while each takes a full batch (ExternalInbox::kBatch records
// from a ring). One batch of 16 B messages fills a third of a kMaxBatchBytes frame; the
// receiver pays per frame (a ZeroMQ read, a wake-up, an envelope), so fuller frames are cheaper
// for it: 16 B publish 4.1 -> 6.1 M msgs/s, pipelined requests 0.51x -> 0.63x raw ZeroMQ's.
inline constexpr int kDrainRounds = 4;
inline constexpr int kLingerMs = 1000;
// Messages kept per peer while its pipe is full, and the total at which local input pauses.
inline constexpr std::size_t kMaxPeerBacklog = 1 << 16;
inline constexpr std::size_t kPauseBacklog = 1024;
inline constexpr int kPipeHwm = 10000;
// Senders whose sequence numbers are tracked before unknown ones are dropped.
inline constexpr std::size_t kMaxSenders = 1024;
// Frames read from the subscriber socket after a peer's last one, past which its silence is its
// own even while more input waits: ZeroMQ's SUB takes one message from each peer's pipe in turn
// (and notices a pipe that filled again within about 100 reads), so a peer with anything queued
// would have been read by then.
inline constexpr uint64_t kFairFrames = 512;
// Entries in a heartbeat's `missed` list, at most.
inline constexpr std::size_t kMaxMissedReports = 1024;
// How long the loop keeps polling without blocking after its last work.
inline constexpr auto kSpin = std::chrono::microseconds(50);
// How often every socket is asked for its events, whatever their ZMQ_FDs say (a safety net).
inline constexpr auto kAskAllEvery = std::chrono::seconds(1);

inline uint64_t random_id() {
  std::random_device rd;
  uint64_t v = 0;
  while (v == 0) v = (uint64_t{rd()} << 32) ^ rd();
  return v;
}

// absl::string_view: Debian's Abseil does not alias it to std::string_view, and its hash maps
// look it up without a copy.
inline absl::string_view view(const zmq::message_t& m) {
  return {static_cast<const char*>(m.data()), m.size()};
}

inline absl::Status status_from(uint16_t code, std::string detail) {
  if (code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) code = 2;  // unknown
  return absl::Status(static_cast<absl::StatusCode>(code), detail);
}

inline std::string z85(const void* key32) {
  char out[41];
  zmq_z85_encode(out, static_cast<const uint8_t*>(key32), 32);
  return out;
}

struct ChannelDesc {
  std::string name;
  uint64_t type_id = 0;
  uint64_t reply_type_id = 0;
  wire::Channel::Kind kind = wire::Channel::Kind::TOPIC;
  bool operator==(const ChannelDesc&) const = default;
};

/// Requests to one peer on one endpoint, sent in one frame when the loop's pass ends.
struct CallBatch {
  struct Call {
    Clock::time_point deadline;
    std::unique_ptr<PendingCall> pending;
  };
  Bridged* channel = nullptr;
  PrincipalPtr principal;  // every request of a batch is for one principal (or none)
  std::string bytes;       // the requests' payloads, back to back
  std::vector<Call> calls;
};

/// Replies to one requester on one endpoint, sent in one frame when the loop's pass ends.
struct ReplyBatch {
  std::string identity;
  Bridged* channel = nullptr;
  uint64_t peer = 0;
  std::vector<BatchItem> items;
  std::string bytes;               // the payloads of the items whose code is 0
  std::size_t envelope_bytes = 0;  // about what the items add to the envelope
};

/// A node this one hears heartbeats from.
struct PeerState {
  uint64_t id = 0;
  std::string name;
  std::string request_endpoint;
  std::string public_key;
  std::chrono::milliseconds interval{0};
  Clock::time_point last_seen;  // when a frame of any kind last came from it
  uint64_t frames_at_seen = 0;  // the subscriber socket's frame count then (Bridge::sub_frames_)
  std::vector<ChannelDesc> serves;
  std::vector<ChannelDesc> imports;
  std::unique_ptr<zmq::socket_t> dealer;                // requests and queue messages to it
  std::deque<std::vector<zmq::message_t>> backlog;      // what its full pipe did not take yet
  absl::flat_hash_map<std::string, uint64_t> send_seq;  // queues: last seq sent to it per channel
  bool batches = false;          // its heartbeat says it reads request and reply batches
  std::vector<CallBatch> calls;  // requests to it not sent yet, a batch per endpoint and principal
};

/// What a receiver knows of one sender's numbering on one channel. Kept while the sender may
/// come back (declared dead but not gone for good), so that what it missed meanwhile is counted.
struct SeqState {
  uint64_t expected = 0;  // the next number; 0: no frame yet (the first one sets it)
  uint64_t gaps = 0;      // numbers skipped so far: reported back in heartbeats (`missed`)
};

/// A node's figures (what its StatsD source sends).
void node_figures(const NodeStats& s, StatsdSink& out);
/// Per (channel, peer) figures for $bus.stats: what was missed each way.
void peer_figures(const NodeStats& s, StatsdSink& out);

class Bridge final : public Link {
 public:
  Bridge(Bus& bus, NodeOptions options);
  ~Bridge() override;

  void stop();
  void add(std::unique_ptr<Bridged> channel);
  /// Listens to `peer` from now on (a host name: resolved again and again by the membership).
  void add_peer(const Peer& peer);
  /// Bridge thread: the publishers `source` (etcd, or one DNS name) finds now, replacing what it
  /// found before. One that no source lists any more is no longer listened to (its heartbeats
  /// stop, and it is declared dead as any silent node); a static peer always is.
  void found(const std::string& source, const std::vector<Peer>& peers);
  /// Bridge thread: what this node registers in etcd.
  MemberRecord member_record() const;
  /// Runs `fn` on the bridge thread later (dropped once it has stopped).
  void post(absl::AnyInvocable<void()> fn) {
    {
      std::lock_guard lock(cmd_mu_);
      if (!running_) return;
      cmds_.push_back(std::move(fn));
    }
    wake();
  }
  /// Runs `fn` on the bridge thread (or here, once it has stopped) and returns its result.
  template <class F>
  auto query(F fn) -> decltype(fn()) {
    using R = decltype(fn());
    {
      std::unique_lock lock(cmd_mu_);
      if (running_) {
        std::promise<R> done;
        auto result = done.get_future();
        cmds_.push_back([&] { done.set_value(fn()); });
        lock.unlock();
        wake();
        return result.get();
      }
    }
    return fn();
  }

  /// Waits until `holds()` (run on the bridge thread) is true, re-checking whenever the
  /// subscriptions or peers change, or until `until`. True when it held.
  template <class F>
  bool wait_until(F holds, Clock::time_point until) {
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard lock(changed_mu_);
        seen = changes_;
      }
      if (query(holds)) return true;
      std::unique_lock lock(changed_mu_);
      if (!changed_cv_.wait_until(lock, until, [&] { return changes_ != seen; })) return false;
    }
  }

  uint64_t id() const { return id_; }
  const std::string& publish_endpoint() const { return publish_endpoint_; }
  const std::string& request_endpoint() const { return request_endpoint_; }
  std::vector<PeerInfo> peers() const;
  NodeStats stats() const;
  std::size_t subscribers(std::string_view topic) const;
  bool serves(std::string_view channel) const;

  // Link
  Bus& bus() override { return bus_; }
  ExternalInbox& inbox() override { return *inbox_; }
  const Limits& limits() const override { return limits_; }
  void queue_publish(Bridged& channel, Outbox& out) override;
  bool oversized(const Bridged& channel, std::size_t bytes) override;
  void call(Bridged& channel, std::string payload, Clock::time_point deadline,
            PrincipalPtr principal, std::unique_ptr<PendingCall> pending) override;
  std::shared_ptr<DirectCalls> direct_calls() override { return lanes_; }
  /// call(), to node `to` (0: any live node serving the channel).
  void call_to(uint64_t to, Bridged& channel, std::string payload, Clock::time_point deadline,
               PrincipalPtr principal, std::unique_ptr<PendingCall> pending);

  // Untyped access (Node::tap, publish_raw, call_raw), on the bridge thread.
  void tap(std::string topic, RawHandler fn);
  absl::StatusOr<std::size_t> publish_raw(const std::string& topic, uint64_t type_id,
                                          const std::string& payload);
  void call_raw(std::string endpoint, uint64_t type_id, uint64_t reply_type_id, uint64_t peer,
                std::string payload, Clock::time_point deadline, RawReply done);
  absl::Status send(Bridged& channel, std::string payload) override;
  void reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
             std::string payload) override;

 private:
  struct Pending {
    uint64_t peer;
    Bridged* channel;
    Clock::time_point deadline;
    std::unique_ptr<PendingCall> call;
  };
  /// A frame the publisher socket refused (a subscriber's queue is full), held until it has
  /// room or send_stall_limit passes. Nothing else goes out on the publisher meanwhile.
  struct Stall {
    std::vector<zmq::message_t> parts;
    uint32_t count = 0;                // messages (0: a heartbeat)
    const Bridged* channel = nullptr;  // a topic batch's channel
    Clock::time_point since;
  };
  /// Why a peer is forgotten: it may come back (silence), or it never will (it left, or a new
  /// run of it took its address).
  enum class Forget { kMayReturn, kForGood };

  void run(std::promise<void>& ready);
  void connect(const Peer& peer);
  void setup();
  void loop();
  void shutdown();
  void wake();
  void run_commands();
  /// Bridge thread: subscriptions or peers changed; wakes wait_until().
  void changed();

  // incoming
  void on_sub(Parts& parts);
  void on_router(Parts& parts);
  void on_dealer(Parts& parts);
  void on_xpub(const zmq::message_t& m);
  void on_zap();
  void on_heartbeat(const EnvelopeFields& env, kj::ArrayPtr<const capnp::word> payload);
  /// A publish (from the SUB socket, or sent straight to the ROUTER): to the imported topic's
  /// subscribers and to taps.
  void on_publish(absl::string_view name, const EnvelopeFields& env, const Payloads& payloads);
  /// A "$bus.stats" request: answers this node's figures.
  void serve_stats(const RemoteCall& call);
  /// Delivers payloads of a publish or send, counting sequence gaps per (sender, channel).
  void deliver(Bridged& ch, const EnvelopeFields& env, const Payloads& payloads);
  /// A frame came from `sender`: if it is a live peer, it is alive now (any frame proves it).
  void heard(uint64_t sender);
  /// The sequence state of (`sender`, `channel`), made when new (bounded: see kMaxSenders).
  SeqState& seq_state(uint64_t sender, const std::string& channel);
  /// `lost` messages of `sender` on `channel` never arrived.
  void count_gap(uint64_t sender, const std::string& channel, SeqState& s, uint64_t lost);
  /// A heartbeat's `published`: numbers below those that never arrived are gaps too.
  void on_published(uint64_t sender, const capnp::List<wire::TopicSeq>::Reader& published);

  /// A send, a connect or a read that stopped before the socket was empty may leave it holding
  /// input that its ZMQ_FD no longer signals: loop() asks it for its events before it polls.
  void touched(void* socket_handle) {
    if (touched_.empty() || touched_.back() != socket_handle) touched_.push_back(socket_handle);
  }

  // outgoing
  /// Sends a multipart message; false if the first part was refused (the pipe is full).
  bool send_all(zmq::socket_t& s, std::vector<zmq::message_t>& parts);
  bool send_parts(zmq::socket_t& s, std::string_view channel, const EnvelopeFields& env,
                  std::string_view payload);
  /// Sends what the pass batched: requests, replies and topic messages.
  void flush_batches();
  /// Sends one request or a batch (`calls` in the order of `payloads`); fails them all when
  /// the peer takes nothing more.
  void send_calls(PeerState& peer, Bridged& channel, std::string_view payloads,
                  std::span<CallBatch::Call> calls, const PrincipalPtr& principal);
  /// Sends peer.calls[i] (see send_calls()).
  void send_batch(PeerState& peer, std::size_t i);
  void flush_calls();
  void flush_replies();
  void send_reply_batch(ReplyBatch& b);
  /// One reply frame for `items` (a single reply's envelope when there is one), with the
  /// payloads of the items whose code is 0, queued for the ROUTER.
  void send_replies(std::string_view identity, std::string_view name, uint64_t reply_type_id,
                    std::vector<BatchItem>& items, std::string_view payloads);
  /// Queues a reply frame for the ROUTER (in order behind those waiting for room).
  void queue_reply(Parts parts, std::size_t replies);
  /// An UNAVAILABLE reply for a request on an endpoint this node does not export.
  void reply_unexported(const RemoteCall& call, absl::string_view name);
  void flush_publishes();
  /// Sends to a peer's DEALER, or keeps the message in the peer's backlog while its pipe is
  /// full. False only when the backlog is full too.
  bool send_to_peer(PeerState& peer, std::string_view channel, const EnvelopeFields& env,
                    std::string_view payload);
  void flush_peer_backlogs();
  void flush_reply_backlog();
  /// Sends the held frame, or sends it on without the full subscriber once send_stall_limit
  /// passed; false while it is still held.
  bool retry_stall();
  /// The number the next message on `ch` takes, counting only what the publisher socket took.
  uint64_t sent_next(const Bridged& ch) const;
  /// Sends a heartbeat like a topic frame (held while a subscriber is full, then sent past it).
  /// False when a held frame is ahead of it: try again on the next pass.
  bool heartbeat(bool leaving);
  /// When the heartbeat after one sent at `now` is due: the next multiple of the period on the
  /// monotonic clock, which every process of a host shares, so that the nodes of a host beat
  /// together and each wakes once for many peers' heartbeats rather than once for each. At
  /// most a period away (a heartbeat sent early, to a newcomer, only shortens the gap).
  Clock::time_point next_beat(Clock::time_point now) const;
  std::string heartbeat_payload(bool leaving);

  // peers
  void check_peers();
  void forget_peer(uint64_t id, const absl::Status& why, Forget how);
  void update_reachability();
  void update_subscriptions();
  /// True when `p` serves `ch` (an import) with its types.
  static bool serves(const PeerState& p, const Bridged& ch, bool endpoint);
  PeerState* pick_peer(const Bridged& ch, bool endpoint);
  void sweep_pending();

  /// `sender` if it is a live peer, else 0 (rows for unknown senders are folded together).
  uint64_t known(uint64_t sender) const;
  bool allowed(const std::string& public_key) const;
  ChannelTraffic& traffic(const std::string& channel, uint64_t peer);
  void log_once(const std::string& key, const std::string& what);
  void malformed(absl::string_view from, const absl::Status& why);

  Bus& bus_;
  const NodeOptions opt_;
  const Limits limits_;
  const uint64_t id_;
  std::string publish_endpoint_;
  std::string request_endpoint_;

  zmq::context_t ctx_;
  std::optional<zmq::socket_t> xpub_, sub_, router_, zap_;
  std::unique_ptr<ExternalInbox> inbox_;
  int wake_fd_ = -1;
  // After ctx_: closed before it. Callers in a call keep it alive; their sockets close when
  // the call ends, which the context's close waits for.
  std::shared_ptr<DirectLanes> lanes_;

  std::mutex changed_mu_;
  std::condition_variable changed_cv_;
  uint64_t changes_ = 0;  // under changed_mu_

  mutable std::mutex cmd_mu_;
  std::vector<absl::AnyInvocable<void()>> cmds_;  // under cmd_mu_
  bool running_ = false;                          // under cmd_mu_
  std::atomic<bool> stopping_{false};
  std::thread thread_;

  // ---- bridge thread only (or any thread once it stopped) ----
  std::vector<std::unique_ptr<Bridged>> channels_;
  absl::flat_hash_map<std::string, Bridged*> import_topics_, export_endpoints_, export_queues_;
  std::vector<Bridged*> imported_calls_;  // import endpoints and queues
  absl::flat_hash_map<uint64_t, PeerState> peers_;
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<std::string, SeqState>> next_seq_;
  // What each peer's heartbeats say it missed of ours, per channel (running totals, kept while
  // it may come back); what peers gone for good had missed, per channel.
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<std::string, uint64_t>> reported_missed_;
  absl::flat_hash_map<std::string, uint64_t> missed_gone_;
  // Nodes declared dead (by id, with when), to tell a false death when one speaks again.
  absl::flat_hash_map<uint64_t, Clock::time_point> declared_dead_;
  uint64_t sub_frames_ = 0;         // frames read from the subscriber socket
  uint64_t control_read_ = 0;       // of messages_read_, heartbeats
  Clock::time_point last_check_{};  // of check_peers(): how long this thread was away
  // Reply frames the ROUTER did not take yet, with the replies each holds.
  std::deque<std::pair<std::vector<zmq::message_t>, std::size_t>> reply_backlog_;
  std::vector<ReplyBatch> reply_batches_;  // replies of this pass, per requester and endpoint
  absl::flat_hash_map<std::pair<std::string, const Bridged*>, std::size_t> reply_batch_at_;
  std::vector<void*> touched_;     // sockets to ask for their events before the next poll
  bool calls_queued_ = false;      // some peer's `calls` holds requests
  std::size_t messages_read_ = 0;  // by on_sub, on_router and on_dealer, for the read budget
  absl::flat_hash_map<std::string, uint32_t> round_robin_;
  absl::flat_hash_map<uint64_t, Pending> pending_;
  uint64_t last_correlation_ = 0;
  std::vector<std::pair<Bridged*, Outbox*>> queued_;
  Payloads payloads_;  // reused: its aligned buffer keeps its size across frames
  std::optional<Stall> stall_;
  std::size_t backlogged_ = 0;                                 // messages in peers' backlogs
  absl::flat_hash_map<std::string, std::size_t> subscribers_;  // remote ones, through XPUB
  absl::flat_hash_set<std::string> subscribed_;  // imported topics our SUB subscribes to
  TrafficRows traffic_;
  absl::flat_hash_set<std::string> logged_;
  NodeStats counters_;
  std::vector<std::pair<uint64_t, Clock::time_point>> goodbyes_;  // leaving nodes we confirm
  absl::flat_hash_set<uint64_t> goodbye_acks_;  // peers that confirmed our own goodbye
  Clock::time_point next_heartbeat_{};
  absl::flat_hash_map<std::string, RawHandler> taps_;  // by topic; "" is every topic
  absl::flat_hash_set<std::string> tapped_;            // subscribed for taps
  absl::flat_hash_map<std::string, std::unique_ptr<Bridged>> raw_calls_;  // call_raw channels
  Clock::time_point next_check_{};
  // Publishers found by membership sources (endpoint -> the sources that list it), and the
  // static ones (never dropped).
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> found_;
  absl::flat_hash_set<std::string> static_peers_;

  MembershipCounters membership_counters_;
  /// The membership, made on first need; under membership_mu_.
  Membership& membership();
  // Last: stopped before the bridge thread, which it posts to.
  mutable std::mutex membership_mu_;
  std::unique_ptr<Membership> membership_;  // under membership_mu_ (made on first need)
};

}  // namespace bus::net::detail
