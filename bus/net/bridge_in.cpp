// Incoming: frames from any transport, read as the protocol says (docs/wire-protocol.md).
#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>

#include <algorithm>
#include <cstdio>

#include "bridge.hpp"

namespace bus::net::detail {

namespace {
const char* stream_name(Stream s) {
  switch (s) {
    case Stream::kTopics: return "subscriber";
    case Stream::kRequests: return "request";
    case Stream::kReplies: return "reply";
    case Stream::kLink: return "shared-memory";
  }
  return "?";
}
}  // namespace

void Bridge::on_malformed(absl::string_view from, const absl::Status& why) {
  ++counters_.malformed_frames;
  log_once(absl::StrCat("malformed:", from),
           absl::StrCat("dropped a malformed frame from the ", from, " socket: ", why.message()));
}

void Bridge::log_once(const std::string& key, const std::string& what) {
  if (logged_.size() > 4096 || !logged_.insert(key).second) return;
  std::fprintf(stderr, "bus.net[%s]: %s\n", opt_.name().c_str(), what.c_str());
}

void Bridge::on_subscription(const std::string& topic, bool added, bool link) {
  if (!added && !link) shm_.left_zmq(topic);
  // A node just subscribed to heartbeats: tell it about us now rather than a period later.
  if (added && topic == kHeartbeatTopic) next_heartbeat_ = Clock::now();
  changed();
}

void Bridge::on_torn(absl::string_view channel, const std::string& envelope) {
  absl::StatusOr<EnvelopeFields> env = decode_envelope(envelope.data(), envelope.size());
  if (!env.ok() || env->kind != wire::Envelope::Kind::PUBLISH) return;
  auto it = import_topics_.find(channel);
  if (it == import_topics_.end() || !subscribed_.contains(it->first)) return;
  // As if its next heartbeat had said how far its numbering went.
  ledger_.lost_before(env->sender, it->first, env->seq + env->count, known(env->sender));
}

void Bridge::on_frame(const InFrame& f) {
  const char* from = stream_name(f.stream);
  absl::StatusOr<EnvelopeFields> env = decode_envelope(f.envelope, f.envelope_size);
  if (!env.ok()) return on_malformed(from, env.status());
  using Kind = wire::Envelope::Kind;
  const Kind kind = env->kind;
  const bool link = f.stream == Stream::kLink;
  if (f.stream == Stream::kReplies || (link && kind == Kind::REPLY)) return on_reply(f, *env);
  if (f.stream == Stream::kRequests || (link && (kind == Kind::REQUEST || kind == Kind::SEND))) {
    return on_request(f, *env);
  }
  // A publisher's stream: topic messages and heartbeats.
  if (!linked_.empty() && handover_takes(f, *env)) return;
  messages_read_ += std::max<uint32_t>(env->count, 1);
  if (env->sender == id_) return;
  if (!link) ++topic_frames_;
  peers_.heard(env->sender, topic_frames_);
  Payloads& payloads = payloads_;
  if (absl::Status st = payloads.parse(f.payload, f.payload_size, env->count, limits_); !st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++counters_.oversized;
      log_once(absl::StrCat("oversized:", f.channel),
               absl::StrCat("dropped oversized messages on '", f.channel, "': ", st.message()));
      return;
    }
    return on_malformed(from, st);
  }
  if (kind == Kind::HEARTBEAT && f.channel == absl::string_view(kHeartbeatTopic)) {
    ++control_read_;
    if (env->count == 1) on_heartbeat(*env, payloads.items()[0], f.stream);
    return;
  }
  if (kind != Kind::PUBLISH) return on_malformed(from, absl::InvalidArgumentError("not a publish"));
  on_publish(f.channel, *env, payloads);
}

void Bridge::on_publish(absl::string_view name, const EnvelopeFields& env,
                        const Payloads& payloads) {
  auto it = import_topics_.find(name);
  bool tapped = false;
  for (absl::string_view key : {name, absl::string_view()}) {
    auto tap = taps_.find(key);
    if (tap == taps_.end()) continue;
    tapped = true;
    for (auto payload : payloads.items()) {
      tap->second(
          RawMessage{std::string_view(name.data(), name.size()), env.type_id, env.sender, payload});
    }
  }
  if (it != import_topics_.end()) return deliver(*it->second, env, payloads);
  // A longer name that shares our subscription's prefix: ZeroMQ filters by prefix only.
  if (!tapped) ++counters_.unknown_channel;
}

void Bridge::deliver(Bridged& ch, const EnvelopeFields& env, const Payloads& payloads,
                     uint32_t take) {
  // Per-sender sequence numbers: what was skipped was lost on the way (at-most-once), and is
  // counted rather than silent. A rejected frame advances them too: it arrived.
  // A number that came before is not taken again (a frame that came both ways while a
  // publisher moved to a link would be: see LinkedPublisher).
  take = std::min(take, env.count);
  const uint32_t seen = ledger_.arrived(env.sender, ch.name, env.seq, take, known(env.sender));
  ChannelTraffic& t = traffic(ch.name, known(env.sender));
  if (env.type_id != ch.type_id) {
    t.rejected += take;
    const PeerState* peer = peers_.find(env.sender);
    log_once(absl::StrCat("type:", ch.name, ":", env.sender),
             absl::StrCat("rejected messages on '", ch.name, "' from node ",
                          peer != nullptr ? peer->name : "?", " (", env.sender,
                          "): their type id is ", absl::Hex(env.type_id), ", this node's is ",
                          absl::Hex(ch.type_id), " (the two programs disagree on the type)"));
    return;
  }
  const std::size_t limit = opt_.message_limit_of(ch.name);
  for (std::size_t i = seen; i < std::min<std::size_t>(take, payloads.items().size()); ++i) {
    auto payload = payloads.items()[i];
    if (payload.size() * sizeof(capnp::word) > limit) {
      ++counters_.oversized;
      log_once(absl::StrCat("oversized:", ch.name),
               absl::StrCat("dropped a ", payload.size() * sizeof(capnp::word),
                            "-byte message on '", ch.name, "': over its limit of ", limit,
                            " bytes (NodeOptions::message_limit, or max_message_bytes)"));
      continue;
    }
    if (absl::Status st = ch.deliver(*this, payload); !st.ok()) {
      ++t.rejected;
      log_once(absl::StrCat("decode:", ch.name),
               absl::StrCat("rejected a message on '", ch.name, "': ", st.message()));
    } else {
      ++t.received;
    }
  }
}

void Bridge::on_request(const InFrame& f, EnvelopeFields& env) {
  const char* from = stream_name(f.stream);
  messages_read_ += std::max<uint32_t>(env.count, 1);
  peers_.heard(env.sender, topic_frames_);
  std::string name(f.channel);
  bool request = env.kind == wire::Envelope::Kind::REQUEST;
  if (env.kind == wire::Envelope::Kind::PUBLISH) {
    // A topic message sent straight to this node (by a node it does not listen to: busctl).
    Payloads& payloads = payloads_;
    if (absl::Status st = payloads.parse(f.payload, f.payload_size, env.count, limits_); !st.ok()) {
      if (st.code() == absl::StatusCode::kResourceExhausted) return void(++counters_.oversized);
      return on_malformed(from, st);
    }
    return on_publish(name, env, payloads);
  }
  if (!request && env.kind != wire::Envelope::Kind::SEND) {
    return on_malformed(from, absl::InvalidArgumentError("not a request, send or publish"));
  }
  // The requests this frame holds: one, or a batch. A requester that batches reads reply
  // batches; so does one whose heartbeat says so.
  std::vector<RemoteCall> calls;
  if (request) {
    const PeerState* peer = peers_.find(env.sender);
    bool batched = !env.items.empty() || (peer != nullptr && peer->batches);
    if (env.items.empty()) {
      calls.push_back({f.reply_to, env.correlation, env.sender, batched});
    } else {
      calls.reserve(env.items.size());
      for (const BatchItem& item : env.items) {
        calls.push_back({f.reply_to, item.correlation, env.sender, batched});
      }
    }
  }
  if (request && name == kStatsEndpoint) {
    for (const RemoteCall& call : calls) serve_stats(call);
    return;
  }
  auto& table = request ? export_endpoints_ : export_queues_;
  auto it = table.find(name);
  if (it == table.end()) {
    ++counters_.unknown_channel;
    log_once(absl::StrCat("unexported:", name),
             absl::StrCat("node ", env.sender, " sent to '", name,
                          "', which this node does not export"));
    for (const RemoteCall& call : calls) reply_unexported(call, name);
    return;
  }
  Bridged& ch = *it->second;
  Payloads& payloads = payloads_;
  absl::Status st = payloads.parse(f.payload, f.payload_size, env.count, limits_);
  if (st.ok() && request && env.count != calls.size()) {
    st = absl::InvalidArgumentError(
        absl::StrCat("request count ", env.count, " for ", calls.size(), " requests"));
  }
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++counters_.oversized;
    } else {
      on_malformed(from, st);
    }
    // ResourceExhausted (oversized) or InvalidArgument
    for (const RemoteCall& call : calls) reply(ch, call, st, {});
    return;
  }
  if (!request) return deliver(ch, env, payloads);
  ChannelTraffic& t = traffic(name, known(env.sender));
  if (env.type_id != ch.type_id) {
    t.rejected += calls.size();
    absl::Status wrong = absl::InvalidArgumentError(
        absl::StrCat("bus.net: request type id ", absl::Hex(env.type_id), " is not the type of '",
                     name, "' here (", absl::Hex(ch.type_id), ")"));
    for (const RemoteCall& call : calls) reply(ch, call, wrong, {});
    return;
  }
  const std::size_t limit = opt_.message_limit_of(name);
  std::vector<bool> refused(calls.size(), false);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (payloads.items()[i].size() * sizeof(capnp::word) <= limit) continue;
    // The one over the channel's limit is refused; the others of the batch go on.
    ++counters_.oversized;
    refused[i] = true;
    reply(ch, calls[i],
          absl::ResourceExhaustedError(
              absl::StrCat("bus.net: request over the limit of '", name, "' (", limit, " bytes)")),
          {});
  }
  traffic(name, known(env.sender)).received +=
      calls.size();  // `t` may have moved: replies add rows
  // Bounded: a peer may send any 64-bit value (UINT64_MAX for "no deadline", say).
  constexpr uint64_t kMaxTimeoutUs = uint64_t{24} * 3600 * 1'000'000;
  // The local servers (and what they request in turn) act for the envelope's principal.
  PrincipalScope acting_for(env.principal);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    if (refused[i]) continue;
    uint64_t timeout = env.items.empty() ? env.timeout_us : env.items[i].timeout_us;
    ch.serve(*this, std::move(calls[i]), payloads.items()[i],
             microseconds(std::min(timeout, kMaxTimeoutUs)));
  }
}

void Bridge::on_reply(const InFrame& f, EnvelopeFields& env) {
  const char* from = stream_name(f.stream);
  messages_read_ += std::max<std::size_t>(env.items.size(), 1);
  peers_.heard(env.sender, topic_frames_);
  if (env.kind != wire::Envelope::Kind::REPLY) {
    return on_malformed(from, absl::InvalidArgumentError("not a reply"));
  }
  // One reply, or a batch: both are read as a batch.
  uint32_t with_payload = 0;
  if (env.items.empty()) {
    env.items.push_back({env.correlation, 0, env.code, std::move(env.detail)});
    with_payload = env.code == 0 ? 1 : 0;  // a single reply's count is not looked at
  } else {
    for (const BatchItem& item : env.items) with_payload += item.code == 0 ? 1 : 0;
    if (env.count != with_payload) {
      return on_malformed(
          from, absl::InvalidArgumentError(absl::StrCat("reply batch count ", env.count, " for ",
                                                        with_payload, " replies with code 0")));
    }
  }
  // A frame that does not parse fails the calls it answers (with code 0), not the others.
  Payloads& payloads = payloads_;
  absl::Status st;
  if (with_payload > 0) st = payloads.parse(f.payload, f.payload_size, with_payload, limits_);
  std::size_t next = 0;  // the next payload
  // Counted per (endpoint, peer) run of replies; looked up afresh each time, as a finished call
  // may add rows (and move the table).
  const Bridged* tally_ch = nullptr;
  uint64_t tally_peer = 0, received = 0, rejected = 0;
  auto settle = [&] {
    if (tally_ch == nullptr) return;
    ChannelTraffic& t = traffic(tally_ch->name, tally_peer);
    t.received += received;
    t.rejected += rejected;
    received = rejected = 0;
  };
  for (BatchItem& item : env.items) {
    std::size_t at = item.code == 0 ? next++ : 0;
    auto it = pending_.find(item.correlation);
    if (it == pending_.end()) {
      ++counters_.late_replies;  // its deadline passed, or its node was given up on
      continue;
    }
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (p.channel != tally_ch || p.peer != tally_peer) {
      settle();
      tally_ch = p.channel;
      tally_peer = p.peer;
    }
    if (item.code != 0) {
      ++received;
      p.call->finish(status_from(item.code, std::move(item.detail)), {});
      continue;
    }
    absl::Status bad = st;
    if (bad.ok() && env.type_id != p.channel->reply_type_id) {
      bad = absl::InvalidArgumentError(absl::StrCat("reply type id ", absl::Hex(env.type_id),
                                                    " is not the endpoint's (",
                                                    absl::Hex(p.channel->reply_type_id), ")"));
    }
    if (!bad.ok()) {
      ++rejected;
      p.call->finish(
          absl::InternalError(absl::StrCat("bus.net: bad reply from node ", p.peer, " on '",
                                           p.channel->name, "': ", bad.message())),
          {});
      continue;
    }
    ++received;
    p.call->finish(absl::OkStatus(), payloads.items()[at]);
  }
  settle();
}

void Bridge::on_heartbeat(const EnvelopeFields& env, kj::ArrayPtr<const capnp::word> payload,
                          Stream stream) {
  try {
    capnp::FlatArrayMessageReader reader(payload, reader_options(limits_));
    auto hb = reader.getRoot<wire::Heartbeat>();
    uint64_t id = hb.getNode();
    if (id != env.sender || id == id_) return;
    // A node that said goodbye is gone: a heartbeat of it that comes later came another way
    // (over ZeroMQ and a shared-memory link both, while it moved) and is not a return.
    for (const auto& [gone, when] : goodbyes_) {
      if (gone == id) return;
    }
    for (uint64_t acked : hb.getGoodbyes()) {
      if (acked == id_) goodbye_acks_.insert(id);
    }
    // Everything it published before this heartbeat came first (one publisher, one pipe), but
    // for a publisher moving to a link: its topic frames wait, and its link's heartbeats count.
    auto moving = linked_.find(id);
    if (moving == linked_.end() || !moving->second.moving) {
      ledger_.published(id, hb.getPublished(), subscribed_, known(id));
    } else if (stream == Stream::kTopics) {
      for (uint64_t n : hb.getHandover()) {
        if (n != id_) continue;
        // Its link carries everything from here; ZeroMQ brought all it sent before.
        moving->second.moving = false;
        moving->second.replay = true;
        zmq_.unlisten(moving->second.address);
      }
    }
    if (hb.getLeaving()) {
      forget_peer(id,
                  absl::AbortedError(
                      absl::StrCat("bus.net: peer gone: node '", hb.getName().cStr(), "' stopped")),
                  Forget::kForGood);
      // Confirm at once: a publisher's frames arrive in order, so everything it sent before
      // arrived.
      goodbyes_.emplace_back(id, Clock::now());
      next_heartbeat_ = Clock::now();
      return;
    }
    if (opt_.secure() && !peers_.contains(id) &&
        std::find(opt_.allow().begin(), opt_.allow().end(), hb.getPublicKey().cStr()) ==
            opt_.allow().end()) {
      ++counters_.auth_denied;
      log_once(absl::StrCat("hb-key:", hb.getPublicKey().cStr()),
               absl::StrCat("ignoring node '", hb.getName().cStr(), "': its key '",
                            hb.getPublicKey().cStr(), "' is not in the allowlist"));
      return;
    }
    ledger_.missed_report(id, id_, hb.getMissed());
    bool fresh = false;
    PeerState& p = peers_.emplace(id, fresh);
    p.last_seen = Clock::now();
    p.frames_at_seen = topic_frames_;
    auto channels = [](auto list) {
      std::vector<ChannelDesc> out;
      for (auto c : list) {
        out.push_back({c.getName().cStr(), c.getTypeId(), c.getReplyTypeId(), c.getKind()});
      }
      return out;
    };
    std::vector<ChannelDesc> serves = channels(hb.getServes());
    std::vector<ChannelDesc> imports = channels(hb.getImports());
    bool changed = fresh || serves != p.serves;
    if (imports != p.imports) this->changed();  // wait_for_subscribers() by name looks at them
    p.serves = std::move(serves);
    p.imports = std::move(imports);
    p.interval = milliseconds(std::clamp<uint32_t>(hb.getIntervalMs(), 1, 60'000));
    p.batches = hb.getBatches();
    if (fresh) {
      p.id = id;
      p.name = hb.getName().cStr();
      p.request_address = hb.getRequestEndpoint().cStr();
      p.publish_address = hb.getPublishEndpoint().cStr();
      p.public_key = hb.getPublicKey().cStr();
      welcome(p);
    }
    if (changed) update_reachability();
    if (hb.hasShm() && shm_.on() && !shm_.linked(id)) offer_link(id, hb);
  } catch (const kj::Exception& e) {
    on_malformed("subscriber", absl::InvalidArgumentError(describe(e)));
  }
}

void Bridge::welcome(PeerState& p) {
  if (peers_.returned(p.id)) {
    // Declared dead, yet the same run of it speaks: it was stopped or cut off for a while, or
    // this node fell behind. Its numbering went on: what it sent meanwhile that never arrived is
    // counted as gaps (the sequence state was kept).
    ++counters_.peers_returned;
    log_once(absl::StrCat("returned:", p.id),
             absl::StrCat("node '", p.name, "' (", p.id,
                          ") was declared dead and is back: what it sent meanwhile and never "
                          "arrived is counted as gaps"));
  }
  if (!p.request_address.empty()) {
    p.route = zmq_.open_route(p.id, p.name, p.request_address, p.public_key);
  }
  if (PeerRoute* link = shm_.route(p.id)) {  // linked before it was heard
    p.route = link;
    p.transport = TransportKind::kShm;
    p.link = shm_.link_of(p.id);
  }
  next_heartbeat_ = Clock::now();  // answer a newcomer at once: it learns about us sooner
  // A node that restarted on the same address is a new node: the old one is gone. (After the
  // new one's route exists, so the endpoint stays routable throughout.)
  std::vector<uint64_t> replaced;
  for (auto& [other, q] : peers_) {
    if (other != p.id && !p.request_address.empty() && q.request_address == p.request_address) {
      replaced.push_back(other);
    }
  }
  std::string name = p.name;  // forget_peer() may move the table
  for (uint64_t other : replaced) {
    forget_peer(other,
                absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", name, "' restarted")),
                Forget::kForGood);
  }
}

}  // namespace bus::net::detail
