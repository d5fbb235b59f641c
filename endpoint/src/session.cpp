// Connections of the HTTP server: their sockets (plain or TLS), reading a request with
// Boost.Beast's parser, writing its response. What answers a request is request_phases.cpp's.
#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
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

/// Connection-level failures end the connection quietly; HTTP parse errors are answered 400.
bool is_http_error(const beast::error_code& ec) {
  return ec.category() == bh::make_error_code(bh::error::bad_target).category();
}

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

}  // namespace

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

}  // namespace bus::http::detail
