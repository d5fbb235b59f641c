// The bridge thread of a Node: the protocol (peers, sequences, requests, replies, publishing),
// driving the transports that carry it. docs/net.md draws the pieces.
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
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "batches.hpp"
#include "bus/net/node.hpp"
#include "direct.hpp"
#include "frames.hpp"
#include "membership.hpp"
#include "peers.hpp"
#include "publish_gate.hpp"
#include "sequences.hpp"
#include "shm_transport.hpp"
#include "wire.hpp"
#include "zmq_transport.hpp"

namespace bus::net::detail {

/// A node's figures (what its StatsD source sends).
void node_figures(const NodeStats& s, StatsdSink& out);
/// Per (channel, peer) figures for $bus.stats: what was missed each way.
void peer_figures(const NodeStats& s, StatsdSink& out);

class Bridge final : public Link, private FrameSink, private ShmTransport::Events {
 public:
  Bridge(Bus& bus, NodeOptions options);
  ~Bridge() override;

  void stop();
  void add(std::unique_ptr<Bridged> channel);
  /// Listens to `peer` from now on (a host name: resolved again and again by the membership).
  void add_peer(const Peer& peer);
  /// Bridge thread: the publishers `source` (etcd, or one DNS name) finds now, replacing what it
  /// found before. One that no source lists any more is no longer listened to (its heartbeats
  /// stop, and it is declared dead as any silent node); a static peer always is. But one that
  /// etcd drops while its node is heard is kept until liveness declares that node dead: etcd
  /// drops a node whose lease ran out, and a node cut off from etcd, not from us, is alive.
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
  const std::string& publish_address() const { return zmq_.publish_address(); }
  const std::string& request_address() const { return zmq_.request_address(); }
  std::vector<PeerInfo> peers() const;
  NodeStats stats() const;
  std::size_t subscribers(std::string_view topic) const;
  bool serves(std::string_view channel) const;

  // Link
  Bus& bus() override { return bus_; }
  ExternalInbox& inbox() override { return *inbox_; }
  const Limits& limits() const override { return limits_; }
  void queue_publish(Bridged& channel, Outbox& out) override;
  void publish_large(Bridged& channel, Outbox& out, bus::detail::MessageRef message) override;
  bool oversized(const Bridged& channel, std::size_t bytes) override;
  void call(Bridged& channel, OutPayload payload, Clock::time_point deadline,
            PrincipalPtr principal, std::unique_ptr<PendingCall> pending) override;
  std::shared_ptr<DirectCalls> direct_calls() override { return lanes_; }
  /// call(), to node `to` (0: any live node serving the channel).
  void call_to(uint64_t to, Bridged& channel, OutPayload payload, Clock::time_point deadline,
               PrincipalPtr principal, std::unique_ptr<PendingCall> pending);

  // Untyped access (Node::tap, publish_raw, call_raw), on the bridge thread.
  void tap(std::string topic, RawHandler fn);
  absl::StatusOr<std::size_t> publish_raw(const std::string& topic, uint64_t type_id,
                                          const std::string& payload);
  void call_raw(std::string endpoint, uint64_t type_id, uint64_t reply_type_id, uint64_t peer,
                std::string payload, Clock::time_point deadline, RawReply done);
  absl::Status send(Bridged& channel, OutPayload payload) override;
  void reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
             OutPayload payload) override;

 private:
  struct Pending {
    uint64_t peer;
    Bridged* channel;
    Clock::time_point deadline;
    std::unique_ptr<PendingCall> call;
    uint64_t link;  // the shared-memory link it went over (0: ZeroMQ)
  };
  /// Why a peer is forgotten: it may come back (silence), or it never will (it left, or a new
  /// run of it took its address).
  enum class Forget { kMayReturn, kForGood };
  /// What one pass of the loop saw and did, shared by its steps.
  struct Pass {
    PollSet set;
    std::size_t at_wake = 0, at_inbox = 0;
    bool inbox_due = false;     // a timer of the inbox is due
    bool fresh_stall = false;   // a frame was held less than kSpin ago
    std::size_t work = 0;       // records drained and messages read
    std::size_t read_work = 0;  // of `work`, messages read from peers (heartbeats aside)
    bool paused = false;        // local input held back this pass
    bool quick = false;         // spinning on shared memory: no poll(2), links' rings only
  };

  void run(std::promise<void>& ready);
  void setup();
  void loop();
  void shutdown();
  void wake();
  void run_commands();
  /// Bridge thread: subscriptions or peers changed; wakes wait_until().
  void changed();

  // ---- the loop's steps (bridge.cpp) -----------------------------------------------------
  /// Gathers what to wait on and waits in poll(2), no longer than the next thing due.
  void wait_for_work(Pass& pass);
  /// Reads every transport's input, within the read budget.
  void read_peers(Pass& pass);
  /// Drains the local inbox (what local publishers and requesters handed over), unless a
  /// subscriber or a peer holds local input back.
  void take_local_input(Pass& pass);
  /// Keeps polling without blocking while traffic flows, else arms the inbox for the next wait.
  void spin_or_rest(const Pass& pass);
  /// Heartbeats when due; liveness and sweeps once per heartbeat.
  void beat_and_check();

  // ---- incoming (bridge_in.cpp) ----------------------------------------------------------
  // FrameSink
  void on_frame(const InFrame& frame) override;
  void on_malformed(absl::string_view from, const absl::Status& why) override;
  void on_subscription(const std::string& topic, bool added, bool link) override;
  void on_torn(absl::string_view channel, const std::string& envelope) override;
  std::size_t messages_read() const override { return messages_read_; }
  NodeStats& counters() override { return counters_; }
  void log_once(const std::string& key, const std::string& what) override;

  /// A publish (from a publisher's stream, or sent straight to this node): to the imported
  /// topic's subscribers and to taps.
  void on_publish(absl::string_view name, const EnvelopeFields& env, const Payloads& payloads);
  void on_request(const InFrame& frame, EnvelopeFields& env);
  void on_reply(const InFrame& frame, EnvelopeFields& env);
  void on_heartbeat(const EnvelopeFields& env, kj::ArrayPtr<const capnp::word> payload,
                    Stream stream);
  /// A "$bus.stats" request: answers this node's figures.
  void serve_stats(const RemoteCall& call);
  /// Delivers payloads of a publish or send (the first `take` of them), counting sequence gaps
  /// per (sender, channel).
  void deliver(Bridged& ch, const EnvelopeFields& env, const Payloads& payloads,
               uint32_t take = UINT32_MAX);
  /// A new peer was heard: how to send it requests, and whether it replaced an older run.
  void welcome(PeerState& p);
  /// A heartbeat says its node takes shared-memory links: link to it if it is on this host.
  void offer_link(uint64_t id, const wire::Heartbeat::Reader& hb);

  // ---- shared-memory links (bridge_links.cpp) ----------------------------------------------
  // ShmTransport::Events
  void on_link_up(uint64_t link, uint64_t peer, const std::string& publish_address) override;
  void on_link_down(uint64_t link, uint64_t peer, bool died, const std::string& why,
                    const Subscribers* publisher) override;
  /// The listened-to address (static, found or kept) that names the publisher at `address`, or
  /// "": for a peer on this host, whose link says what its publisher bound (a wildcard host
  /// matches any listened-to address with its port).
  std::string listened_address(const std::string& address) const;
  /// `address` when this node listens to a publisher there (static, found or kept), else "".
  /// Exact: what a peer's heartbeats advertise is matched with what it is listed by.
  std::string listening_at(const std::string& address) const;
  /// What this node takes of other nodes' topics: the heartbeats, imports with subscribers, taps.
  std::vector<std::string> topic_filters() const;

  // ---- outgoing (bridge_out.cpp) ---------------------------------------------------------
  /// Sends what the pass batched: requests, replies and topic messages.
  void flush_batches();
  /// Sends one request or a batch (`calls` in the order of `payloads`); fails them all when
  /// the peer takes nothing more.
  void send_calls(PeerState& peer, Bridged& channel, std::string_view payloads,
                  std::span<CallBatch::Call> calls, const PrincipalPtr& principal,
                  const bus::detail::MessageRef* large = nullptr);
  /// Sends peer.calls[i] (see send_calls()).
  void send_batch(PeerState& peer, std::size_t i);
  void flush_calls();
  void send_reply_batch(ReplyBatch& b);
  /// One reply frame for `items` (a single reply's envelope when there is one), with the
  /// payloads of the items whose code is 0, to `to`.
  void send_replies(const ReplyTo& to, std::string_view name, uint64_t reply_type_id,
                    std::vector<BatchItem>& items, std::string_view payloads,
                    const bus::detail::MessageRef* large = nullptr);
  /// An UNAVAILABLE reply for a request on an endpoint this node does not export.
  void reply_unexported(const RemoteCall& call, absl::string_view name);
  void flush_publishes();
  /// Publishes `frame` to every subscriber (held by the gate while one is full).
  void publish_frame(OutFrame frame);
  /// Offers the held frame again; true when nothing is held.
  bool retry_held();
  /// The subscribers a published frame goes to, whatever their transport.
  std::vector<Subscribers*> subscribers_of(const OutFrame& frame);
  /// The number the next message on `ch` takes, counting only what left.
  uint64_t sent_next(const Bridged& ch) const;
  /// Sends a heartbeat like a topic frame (held while a subscriber is full, then sent past it).
  /// False when a held frame is ahead of it: try again on the next pass.
  bool heartbeat(bool leaving);
  /// When the heartbeat after one sent at `now` is due: the next multiple of the period on the
  /// monotonic clock, which every process of a host shares, so that the nodes of a host beat
  /// together and each wakes once for many peers' heartbeats rather than once for each. At
  /// most a period away (a heartbeat sent early, to a newcomer, only shortens the gap).
  Clock::time_point next_beat(Clock::time_point now) const;
  std::string heartbeat_payload(bool leaving, const std::vector<uint64_t>& handover);

  // ---- peers (bridge_peers.cpp) ----------------------------------------------------------
  /// Listens to a publisher's address.
  void listen(const Peer& peer);
  /// No longer listens to the publisher at `address` (found by membership), over either way.
  void drop_member(const std::string& address);
  /// A live peer (other than `except`) is heard through the publisher listened to at `address`.
  bool heard_at(const std::string& address, uint64_t except = 0) const;
  void check_peers();
  void forget_peer(uint64_t id, const absl::Status& why, Forget how);
  void update_reachability();
  void update_subscriptions();
  void sweep_pending();
  /// Frames waiting for room toward peers, over every transport.
  std::size_t backlogged() const { return zmq_.backlogged() + shm_.backlogged(); }
  /// `sender` if it is a live peer, else 0 (rows for unknown senders are folded together).
  uint64_t known(uint64_t sender) const { return peers_.contains(sender) ? sender : 0; }
  ChannelTraffic& traffic(const std::string& channel, uint64_t peer) {
    return ledger_.traffic(channel, peer);
  }

  Bus& bus_;
  const NodeOptions opt_;
  const Limits limits_;
  const uint64_t id_;

  // The transports. Closed by shutdown(), on the bridge thread.
  ZmqTransport zmq_;
  ShmTransport shm_;
  std::unique_ptr<ExternalInbox> inbox_;
  int wake_fd_ = -1;
  // Callers in a call keep it alive; their sockets close when the call ends, which the
  // context's close waits for.
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
  PeerTable peers_;
  SequenceLedger ledger_;
  PublishGate gate_;
  ReplyBatcher replies_;
  uint64_t topic_frames_ = 0;      // frames read from publishers' topic streams (ZeroMQ)
  uint64_t control_read_ = 0;      // of messages_read_, heartbeats
  std::size_t messages_read_ = 0;  // from every stream, for the read budget
  bool calls_queued_ = false;      // some peer's `calls` holds requests
  absl::flat_hash_map<uint64_t, Pending> pending_;
  /// Ends with `why` every call in flight for which `lost(pending)` holds (its peer or link is
  /// gone: failed now, not at its deadline), counted as calls_peer_gone.
  template <class Lost>
  void fail_calls(Lost lost, const absl::Status& why) {
    std::vector<uint64_t> failed;
    for (auto& [corr, pend] : pending_) {
      if (lost(pend)) failed.push_back(corr);
    }
    for (uint64_t corr : failed) {
      auto node = pending_.extract(corr);
      ++counters_.calls_peer_gone;
      node.mapped().call->finish(why, {});
    }
  }
  uint64_t last_correlation_ = 0;
  std::vector<std::pair<Bridged*, Outbox*>> queued_;
  Payloads payloads_;  // reused: its aligned buffer keeps its size across frames
  absl::flat_hash_set<std::string> subscribed_;  // imported topics subscribed to
  absl::flat_hash_set<std::string> logged_;
  NodeStats counters_;
  std::vector<std::pair<uint64_t, Clock::time_point>> goodbyes_;  // leaving nodes we confirm
  absl::flat_hash_set<uint64_t> goodbye_acks_;         // peers that confirmed our own goodbye
  absl::flat_hash_map<std::string, RawHandler> taps_;  // by topic; "" is every topic
  absl::flat_hash_set<std::string> tapped_;            // subscribed for taps
  absl::flat_hash_map<std::string, std::unique_ptr<Bridged>> raw_calls_;  // call_raw channels
  // The loop's clocks and state across passes.
  Clock::time_point next_heartbeat_{};
  Clock::time_point next_check_{};
  Clock::time_point next_ask_all_{};
  Clock::time_point last_work_{};
  Clock::time_point next_full_pass_{};  // while spinning on shared memory (see wait_for_work)
  std::string advertised_publish_;      // what our heartbeats say (see advertised_publish())
  bool awake_ = false;  // traffic flows: poll without blocking, keep the inbox awake
  bool armed_ = false;  // the inbox's producers write its eventfd (see take_local_input)
  // Publishers found by membership sources (address -> the sources that list it), and the
  // static ones (never dropped).
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> found_;
  absl::flat_hash_set<std::string> static_peers_;
  // Publishers etcd no longer lists whose nodes were still heard: listened to until they die.
  absl::flat_hash_set<std::string> kept_;
  /// A publisher listened to over its shared-memory link instead of ZeroMQ. Its topics move
  /// without a loss, a duplicate or a reordering. The link carries nothing of them before the
  /// publisher's first heartbeat naming this node (`handover`), and everything after it; ZeroMQ
  /// carries everything until this node lets go of it. While it moves, topic frames from both
  /// wait here; when a heartbeat naming this node comes over ZeroMQ (behind everything ZeroMQ
  /// brought before), the subscriber socket lets go, and per topic the ZeroMQ frames below the
  /// link's first number (its first heartbeat's `published`) are read, then the link's frames.
  struct LinkedPublisher {
    std::string address;  // what the subscriber socket was (and is again, when the link goes)
    bool moving = true;   // until the handover
    bool replay = false;  // the handover came: read what waits after this read step
    Clock::time_point since;
    struct Frame {
      std::string channel, envelope, payload;
      /// This frame, as read from `stream`, to hand to on_frame() (valid while it lives).
      InFrame as_read(Stream stream) const {
        InFrame f;
        f.stream = stream;
        f.channel = channel;
        f.envelope = envelope.data();
        f.envelope_size = envelope.size();
        f.payload = payload.data();
        f.payload_size = payload.size();
        return f;
      }
    };
    std::deque<Frame> zmq, link;  // what waits, from each
    std::size_t bytes = 0;
  };
  /// A topic frame of a publisher in `linked_`: true when it waits (or, a ZeroMQ copy of one
  /// that moved, is dropped); false when it is read now.
  bool handover_takes(const InFrame& f, const EnvelopeFields& env);
  absl::flat_hash_map<uint64_t, LinkedPublisher> linked_;  // by publisher node
  /// Reads what waited for the handovers that came.
  void replay_handovers();
  void replay_handover(uint64_t node);
  /// Gives up moving `node`'s topics to its link (its handover did not come): ZeroMQ it is.
  void abandon_handover(uint64_t node, const char* why);

  MembershipCounters membership_counters_;
  /// The membership, made on first need; under membership_mu_.
  Membership& membership();
  // Last: stopped before the bridge thread, which it posts to.
  mutable std::mutex membership_mu_;
  std::unique_ptr<Membership> membership_;  // under membership_mu_ (made on first need)
};

}  // namespace bus::net::detail
