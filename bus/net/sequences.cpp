#include "sequences.hpp"

#include <algorithm>

namespace bus::net::detail {

ChannelTraffic& row(TrafficRows& rows, const std::string& channel, uint64_t peer) {
  auto [it, fresh] = rows.try_emplace(std::make_pair(channel, peer));
  if (fresh) {
    it->second.channel = channel;
    it->second.peer = peer;
  }
  return it->second;
}

void fold_gone(TrafficRows& rows, uint64_t peer) {
  std::vector<std::pair<std::string, uint64_t>> keys;
  for (auto& [key, t] : rows) {
    if (key.second == peer) keys.push_back(key);
  }
  for (auto& key : keys) {
    ChannelTraffic t = rows[key];
    rows.erase(key);
    ChannelTraffic& gone = row(rows, key.first, 0);
    for (const TrafficFigure& f : kTrafficFigures) gone.*f.member += t.*f.member;
  }
}

SeqState& SequenceLedger::state(uint64_t sender, const std::string& channel) {
  if (next_seq_.size() >= kMaxSenders && !next_seq_.contains(sender)) {
    // Bounded: senders this node does not hear heartbeats from (a queue sender it does not
    // listen to, a node declared dead long ago, made-up ids) are forgotten first.
    absl::erase_if(next_seq_, [&](const auto& e) { return !live_(e.first); });
  }
  return next_seq_[sender][channel];
}

void SequenceLedger::gap(const std::string& channel, SeqState& s, uint64_t lost,
                         uint64_t row_peer) {
  s.gaps += lost;
  traffic(channel, row_peer).gaps += lost;
}

uint32_t SequenceLedger::arrived(uint64_t sender, const std::string& channel, uint64_t seq,
                                 uint32_t count, uint64_t row_peer) {
  SeqState& s = state(sender, channel);
  uint32_t seen = 0;
  if (s.expected != 0 && seq < s.expected) {
    seen = static_cast<uint32_t>(std::min<uint64_t>(count, s.expected - seq));
  }
  if (s.expected != 0 && seq > s.expected) gap(channel, s, seq - s.expected, row_peer);
  if (seq + count > s.expected) s.expected = seq + count;
  return seen;
}

void SequenceLedger::published(uint64_t sender,
                               const capnp::List<wire::TopicSeq>::Reader& published,
                               const absl::flat_hash_set<std::string>& subscribed,
                               uint64_t row_peer) {
  if (!next_seq_.contains(sender)) return;
  for (auto p : published) {
    // Only topics subscribed to now: a topic we do not take has no gaps.
    std::string channel = p.getChannel().cStr();
    if (subscribed.contains(channel)) lost_before(sender, channel, p.getNext(), row_peer);
  }
}

void SequenceLedger::lost_before(uint64_t sender, const std::string& channel, uint64_t next,
                                 uint64_t row_peer) {
  auto from = next_seq_.find(sender);
  if (from == next_seq_.end()) return;
  // Only with a first frame already, so that the numbering's start here is known.
  auto s = from->second.find(channel);
  if (s == from->second.end() || s->second.expected == 0 || next <= s->second.expected) return;
  gap(channel, s->second, next - s->second.expected, row_peer);
  s->second.expected = next;
}

void SequenceLedger::missed_report(uint64_t peer, uint64_t self,
                                   const capnp::List<wire::Missed>::Reader& missed) {
  for (auto m : missed) {
    if (m.getSender() == self) reported_missed_[peer][m.getChannel().cStr()] = m.getCount();
  }
}

std::vector<std::tuple<uint64_t, const std::string*, uint64_t>> SequenceLedger::missed() const {
  std::vector<std::tuple<uint64_t, const std::string*, uint64_t>> out;
  for (const auto& [sender, channels] : next_seq_) {
    for (const auto& [channel, st] : channels) {
      if (st.gaps > 0 && out.size() < kMaxMissedReports)
        out.emplace_back(sender, &channel, st.gaps);
    }
  }
  return out;
}

void SequenceLedger::restart(const std::string& channel) {
  for (auto& [sender, channels] : next_seq_) {
    if (auto st = channels.find(channel); st != channels.end()) st->second.expected = 0;
  }
}

void SequenceLedger::forget_for_good(uint64_t peer) {
  next_seq_.erase(peer);
  if (auto r = reported_missed_.find(peer); r != reported_missed_.end()) {
    for (const auto& [channel, n] : r->second) missed_gone_[channel] += n;
    reported_missed_.erase(r);
  }
}

void SequenceLedger::bound() {
  if (reported_missed_.size() > kMaxSenders) {
    absl::erase_if(reported_missed_, [&](const auto& r) {
      if (live_(r.first)) return false;
      for (const auto& [channel, n] : r.second) missed_gone_[channel] += n;
      return true;
    });
  }
}

}  // namespace bus::net::detail
