// The HTTP/WebSocket edge (bus::http): REST calls in, bus requests through, replies out.
//
//   bus::Bus bus;
//   bus::http::Server http(bus, bus::http::ServerOptions().port(8080));
//   http.route(bus::http::Method::kGet, "/orders/{id}", orders);   // Endpoint<Message<..>, ..>
//   http.run_until_signal();
//
// Each I/O thread is an Asio event loop that is also a bus inbox: a route's bus request is made
// on it and its reply comes back through the bus's rings and an eventfd. Only what is routed is
// reachable; the rest of the bus stays private.
#pragma once

#include <absl/functional/any_invocable.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bus/bus.hpp"
#include "bus/http/json.hpp"
#include "bus/http/options.hpp"
#include "bus/http/request.hpp"
#include "bus/http/websocket.hpp"
#include "bus/net/limiter.hpp"
#include "bus/statsd.hpp"

namespace bus::http {

namespace detail {
/// The connection waiting for an answer.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void answer(uint64_t ticket, Reply&& reply) = 0;
};
}  // namespace detail

/// Answers one request. Call it once, on the I/O thread that called the route (bus replies to
/// requests made there arrive there). Dropping it unanswered answers 500.
class Responder {
 public:
  Responder(std::shared_ptr<detail::Exchange> exchange, uint64_t ticket)
      : exchange_(std::move(exchange)), ticket_(ticket) {}
  Responder(Responder&&) noexcept = default;
  Responder& operator=(Responder&&) = delete;
  ~Responder() {
    if (exchange_) {
      exchange_->answer(ticket_, Reply::error(500, "internal", "the route gave no answer"));
    }
  }
  void operator()(Reply reply) {
    auto exchange = std::move(exchange_);
    exchange->answer(ticket_, std::move(reply));
  }

 private:
  std::shared_ptr<detail::Exchange> exchange_;
  uint64_t ticket_;
};

/// A route as the server keeps it: called on an I/O thread, possibly on several at once.
using Handler = absl::AnyInvocable<void(const Request&, Responder) const>;

namespace detail {
/// What a route requires of its caller (Route::require).
struct Access {
  bool authenticated = false;       // a principal (a valid token, or a client certificate)
  std::vector<std::string> scopes;  // every one of them in its token
};
/// What the OpenAPI document says of a route (read at start(), after the Route's setters ran).
struct RouteDoc {
  std::optional<capnp::StructSchema> request;  // filled from the body and parameters by the codec
  std::optional<capnp::Type> reply;            // the reply is this type's JSON
  std::string media_type;                      // the reply's; empty: not known
  std::string summary;
  std::string description;
  std::string tag;
  std::vector<unsigned> reply_statuses = {200};  // the statuses whose body is the reply
  bool bus = false;                              // a bus request: 404 (NotFound), 503, 504
  bool limited = false;                          // a rate limit: 429
};
struct RouteSpec {
  Method method;
  std::string path;                       // the template, e.g. "/greeting/{name}"
  std::string endpoint;                   // the bus endpoint it calls; empty for a direct handler
  std::function<std::size_t()> handlers;  // servers of that endpoint (for /health)
  /// Called by start() with the template's parameter names; throws if the route cannot work.
  std::function<void(const std::vector<std::string>&)> check;
  std::shared_ptr<Access> access = std::make_shared<Access>();
  std::function<RouteDoc()> doc;  // null: a direct handler, documented from its spec alone
};
/// 429 with Retry-After.
Reply rate_limited(std::string_view limiter, std::chrono::milliseconds retry_after);
}  // namespace detail

/// A route to a bus endpoint, returned by Server::route to adjust it before start().
template <class Req, class Rep>
class Route {
 public:
  struct State {
    explicit State(const Endpoint<Req, Rep>& e) : endpoint(e) {}
    const Endpoint<Req, Rep>& endpoint;
    std::shared_ptr<detail::Access> access;
    std::function<absl::StatusOr<Req>(const Request&)> in;
    std::function<Reply(const Rep&)> out;
    bool custom_in = false;
    bool custom_out = false;
    std::string summary, description;  // for the OpenAPI document
    std::string media_type;
    std::optional<capnp::Type> produces;
    Clock::duration timeout{0};  // 0: the server's default
    net::RateLimiter* limiter = nullptr;
    std::function<std::string(const Request&)> limit_key;
  };

  /// Maps the HTTP request to `Req`: required when `Req` has no Cap'n Proto schema (no
  /// bus::Codec). A non-OK status is the answer (InvalidArgument: 400 with its message).
  Route& request(std::function<absl::StatusOr<Req>(const Request&)> in) {
    state_->in = std::move(in);
    state_->custom_in = true;
    return *this;
  }
  /// Maps the reply to the HTTP response: required when `Rep` has no Cap'n Proto schema.
  Route& reply(std::function<Reply(const Rep&)> out) {
    state_->out = std::move(out);
    state_->custom_out = true;
    return *this;
  }
  /// What the OpenAPI document (GET /openapi.json) says the route does: a one-line summary and,
  /// optionally, more (CommonMark).
  Route& describe(std::string summary, std::string description = "") {
    state_->summary = std::move(summary);
    state_->description = std::move(description);
    return *this;
  }
  /// For the OpenAPI document, when reply(...) writes something other than Rep as JSON: the
  /// media type it answers with ("text/plain; charset=utf-8")...
  Route& produces(std::string media_type) {
    state_->media_type = std::move(media_type);
    state_->produces.reset();
    return *this;
  }
  /// ... or the Cap'n Proto type whose JSON it writes: `produces<capnp::List<capnp::Text>>()` for
  /// `Reply::json(to_json(reply->getGreetings()))`.
  template <class T>
  Route& produces() {
    state_->media_type = "application/json";
    state_->produces = capnp::Type::from<T>();
    return *this;
  }
  /// Callers must be authenticated (a valid bearer token, or a client certificate) and, with a
  /// `scope`, hold it in their token's "scope" (or "scp") claim; call again for more scopes.
  /// Without a token the answer is 401 with WWW-Authenticate; without the scope, 403.
  Route& require(std::string scope = "") {
    state_->access->authenticated = true;
    if (!scope.empty()) state_->access->scopes.push_back(std::move(scope));
    return *this;
  }
  /// This route's request deadline (504 past it).
  Route& timeout(Clock::duration d) {
    state_->timeout = d;
    return *this;
  }
  /// Admits this route's requests through `limiter` (shared by every node of the bus that runs a
  /// limiter of its name), keyed by `key(request)`: an API key header, a client id. Refused
  /// requests are answered 429 with Retry-After (the seconds left in the limiter's window) and
  /// never reach the bus. The limiter must outlive the server.
  Route& limit(net::RateLimiter& limiter, std::function<std::string(const Request&)> key) {
    state_->limiter = &limiter;
    state_->limit_key = std::move(key);
    return *this;
  }

 private:
  friend class Server;
  explicit Route(std::shared_ptr<State> s) : state_(std::move(s)) {}
  std::shared_ptr<State> state_;
};

/// Counters of the server itself (the per-route ones are in /metrics).
struct ServerStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t connections_refused = 0;     // over max_connections: answered 503 and closed
  uint64_t connections_timed_out = 0;   // read, idle or write timeout
  uint64_t requests = 0;                // answered, every status
  uint64_t requests_waiting = 0;        // read, waiting for a turn (max_in_flight)
  uint64_t bad_requests = 0;            // unparseable HTTP, headers or body over the limits
  uint64_t tls_handshakes = 0;          // completed
  uint64_t tls_handshake_failures = 0;  // not TLS, nothing in common, a client certificate refused
};

class Server {
 public:
  /// The bus must outlive the server; stop the server before the bus.
  Server(Bus& bus, ServerOptions options = {});
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;
  /// Shuts down (as shutdown()) and waits.
  ~Server();

  /// Routes `method path` to a bus endpoint. `path` is a template: literal segments and
  /// `{name}` parameters. With Cap'n Proto types (Message<S>, or a type with a bus::Codec) the
  /// request is the JSON body with path and query parameters filled in by field name, and the
  /// reply is written as JSON; other types need Route::request / Route::reply. A GET route
  /// answers HEAD too. Call before start().
  template <class Req, class Rep>
  Route<Req, Rep> route(Method method, std::string_view path, const Endpoint<Req, Rep>& endpoint);

  /// A route answered on the I/O thread itself, without the bus (static or computed replies).
  /// `scopes`, when given, are what it requires, as Route::require ({""}: authentication only).
  Server& handle(Method method, std::string_view path, std::function<Reply(const Request&)> handler,
                 std::vector<std::string> scopes = {});

  /// Binds and starts the I/O threads. Throws std::runtime_error if the address cannot be
  /// bound, std::invalid_argument for a route that cannot work (a path parameter that names no
  /// field, a type with no mapping, two routes for one method and path).
  void start();
  /// The bound port once start() has bound it, 0 before; safe from any thread.
  uint16_t port() const;
  /// The TLS listener's port once start() has bound it, 0 before or without TLS.
  uint16_t tls_port() const;
  /// Reads the TLS certificate chain, key and client CA files again: new connections get them,
  /// open ones go on with theirs. When a file cannot be used the old ones stay and the status
  /// says what is wrong. From any thread; run_until_signal() calls it on SIGHUP.
  absl::Status reload_tls();
  /// Stops accepting, answers what is in flight within the grace period (with
  /// "Connection: close"), then closes every connection and stops the I/O threads. Idempotent,
  /// from any thread, returns at once.
  void shutdown();
  /// Blocks until the server has stopped.
  void wait();
  /// start() if needed, then blocks until SIGINT or SIGTERM (or shutdown()), then shuts down
  /// gracefully and returns. With TLS, SIGHUP reloads the certificates (reload_tls()). The
  /// signals are taken on the calling thread: the threads it starts block them, and the caller's
  /// own signal mask is left as it was.
  void run_until_signal();

  /// The WebSocket bridge, created on first use with `options` (later calls return it and
  /// ignore theirs). Configure it before start().
  WebSocketBridge& websocket(WebSocketOptions options = {});
  WebSocketStats websocket_stats() const;

  ServerStats stats() const;
  /// The OpenAPI 3.1 document (JSON) of the routes, as GET /openapi.json serves it (see
  /// OpenApiOptions). After start().
  const std::string& openapi() const;
  /// The figures /metrics shows for HTTP (requests by route and status, latency, connections),
  /// for a bus::StatsdExporter. After start(); the server must outlive the exporter.
  StatsdSource statsd_source() const;

  struct Impl;  // opaque: Beast and Asio stay in endpoint/src

 private:
  void add_route(detail::RouteSpec spec, Handler handler);
  Clock::duration default_deadline() const;

  Bus& bus_;
  std::unique_ptr<Impl> impl_;
};

// ==== implementation
// ====================================================================================

template <class Req, class Rep>
Route<Req, Rep> Server::route(Method method, std::string_view path,
                              const Endpoint<Req, Rep>& endpoint) {
  using State = typename Route<Req, Rep>::State;
  auto st = std::make_shared<State>(endpoint);
  if constexpr (Bridgeable<Req>) st->in = [](const Request& r) { return from_request<Req>(r); };
  if constexpr (Bridgeable<Rep>) st->out = [](const Rep& v) { return to_reply(v); };

  detail::RouteSpec spec;
  spec.method = method;
  spec.path = std::string(path);
  spec.endpoint = endpoint.name();
  spec.handlers = [this, st] { return bus_.servers(st->endpoint); };
  spec.doc = [st] {
    detail::RouteDoc d;
    d.bus = true;
    d.limited = st->limiter != nullptr;
    d.summary = st->summary;
    d.description = st->description;
    d.tag = st->endpoint.name();
    if constexpr (Bridgeable<Req>) {
      if (!st->custom_in) d.request = capnp::Schema::from<typename Codec<Req>::Schema>();
    }
    d.media_type = st->media_type;
    d.reply = st->produces;
    if constexpr (Bridgeable<Rep>) {
      if (!st->custom_out) {
        d.media_type = "application/json";
        d.reply = capnp::Type::from<typename Codec<Rep>::Schema>();
      }
    }
    return d;
  };
  st->access = spec.access;
  spec.check = [st, desc = std::string(to_string(method)) + " " +
                           spec.path](const std::vector<std::string>& params) {
    if (!st->in) {
      throw std::invalid_argument("bus::http: route " + desc +
                                  ": the request type has no Cap'n Proto schema (no "
                                  "bus::Codec); map it with Route::request(...)");
    }
    if (!st->out) {
      throw std::invalid_argument("bus::http: route " + desc +
                                  ": the reply type has no Cap'n Proto schema (no bus::Codec); "
                                  "map it with Route::reply(...)");
    }
    if constexpr (Bridgeable<Req>) {
      if (!st->custom_in) {
        detail::check_fields(capnp::Schema::from<typename Codec<Req>::Schema>(), params, desc);
      }
    }
  };

  Bus* bus = &bus_;
  add_route(std::move(spec), [bus, st, fallback = default_deadline()](const Request& req,
                                                                      Responder respond) {
    if (st->limiter != nullptr) {
      if (net::Decision d = st->limiter->admit(st->limit_key(req)); !d.admitted) {
        return respond(detail::rate_limited(st->limiter->name(), d.retry_after));
      }
    }
    // Built in place (a placeholder status with a message would allocate per request).
    absl::StatusOr<Req> r = [&]() -> absl::StatusOr<Req> {
      try {
        return st->in(req);
      } catch (const std::exception& e) {
        return absl::InvalidArgumentError(e.what());
      }
    }();
    if (!r.ok()) return respond(Reply::failure(r.status()));
    auto timeout = st->timeout.count() > 0 ? st->timeout : fallback;
    bus->request(st->endpoint, std::move(*r), timeout,
                 [st, respond = std::move(respond)](absl::StatusOr<Rep> rep) mutable {
                   if (!rep.ok()) return respond(Reply::failure(rep.status()));
                   try {
                     respond(st->out(*rep));
                   } catch (const std::exception& e) {
                     respond(Reply::error(500, "internal",
                                          std::string("writing the reply failed: ") + e.what()));
                   }
                 });
  });
  return Route<Req, Rep>(st);
}

}  // namespace bus::http
