// Membership: DNS names re-resolved, and etcd v3 through its JSON gateway (docs/net.md says why
// the gateway and not gRPC). Everything here runs on the membership thread, in coroutines on one
// io_context; the bridge is reached only through Bridge::post() and Bridge::query().
#include "membership.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <arpa/inet.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <ifaddrs.h>
#include <kj/exception.h>
#include <netinet/in.h>

#include <atomic>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <thread>

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
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

// One etcd call (connect, request, answer): etcd answers in milliseconds; past this it is taken
// for unreachable and the next member is tried.
constexpr auto kCallTimeout = 2s;
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

struct Url {
  std::string host, port;
};

Url parse_url(const std::string& endpoint) {
  absl::string_view s = endpoint;
  if (absl::StartsWith(s, "http://")) s.remove_prefix(7);
  if (absl::StartsWith(s, "https://")) {
    throw std::invalid_argument(absl::StrCat("bus.net: etcd endpoint ", endpoint,
                                             ": https is not supported, give http://host:port"));
  }
  if (!s.empty() && s.back() == '/') s.remove_suffix(1);
  auto colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == s.size()) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: etcd endpoint ", endpoint, ": expected http://host:port"));
  }
  return Url{std::string(s.substr(0, colon)), std::string(s.substr(colon + 1))};
}

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

/// The IPv4 and IPv6 addresses of this host's interfaces, as text.
absl::flat_hash_set<std::string> local_addresses() {
  absl::flat_hash_set<std::string> out;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return out;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ifa_addr->sa_family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    } else if (a->ifa_addr->sa_family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, buf,
                  sizeof buf);
    } else {
      continue;
    }
    out.insert(buf);
  }
  ::freeifaddrs(list);
  return out;
}

/// The first non-loopback IPv4 address of this host, or 127.0.0.1.
std::string primary_address() {
  std::string best = "127.0.0.1";
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return best;
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, buf, sizeof buf);
    if (!absl::StartsWith(buf, "127.")) {
      best = buf;
      break;
    }
  }
  ::freeifaddrs(list);
  return best;
}

/// `tcp://host:port` -> host and port (false for other transports).
bool split_tcp(const std::string& endpoint, std::string& host, std::string& port) {
  if (!absl::StartsWith(endpoint, "tcp://")) return false;
  absl::string_view rest = absl::string_view(endpoint).substr(6);
  auto colon = rest.rfind(':');
  if (colon == absl::string_view::npos) return false;
  host = std::string(rest.substr(0, colon));
  port = std::string(rest.substr(colon + 1));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return true;
}

bool wildcard(const std::string& host) {
  return host == "*" || host == "0.0.0.0" || host == "::" || host.empty();
}

std::string tcp_endpoint(const tcp::endpoint& e) {
  const std::string a = e.address().to_string();
  return e.address().is_v6() ? absl::StrCat("tcp://[", a, "]:", e.port())
                             : absl::StrCat("tcp://", a, ":", e.port());
}

class EtcdError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class LeaseLost : public EtcdError {
 public:
  LeaseLost() : EtcdError("the lease ran out") {}
};

}  // namespace

bool split_host_name(const std::string& endpoint, std::string& host, std::string& port) {
  if (!split_tcp(endpoint, host, port) || wildcard(host)) return false;
  boost::system::error_code ec;
  asio::ip::make_address(host, ec);
  return static_cast<bool>(ec);  // not an address: a name
}

struct Membership::Impl {
  // First: destroyed last, after the sockets and timers below that use it.
  asio::io_context io{1};
  Bridge& bridge;
  const NodeOptions opt;
  std::string publish;  // what etcd registration says (advertised)
  std::string bound_host, bound_port;
  absl::flat_hash_set<std::string> local;  // this host's addresses (is a resolved peer us?)
  std::thread thread;

  MembershipCounters& counters;
  std::atomic<uint64_t> changes{0};  // of the node's channels (channels_changed())

  // ---- membership thread ----
  bool stopping = false;
  capnp::JsonCodec codec;
  std::vector<Url> urls;
  std::size_t url_at = 0;
  int64_t lease = 0;
  int64_t ttl_seconds = kMinLeaseSeconds;
  uint64_t registered_changes = 0;
  asio::steady_timer tick{io};  // the session's keep-alive period, or the wait between attempts
  std::shared_ptr<beast::tcp_stream> watch;
  std::exception_ptr watch_failed;
  bool reachable = true;  // for the log: say once when etcd goes and when it comes back
  std::chrono::milliseconds retry{kFirstRetry};  // the next wait between attempts
  /// A registered node, as its record says.
  struct Registered {
    Peer peer;
    absl::flat_hash_set<std::string> gives, takes;  // exports and serves; imports
    bool operator==(const Registered& o) const {
      return peer.endpoint == o.peer.endpoint && peer.public_key == o.peer.public_key &&
             gives == o.gives && takes == o.takes;
    }
  };
  absl::flat_hash_map<std::string, Registered> members;  // by etcd key
  Registered self;  // this node's record as last written (etcd_related_only())
  std::vector<std::unique_ptr<asio::steady_timer>> dns_timers;

  Impl(Bridge& b, const NodeOptions& o, const std::string& publish_endpoint, MembershipCounters& c)
      : bridge(b), opt(o), local(local_addresses()), counters(c) {
    codec.handleByAnnotation<ms::Member>();
    codec.handleByAnnotation<ms::PutRequest>();
    codec.handleByAnnotation<ms::RangeRequest>();
    codec.handleByAnnotation<ms::RangeResponse>();
    codec.handleByAnnotation<ms::WatchRequest>();
    codec.handleByAnnotation<ms::WatchStreamItem>();
    codec.handleByAnnotation<ms::LeaseGrantRequest>();
    codec.handleByAnnotation<ms::LeaseGrantResponse>();
    codec.handleByAnnotation<ms::LeaseId>();
    codec.handleByAnnotation<ms::LeaseKeepAliveResponse>();
    codec.handleByAnnotation<ms::Error>();
    for (const auto& e : opt.etcd()) urls.push_back(parse_url(e));
    const auto dead =
        std::chrono::duration_cast<std::chrono::seconds>(opt.dead_after_time() + 999ms);
    ttl_seconds = std::max<int64_t>(kMinLeaseSeconds, dead.count());
    publish = advertised_publish(opt, publish_endpoint);
    split_tcp(publish_endpoint, bound_host, bound_port);
  }

  void log(const std::string& what) {
    std::fprintf(stderr, "bus.net[%s]: %s\n", opt.name().c_str(), what.c_str());
  }

  /// A resolved address that is this node's own publisher.
  bool is_self(const tcp::endpoint& e) const {
    if (std::to_string(e.port()) != bound_port) return false;
    const std::string a = e.address().to_string();
    return a == bound_host || (wildcard(bound_host) && local.contains(a));
  }

  // ---- JSON through Cap'n Proto's codec ----
  template <class T>
  std::string encode(typename T::Reader r) {
    kj::String s = codec.encode(r);
    return std::string(s.cStr(), s.size());
  }
  template <class T>
  typename T::Reader decode(const std::string& json, capnp::MallocMessageBuilder& mb) {
    auto root = mb.initRoot<T>();
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&] { codec.decode(kj::StringPtr(json.c_str(), json.size()), root); })) {
      throw EtcdError(absl::StrCat("not the JSON expected (", e->getDescription().cStr(), ")"));
    }
    return root.asReader();
  }

  // ---- HTTP to etcd's gateway ----
  awaitable<void> connect(beast::tcp_stream& s, const Url& u) {
    tcp::resolver resolver(co_await asio::this_coro::executor);
    auto found = co_await resolver.async_resolve(u.host, u.port, use_awaitable);
    s.expires_after(kCallTimeout);
    co_await s.async_connect(found, use_awaitable);
  }

  http::request<http::string_body> request(const Url& u, const char* target, std::string body) {
    http::request<http::string_body> req{http::verb::post, target, 11};
    req.set(http::field::host, absl::StrCat(u.host, ":", u.port));
    req.set(http::field::content_type, "application/json");
    req.keep_alive(true);
    req.body() = std::move(body);
    req.prepare_payload();
    return req;
  }

  /// POST `body` to `target`, the answer's body (EtcdError when etcd refuses).
  awaitable<std::string> call(beast::tcp_stream& s, beast::flat_buffer& buf, const Url& u,
                              const char* target, std::string body) {
    auto req = request(u, target, std::move(body));
    s.expires_after(kCallTimeout);
    co_await http::async_write(s, req, use_awaitable);
    http::response<http::string_body> res;
    co_await http::async_read(s, buf, res, use_awaitable);
    if (res.result() != http::status::ok) {
      std::string why = res.body();
      if (absl::StartsWith(why, "{")) {
        capnp::MallocMessageBuilder mb;
        why = decode<ms::Error>(why, mb).getMessage().cStr();
      }
      throw EtcdError(absl::StrCat("etcd ", target, ": HTTP ", res.result_int(), " ", why));
    }
    co_return std::move(res.body());
  }

  // ---- registration ----
  std::string member_json() {
    MemberRecord r = bridge.query([this] { return bridge.member_record(); });
    self.gives.clear();
    self.gives.insert(r.exports.begin(), r.exports.end());
    self.gives.insert(r.serves.begin(), r.serves.end());
    self.takes = absl::flat_hash_set<std::string>(r.imports.begin(), r.imports.end());
    capnp::MallocMessageBuilder mb;
    auto m = mb.initRoot<ms::Member>();
    m.setId(absl::StrCat(absl::Hex(r.id, absl::kZeroPad16)));
    m.setName(r.name);
    m.setPublish(publish);
    m.setRequests(r.requests);
    m.setPublicKey(r.public_key);
    auto fill = [](auto list, const std::vector<std::string>& from) {
      for (unsigned i = 0; i < from.size(); ++i) list.set(i, from[i]);
    };
    fill(m.initExports(static_cast<unsigned>(r.exports.size())), r.exports);
    fill(m.initServes(static_cast<unsigned>(r.serves.size())), r.serves);
    fill(m.initImports(static_cast<unsigned>(r.imports.size())), r.imports);
    return encode<ms::Member>(m.asReader());
  }
  std::string own_key() const {
    return absl::StrCat(opt.etcd_prefix(), absl::Hex(bridge.id(), absl::kZeroPad16));
  }

  awaitable<void> put_member(beast::tcp_stream& s, beast::flat_buffer& buf, const Url& u) {
    const uint64_t seen = changes.load();
    capnp::MallocMessageBuilder mb;
    auto put = mb.initRoot<ms::PutRequest>();
    const std::string key = own_key(), value = member_json();
    put.setKey(bytes(key));
    put.setValue(bytes(value));
    put.setLease(lease);
    co_await call(s, buf, u, "/v3/kv/put", encode<ms::PutRequest>(put.asReader()));
    registered_changes = seen;
    if (opt.etcd_related_only()) found_members();  // what this node shares may have changed
  }

  /// The lease's TTL after a keep-alive; 0 when it is gone (expired, or etcd lost it).
  awaitable<int64_t> keep_alive(beast::tcp_stream& s, beast::flat_buffer& buf, const Url& u) {
    capnp::MallocMessageBuilder req;
    req.initRoot<ms::LeaseId>().setId(lease);
    std::string answer = co_await call(s, buf, u, "/v3/lease/keepalive",
                                       encode<ms::LeaseId>(req.getRoot<ms::LeaseId>()));
    capnp::MallocMessageBuilder mb;
    co_return decode<ms::LeaseKeepAliveResponse>(answer, mb).getResult().getTtl();
  }

  // ---- what etcd says, to the bridge ----
  /// `m` and this node share a channel: one exports or serves what the other imports.
  bool related(const Registered& m) const {
    auto meets = [](const absl::flat_hash_set<std::string>& a,
                    const absl::flat_hash_set<std::string>& b) {
      for (const auto& x : a) {
        if (b.contains(x)) return true;
      }
      return false;
    };
    return meets(m.gives, self.takes) || meets(m.takes, self.gives);
  }

  void found_members() {
    const bool all = !opt.etcd_related_only() || !opt.etcd_register();
    std::vector<Peer> peers;
    peers.reserve(members.size());
    for (const auto& [key, m] : members) {
      if (all || related(m)) peers.push_back(m.peer);
    }
    bridge.post([b = &bridge, peers = std::move(peers)] { b->found(kEtcdSource, peers); });
  }

  /// A registration's value -> the node (false for our own, or one unreadable).
  bool member_peer(const std::string& key, const std::string& value, Registered& out) {
    if (key == own_key()) return false;
    capnp::MallocMessageBuilder mb;
    try {
      auto m = decode<ms::Member>(value, mb);
      if (m.getPublish().size() == 0) throw EtcdError("no publish endpoint");
      out.peer = Peer{m.getPublish().cStr(), m.getPublicKey().cStr()};
      for (auto c : m.getExports()) out.gives.insert(c.cStr());
      for (auto c : m.getServes()) out.gives.insert(c.cStr());
      for (auto c : m.getImports()) out.takes.insert(c.cStr());
      return true;
    } catch (const std::exception& e) {
      counters.etcd_errors.fetch_add(1, std::memory_order_relaxed);
      log(absl::StrCat("etcd key ", key, " is not a node's registration (", e.what(),
                       "): ignored"));
      return false;
    }
  }

  /// Reads the watch stream until it fails (or the session drops it).
  awaitable<void> watch_loop(std::shared_ptr<beast::tcp_stream> s, Url u, int64_t from) {
    capnp::MallocMessageBuilder mb;
    auto w = mb.initRoot<ms::WatchRequest>().initCreateRequest();
    const std::string begin = opt.etcd_prefix(), end = prefix_end(opt.etcd_prefix());
    w.setKey(bytes(begin));
    w.setRangeEnd(bytes(end));
    w.setStartRevision(from);
    auto req = request(u, "/v3/watch",
                       encode<ms::WatchRequest>(mb.getRoot<ms::WatchRequest>().asReader()));
    s->expires_after(kCallTimeout);
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

  /// One WatchResponse; true when the members changed.
  bool on_watch_line(const std::string& line) {
    capnp::MallocMessageBuilder mb;
    auto item = decode<ms::WatchStreamItem>(line, mb);
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
        changed |= members.erase(key) > 0;
      } else if (Registered m; member_peer(key, text(ev.getKv().getValue()), m)) {
        auto& have = members[key];
        changed |= !(have == m);
        have = std::move(m);
      }
    }
    return changed;
  }

  /// Registers (when it should), reads the members, watches for changes and keeps the lease
  /// alive, until something fails (an exception) or the node stops.
  awaitable<void> etcd_session() {
    const Url u = urls[url_at];
    auto ex = co_await asio::this_coro::executor;
    beast::tcp_stream s(ex);
    beast::flat_buffer buf;
    co_await connect(s, u);
    if (opt.etcd_register()) {
      // After an outage the old lease may still hold (etcd restarted with its data): keep it.
      if (lease != 0 && co_await keep_alive(s, buf, u) <= 0) lease = 0;
      if (lease == 0) {
        capnp::MallocMessageBuilder mb;
        mb.initRoot<ms::LeaseGrantRequest>().setTtl(ttl_seconds);
        std::string answer = co_await call(
            s, buf, u, "/v3/lease/grant",
            encode<ms::LeaseGrantRequest>(mb.getRoot<ms::LeaseGrantRequest>().asReader()));
        capnp::MallocMessageBuilder got;
        auto g = decode<ms::LeaseGrantResponse>(answer, got);
        if (g.getError().size() > 0 || g.getId() == 0) {
          throw EtcdError(absl::StrCat("etcd refused a lease: ", g.getError().cStr()));
        }
        lease = g.getId();
        ttl_seconds = std::max(ttl_seconds, g.getTtl());
      }
      co_await put_member(s, buf, u);
      counters.etcd_registrations.fetch_add(1, std::memory_order_relaxed);
    }
    // Everyone registered now, then every change after it.
    capnp::MallocMessageBuilder rq;
    auto range = rq.initRoot<ms::RangeRequest>();
    const std::string begin = opt.etcd_prefix(), end = prefix_end(opt.etcd_prefix());
    range.setKey(bytes(begin));
    range.setRangeEnd(bytes(end));
    std::string answer =
        co_await call(s, buf, u, "/v3/kv/range", encode<ms::RangeRequest>(range.asReader()));
    capnp::MallocMessageBuilder got;
    auto all = decode<ms::RangeResponse>(answer, got);
    members.clear();
    for (auto kv : all.getKvs()) {
      const std::string key = text(kv.getKey());
      if (Registered m; member_peer(key, text(kv.getValue()), m)) members[key] = std::move(m);
    }
    found_members();
    if (!reachable) log(absl::StrCat("etcd at ", u.host, ":", u.port, " reached again"));
    reachable = true;
    retry = kFirstRetry;

    watch = std::make_shared<beast::tcp_stream>(ex);
    watch_failed = nullptr;
    co_await connect(*watch, u);
    asio::co_spawn(ex, watch_loop(watch, u, all.getHeader().getRevision() + 1),
                   [this, w = watch](std::exception_ptr e) {
                     if (w != watch || stopping) return;  // an old session's stream
                     watch_failed = e ? e : std::make_exception_ptr(EtcdError("watch ended"));
                     tick.cancel();
                   });

    // A keep-alive a third of the TTL apart: two may be lost before the lease runs out.
    const auto every = std::chrono::milliseconds(ttl_seconds * 1000 / 3);
    for (;;) {
      tick.expires_after(every);
      boost::system::error_code ec;
      co_await tick.async_wait(asio::redirect_error(use_awaitable, ec));
      if (stopping) co_return;
      if (watch_failed) std::rethrow_exception(watch_failed);
      if (!opt.etcd_register()) continue;
      if (co_await keep_alive(s, buf, u) <= 0) {
        lease = 0;  // it ran out (etcd was away too long): register anew at once
        throw LeaseLost();
      }
      if (changes.load() != registered_changes) co_await put_member(s, buf, u);
    }
  }

  awaitable<void> etcd_loop() {
    while (!stopping) {
      bool again_now = false;
      try {
        co_await etcd_session();
      } catch (const std::exception& e) {
        if (stopping) break;
        counters.etcd_errors.fetch_add(1, std::memory_order_relaxed);
        // A lease that ran out while etcd answers: register anew at once.
        again_now = lease == 0 && reachable && dynamic_cast<const LeaseLost*>(&e) != nullptr;
        if (reachable && !again_now) {
          log(absl::StrCat("etcd at ", urls[url_at].host, ":", urls[url_at].port, ": ", e.what(),
                           "; keeping the ", members.size(), " peers it gave, trying again"));
          reachable = false;
        }
      }
      if (watch) {
        boost::system::error_code ignored;
        watch->socket().close(ignored);
        watch.reset();
      }
      if (stopping) break;
      url_at = (url_at + 1) % urls.size();
      if (again_now) continue;
      tick.expires_after(retry);
      boost::system::error_code ec;
      co_await tick.async_wait(asio::redirect_error(use_awaitable, ec));
      retry = std::min<std::chrono::milliseconds>(retry * 2, kMaxRetry);
    }
  }

  awaitable<void> revoke() {
    if (lease == 0 || urls.empty()) co_return;
    const Url u = urls[url_at];
    beast::tcp_stream s(co_await asio::this_coro::executor);
    beast::flat_buffer buf;
    co_await connect(s, u);
    capnp::MallocMessageBuilder mb;
    mb.initRoot<ms::LeaseId>().setId(lease);
    s.expires_after(kRevokeTimeout);
    auto req = request(u, "/v3/lease/revoke", encode<ms::LeaseId>(mb.getRoot<ms::LeaseId>()));
    co_await http::async_write(s, req, use_awaitable);
    http::response<http::string_body> res;
    co_await http::async_read(s, buf, res, use_awaitable);
    lease = 0;
  }

  // ---- DNS ----
  awaitable<void> dns_loop(Peer peer, std::string host, std::string port) {
    const std::string source = absl::StrCat("dns:", host, ":", port);
    auto ex = co_await asio::this_coro::executor;
    tcp::resolver resolver(ex);
    auto& timer = *dns_timers.emplace_back(std::make_unique<asio::steady_timer>(ex));
    absl::flat_hash_map<std::string, std::chrono::steady_clock::time_point> seen;
    std::vector<std::string> told;  // what the bridge has, sorted
    bool failing = false;
    while (!stopping) {
      boost::system::error_code ec;
      // No AI_ADDRCONFIG (asio's default): loopback-only hosts and test names in /etc/hosts.
      auto answer = co_await resolver.async_resolve(host, port, tcp::resolver::flags(),
                                                    asio::redirect_error(use_awaitable, ec));
      const auto now = std::chrono::steady_clock::now();
      if (ec) {
        // A name that has no address now is not a failure of ours to wait out: what it had
        // ages out below like any address it stopped giving.
        counters.dns_errors.fetch_add(1, std::memory_order_relaxed);
        if (!failing) log(absl::StrCat("resolving ", host, ": ", ec.message()));
        failing = true;
      } else {
        if (failing) log(absl::StrCat("resolving ", host, " works again"));
        failing = false;
        for (const auto& entry : answer) {
          if (!is_self(entry.endpoint())) seen[tcp_endpoint(entry.endpoint())] = now;
        }
      }
      absl::erase_if(seen, [&](const auto& s) { return now - s.second > opt.dead_after_time(); });
      std::vector<std::string> have;
      for (const auto& [ep, when] : seen) have.push_back(ep);
      std::sort(have.begin(), have.end());
      if (have != told) {
        told = have;
        std::vector<Peer> peers;
        for (auto& ep : have) peers.push_back(Peer{ep, peer.public_key});
        bridge.post([b = &bridge, source, peers = std::move(peers)] { b->found(source, peers); });
      }
      timer.expires_after(opt.resolve_every());
      co_await timer.async_wait(asio::redirect_error(use_awaitable, ec));
    }
  }

  void start_dns(const Peer& p) {
    std::string host, port;
    if (!split_host_name(p.endpoint, host, port)) return;
    asio::co_spawn(io, dns_loop(p, host, port), asio::detached);
  }
};

std::string advertised_publish(const NodeOptions& opt, const std::string& bound) {
  std::string publish = opt.advertise_publish().empty() ? bound : opt.advertise_publish();
  std::string host, port;
  if (split_tcp(publish, host, port) && wildcard(host)) {
    std::string adv_host, adv_port;
    std::string to = split_tcp(opt.advertise(), adv_host, adv_port) && !wildcard(adv_host)
                         ? adv_host
                         : primary_address();
    publish =
        absl::StrCat("tcp://", to.find(':') != std::string::npos ? "[" + to + "]" : to, ":", port);
  }
  return publish;
}

Membership::Membership(Bridge& bridge, const NodeOptions& options,
                       const std::string& publish_endpoint, MembershipCounters& counters)
    : impl_(std::make_unique<Impl>(bridge, options, publish_endpoint, counters)) {
  Impl& m = *impl_;
  for (const Peer& p : options.peers()) m.start_dns(p);
  if (!m.urls.empty()) {
    asio::co_spawn(m.io, m.etcd_loop(), asio::detached);
  }
  m.thread = std::thread([&m] {
    auto guard = asio::make_work_guard(m.io);  // stays up for add_name() with nothing to do
    m.io.run();
  });
}

Membership::~Membership() { stop(); }

void Membership::add_name(const Peer& peer) {
  asio::post(impl_->io, [m = impl_.get(), peer] { m->start_dns(peer); });
}

void Membership::channels_changed() {
  ++impl_->changes;
  asio::post(impl_->io, [m = impl_.get()] {
    if (m->opt.etcd_register() && !m->urls.empty()) m->tick.cancel();  // write it now
  });
}

void Membership::stop() {
  Impl& m = *impl_;
  if (!m.thread.joinable()) return;
  asio::post(m.io, [&m] {
    m.stopping = true;
    m.tick.cancel();
    for (auto& t : m.dns_timers) t->cancel();
    if (m.watch) {
      boost::system::error_code ignored;
      m.watch->socket().close(ignored);
    }
    if (m.opt.etcd_register() && m.lease != 0) {
      asio::co_spawn(m.io, m.revoke(), [&m](std::exception_ptr) { m.io.stop(); });
    } else {
      m.io.stop();
    }
  });
  m.thread.join();
}

}  // namespace bus::net::detail
