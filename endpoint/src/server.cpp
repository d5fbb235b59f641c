// The HTTP server's lifecycle, its routes, and the built-in /health and /metrics.
#include <absl/strings/str_cat.h>
#include <bus/schemas/http.capnp.h>
#include <capnp/message.h>
#include <pthread.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/address.hpp>
#include <boost/asio/signal_set.hpp>
#include <csignal>
#include <cstdio>
#include <functional>
#include <optional>

#include "bus/net/node.hpp"
#include "io.hpp"
#include "openapi.hpp"

namespace bus::http {

std::optional<std::string_view> Request::header(std::string_view name) const {
  const auto& msg = *static_cast<const bh::request<bh::string_body>*>(native_);
  auto it = msg.find(beast::string_view(name.data(), name.size()));
  if (it == msg.end()) return std::nullopt;
  return std::string_view(it->value().data(), it->value().size());
}

Server::Server(Bus& bus, ServerOptions options)
    : bus_(bus), impl_(std::make_unique<Impl>(bus, std::move(options))) {}

Server::~Server() {
  shutdown();
  wait();
}

Clock::duration Server::default_deadline() const { return impl_->options.deadline(); }

void Server::add_route(detail::RouteSpec spec, Handler handler) {
  if (impl_->started) throw std::logic_error("bus::http: add routes before Server::start()");
  std::size_t i = impl_->router.add(spec.method, spec.path);
  impl_->labels.push_back(detail::RouteLabel{std::string(to_string(spec.method)), spec.path});
  impl_->entries.resize(i + 1);
  impl_->entries[i] = detail::Entry{std::move(spec), std::move(handler)};
}

Server& Server::handle(Method method, std::string_view path,
                       std::function<Reply(const Request&)> handler,
                       std::vector<std::string> scopes) {
  detail::RouteSpec spec;
  spec.method = method;
  spec.path = std::string(path);
  for (std::string& scope : scopes) {
    spec.access->authenticated = true;
    if (!scope.empty()) spec.access->scopes.push_back(std::move(scope));
  }
  add_route(std::move(spec), [h = std::move(handler)](const Request& req, Responder respond) {
    Reply r;
    try {
      r = h(req);
    } catch (const std::exception& e) {
      r = Reply::error(500, "internal", std::string("the handler threw: ") + e.what());
    }
    respond(std::move(r));
  });
  return *this;
}

void Server::start() {
  Impl& s = *impl_;
  if (s.started) return;
  Impl* impl = impl_.get();
  auto built_in = [](std::string path, std::function<detail::RouteDoc()> doc) {
    detail::RouteSpec spec;
    spec.method = Method::kGet;
    spec.path = std::move(path);
    spec.doc = std::move(doc);
    return spec;
  };
  add_route(built_in("/health",
                     [] {
                       detail::RouteDoc d;
                       d.summary = "Whether every executor answers and every route has a handler";
                       d.tag = "server";
                       d.media_type = "application/json";
                       d.reply = capnp::Type::from<schemas::http::Health>();
                       d.reply_statuses = {200, 503};
                       return d;
                     }),
            [impl](const Request& req, Responder respond) {
              impl->serve_health(req, std::move(respond));
            });
  add_route(built_in("/metrics",
                     [] {
                       detail::RouteDoc d;
                       d.summary = "Counters and histograms (Prometheus text format 0.0.4)";
                       d.tag = "server";
                       d.media_type = "text/plain; version=0.0.4; charset=utf-8";
                       return d;
                     }),
            [impl](const Request&, Responder respond) { respond(impl->serve_metrics()); });
  if (!s.options.openapi().path().empty()) {
    add_route(built_in(s.options.openapi().path(),
                       [] {
                         detail::RouteDoc d;
                         d.summary = "This document (OpenAPI 3.1)";
                         d.tag = "server";
                         d.media_type = "application/json";
                         return d;
                       }),
              [impl](const Request&, Responder respond) { respond(Reply::json(impl->openapi)); });
  }
  for (std::size_t i = 0; i < s.entries.size(); ++i) {
    if (s.entries[i].spec.check) s.entries[i].spec.check(s.router.routes()[i].params);
  }
  {
    // Written once: the routes are fixed from here on.
    detail::ApiSurface api;
    api.options = &s.options;
    for (std::size_t i = 0; i < s.entries.size(); ++i) {
      api.routes.push_back({&s.entries[i].spec, s.router.routes()[i].params});
    }
    if (s.websocket) api.websocket = &s.websocket->options();
    s.openapi = detail::openapi_document(api);
  }
  s.unmatched = s.labels.size();
  s.labels.push_back(detail::RouteLabel{"", "(unmatched)"});

  for (unsigned e = 0; e < bus_.executors(); ++e) {
    s.probes.push_back(std::make_unique<Endpoint<uint32_t, uint32_t>>(
        absl::StrCat("$http.health.", e), Overflow::kFail));
    s.probe_servers.push_back(bus_.serve(
        *s.probes.back(), [](uint32_t x) { return x; }, on_executor(e)));
  }

  beast::error_code ec;
  auto address = asio::ip::make_address(s.options.address(), ec);
  if (ec) {
    throw std::runtime_error("bus::http: '" + s.options.address() + "' is not an IP address");
  }
  std::optional<tcp::endpoint> plain, tls;
  if (s.options.plain()) plain.emplace(address, s.options.port());
  std::shared_ptr<asio::ssl::context> context;
  if (s.options.tls()) {
    context = detail::make_tls_context(*s.options.tls());  // throws for a file it cannot use
    tls.emplace(address, s.options.tls()->port());
  }
  if (!plain && !tls) {
    throw std::invalid_argument("bus::http: no listener: plain(false) and no tls(...)");
  }
  if (s.options.jwt()) s.jwt = std::make_unique<detail::JwtVerifier>(*s.options.jwt());
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::unique_ptr<bool>> ready;
  s.started = true;
  for (unsigned t = 0; t < s.options.io_threads(); ++t) {
    s.threads.push_back(std::make_unique<detail::IoThread>(s, t));
    s.threads.back()->tls_context = context;
    ready.push_back(std::make_unique<bool>(false));
    {
      std::lock_guard lock(s.mu);
      ++s.running;
    }
    try {
      s.threads.back()->start(plain, tls, mu, cv, *ready.back());
    } catch (...) {
      {
        std::lock_guard lock(s.mu);
        --s.running;
      }
      s.threads.pop_back();
      shutdown();
      wait();
      throw;
    }
    if (t == 0) {
      // The others share the ports the first one got.
      s.port = s.threads[0]->port();
      if (plain) plain->port(s.port);
      s.tls_port = s.threads[0]->tls_port();
      if (tls) tls->port(s.tls_port);
    }
  }
  std::unique_lock lock(mu);
  cv.wait(lock, [&] {
    for (auto& r : ready) {
      if (!*r) return false;
    }
    return true;
  });
}

uint16_t Server::port() const { return impl_->port; }

const std::string& Server::openapi() const {
  if (!impl_->started) throw std::logic_error("bus::http::Server::openapi: call it after start()");
  return impl_->openapi;
}

uint16_t Server::tls_port() const { return impl_->tls_port; }

absl::Status Server::reload_tls() {
  Impl& s = *impl_;
  if (!s.options.tls()) return absl::FailedPreconditionError("bus::http: the server has no TLS");
  std::lock_guard lock(s.tls_mu);
  std::shared_ptr<asio::ssl::context> context;
  try {
    context = detail::make_tls_context(*s.options.tls());
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
  // Each thread swaps it in on its own loop: the next connection it accepts gets it.
  for (auto& t : s.threads) {
    asio::post(t->ioc, [thread = t.get(), context] { thread->tls_context = context; });
  }
  return absl::OkStatus();
}

void Server::shutdown() {
  if (impl_->stopping.exchange(true)) return;
  for (auto& t : impl_->threads) t->shutdown();
}

void Server::wait() {
  {
    std::unique_lock lock(impl_->mu);
    impl_->cv.wait(lock, [&] { return impl_->running == 0; });
  }
  for (auto& t : impl_->threads) t->join();
  // Released, not cancelled: cancelling waits for each executor, and one may be stuck in a
  // handler. The probe servers capture nothing and stay registered for the bus's lifetime.
  for (Subscription& s : impl_->probe_servers) s.release();
}

namespace {

/// Blocks SIGINT, SIGTERM and SIGHUP on the calling thread for its scope, so that the threads it
/// starts meanwhile never take them: the calling thread's own mask is back when the scope ends.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked() {
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGHUP);
    ::pthread_sigmask(SIG_BLOCK, &stop, &old_);
  }
  ~StopSignalsBlocked() { ::pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  StopSignalsBlocked(const StopSignalsBlocked&) = delete;
  StopSignalsBlocked& operator=(const StopSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

}  // namespace

void Server::run_until_signal() {
  asio::io_context signals_ctx;
  asio::signal_set signals(signals_ctx, SIGINT, SIGTERM);
  // SIGHUP reloads the certificates (as nginx does); without TLS it keeps its default action.
  if (impl_->options.tls()) signals.add(SIGHUP);
  std::function<void(beast::error_code, int)> on_signal = [&](beast::error_code ec, int signal) {
    if (ec) return;
    if (signal != SIGHUP) return shutdown();
    absl::Status st = reload_tls();
    std::fprintf(stderr, "bus::http: SIGHUP: %s\n",
                 st.ok() ? "TLS certificates reloaded" : std::string(st.message()).c_str());
    signals.async_wait(on_signal);
  };
  signals.async_wait(on_signal);
  // Returns on a signal, or when shutdown() came from elsewhere and the threads ended.
  std::optional<std::thread> waiter;
  {
    // The signal goes to this thread, the one running the loop that completes the wait, never to
    // an I/O thread or the waiter (nor to one of them while it is still starting).
    StopSignalsBlocked here_only;
    start();
    waiter.emplace([&] {
      wait();
      asio::post(signals_ctx, [&] { signals.cancel(); });
    });
  }
  signals_ctx.run();
  waiter->join();
}

WebSocketBridge& Server::websocket(WebSocketOptions options) {
  if (!impl_->websocket) {
    if (impl_->started) throw std::logic_error("bus::http: websocket() after start()");
    impl_->websocket = std::make_unique<WebSocketBridge>(std::move(options));
  }
  return *impl_->websocket;
}

ServerStats Server::stats() const {
  ServerStats out;
  out.connections_open = impl_->open.load(std::memory_order_relaxed);
  for (const auto& t : impl_->threads) {
    out.connections_accepted += t->io.accepted.load(std::memory_order_relaxed);
    out.connections_refused += t->io.refused.load(std::memory_order_relaxed);
    out.connections_timed_out += t->io.timed_out.load(std::memory_order_relaxed);
    out.requests += t->io.requests.load(std::memory_order_relaxed);
    out.requests_waiting += t->io.waiting.load(std::memory_order_relaxed);
    out.bad_requests += t->io.bad_requests.load(std::memory_order_relaxed);
    out.tls_handshakes += t->io.tls_handshakes.load(std::memory_order_relaxed);
    out.tls_handshake_failures += t->io.tls_failed.load(std::memory_order_relaxed);
  }
  return out;
}

// ==== /health and /metrics
// ======================================================================

namespace {

/// One /health request: waits for every executor's probe, then answers.
struct HealthCheck {
  Server::Impl* server;
  std::optional<Responder> respond;
  std::vector<bool> alive;
  std::size_t waiting;

  void finish() {
    using schemas::http::Health;
    capnp::MallocMessageBuilder b;
    Health::Builder h = b.initRoot<Health>();
    bool ok = !server->stopping.load();
    auto executors = h.initExecutors(static_cast<unsigned>(alive.size()));
    for (unsigned i = 0; i < alive.size(); ++i) {
      executors[i].setIndex(i);
      executors[i].setAlive(alive[i]);
      ok = ok && alive[i];
    }
    std::vector<const detail::Entry*> routed;
    for (const auto& e : server->entries) {
      if (!e.spec.endpoint.empty()) routed.push_back(&e);
    }
    auto services = h.initServices(static_cast<unsigned>(routed.size()));
    for (unsigned i = 0; i < routed.size(); ++i) {
      const detail::RouteSpec& spec = routed[i]->spec;
      std::size_t n = spec.handlers();
      services[i].setRoute(std::string(to_string(spec.method)) + " " + spec.path);
      services[i].setEndpoint(spec.endpoint);
      services[i].setHandlers(static_cast<uint32_t>(n));
      ok = ok && n > 0;
    }
    auto bridge = h.initBridge();
    if (const net::Node* node = server->options.node()) {
      bridge.setEnabled(true);
      bridge.setNode(absl::StrCat(absl::Hex(node->id(), absl::kZeroPad16)));
      std::vector<net::PeerInfo> peers = node->peers();
      auto out = bridge.initPeers(static_cast<unsigned>(peers.size()));
      for (unsigned i = 0; i < peers.size(); ++i) {
        out[i].setId(absl::StrCat(absl::Hex(peers[i].id, absl::kZeroPad16)));
        out[i].setName(peers[i].name);
        auto serves = out[i].initServes(static_cast<unsigned>(peers[i].serves.size()));
        for (unsigned j = 0; j < peers[i].serves.size(); ++j) serves.set(j, peers[i].serves[j]);
        out[i].setSinceHeartbeatMs(static_cast<uint64_t>(peers[i].since_heartbeat.count()));
      }
    }
    h.setStatus(ok ? "ok" : "unavailable");
    (*respond)(Reply::json(to_json(h.asReader()), ok ? 200 : 503));
  }
};

}  // namespace

void Server::Impl::serve_health(const Request&, Responder respond) {
  auto check = std::make_shared<HealthCheck>(
      HealthCheck{this, std::move(respond), std::vector<bool>(probes.size()), probes.size()});
  if (probes.empty()) return check->finish();
  for (uint32_t i = 0; i < probes.size(); ++i) {
    // A probe runs on executor i and its answer on this I/O thread: an executor stuck in a
    // handler (or gone) misses the deadline and is reported dead.
    bus.request(*probes[i], i, options.health_timeout(), [check, i](absl::StatusOr<uint32_t> r) {
      check->alive[i] = r.ok();
      if (--check->waiting == 0) check->finish();
    });
  }
}

StatsdSource Server::statsd_source() const {
  if (!impl_->started) {
    throw std::logic_error("bus::http::Server::statsd_source: call it after start()");
  }
  const Impl* impl = impl_.get();
  return [impl](StatsdSink& out) {
    detail::MetricsView v;
    v.routes = &impl->labels;
    for (const auto& t : impl->threads) {
      v.counters.push_back(&t->counters);
      v.io.push_back(&t->io);
    }
    v.connections_open = impl->open.load(std::memory_order_relaxed);
    if (impl->websocket) v.websocket = impl->websocket_stats();
    detail::statsd_metrics(v, out);
  };
}

Reply Server::Impl::serve_metrics() const {
  detail::MetricsView v;
  v.routes = &labels;
  for (const auto& t : threads) {
    v.counters.push_back(&t->counters);
    v.io.push_back(&t->io);
  }
  v.connections_open = open.load(std::memory_order_relaxed);
  v.bus = bus.stats();
  if (options.node() != nullptr) v.node = options.node()->stats();
  if (websocket) v.websocket = websocket_stats();
  Reply r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = detail::render_metrics(v);
  return r;
}

}  // namespace bus::http
