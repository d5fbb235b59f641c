#include "bus/net/limiter.hpp"

#include <absl/strings/str_cat.h>

#include <algorithm>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "bus/schemas/limiter.capnp.h"

namespace bus::net {
namespace {

using Counts = schemas::limiter::Counts;
using CountsMessage = Message<Counts>;
using SysClock = std::chrono::system_clock;

/// The topic of a limiter name. Nodes keep references to the topics they bridge, so topics
/// live as long as the program (one per limiter name, like the channel registry itself).
const Topic<CountsMessage>& topic_for(const std::string& name) {
  static std::mutex mu;
  static auto* topics = new absl::flat_hash_map<std::string, std::unique_ptr<Topic<CountsMessage>>>;
  std::lock_guard lock(mu);
  auto& t = (*topics)[name];
  if (!t) t = std::make_unique<Topic<CountsMessage>>(absl::StrCat("bus.limit.", name));
  return *t;
}

uint64_t random_id() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ 1;
}

}  // namespace

struct RateLimiter::Impl {
  Impl(Bus& b, std::string n, uint64_t self, LimiterOptions o)
      : bus(b), name(std::move(n)), id(self), opts(std::move(o)), topic(topic_for(name)) {
    if (opts.window().count() <= 0) {
      throw std::invalid_argument("bus::net::RateLimiter: the window must be positive");
    }
    if (!opts.clock()) opts.clock([] { return SysClock::now(); });
  }

  struct Key {
    int64_t window = std::numeric_limits<int64_t>::min();
    uint64_t local = 0;                              // admitted here
    uint64_t remote_sum = 0;                         // the sum of `remote`
    absl::flat_hash_map<uint64_t, uint64_t> remote;  // other limiter instance -> its count
    bool dirty = false;                              // changed since the last exchange
    uint64_t total() const { return local + remote_sum; }
  };

  Bus& bus;
  const std::string name;
  const uint64_t id;
  LimiterOptions opts;
  const Topic<CountsMessage>& topic;

  mutable std::mutex mu;  // guards everything below
  absl::flat_hash_map<std::string, Key> keys;
  LimiterStats st;
  uint64_t exchanges = 0;

  Subscription sub;
  TimerId timer;

  int64_t window_at(SysClock::time_point t) const {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch()).count();
    int64_t w = opts.window().count();
    return ms >= 0 ? ms / w : (ms - w + 1) / w;
  }
  /// The key's state in window `w`; a key of an older window starts over. (A newer one stays:
  /// the clock went back, or another node's clock runs ahead; counting more is the safe side.)
  Key& at(std::string_view k, int64_t w) {
    Key& e = keys[absl::string_view(k.data(), k.size())];
    if (e.window < w) {
      e.window = w;
      e.local = 0;
      e.remote_sum = 0;
      e.remote.clear();
      e.dirty = false;
    }
    return e;
  }
  uint64_t over(uint64_t total) const { return total > opts.limit() ? total - opts.limit() : 0; }

  Decision admit(std::string_view k, uint64_t n) {
    auto now = opts.clock()();
    int64_t w = window_at(now);
    std::lock_guard lock(mu);
    Key& e = at(k, w);
    Decision d;
    if (e.total() + n <= opts.limit()) {
      e.local += n;
      e.dirty = true;
      st.admitted += n;
      d.admitted = true;
    } else {
      st.refused += n;
      auto end =
          SysClock::time_point(std::chrono::milliseconds((e.window + 1) * opts.window().count()));
      d.retry_after = std::max(std::chrono::milliseconds(1),
                               std::chrono::ceil<std::chrono::milliseconds>(end - now));
    }
    d.known = e.total();
    return d;
  }

  /// Another node's counts.
  void take(const CountsMessage& m) {
    auto r = m.reader();
    if (r.getNode() == id || r.getLimiter() != name) return;
    int64_t now_w = window_at(opts.clock()());
    int64_t w = r.getWindow();
    std::lock_guard lock(mu);
    if (w < now_w) {
      ++st.stale;
      return;
    }
    ++st.received;
    for (auto entry : r.getEntries()) {
      auto key = entry.getKey();
      Key& e = at(std::string_view(key.cStr(), key.size()), w);
      if (e.window != w) continue;  // this key is already in a later window here
      uint64_t& known = e.remote[r.getNode()];
      uint64_t count = entry.getCount();
      if (count <= known) continue;  // counts only grow within a window: an older message
      uint64_t before = over(e.total());
      e.remote_sum += count - known;
      known = count;
      st.over_admitted += over(e.total()) - before;
    }
  }

  /// Publishes this node's counts: the keys that changed, or all of them.
  void exchange(bool all) {
    int64_t w = window_at(opts.clock()());
    std::vector<std::pair<std::string, uint64_t>> out;
    {
      std::lock_guard lock(mu);
      all = all || ++exchanges % 10 == 0;
      for (auto it = keys.begin(); it != keys.end();) {
        Key& e = it->second;
        if (e.window < w) {
          keys.erase(it++);  // a past window: forget it
          continue;
        }
        if (e.local > 0 && (all || e.dirty)) out.emplace_back(it->first, e.local);
        e.dirty = false;
        ++it;
      }
      if (!out.empty()) ++st.sent;
    }
    if (out.empty()) return;
    auto msg = build<Counts>([&](Counts::Builder b) {
      b.setLimiter(name);
      b.setNode(id);
      b.setWindow(w);
      auto entries = b.initEntries(static_cast<unsigned>(out.size()));
      for (unsigned i = 0; i < out.size(); ++i) {
        entries[i].setKey(out[i].first);
        entries[i].setCount(out[i].second);
      }
    });
    (void)bus.publish(topic, std::move(msg));
  }

  void start(const std::shared_ptr<Impl>& self) {
    std::weak_ptr<Impl> weak = self;
    sub = bus.subscribe(topic, [weak](const CountsMessage& m) {
      if (auto s = weak.lock()) s->take(m);
    });
    if (opts.exchange().count() > 0) {
      timer = bus.every(Placement{}, opts.exchange(), [weak] {
        if (auto s = weak.lock()) s->exchange(false);
      });
    }
  }
};

RateLimiter::RateLimiter(Bus& bus, std::string name, LimiterOptions options)
    : name_(std::move(name)),
      id_(random_id()),
      impl_(std::make_shared<Impl>(bus, name_, id_, std::move(options))) {
  impl_->start(impl_);
}

RateLimiter::RateLimiter(Bus& bus, Node& node, std::string name, LimiterOptions options)
    : RateLimiter(bus, std::move(name), std::move(options)) {
  node.export_topic(impl_->topic).import_topic(impl_->topic);
}

RateLimiter::~RateLimiter() {
  impl_->bus.cancel(impl_->timer);
  impl_->sub.cancel();
}

Decision RateLimiter::admit(std::string_view key, uint64_t n) { return impl_->admit(key, n); }

uint64_t RateLimiter::known(std::string_view key) const {
  int64_t w = impl_->window_at(impl_->opts.clock()());
  std::lock_guard lock(impl_->mu);
  auto it = impl_->keys.find(absl::string_view(key.data(), key.size()));
  return it == impl_->keys.end() || it->second.window != w ? 0 : it->second.total();
}

void RateLimiter::exchange() { impl_->exchange(true); }

LimiterStats RateLimiter::stats() const {
  std::lock_guard lock(impl_->mu);
  LimiterStats s = impl_->st;
  s.keys = impl_->keys.size();
  return s;
}

}  // namespace bus::net
