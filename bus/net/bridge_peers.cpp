// Peers: whom the node listens to (static ones, what membership finds, what etcd dropped while
// its node was heard), when a silent one is declared dead and forgotten, what they make
// reachable, and what the node subscribes to of them.
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "bridge.hpp"

namespace bus::net::detail {

// ---- whom to listen to --------------------------------------------------------------------

Membership& Bridge::membership() {
  if (!membership_) {
    membership_ =
        std::make_unique<Membership>(*this, opt_, zmq_.publish_address(), membership_counters_);
  }
  return *membership_;
}

void Bridge::add_peer(const Peer& p) {
  if (is_host_name(p.address)) {
    std::lock_guard lock(membership_mu_);
    if (!stopping_.load()) membership().add_name(p);
    return;
  }
  std::exception_ptr error;
  query([&] {
    try {
      if (static_peers_.insert(p.address).second) {
        if (kept_.erase(p.address) == 0) listen(p);  // a kept one is listened to already
      }
    } catch (...) {
      error = std::current_exception();
    }
    return 0;
  });
  if (error) std::rethrow_exception(error);
}

void Bridge::listen(const Peer& p) {
  if (!inbox_) return;                                                                // stopped
  if (p.address == zmq_.publish_address() || p.address == opt_.publish_on()) return;  // us
  zmq_.listen(p);
}

void Bridge::found(const std::string& source, const std::vector<Peer>& peers) {
  if (!inbox_) return;  // stopped
  absl::flat_hash_set<std::string> now;
  for (const Peer& p : peers) {
    if (p.address == zmq_.publish_address() || static_peers_.contains(p.address)) continue;
    now.insert(p.address);
    auto& sources = found_[p.address];
    if (kept_.erase(p.address) > 0) {  // listed again: it was listened to all along
      sources.insert(source);
      continue;
    }
    if (!sources.insert(source).second || sources.size() > 1) continue;  // already listened to
    try {
      listen(p);
      ++counters_.members_found;
    } catch (const std::exception& e) {
      log_once(absl::StrCat("found:", p.address), e.what());
    }
  }
  for (auto it = found_.begin(); it != found_.end();) {
    auto next = std::next(it);
    auto& sources = it->second;
    if (!now.contains(it->first) && sources.erase(source) > 0 && sources.empty()) {
      if (source == kEtcdSource && heard_at(it->first)) {
        kept_.insert(it->first);  // liveness decides (check_peers, forget_peer)
        ++counters_.members_kept;
      } else {
        drop_member(it->first);
      }
      found_.erase(it);
    }
    it = next;
  }
}

void Bridge::drop_member(const std::string& address) {
  if (static_peers_.contains(address)) return;  // given, not found: always listened to
  zmq_.unlisten(address);
  // Listened to over a shared-memory link instead: not any more (the link stays, for requests,
  // but its heartbeats stop coming, and so it is declared dead like any).
  std::vector<uint64_t> by_link;
  for (const auto& [node, lp] : linked_) {
    if (lp.address == address) by_link.push_back(node);
  }
  for (uint64_t node : by_link) {
    for (const std::string& f : topic_filters()) shm_.subscribe(node, f, false);
    linked_.erase(node);
  }
  ++counters_.members_dropped;
}

bool Bridge::heard_at(const std::string& address, uint64_t except) const {
  for (const auto& [id, p] : peers_) {
    if (id != except && !address.empty() && p.publish_address == address) return true;
  }
  return false;
}

MemberRecord Bridge::member_record() const {
  MemberRecord r;
  r.id = id_;
  r.name = opt_.name();
  r.requests = zmq_.request_address();
  r.public_key = opt_.curve_keys().public_key;
  for (const auto& ch : channels_) {
    switch (ch->role) {
      case Bridged::Role::kExportTopic: r.exports.push_back(ch->name); break;
      case Bridged::Role::kExportEndpoint:
      case Bridged::Role::kExportQueue: r.serves.push_back(ch->name); break;
      default: r.imports.push_back(ch->name); break;
    }
  }
  return r;
}

// ---- liveness, reachability, subscriptions ---------------------------------------------------

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
      std::string e = listening_at(p.publish_address);
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
  fail_calls([id](const Pending& pend) { return pend.peer == id; }, why);
  // Requests batched for it but not sent: failed once it is gone (a callback that calls again
  // then cannot pick it).
  p = peers_.find(id);  // a finished call may have changed the table
  if (p == nullptr) return;
  std::vector<CallBatch> unsent = std::move(p->calls);
  const std::string address = listening_at(p->publish_address);
  zmq_.close_route(id);
  peers_.erase(id);
  // Kept after etcd dropped it because it was alive: no longer (unless a node that took its
  // place there is).
  if (kept_.contains(address) && !heard_at(address)) {
    kept_.erase(address);
    drop_member(address);
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
            {id, p.name, p.request_address, p.public_key, p.transport == TransportKind::kShm});
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

}  // namespace bus::net::detail
