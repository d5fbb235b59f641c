// The test client: POSIX blocking sockets with timeouts; Beast's response parser reads the
// responses (so a malformed response from the server is an error here, not a silent pass).
#include "client.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <thread>

namespace http_test {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = boost::beast::http;
using Ms = std::chrono::milliseconds;
using SteadyClock = std::chrono::steady_clock;

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

void set_timeouts(int fd, Ms timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

sockaddr_in loopback(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int remaining_ms(SteadyClock::time_point deadline) {
  auto left = std::chrono::duration_cast<Ms>(deadline - SteadyClock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

}  // namespace

std::optional<std::string> Response::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return std::nullopt;
}

// ==== Connection
// =================================================================================

Connection::Connection(uint16_t port, Ms timeout) : timeout_(timeout) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    connect_error_ = std::string("socket: ") + std::strerror(errno);
    return;
  }
  set_timeouts(fd_, timeout);
  int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in a = loopback(port);
  int rc;
  do {
    rc = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) connect_error_ = std::string("connect: ") + std::strerror(errno);
}

Connection::Connection(uint16_t port, const Tls& tls, Ms timeout) : Connection(port, timeout) {
  if (!connected()) return;
  auto fail = [&](const std::string& what) {
    std::string why;
    while (unsigned long e = ERR_get_error()) {
      char text[256];
      ERR_error_string_n(e, text, sizeof text);
      why += std::string(why.empty() ? "" : "; ") + text;
    }
    connect_error_ = what + (why.empty() ? "" : ": " + why);
  };
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  tls_ctx_ = ctx;
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (SSL_CTX_load_verify_locations(ctx, tls.ca_file.c_str(), nullptr) != 1) {
    fail("cannot load " + tls.ca_file);
    return;
  }
  if (!tls.cert_file.empty() &&
      (SSL_CTX_use_certificate_chain_file(ctx, tls.cert_file.c_str()) != 1 ||
       SSL_CTX_use_PrivateKey_file(ctx, tls.key_file.c_str(), SSL_FILETYPE_PEM) != 1)) {
    fail("cannot load " + tls.cert_file);
    return;
  }
  if (!tls.alpn.empty()) {
    std::string wire;  // length-prefixed protocol names
    std::size_t at = 0;
    while (at <= tls.alpn.size()) {
      std::size_t end = std::min(tls.alpn.find(',', at), tls.alpn.size());
      wire += static_cast<char>(end - at);
      wire += tls.alpn.substr(at, end - at);
      at = end + 1;
    }
    SSL_CTX_set_alpn_protos(ctx, reinterpret_cast<const unsigned char*>(wire.data()),
                            static_cast<unsigned>(wire.size()));
  }
  SSL* ssl = SSL_new(ctx);
  ssl_ = ssl;
  SSL_set_tlsext_host_name(ssl, tls.host.c_str());
  SSL_set1_host(ssl, tls.host.c_str());
  SSL_set_fd(ssl, fd_);
  if (SSL_connect(ssl) != 1) fail("TLS handshake failed");
}

std::string Connection::peer_subject() const {
  if (ssl_ == nullptr) return {};
  X509* cert = SSL_get0_peer_certificate(static_cast<SSL*>(ssl_));
  if (cert == nullptr) return {};
  char name[256];
  X509_NAME_oneline(X509_get_subject_name(cert), name, sizeof name);
  return name;
}

std::string Connection::alpn() const {
  if (ssl_ == nullptr) return {};
  const unsigned char* p = nullptr;
  unsigned n = 0;
  SSL_get0_alpn_selected(static_cast<const SSL*>(ssl_), &p, &n);
  return std::string(reinterpret_cast<const char*>(p), n);
}

long Connection::receive(char* buf, std::size_t size) {
  if (ssl_ == nullptr) return ::recv(fd_, buf, size, 0);
  int n = SSL_read(static_cast<SSL*>(ssl_), buf, static_cast<int>(size));
  if (n > 0) return n;
  int e = SSL_get_error(static_cast<SSL*>(ssl_), n);
  ERR_clear_error();
  if (e == SSL_ERROR_ZERO_RETURN) return 0;
  if (e == SSL_ERROR_SYSCALL && (errno == 0 || errno == ECONNRESET || errno == EPIPE)) return 0;
  if (e == SSL_ERROR_SSL) return 0;  // an alert: the server ended the connection
  return -1;                         // the receive timeout
}

Connection::Connection(Connection&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)),
      tls_ctx_(std::exchange(o.tls_ctx_, nullptr)),
      ssl_(std::exchange(o.ssl_, nullptr)),
      connect_error_(std::move(o.connect_error_)),
      pending_(std::move(o.pending_)),
      peer_closed_(o.peer_closed_),
      timeout_(o.timeout_) {}

Connection::~Connection() { close(); }

void Connection::close() {
  if (ssl_ != nullptr) SSL_free(static_cast<SSL*>(ssl_));
  if (tls_ctx_ != nullptr) SSL_CTX_free(static_cast<SSL_CTX*>(tls_ctx_));
  ssl_ = tls_ctx_ = nullptr;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void Connection::shutdown_send() {
  if (fd_ >= 0) ::shutdown(fd_, SHUT_WR);
}

uint16_t Connection::local_port() const {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (fd_ < 0 || ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) != 0) return 0;
  return ntohs(a.sin_port);
}

bool Connection::send(const RequestSpec& req) {
  std::string out = req.method + " " + req.target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_length = false;
  for (const auto& [k, v] : req.headers) {
    out += k + ": " + v + "\r\n";
    has_length = has_length || iequals(k, "Content-Length") || iequals(k, "Transfer-Encoding");
  }
  bool wants_length =
      !req.body.empty() || req.method == "POST" || req.method == "PUT" || req.method == "PATCH";
  if (wants_length && !has_length)
    out += "Content-Length: " + std::to_string(req.body.size()) + "\r\n";
  out += "\r\n";
  out += req.body;
  return write_raw(out);
}

bool Connection::send(std::string method, std::string target, std::string body, Headers headers) {
  return send(
      RequestSpec{std::move(method), std::move(target), std::move(body), std::move(headers)});
}

Response Connection::request(const RequestSpec& req) {
  if (!send(req)) {
    Response r;
    r.error =
        "the request could not be written" + (connect_error_.empty() ? "" : ": " + connect_error_);
    return r;
  }
  return read(req.method == "HEAD");
}

Response Connection::request(std::string method, std::string target, std::string body,
                             Headers headers) {
  return request(
      RequestSpec{std::move(method), std::move(target), std::move(body), std::move(headers)});
}

long Connection::fill() {
  if (fd_ < 0) return -1;
  char buf[64 * 1024];
  for (;;) {
    ssize_t n = receive(buf, sizeof buf);
    if (n > 0) {
      pending_.append(buf, static_cast<std::size_t>(n));
      return n;
    }
    if (n == 0) {
      peer_closed_ = true;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == ECONNRESET || errno == EPIPE) {
      peer_closed_ = true;
      return 0;
    }
    return -1;  // EAGAIN: the receive timeout
  }
}

Response Connection::read(bool head) {
  Response out;
  if (!connected()) {
    out.error = "not connected: " + connect_error_;
    return out;
  }
  bh::response_parser<bh::string_body> parser;
  parser.header_limit(1 << 20);
  parser.body_limit(64 * 1024 * 1024);
  parser.eager(true);
  if (head) parser.skip(true);
  for (;;) {
    if (!pending_.empty()) {
      beast::error_code ec;
      std::size_t used = parser.put(asio::buffer(pending_.data(), pending_.size()), ec);
      pending_.erase(0, used);
      if (ec && ec != bh::error::need_more) {
        out.error = "malformed response: " + ec.message();
        return out;
      }
      if (parser.is_done()) break;
      if (used > 0 && !pending_.empty()) continue;
    }
    long n = peer_closed_ ? 0 : fill();
    if (n == 0) {
      // Beast's put_eof completes a parser that has seen nothing: check got_some() first.
      beast::error_code ec;
      if (parser.got_some()) parser.put_eof(ec);
      if (parser.got_some() && !ec && parser.is_done()) break;
      out.error = pending_.empty() && !parser.got_some()
                      ? "the server closed the connection"
                      : "the server closed the connection mid-response";
      return out;
    }
    if (n < 0) {
      out.error =
          std::string("no response within the receive timeout (") + std::strerror(errno) + ")";
      return out;
    }
  }
  auto& msg = parser.get();
  out.status = msg.result_int();
  out.reason = std::string(msg.reason());
  for (const auto& f : msg)
    out.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
  out.body = std::move(msg.body());
  return out;
}

bool Connection::write_raw(std::string_view bytes) {
  if (fd_ < 0) return false;
  while (!bytes.empty()) {
    ssize_t n = ssl_ != nullptr ? SSL_write(static_cast<SSL*>(ssl_), bytes.data(),
                                            static_cast<int>(bytes.size()))
                                : ::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (ssl_ != nullptr && n <= 0) {
      ERR_clear_error();
      peer_closed_ = true;
      return false;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) peer_closed_ = true;
      return false;
    }
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

bool Connection::write_slowly(std::string_view bytes, Ms gap, std::size_t chunk) {
  chunk = std::max<std::size_t>(chunk, 1);
  while (!bytes.empty()) {
    // Has the server closed already? Take what it sent, see the end of stream.
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
      char buf[4096];
      ssize_t n = ::recv(fd_, buf, sizeof buf, MSG_DONTWAIT);
      if (n > 0) pending_.append(buf, static_cast<std::size_t>(n));
      if (n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE))) {
        peer_closed_ = true;
        return false;
      }
    }
    std::size_t k = std::min(chunk, bytes.size());
    if (!write_raw(bytes.substr(0, k))) return false;
    bytes.remove_prefix(k);
    if (!bytes.empty()) std::this_thread::sleep_for(gap);
  }
  return true;
}

bool Connection::closed_by_peer(Ms bound) {
  auto deadline = SteadyClock::now() + bound;
  while (!peer_closed_) {
    if (fd_ < 0) return false;
    pollfd p{fd_, POLLIN | POLLRDHUP, 0};
    int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return false;  // still open at the bound
    if (fill() < 0 && SteadyClock::now() >= deadline) return false;
  }
  return true;
}

std::string Connection::read_all(Ms bound) {
  closed_by_peer(bound);
  return pending_;
}

// ==== helpers
// ====================================================================================

Response request(uint16_t port, const RequestSpec& req) {
  Connection c(port);
  if (!c.connected()) {
    Response r;
    r.error = c.connect_error();
    return r;
  }
  return c.request(req);
}

Response get(uint16_t port, std::string target) {
  return request(port, RequestSpec{"GET", std::move(target), {}, {}});
}

bool can_connect(uint16_t port) {
  Connection c(port, Ms(5000));
  return c.connected();
}

PortHolder::PortHolder(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a = loopback(port);
  if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::listen(fd_, 16) != 0) {
    return;
  }
  socklen_t len = sizeof a;
  if (::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) port_ = ntohs(a.sin_port);
}

PortHolder::~PortHolder() {
  if (fd_ >= 0) ::close(fd_);
}

uint64_t raise_fd_limit() {
  rlimit r{};
  if (::getrlimit(RLIMIT_NOFILE, &r) != 0) return 0;
  if (r.rlim_cur < r.rlim_max) {
    r.rlim_cur = r.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &r);
    ::getrlimit(RLIMIT_NOFILE, &r);
  }
  return static_cast<uint64_t>(r.rlim_cur);
}

}  // namespace http_test
