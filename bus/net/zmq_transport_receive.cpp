// The ZeroMQ transport's receive path: which sockets one pass of the bridge loop polls, and
// reading what they hold (topics, requests, replies, subscriptions) within the read budget.
#include <absl/strings/str_cat.h>

#include <algorithm>

#include "zmq_transport.hpp"
#include "zmq_transport_senders.hpp"

namespace bus::net::detail {

bool recv(zmq::socket_t& s, Parts& parts, std::size_t max_parts) {
  parts.clear();
  zmq::message_t m;
  if (!s.recv(m, zmq::recv_flags::dontwait)) return false;
  bool more = m.more();
  parts.push_back(std::move(m));
  // No bus message has more than 4 parts (identity, channel, envelope, payloads): keep at most
  // `max_parts` so a peer cannot make us hold an unbounded list; the caller rejects the rest.
  while (more) {
    zmq::message_t next;
    if (!s.recv(next, zmq::recv_flags::none)) break;  // the rest of a multipart is already here
    more = next.more();
    if (parts.size() < max_parts) parts.push_back(std::move(next));
  }
  return true;
}

// ---- the loop ------------------------------------------------------------------------------

bool ZmqTransport::prepare(PollSet& set) {
  // Polled on their ZMQ_FD with poll(2), not zmq_poll(): zmq_poll asks every ZeroMQ socket for
  // its events (a poll() and a getpid() each, twice when it waits) on every pass. A ZMQ_FD says
  // only that the socket has commands to process, which a send, a connect or asking for its
  // events also does: so a socket is read when its fd says so until a read finds it empty, and
  // one touched since is asked for its events before the loop waits.
  std::vector<zmq::socket_t*> sockets;  // by index - at_xpub_
  std::vector<bool> wants_room;         // by index - at_xpub_: a dealer holding a backlog
  auto watch = [&](zmq::socket_t& s, bool room = false) {
    std::size_t at = set.add(s.get(zmq::sockopt::fd), POLLIN);
    sockets.push_back(&s);
    wants_room.push_back(room);
    return at;
  };
  // XPUB: only subscriptions. It says POLLOUT even while a NODROP pipe is full (its
  // distributor always "has out"): room for a held frame comes as a command on its ZMQ_FD (a
  // subscriber's pipe read down to half), and a stall is retried when that fires, just before
  // the loop waits, and on the poll timeout (1 ms) at the latest.
  at_xpub_ = watch(*xpub_);
  at_sub_ = watch(*sub_);
  at_router_ = watch(*router_);
  at_zap_ = zap_ ? watch(*zap_) : 0;
  at_dealers_ = set.fds.size();
  dealers_.clear();
  for (auto& [id, r] : routes_) {
    dealers_.push_back(id);
    // A dealer holding a backlog is asked for room on every pass.
    const bool room = !r->backlog.empty();
    watch(*r->dealer, room);
    if (room) touched(r->dealer->handle());
  }
  // Requests wait in the ROUTER while replies wait for room (back-pressure on requesters): it
  // is asked on every pass, but what it holds does not keep the loop from waiting.
  router_held_ = reply_backlog_.size() >= kPauseBacklog;
  if (router_held_) touched(router_->handle());

  ready_.assign(sockets.size(), false);
  bool has_input = false;
  for (std::size_t i = 0; i < sockets.size() && (ask_all_ || !touched_.empty()); ++i) {
    zmq::socket_t& s = *sockets[i];
    if (!ask_all_ && std::find(touched_.begin(), touched_.end(), s.handle()) == touched_.end()) {
      continue;
    }
    const int events = s.get(zmq::sockopt::events);
    const bool in = (events & ZMQ_POLLIN) != 0;
    ready_[i] = in;
    if ((in && !(&s == &*router_ && router_held_)) ||
        (wants_room[i] && (events & ZMQ_POLLOUT) != 0)) {
      has_input = true;
    }
  }
  touched_.clear();
  ask_all_ = false;
  return has_input;
}

void ZmqTransport::read_traffic(const PollSet& set) {
  for (std::size_t i = 0; i < ready_.size(); ++i) {
    if (set.fds[at_xpub_ + i].revents != 0) ready_[i] = true;
  }
  // Only sockets with input, and at most kReadBudget messages and frames from each: one left
  // before it was empty is asked again before the next poll.
  auto read = [&](zmq::socket_t& s, auto&& next, auto&& on) {
    void* handle = s.handle();  // reading may forget a peer and close its dealer
    std::size_t start = sink_.messages_read();
    for (std::size_t frames = 0;; ++frames) {
      if (frames == kReadBudget || sink_.messages_read() - start >= kReadBudget) {
        touched(handle);  // not read to the end: asked again before the next poll
        return;
      }
      if (!next()) return;
      on();
    }
  };
  if (ready_[at_sub_ - at_xpub_]) {
    read(
        *sub_, [&] { return recv(*sub_, parts_); }, [&] { on_sub(parts_); });
  }
  if (ready_[at_router_ - at_xpub_]) {
    read(
        *router_,
        [&] {
          if (reply_backlog_.size() < kPauseBacklog) return recv(*router_, parts_, 5);
          touched(router_->handle());
          return false;
        },
        [&] { on_router(parts_); });
  }
  for (std::size_t d = 0; d < dealers_.size(); ++d) {
    if (!ready_[at_dealers_ - at_xpub_ + d]) continue;
    // Reading may add or forget peers (and close their dealers): look the route up again
    // before each read.
    auto it = routes_.find(dealers_[d]);
    if (it == routes_.end()) continue;
    zmq::socket_t& dealer = *it->second->dealer;
    read(
        dealer,
        [&] {
          auto r = routes_.find(dealers_[d]);
          return r != routes_.end() && r->second->dealer.get() == &dealer && recv(dealer, parts_);
        },
        [&] { on_dealer(parts_); });
  }
}

void ZmqTransport::read_control(const PollSet&) {
  if (ready_[0]) {
    std::size_t i = 0;
    for (zmq::message_t m; i < kReadBudget && xpub_->recv(m, zmq::recv_flags::dontwait); ++i) {
      on_xpub(m);
    }
    if (i == kReadBudget) touched(xpub_->handle());
  }
  if (zap_ && ready_[at_zap_ - at_xpub_]) on_zap();  // reads until ZAP's socket is empty
}

void ZmqTransport::read_topics_for(std::chrono::milliseconds bound) {
  zmq::pollitem_t item{sub_->handle(), 0, ZMQ_POLLIN, 0};
  zmq::poll(&item, 1, bound);
  while (recv(*sub_, parts_)) on_sub(parts_);
}

// ---- incoming ------------------------------------------------------------------------------

void ZmqTransport::on_sub(Parts& parts) {
  if (parts.size() != 3) {
    return sink_.on_malformed(
        "subscriber", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  }
  sink_.on_frame(frame_of(parts, 0, Stream::kTopics));
}

void ZmqTransport::on_router(Parts& parts) {
  if (parts.size() != 4) {
    return sink_.on_malformed(
        "request", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 4")));
  }
  InFrame f = frame_of(parts, 1, Stream::kRequests);
  f.reply_to.identity = std::string(view(parts[0]));
  sink_.on_frame(f);
}

void ZmqTransport::on_dealer(Parts& parts) {
  if (parts.size() != 3) {
    return sink_.on_malformed(
        "reply", absl::InvalidArgumentError(absl::StrCat(parts.size(), " parts, expected 3")));
  }
  sink_.on_frame(frame_of(parts, 0, Stream::kReplies));
}

void ZmqTransport::on_xpub(const zmq::message_t& m) {
  if (m.size() < 1) return;
  const char* d = static_cast<const char*>(m.data());
  std::string topic(d + 1, m.size() - 1);
  if (d[0] == 1) {
    ++subscribers_[topic];
    sink_.on_subscription(topic, true, false);
  } else if (d[0] == 0) {
    auto it = subscribers_.find(topic);
    if (it != subscribers_.end() && --it->second == 0) subscribers_.erase(it);
    sink_.on_subscription(topic, false, false);
  }
}

}  // namespace bus::net::detail
