// The stall-and-cut policy for published frames, whichever transport their subscribers are on.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <vector>

#include "frames.hpp"

namespace bus::net::detail {

/// Holds a published frame back while a subscriber is full, for at most send_stall_limit, then
/// sends it on without that subscriber. While a frame is held nothing else is published (the
/// bridge stops taking local input, and local publishers feel the back-pressure through the
/// bounded rings): a subscriber that is only a little slower, or pauses briefly, loses nothing,
/// and one that stops reading costs the others one wait, then only itself.
class PublishGate {
 public:
  explicit PublishGate(std::chrono::milliseconds limit) : limit_(limit) {}

  /// Offers `frame` to each of `to`. When one is full, the frame is held for it (and for any
  /// other that was full) and false is returned: a stall.
  bool publish(OutFrame frame, const std::vector<Subscribers*>& to);
  /// Offers the held frame again to those that refused it. Past the limit it cuts them (each
  /// counted in `cuts`). True when nothing is held any more.
  bool retry(uint64_t& cuts);
  bool holding() const { return held_.has_value(); }
  /// When the held frame was first refused (holding() only).
  Clock::time_point since() const { return held_->since; }
  /// Messages of `topic` in the held frame: numbered already, not taken yet.
  uint32_t held(const Bridged* topic) const {
    return held_ && held_->frame.topic == topic ? held_->frame.count : 0;
  }
  /// `s` goes away (a link closed): the held frame no longer waits for it.
  void forget(const Subscribers* s);

 private:
  struct Held {
    OutFrame frame;
    std::vector<Subscribers*> waiting;
    Clock::time_point since;
  };
  const std::chrono::milliseconds limit_;
  std::optional<Held> held_;
};

}  // namespace bus::net::detail
