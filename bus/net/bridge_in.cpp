#include <absl/strings/str_cat.h>
#include <capnp/serialize.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <stdexcept>

#include "bridge.hpp"

namespace bus::net::detail {

// ---- incoming ------------------------------------------------------------------------------

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
  messages_read_ += std::max<uint32_t>(env->count, 1);
  if (env->sender == id_) return;
  ++sub_frames_;
  heard(env->sender);
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
    ++control_read_;
    if (env->count == 1) on_heartbeat(*env, payloads.items()[0]);
    return;
  }
  if (env->kind != wire::Envelope::Kind::PUBLISH) {
    return malformed("subscriber", absl::InvalidArgumentError("not a publish"));
  }
  on_publish(name, *env, payloads);
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

void Bridge::heard(uint64_t sender) {
  auto it = peers_.find(sender);
  if (it == peers_.end()) return;
  it->second.last_seen = Clock::now();
  it->second.frames_at_seen = sub_frames_;
}

SeqState& Bridge::seq_state(uint64_t sender, const std::string& channel) {
  if (next_seq_.size() >= kMaxSenders && !next_seq_.contains(sender)) {
    // Bounded: senders this node does not hear heartbeats from (a queue sender it does not
    // listen to, a node declared dead long ago, made-up ids) are forgotten first.
    absl::erase_if(next_seq_, [&](const auto& e) { return !peers_.contains(e.first); });
  }
  return next_seq_[sender][channel];
}

void Bridge::count_gap(uint64_t sender, const std::string& channel, SeqState& s, uint64_t lost) {
  s.gaps += lost;
  traffic(channel, known(sender)).gaps += lost;
}

void Bridge::deliver(Bridged& ch, const EnvelopeFields& env, const Payloads& payloads) {
  // Per-sender sequence numbers: what was skipped was lost on the way (at-most-once), and is
  // counted rather than silent. A rejected frame advances them too: it arrived.
  SeqState& s = seq_state(env.sender, ch.name);
  if (s.expected != 0 && env.seq > s.expected)
    count_gap(env.sender, ch.name, s, env.seq - s.expected);
  if (env.seq + env.count > s.expected) s.expected = env.seq + env.count;
  ChannelTraffic& t = traffic(ch.name, known(env.sender));
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
  messages_read_ += std::max<uint32_t>(env->count, 1);
  heard(env->sender);
  std::string name(view(parts[1]));
  bool request = env->kind == wire::Envelope::Kind::REQUEST;
  if (env->kind == wire::Envelope::Kind::PUBLISH) {
    // A topic message sent straight to this node (by a node it does not listen to: busctl).
    Payloads& payloads = payloads_;
    if (absl::Status st = payloads.parse(parts[3].data(), parts[3].size(), env->count, limits_);
        !st.ok()) {
      if (st.code() == absl::StatusCode::kResourceExhausted) return void(++counters_.oversized);
      return malformed("request", st);
    }
    return on_publish(name, *env, payloads);
  }
  if (!request && env->kind != wire::Envelope::Kind::SEND) {
    return malformed("request", absl::InvalidArgumentError("not a request, send or publish"));
  }
  // The requests this frame holds: one, or a batch. A requester that batches reads reply
  // batches; so does one whose heartbeat says so.
  std::vector<RemoteCall> calls;
  if (request) {
    auto peer = peers_.find(env->sender);
    bool batched = !env->items.empty() || (peer != peers_.end() && peer->second.batches);
    std::string identity(view(parts[0]));
    if (env->items.empty()) {
      calls.push_back({std::move(identity), env->correlation, env->sender, batched});
    } else {
      calls.reserve(env->items.size());
      for (const BatchItem& item : env->items) {
        calls.push_back({identity, item.correlation, env->sender, batched});
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
             absl::StrCat("node ", env->sender, " sent to '", name,
                          "', which this node does not export"));
    for (const RemoteCall& call : calls) reply_unexported(call, name);
    return;
  }
  Bridged& ch = *it->second;
  Payloads& payloads = payloads_;
  absl::Status st = payloads.parse(parts[3].data(), parts[3].size(), env->count, limits_);
  if (st.ok() && request && env->count != calls.size()) {
    st = absl::InvalidArgumentError(
        absl::StrCat("request count ", env->count, " for ", calls.size(), " requests"));
  }
  if (!st.ok()) {
    if (st.code() == absl::StatusCode::kResourceExhausted) {
      ++counters_.oversized;
    } else {
      malformed("request", st);
    }
    // ResourceExhausted (oversized) or InvalidArgument
    for (const RemoteCall& call : calls) reply(ch, call, st, {});
    return;
  }
  if (!request) return deliver(ch, *env, payloads);
  ChannelTraffic& t = traffic(name, known(env->sender));
  if (env->type_id != ch.type_id) {
    t.rejected += calls.size();
    absl::Status wrong = absl::InvalidArgumentError(
        absl::StrCat("bus.net: request type id ", absl::Hex(env->type_id), " is not the type of '",
                     name, "' here (", absl::Hex(ch.type_id), ")"));
    for (const RemoteCall& call : calls) reply(ch, call, wrong, {});
    return;
  }
  t.received += calls.size();
  // Bounded: a peer may send any 64-bit value (UINT64_MAX for "no deadline", say).
  constexpr uint64_t kMaxTimeoutUs = uint64_t{24} * 3600 * 1'000'000;
  // The local servers (and what they request in turn) act for the envelope's principal.
  PrincipalScope acting_for(env->principal);
  for (std::size_t i = 0; i < calls.size(); ++i) {
    uint64_t timeout = env->items.empty() ? env->timeout_us : env->items[i].timeout_us;
    ch.serve(*this, std::move(calls[i]), payloads.items()[i],
             microseconds(std::min(timeout, kMaxTimeoutUs)));
  }
}

void Bridge::on_dealer(Parts& parts) {
  if (parts.size() != 3)
    return malformed("reply",
                     absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  absl::StatusOr<EnvelopeFields> env = decode_envelope(parts[1].data(), parts[1].size());
  if (!env.ok()) return malformed("reply", env.status());
  messages_read_ += std::max<std::size_t>(env->items.size(), 1);
  heard(env->sender);
  if (env->kind != wire::Envelope::Kind::REPLY) {
    return malformed("reply", absl::InvalidArgumentError("not a reply"));
  }
  // One reply, or a batch: both are read as a batch.
  uint32_t with_payload = 0;
  if (env->items.empty()) {
    env->items.push_back({env->correlation, 0, env->code, std::move(env->detail)});
    with_payload = env->code == 0 ? 1 : 0;  // a single reply's count is not looked at
  } else {
    for (const BatchItem& item : env->items) with_payload += item.code == 0 ? 1 : 0;
    if (env->count != with_payload) {
      return malformed("reply", absl::InvalidArgumentError(
                                    absl::StrCat("reply batch count ", env->count, " for ",
                                                 with_payload, " replies with code 0")));
    }
  }
  // A frame that does not parse fails the calls it answers (with code 0), not the others.
  Payloads& payloads = payloads_;
  absl::Status st;
  if (with_payload > 0)
    st = payloads.parse(parts[2].data(), parts[2].size(), with_payload, limits_);
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
  for (BatchItem& item : env->items) {
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
    if (bad.ok() && env->type_id != p.channel->reply_type_id) {
      bad = absl::InvalidArgumentError(absl::StrCat("reply type id ", absl::Hex(env->type_id),
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
  changed();
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
    // Everything it published before this heartbeat came first (one publisher, one pipe).
    on_published(id, hb.getPublished());
    if (hb.getLeaving()) {
      forget_peer(id,
                  absl::AbortedError(
                      absl::StrCat("bus.net: peer gone: node '", hb.getName().cStr(), "' stopped")),
                  Forget::kForGood);
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
    for (auto m : hb.getMissed()) {
      if (m.getSender() == id_) reported_missed_[id][m.getChannel().cStr()] = m.getCount();
    }
    auto [it, fresh] = peers_.try_emplace(id);
    PeerState& p = it->second;
    p.last_seen = Clock::now();
    p.frames_at_seen = sub_frames_;
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
      if (declared_dead_.erase(id) > 0) {
        // Declared dead, yet the same run of it speaks: it was stopped or cut off for a while,
        // or this node fell behind. Its numbering went on: what it sent meanwhile that never
        // arrived is counted as gaps (the sequence state was kept).
        ++counters_.peers_returned;
        log_once(absl::StrCat("returned:", id),
                 absl::StrCat("node '", p.name, "' (", id,
                              ") was declared dead and is back: what it sent meanwhile and "
                              "never arrived is counted as gaps"));
      }
      p.request_endpoint = hb.getRequestEndpoint().cStr();
      p.public_key = hb.getPublicKey().cStr();
      if (!p.request_endpoint.empty()) {
        p.dealer = make_dealer(ctx_, opt_, p.public_key);
        touched(p.dealer->handle());
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
        forget_peer(
            other,
            absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", name, "' restarted")),
            Forget::kForGood);
      }
    }
    if (changed) update_reachability();
  } catch (const kj::Exception& e) {
    malformed("subscriber", absl::InvalidArgumentError(describe(e)));
  }
}

void Bridge::on_published(uint64_t sender, const capnp::List<wire::TopicSeq>::Reader& published) {
  auto from = next_seq_.find(sender);
  if (from == next_seq_.end()) return;
  for (auto p : published) {
    // Only topics subscribed to now, with a first frame already (so the numbering's start here
    // is known): a topic we do not take has no gaps.
    std::string channel = p.getChannel().cStr();
    if (!subscribed_.contains(channel)) continue;
    auto s = from->second.find(channel);
    if (s == from->second.end() || s->second.expected == 0) continue;
    if (p.getNext() > s->second.expected) {
      count_gap(sender, channel, s->second, p.getNext() - s->second.expected);
      s->second.expected = p.getNext();
    }
  }
}

}  // namespace bus::net::detail
