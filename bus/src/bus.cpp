#include "bus/bus.hpp"

#include <unistd.h>

#include <atomic>

namespace bus {
namespace {
std::atomic<uint64_t> g_next_uid{1};
}

Bus::Bus(Options options)
    : core_(std::make_shared<detail::Core>(options, g_next_uid.fetch_add(1))) {
  core_->start(core_);
}

Bus::~Bus() {
  (void)stop();
  // Registrations cancel against a stopped bus: they only drop their handlers.
  kept_.clear();
  for (auto& life : services_) {
    life->alive.store(false, std::memory_order_relaxed);
    life->subs.clear();
    life->periodic.clear();
    life->state.reset();
  }
}

absl::Status Bus::stop() { return core_->stop(); }

std::optional<unsigned> Bus::current_executor() const {
  detail::Producer& p = core_->producer();
  if (!p.executor) return std::nullopt;
  return p.own_inbox->index();
}

unsigned Bus::place(Placement where) {
  if (where.executor < 0) return core_->next_placement();
  if (static_cast<unsigned>(where.executor) >= executors()) {
    throw std::out_of_range(absl::StrCat("bus: executor ", where.executor,
                                         " does not exist (the bus has ", executors(), ")"));
  }
  return static_cast<unsigned>(where.executor);
}

detail::Inbox& Bus::placed(Placement where) { return core_->executor(place(where)); }

void Bus::cancel(TimerId timer) {
  if (!timer) return;
  detail::Inbox* in;
  {
    std::lock_guard lock(core_->mu);
    if (timer.inbox >= core_->inboxes.size()) return;
    in = core_->inboxes[timer.inbox].get();
  }
  (void)core_->cancel_on(
      *in, [in, id = timer.id] { in->cancel_timer(id); }, nullptr);
}

void Bus::keep(Subscription s) {
  std::lock_guard lock(keep_mu_);
  kept_.push_back(std::move(s));
}

detail::ServiceLife* Bus::keep_service(std::shared_ptr<void> state) {
  auto life = std::make_unique<detail::ServiceLife>();
  life->state = std::move(state);
  std::lock_guard lock(keep_mu_);
  services_.push_back(std::move(life));
  return services_.back().get();
}

void Bus::stop_service(detail::ServiceLife& life, unsigned executor) {
  std::vector<Subscription> subs;
  std::vector<TimerId> periodic;
  // The state travels in a holder: if the executor cannot take it any more, it comes back.
  auto holder = std::make_shared<std::shared_ptr<void>>();
  {
    std::lock_guard lock(life.mu);
    subs.swap(life.subs);
    periodic.swap(life.periodic);
    holder->swap(life.state);
  }
  if (!*holder) return;  // stopped already
  auto give_back = [&] {
    std::lock_guard lock(life.mu);
    life.state = std::move(*holder);  // destroyed by ~Bus, once no executor runs
  };
  // Each cancel returns once its handler cannot start again (from one of the service's own
  // handlers: once the running one returns). Then nothing of it runs (`alive`), and the state
  // goes on its executor, between two of its records: after the running handler, if called
  // from one.
  subs.clear();
  for (TimerId t : periodic) cancel(t);
  if (!core_->cancel_on(
          core_->executor(executor),
          [&life] { life.alive.store(false, std::memory_order_relaxed); },
          [holder] { holder->reset(); })) {
    life.alive.store(false, std::memory_order_relaxed);
    give_back();  // nothing runs on the executor any more: the state goes with the bus
  }
}

Stats Bus::stats() const {
  Stats out;
  detail::Core& c = *core_;
  uint32_t n = detail::channel_count();
  std::vector<ChannelStats> ch(n);
  std::vector<bool> used(n, false);
  auto from_producer = [&](uint32_t id, std::size_t f, uint64_t v) {
    if (id >= n) return;
    used[id] = true;
    if (f == detail::kPublished) ch[id].published += v;
    if (f == detail::kDropped) ch[id].dropped += v;
    if (f == detail::kFailed) ch[id].failed += v;
    if (f == detail::kRepliedLate) ch[id].late_replies += v;
  };
  {
    std::lock_guard lock(c.mu);
    c.retired_counts.for_each(from_producer);
    for (detail::Producer* p : c.producers) {
      p->counters.for_each(from_producer);
      out.held_records += p->backlog_size.load(std::memory_order_relaxed);
    }
    for (auto& in : c.inboxes) {
      in->counters.for_each([&](uint32_t id, std::size_t f, uint64_t v) {
        if (id >= n) return;
        used[id] = true;
        switch (f) {
          case detail::kDelivered: ch[id].delivered += v; break;
          case detail::kHandlerFailed: ch[id].handler_failed += v; break;
          case detail::kLateReplies: ch[id].late_replies += v; break;
          case detail::kExpired: ch[id].expired += v; break;
          case detail::kUnrouted: ch[id].unrouted += v; break;
          default: break;
        }
      });
      InboxStats is;
      is.index = in->index();
      is.external = in->kind() == detail::Inbox::Kind::kExternal;
      out.inboxes.push_back(is);
    }
    for (auto& r : c.rings) {
      InboxStats& is = out.inboxes[r->consumer()->index()];
      ++is.rings;
      is.depth_bytes += r->depth_words() * 8;
      is.capacity_bytes += r->capacity() * 8;
    }
  }
  for (uint32_t id = 0; id < n; ++id) {
    if (!used[id] && c.find_state(id) == nullptr) continue;
    const detail::ChannelInfo& info = detail::channel_info(id);
    ch[id].name = info.name;
    ch[id].type = info.type_name;
    out.channels.push_back(std::move(ch[id]));
  }
  return out;
}

// ---- Batch
// ---------------------------------------------------------------------------------------

Batch::Batch(Bus& bus) : core_(*bus.core_), producer_(core_.producer()) {
  accepted_ = core_.enter(producer_);
  if (accepted_ && producer_.batch_depth++ == 0) {
    outer_gate_ = producer_.gate;
    producer_.gate = detail::Producer::kOpen;
  }
}

Batch::~Batch() {
  if (!accepted_) return;
  if (--producer_.batch_depth == 0) {
    producer_.flush();
    producer_.gate = outer_gate_;
    core_.leave(producer_);
  }
}

void Batch::flush() { producer_.flush(); }

// ---- ExternalInbox
// -------------------------------------------------------------------------------

ExternalInbox::ExternalInbox(Bus& bus) : bus_(bus), inbox_(&bus.core_->create_external_inbox()) {
  bind_to_this_thread();
}

ExternalInbox::~ExternalInbox() {
  detail::Producer& p = bus_.core_->producer();
  if (p.own_inbox == inbox_) p.own_inbox = nullptr;
  inbox_->run_deferred();  // callbacks posted to itself run (their owners may be going away)
  inbox_->cancel_all_pending(absl::CancelledError("bus: the inbox waiting for this reply closed"));
}

void ExternalInbox::bind_to_this_thread() { bus_.core_->bind_thread(*inbox_); }

std::size_t ExternalInbox::drain_awake() {
  // No eventfd read: while the inbox is awake producers do not write it, so reading would be a
  // syscall per pass that finds nothing. A write from before waking is consumed by drain().
  inbox_->begin_drain();
  return inbox_->run_once();
}

std::size_t ExternalInbox::drain() {
  inbox_->begin_drain();
  // One read takes the whole count (the eventfd is not a semaphore): a second would only find
  // nothing, a syscall per wake-up.
  uint64_t ignored;
  (void)::read(fd(), &ignored, sizeof ignored);
  std::size_t n = drain_awake();
  inbox_->end_drain();
  return n;
}

}  // namespace bus
