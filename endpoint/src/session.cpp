// Connections and I/O threads of the HTTP server (Boost.Beast on Asio).
#include <absl/container/inlined_vector.h>
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <kj/compat/url.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <boost/asio/write.hpp>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "cors.hpp"
#include "framing.hpp"
#include "io.hpp"

namespace bus::http::detail {
namespace {

std::optional<Method> method_of(bh::verb v) {
  switch (v) {
    case bh::verb::get: return Method::kGet;
    case bh::verb::head: return Method::kHead;
    case bh::verb::post: return Method::kPost;
    case bh::verb::put: return Method::kPut;
    case bh::verb::patch: return Method::kPatch;
    case bh::verb::delete_: return Method::kDelete;
    case bh::verb::options: return Method::kOptions;
    default: return std::nullopt;
  }
}

/// Connection-level failures end the connection quietly; HTTP parse errors are answered 400.
bool is_http_error(const beast::error_code& ec) {
  return ec.category() == bh::make_error_code(bh::error::bad_target).category();
}

std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }
absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// Whether a route's extra header field may be sent: not one the server sets itself, and
/// nothing that would end the field early (a CR or LF would let a value inject fields).
bool header_allowed(std::string_view name, std::string_view value) {
  for (std::string_view own :
       {"content-type", "content-length", "connection", "allow", "transfer-encoding"}) {
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()),
                               absl::string_view(own.data(), own.size()))) {
      return false;
    }
  }
  bool bad = name.empty() || name.find_first_of("\r\n: ") != std::string_view::npos ||
             value.find_first_of("\r\n") != std::string_view::npos;
  if (bad) {
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      std::fprintf(stderr,
                   "bus::http: a reply's header field \"%.*s\" was not sent: its name "
                   "or value holds a CR, LF or colon (logged once)\n",
                   static_cast<int>(name.size()), name.data());
    }
  }
  return !bad;
}

/// `s` fit for a quoted-string of WWW-Authenticate (RFC 6750 §3 allows no '"' or '\\' in
/// error_description, and a token's kid is the client's text).
std::string quotable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') c = '?';
  }
  return out;
}

/// An Asio socket owning `fd`, a connected TCP socket (closed when Asio cannot take it).
tcp::socket adopt(asio::io_context& ioc, int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  tcp::socket socket(ioc);
  beast::error_code ec;
  socket.assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (ec) ::close(fd);
  return socket;
}

}  // namespace

Reply unauthorized(std::string_view realm, std::string_view error, std::string_view description) {
  Reply r = Reply::error(401, "unauthenticated",
                         description.empty() ? "this route needs a bearer token" : description);
  std::string challenge = absl::StrCat("Bearer realm=\"", quotable(realm), "\"");
  if (!error.empty()) {
    absl::StrAppend(&challenge, ", error=\"", av(error), "\", error_description=\"",
                    quotable(description), "\"");
  }
  r.headers.emplace_back("WWW-Authenticate", std::move(challenge));
  return r;
}

Reply forbidden(std::string_view realm, std::string_view scope) {
  Reply r =
      Reply::error(403, "forbidden",
                   absl::StrCat("this route needs scope '", av(scope), "', which the token lacks"));
  r.headers.emplace_back(
      "WWW-Authenticate",
      absl::StrCat("Bearer realm=\"", quotable(realm), "\", error=\"insufficient_scope\", scope=\"",
                   quotable(scope), "\""));
  return r;
}

// ==== Session
// ====================================================================================

Session::Session(IoThread& io, int fd, SSL_CTX* tls) : io_(io), tls_(tls != nullptr) {
  sock_.fd = fd;
  io_.sessions.insert(this);
  if (tls != nullptr) {
    ssl_ = SSL_new(tls);  // holds a reference to its context: a reload leaves it as it is
    if (ssl_ != nullptr) {
      attach(ssl_, &sock_);
      SSL_set_accept_state(ssl_);
    }
  }
}

Session::~Session() {
  close();  // a no-op unless the session never got to close its socket
  io_.forget(this);
}

void Session::start() {
  self_ = shared_from_this();
  int one = 1;  // a reply is one write: send it now
  ::setsockopt(sock_.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (!io_.watch(sock_.fd, this)) return close();
  if (tls_) {
    if (ssl_ == nullptr) {
      bump(io_.io.tls_failed);  // SSL_new failed (out of memory)
      return close();
    }
    // The handshake must end within the read timeout, as a request must.
    phase_ = Phase::kHandshake;
    deadline_ = Clock::now() + io_.server.options.read_timeout();
    return handshake();
  }
  // The first request may be here already: the registration's first event says so.
  wait_for_request();
}

void Session::handshake() {
  int rc = SSL_do_handshake(ssl_);
  switch (tls_step(ssl_, rc)) {
    case TlsStep::kDone:
      bump(io_.io.tls_handshakes);
      if (std::string subject = peer_subject(ssl_); !subject.empty()) {
        // Every request on this connection comes from its certificate's subject.
        auto p = std::make_shared<Principal>();
        p->subject = std::move(subject);
        client_principal_ = std::move(p);
      }
      return wait_for_request();
    case TlsStep::kWantRead:
    case TlsStep::kWantWrite: return;  // the poller calls again when the socket is ready
    case TlsStep::kClosed:
    case TlsStep::kFailed:
      // Not TLS, a protocol or version it does not speak, a certificate it does not accept:
      // nothing to answer in HTTP.
      bump(io_.io.tls_failed);
      return close();
  }
}

void Session::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  deadline_.reset();
  if (ssl_ != nullptr) {
    // close_notify, once (the socket is non-blocking): the end of a TLS connection that the
    // server chose, so that a client can tell it from a cut.
    if (SSL_is_init_finished(ssl_) && sock_.fd >= 0) SSL_shutdown(ssl_);
    SSL_free(ssl_);
    ssl_ = nullptr;
    ERR_clear_error();
  }
  if (sock_.fd >= 0) {
    // Leave the poller explicitly: close() alone leaves it only when no other descriptor refers
    // to the socket, and a fork() elsewhere in the process (a child before its exec) holds one
    // for a while: its events would then come for a session that is gone.
    io_.unwatch(sock_.fd);
    ::shutdown(sock_.fd, SHUT_RDWR);
    ::close(sock_.fd);
    sock_.fd = -1;
  }
  // Let go after the current handler: the poller may still hold this round's events for it.
  if (self_) asio::post(io_.ioc, [s = std::move(self_)] {});
}

void Session::on_events(uint32_t events) {
  if (phase_ == Phase::kClosed) return;
  if ((events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) sock_.readable = true;
  if ((events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0) sock_.peer_closed = true;
  if ((events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0) sock_.writable = true;
  switch (phase_) {
    case Phase::kHandshake: return handshake();
    case Phase::kIdle: return wait_for_request();
    case Phase::kReading: return parse();
    case Phase::kWriting: return send();
    default: return;  // a request is being answered: what comes next waits in the socket
  }
}

Session::Received Session::receive(std::size_t want) {
  if (ssl_ != nullptr) return receive_tls(want);
  if (!sock_.readable) return Received::kNothing;
  asio::mutable_buffer space = buffer_.prepare(want);
  for (;;) {
    ssize_t n = ::recv(sock_.fd, space.data(), space.size(), 0);
    if (n > 0) {
      buffer_.commit(static_cast<std::size_t>(n));
      // Less than asked for: the socket is drained, and what arrives next is a new edge. Not so
      // when the peer's end was seen: the read that returns it is still to come.
      if (static_cast<std::size_t>(n) < space.size() && !sock_.peer_closed) sock_.readable = false;
      return Received::kSome;
    }
    if (n == 0) return Received::kEnd;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      sock_.readable = false;
      return Received::kNothing;
    }
    return Received::kFailed;
  }
}

Session::Received Session::receive_tls(std::size_t want) {
  // OpenSSL may hold a record already read (read-ahead) while the socket is drained.
  if (!sock_.readable && SSL_has_pending(ssl_) == 0) return Received::kNothing;
  asio::mutable_buffer space = buffer_.prepare(want);
  int n = SSL_read(ssl_, space.data(), static_cast<int>(space.size()));
  if (n > 0) {
    buffer_.commit(static_cast<std::size_t>(n));
    return Received::kSome;
  }
  switch (tls_step(ssl_, n)) {
    case TlsStep::kWantRead:
    case TlsStep::kWantWrite: return Received::kNothing;  // the poller calls again
    case TlsStep::kClosed: return Received::kEnd;
    default: return Received::kFailed;
  }
}

void Session::wait_for_request() {
  if (io_.draining) return close();
  phase_ = Phase::kIdle;
  if (buffer_.size() > 0) {
    // A pipelined request is already here. Read it from a fresh handler: answering one at once
    // (a route on the I/O thread) must not nest a call per request in the buffer.
    asio::post(io_.ioc, [self = shared_from_this()] {
      if (self->phase_ == Phase::kIdle) self->read_request();
    });
    return;
  }
  deadline_ = Clock::now() + io_.server.options.idle_timeout();
  switch (receive(kFirstRead)) {
    case Received::kSome: return read_request();
    case Received::kNothing: return;  // the poller calls again when the next request begins
    case Received::kEnd:
    case Received::kFailed: return close();
  }
}

void Session::read_request() {
  phase_ = Phase::kReading;
  started_ = Clock::now();  // latency counts from the request's first byte
  // The whole request must arrive within read_timeout of its first byte: a client trickling
  // its headers is closed by the sweep.
  deadline_ = started_ + io_.server.options.read_timeout();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(io_.server.options.max_header_bytes()));
  parser_->body_limit(io_.server.options.max_body_bytes());
  parser_->eager(true);
  parse();
}

void Session::parse() {
  for (;;) {
    beast::error_code ec;
    if (buffer_.size() > 0) {
      std::size_t used = parser_->put(buffer_.data(), ec);
      buffer_.consume(used);
      if (ec != bh::error::need_more) {
        if (ec || parser_->is_done()) return on_read(ec);
        if (used > 0) continue;
      }
    }
    // More is needed: what the buffer has room for, at least kFirstRead, at most 64 KiB.
    std::size_t want = std::clamp<std::size_t>(buffer_.capacity() - buffer_.size(), kFirstRead,
                                               std::size_t{64} << 10);
    switch (receive(want)) {
      case Received::kSome: continue;
      case Received::kNothing: return;  // the poller calls again when more arrives
      case Received::kEnd:
        if (!parser_->got_some()) return on_read(bh::error::end_of_stream);
        parser_->put_eof(ec);  // a message whose end is the connection's end, or a cut one
        return on_read(ec);    // done: answered, and the next read finds the end
      case Received::kFailed: return on_read(beast::error_code(errno, beast::system_category()));
    }
  }
}

void Session::on_read(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec == bh::error::header_limit) {
    return refuse(
        Reply::error(431, "header_fields_too_large",
                     "the request line and headers exceed " +
                         std::to_string(io_.server.options.max_header_bytes()) + " bytes"),
        true);
  }
  if (ec == bh::error::body_limit) {
    return refuse(Reply::error(413, "payload_too_large",
                               "the body exceeds " +
                                   std::to_string(io_.server.options.max_body_bytes()) + " bytes"),
                  true);
  }
  if (ec == bh::error::end_of_stream || ec == bh::error::partial_message) return close();
  if (ec && is_http_error(ec)) {
    return refuse(Reply::error(400, "bad_request", describe_parse_error(ec)), true);
  }
  if (ec) return close();  // reset, aborted by a timeout, ...
  dispatch();
}

void Session::refuse(Reply reply, bool close_after) {
  bump(io_.io.bad_requests);
  cors_allowed_ = {};
  route_ = io_.server.unmatched;
  close_after_ = close_after;
  if (parser_ && parser_->is_header_done()) {
    version_ = parser_->get().version();
    head_ = parser_->get().method() == bh::verb::head;
  } else {
    version_ = 11;
    head_ = false;
  }
  write(std::move(reply), nullptr);
}

void Session::dispatch() {
  auto& msg = parser_->get();
  version_ = msg.version();
  keep_alive_ = msg.keep_alive();
  close_after_ = false;
  cors_allowed_ = {};
  head_ = msg.method() == bh::verb::head;
  std::optional<Method> method = method_of(msg.method());
  if (!method) {
    route_ = io_.server.unmatched;
    return write(
        Reply::error(501, "not_implemented",
                     "method " + std::string(view(msg.method_string())) + " is not served"),
        nullptr);
  }

  if (std::optional<Reply> bad = framing_error(msg)) return refuse(std::move(*bad), true);
  const std::optional<CorsOptions>& cors = io_.server.options.cors();
  if (cors) {
    // A browser's cross-origin request: its answer says whether the page may read it.
    if (auto origin = msg.find(bh::field::origin); origin != msg.end()) {
      cors_allowed_ = allowed_origin(*cors, view(origin->value()));
    }
  }

  std::string_view target = view(msg.target());
  TargetForm form = classify_target(target);
  if (form == TargetForm::kAsterisk) {
    route_ = io_.server.unmatched;
    if (*method != Method::kOptions) {
      return refuse(Reply::error(400, "bad_request", "'*' is a request target for OPTIONS only"),
                    false);
    }
    // A server-wide OPTIONS (RFC 9110 §9.3.7): what this server implements, and no content.
    static const std::string kMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
    return write(Reply{200, "", "", {}}, &kMethods);
  }
  if (form == TargetForm::kAbsolute) {
    // The path after the authority is the target (RFC 9112 §3.2.2: servers accept this form).
    std::optional<std::string> origin = origin_form(target);
    if (origin) {
      absolute_target_ = std::move(*origin);
      target = absolute_target_;
      form = classify_target(target);
    } else {
      form = TargetForm::kInvalid;
    }
  }
  if (form == TargetForm::kInvalid) {
    return refuse(
        Reply::error(400, "bad_request",
                     "malformed request target: it must be a path starting with '/' in visible "
                     "ASCII (percent-encode other bytes)"),
        false);
  }
  if (const WebSocketBridge* ws = io_.server.websocket.get();
      ws != nullptr && target.substr(0, target.find('?')) == ws->options().path()) {
    route_ = io_.server.unmatched;
    if (*method != Method::kGet) {
      return write(Reply::error(426, "upgrade_required",
                                "GET " + ws->options().path() + " is a WebSocket: send an upgrade"),
                   nullptr);
    }
    std::optional<Reply> refused =
        upgrade(io_, *parser_, client_principal_, [this] { return hand_over(); });
    if (refused) return write(std::move(*refused), nullptr);
    return;
  }
  // A request path of up to 8 segments takes no allocation (a std::vector took two for
  // /greeting/{name}, growing).
  absl::InlinedVector<std::string_view, 8> path;
  Request::Fields query;
  kj::Maybe<kj::Url> url;
  if (form == TargetForm::kPlain) {
    // Nothing to decode, no query, no dot segments: the path is its '/'-separated segments
    // (empty ones dropped, as kj::Url does). Saves kj::Url's allocations on the common request.
    for (absl::string_view seg :
         absl::StrSplit(absl::string_view(target.data(), target.size()), '/', absl::SkipEmpty())) {
      path.emplace_back(seg.data(), seg.size());
    }
  } else {
    url = kj::Url::tryParse(std::string(target), kj::Url::HTTP_REQUEST);
    kj::Url* parsed = nullptr;
    KJ_IF_MAYBE (u, url) {
      parsed = u;
    }
    if (parsed == nullptr) {
      return refuse(
          Reply::error(400, "bad_request", "malformed request target: " + std::string(target)),
          false);
    }
    path.reserve(parsed->path.size());
    for (const kj::String& seg : parsed->path) path.emplace_back(seg.cStr(), seg.size());
    query.reserve(parsed->query.size());
    for (const auto& q : parsed->query) {
      query.emplace_back(std::string(q.name.cStr(), q.name.size()),
                         std::string(q.value.cStr(), q.value.size()));
    }
  }
  Router::Miss miss;
  std::optional<Router::Match> match = io_.server.router.match(*method, path, &miss);
  if (cors && *method == Method::kOptions && !match) {
    auto requested = msg.find(bh::field::access_control_request_method);
    auto origin = msg.find(bh::field::origin);
    if (requested != msg.end() && origin != msg.end()) {
      // A preflight: answered here, before any credentials (browsers send none with it).
      route_ = io_.server.unmatched;
      if (cors_allowed_.empty()) {
        return write(Reply::error(403, "forbidden",
                                  absl::StrCat("CORS: origin ", av(view(origin->value())),
                                               " is not allowed")),
                     nullptr);
      }
      if (!miss.path_known) {
        return write(Reply::error(404, "not_found", "no route for " + std::string(target)),
                     nullptr);
      }
      std::string_view allowed = std::exchange(cors_allowed_, {});  // the preflight's own fields
      return write(preflight(*cors, allowed, miss.allow, view(requested->value()),
                             view(msg[bh::field::access_control_request_headers])),
                   nullptr);
    }
  }
  if (!match) {
    route_ = io_.server.unmatched;
    if (miss.path_known && *method == Method::kOptions) {
      // No OPTIONS route here: what the path allows, and no content (RFC 9110 §9.3.7).
      miss.allow += ", OPTIONS";
      return write(Reply{200, "", "", {}}, &miss.allow);
    }
    if (miss.path_known) {
      return write(Reply::error(405, "method_not_allowed",
                                std::string(to_string(*method)) + " is not allowed on " +
                                    std::string(target) + " (allowed: " + miss.allow + ")"),
                   &miss.allow);
    }
    return write(
        Reply::error(404, "not_found",
                     "no route for " + std::string(to_string(*method)) + " " + std::string(target)),
        nullptr);
  }

  route_ = match->route;
  PrincipalPtr principal = client_principal_;
  if (io_.tokens) {
    absl::StatusOr<PrincipalPtr> who = io_.authenticate(msg, client_principal_);
    if (!who.ok()) {
      bump(io_.io.auth_invalid);
      absl::string_view why = who.status().message();
      return write(
          unauthorized(io_.realm(), "invalid_token", std::string_view(why.data(), why.size())),
          nullptr);
    }
    principal = *std::move(who);
  }
  if (const Access* access = io_.server.entries[route_].spec.access.get();
      access != nullptr && access->authenticated) {
    if (principal == nullptr) {
      bump(io_.io.auth_missing);
      return write(unauthorized(io_.realm(), "", ""), nullptr);
    }
    for (const std::string& scope : access->scopes) {
      if (!principal->has_scope(scope)) {
        bump(io_.io.auth_forbidden);
        return write(forbidden(io_.realm(), scope), nullptr);
      }
    }
  }
  request_.emplace(*method, target, msg.body(), std::move(match->params), std::move(query), &msg,
                   std::move(principal));
  deadline_.reset();  // the route's deadline answers it, whether it waits for a turn or runs
  if (!io_.admit(*this)) {
    phase_ = Phase::kQueued;  // the I/O thread has max_in_flight requests out: wait for a turn
    return;
  }
  invoke();
}

void Session::invoke() {
  phase_ = Phase::kHandling;
  io_.batch_round();
  // The route's bus requests carry its principal. A copy: an answer given at once resets
  // request_ while the handler still runs.
  PrincipalPtr principal = request_->shared_principal();
  PrincipalScope acting_for(principal);
  io_.server.entries[route_].handler(*request_, Responder(shared_from_this(), ++ticket_));
}

void Session::answer(uint64_t ticket, Reply&& reply) {
  io_.finished_one();  // every Responder answers exactly once, stale or not
  // A stale answer: the connection was closed (timeout, shutdown) while the route worked.
  if (ticket != ticket_ || phase_ != Phase::kHandling) return;
  request_.reset();
  write(std::move(reply), nullptr);
}

void Session::write(Reply&& reply, const std::string* allow) {
  if (reply.status < 100 || reply.status > 999) {
    reply = Reply::error(500, "internal",
                         "the route answered with status " + std::to_string(reply.status) +
                             ", which is not an HTTP status code");
  }
  Clock::time_point now = Clock::now();
  io_.counters[route_]->record(reply.status, now - started_);
  bump(io_.io.requests);
  keep_open_ = keep_alive_ && !close_after_ && !io_.draining;
  format(reply, allow);
  sent_ = 0;
  phase_ = Phase::kWriting;
  deadline_ = now + io_.server.options.write_timeout();
  send();
}

void Session::format(const Reply& reply, const std::string* allow) {
  // The response head is written straight into the connection's buffer (kept between
  // requests): Beast's message fields cost an allocation per field and per response. The
  // common response takes two appends, the status line kept per thread: each piece of an append
  // costs a copy call (the response took about 1,100 instructions as 15 pieces, 700 now).
  out_.clear();
  if (!reply.content_type.empty()) [[likely]] {
    absl::StrAppend(&out_, io_.status_line(version_, reply.status),
                    "Content-Type: ", reply.content_type, "\r\n");
  } else {
    out_ = io_.status_line(version_, reply.status);  // no content (OPTIONS)
  }
  if (allow != nullptr) absl::StrAppend(&out_, "Allow: ", *allow, "\r\n");
  if (!cors_allowed_.empty()) append_cors_fields(*io_.server.options.cors(), cors_allowed_, out_);
  for (const auto& [name, value] : reply.headers) {
    if (!header_allowed(name, value)) continue;
    absl::StrAppend(&out_, name, ": ", value, "\r\n");
  }
  absl::string_view connection;
  if (version_ >= 11 && !keep_open_) connection = "Connection: close\r\n";
  if (version_ < 11 && keep_open_) connection = "Connection: keep-alive\r\n";
  // 1xx, 204 and 304 have no body, and no Content-Length (RFC 9110, 8.6).
  if (reply.status < 200 || reply.status == 204 || reply.status == 304) {
    absl::StrAppend(&out_, connection, "\r\n");
    return;
  }
  // HEAD: the headers GET would send (Content-Length included), no body.
  absl::StrAppend(&out_, "Content-Length: ", reply.body.size(), "\r\n", connection, "\r\n",
                  head_ ? absl::string_view() : absl::string_view(reply.body));
}

void Session::send() {
  while (sock_.writable) {
    ssize_t n;
    if (ssl_ != nullptr) {
      n = SSL_write(ssl_, out_.data() + sent_, static_cast<int>(out_.size() - sent_));
      if (n <= 0) {
        switch (tls_step(ssl_, static_cast<int>(n))) {
          case TlsStep::kWantWrite: continue;  // the BIO found the socket full: ends the loop
          case TlsStep::kWantRead: return;     // the poller's next event tries again
          default: return close();
        }
      }
    } else {
      n = ::send(sock_.fd, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return close();  // reset, ...
      }
    }
    sent_ += static_cast<std::size_t>(n);
    if (sent_ == out_.size()) {
      if (out_.capacity() > kKeptOut) out_ = std::string();  // a large reply: let it go
      if (!keep_open_) return close();
      return wait_for_request();
    }
  }
  sock_.writable = false;  // the socket is full: the poller calls again when there is room
}

Handover Session::hand_over() {
  io_.unwatch(sock_.fd);
  Handover h{adopt(io_.ioc, sock_.fd), std::exchange(ssl_, nullptr), client_principal_};
  sock_.fd = -1;  // the WebSocket's now
  close();
  return h;
}

std::optional<Reply> cross_origin_refusal(IoThread& io, const bh::request<bh::string_body>& msg) {
  auto origin = msg.find(bh::field::origin);
  if (origin == msg.end()) return std::nullopt;  // not a browser
  std::string_view from = view(origin->value());
  if (same_origin(from, view(msg[bh::field::host]))) return std::nullopt;
  if (const auto& cors = io.server.options.cors(); cors && !allowed_origin(*cors, from).empty()) {
    return std::nullopt;
  }
  // A page of another site would act with this browser's cookies and certificates.
  bump(io.ws.refused);
  return Reply::error(403, "forbidden",
                      absl::StrCat("origin ", av(from), " may not open a WebSocket here"));
}

// ==== IoThread
// ===================================================================================

IoThread::IoThread(Server::Impl& s, unsigned i) : server(s), index(i) {
  for (std::size_t r = 0; r < server.labels.size(); ++r) {
    counters.push_back(std::make_unique<RouteCounters>());
  }
}

IoThread::~IoThread() { join(); }

uint16_t IoThread::listen(tcp::acceptor& acceptor, const tcp::endpoint& at, const char* option) {
  beast::error_code ec;
  if (index == 0 && at.port() != 0) {
    // SO_REUSEPORT would let this server share a port another server (of the same user)
    // listens on. A plain bind first tells whether the port is taken.
    tcp::acceptor probe(ioc);
    probe.open(at.protocol(), ec);
    if (!ec) probe.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) probe.bind(at, ec);
  }
  if (!ec) acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) {
    // Every I/O thread listens on the same port; the kernel spreads the connections.
    using ReusePort = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
    acceptor.set_option(ReusePort(true), ec);
  }
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor.non_blocking(true, ec);
  if (ec) {
    throw std::runtime_error("bus::http: cannot listen on " + at.address().to_string() + ":" +
                             std::to_string(at.port()) + ": " + ec.message() +
                             " (is the port taken? choose another with " + option + ")");
  }
  return acceptor.local_endpoint().port();
}

void IoThread::start(const std::optional<tcp::endpoint>& plain,
                     const std::optional<tcp::endpoint>& tls, std::mutex& mu,
                     std::condition_variable& cv, bool& ready) {
  if (plain) port_ = listen(acceptor_, *plain, "ServerOptions::port");
  if (tls) tls_port_ = listen(tls_acceptor_, *tls, "TlsOptions::port");
  int poller = ::epoll_create1(EPOLL_CLOEXEC);
  if (poller < 0) {
    throw std::runtime_error(std::string("bus::http: epoll_create1 failed: ") +
                             std::strerror(errno));
  }
  poller_.emplace(ioc, poller);
  thread_ = std::thread([this, &mu, &cv, &ready] { run(mu, cv, ready); });
}

void IoThread::run(std::mutex& mu, std::condition_variable& cv, bool& ready) {
  char name[16];
  std::snprintf(name, sizeof name, "bus-http-%u", index);
  pthread_setname_np(pthread_self(), name);
  inbox_.emplace(server.bus);  // this thread's bus inbox: replies to its requests come here
  if (server.jwt) tokens.emplace(*server.jwt);
  ws_hub.reset(make_ws_hub());
  // The inbox's eventfd is in the connection poller too (its events carry no session): replies
  // are taken in the same rounds as the connections' events, without a wait of their own.
  epoll_event wake{};
  wake.events = EPOLLIN | EPOLLET;
  wake.data.ptr = nullptr;
  if (::epoll_ctl(poller_->native_handle(), EPOLL_CTL_ADD, inbox_->fd(), &wake) != 0) {
    std::fprintf(stderr, "bus::http: cannot watch the inbox: %s\n", std::strerror(errno));
    std::abort();  // the thread could never hear its replies
  }
  wait_for_connections();
  if (acceptor_.is_open()) accept(acceptor_, false);
  if (tls_acceptor_.is_open()) accept(tls_acceptor_, true);
  sweep();
  {
    // Notified under the lock: start() owns `cv` and may return (destroying it) once it sees
    // `ready`.
    std::lock_guard lock(mu);
    ready = true;
    cv.notify_all();
  }

  ioc.run();

  // Stopped. Close what is left, let the aborted operations release their sessions, then close
  // the inbox: requests still pending are cancelled and their answers go nowhere.
  for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) s->close();
  close_websockets(*this, /*now=*/true);
  waiting_.clear();
  ioc.restart();
  ioc.poll();
  ws_hub.reset();  // its bus subscriptions, before the inbox they run on
  batch_.reset();
  ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_DEL, inbox_->fd(), nullptr);
  inbox_.reset();
  ioc.poll();
  poller_.reset();
  std::lock_guard lock(server.mu);
  --server.running;
  server.cv.notify_all();
}

void IoThread::join() {
  if (thread_.joinable()) thread_.join();
}

void IoThread::shutdown() {
  asio::post(ioc, [this] { begin_shutdown(); });
}

void IoThread::accept(tcp::acceptor& acceptor, bool tls) {
  // Waits for the listening socket, then takes what waits in its backlog, a bounded number per
  // round (like nginx's multi_accept): one accept per pass of the event loop would leave a burst
  // of new connections (10,000 at once) waiting behind every active one for many passes.
  acceptor.async_wait(tcp::acceptor::wait_read, [this, &acceptor, tls](beast::error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    for (int i = 0; !ec && i <= kAcceptBurst && acceptor.is_open(); ++i) {
      int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(fd, tls);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // The connection went before it was taken: the next one.
      if (errno == ECONNABORTED || errno == EINTR || errno == EPROTO) continue;
      ec.assign(errno, beast::system_category());
    }
    if (ec) {
      // Out of descriptors or memory: try again shortly rather than spin on the error.
      std::fprintf(stderr, "bus::http: accept failed: %s\n", ec.message().c_str());
      auto& retry = tls ? tls_accept_retry_ : accept_retry_;
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this, &acceptor, tls](beast::error_code e) {
        if (!e && acceptor.is_open()) accept(acceptor, tls);
      });
      return;
    }
    accept(acceptor, tls);
  });
}

void IoThread::admit(int fd, bool tls) {
  if (server.open.fetch_add(1, std::memory_order_relaxed) >= server.options.max_connections()) {
    server.open.fetch_sub(1, std::memory_order_relaxed);
    if (!tls) return refuse(fd);
    bump(io.refused);  // a 503 in plain text would be garbage to a TLS client: just closed
    ::close(fd);
  } else {
    bump(io.accepted);
    std::make_shared<Session>(*this, fd, tls ? tls_context->native_handle() : nullptr)->start();
  }
}

void IoThread::refuse(int fd) {
  static const std::string kRefusal = [] {
    Reply r = Reply::error(503, "unavailable", "too many connections; try again later");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body;
  }();
  bump(io.refused);
  auto s = std::make_shared<tcp::socket>(adopt(ioc, fd));
  if (!s->is_open()) return;
  asio::async_write(*s, asio::buffer(kRefusal), [s](beast::error_code, std::size_t) {
    beast::error_code ignored;
    s->shutdown(tcp::socket::shutdown_send, ignored);
    s->close(ignored);
  });
}

bool IoThread::watch(int fd, Session* s) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = s;
  return ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

void IoThread::unwatch(int fd) {
  if (poller_) ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_DEL, fd, nullptr);
}

void IoThread::wait_for_connections() {
  // Asio re-arms its registration of the poller for each wait, which also reports events this
  // round left in the poller.
  poller_->async_wait(asio::posix::stream_descriptor::wait_read, [this](beast::error_code ec) {
    if (ec) return;
    poll_connections();
    wait_for_connections();
  });
}

void IoThread::poll_connections() {
  // A round is short: its requests go to the executors together when it ends (batch_round), and
  // their replies are sent between rounds. 256 events per round kept requests 9 ms on average
  // at 10,000 busy connections on one core shared with the executor; 32 kept them under 1 ms.
  std::array<epoll_event, kRound> events;
  int n = ::epoll_wait(poller_->native_handle(), events.data(), kRound, 0);
  // Replies first, every round: the eventfd's event may wait behind thousands of connection
  // events in the poller's ready list, and the answers to the last round's requests are usually
  // here already (the executor ran when that round's batch woke it). That drain also answers the
  // eventfd's own event, when this round holds it.
  if (inbox_ && n > 0) {
    inbox_->drain();  // replies: their Responders start the writes
    arm_bus_timer();
  }
  // A session closed while this round runs stays alive until the round's end (Session::close).
  for (int i = 0; i < n; ++i) {
    if (auto* s = static_cast<Session*>(events[i].data.ptr)) s->on_events(events[i].events);
  }
}

bool IoThread::admit(Session& s) {
  // Behind the waiting ones, if any: turns are taken in order.
  if (in_flight_ < server.options.max_in_flight() && waiting_.empty()) {
    ++in_flight_;
    return true;
  }
  waiting_.push_back(s.shared_from_this());
  io.waiting.store(waiting_.size(), std::memory_order_relaxed);
  return false;
}

void IoThread::finished_one() {
  --in_flight_;
  if (waiting_.empty() || waiters_posted_) return;
  // The waiting requests go from a fresh handler, all that fit in one: a route answering at
  // once would otherwise nest a call per waiter, and a handler per waiter costs a post each.
  waiters_posted_ = true;
  asio::post(ioc, [this] {
    waiters_posted_ = false;
    while (!waiting_.empty() && in_flight_ < server.options.max_in_flight()) {
      std::shared_ptr<Session> next = std::move(waiting_.front());
      waiting_.pop_front();
      if (next->phase() != Session::Phase::kQueued) continue;  // closed while it waited
      ++in_flight_;
      next->invoke();
    }
    io.waiting.store(waiting_.size(), std::memory_order_relaxed);
  });
}

void IoThread::batch_round() {
  if (batch_) return;
  batch_.emplace(server.bus);
  // A handler posted now runs after the completions Asio already has queued (this round's
  // ready sockets), so the batch spans every request they make.
  asio::post(ioc, [this] {
    batch_.reset();  // the round's requests go to the executors, waking those that were parked
    // A woken executor waits for a CPU like any thread; when it shares this one (one core for
    // the server, or a machine busier than its cores) it would wait for this thread's time slice
    // while the round's answers wait for it. Yielding lets it run now, and the next round takes
    // its replies first. Where it has a core of its own, the call returns at once.
    if (server.options.yield_after_round()) ::sched_yield();
    arm_bus_timer();
  });
}

void IoThread::arm_bus_timer() {
  if (!inbox_) return;
  std::optional<Clock::time_point> next = inbox_->next_timer();
  if (!next || (bus_timer_at_ && *bus_timer_at_ <= *next)) return;
  bus_timer_at_ = next;
  bus_timer_.expires_at(*next);
  bus_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    bus_timer_at_.reset();
    inbox_->drain();  // request deadlines: 504s
    arm_bus_timer();
  });
}

void IoThread::sweep() {
  auto& o = server.options;
  auto period = std::min({o.read_timeout(), o.idle_timeout(), o.write_timeout()}) / 4;
  period = std::clamp<Clock::duration>(period, std::chrono::milliseconds(5),
                                       std::chrono::milliseconds(500));
  sweep_timer_.expires_after(period);
  sweep_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    Clock::time_point now = Clock::now();
    std::vector<Session*> late;
    for (Session* s : sessions) {
      if (s->deadline() && *s->deadline() <= now) late.push_back(s);
    }
    for (Session* s : late) {
      bump(io.timed_out);
      if (s->phase() == Session::Phase::kHandshake) bump(io.tls_failed);
      s->close();
    }
    sweep();
  });
}

void IoThread::begin_shutdown() {
  if (draining) return;
  draining = true;
  beast::error_code ignored;
  acceptor_.close(ignored);
  tls_acceptor_.close(ignored);
  accept_retry_.cancel();
  tls_accept_retry_.cancel();
  // Connections between requests (or in the middle of reading one, or of their handshake)
  // close now; those whose request is being answered finish it, with "Connection: close".
  for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) {
    if (s->phase() == Session::Phase::kIdle || s->phase() == Session::Phase::kReading ||
        s->phase() == Session::Phase::kHandshake) {
      s->close();
    }
  }
  close_websockets(*this, /*now=*/false);  // "going away", with a closing handshake
  grace_timer_.expires_after(server.options.grace());
  grace_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) s->close();
    close_websockets(*this, /*now=*/true);
    finish();
  });
  if (sessions.empty() && ws_sessions.empty()) finish();
}

void IoThread::forget(Session* s) {
  sessions.erase(s);
  server.open.fetch_sub(1, std::memory_order_relaxed);
  if (draining && sessions.empty() && ws_sessions.empty()) finish();
}

absl::StatusOr<PrincipalPtr> IoThread::authenticate(const bh::request<bh::string_body>& msg,
                                                    const PrincipalPtr& fallback) {
  if (!tokens) return fallback;
  auto it = msg.find(bh::field::authorization);
  if (it == msg.end()) return fallback;
  std::string_view value = view(it->value());
  // The scheme is case-insensitive (RFC 9110 §11.1); others (Basic) are the route's business.
  if (value.size() < 7 || value[6] != ' ' ||
      !absl::EqualsIgnoreCase(absl::string_view(value.data(), 6), "Bearer")) {
    return fallback;
  }
  absl::string_view token =
      absl::StripAsciiWhitespace(absl::string_view(value.data() + 7, value.size() - 7));
  return tokens->verify(std::string_view(token.data(), token.size()), ::time(nullptr));
}

const std::string& IoThread::realm() const {
  static const std::string kDefault = "bus";
  return server.jwt ? server.jwt->options().realm() : kDefault;
}

const std::string& IoThread::status_line(unsigned version, unsigned status) {
  const unsigned key = version * 1000 + status;
  if (key != status_line_key_) {
    beast::string_view reason = bh::obsolete_reason(bh::int_to_status(status));
    status_line_ = absl::StrCat("HTTP/", version / 10, ".", version % 10, " ", status, " ",
                                absl::string_view(reason.data(), reason.size()), "\r\n");
    status_line_key_ = key;
  }
  return status_line_;
}

void IoThread::finish() {
  if (finished_) return;
  finished_ = true;
  grace_timer_.cancel();
  sweep_timer_.cancel();
  bus_timer_.cancel();
  ioc.stop();
}

}  // namespace bus::http::detail
