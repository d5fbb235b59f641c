#include "peers.hpp"

namespace bus::net::detail {

PeerState& PeerTable::emplace(uint64_t id, bool& fresh) {
  auto [it, made] = peers_.try_emplace(id);
  fresh = made;
  return it->second;
}

void PeerTable::heard(uint64_t sender, uint64_t frames) {
  auto it = peers_.find(sender);
  if (it == peers_.end()) return;
  it->second.last_seen = Clock::now();
  it->second.frames_at_seen = frames;
}

bool PeerTable::serves(const PeerState& p, const Bridged& ch, bool endpoint) {
  if (p.route == nullptr) return false;
  auto kind = endpoint ? wire::Channel::Kind::ENDPOINT : wire::Channel::Kind::QUEUE;
  for (const auto& s : p.serves) {
    if (s.name == ch.name && s.kind == kind && s.type_id == ch.type_id &&
        (!endpoint || s.reply_type_id == ch.reply_type_id)) {
      return true;
    }
  }
  return false;
}

PeerState* PeerTable::pick(const Bridged& ch, bool endpoint) {
  std::vector<PeerState*> live;
  for (auto& [id, p] : peers_) {
    if (serves(p, ch, endpoint)) live.push_back(&p);
  }
  if (live.empty()) return nullptr;
  return live[round_robin_[ch.name]++ % live.size()];
}

}  // namespace bus::net::detail
