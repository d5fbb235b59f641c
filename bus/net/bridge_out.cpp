// Outgoing: publishing through the gate, requests, replies, queue messages, heartbeats; and the
// peers' lifecycle (liveness, reachability, subscriptions).
#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "bridge.hpp"
#include "shm_heap.hpp"

namespace bus::net::detail {

using namespace std::chrono_literals;

// ---- publishing ----------------------------------------------------------------------------

bool Bridge::oversized(const Bridged& channel, std::size_t bytes) {
  const std::size_t limit = opt_.message_limit_of(channel.name);
  if (bytes <= limit) return false;
  ++counters_.oversized;
  log_once(absl::StrCat("oversized-out:", channel.name),
           absl::StrCat("did not send a ", bytes, "-byte message on '", channel.name,
                        "': over its limit of ", limit,
                        " bytes (NodeOptions::message_limit, or max_message_bytes)"));
  return true;
}

void Bridge::queue_publish(Bridged& channel, Outbox& out) {
  if (!out.queued) {
    out.queued = true;
    queued_.emplace_back(&channel, &out);
  }
  if (out.bytes.size() >= kMaxBatchBytes && !gate_.holding()) flush_publishes();
}

void Bridge::publish_large(Bridged& channel, Outbox& out, bus::detail::MessageRef message) {
  // In order: what the open batch holds goes first, in a frame of its own.
  if (out.count > 0) {
    out.pieces.push_back({std::move(out.bytes), out.count, {}});
    out.bytes.clear();
    out.count = 0;
  }
  out.pieces.push_back({{}, 1, std::move(message)});
  if (!out.queued) {
    out.queued = true;
    queued_.emplace_back(&channel, &out);
  }
}

std::vector<Subscribers*> Bridge::subscribers_of(const OutFrame& frame) {
  std::vector<Subscribers*> to{&zmq_.publisher()};
  shm_.subscribers_of(frame, to);
  return to;
}

void Bridge::publish_frame(OutFrame frame) {
  std::vector<Subscribers*> to = subscribers_of(frame);
  if (!gate_.publish(std::move(frame), to)) {
    if (!retry_held()) ++counters_.publish_stalls;
  }
}

bool Bridge::retry_held() { return gate_.retry(counters_.publish_cuts); }

void Bridge::flush_publishes() {
  // A frame of `count` messages of `ch`: the next numbers, counted, and through the gate.
  auto publish = [this](Bridged& ch, Outbox& out, std::string bytes, uint32_t count,
                        bus::detail::MessageRef large) {
    EnvelopeFields env;
    env.kind = wire::Envelope::Kind::PUBLISH;
    env.type_id = ch.type_id;
    env.sender = id_;
    env.seq = out.next_seq;
    env.count = count;
    out.next_seq += count;
    counters_.published += count;
    ++counters_.publish_frames;
    if (subscribers(ch.name) > 0) traffic(ch.name, 0).sent += count;
    OutFrame f;
    f.channel = ch.name;
    f.envelope = encode_envelope(env);
    f.payload = std::move(bytes);
    f.large = std::move(large);
    f.count = count;
    f.topic = &ch;
    publish_frame(std::move(f));
  };
  std::size_t i = 0;
  for (; i < queued_.size() && !gate_.holding(); ++i) {
    auto [ch, out] = queued_[i];
    while (!out->pieces.empty() && !gate_.holding()) {
      Outbox::Piece piece = std::move(out->pieces.front());
      out->pieces.pop_front();
      publish(*ch, *out, std::move(piece.bytes), piece.count, std::move(piece.large));
    }
    if (!out->pieces.empty()) break;  // held: the rest goes, in order, when the gate opens
    out->queued = false;
    if (out->count == 0) continue;
    std::string bytes = std::move(out->bytes);
    out->bytes.clear();
    const uint32_t count = std::exchange(out->count, 0);
    publish(*ch, *out, std::move(bytes), count, {});
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(i));
}

uint64_t Bridge::sent_next(const Bridged& ch) const {
  // The held frame took its numbers when it was made; no subscriber has taken it yet.
  return ch.out.next_seq - gate_.held(&ch);
}

bool Bridge::heartbeat(bool leaving) {
  if (gate_.holding()) return false;
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::HEARTBEAT;
  env.type_id = capnp::typeId<wire::Heartbeat>();
  env.sender = id_;
  env.count = 1;
  OutFrame hb;
  hb.channel = kHeartbeatTopic;
  hb.envelope = encode_envelope(env);
  hb.handover = shm_.handovers();
  hb.payload = heartbeat_payload(leaving, hb.handover);
  // Like a topic frame, in order with them (its `published` counts on that): held while a
  // subscriber is full, at most send_stall_limit, then sent past it. A subscriber that is full
  // has our frames to read, and any frame proves us alive.
  publish_frame(std::move(hb));
  return true;
}

Clock::time_point Bridge::next_beat(Clock::time_point now) const {
  const auto period = std::chrono::duration_cast<Clock::duration>(opt_.heartbeat());
  if (period <= Clock::duration::zero()) return now;
  return Clock::time_point((now.time_since_epoch() / period + 1) * period);
}

std::string Bridge::heartbeat_payload(bool leaving, const std::vector<uint64_t>& handover) {
  capnp::MallocMessageBuilder builder;
  auto hb = builder.initRoot<wire::Heartbeat>();
  hb.setNode(id_);
  hb.setName(opt_.name());
  hb.setRequestEndpoint(zmq_.request_endpoint());
  hb.setIntervalMs(static_cast<uint32_t>(opt_.heartbeat().count()));
  hb.setLeaving(leaving);
  hb.setBatches(true);
  hb.setPublicKey(opt_.curve_keys().public_key);
  hb.setPublishEndpoint(advertised_publish_);
  if (shm_.on()) {
    const HostIdentity& host = HostIdentity::self();
    auto shm = hb.initShm();
    shm.setSocket(shm_socket_name(id_).substr(1));  // without the leading NUL
    shm.setBootId(host.boot_id);
    shm.setIpcNamespace(host.ipc_namespace);
    shm.setNetNamespace(host.net_namespace);
  }
  auto h = hb.initHandover(static_cast<unsigned>(handover.size()));
  for (unsigned i = 0; i < handover.size(); ++i) h.set(i, handover[i]);
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
  // Running totals (a lost heartbeat loses nothing): what we missed of each sender...
  auto missed = ledger_.missed();
  auto m = hb.initMissed(static_cast<unsigned>(missed.size()));
  for (unsigned i = 0; i < missed.size(); ++i) {
    m[i].setSender(std::get<0>(missed[i]));
    m[i].setChannel(*std::get<1>(missed[i]));
    m[i].setCount(std::get<2>(missed[i]));
  }
  // ...and how far our numbering went, so a receiver counts a lost tail too.
  std::vector<const Bridged*> topics;
  for (auto& ch : channels_) {
    if (ch->role == Bridged::Role::kExportTopic && sent_next(*ch) > 1) topics.push_back(ch.get());
  }
  auto published = hb.initPublished(static_cast<unsigned>(topics.size()));
  for (unsigned i = 0; i < topics.size(); ++i) {
    published[i].setChannel(topics[i]->name);
    published[i].setNext(sent_next(*topics[i]));
  }
  std::string payload;
  append_message(builder, payload);
  return payload;
}

// ---- requests and queue messages -----------------------------------------------------------

void Bridge::call(Bridged& channel, OutPayload payload, Clock::time_point deadline,
                  PrincipalPtr principal, std::unique_ptr<PendingCall> pending) {
  call_to(0, channel, std::move(payload), deadline, std::move(principal), std::move(pending));
}

void Bridge::call_to(uint64_t to, Bridged& channel, OutPayload payload, Clock::time_point deadline,
                     PrincipalPtr principal, std::unique_ptr<PendingCall> pending) {
  if (oversized(channel, payload.size())) {
    pending->finish(
        absl::ResourceExhaustedError(absl::StrCat("bus.net: request of ", payload.size(),
                                                  " bytes is over its channel's limit")),
        {});
    return;
  }
  PeerState* peer = nullptr;
  if (to != 0) {
    peer = peers_.find(to);
    if (peer == nullptr) {
      pending->finish(absl::UnavailableError(absl::StrCat("bus.net: node ", to, " is not live")),
                      {});
      return;
    }
    if (peer->route == nullptr) {
      pending->finish(absl::FailedPreconditionError(
                          absl::StrCat("bus.net: node '", peer->name, "' (", to,
                                       ") is live but has no request socket: it cannot be asked")),
                      {});
      return;
    }
  } else {
    peer = peers_.pick(channel, /*endpoint=*/true);
  }
  if (peer == nullptr) {
    pending->finish(
        absl::UnavailableError(absl::StrCat("bus.net: no live node serves '", channel.name, "'")),
        {});
    return;
  }
  if (!peer->batches || payload.large) {
    // Alone in its frame: the requester does not read batches, or it is a large message, which
    // goes as it is (read in place by a peer that shares memory).
    CallBatch::Call one{deadline, std::move(pending)};
    return send_calls(*peer, channel, payload.view(), {&one, 1}, principal,
                      payload.large ? &payload.large : nullptr);
  }
  // Requests to one peer on one endpoint go out together when this pass ends: one frame, one
  // envelope, one transport message for the lot. The envelope names one principal: requests for
  // another go in a batch of their own (the edge hands out one principal per token, so a
  // client's requests share one).
  auto b = std::find_if(peer->calls.begin(), peer->calls.end(), [&](const CallBatch& c) {
    return c.channel == &channel && c.principal == principal;
  });
  if (b == peer->calls.end()) {
    b = peer->calls.emplace(peer->calls.end());
    b->channel = &channel;
    b->principal = std::move(principal);
  }
  b->bytes.append(payload.bytes);
  b->calls.push_back({deadline, std::move(pending)});
  calls_queued_ = true;
  if (b->calls.size() >= kSendBatchItems || b->bytes.size() >= kMaxBatchBytes) {
    send_batch(*peer, static_cast<std::size_t>(b - peer->calls.begin()));
  }
}

void Bridge::send_batch(PeerState& peer, std::size_t i) {
  // Taken out first: a call that fails here finishes at once, and its callback (a raw call's)
  // may queue another request, growing peer.calls under us.
  Bridged& channel = *peer.calls[i].channel;
  std::string bytes = std::move(peer.calls[i].bytes);
  std::vector<CallBatch::Call> calls = std::move(peer.calls[i].calls);
  PrincipalPtr principal = std::move(peer.calls[i].principal);
  peer.calls[i].bytes.clear();
  peer.calls[i].calls.clear();
  send_calls(peer, channel, bytes, calls, principal);
}

void Bridge::send_calls(PeerState& peer, Bridged& channel, std::string_view payloads,
                        std::span<CallBatch::Call> calls, const PrincipalPtr& principal,
                        const bus::detail::MessageRef* large) {
  if (calls.empty()) return;
  EnvelopeFields env;
  env.principal = principal;
  env.kind = wire::Envelope::Kind::REQUEST;
  env.type_id = channel.type_id;
  env.sender = id_;
  env.count = static_cast<uint32_t>(calls.size());
  auto now = Clock::now();
  auto timeout_us = [&](Clock::time_point deadline) -> uint64_t {
    auto left = deadline - now;
    return left > Clock::duration::zero()
               ? static_cast<uint64_t>(duration_cast<microseconds>(left).count())
               : 0;
  };
  uint64_t first = last_correlation_ + 1;
  if (calls.size() == 1) {
    env.correlation = first;
    env.timeout_us = timeout_us(calls[0].deadline);
  } else {
    env.items.resize(calls.size());
    for (std::size_t i = 0; i < calls.size(); ++i) {
      env.items[i].correlation = first + i;
      env.items[i].timeout_us = timeout_us(calls[i].deadline);
    }
  }
  if (!peer.route->send(channel.name, env, payloads, large)) {
    counters_.send_refused += calls.size();
    for (auto& c : calls) {
      c.pending->finish(absl::ResourceExhaustedError(absl::StrCat(
                            "bus.net: no room toward node '", peer.name, "' for '", channel.name,
                            "' (it is not taking requests as fast as they come)")),
                        {});
    }
    return;
  }
  last_correlation_ += calls.size();
  ++counters_.request_frames;
  traffic(channel.name, peer.id).sent += calls.size();
  const uint64_t link = peer.transport == TransportKind::kShm ? peer.link : 0;
  for (std::size_t i = 0; i < calls.size(); ++i) {
    pending_.emplace(first + i, Pending{peer.id, &channel, calls[i].deadline,
                                        std::move(calls[i].pending), link});
  }
}

void Bridge::flush_calls() {
  if (!calls_queued_) return;
  calls_queued_ = false;
  for (auto& [id, peer] : peers_) {
    for (std::size_t i = 0; i < peer.calls.size(); ++i) {
      if (!peer.calls[i].calls.empty()) send_batch(peer, i);
    }
    // A batch per principal would pile up with every new client: only the principal-less ones
    // (one per endpoint) are kept for their buffers.
    std::erase_if(peer.calls,
                  [](const CallBatch& b) { return b.principal != nullptr && b.calls.empty(); });
  }
}

void Bridge::flush_batches() {
  flush_calls();
  replies_.flush([this](ReplyBatch& b) { send_reply_batch(b); });
  flush_publishes();
  shm_.wake_written();  // once a pass, for all it wrote to each link
}

absl::Status Bridge::send(Bridged& channel, OutPayload payload) {
  PeerState* peer = peers_.pick(channel, /*endpoint=*/false);
  absl::Status st;
  if (oversized(channel, payload.size())) {
    st = absl::ResourceExhaustedError("bus.net: queue message over its channel's limit");
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
    // Over ZeroMQ even to a linked peer: its receiver takes them in their numbered order, and a
    // switch of path mid-stream (the link coming up or going) would let later ones overtake
    // earlier ones, which it would then drop as old. Requests need no order and move.
    PeerRoute* route = zmq_.route(peer->id);
    if (route == nullptr) route = peer->route;
    if (route->send(channel.name, env, payload.view(), payload.large ? &payload.large : nullptr)) {
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

// ---- replies -------------------------------------------------------------------------------

void Bridge::reply(Bridged& channel, const RemoteCall& to, const absl::Status& status,
                   OutPayload payload) {
  if (status.ok() && oversized(channel, payload.size())) {
    return reply(channel, to,
                 absl::ResourceExhaustedError("bus.net: reply over its channel's limit"), {});
  }
  if (to.batched && !payload.large) {
    // With the other replies to that requester on that endpoint, when this pass ends.
    replies_.add(to, channel, status, payload.bytes,
                 [this](ReplyBatch& b) { send_reply_batch(b); });
    return;
  }
  // One reply, alone in its frame: the requester does not read batches.
  std::vector<BatchItem> one(1);
  one[0].correlation = to.correlation;
  one[0].code = static_cast<uint16_t>(status.code());
  if (!status.ok()) one[0].detail = std::string(status.message());
  ++traffic(channel.name, known(to.peer)).sent;
  send_replies(to.to, channel.name, channel.reply_type_id, one, payload.view(),
               payload.large ? &payload.large : nullptr);
}

void Bridge::send_reply_batch(ReplyBatch& b) {
  if (b.items.empty()) return;
  traffic(b.channel->name, known(b.peer)).sent += b.items.size();
  send_replies(b.to, b.channel->name, b.channel->reply_type_id, b.items, b.bytes);
  b.items.clear();
  b.bytes.clear();
  b.envelope_bytes = 0;
}

void Bridge::send_replies(const ReplyTo& to, std::string_view name, uint64_t reply_type_id,
                          std::vector<BatchItem>& items, std::string_view payloads,
                          const bus::detail::MessageRef* large) {
  std::size_t n = items.size();
  auto with_payload = static_cast<uint32_t>(
      std::count_if(items.begin(), items.end(), [](const BatchItem& i) { return i.code == 0; }));
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::REPLY;
  env.sender = id_;
  env.type_id = with_payload > 0 ? reply_type_id : 0;
  env.count = with_payload;
  if (n == 1) {
    env.correlation = items[0].correlation;
    env.code = items[0].code;
    env.detail = std::move(items[0].detail);
  } else {
    env.items = std::move(items);
  }
  if (to.link != 0) {
    shm_.reply(to.link, name, encode_envelope(env), payloads,
               large != nullptr ? *large : bus::detail::MessageRef(), n);
  } else {
    zmq_.reply(to.identity, name, encode_envelope(env), payloads, n);
  }
}

void Bridge::reply_unexported(const RemoteCall& call, absl::string_view name) {
  std::vector<BatchItem> one(1);
  one[0].correlation = call.correlation;
  one[0].code = static_cast<uint16_t>(absl::StatusCode::kUnavailable);
  one[0].detail = absl::StrCat("bus.net: '", name, "' is not exported by node ", opt_.name());
  send_replies(call.to, std::string_view(name.data(), name.size()), 0, one, {});
}

// ---- peers ---------------------------------------------------------------------------------

void Bridge::update_subscriptions() {
  // Only topics with local subscribers are subscribed to, so other nodes' publishers (and their
  // filtering) do not send us what nobody here reads.
  for (auto& [name, ch] : import_topics_) {
    bool want = ch->wanted(*this);
    if (want == subscribed_.contains(name)) continue;
    zmq_.filter(name, want);
    for (const auto& [node, lp] : linked_) shm_.subscribe(node, name, want);
    if (want) {
      subscribed_.insert(name);
    } else {
      subscribed_.erase(name);
      // What is published while we do not listen is not lost: after a new subscription, the
      // first frame starts the count again.
      ledger_.restart(name);
    }
    next_heartbeat_ = Clock::now();  // our imports changed: tell the peers
  }
  for (const auto& [name, fn] : taps_) {
    if (subscribed_.contains(name) || !tapped_.insert(name).second) continue;
    zmq_.filter(name, true);  // "" (every topic) included
    for (const auto& [node, lp] : linked_) shm_.subscribe(node, name, true);
  }
}

void Bridge::check_peers() {
  // Silence counts only while we keep up with what arrives: a peer whose frames wait unread
  // here (this thread was held up, or reads slower than they come) is not silent.
  const bool behind = zmq_.behind();
  std::vector<uint64_t> dead = peers_.silent([&](const PeerState& p) {
    return p.transport == TransportKind::kShm
               ? shm_.input_waiting(p.id)
               : ZmqTransport::input_waiting(p, behind, topic_frames_);
  });
  ledger_.bound();
  // A handover that does not come within dead_after heartbeats (the publisher's ZeroMQ
  // connection to us is not up, say) is given up: its topics stay on ZeroMQ.
  std::vector<uint64_t> stuck;
  for (const auto& [node, lp] : linked_) {
    if (lp.moving && Clock::now() - lp.since > opt_.dead_after_time()) stuck.push_back(node);
  }
  for (uint64_t node : stuck) abandon_handover(node, "no heartbeat naming this node came");
  for (uint64_t id : dead) {
    const PeerState* found = peers_.find(id);
    if (found == nullptr) continue;  // forgotten meanwhile (a call's callback, say)
    const PeerState& p = *found;
    ++counters_.peers_lost;
    peers_.declared_dead(id);
    std::string name = p.name;
    // Its connection to us is re-made rather than left to TCP: a connection that crossed a
    // network partition comes back only when TCP retransmits again, seconds after the network
    // did (its timer backs off, doubling), where a new one comes up at the first connect
    // attempt. Our request socket to it goes with forget_peer(); its publisher, at its end,
    // sees our new connection and our subscriptions again.
    if (p.transport == TransportKind::kZmq && !linked_.contains(id)) {
      std::string e = listening_at(p.publish_endpoint);
      // Not a kept one (forget_peer() drops it), nor one a node that took its place speaks on.
      if (!e.empty() && !kept_.contains(e) && !heard_at(e, id)) {
        if (zmq_.relisten(e)) ++counters_.reconnects;
      }
    }
    forget_peer(id,
                absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", name,
                                                "' was silent for ", opt_.dead_after(),
                                                " heartbeats with the request in flight")),
                Forget::kMayReturn);
  }
}

void Bridge::forget_peer(uint64_t id, const absl::Status& why, Forget how) {
  PeerState* p = peers_.find(id);
  if (p == nullptr) return;
  lanes_->peer_gone(id, why);
  // Fail what was in flight on it now, not at the deadline.
  std::vector<uint64_t> failed;
  for (auto& [corr, pend] : pending_) {
    if (pend.peer == id) failed.push_back(corr);
  }
  for (uint64_t corr : failed) {
    auto node = pending_.extract(corr);
    ++counters_.calls_peer_gone;
    node.mapped().call->finish(why, {});
  }
  // Requests batched for it but not sent: failed once it is gone (a callback that calls again
  // then cannot pick it).
  p = peers_.find(id);  // a finished call may have changed the table
  if (p == nullptr) return;
  std::vector<CallBatch> unsent = std::move(p->calls);
  const std::string endpoint = listening_at(p->publish_endpoint);
  zmq_.close_route(id);
  peers_.erase(id);
  // Kept after etcd dropped it because it was alive: no longer (unless a node that took its
  // place there is).
  if (kept_.contains(endpoint) && !heard_at(endpoint)) {
    kept_.erase(endpoint);
    drop_member(endpoint);
  }
  if (how == Forget::kForGood) {
    ledger_.forget_for_good(id);
    linked_.erase(id);  // what waited for its handover goes with it
  }
  ledger_.fold(id);
  update_reachability();
  for (CallBatch& b : unsent) {
    for (auto& c : b.calls) {
      ++counters_.calls_peer_gone;
      c.pending->finish(why, {});
    }
  }
}

void Bridge::update_reachability() {
  // The lanes learn the servers first: a call routed to a proxy as soon as it is reachable finds
  // its servers there.
  absl::flat_hash_map<std::string, std::vector<DirectServer>> direct;
  for (Bridged* ch : imported_calls_) {
    if (ch->role != Bridged::Role::kImportEndpoint) continue;
    for (const auto& [id, p] : peers_) {
      if (PeerTable::serves(p, *ch, true)) {
        direct[ch->name].push_back(
            {id, p.name, p.request_endpoint, p.public_key, p.transport == TransportKind::kShm});
      }
    }
  }
  lanes_->set_servers(std::move(direct));
  for (Bridged* ch : imported_calls_) {
    bool endpoint = ch->role == Bridged::Role::kImportEndpoint;
    bool reachable = false;
    for (const auto& [id, p] : peers_) reachable = reachable || PeerTable::serves(p, *ch, endpoint);
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
  changed();  // peers or what they serve changed
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

std::vector<PeerInfo> Bridge::peers() const {
  std::vector<PeerInfo> out;
  auto now = Clock::now();
  for (const auto& [id, p] : peers_) {
    PeerInfo i;
    i.id = id;
    i.name = p.name;
    i.request_endpoint = p.request_endpoint;
    auto info = [](const ChannelDesc& c, bool served) {
      ChannelInfo ci;
      ci.name = c.name;
      ci.kind = c.kind == wire::Channel::Kind::ENDPOINT ? ChannelInfo::Kind::kEndpoint
                : c.kind == wire::Channel::Kind::QUEUE  ? ChannelInfo::Kind::kQueue
                                                        : ChannelInfo::Kind::kTopic;
      ci.type_id = c.type_id;
      ci.reply_type_id = c.reply_type_id;
      ci.served = served;
      return ci;
    };
    for (const auto& s : p.serves) {
      i.serves.push_back(s.name);
      i.channels.push_back(info(s, true));
    }
    for (const auto& s : p.imports) {
      i.imports.push_back(s.name);
      i.channels.push_back(info(s, false));
    }
    i.since_heartbeat = duration_cast<milliseconds>(now - p.last_seen);
    i.transport =
        p.transport == TransportKind::kShm ? Transport::kSharedMemory : Transport::kZeroMq;
    out.push_back(std::move(i));
  }
  return out;
}

NodeStats Bridge::stats() const {
  NodeStats s = counters_;
  membership_counters_.add_to(s);
  s.shm_heap_bytes = ShmHeap::instance().in_use();
  s.shm_pinned_bytes = shm_.pinned_bytes();
  s.peers = peers();
  TrafficRows rows = ledger_.rows([this](uint64_t peer) { return known(peer); });
  lanes_->add_to(s, rows);  // calls made on their callers' threads
  for (const auto& [key, t] : rows) {
    ChannelTraffic row = t;
    const PeerState* p = peers_.find(key.second);
    row.peer_name = p != nullptr ? p->name : (key.second == 0 ? "" : "?");
    s.traffic.push_back(std::move(row));
  }
  return s;
}

std::size_t Bridge::subscribers(std::string_view topic) const {
  std::size_t zmq = zmq_.subscribers(topic);
  std::size_t leaving = std::min(zmq, shm_.leaving(topic));
  return zmq - leaving + shm_.subscribers(topic);
}

bool Bridge::serves(std::string_view channel) const {
  for (const auto& [id, p] : peers_) {
    if (p.route == nullptr) continue;
    for (const auto& s : p.serves) {
      if (s.name == channel) return true;
    }
  }
  return false;
}

}  // namespace bus::net::detail
