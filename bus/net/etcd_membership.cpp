#include "etcd_membership.hpp"

#include <absl/strings/str_cat.h>
#include <capnp/message.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http.hpp>
#include <cstdio>
#include <limits>

#include "bridge.hpp"
#include "bus/schemas/membership.capnp.h"

namespace bus::net::detail {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
namespace ms = bus::schemas::membership;
using asio::awaitable;
using asio::use_awaitable;
using namespace std::chrono_literals;

// Between attempts while etcd cannot be reached: doubling up to the cap.
constexpr auto kFirstRetry = 100ms;
constexpr auto kMaxRetry = 2s;
// What stop() waits for the lease's revocation.
constexpr auto kRevokeTimeout = 500ms;
// The shortest lease asked for (etcd's own minimum is 2 s). The lease says whom to listen to,
// not who is alive (heartbeats do). Shorter leases ran out under many nodes starting together on
// a small machine, etcd among them, and the re-registrations slowed the whole mesh's joining
// (docs/benchmarks.md, "The figures behind the code").
constexpr int64_t kMinLeaseSeconds = 5;

/// The key just past every key that starts with `prefix` (etcd's range_end for a prefix).
std::string prefix_end(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // every key
}

kj::ArrayPtr<const kj::byte> bytes(const std::string& s) {
  return kj::arrayPtr(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}
std::string text(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

class LeaseLost : public EtcdError {
 public:
  LeaseLost() : EtcdError("the lease ran out") {}
};

}  // namespace

EtcdMembership::EtcdMembership(asio::io_context& io, Bridge& bridge, const NodeOptions& options,
                               std::string publish, MembershipCounters& counters)
    : bridge_(bridge),
      opt_(options),
      publish_(std::move(publish)),
      counters_(counters),
      client_(options.etcd()),
      tick_(io),
      retry_(kFirstRetry) {
  const auto dead =
      std::chrono::duration_cast<std::chrono::seconds>(opt_.dead_after_time() + 999ms);
  ttl_seconds_ = std::max<int64_t>(kMinLeaseSeconds, dead.count());
}

void EtcdMembership::start() { asio::co_spawn(tick_.get_executor(), loop(), asio::detached); }

void EtcdMembership::channels_changed() {
  ++changes_;
  asio::post(tick_.get_executor(), [this] {
    if (opt_.etcd_register()) tick_.cancel();  // write it now
  });
}

void EtcdMembership::stop() {
  stopping_ = true;
  tick_.cancel();
  if (watch_) {
    boost::system::error_code ignored;
    watch_->socket().close(ignored);
  }
}

void EtcdMembership::log(const std::string& what) {
  std::fprintf(stderr, "bus.net[%s]: %s\n", opt_.name().c_str(), what.c_str());
}

// ---- registration ----------------------------------------------------------------------------

std::string EtcdMembership::member_json() {
  MemberRecord r = bridge_.query([this] { return bridge_.member_record(); });
  self_.gives.clear();
  self_.gives.insert(r.exports.begin(), r.exports.end());
  self_.gives.insert(r.serves.begin(), r.serves.end());
  self_.takes = absl::flat_hash_set<std::string>(r.imports.begin(), r.imports.end());
  capnp::MallocMessageBuilder mb;
  auto m = mb.initRoot<ms::Member>();
  m.setId(absl::StrCat(absl::Hex(r.id, absl::kZeroPad16)));
  m.setName(r.name);
  m.setPublish(publish_);
  m.setRequests(r.requests);
  m.setPublicKey(r.public_key);
  auto fill = [](auto list, const std::vector<std::string>& from) {
    for (unsigned i = 0; i < from.size(); ++i) list.set(i, from[i]);
  };
  fill(m.initExports(static_cast<unsigned>(r.exports.size())), r.exports);
  fill(m.initServes(static_cast<unsigned>(r.serves.size())), r.serves);
  fill(m.initImports(static_cast<unsigned>(r.imports.size())), r.imports);
  return client_.encode<ms::Member>(m.asReader());
}

std::string EtcdMembership::own_key() const {
  return absl::StrCat(opt_.etcd_prefix(), absl::Hex(bridge_.id(), absl::kZeroPad16));
}

awaitable<void> EtcdMembership::put_member(beast::tcp_stream& s, beast::flat_buffer& buf,
                                           const EtcdUrl& u) {
  const uint64_t seen = changes_.load();
  capnp::MallocMessageBuilder mb;
  auto put = mb.initRoot<ms::PutRequest>();
  const std::string key = own_key(), value = member_json();
  put.setKey(bytes(key));
  put.setValue(bytes(value));
  put.setLease(lease_);
  co_await client_.call(s, buf, u, "/v3/kv/put", client_.encode<ms::PutRequest>(put.asReader()));
  registered_changes_ = seen;
  if (opt_.etcd_related_only()) found_members();  // what this node shares may have changed
}

awaitable<int64_t> EtcdMembership::keep_alive(beast::tcp_stream& s, beast::flat_buffer& buf,
                                              const EtcdUrl& u) {
  capnp::MallocMessageBuilder req;
  req.initRoot<ms::LeaseId>().setId(lease_);
  std::string answer = co_await client_.call(
      s, buf, u, "/v3/lease/keepalive", client_.encode<ms::LeaseId>(req.getRoot<ms::LeaseId>()));
  capnp::MallocMessageBuilder mb;
  co_return client_.decode<ms::LeaseKeepAliveResponse>(answer, mb).getResult().getTtl();
}

// ---- what etcd says, to the bridge -----------------------------------------------------------

bool EtcdMembership::related(const Registered& m) const {
  auto meets = [](const absl::flat_hash_set<std::string>& a,
                  const absl::flat_hash_set<std::string>& b) {
    for (const auto& x : a) {
      if (b.contains(x)) return true;
    }
    return false;
  };
  return meets(m.gives, self_.takes) || meets(m.takes, self_.gives);
}

void EtcdMembership::found_members() {
  const bool all = !opt_.etcd_related_only() || !opt_.etcd_register();
  std::vector<Peer> peers;
  peers.reserve(members_.size());
  for (const auto& [key, m] : members_) {
    if (all || related(m)) peers.push_back(m.peer);
  }
  bridge_.post([b = &bridge_, peers = std::move(peers)] { b->found(kEtcdSource, peers); });
}

bool EtcdMembership::member_peer(const std::string& key, const std::string& value,
                                 Registered& out) {
  if (key == own_key()) return false;
  capnp::MallocMessageBuilder mb;
  try {
    auto m = client_.decode<ms::Member>(value, mb);
    if (m.getPublish().size() == 0) throw EtcdError("no publish address");
    out.peer = Peer{m.getPublish().cStr(), m.getPublicKey().cStr()};
    for (auto c : m.getExports()) out.gives.insert(c.cStr());
    for (auto c : m.getServes()) out.gives.insert(c.cStr());
    for (auto c : m.getImports()) out.takes.insert(c.cStr());
    return true;
  } catch (const std::exception& e) {
    counters_.etcd_errors.fetch_add(1, std::memory_order_relaxed);
    log(absl::StrCat("etcd key ", key, " is not a node's registration (", e.what(), "): ignored"));
    return false;
  }
}

awaitable<void> EtcdMembership::watch_loop(std::shared_ptr<beast::tcp_stream> s, EtcdUrl u,
                                           int64_t from) {
  capnp::MallocMessageBuilder mb;
  auto w = mb.initRoot<ms::WatchRequest>().initCreateRequest();
  const std::string begin = opt_.etcd_prefix(), end = prefix_end(opt_.etcd_prefix());
  w.setKey(bytes(begin));
  w.setRangeEnd(bytes(end));
  w.setStartRevision(from);
  auto req = client_.request(
      u, "/v3/watch", client_.encode<ms::WatchRequest>(mb.getRoot<ms::WatchRequest>().asReader()));
  s->expires_after(kEtcdCallTimeout);
  co_await http::async_write(*s, req, use_awaitable);
  beast::flat_buffer buf;
  http::response_parser<http::string_body> parser;
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  co_await http::async_read_header(*s, buf, parser, use_awaitable);
  if (parser.get().result() != http::status::ok) {
    throw EtcdError(absl::StrCat("etcd /v3/watch: HTTP ", parser.get().result_int()));
  }
  s->expires_never();  // quiet for as long as nothing changes; the keep-alives notice a loss
  for (;;) {
    if (parser.is_done()) throw EtcdError("etcd ended the watch stream");
    co_await http::async_read_some(*s, buf, parser, use_awaitable);
    // grpc-gateway writes each WatchResponse as one JSON object and a newline.
    std::string& body = parser.get().body();
    std::size_t start = 0;
    bool changed = false;
    for (std::size_t nl; (nl = body.find('\n', start)) != std::string::npos; start = nl + 1) {
      changed |= on_watch_line(body.substr(start, nl - start));
    }
    body.erase(0, start);
    if (changed) found_members();
  }
}

bool EtcdMembership::on_watch_line(const std::string& line) {
  capnp::MallocMessageBuilder mb;
  auto item = client_.decode<ms::WatchStreamItem>(line, mb);
  if (item.hasError())
    throw EtcdError(absl::StrCat("etcd watch: ", item.getError().getMessage().cStr()));
  auto r = item.getResult();
  if (r.getCanceled()) {
    throw EtcdError(absl::StrCat("etcd canceled the watch (compacted to ", r.getCompactRevision(),
                                 "): reading the members again"));
  }
  bool changed = false;
  for (auto ev : r.getEvents()) {
    const std::string key = text(ev.getKv().getKey());
    if (ev.getType() == "DELETE") {
      changed |= members_.erase(key) > 0;
    } else if (Registered m; member_peer(key, text(ev.getKv().getValue()), m)) {
      auto& have = members_[key];
      changed |= !(have == m);
      have = std::move(m);
    }
  }
  return changed;
}

// ---- the sessions ----------------------------------------------------------------------------

awaitable<void> EtcdMembership::session() {
  const EtcdUrl u = client_.url();
  auto ex = co_await asio::this_coro::executor;
  beast::tcp_stream s(ex);
  beast::flat_buffer buf;
  co_await client_.connect(s, u);
  if (opt_.etcd_register()) {
    // After an outage the old lease may still hold (etcd restarted with its data): keep it.
    if (lease_ != 0 && co_await keep_alive(s, buf, u) <= 0) lease_ = 0;
    if (lease_ == 0) {
      capnp::MallocMessageBuilder mb;
      mb.initRoot<ms::LeaseGrantRequest>().setTtl(ttl_seconds_);
      std::string answer = co_await client_.call(
          s, buf, u, "/v3/lease/grant",
          client_.encode<ms::LeaseGrantRequest>(mb.getRoot<ms::LeaseGrantRequest>().asReader()));
      capnp::MallocMessageBuilder got;
      auto g = client_.decode<ms::LeaseGrantResponse>(answer, got);
      if (g.getError().size() > 0 || g.getId() == 0) {
        throw EtcdError(absl::StrCat("etcd refused a lease: ", g.getError().cStr()));
      }
      lease_ = g.getId();
      ttl_seconds_ = std::max(ttl_seconds_, g.getTtl());
    }
    co_await put_member(s, buf, u);
    counters_.etcd_registrations.fetch_add(1, std::memory_order_relaxed);
  }
  // Everyone registered now, then every change after it.
  capnp::MallocMessageBuilder rq;
  auto range = rq.initRoot<ms::RangeRequest>();
  const std::string begin = opt_.etcd_prefix(), end = prefix_end(opt_.etcd_prefix());
  range.setKey(bytes(begin));
  range.setRangeEnd(bytes(end));
  std::string answer = co_await client_.call(s, buf, u, "/v3/kv/range",
                                             client_.encode<ms::RangeRequest>(range.asReader()));
  capnp::MallocMessageBuilder got;
  auto all = client_.decode<ms::RangeResponse>(answer, got);
  members_.clear();
  for (auto kv : all.getKvs()) {
    const std::string key = text(kv.getKey());
    if (Registered m; member_peer(key, text(kv.getValue()), m)) members_[key] = std::move(m);
  }
  found_members();
  if (!reachable_) log(absl::StrCat("etcd at ", u.host, ":", u.port, " reached again"));
  reachable_ = true;
  retry_ = kFirstRetry;

  watch_ = std::make_shared<beast::tcp_stream>(ex);
  watch_failed_ = nullptr;
  co_await client_.connect(*watch_, u);
  asio::co_spawn(ex, watch_loop(watch_, u, all.getHeader().getRevision() + 1),
                 [this, w = watch_](std::exception_ptr e) {
                   if (w != watch_ || stopping_) return;  // an old session's stream
                   watch_failed_ = e ? e : std::make_exception_ptr(EtcdError("watch ended"));
                   tick_.cancel();
                 });

  // A keep-alive a third of the TTL apart: two may be lost before the lease runs out.
  const auto every = std::chrono::milliseconds(ttl_seconds_ * 1000 / 3);
  for (;;) {
    tick_.expires_after(every);
    boost::system::error_code ec;
    co_await tick_.async_wait(asio::redirect_error(use_awaitable, ec));
    if (stopping_) co_return;
    if (watch_failed_) std::rethrow_exception(watch_failed_);
    if (!opt_.etcd_register()) continue;
    if (co_await keep_alive(s, buf, u) <= 0) {
      lease_ = 0;  // it ran out (etcd was away too long): register anew at once
      throw LeaseLost();
    }
    if (changes_.load() != registered_changes_) co_await put_member(s, buf, u);
  }
}

awaitable<void> EtcdMembership::loop() {
  while (!stopping_) {
    bool again_now = false;
    try {
      co_await session();
    } catch (const std::exception& e) {
      if (stopping_) break;
      counters_.etcd_errors.fetch_add(1, std::memory_order_relaxed);
      // A lease that ran out while etcd answers: register anew at once.
      again_now = lease_ == 0 && reachable_ && dynamic_cast<const LeaseLost*>(&e) != nullptr;
      if (reachable_ && !again_now) {
        log(absl::StrCat("etcd at ", client_.url().host, ":", client_.url().port, ": ", e.what(),
                         "; keeping the ", members_.size(), " peers it gave, trying again"));
        reachable_ = false;
      }
    }
    if (watch_) {
      boost::system::error_code ignored;
      watch_->socket().close(ignored);
      watch_.reset();
    }
    if (stopping_) break;
    client_.next();
    if (again_now) continue;
    tick_.expires_after(retry_);
    boost::system::error_code ec;
    co_await tick_.async_wait(asio::redirect_error(use_awaitable, ec));
    retry_ = std::min<std::chrono::milliseconds>(retry_ * 2, kMaxRetry);
  }
}

awaitable<void> EtcdMembership::revoke() {
  if (lease_ == 0) co_return;
  const EtcdUrl u = client_.url();
  beast::tcp_stream s(co_await asio::this_coro::executor);
  beast::flat_buffer buf;
  co_await client_.connect(s, u);
  capnp::MallocMessageBuilder mb;
  mb.initRoot<ms::LeaseId>().setId(lease_);
  s.expires_after(kRevokeTimeout);
  auto req = client_.request(u, "/v3/lease/revoke",
                             client_.encode<ms::LeaseId>(mb.getRoot<ms::LeaseId>()));
  co_await http::async_write(s, req, use_awaitable);
  http::response<http::string_body> res;
  co_await http::async_read(s, buf, res, use_awaitable);
  lease_ = 0;
}

}  // namespace bus::net::detail
