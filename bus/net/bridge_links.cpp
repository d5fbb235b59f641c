// Shared-memory links as the bridge sees them: when to make one, and what moves onto it (a
// peer's requests, and its topics when this node listens to it) and back when it goes.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <capnp/serialize.h>

#include "bridge.hpp"

namespace bus::net::detail {

namespace {

/// "tcp://host:port" as host and port; false for another form (ipc://, a name without a port).
bool host_and_port(const std::string& address, std::string& host, std::string& port) {
  if (address.rfind("tcp://", 0) != 0) return false;
  absl::string_view rest = absl::string_view(address).substr(6);
  auto colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return false;
  host = std::string(rest.substr(0, colon));
  port = std::string(rest.substr(colon + 1));
  return true;
}

bool any_address(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "[::]" || host == "::";
}

}  // namespace

void Bridge::offer_link(uint64_t id, const wire::Heartbeat::Reader& hb) {
  auto shm = hb.getShm();
  const HostIdentity& host = HostIdentity::self();
  // Same kernel boot, same IPC and network namespaces: another container with its own
  // namespaces is another host here (and its abstract socket could not be reached anyway).
  if (shm.getBootId() != host.boot_id || shm.getIpcNamespace() != host.ipc_namespace ||
      shm.getNetNamespace() != host.net_namespace) {
    return;
  }
  shm_.connect(id, std::string(1, '\0') + shm.getSocket().cStr());
}

std::string Bridge::listened_address(const std::string& address) const {
  if (static_peers_.contains(address) || found_.contains(address) || kept_.contains(address)) {
    return address;
  }
  // A publisher bound to every interface says "tcp://0.0.0.0:7401": on one host, any address of
  // ours with that port reaches it.
  std::string host, port;
  if (!host_and_port(address, host, port) || !any_address(host)) return "";
  auto match = [&](const std::string& e) {
    std::string h, p;
    return host_and_port(e, h, p) && p == port;
  };
  for (const auto& e : static_peers_) {
    if (match(e)) return e;
  }
  for (const auto& [e, sources] : found_) {
    if (match(e)) return e;
  }
  for (const auto& e : kept_) {
    if (match(e)) return e;
  }
  return "";
}

std::string Bridge::listening_at(const std::string& address) const {
  const bool listened =
      static_peers_.contains(address) || found_.contains(address) || kept_.contains(address);
  return listened ? address : "";
}

std::vector<std::string> Bridge::topic_filters() const {
  std::vector<std::string> out{kHeartbeatTopic};
  for (const auto& t : subscribed_) out.push_back(t);
  for (const auto& t : tapped_) {
    if (!subscribed_.contains(t)) out.push_back(t);
  }
  return out;
}

void Bridge::on_link_up(uint64_t link, uint64_t peer, const std::string& publish_address) {
  // Its requests go over the link from now on. (Its DEALER stays open: replies to what was sent
  // there before still come back there, and it is the way back should the link go.)
  if (PeerState* p = peers_.find(peer)) {
    p->route = shm_.route(peer);
    p->transport = TransportKind::kShm;
    p->link = link;
    update_reachability();
  }
  // Its topics and heartbeats too, when this node listens to it (see LinkedPublisher): the
  // heartbeats' subscription first, which starts its handover.
  std::string address = listened_address(publish_address);
  if (!address.empty()) {
    LinkedPublisher& lp = linked_[peer];
    lp.address = address;
    lp.since = Clock::now();
    for (const std::string& f : topic_filters()) shm_.subscribe(peer, f, true);
  }
  changed();
}

bool Bridge::handover_takes(const InFrame& f, const EnvelopeFields& env) {
  auto it = linked_.find(env.sender);
  if (it == linked_.end()) return false;
  LinkedPublisher& lp = it->second;
  const bool link = f.stream == Stream::kLink;
  // Moved: what ZeroMQ still brings came over the link too. Until what waited is read (at the
  // end of this read step), the link's frames wait behind it.
  if (!lp.moving && (!lp.replay || !link)) return !link;
  // Heartbeats over ZeroMQ are read now (liveness, and the one that names this node), without
  // their `published`; topic frames of either way wait, copied (the ring moves on).
  if (lp.moving && !link && env.kind == wire::Envelope::Kind::HEARTBEAT) return false;
  (link ? lp.link : lp.zmq)
      .push_back({std::string(f.channel),
                  std::string(static_cast<const char*>(f.envelope), f.envelope_size),
                  std::string(static_cast<const char*>(f.payload), f.payload_size)});
  lp.bytes += f.envelope_size + f.payload_size;
  if (lp.bytes > (std::size_t{64} << 20)) abandon_handover(env.sender, "64 MiB waited");
  return true;
}

void Bridge::replay_handovers() {
  // Reading what waited may forget a publisher (a goodbye among its frames): no iterator or
  // reference into linked_ is kept across it.
  std::vector<uint64_t> due;
  for (const auto& [node, lp] : linked_) {
    if (lp.replay) due.push_back(node);
  }
  for (uint64_t node : due) replay_handover(node);
}

void Bridge::replay_handover(uint64_t node) {
  auto it = linked_.find(node);
  if (it == linked_.end() || !it->second.replay) return;
  LinkedPublisher& lp = it->second;
  lp.replay = false;
  auto zmq = std::move(lp.zmq);
  auto link = std::move(lp.link);
  lp.zmq.clear();
  lp.link.clear();
  lp.bytes = 0;
  // Where the link starts, per topic: its first frame is the heartbeat that named us, whose
  // `published` says the number each topic's next message took.
  absl::flat_hash_map<std::string, uint64_t> link_starts;
  bool known_start = false;
  if (!link.empty()) {
    absl::StatusOr<EnvelopeFields> env =
        decode_envelope(link.front().envelope.data(), link.front().envelope.size());
    if (env.ok() && env->kind == wire::Envelope::Kind::HEARTBEAT &&
        payloads_.parse(link.front().payload.data(), link.front().payload.size(), 1, limits_)
            .ok()) {
      try {
        capnp::FlatArrayMessageReader reader(payloads_.items()[0], reader_options(limits_));
        for (auto t : reader.getRoot<wire::Heartbeat>().getPublished()) {
          link_starts[t.getChannel().cStr()] = t.getNext();
        }
        known_start = true;
      } catch (const kj::Exception&) {
      }
    }
  }
  // ZeroMQ's frames below the link's start, then the link's (from its start on, complete).
  for (const auto& w : zmq) {
    absl::StatusOr<EnvelopeFields> env = decode_envelope(w.envelope.data(), w.envelope.size());
    if (!env.ok() ||
        !payloads_.parse(w.payload.data(), w.payload.size(), env->count, limits_).ok()) {
      on_malformed("subscriber", absl::InvalidArgumentError("a topic frame that does not read"));
      continue;
    }
    auto start = link_starts.find(w.channel);
    uint64_t limit = !known_start ? UINT64_MAX : start == link_starts.end() ? 1 : start->second;
    if (env->seq >= limit) continue;  // the link has it
    messages_read_ += env->count;
    peers_.heard(env->sender, topic_frames_);
    auto topic = import_topics_.find(w.channel);
    if (topic == import_topics_.end()) continue;
    deliver(*topic->second, *env, payloads_,
            static_cast<uint32_t>(std::min<uint64_t>(env->count, limit - env->seq)));
  }
  for (const auto& w : link) on_frame(w.as_read(Stream::kLink));
  ++counters_.shm_handovers;
}

void Bridge::abandon_handover(uint64_t node, const char* why) {
  auto it = linked_.find(node);
  if (it == linked_.end() || !it->second.moving) return;
  // What waited from the link came over ZeroMQ too (still subscribed there): dropped. What
  // waited from ZeroMQ is read now.
  for (const std::string& f : topic_filters()) shm_.subscribe(node, f, false);
  auto zmq = std::move(it->second.zmq);
  linked_.erase(it);
  for (const auto& w : zmq) on_frame(w.as_read(Stream::kTopics));
  log_once(absl::StrCat("handover:", node),
           absl::StrCat("node ", absl::Hex(node),
                        "'s topics stay on ZeroMQ: its handover to shared memory did not come (",
                        why, ")"));
}

void Bridge::on_link_down(uint64_t link, uint64_t peer, bool died, const std::string& why,
                          const Subscribers* publisher) {
  gate_.forget(publisher);
  replay_handover(peer);  // what the link brought before it went, if its handover came
  if (auto it = linked_.find(peer); it != linked_.end()) {
    // Listened to over ZeroMQ again, if it still is a peer of ours (static, or found).
    std::string address = it->second.address;
    const bool moved = !it->second.moving;
    linked_.erase(it);
    if (moved && (static_peers_.contains(address) || found_.contains(address))) {
      try {
        zmq_.listen(Peer{address, ""});
      } catch (const std::exception& e) {
        log_once(absl::StrCat("relisten:", address), e.what());
      }
    }
  }
  PeerState* p = peers_.find(peer);
  if (p == nullptr) return changed();
  std::string name = p->name;
  if (died) {
    // Its process is gone (the link's socket closed without a goodbye): no need to wait for its
    // silence. What was in flight to it fails now.
    ++counters_.peers_lost;
    forget_peer(peer,
                absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", name,
                                                "' ended (its shared-memory link closed)")),
                Forget::kForGood);
    return;
  }
  p->route = zmq_.route(peer);
  p->transport = TransportKind::kZmq;
  p->link = 0;
  // Requests that went over the link will not be answered over it.
  fail_calls([link](const Pending& pend) { return pend.link == link; },
             absl::UnavailableError(absl::StrCat("bus.net: the shared-memory link to node '", name,
                                                 "' closed (", why, ")")));
  update_reachability();
}

}  // namespace bus::net::detail
