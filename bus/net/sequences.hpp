// Loss accounting across processes: per-(sender, channel) sequence numbers, the gaps a receiver
// counts in them, what peers report they missed of ours, and the traffic rows of NodeStats.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <cstdint>
#include <functional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bus/net/stats.hpp"
#include "bus/schemas/envelope.capnp.h"
#include "frames.hpp"

namespace bus::net::detail {

/// Traffic counted per (channel, peer).
using TrafficRows = absl::flat_hash_map<std::pair<std::string, uint64_t>, ChannelTraffic>;
/// The row of (`channel`, `peer`), made when new.
ChannelTraffic& row(TrafficRows& rows, const std::string& channel, uint64_t peer);
/// Folds `peer`'s rows into the "gone" rows (peer 0), so that the table stays bounded as nodes
/// come and go.
void fold_gone(TrafficRows& rows, uint64_t peer);

/// What a receiver knows of one sender's numbering on one channel. Kept while the sender may
/// come back (declared dead but not gone for good), so that what it missed meanwhile is counted.
struct SeqState {
  uint64_t expected = 0;  // the next number; 0: no frame yet (the first one sets it)
  uint64_t gaps = 0;      // numbers skipped so far: reported back in heartbeats (`missed`)
};

/// The ledger of one node (bridge thread). Rows are keyed by the peer's id when it is a live
/// peer, 0 otherwise (`known`, below, says which): rows of unknown senders are folded together.
class SequenceLedger {
 public:
  /// `live(id)`: whether `id` is a live peer (state for others is dropped first when bounded).
  explicit SequenceLedger(std::function<bool(uint64_t)> live) : live_(std::move(live)) {}

  /// `count` messages numbered from `seq` arrived from `sender` on `channel`: what was skipped
  /// before them was lost on the way (at-most-once) and is counted as gaps on the row of
  /// `row_peer`. Returns how many of them (the first ones) arrived before: take the rest only.
  uint32_t arrived(uint64_t sender, const std::string& channel, uint64_t seq, uint32_t count,
                   uint64_t row_peer);
  /// A heartbeat's `published` from `sender`: numbers below those that never arrived are gaps too,
  /// on the topics in `subscribed` (a topic we do not take has no gaps).
  void published(uint64_t sender, const capnp::List<wire::TopicSeq>::Reader& published,
                 const absl::flat_hash_set<std::string>& subscribed, uint64_t row_peer);
  /// Numbers of `sender` on `channel` below `next` that did not arrive are lost (counted as
  /// gaps), as a heartbeat's `published` says for every topic.
  void lost_before(uint64_t sender, const std::string& channel, uint64_t next, uint64_t row_peer);
  /// A heartbeat's `missed` from `peer`: its running totals of what it missed of `self`'s.
  void missed_report(uint64_t peer, uint64_t self, const capnp::List<wire::Missed>::Reader& missed);
  /// Our running totals of what we missed of each sender (a heartbeat's `missed`), at most
  /// kMaxMissedReports entries.
  std::vector<std::tuple<uint64_t, const std::string*, uint64_t>> missed() const;
  /// `channel` is no longer subscribed to: what is published meanwhile is not lost, and the
  /// first frame after a new subscription starts the count again.
  void restart(const std::string& channel);
  /// `peer` will not speak again with this id (it left, or a new run took its address): its
  /// numbering ends here, and what it missed of ours stays counted under "gone".
  void forget_for_good(uint64_t peer);
  /// `peer` is no longer live: its traffic rows fold into "gone".
  void fold(uint64_t peer) { fold_gone(traffic_, peer); }
  /// Bounds what is kept of what peers that are not live reported (kMaxSenders).
  void bound();

  ChannelTraffic& traffic(const std::string& channel, uint64_t peer) {
    return row(traffic_, channel, peer);
  }
  /// The traffic rows with what peers reported missing added (live peers' on their rows, the
  /// others' on the "gone" rows).
  template <class Known>
  TrafficRows rows(Known known) const;

 private:
  SeqState& state(uint64_t sender, const std::string& channel);
  void gap(const std::string& channel, SeqState& s, uint64_t lost, uint64_t row_peer);

  absl::flat_hash_map<uint64_t, absl::flat_hash_map<std::string, SeqState>> next_seq_;
  // What each peer's heartbeats say it missed of ours, per channel (running totals, kept while
  // it may come back); what peers gone for good had missed, per channel.
  absl::flat_hash_map<uint64_t, absl::flat_hash_map<std::string, uint64_t>> reported_missed_;
  absl::flat_hash_map<std::string, uint64_t> missed_gone_;
  TrafficRows traffic_;
  std::function<bool(uint64_t)> live_;
};

template <class Known>
TrafficRows SequenceLedger::rows(Known known) const {
  TrafficRows rows = traffic_;
  for (const auto& [peer, channels] : reported_missed_) {
    for (const auto& [channel, n] : channels) row(rows, channel, known(peer)).peer_missed += n;
  }
  for (const auto& [channel, n] : missed_gone_) row(rows, channel, 0).peer_missed += n;
  return rows;
}

}  // namespace bus::net::detail
