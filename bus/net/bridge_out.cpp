// Outgoing: publishing through the gate, heartbeats, requests, queue messages and replies.
#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <tuple>

#include "bridge.hpp"

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

std::size_t Bridge::subscribers(std::string_view topic) const {
  std::size_t zmq = zmq_.subscribers(topic);
  std::size_t leaving = std::min(zmq, shm_.leaving(topic));
  return zmq - leaving + shm_.subscribers(topic);
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
  hb.setRequestEndpoint(zmq_.request_address());
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

}  // namespace bus::net::detail
