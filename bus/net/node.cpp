// The public Node: each call handed to its bridge (most run on the bridge thread, through
// Bridge::query()), and what the bridge reports of itself: its peers, its figures.
#include "bus/net/node.hpp"

#include <algorithm>
#include <stdexcept>

#include "bridge.hpp"
#include "shm_heap.hpp"

namespace bus::net::detail {

// ---- what the bridge reports ---------------------------------------------------------------

std::vector<PeerInfo> Bridge::peers() const {
  std::vector<PeerInfo> out;
  auto now = Clock::now();
  for (const auto& [id, p] : peers_) {
    PeerInfo i;
    i.id = id;
    i.name = p.name;
    i.request_address = p.request_address;
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

// ---- the public Node -------------------------------------------------------------------------

namespace bus::net {

CurveKeys CurveKeys::generate() {
  char pub[41], sec[41];
  if (zmq_curve_keypair(pub, sec) != 0) {
    throw std::runtime_error("bus.net: zmq_curve_keypair failed (libzmq built without CURVE?)");
  }
  return CurveKeys{pub, sec};
}

Node::Node(Bus& bus, NodeOptions options)
    : bridge_(std::make_unique<detail::Bridge>(bus, std::move(options))) {}
Node::~Node() { stop(); }
void Node::stop() { bridge_->stop(); }
Node& Node::peer(std::string address, std::string public_key) {
  bridge_->add_peer(Peer{std::move(address), std::move(public_key)});
  return *this;
}
Node& Node::add(std::unique_ptr<detail::Bridged> channel) {
  bridge_->add(std::move(channel));
  return *this;
}
uint64_t Node::id() const { return bridge_->id(); }
std::string Node::publish_address() const { return bridge_->publish_address(); }
std::string Node::request_address() const { return bridge_->request_address(); }
std::vector<PeerInfo> Node::peers() const {
  return bridge_->query([this] { return bridge_->peers(); });
}
NodeStats Node::stats() const {
  return bridge_->query([this] { return bridge_->stats(); });
}
std::size_t Node::subscribers(std::string_view topic) const {
  return bridge_->query([this, topic] { return bridge_->subscribers(topic); });
}
bool Node::wait_for_subscribers(std::string_view topic, std::size_t n,
                                std::chrono::milliseconds timeout) const {
  return bridge_->wait_until([&] { return bridge_->subscribers(topic) >= n; },
                             Clock::now() + timeout);
}
bool Node::wait_for_subscribers(std::string_view topic, const std::vector<std::string>& names,
                                std::chrono::milliseconds timeout) const {
  return bridge_->wait_until(
      [&] {
        std::size_t importers = 0, named = 0;
        for (const PeerInfo& p : bridge_->peers()) {
          if (std::find(p.imports.begin(), p.imports.end(), topic) == p.imports.end()) continue;
          ++importers;
          if (std::find(names.begin(), names.end(), p.name) != names.end()) ++named;
        }
        // Subscriptions come on another connection than heartbeats: one may be ahead.
        return named >= names.size() && bridge_->subscribers(topic) >= importers;
      },
      Clock::now() + timeout);
}
bool Node::wait_for_server(std::string_view channel, std::chrono::milliseconds timeout) const {
  return bridge_->wait_until([&] { return bridge_->serves(channel); }, Clock::now() + timeout);
}

}  // namespace bus::net
