// Shared-memory links as the bridge sees them: when to make one, and what moves onto it (a
// peer's requests, and its topics when this node listens to it) and back when it goes.
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

#include "bridge.hpp"

namespace bus::net::detail {

namespace {

/// "tcp://host:port" as host and port; false for another form (ipc://, a name without a port).
bool host_and_port(const std::string& endpoint, std::string& host, std::string& port) {
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  absl::string_view rest = absl::string_view(endpoint).substr(6);
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

std::string Bridge::listened_endpoint(const std::string& endpoint) const {
  if (static_peers_.contains(endpoint) || found_.contains(endpoint)) return endpoint;
  // A publisher bound to every interface says "tcp://0.0.0.0:7401": on one host, any address of
  // ours with that port reaches it.
  std::string host, port;
  if (!host_and_port(endpoint, host, port) || !any_address(host)) return "";
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
  return "";
}

std::vector<std::string> Bridge::topic_filters() const {
  std::vector<std::string> out{kHeartbeatTopic};
  for (const auto& t : subscribed_) out.push_back(t);
  for (const auto& t : tapped_) {
    if (!subscribed_.contains(t)) out.push_back(t);
  }
  return out;
}

void Bridge::on_link_up(uint64_t link, uint64_t peer, const std::string& publish_endpoint) {
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
  std::string endpoint = listened_endpoint(publish_endpoint);
  if (!endpoint.empty()) {
    LinkedPublisher& lp = linked_[peer];
    lp.endpoint = endpoint;
    lp.since = Clock::now();
    for (const std::string& f : topic_filters()) shm_.subscribe(peer, f, true);
  }
  changed();
}

void Bridge::replay_handovers() {
  for (auto& [node, lp] : linked_) {
    if (!lp.replay) continue;
    lp.replay = false;
    std::deque<LinkedPublisher::Frame> frames = std::move(lp.waiting);
    lp.waiting.clear();
    lp.bytes = 0;
    for (const auto& w : frames) {
      InFrame f;
      f.stream = Stream::kLink;
      f.channel = w.channel;
      f.envelope = w.envelope.data();
      f.envelope_size = w.envelope.size();
      f.payload = w.payload.data();
      f.payload_size = w.payload.size();
      on_frame(f);
    }
    ++counters_.shm_handovers;
  }
}

void Bridge::abandon_handover(uint64_t node, const char* why) {
  auto it = linked_.find(node);
  if (it == linked_.end() || !it->second.moving) return;
  // What waited came over ZeroMQ too (still subscribed there): dropped.
  for (const std::string& f : topic_filters()) shm_.subscribe(node, f, false);
  linked_.erase(it);
  log_once(absl::StrCat("handover:", node),
           absl::StrCat("node ", absl::Hex(node),
                        "'s topics stay on ZeroMQ: its handover to shared memory did not come (",
                        why, ")"));
}

void Bridge::on_link_down(uint64_t link, uint64_t peer, bool died, const std::string& why,
                          const Subscribers* publisher) {
  gate_.forget(publisher);
  if (auto it = linked_.find(peer); it != linked_.end()) {
    // Listened to over ZeroMQ again, if it still is a peer of ours (static, or found).
    std::string endpoint = it->second.endpoint;
    const bool moved = !it->second.moving;
    linked_.erase(it);
    if (moved && (static_peers_.contains(endpoint) || found_.contains(endpoint))) {
      try {
        zmq_.listen(Peer{endpoint, ""});
      } catch (const std::exception& e) {
        log_once(absl::StrCat("relisten:", endpoint), e.what());
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
  std::vector<uint64_t> failed;
  for (auto& [corr, pend] : pending_) {
    if (pend.link == link) failed.push_back(corr);
  }
  for (uint64_t corr : failed) {
    auto node = pending_.extract(corr);
    ++counters_.calls_peer_gone;
    node.mapped().call->finish(
        absl::UnavailableError(absl::StrCat("bus.net: the shared-memory link to node '", name,
                                            "' closed (", why, ")")),
        {});
  }
  update_reachability();
}

}  // namespace bus::net::detail
