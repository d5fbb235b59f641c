// What ShmTransport keeps of each link: where its handshake is, what the other end subscribed
// to, what waits for room in its ring, and the publisher and route the bridge sends through.
// Shared by the transport's files; how they send is in shm_transport_send.cpp.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/match.h>

#include <deque>
#include <memory>
#include <string>

#include "shm_transport.hpp"

namespace bus::net::detail {

struct ShmTransport::Link {
  uint64_t id = 0;
  State state = State::kAccepted;
  bool initiated = false;
  uint64_t node = 0;  // the other end's node id (known from its hello, or the heartbeat)
  int sock = -1;      // kAccepted: the socket, before the link is made
  std::unique_ptr<ShmLink> link;
  ShmLink::Role role = ShmLink::Role::kBridge;
  // The prefixes it takes topic frames of, and what they say of each channel sent so far.
  absl::flat_hash_set<std::string> prefixes;
  absl::flat_hash_map<std::string, bool> wants;
  // Passed over after a stall: topic frames are dropped (it counts them as gaps) until half of
  // its ring is free again.
  bool cut = false;
  // It subscribed to our heartbeats over the link and takes nothing on it until a heartbeat
  // that names it in `handover` (it reads ZeroMQ until that heartbeat comes there too).
  bool handover = false;
  struct Waiting {
    shm::FrameType type;
    std::string channel, envelope, payload;
    bus::detail::MessageRef large;  // in place of `payload`
    std::size_t replies;            // replies it holds (counted unroutable if it never goes)
  };
  std::deque<Waiting> backlog;  // point-to-point frames waiting for room, in order
  std::unique_ptr<Publisher> publisher;
  std::unique_ptr<Route> route;
  bool written = false;  // since the last wake_written()
  bool dead = false;

  bool takes(const std::string& channel) {
    auto [it, fresh] = wants.try_emplace(channel, false);
    if (fresh) {
      for (const auto& p : prefixes) it->second = it->second || absl::StartsWith(channel, p);
    }
    return it->second;
  }
};

/// A link's subscriber, as the publish gate sees it.
class ShmTransport::Publisher final : public Subscribers {
 public:
  Publisher(ShmTransport& t, Link& l) : t_(t), l_(l) {}
  bool offer(const OutFrame& f) override;
  void cut(const OutFrame&) override;

 private:
  ShmTransport& t_;
  Link& l_;
};

/// A link to a bridge node, as its requests' route.
class ShmTransport::Route final : public PeerRoute {
 public:
  Route(ShmTransport& t, Link& l) : t_(t), l_(l) {}
  bool send(std::string_view channel, const EnvelopeFields& env, std::string_view payload,
            const bus::detail::MessageRef* large) override;

 private:
  ShmTransport& t_;
  Link& l_;
};

inline ShmTransport::Link* ShmTransport::find(uint64_t id) {
  auto it = links_.find(id);
  return it == links_.end() || it->second->dead ? nullptr : it->second.get();
}

inline ShmTransport::Link* ShmTransport::by_node(uint64_t node) const {
  auto it = by_node_.find(node);
  if (it == by_node_.end()) return nullptr;
  auto l = links_.find(it->second);
  return l == links_.end() || l->second->dead ? nullptr : l->second.get();
}

}  // namespace bus::net::detail
