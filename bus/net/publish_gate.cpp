#include "publish_gate.hpp"

#include <algorithm>

namespace bus::net::detail {

bool PublishGate::publish(OutFrame frame, const std::vector<Subscribers*>& to) {
  std::vector<Subscribers*> refused;
  for (Subscribers* s : to) {
    if (!s->offer(frame)) refused.push_back(s);
  }
  if (refused.empty()) return true;
  held_.emplace(Held{std::move(frame), std::move(refused), Clock::now()});
  return false;
}

bool PublishGate::retry(uint64_t& cuts) {
  if (!held_) return true;
  std::erase_if(held_->waiting, [&](Subscribers* s) { return s->offer(held_->frame); });
  if (!held_->waiting.empty() && Clock::now() - held_->since >= limit_) {
    for (Subscribers* s : held_->waiting) {
      s->cut(held_->frame);
      ++cuts;
    }
    held_->waiting.clear();
  }
  if (!held_->waiting.empty()) return false;
  held_.reset();
  return true;
}

void PublishGate::forget(const Subscribers* s) {
  if (!held_) return;
  std::erase(held_->waiting, s);
  if (held_->waiting.empty()) held_.reset();
}

}  // namespace bus::net::detail
