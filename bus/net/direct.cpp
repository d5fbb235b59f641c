#include "direct.hpp"

#include <absl/container/flat_hash_set.h>
#include <absl/strings/str_cat.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

namespace bus::net::detail {

namespace {
// Replies to requests sent from a lane wait on its socket; a call notices a peer gone or the
// node stopping within this long (the bridge declares a peer dead after missed heartbeats,
// hundreds of milliseconds; this adds little to it).
constexpr auto kDirectSlice = std::chrono::milliseconds(10);
// Reasons of recently gone peers kept for calls that wait on them.
constexpr std::size_t kGoneKept = 256;

absl::string_view sv(std::string_view s) { return {s.data(), s.size()}; }
}  // namespace

struct DirectLanes::Lane {
  uint64_t generation = 0;  // of the servers its dealers were last checked against
  absl::flat_hash_map<uint64_t, std::unique_ptr<zmq::socket_t>> dealers;  // by node id
  absl::flat_hash_map<uint64_t, std::unique_ptr<ShmLink>> links;          // by node id
  absl::flat_hash_set<uint64_t> unlinkable;  // nodes a link could not be made to: DEALERs
  uint64_t last_correlation = 0;
  Parts parts;
  Payloads payloads;
  // What the current call counts, added to the lanes' counters once, when the lane goes back.
  struct {
    uint64_t received = 0, rejected = 0, late = 0, malformed = 0, peer_gone = 0;
  } tally;
};

DirectLanes::DirectLanes(zmq::context_t& ctx, const NodeOptions& options, uint64_t node_id,
                         Limits limits)
    : ctx_(ctx),
      options_(options),
      node_id_(node_id),
      limits_(limits),
      servers_(std::make_shared<const Servers>()) {
  shm_.ring_bytes = options.shm_ring_bytes();
  shm_.heap_limit = options.shm_heap_limit();
  shm_.spin = options.shm_spin();
  shm_.access.group = options.shm_group();
}

DirectLanes::~DirectLanes() = default;

void DirectLanes::set_servers(absl::flat_hash_map<std::string, std::vector<DirectServer>> s) {
  std::lock_guard lock(mu_);
  auto next = std::make_shared<Servers>();
  next->generation = servers_->generation + 1;
  next->by_endpoint = std::move(s);
  servers_ = std::move(next);
}

void DirectLanes::peer_gone(uint64_t id, const absl::Status& why) {
  std::lock_guard lock(mu_);
  gone_.push_back({id, servers_->generation, why});
  if (gone_.size() > kGoneKept) gone_.pop_front();
  fold_gone(traffic_, id);  // as the bridge does with its own rows
}

void DirectLanes::stop() {
  std::lock_guard lock(mu_);
  stopped_.store(true);
  idle_.clear();  // closes their sockets
}

void DirectLanes::add_to(NodeStats& s, TrafficRows& rows) const {
  std::lock_guard lock(mu_);
  s.late_replies += counters_.late_replies;
  s.calls_peer_gone += counters_.calls_peer_gone;
  s.request_frames += counters_.request_frames;
  s.direct_calls += counters_.direct_calls;
  s.malformed_frames += counters_.malformed_frames;
  s.oversized += counters_.oversized;
  for (const auto& [key, t] : traffic_) {
    ChannelTraffic& r = row(rows, key.first, key.second);
    r.sent += t.sent;
    r.received += t.received;
    r.rejected += t.rejected;
  }
}

void DirectLanes::fail(Lane& lane, const absl::Status& why, PendingCall& done) {
  if (why.code() == absl::StatusCode::kAborted) ++lane.tally.peer_gone;
  done.finish(why, {});
}

const absl::Status* DirectLanes::gone_since_picked(const DirectServer& server) const {
  for (const Gone& g : gone_) {
    if (g.id == server.id && g.generation >= server.picked_at) return &g.why;
  }
  return nullptr;
}

absl::Status DirectLanes::gone(const DirectServer& server) const {
  if (stopped_.load(std::memory_order_relaxed)) {
    return absl::CancelledError("bus.net: the node stopped");
  }
  std::lock_guard lock(mu_);
  const absl::Status* why = gone_since_picked(server);
  return why != nullptr ? *why : absl::OkStatus();
}

bool DirectLanes::call(std::string_view name, uint64_t type_id, uint64_t reply_type_id,
                       const OutPayload& out, Clock::time_point deadline, PendingCall& done) {
  const std::string_view payload = out.view();
  if (payload.size() > options_.message_limit_of(name)) {
    {
      std::lock_guard lock(mu_);
      ++counters_.oversized;
    }
    done.finish(absl::ResourceExhaustedError(absl::StrCat("bus.net: request of ", payload.size(),
                                                          " bytes is over its channel's limit")),
                {});
    return true;
  }
  std::unique_ptr<Lane> lane;
  std::shared_ptr<const Servers> servers;
  DirectServer to;
  bool linked = false;  // the server shares memory with this node: try the lane's link first
  {
    std::lock_guard lock(mu_);
    if (stopped_.load(std::memory_order_relaxed)) {
      done.finish(absl::CancelledError("bus.net: the node stopped"), {});
      return true;
    }
    servers = servers_;
    auto it = servers->by_endpoint.find(absl::string_view(name.data(), name.size()));
    if (it == servers->by_endpoint.end() || it->second.empty()) {
      done.finish(
          absl::UnavailableError(absl::StrCat("bus.net: no live node serves '", sv(name), "'")),
          {});
      return true;
    }
    to = it->second[round_robin_[it->first]++ % it->second.size()];
    to.picked_at = servers->generation;
    if (idle_.empty()) {
      lane = std::make_unique<Lane>();
    } else {
      lane = std::move(idle_.back());
      idle_.pop_back();
    }
    // Dealers to nodes no longer serving anything here are closed (a node that restarted is a
    // new node, with a new id).
    if (lane->generation != servers->generation) {
      lane->generation = servers->generation;
      absl::flat_hash_set<uint64_t> live;
      for (const auto& [n, list] : servers->by_endpoint) {
        for (const auto& s : list) live.insert(s.id);
      }
      absl::erase_if(lane->dealers, [&](const auto& d) { return !live.contains(d.first); });
      absl::erase_if(lane->links, [&](const auto& l) { return !live.contains(l.first); });
    }
    if (to.shm && !lane->unlinkable.contains(to.id)) linked = true;
    // Sockets are made under the lock that stop() takes: none is made after the context closes.
    auto& dealer = lane->dealers[to.id];
    if (!dealer) {
      try {
        dealer = make_dealer(ctx_, options_, to.public_key);
        dealer->connect(to.request_address);
      } catch (const zmq::error_t& e) {
        dealer.reset();
        lane->dealers.erase(to.id);
        idle_.push_back(std::move(lane));
        done.finish(
            absl::UnavailableError(absl::StrCat("bus.net: cannot call node '", to.name, "' at ",
                                                to.request_address, ": ", e.what())),
            {});
        return true;
      }
    }
  }
  Wait outcome = Wait::kFailed;
  bool sent = false;
  bool told = false;  // `done` has its answer
  std::optional<Wait> over_link;
  if (linked) {
    over_link = call_linked(*lane, to, name, type_id, reply_type_id, out, deadline, done, sent);
    if (over_link) outcome = *over_link;
  }
  if (!over_link) try {
      zmq::socket_t* dealer = lane->dealers[to.id].get();
      EnvelopeFields env;
      env.kind = wire::Envelope::Kind::REQUEST;
      env.type_id = type_id;
      env.sender = node_id_;
      env.count = 1;
      env.correlation = ++lane->last_correlation;
      env.principal = bus::detail::current_principal();  // this thread's: it made the call
      auto left = deadline - Clock::now();
      env.timeout_us = left > Clock::duration::zero()
                           ? static_cast<uint64_t>(duration_cast<microseconds>(left).count())
                           : 0;
      std::string e = encode_envelope(env);
      // The pipe has room unless the node stopped reading for kPipeHwm requests (late replies of
      // abandoned calls do not count): wait for it as for the reply.
      for (;;) {  // NOLINT(readability-misleading-indentation): the try's body
        if (dealer->send(zmq::buffer(name), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
          dealer->send(zmq::buffer(e), zmq::send_flags::sndmore);
          dealer->send(zmq::message_t(payload.data(), payload.size()), zmq::send_flags::none);
          sent = true;
          break;
        }
        auto now = Clock::now();
        if (now >= deadline) break;
        if (absl::Status why = gone(to); !why.ok()) {
          fail(*lane, why, done);
          told = true;
          break;
        }
        zmq::pollitem_t item{dealer->handle(), 0, ZMQ_POLLOUT, 0};
        zmq::poll(
            &item, 1,
            std::min(kDirectSlice, duration_cast<milliseconds>(deadline - now) + milliseconds(1)));
      }
      if (sent) {
        outcome = await(*lane, *dealer, to, name, reply_type_id, env.correlation, deadline, done);
      } else {
        outcome = told ? Wait::kFailed : Wait::kExpired;
      }
    } catch (const zmq::error_t& e) {
      // The context closing under a stop (ETERM).
      lane->dealers.erase(to.id);
      done.finish(stopped_.load()
                      ? absl::CancelledError("bus.net: the node stopped")
                      : absl::UnavailableError(absl::StrCat("bus.net: call to node '", to.name,
                                                            "' failed: ", e.what())),
                  {});
      outcome = Wait::kFailed;
    }
  std::lock_guard lock(mu_);
  auto& tally = lane->tally;
  counters_.late_replies += tally.late;
  counters_.malformed_frames += tally.malformed;
  counters_.calls_peer_gone += tally.peer_gone;
  if (sent) {
    ++counters_.request_frames;
    ++counters_.direct_calls;
    // A call that ends after its node was given up on counts in the "gone" row, as peer_gone()
    // folded that node's rows: the table stays bounded as nodes come and go.
    ChannelTraffic& t =
        row(traffic_, std::string(name), gone_since_picked(to) != nullptr ? 0 : to.id);
    ++t.sent;
    t.received += tally.received;
    t.rejected += tally.rejected;
  }
  tally = {};
  if (!stopped_.load(std::memory_order_relaxed)) idle_.push_back(std::move(lane));
  // else: its sockets close here, on the thread that used them last
  return outcome != Wait::kExpired;
}

DirectLanes::Wait DirectLanes::await(Lane& lane, zmq::socket_t& dealer, const DirectServer& to,
                                     std::string_view name, uint64_t reply_type_id,
                                     uint64_t correlation, Clock::time_point deadline,
                                     PendingCall& done) {
  for (;;) {
    while (recv(dealer, lane.parts)) {
      if (lane.parts.size() != 3) {
        ++lane.tally.malformed;
        continue;
      }
      if (on_reply(lane, lane.parts[1].data(), lane.parts[1].size(), lane.parts[2].data(),
                   lane.parts[2].size(), to, name, reply_type_id, correlation, done)) {
        return Wait::kAnswered;
      }
    }
    auto now = Clock::now();
    if (now >= deadline) return Wait::kExpired;
    if (absl::Status why = gone(to); !why.ok()) {
      fail(lane, why, done);
      return Wait::kFailed;
    }
    zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
    // Rounded up: a wait that ends a little before the deadline would only poll again.
    auto wait = std::min<milliseconds>(
        kDirectSlice, duration_cast<milliseconds>(deadline - now) + milliseconds(1));
    zmq::poll(&item, 1, wait);
  }
}

bool DirectLanes::on_reply(Lane& lane, const void* envelope, std::size_t envelope_size,
                           const void* payload, std::size_t payload_size, const DirectServer& from,
                           std::string_view name, uint64_t reply_type_id, uint64_t correlation,
                           PendingCall& done) {
  auto malformed = [&](const absl::Status& /*why*/) {
    ++lane.tally.malformed;
    return false;
  };
  absl::StatusOr<EnvelopeFields> env = decode_envelope(envelope, envelope_size);
  if (!env.ok()) return malformed(env.status());
  if (env->kind != wire::Envelope::Kind::REPLY) {
    return malformed(absl::InvalidArgumentError("not a reply"));
  }
  // One reply, or a batch (a late reply to an abandoned call can share a frame with ours).
  if (env->items.empty()) env->items.push_back({env->correlation, 0, env->code, env->detail});
  uint32_t with_payload = 0;
  std::size_t at = 0;
  const BatchItem* ours = nullptr;
  for (const BatchItem& item : env->items) {
    if (item.correlation == correlation && ours == nullptr) {
      ours = &item;
      at = with_payload;
    }
    with_payload += item.code == 0 ? 1 : 0;
  }
  lane.tally.late += env->items.size() - (ours != nullptr ? 1 : 0);
  if (ours == nullptr) return false;
  if (ours->code != 0) {
    ++lane.tally.received;
    done.finish(status_from(ours->code, ours->detail), {});
    return true;
  }
  absl::Status bad = lane.payloads.parse(payload, payload_size, with_payload, limits_);
  if (bad.ok() && env->type_id != reply_type_id) {
    bad = absl::InvalidArgumentError(absl::StrCat("reply type id ", absl::Hex(env->type_id),
                                                  " is not the endpoint's (",
                                                  absl::Hex(reply_type_id), ")"));
  }
  ++(bad.ok() ? lane.tally.received : lane.tally.rejected);
  if (!bad.ok()) {
    done.finish(absl::InternalError(absl::StrCat("bus.net: bad reply from node ", from.id, " on '",
                                                 sv(name), "': ", bad.message())),
                {});
    return true;
  }
  done.finish(absl::OkStatus(), lane.payloads.items()[at]);
  return true;
}

// ---- over a shared-memory link ------------------------------------------------------------

ShmLink* DirectLanes::link_to(Lane& lane, const DirectServer& to, Clock::time_point deadline) {
  if (auto it = lane.links.find(to.id); it != lane.links.end()) return it->second.get();
  auto give_up = [&] {
    lane.unlinkable.insert(to.id);
    return nullptr;
  };
  absl::StatusOr<int> sock = ShmLink::connect_to(to.id);
  if (!sock.ok()) return give_up();
  auto link = ShmLink::make(*sock, node_id_, ShmLink::Role::kLane, shm_);
  if (!link.ok() || !(*link)->send_hello(ShmLink::Verdict::kWelcome, "", -1).ok()) return give_up();
  // The server's bridge answers within a pass of its loop.
  auto until = std::min(deadline, Clock::now() + std::chrono::seconds(1));
  for (;;) {
    absl::StatusOr<ShmLink::Hello> hello = (*link)->receive_hello();
    if (hello.ok()) {
      const bool ok = hello->verdict == ShmLink::Verdict::kWelcome && hello->node == to.id &&
                      hello->uid == ::geteuid() && (*link)->attach(*hello).ok();
      if (!ok) {
        if (hello->segment_fd >= 0) ::close(hello->segment_fd);
        if (hello->wake_fd >= 0) ::close(hello->wake_fd);
        return give_up();
      }
      break;
    }
    if (!absl::IsUnavailable(hello.status()) || Clock::now() >= until) return give_up();
    pollfd p{(*link)->socket(), POLLIN, 0};
    ::poll(&p, 1, 10);
  }
  return (lane.links[to.id] = std::move(*link)).get();
}

std::optional<DirectLanes::Wait> DirectLanes::call_linked(Lane& lane, const DirectServer& to,
                                                          std::string_view name, uint64_t type_id,
                                                          uint64_t reply_type_id,
                                                          const OutPayload& payload,
                                                          Clock::time_point deadline,
                                                          PendingCall& done, bool& sent) {
  ShmLink* link = link_to(lane, to, deadline);
  if (link == nullptr) return std::nullopt;  // ZeroMQ then
  EnvelopeFields env;
  env.kind = wire::Envelope::Kind::REQUEST;
  env.type_id = type_id;
  env.sender = node_id_;
  env.count = 1;
  env.correlation = ++lane.last_correlation;
  env.principal = bus::detail::current_principal();  // this thread's: it made the call
  auto left = deadline - Clock::now();
  env.timeout_us = left > Clock::duration::zero()
                       ? static_cast<uint64_t>(duration_cast<microseconds>(left).count())
                       : 0;
  const std::string e = encode_envelope(env);
  auto broken = [&](const char* why) {
    lane.links.erase(to.id);
    fail(lane,
         absl::AbortedError(absl::StrCat("bus.net: peer gone: node '", to.name, "' (", why, ")")),
         done);
    return Wait::kFailed;
  };
  // Room in the ring: there is unless the server stopped reading; wait for it as for the reply.
  for (;;) {
    ShmLink::Sent s = link->send(name, e, payload.view(), payload.large, shm_.heap_limit / 4);
    if (s == ShmLink::Sent::kYes) break;
    if (s == ShmLink::Sent::kBroken) return broken("its link broke");
    if (s == ShmLink::Sent::kNoHeap) {
      done.finish(
          absl::ResourceExhaustedError(
              "bus.net: no room in the shared-memory heap for the request (shm_heap_limit)"),
          {});
      return Wait::kFailed;
    }
    if (Clock::now() >= deadline) return Wait::kExpired;
    if (absl::Status why = gone(to); !why.ok()) {
      fail(lane, why, done);
      return Wait::kFailed;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  sent = true;
  link->wake();
  const uint64_t correlation = env.correlation;
  Clock::time_point spin_until = Clock::now() + shm_.spin;
  for (;;) {
    bool answered = false;
    absl::Status st = link->read(kReadBudget, [&](const shm::ParsedFrame& f) {
      if (answered || (f.type != shm::FrameType::kData && f.type != shm::FrameType::kBlock)) return;
      const char* payload_at = f.payload;
      if (f.type == shm::FrameType::kBlock) {
        payload_at = link->block(f.block, f.payload_bytes);
        if (payload_at == nullptr) return;  // counted below as a broken link
      }
      if (f.type == shm::FrameType::kBlock) {
        BlockHold hold(*link, f.block, payload_at, f.payload_bytes, nullptr);
        HoldScope scope(&hold);  // a large reply is read in place
        answered = on_reply(lane, f.envelope, f.envelope_bytes, payload_at, f.payload_bytes, to,
                            name, reply_type_id, correlation, done);
        return;
      }
      answered = on_reply(lane, f.envelope, f.envelope_bytes, payload_at, f.payload_bytes, to, name,
                          reply_type_id, correlation, done);
    });
    if (answered) return Wait::kAnswered;
    if (!st.ok()) return broken("it wrote what does not read as frames");
    auto now = Clock::now();
    if (now >= deadline) return Wait::kExpired;
    if (absl::Status why = gone(to); !why.ok()) {
      fail(lane, why, done);
      return Wait::kFailed;
    }
    if (now < spin_until) continue;  // the reply is a cache-line transfer away
    // Asleep on our futex word until the server's bridge writes (and wakes it), a slice at most:
    // its goodbye and its process's end come on the socket.
    bool bye = false;
    if (link->on_socket(bye) == ShmLink::SocketState::kClosed) return broken("its link closed");
    if (link->sleep_on(1)) {
      auto slice = std::min<Clock::duration>(kDirectSlice, deadline - now);
      timespec ts{
          static_cast<time_t>(duration_cast<std::chrono::seconds>(slice).count()),
          static_cast<long>((slice % std::chrono::seconds(1)) / std::chrono::nanoseconds(1))};
      ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(&link->sleeping_word()), FUTEX_WAIT, 1, &ts,
                nullptr, 0);
      link->awake();
    }
  }
}

}  // namespace bus::net::detail
