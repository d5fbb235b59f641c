// A small blocking HTTP/1.1 client for the endpoint tests. Boost.Beast stays in client.cpp (it
// costs seconds per translation unit): tests include this header only.
//
// Every socket has a receive and send timeout, so a test whose server misbehaves fails instead
// of hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace http_test {

using Headers = std::vector<std::pair<std::string, std::string>>;

/// One response as read off the wire. `status` is 0 when none could be read (the connection
/// closed, the receive timed out, or the bytes were not HTTP); `error` then says why.
struct Response {
  unsigned status = 0;
  std::string reason;
  Headers headers;
  std::string body;
  std::string error;

  /// A header's value (case-insensitive name); the first one if it repeats.
  std::optional<std::string> header(std::string_view name) const;
  bool has_header(std::string_view name) const { return header(name).has_value(); }
};

/// One request. Host is added; Content-Length is added when there is a body (or the method is
/// POST, PUT or PATCH) unless `headers` sets it.
struct RequestSpec {
  std::string method = "GET";
  std::string target = "/";
  std::string body;
  Headers headers;
};

/// A TLS client's settings (OpenSSL, verifying the server's certificate and host name).
struct Tls {
  std::string ca_file;             // the CA that must have issued the server's certificate
  std::string host = "localhost";  // SNI, and the name the certificate must hold
  std::string cert_file;           // a client certificate (mTLS), with key_file
  std::string key_file;
  std::string alpn = "http/1.1";  // offered protocols, comma-separated; "" offers none
};

/// A keep-alive connection to 127.0.0.1:port, with blocking sockets and a receive timeout.
class Connection {
 public:
  explicit Connection(uint16_t port,
                      std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));
  /// Over TLS: connected() is false when the handshake failed (connect_error() says why).
  Connection(uint16_t port, const Tls& tls,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(20000));
  Connection(Connection&& o) noexcept;
  Connection& operator=(Connection&&) = delete;
  Connection(const Connection&) = delete;
  ~Connection();

  /// False when the connect failed (refused, ...).
  bool connected() const { return fd_ >= 0 && connect_error_.empty(); }
  const std::string& connect_error() const { return connect_error_; }
  /// The client side's port: the same value across requests means the same TCP connection.
  uint16_t local_port() const;
  /// TLS: the server certificate's subject ("CN=localhost") and the protocol ALPN chose.
  std::string peer_subject() const;
  std::string alpn() const;

  /// Writes one request (does not read). Several sends in a row pipeline them.
  bool send(const RequestSpec& req);
  bool send(std::string method, std::string target, std::string body = {}, Headers headers = {});
  /// Reads one response. `head`: it answers a HEAD request (headers only, whatever
  /// Content-Length says).
  Response read(bool head = false);
  /// send() then read().
  Response request(const RequestSpec& req);
  Response request(std::string method, std::string target, std::string body = {},
                   Headers headers = {});

  // ---- raw mode ------------------------------------------------------------------------------

  /// Writes bytes as they are. False if the server closed the connection (or the write failed).
  bool write_raw(std::string_view bytes);
  /// Writes `bytes` `chunk` bytes at a time with `gap` between writes; stops early (false) once
  /// the server has closed the connection.
  bool write_slowly(std::string_view bytes, std::chrono::milliseconds gap, std::size_t chunk = 1);
  /// True once the server has closed its side (a read sees end of stream or a reset) within
  /// `bound`; whatever it sent first is appended to `received()`.
  bool closed_by_peer(std::chrono::milliseconds bound = std::chrono::milliseconds(20000));
  /// Reads until the server closes or `bound` passes; returns what was read (also kept in
  /// received()).
  std::string read_all(std::chrono::milliseconds bound = std::chrono::milliseconds(20000));
  /// Bytes read in raw mode (and bytes read ahead of the last parsed response).
  const std::string& received() const { return pending_; }

  /// Closes the client side.
  void close();
  /// Ends what the client sends (a FIN) and keeps reading.
  void shutdown_send();

 private:
  /// Reads more bytes into pending_: >0 read, 0 end of stream, -1 error or timeout.
  long fill();

  /// Bytes read (TLS: decrypted) into buf, as recv returns them.
  long receive(char* buf, std::size_t size);

  int fd_ = -1;
  void* tls_ctx_ = nullptr;  // SSL_CTX, SSL (OpenSSL stays in client.cpp)
  void* ssl_ = nullptr;
  std::string connect_error_;
  std::string pending_;  // bytes read but not consumed by a parsed response
  bool peer_closed_ = false;
  std::chrono::milliseconds timeout_;
};

/// One request on a fresh connection.
Response request(uint16_t port, const RequestSpec& req);
Response get(uint16_t port, std::string target);

/// True if a TCP connect to 127.0.0.1:port succeeds now.
bool can_connect(uint16_t port);

/// A plain listening socket on 127.0.0.1 (no SO_REUSEPORT) holding a port; closed on
/// destruction. port 0 picks a free one.
class PortHolder {
 public:
  explicit PortHolder(uint16_t port = 0);
  ~PortHolder();
  PortHolder(const PortHolder&) = delete;
  PortHolder& operator=(const PortHolder&) = delete;
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

/// Raises RLIMIT_NOFILE's soft limit to its hard limit; returns the new soft limit.
uint64_t raise_fd_limit();

}  // namespace http_test
