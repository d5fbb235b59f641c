// Who may call the server: bearer JWTs (RFC 6750, RFC 7519), verified with OpenSSL.
//
//   auto options = bus::http::ServerOptions().tls(...).jwt(
//       bus::http::JwtOptions().jwks_file("keys.json").issuer("https://id.example").audience("orders"));
//   http.route(Method::kGet, "/orders/{id}", orders).require("orders:read");
//
// A request with a valid token carries its principal (bus::Principal: subject, scopes, claims)
// to the handler that serves it. A route that requires a scope answers 401 without a valid token
// (WWW-Authenticate says why) and 403 when the token lacks the scope.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace bus::http {

/// The tokens the server accepts. Algorithms are RS256, ES256 and HS256, each pinned to its key:
/// an RSA key verifies RS256 only, a P-256 key ES256 only, a secret HS256 only, so a token
/// cannot choose how it is checked ("alg":"none" and algorithm confusion are refused).
class JwtOptions {
 public:
  /// Public keys (or certificates) in a PEM file: RSA (2048 bits or more) for RS256, EC P-256
  /// for ES256. `kid` names it for tokens that say which key signed them (empty: any token).
  JwtOptions& key_file(std::string pem_file, std::string kid = "") {
    keys_.push_back({Source::kPem, std::move(pem_file), std::move(kid)});
    return *this;
  }
  /// Keys in a JWK Set file (RFC 7517): "kty" RSA, EC (P-256) or oct (an HS256 secret), each
  /// with its "kid"; an "alg" given must be the key's.
  JwtOptions& jwks_file(std::string path) {
    keys_.push_back({Source::kJwks, std::move(path), ""});
    return *this;
  }
  /// An HS256 shared secret (at least 32 bytes).
  JwtOptions& hmac_secret(std::string secret, std::string kid = "") {
    keys_.push_back({Source::kSecret, std::move(secret), std::move(kid)});
    return *this;
  }
  /// The "iss" a token must have (empty: any).
  JwtOptions& issuer(std::string iss) {
    issuer_ = std::move(iss);
    return *this;
  }
  /// A value the token's "aud" must hold (empty: not checked).
  JwtOptions& audience(std::string aud) {
    audience_ = std::move(aud);
    return *this;
  }
  /// How far "exp" and "nbf" may be off this host's clock (default 60 s).
  JwtOptions& clock_skew(std::chrono::seconds s) {
    clock_skew_ = s;
    return *this;
  }
  /// The realm in WWW-Authenticate (default "bus").
  JwtOptions& realm(std::string r) {
    realm_ = std::move(r);
    return *this;
  }

  enum class Source { kPem, kJwks, kSecret };
  struct Key {
    Source source;
    std::string value;  // a path, or the secret
    std::string kid;
  };
  const std::vector<Key>& keys() const { return keys_; }
  const std::string& issuer() const { return issuer_; }
  const std::string& audience() const { return audience_; }
  std::chrono::seconds clock_skew() const { return clock_skew_; }
  const std::string& realm() const { return realm_; }

 private:
  std::vector<Key> keys_;
  std::string issuer_;
  std::string audience_;
  std::chrono::seconds clock_skew_{60};
  std::string realm_ = "bus";
};

}  // namespace bus::http
