// Bearer JWT verification with OpenSSL's EVP interface: compact JWS (RFC 7515) signed RS256,
// ES256 or HS256, claims (RFC 7519) read with Cap'n Proto's JSON codec. No Beast here.
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/status/statusor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bus/http/auth.hpp"
#include "bus/principal.hpp"

namespace bus::http::detail {

/// A token that verified: who it names, and the times between which it is good.
struct Verified {
  PrincipalPtr principal;
  int64_t not_before = INT64_MIN;  // nbf - skew, in seconds since the epoch
  int64_t expires = INT64_MAX;     // exp + skew
};

/// The keys and rules of a server's JwtOptions. Thread-safe: verify() only reads.
class JwtVerifier {
 public:
  /// Reads the keys; throws std::runtime_error naming the file (or key) and what is wrong.
  explicit JwtVerifier(const JwtOptions& options);
  ~JwtVerifier();
  JwtVerifier(const JwtVerifier&) = delete;
  JwtVerifier& operator=(const JwtVerifier&) = delete;

  /// `token` checked at `now` (seconds since the epoch): Unauthenticated with a reason a client
  /// can act on ("the token expired") when it is refused.
  absl::StatusOr<Verified> verify(std::string_view token, int64_t now) const;
  const JwtOptions& options() const { return options_; }

  struct Key;

 private:
  JwtOptions options_;
  std::vector<std::unique_ptr<Key>> keys_;
};

/// One I/O thread's tokens verified already: a client that sends its token again (every request
/// of a session does) costs a hash lookup, not a signature check. The times are checked on every
/// use. Bounded: past kMaxEntries it starts afresh.
class TokenCache {
 public:
  explicit TokenCache(const JwtVerifier& verifier) : verifier_(verifier) {}
  absl::StatusOr<PrincipalPtr> verify(std::string_view token, int64_t now);

  static constexpr std::size_t kMaxEntries = 4096;

 private:
  const JwtVerifier& verifier_;
  absl::flat_hash_map<std::string, Verified> verified_;
};

/// Decodes unpadded base64url (RFC 4648 §5); nullopt for anything else.
std::optional<std::string> base64url_decode(std::string_view in);

}  // namespace bus::http::detail
