// TLS on the HTTP server's connections. Contexts are made (and made again on reload) through
// Asio's ssl::context; a connection is an OpenSSL SSL object on the socket itself, driven with
// non-blocking calls by its I/O thread's connection poller, like the plain ones. Not
// asio::ssl::stream: it holds two 17 KiB buffers and a 2 x 17 KiB BIO pair per connection, every
// byte copied through them, which 10,000 connections cannot afford (docs/http.md); an SSL with
// SSL_MODE_RELEASE_BUFFERS holds its buffers only while a record is in them.
#pragma once

#include <openssl/ssl.h>

#include <boost/asio/compose.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/beast/core/buffers_prefix.hpp>
#include <boost/beast/core/error.hpp>
#include <boost/beast/core/role.hpp>
#include <memory>
#include <string>
#include <utility>

#include "bus/http/options.hpp"

namespace bus::http::detail {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

/// A connection's socket with its edge-triggered readiness as last seen. `edges`: readiness
/// comes from the I/O thread's connection poller (a read that finds less than it asked for
/// means the socket is drained until the next edge); without it every call tries the socket.
struct PolledSocket {
  int fd = -1;
  bool edges = true;
  bool readable = false;
  bool writable = true;
  bool peer_closed = false;  // EPOLLRDHUP/HUP seen: a read will find the end
};

/// Gives `ssl` a BIO over `socket` (which must outlive it): recv and send(MSG_NOSIGNAL: a peer
/// gone is an error, not SIGPIPE), keeping `socket`'s readiness as the plain connections do, so
/// that a TLS read costs no syscall more than a plain one.
void attach(SSL* ssl, PolledSocket* socket);

/// A server context for `o`: TLS 1.2 and 1.3, ALPN http/1.1, its certificate chain and key, and
/// with a client CA the client certificate check. Throws std::runtime_error naming the file
/// and OpenSSL's reason when one cannot be used.
std::shared_ptr<asio::ssl::context> make_tls_context(const TlsOptions& o);

/// The subject of the client's certificate when one was presented and verified
/// ("CN=alice,O=Example"), else empty.
std::string peer_subject(SSL* ssl);

/// The outcome of a non-blocking SSL_read, SSL_write or SSL_do_handshake that returned `rc`.
enum class TlsStep { kDone, kWantRead, kWantWrite, kClosed, kFailed };
TlsStep tls_step(SSL* ssl, int rc);
/// What OpenSSL says about the last failure on this thread (for a log line), and clears it.
std::string tls_error();

/// An established TLS connection as an Asio stream, for Beast's WebSocket (WSS): reads and
/// writes are OpenSSL's, retried when Asio's reactor reports the socket ready. It owns the SSL.
class TlsStream {
 public:
  using executor_type = tcp::socket::executor_type;

  /// Takes `ssl`, established on `socket`'s descriptor.
  TlsStream(tcp::socket socket, SSL* ssl)
      : socket_(std::move(socket)), ssl_(ssl), polled_(std::make_unique<PolledSocket>()) {
    polled_->fd = socket_.native_handle();
    polled_->edges = false;  // Asio's reactor says when to try again
    attach(ssl_, polled_.get());
  }
  TlsStream(TlsStream&& o) noexcept
      : socket_(std::move(o.socket_)),
        ssl_(std::exchange(o.ssl_, nullptr)),
        polled_(std::move(o.polled_)),
        gathered_(std::move(o.gathered_)) {}
  TlsStream& operator=(TlsStream&&) = delete;
  ~TlsStream() {
    if (ssl_ != nullptr) SSL_free(ssl_);
  }

  executor_type get_executor() { return socket_.get_executor(); }
  tcp::socket& socket() { return socket_; }
  SSL* ssl() const { return ssl_; }

  template <class Buffers, class Token>
  auto async_read_some(const Buffers& buffers, Token&& token) {
    return asio::async_compose<Token, void(beast::error_code, std::size_t)>(
        Op<Buffers, false>(this, buffers), token, socket_);
  }
  template <class Buffers, class Token>
  auto async_write_some(const Buffers& buffers, Token&& token) {
    return asio::async_compose<Token, void(beast::error_code, std::size_t)>(
        Op<Buffers, true>(this, buffers), token, socket_);
  }

  /// Sends close_notify if the socket takes it now (the WebSocket closing handshake is done),
  /// then closes the socket.
  void close();

 private:
  /// One read or write: tried at once, then again each time the socket is ready for what
  /// OpenSSL wants (a read may need to write, during a key update, and the other way round).
  template <class Buffers, bool kWrite>
  struct Op {
    Op(TlsStream* s, const Buffers& b) : stream(s), buffers(b) {}
    TlsStream* stream;
    Buffers buffers;
    bool started = false;
    bool deliver = false;  // the result is known: complete from a fresh handler
    beast::error_code result;
    std::size_t done = 0;

    template <class Self>
    void operator()(Self& self, beast::error_code ec = {}, std::size_t = 0) {
      if (deliver) return self.complete(result, done);
      if (ec) return self.complete(ec, 0);
      bool first = !started;
      started = true;
      int rc = 0;
      if (asio::buffer_size(buffers) > 0) {
        if constexpr (kWrite) {
          rc = stream->write_some(buffers);
        } else {
          rc = stream->read_some(buffers);
        }
      }
      if (rc > 0 || asio::buffer_size(buffers) == 0) {
        done = static_cast<std::size_t>(std::max(rc, 0));
      } else {
        switch (tls_step(stream->ssl_, rc)) {
          case TlsStep::kWantRead:
            return stream->socket_.async_wait(tcp::socket::wait_read, std::move(self));
          case TlsStep::kWantWrite:
            return stream->socket_.async_wait(tcp::socket::wait_write, std::move(self));
          case TlsStep::kClosed: result = asio::error::eof; break;
          case TlsStep::kDone:
          case TlsStep::kFailed: result = asio::error::connection_reset; break;
        }
      }
      // Asio's rule: a completion never runs inside the call that started the operation.
      if (first) {
        deliver = true;
        return asio::post(stream->socket_.get_executor(), std::move(self));
      }
      self.complete(result, done);
    }
  };

  /// One SSL_read into the front of `buffers`.
  template <class Buffers>
  int read_some(const Buffers& buffers) {
    asio::mutable_buffer b = beast::buffers_front(buffers);
    return SSL_read(ssl_, b.data(), static_cast<int>(std::min<std::size_t>(b.size(), 1 << 30)));
  }
  /// One SSL_write of up to 16 KiB of `buffers`, gathered first: one record for a WebSocket
  /// frame's header and payload, not two.
  template <class Buffers>
  int write_some(const Buffers& buffers) {
    if (gathered_.empty()) {
      // A retried write passes the same bytes (OpenSSL requires it).
      gathered_.resize(std::min<std::size_t>(asio::buffer_size(buffers), kMaxRecord));
      asio::buffer_copy(asio::buffer(gathered_), buffers);
    }
    int rc = SSL_write(ssl_, gathered_.data(), static_cast<int>(gathered_.size()));
    if (rc > 0) gathered_.clear();
    return rc;
  }
  static constexpr std::size_t kMaxRecord = 16 * 1024;

  tcp::socket socket_;
  SSL* ssl_;
  std::unique_ptr<PolledSocket> polled_;  // the BIO's, at a fixed address
  std::string gathered_;                  // a write's bytes until OpenSSL takes them
};

// Beast's customization points for a WebSocket over a TlsStream.
void beast_close_socket(TlsStream& s);
void teardown(beast::role_type, TlsStream& s, beast::error_code& ec);
template <class Handler>
void async_teardown(beast::role_type, TlsStream& s, Handler&& handler) {
  s.close();
  asio::post(s.get_executor(),
             [h = std::forward<Handler>(handler)]() mutable { h(beast::error_code()); });
}

}  // namespace bus::http::detail
