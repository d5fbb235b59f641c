#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <stdexcept>
#include <tuple>

#include "bridge.hpp"
#include "bus/detail/pool.hpp"

namespace bus::net::detail {

using namespace std::chrono_literals;

// ---- outgoing ------------------------------------------------------------------------------

namespace {
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
}  // namespace

// ZeroMQ queues a multipart message atomically: once the first part is accepted, the others are
// too (they go to the same pipe), so only the first send can say EAGAIN (false here). A ROUTER
// with MANDATORY throws EHOSTUNREACH on the first part for a requester that is gone.
bool Bridge::send_all(zmq::socket_t& s, std::vector<zmq::message_t>& parts) {
  touched(s.handle());
  if (!s.send(parts[0], zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return false;
  for (std::size_t i = 1; i < parts.size(); ++i) {
    s.send(parts[i], i + 1 < parts.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  return true;
}

bool Bridge::send_parts(zmq::socket_t& s, std::string_view channel, const EnvelopeFields& env,
                        std::string_view payload) {
  touched(s.handle());
  std::string e = encode_envelope(env);
  // As send_all(): only the first part can be refused.
  if (!s.send(zmq::buffer(channel), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
    return false;
  }
  s.send(zmq::buffer(e), zmq::send_flags::sndmore);
  s.send(frame(payload), zmq::send_flags::none);
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
  parts.push_back(frame(payload));
  peer.backlog.push_back(std::move(parts));
  ++backlogged_;
  return true;
}

void Bridge::flush_peer_backlogs() {
  for (auto& [id, peer] : peers_) {
    while (!peer.backlog.empty()) {
      if (!send_all(*peer.dealer, peer.backlog.front())) break;
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
    ++counters_.publish_frames;
    if (subscribers_.contains(ch->name)) {
      ChannelTraffic& t = traffic(ch->name, 0);
      t.sent += out->count;
    }
    std::string e = encode_envelope(env);
    Stall stall;
    stall.parts.emplace_back(ch->name.data(), ch->name.size());
    stall.parts.emplace_back(e.data(), e.size());
    stall.parts.push_back(frame(out->bytes));
    stall.count = out->count;
    stall.channel = ch;
    out->bytes.clear();
    out->count = 0;
    stall_ = std::move(stall);
    stall_->since = Clock::now();
    if (!retry_stall()) ++counters_.publish_stalls;
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(i));
}

bool Bridge::retry_stall() {
  if (!stall_) return true;
  // NODROP: a full subscriber queue refuses the frame for everyone (ZeroMQ cannot tell which
  // subscriber is full), which holds the frame back: the back-pressure that keeps a subscriber
  // that is only a little slower, or pauses briefly, from losing anything.
  if (send_all(*xpub_, stall_->parts)) {
    stall_.reset();
    return true;
  }
  if (Clock::now() - stall_->since < opt_.send_stall_limit()) return false;
  ++counters_.publish_cuts;
  log_once("cut",
           absl::StrCat("a subscriber's queue stayed full for ", opt_.send_stall_limit().count(),
                        " ms: sending on without it (it counts what it misses)"));
  // Without NODROP, ZeroMQ writes the frame to every subscriber with room and skips a full one.
  // It then leaves that one out of every send, NODROP or not, until half of its queue is read:
  // a stopped subscriber is passed over from now on, while the others still hold the publisher
  // back when they are full (and are waited for, up to the limit).
  xpub_->set(zmq::sockopt::xpub_nodrop, 0);
  (void)send_all(*xpub_, stall_->parts);  // never refused without NODROP
  xpub_->set(zmq::sockopt::xpub_nodrop, 1);
  stall_.reset();
  return true;
}

uint64_t Bridge::sent_next(const Bridged& ch) const {
  // The held frame took its numbers when it was made; the socket has not taken it yet.
  return ch.out.next_seq - (stall_ && stall_->channel == &ch ? stall_->count : 0);
}

bool Bridge::heartbeat(bool leaving) {
  if (stall_) return false;
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::HEARTBEAT;
  env.type_id = capnp::typeId<wire::Heartbeat>();
  env.sender = id_;
  env.count = 1;
  std::string e = encode_envelope(env);
  Stall hb;
  hb.parts.emplace_back(kHeartbeatTopic, sizeof kHeartbeatTopic - 1);
  hb.parts.emplace_back(e.data(), e.size());
  hb.parts.push_back(frame(heartbeat_payload(leaving)));
  hb.since = Clock::now();
  // Like a topic frame, in order with them (its `published` counts on that): held while a
  // subscriber is full, at most send_stall_limit, then sent past it. A subscriber that is full
  // has our frames to read, and any frame proves us alive.
  stall_ = std::move(hb);
  if (!retry_stall()) ++counters_.publish_stalls;
  return true;
}

Clock::time_point Bridge::next_beat(Clock::time_point now) const {
  const auto period = std::chrono::duration_cast<Clock::duration>(opt_.heartbeat());
  if (period <= Clock::duration::zero()) return now;
  return Clock::time_point((now.time_since_epoch() / period + 1) * period);
}

std::string Bridge::heartbeat_payload(bool leaving) {
  capnp::MallocMessageBuilder builder;
  auto hb = builder.initRoot<wire::Heartbeat>();
  hb.setNode(id_);
  hb.setName(opt_.name());
  hb.setRequestEndpoint(request_endpoint_);
  hb.setIntervalMs(static_cast<uint32_t>(opt_.heartbeat().count()));
  hb.setLeaving(leaving);
  hb.setBatches(true);
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
  // Running totals (a lost heartbeat loses nothing): what we missed of each sender...
  std::vector<std::tuple<uint64_t, const std::string*, uint64_t>> missed;
  for (const auto& [sender, channels] : next_seq_) {
    for (const auto& [channel, st] : channels) {
      if (st.gaps > 0 && missed.size() < kMaxMissedReports) {
        missed.emplace_back(sender, &channel, st.gaps);
      }
    }
  }
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

void Bridge::call(Bridged& channel, std::string payload, Clock::time_point deadline,
                  PrincipalPtr principal, std::unique_ptr<PendingCall> pending) {
  call_to(0, channel, std::move(payload), deadline, std::move(principal), std::move(pending));
}

void Bridge::call_to(uint64_t to, Bridged& channel, std::string payload, Clock::time_point deadline,
                     PrincipalPtr principal, std::unique_ptr<PendingCall> pending) {
  if (oversized(channel, payload.size())) {
    pending->finish(
        absl::ResourceExhaustedError(absl::StrCat("bus.net: request of ", payload.size(),
                                                  " bytes is over max_message_bytes")),
        {});
    return;
  }
  PeerState* peer = nullptr;
  if (to != 0) {
    auto it = peers_.find(to);
    if (it == peers_.end()) {
      pending->finish(absl::UnavailableError(absl::StrCat("bus.net: node ", to, " is not live")),
                      {});
      return;
    }
    if (!it->second.dealer) {
      pending->finish(absl::FailedPreconditionError(
                          absl::StrCat("bus.net: node '", it->second.name, "' (", to,
                                       ") is live but has no request socket: it cannot be asked")),
                      {});
      return;
    }
    peer = &it->second;
  } else {
    peer = pick_peer(channel, /*endpoint=*/true);
  }
  if (peer == nullptr) {
    pending->finish(
        absl::UnavailableError(absl::StrCat("bus.net: no live node serves '", channel.name, "'")),
        {});
    return;
  }
  if (!peer->batches) {
    CallBatch::Call one{deadline, std::move(pending)};
    return send_calls(*peer, channel, payload, {&one, 1}, principal);
  }
  // Requests to one peer on one endpoint go out together when this pass ends: one frame, one
  // envelope, one ZeroMQ message for the lot. The envelope names one principal: requests for
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
  b->bytes.append(payload);
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
                        std::span<CallBatch::Call> calls, const PrincipalPtr& principal) {
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
  if (!send_to_peer(peer, channel.name, env, payloads)) {
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
  for (std::size_t i = 0; i < calls.size(); ++i) {
    pending_.emplace(first + i,
                     Pending{peer.id, &channel, calls[i].deadline, std::move(calls[i].pending)});
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
  flush_replies();
  flush_publishes();
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
  if (to.batched) {
    // With the other replies to that requester on that endpoint, when this pass ends.
    auto [at, fresh] = reply_batch_at_.try_emplace(std::pair(to.identity, &channel));
    if (fresh) {
      at->second = reply_batches_.size();
      ReplyBatch& b = reply_batches_.emplace_back();
      b.identity = to.identity;
      b.channel = &channel;
      b.peer = to.peer;
    }
    ReplyBatch& b = reply_batches_[at->second];
    BatchItem& item = b.items.emplace_back();
    item.correlation = to.correlation;
    item.code = static_cast<uint16_t>(status.code());
    b.envelope_bytes += 3 * sizeof(capnp::word);
    if (status.ok()) {
      b.bytes.append(payload);
    } else {
      item.detail = std::string(status.message().substr(0, 1024));
      b.envelope_bytes += item.detail.size() + 8;
    }
    // Within what a receiver takes as an envelope (decode_envelope's bound).
    if (b.items.size() >= kSendBatchItems || b.bytes.size() >= kMaxBatchBytes ||
        b.envelope_bytes >= 32 * 1024) {
      send_reply_batch(b);
    }
    return;
  }
  // One reply, alone in its frame: the requester does not read batches.
  std::vector<BatchItem> one(1);
  one[0].correlation = to.correlation;
  one[0].code = static_cast<uint16_t>(status.code());
  if (!status.ok()) one[0].detail = std::string(status.message());
  ++traffic(channel.name, known(to.peer)).sent;
  send_replies(to.identity, channel.name, channel.reply_type_id, one, payload);
}

void Bridge::send_reply_batch(ReplyBatch& b) {
  if (b.items.empty()) return;
  traffic(b.channel->name, known(b.peer)).sent += b.items.size();
  send_replies(b.identity, b.channel->name, b.channel->reply_type_id, b.items, b.bytes);
  b.items.clear();
  b.bytes.clear();
  b.envelope_bytes = 0;
}

void Bridge::send_replies(std::string_view identity, std::string_view name, uint64_t reply_type_id,
                          std::vector<BatchItem>& items, std::string_view payloads) {
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
  std::string e = encode_envelope(env);
  Parts parts;
  parts.emplace_back(identity.data(), identity.size());
  parts.emplace_back(name.data(), name.size());
  parts.emplace_back(e.data(), e.size());
  parts.push_back(frame(payloads));
  queue_reply(std::move(parts), n);
}

void Bridge::flush_replies() {
  if (reply_batches_.empty()) return;
  for (ReplyBatch& b : reply_batches_) send_reply_batch(b);
  reply_batches_.clear();
  reply_batch_at_.clear();
}

void Bridge::queue_reply(Parts parts, std::size_t replies) {
  if (reply_backlog_.size() >= kMaxPeerBacklog) {
    counters_.unroutable_replies += replies;
    return;
  }
  // In order behind what is waiting already; the ROUTER takes it when the requester's pipe has
  // room (its high-water mark: the requester is not reading as fast as it asks).
  ++counters_.reply_frames;
  reply_backlog_.push_back({std::move(parts), replies});
  flush_reply_backlog();
}

void Bridge::reply_unexported(const RemoteCall& call, absl::string_view name) {
  std::vector<BatchItem> one(1);
  one[0].correlation = call.correlation;
  one[0].code = static_cast<uint16_t>(absl::StatusCode::kUnavailable);
  one[0].detail = absl::StrCat("bus.net: '", name, "' is not exported by node ", opt_.name());
  send_replies(call.identity, std::string_view(name.data(), name.size()), 0, one, {});
}

void Bridge::flush_reply_backlog() {
  while (!reply_backlog_.empty()) {
    try {
      // EAGAIN: that requester's pipe is full; keep the order, retry later.
      if (!send_all(*router_, reply_backlog_.front().first)) return;
    } catch (const zmq::error_t&) {
      // EHOSTUNREACH (ROUTER_MANDATORY): the requester disconnected.
      counters_.unroutable_replies += reply_backlog_.front().second;
    }
    reply_backlog_.pop_front();
  }
}

// ---- peers ---------------------------------------------------------------------------------

void Bridge::update_subscriptions() {
  // Only topics with local subscribers are subscribed to, so other nodes' publishers (and
  // ZeroMQ's filtering) do not send us what nobody here reads.
  touched(sub_->handle());
  for (auto& [name, ch] : import_topics_) {
    bool want = ch->wanted(*this);
    if (want == subscribed_.contains(name)) continue;
    if (want) {
      sub_->set(zmq::sockopt::subscribe, name);
      subscribed_.insert(name);
    } else {
      sub_->set(zmq::sockopt::unsubscribe, name);
      subscribed_.erase(name);
      // What is published while we do not listen is not lost: after a new subscription, the
      // first frame starts the count again.
      for (auto& [sender, channels] : next_seq_) {
        if (auto st = channels.find(name); st != channels.end()) st->second.expected = 0;
      }
    }
    next_heartbeat_ = Clock::now();  // our imports changed: tell the peers
  }
  for (const auto& [name, fn] : taps_) {
    if (subscribed_.contains(name) || !tapped_.insert(name).second) continue;
    sub_->set(zmq::sockopt::subscribe, name);  // "" (every topic) included
  }
}

void Bridge::check_peers() {
  auto now = Clock::now();
  // Silence counts only while we keep up with what arrives: a peer whose frames wait unread in
  // our subscriber socket (this thread was held up, or reads slower than they come) is not
  // silent. With input waiting, a peer is silent only if kFairFrames frames of others were read
  // since its last one.
  touched(sub_->handle());
  const bool behind = (sub_->get(zmq::sockopt::events) & ZMQ_POLLIN) != 0;
  // Nor does time this thread did not run its loop (checks come a heartbeat apart at most): the
  // process was stopped, or this thread was held up (a blocked publish to a full local ring, a
  // slow handler). Peers get that time back: after a pause, frames that came meanwhile may not
  // even have reached the subscriber socket yet.
  if (last_check_ != Clock::time_point{}) {
    auto away = now - last_check_ - opt_.heartbeat();
    if (away > opt_.heartbeat() / 2) {
      for (auto& [id, p] : peers_) p.last_seen += away;
    }
  }
  last_check_ = now;
  std::vector<uint64_t> dead;
  for (auto& [id, p] : peers_) {
    if (now - p.last_seen <= p.interval * opt_.dead_after()) continue;
    if (behind && sub_frames_ - p.frames_at_seen < kFairFrames) continue;
    dead.push_back(id);
  }
  // Bounded like the sequence state: what is kept for peers that may come back.
  if (declared_dead_.size() > kMaxSenders) {
    absl::erase_if(declared_dead_, [&](const auto& d) { return now - d.second > 1h; });
    if (declared_dead_.size() > kMaxSenders) declared_dead_.clear();
  }
  if (reported_missed_.size() > kMaxSenders) {
    absl::erase_if(reported_missed_, [&](const auto& r) {
      if (peers_.contains(r.first)) return false;
      for (const auto& [channel, n] : r.second) missed_gone_[channel] += n;
      return true;
    });
  }
  for (uint64_t id : dead) {
    ++counters_.peers_lost;
    declared_dead_[id] = now;
    auto& p = peers_[id];
    forget_peer(id,
                absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", p.name,
                                                "' was silent for ", opt_.dead_after(),
                                                " heartbeats with the request in flight")),
                Forget::kMayReturn);
  }
}

void Bridge::forget_peer(uint64_t id, const absl::Status& why, Forget how) {
  auto it = peers_.find(id);
  if (it == peers_.end()) return;
  lanes_->peer_gone(id, why);
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
  // Requests batched for it but not sent: failed once it is gone (a callback that calls again
  // then cannot pick it).
  std::vector<CallBatch> unsent = std::move(it->second.calls);
  if (!it->second.backlog.empty()) {
    // Queue messages and requests that never left: the requests failed above; count the rest.
    backlogged_ -= it->second.backlog.size();
    counters_.send_refused += it->second.backlog.size();
  }
  peers_.erase(it);
  if (how == Forget::kForGood) {
    // It will not speak again with this id: its numbering ends here, and what it missed of
    // ours stays counted under "gone".
    next_seq_.erase(id);
    if (auto r = reported_missed_.find(id); r != reported_missed_.end()) {
      for (const auto& [channel, n] : r->second) missed_gone_[channel] += n;
      reported_missed_.erase(r);
    }
  }
  fold_gone(traffic_, id);
  update_reachability();
  for (CallBatch& b : unsent) {
    for (auto& c : b.calls) {
      ++counters_.calls_peer_gone;
      c.pending->finish(why, {});
    }
  }
}

bool Bridge::serves(const PeerState& p, const Bridged& ch, bool endpoint) {
  if (!p.dealer) return false;
  auto kind = endpoint ? wire::Channel::Kind::ENDPOINT : wire::Channel::Kind::QUEUE;
  for (const auto& s : p.serves) {
    if (s.name == ch.name && s.kind == kind && s.type_id == ch.type_id &&
        (!endpoint || s.reply_type_id == ch.reply_type_id)) {
      return true;
    }
  }
  return false;
}

PeerState* Bridge::pick_peer(const Bridged& ch, bool endpoint) {
  std::vector<PeerState*> live;
  for (auto& [id, p] : peers_) {
    if (serves(p, ch, endpoint)) live.push_back(&p);
  }
  if (live.empty()) return nullptr;
  return live[round_robin_[ch.name]++ % live.size()];
}

void Bridge::update_reachability() {
  // The lanes learn the servers first: a call routed to a proxy as soon as it is reachable finds
  // its servers there.
  absl::flat_hash_map<std::string, std::vector<DirectServer>> direct;
  for (Bridged* ch : imported_calls_) {
    if (ch->role != Bridged::Role::kImportEndpoint) continue;
    for (const auto& [id, p] : peers_) {
      if (serves(p, *ch, true))
        direct[ch->name].push_back({id, p.name, p.request_endpoint, p.public_key});
    }
  }
  lanes_->set_servers(std::move(direct));
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

bool Bridge::allowed(const std::string& key) const {
  for (const auto& k : opt_.allow()) {
    if (k == key) return true;
  }
  return false;
}

uint64_t Bridge::known(uint64_t sender) const { return peers_.contains(sender) ? sender : 0; }

ChannelTraffic& Bridge::traffic(const std::string& channel, uint64_t peer) {
  return row(traffic_, channel, peer);
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
    out.push_back(std::move(i));
  }
  return out;
}

NodeStats Bridge::stats() const {
  NodeStats s = counters_;
  membership_counters_.add_to(s);
  s.peers = peers();
  TrafficRows rows = traffic_;
  lanes_->add_to(s, rows);  // calls made on their callers' threads
  // What peers report they missed of ours: a live peer's on its row, the others' (it may come
  // back, or left for good) on the "gone" rows.
  for (const auto& [peer, channels] : reported_missed_) {
    for (const auto& [channel, n] : channels) row(rows, channel, known(peer)).peer_missed += n;
  }
  for (const auto& [channel, n] : missed_gone_) row(rows, channel, 0).peer_missed += n;
  for (const auto& [key, t] : rows) {
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
