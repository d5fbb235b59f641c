// How the HTTP server listens, how many threads serve it, and the limits it enforces.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bus/http/auth.hpp"

namespace bus::net {
class Node;
}

namespace bus::http {

/// HTTPS (and WSS): a TLS listener of its own, beside the plain one or instead of it
/// (ServerOptions::plain(false)). TLS 1.2 and 1.3 only, ALPN "http/1.1"; certificates are PEM
/// files, read again by Server::reload_tls() (SIGHUP under run_until_signal()).
///   bus::http::TlsOptions().port(8443).certificate_chain("fullchain.pem").private_key("key.pem")
class TlsOptions {
 public:
  /// The TLS port; 0 picks a free one (Server::tls_port() tells which).
  TlsOptions& port(uint16_t p) {
    port_ = p;
    return *this;
  }
  /// The server's certificate, then the intermediates that lead to a root clients trust.
  TlsOptions& certificate_chain(std::string pem_file) {
    certificate_chain_ = std::move(pem_file);
    return *this;
  }
  /// The certificate's private key (RSA or EC), unencrypted.
  TlsOptions& private_key(std::string pem_file) {
    private_key_ = std::move(pem_file);
    return *this;
  }
  /// mTLS: clients present a certificate issued by a CA in this file, or the handshake fails
  /// (with require_client_certificate(false), one without a certificate is let in, one with a
  /// bad certificate is not). The certificate's subject becomes the request's principal.
  TlsOptions& client_ca(std::string pem_file) {
    client_ca_ = std::move(pem_file);
    return *this;
  }
  TlsOptions& require_client_certificate(bool r) {
    require_client_certificate_ = r;
    return *this;
  }
  /// The TLS 1.2 cipher suites, in OpenSSL's syntax (TLS 1.3's are OpenSSL's defaults).
  /// Default: ECDHE with AES-GCM or ChaCha20-Poly1305 (Mozilla's "intermediate").
  TlsOptions& ciphers(std::string list) {
    ciphers_ = std::move(list);
    return *this;
  }

  uint16_t port() const { return port_; }
  const std::string& certificate_chain() const { return certificate_chain_; }
  const std::string& private_key() const { return private_key_; }
  const std::string& client_ca() const { return client_ca_; }
  bool require_client_certificate() const { return require_client_certificate_; }
  const std::string& ciphers() const { return ciphers_; }

 private:
  uint16_t port_ = 0;
  std::string certificate_chain_;
  std::string private_key_;
  std::string client_ca_;
  bool require_client_certificate_ = true;
  std::string ciphers_ =
      "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
      "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
};

/// Cross-origin requests from browsers (the Fetch standard's CORS): which origins may call the
/// server, with which methods and headers. The WebSocket bridge checks a browser's Origin
/// against the same list.
///   bus::http::CorsOptions().allow_origin("https://app.example").allow_credentials(true)
class CorsOptions {
 public:
  /// An origin ("https://app.example", scheme://host[:port] as a browser sends it), or "*" for
  /// any (not with credentials: then the caller's origin is echoed instead).
  CorsOptions& allow_origin(std::string origin) {
    origins_.push_back(std::move(origin));
    return *this;
  }
  /// Request headers a page may send (preflight's Access-Control-Allow-Headers); default
  /// "Authorization, Content-Type".
  CorsOptions& allow_headers(std::string comma_separated) {
    allow_headers_ = std::move(comma_separated);
    return *this;
  }
  /// Response headers a page may read beyond the simple ones (e.g. "WWW-Authenticate,
  /// Retry-After"); default none.
  CorsOptions& expose_headers(std::string comma_separated) {
    expose_headers_ = std::move(comma_separated);
    return *this;
  }
  /// Whether pages may send cookies or HTTP authentication (Access-Control-Allow-Credentials).
  CorsOptions& allow_credentials(bool c) {
    allow_credentials_ = c;
    return *this;
  }
  /// How long a browser may keep a preflight's answer (default 10 minutes).
  CorsOptions& max_age(std::chrono::seconds s) {
    max_age_ = s;
    return *this;
  }

  const std::vector<std::string>& origins() const { return origins_; }
  const std::string& allow_headers() const { return allow_headers_; }
  const std::string& expose_headers() const { return expose_headers_; }
  bool allow_credentials() const { return allow_credentials_; }
  std::chrono::seconds max_age() const { return max_age_; }

 private:
  std::vector<std::string> origins_;
  std::string allow_headers_ = "Authorization, Content-Type";
  std::string expose_headers_;
  bool allow_credentials_ = false;
  std::chrono::seconds max_age_{600};
};

/// The OpenAPI 3.1 document the server publishes, generated from its routes and their Cap'n Proto
/// schemas (docs/http.md, "OpenAPI"):
///   bus::http::OpenApiOptions().title("Orders").version("2.1.0")
class OpenApiOptions {
 public:
  /// Where it is served (default "/openapi.json"); "" serves none (Server::openapi() still has it).
  OpenApiOptions& path(std::string p) {
    path_ = std::move(p);
    return *this;
  }
  /// info.title, info.version (the API's version, not OpenAPI's) and info.description.
  OpenApiOptions& title(std::string t) {
    title_ = std::move(t);
    return *this;
  }
  OpenApiOptions& version(std::string v) {
    version_ = std::move(v);
    return *this;
  }
  OpenApiOptions& description(std::string d) {
    description_ = std::move(d);
    return *this;
  }
  /// A base URL callers reach the server at ("https://api.example.com/v1"), with what it is;
  /// call again for more. None: "/", the host the document was fetched from.
  OpenApiOptions& server(std::string url, std::string description = "") {
    servers_.push_back({std::move(url), std::move(description)});
    return *this;
  }
  struct Server {
    std::string url;
    std::string description;
  };

  const std::string& path() const { return path_; }
  const std::string& title() const { return title_; }
  const std::string& version() const { return version_; }
  const std::string& description() const { return description_; }
  const std::vector<Server>& servers() const { return servers_; }

 private:
  std::string path_ = "/openapi.json";
  std::string title_ = "bus HTTP endpoint";
  std::string version_ = "1.0.0";
  std::string description_;
  std::vector<Server> servers_;
};

/// Server parameters, with fluent setters:
///   bus::http::ServerOptions().port(8080).io_threads(2).deadline(std::chrono::seconds(2))
class ServerOptions {
 public:
  using Duration = std::chrono::steady_clock::duration;

  /// The address to listen on (default 127.0.0.1; "0.0.0.0" or "::" for every interface).
  ServerOptions& address(std::string a) {
    address_ = std::move(a);
    return *this;
  }
  /// The port; 0 picks a free one (Server::port() tells which).
  ServerOptions& port(uint16_t p) {
    port_ = p;
    return *this;
  }
  /// I/O threads, each with its own io_context, listening socket (SO_REUSEPORT: the kernel
  /// spreads connections) and bus inbox for the replies.
  ServerOptions& io_threads(unsigned n) {
    io_threads_ = n == 0 ? 1 : n;
    return *this;
  }
  /// Open connections allowed; one more is answered 503 and closed.
  ServerOptions& max_connections(std::size_t n) {
    max_connections_ = n;
    return *this;
  }
  /// Requests one I/O thread has handed to routes and not yet answered; more wait their turn
  /// in order (their connections are not read meanwhile). It bounds the thread's rings to the
  /// executors: keep it under ring_bytes / ~200 bytes per request record.
  ServerOptions& max_in_flight(std::size_t n) {
    max_in_flight_ = n == 0 ? 1 : n;
    return *this;
  }
  /// Whether an I/O thread yields its CPU after each round that handed requests to the bus
  /// (default true), so that an executor it woke on this CPU answers before the thread reads
  /// more. Turn it off when every executor has a core of its own.
  ServerOptions& yield_after_round(bool y) {
    yield_after_round_ = y;
    return *this;
  }
  /// Request line plus headers (431 beyond), and body (413 beyond).
  ServerOptions& max_header_bytes(std::size_t n) {
    max_header_bytes_ = n;
    return *this;
  }
  ServerOptions& max_body_bytes(std::size_t n) {
    max_body_bytes_ = n;
    return *this;
  }
  /// Once a request's first byte arrives, the whole request must arrive within this (a client
  /// trickling its headers is closed).
  ServerOptions& read_timeout(Duration d) {
    read_timeout_ = d;
    return *this;
  }
  /// A keep-alive connection with no request for this long is closed.
  ServerOptions& idle_timeout(Duration d) {
    idle_timeout_ = d;
    return *this;
  }
  /// A response the client does not take within this is abandoned and the connection closed.
  ServerOptions& write_timeout(Duration d) {
    write_timeout_ = d;
    return *this;
  }
  /// The deadline of a route's bus request unless the route sets its own (504 past it).
  ServerOptions& deadline(Duration d) {
    deadline_ = d;
    return *this;
  }
  /// How long shutdown waits for requests in flight before it closes their connections.
  ServerOptions& grace(Duration d) {
    grace_ = d;
    return *this;
  }
  /// How long /health waits for each executor to answer its probe.
  ServerOptions& health_timeout(Duration d) {
    health_timeout_ = d;
    return *this;
  }
  /// Serves HTTPS too (or only, with plain(false)): see TlsOptions.
  ServerOptions& tls(TlsOptions t) {
    tls_ = std::move(t);
    return *this;
  }
  /// Accepts bearer JWTs: a request with a valid one carries its principal to the handler, one
  /// with an invalid one is answered 401; routes say what they require (Route::require).
  ServerOptions& jwt(JwtOptions j) {
    jwt_ = std::move(j);
    return *this;
  }
  /// Answers CORS: see CorsOptions. Without it no response carries CORS headers, preflights are
  /// plain OPTIONS, and the WebSocket bridge takes browsers from its own origin only.
  ServerOptions& cors(CorsOptions c) {
    cors_ = std::move(c);
    return *this;
  }
  /// The OpenAPI document's title, version and path (served by default at /openapi.json).
  ServerOptions& openapi(OpenApiOptions o) {
    openapi_ = std::move(o);
    return *this;
  }
  /// Whether the plain HTTP listener (port()) runs; default true.
  ServerOptions& plain(bool p) {
    plain_ = p;
    return *this;
  }
  /// A bridge node whose peers /health and /metrics report. It must outlive the server.
  ServerOptions& node(const net::Node* n) {
    node_ = n;
    return *this;
  }

  const std::string& address() const { return address_; }
  uint16_t port() const { return port_; }
  unsigned io_threads() const { return io_threads_; }
  std::size_t max_connections() const { return max_connections_; }
  std::size_t max_in_flight() const { return max_in_flight_; }
  bool yield_after_round() const { return yield_after_round_; }
  std::size_t max_header_bytes() const { return max_header_bytes_; }
  std::size_t max_body_bytes() const { return max_body_bytes_; }
  Duration read_timeout() const { return read_timeout_; }
  Duration idle_timeout() const { return idle_timeout_; }
  Duration write_timeout() const { return write_timeout_; }
  Duration deadline() const { return deadline_; }
  Duration grace() const { return grace_; }
  Duration health_timeout() const { return health_timeout_; }
  const net::Node* node() const { return node_; }
  const std::optional<TlsOptions>& tls() const { return tls_; }
  const std::optional<JwtOptions>& jwt() const { return jwt_; }
  const std::optional<CorsOptions>& cors() const { return cors_; }
  const OpenApiOptions& openapi() const { return openapi_; }
  bool plain() const { return plain_; }

 private:
  std::string address_ = "127.0.0.1";
  uint16_t port_ = 0;
  unsigned io_threads_ = 1;
  std::size_t max_connections_ = 10'000;
  std::size_t max_in_flight_ = 256;
  bool yield_after_round_ = true;
  std::size_t max_header_bytes_ = 8 * 1024;
  std::size_t max_body_bytes_ = 1024 * 1024;
  Duration read_timeout_ = std::chrono::seconds(10);
  Duration idle_timeout_ = std::chrono::seconds(60);
  Duration write_timeout_ = std::chrono::seconds(30);
  Duration deadline_ = std::chrono::seconds(5);
  Duration grace_ = std::chrono::seconds(10);
  Duration health_timeout_ = std::chrono::seconds(1);
  const net::Node* node_ = nullptr;
  std::optional<TlsOptions> tls_;
  std::optional<JwtOptions> jwt_;
  std::optional<CorsOptions> cors_;
  OpenApiOptions openapi_;
  bool plain_ = true;
};

}  // namespace bus::http
