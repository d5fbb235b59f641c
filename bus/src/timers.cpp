#include "bus/detail/timers.hpp"

namespace bus::detail {

bool Timers::see(uint64_t id) {
  if (seen(id)) return false;
  seen_above_.insert(id);
  while (seen_above_.erase(seen_ + 1) != 0) ++seen_;
  return true;
}

void Timers::insert(uint64_t id, Clock::time_point at, Clock::duration period, Fn fn,
                    bool essential) {
  timers_.emplace(std::make_pair(at, id), Timer{std::move(fn), period, essential});
  at_.emplace(id, at);
}

bool Timers::cancel(uint64_t id) {
  if (id == firing_) {
    firing_cancelled_ = true;
    return true;
  }
  auto it = at_.find(id);
  if (it == at_.end()) {
    if (seen(id)) return false;  // fired (once) or cancelled before
    cancelled_unseen_.insert(id);
    return true;
  }
  timers_.erase(std::make_pair(it->second, id));
  at_.erase(it);
  return true;
}

Timers::Fired Timers::fire_first() {
  auto node = timers_.extract(timers_.begin());
  uint64_t id = node.key().second;
  at_.erase(id);
  firing_ = id;
  firing_cancelled_ = false;
  Timer& t = node.mapped();
  return Fired{id, node.key().first, std::move(t.fn), t.period, t.essential};
}

void Timers::drop_inessential() {
  for (auto it = timers_.begin(); it != timers_.end();) {
    if (!it->second.essential) {
      at_.erase(it->first.second);
      it = timers_.erase(it);
    } else {
      ++it;
    }
  }
}

}  // namespace bus::detail
