#include "tls.hpp"

#include <openssl/err.h>
#include <openssl/x509.h>
#include <sys/socket.h>

#include <cerrno>
#include <stdexcept>

namespace bus::http::detail {
namespace {

/// ALPN: http/1.1 or nothing. A client that offers protocols but not this one gets the
/// no_application_protocol alert (RFC 7301 §3.2); one that offers none is served HTTP/1.1.
int select_alpn(SSL*, const unsigned char** out, unsigned char* out_len, const unsigned char* in,
                unsigned in_len, void*) {
  static const unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, out_len, kHttp11, sizeof kHttp11, in, in_len) ==
      OPENSSL_NPN_NEGOTIATED) {
    *out = chosen;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_ALERT_FATAL;
}

int bio_read(BIO* b, char* data, int len) {
  auto* s = static_cast<PolledSocket*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  if (s->edges && !s->readable) {
    BIO_set_retry_read(b);  // drained until the poller's next edge: no recv to find nothing
    return -1;
  }
  for (;;) {
    ssize_t n = ::recv(s->fd, data, static_cast<std::size_t>(len), 0);
    if (n > 0) {
      if (s->edges && n < len && !s->peer_closed) s->readable = false;
      return static_cast<int>(n);
    }
    if (n == 0) return 0;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      s->readable = false;
      BIO_set_retry_read(b);
    }
    return -1;
  }
}

int bio_write(BIO* b, const char* data, int len) {
  auto* s = static_cast<PolledSocket*>(BIO_get_data(b));
  BIO_clear_retry_flags(b);
  for (;;) {
    ssize_t n = ::send(s->fd, data, static_cast<std::size_t>(len), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      s->writable = false;
      BIO_set_retry_write(b);
    }
    return -1;
  }
}

long bio_ctrl(BIO*, int cmd, long, void*) { return cmd == BIO_CTRL_FLUSH ? 1 : 0; }

BIO_METHOD* socket_method() {
  static BIO_METHOD* method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "bus polled socket");
    BIO_meth_set_read(m, &bio_read);
    BIO_meth_set_write(m, &bio_write);
    BIO_meth_set_ctrl(m, &bio_ctrl);
    BIO_meth_set_create(m, [](BIO* b) {
      BIO_set_init(b, 1);
      return 1;
    });
    return m;
  }();
  return method;
}

}  // namespace

void attach(SSL* ssl, PolledSocket* socket) {
  BIO* bio = BIO_new(socket_method());
  BIO_set_data(bio, socket);
  SSL_set_bio(ssl, bio, bio);
}

std::string tls_error() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char text[256];
    ERR_error_string_n(e, text, sizeof text);
    if (!out.empty()) out += "; ";
    out += text;
  }
  return out.empty() ? "no OpenSSL error recorded" : out;
}

std::shared_ptr<asio::ssl::context> make_tls_context(const TlsOptions& o) {
  auto ctx = std::make_shared<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* native = ctx->native_handle();
  auto fail = [](const std::string& what, const std::string& why) {
    return std::runtime_error("bus::http: TLS: " + what + ": " + why);
  };
  if (o.certificate_chain().empty() || o.private_key().empty()) {
    throw fail("no certificate", "TlsOptions needs certificate_chain() and private_key()");
  }
  ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_compression |
                   asio::ssl::context::single_dh_use);
  SSL_CTX_set_min_proto_version(native, TLS1_2_VERSION);
  // A peer that closes without close_notify ends the connection as a plain one does (HTTP's
  // framing, not TLS's, says whether a message was cut).
  SSL_CTX_set_options(native, SSL_OP_NO_RENEGOTIATION | SSL_OP_IGNORE_UNEXPECTED_EOF);
  // Buffers are held only while a record is in them (an idle keep-alive connection holds
  // none); writes may be partial and retried from a moved buffer (the connection's out_ string);
  // a read takes whatever the socket has, not one record header at a time.
  SSL_CTX_set_mode(native, SSL_MODE_RELEASE_BUFFERS | SSL_MODE_ENABLE_PARTIAL_WRITE |
                               SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead(native, 1);
  if (SSL_CTX_set_cipher_list(native, o.ciphers().c_str()) != 1) {
    throw fail("ciphers '" + o.ciphers() + "'", tls_error());
  }
  boost::system::error_code ec;
  // Asio takes OpenSSL's error into `ec`: its message is the reason.
  ctx->use_certificate_chain_file(o.certificate_chain(), ec);
  if (ec) throw fail("certificate chain " + o.certificate_chain(), ec.message());
  ctx->use_private_key_file(o.private_key(), asio::ssl::context::pem, ec);
  if (ec && ec.message().find("values mismatch") != std::string::npos) {
    throw fail("private key " + o.private_key(),
               "it is not the key of the certificate in " + o.certificate_chain());
  }
  if (ec) throw fail("private key " + o.private_key(), ec.message());
  if (SSL_CTX_check_private_key(native) != 1) {
    throw fail("private key " + o.private_key(),
               "it is not the key of the certificate in " + o.certificate_chain());
  }
  SSL_CTX_set_alpn_select_cb(native, &select_alpn, nullptr);
  static const unsigned char kSessionContext[] = "bus-http";
  SSL_CTX_set_session_id_context(native, kSessionContext, sizeof kSessionContext - 1);
  if (!o.client_ca().empty()) {
    ctx->load_verify_file(o.client_ca(), ec);
    if (ec) throw fail("client CA " + o.client_ca(), ec.message());
    // The CAs the server names in its certificate request, so a client picks a fitting one.
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(o.client_ca().c_str());
    if (names == nullptr) throw fail("client CA " + o.client_ca(), tls_error());
    SSL_CTX_set_client_CA_list(native, names);
    auto mode = asio::ssl::verify_peer;
    if (o.require_client_certificate()) mode |= asio::ssl::verify_fail_if_no_peer_cert;
    ctx->set_verify_mode(mode);
  }
  ERR_clear_error();
  return ctx;
}

std::string peer_subject(SSL* ssl) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return {};
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return {};
  X509_NAME_print_ex(bio, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  long n = BIO_get_mem_data(bio, &data);
  std::string out(data, n > 0 ? static_cast<std::size_t>(n) : 0);
  BIO_free(bio);
  return out;
}

TlsStep tls_step(SSL* ssl, int rc) {
  if (rc > 0) return TlsStep::kDone;
  switch (SSL_get_error(ssl, rc)) {
    case SSL_ERROR_WANT_READ: return TlsStep::kWantRead;
    case SSL_ERROR_WANT_WRITE: return TlsStep::kWantWrite;
    case SSL_ERROR_ZERO_RETURN: return TlsStep::kClosed;  // close_notify
    case SSL_ERROR_SYSCALL:
      ERR_clear_error();
      // The peer closed (or reset) without close_notify: the end, as on a plain socket.
      return TlsStep::kClosed;
    default: ERR_clear_error(); return TlsStep::kFailed;
  }
}

void TlsStream::close() {
  if (ssl_ != nullptr && socket_.is_open()) {
    // One try: the socket is non-blocking, and a peer gone already needs none.
    SSL_shutdown(ssl_);
    ERR_clear_error();
  }
  boost::system::error_code ignored;
  socket_.close(ignored);
}

void beast_close_socket(TlsStream& s) {
  boost::system::error_code ignored;
  s.socket().close(ignored);
}

void teardown(beast::role_type, TlsStream& s, beast::error_code& ec) {
  s.close();
  ec = {};
}

}  // namespace bus::http::detail
