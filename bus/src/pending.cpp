#include "bus/detail/pending.hpp"

#include <cassert>

namespace bus::detail {

uint64_t PendingRequests::reserve() {
  uint32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else if (slots_.size() >= max_) {
    return 0;  // every slot there may be is taken
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  uint64_t corr = (++last_correlation_ << kSlotBits) | slot;
  if (corr == 0) corr = (++last_correlation_ << kSlotBits) | slot;  // 0 marks a free slot
  slots_[slot].corr = corr;
  return corr;
}

PendingRequests::CompleteFn PendingRequests::free_slot(Slot& slot) {
  CompleteFn fn = std::move(slot.fn);
  slot.fn = nullptr;
  slot.corr = 0;
  free_.push_back(static_cast<uint32_t>(&slot - slots_.data()));
  return fn;
}

void PendingRequests::release(uint64_t corr) {
  if (Slot* slot = find(corr)) (void)free_slot(*slot);
}

void PendingRequests::add(uint64_t corr, uint32_t channel, Clock::time_point deadline,
                          CompleteFn&& fn) {
  Slot* slot = find(corr);
  assert(slot != nullptr && !slot->fn);
  slot->channel = channel;
  slot->fn = std::move(fn);
  deadlines_.push(deadline, corr);
  if (deadlines_.size() > 2 * count() + 64) {
    // Mostly answered entries: keep the pending ones' (answers out of deadline order leave
    // entries behind the first; this bounds them to about the number pending).
    deadlines_.retain([this](uint64_t c) { return find(c) != nullptr; });
  }
}

bool PendingRequests::complete(uint64_t corr, uint32_t channel, absl::Status&& status,
                               void* reply) {
  Slot* slot = find(corr);
  if (slot == nullptr || slot->channel != channel || !slot->fn) [[unlikely]] {
    return false;
  }
  CompleteFn fn = free_slot(*slot);
  if (!deadlines_.empty() && deadlines_.top().second == corr) forget_answered();
  fn(std::move(status), reply);
  return true;
}

void PendingRequests::forget_answered() {
  while (!deadlines_.empty() && find(deadlines_.top().second) == nullptr) deadlines_.pop();
}

uint64_t PendingRequests::next_expired(Clock::time_point now) {
  while (!deadlines_.empty() && deadlines_.top().first <= now) {
    uint64_t corr = deadlines_.top().second;
    deadlines_.pop();
    if (find(corr) != nullptr) return corr;  // else answered
  }
  return 0;
}

std::pair<uint32_t, PendingRequests::CompleteFn> PendingRequests::take(uint64_t corr) {
  Slot* slot = find(corr);
  assert(slot != nullptr);
  uint32_t channel = slot->channel;
  return {channel, free_slot(*slot)};
}

}  // namespace bus::detail
