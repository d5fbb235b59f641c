#include "jwt.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/param_build.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "bus/http/json.hpp"

namespace bus::http::detail {

enum class Alg { kRS256, kES256, kHS256 };

struct JwtVerifier::Key {
  Alg alg;
  std::string kid;
  EVP_PKEY* pkey = nullptr;  // RS256, ES256
  std::string secret;        // HS256
  ~Key() { EVP_PKEY_free(pkey); }
};

namespace {

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

absl::Status refused(std::string_view why) { return absl::UnauthenticatedError(std::string(why)); }

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("bus::http: JWT keys: cannot read " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

/// The JSON text as Cap'n Proto's JsonValue in `b`; nullopt when it is not JSON.
std::optional<capnp::JsonValue::Reader> parse_json(std::string_view text,
                                                   capnp::MallocMessageBuilder& b) {
  auto root = b.initRoot<capnp::JsonValue>();
  try {
    codec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), root);
  } catch (const kj::Exception&) {
    return std::nullopt;
  }
  return root.asReader();
}

std::optional<capnp::JsonValue::Reader> member(capnp::JsonValue::Reader v, std::string_view name) {
  if (!v.isObject()) return std::nullopt;
  for (auto f : v.getObject()) {
    if (std::string_view(f.getName().cStr(), f.getName().size()) == name) return f.getValue();
  }
  return std::nullopt;
}

std::optional<std::string> string_member(capnp::JsonValue::Reader v, std::string_view name) {
  auto m = member(v, name);
  if (!m || !m->isString()) return std::nullopt;
  return std::string(m->getString().cStr(), m->getString().size());
}

/// RSA of 2048 bits or more -> RS256, EC P-256 -> ES256; otherwise an error naming `what`.
Alg alg_of(EVP_PKEY* pkey, const std::string& what) {
  if (EVP_PKEY_is_a(pkey, "RSA")) {
    if (EVP_PKEY_get_bits(pkey) < 2048) {
      throw std::runtime_error("bus::http: JWT key " + what + ": an RSA key under 2048 bits");
    }
    return Alg::kRS256;
  }
  if (EVP_PKEY_is_a(pkey, "EC")) {
    char group[64] = {};
    std::size_t len = 0;
    EVP_PKEY_get_utf8_string_param(pkey, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, &len);
    if (std::string_view(group) == "prime256v1") return Alg::kES256;
    throw std::runtime_error("bus::http: JWT key " + what + ": an EC key on " + group +
                             " (ES256 needs P-256)");
  }
  throw std::runtime_error("bus::http: JWT key " + what + ": neither RSA nor EC P-256");
}

std::optional<Alg> alg_named(std::string_view name) {
  if (name == "RS256") return Alg::kRS256;
  if (name == "ES256") return Alg::kES256;
  if (name == "HS256") return Alg::kHS256;
  return std::nullopt;
}

std::string_view alg_name(Alg a) {
  switch (a) {
    case Alg::kRS256: return "RS256";
    case Alg::kES256: return "ES256";
    case Alg::kHS256: return "HS256";
  }
  return "?";
}

/// The keys of a PEM file: public keys and certificates, in order.
std::vector<EVP_PKEY*> pem_keys(const std::string& path) {
  std::string text = read_file(path);
  std::vector<EVP_PKEY*> out;
  BIO* bio = BIO_new_mem_buf(text.data(), static_cast<int>(text.size()));
  for (;;) {
    char* name = nullptr;
    char* header = nullptr;
    unsigned char* data = nullptr;
    long len = 0;
    if (PEM_read_bio(bio, &name, &header, &data, &len) != 1) break;
    const unsigned char* p = data;
    EVP_PKEY* key = nullptr;
    if (std::string_view(name) == "PUBLIC KEY") {
      key = d2i_PUBKEY(nullptr, &p, len);
    } else if (std::string_view(name) == "CERTIFICATE") {
      if (X509* cert = d2i_X509(nullptr, &p, len)) {
        key = X509_get_pubkey(cert);
        X509_free(cert);
      }
    }
    OPENSSL_free(name);
    OPENSSL_free(header);
    OPENSSL_free(data);
    if (key != nullptr) out.push_back(key);
  }
  BIO_free(bio);
  ERR_clear_error();
  if (out.empty()) {
    throw std::runtime_error("bus::http: JWT keys: " + path +
                             " holds no PUBLIC KEY or CERTIFICATE in PEM");
  }
  return out;
}

/// An RSA or EC public key from a JWK's base64url members.
EVP_PKEY* jwk_key(capnp::JsonValue::Reader jwk, const std::string& kty, const std::string& what) {
  auto b64 = [&](std::string_view name) {
    std::optional<std::string> v = string_member(jwk, name);
    std::optional<std::string> bytes = v ? base64url_decode(*v) : std::nullopt;
    if (!bytes || bytes->empty()) {
      throw std::runtime_error("bus::http: JWT key " + what + ": \"" + std::string(name) +
                               "\" is missing or not base64url");
    }
    return *bytes;
  };
  OSSL_PARAM_BLD* bld = OSSL_PARAM_BLD_new();
  BIGNUM* n = nullptr;
  BIGNUM* e = nullptr;
  std::string point;
  if (kty == "RSA") {
    std::string nb = b64("n"), eb = b64("e");
    n = BN_bin2bn(reinterpret_cast<const unsigned char*>(nb.data()), static_cast<int>(nb.size()),
                  nullptr);
    e = BN_bin2bn(reinterpret_cast<const unsigned char*>(eb.data()), static_cast<int>(eb.size()),
                  nullptr);
    OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_N, n);
    OSSL_PARAM_BLD_push_BN(bld, OSSL_PKEY_PARAM_RSA_E, e);
  } else {
    if (string_member(jwk, "crv") != "P-256") {
      OSSL_PARAM_BLD_free(bld);
      throw std::runtime_error("bus::http: JWT key " + what + ": an EC key not on P-256");
    }
    std::string x = b64("x"), y = b64("y");
    if (x.size() > 32 || y.size() > 32) {
      OSSL_PARAM_BLD_free(bld);
      throw std::runtime_error("bus::http: JWT key " + what + ": x and y must be 32 bytes");
    }
    // RFC 7518 wants the full 32 bytes, but writers that encode the coordinates as integers
    // (PyJWT before 2.7, among others) drop leading zero bytes, one key in 128: put them back.
    x.insert(0, 32 - x.size(), '\0');
    y.insert(0, 32 - y.size(), '\0');
    point = "\x04" + x + y;  // an uncompressed point
    OSSL_PARAM_BLD_push_utf8_string(bld, OSSL_PKEY_PARAM_GROUP_NAME, "prime256v1", 0);
    OSSL_PARAM_BLD_push_octet_string(bld, OSSL_PKEY_PARAM_PUB_KEY, point.data(), point.size());
  }
  OSSL_PARAM* params = OSSL_PARAM_BLD_to_param(bld);
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_from_name(nullptr, kty == "RSA" ? "RSA" : "EC", nullptr);
  EVP_PKEY* key = nullptr;
  bool ok = ctx != nullptr && EVP_PKEY_fromdata_init(ctx) == 1 &&
            EVP_PKEY_fromdata(ctx, &key, EVP_PKEY_PUBLIC_KEY, params) == 1;
  EVP_PKEY_CTX_free(ctx);
  OSSL_PARAM_free(params);
  OSSL_PARAM_BLD_free(bld);
  BN_free(n);
  BN_free(e);
  ERR_clear_error();
  if (!ok) throw std::runtime_error("bus::http: JWT key " + what + ": OpenSSL refused it");
  return key;
}

bool verify_signature(const JwtVerifier::Key& key, std::string_view input, std::string sig) {
  if (key.alg == Alg::kHS256) {
    unsigned char mac[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    HMAC(EVP_sha256(), key.secret.data(), static_cast<int>(key.secret.size()),
         reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len);
    return sig.size() == len && CRYPTO_memcmp(mac, sig.data(), len) == 0;
  }
  if (key.alg == Alg::kES256) {
    // JWS writes r and s as 32 bytes each (RFC 7518 §3.4); OpenSSL verifies DER.
    if (sig.size() != 64) return false;
    ECDSA_SIG* es = ECDSA_SIG_new();
    ECDSA_SIG_set0(es, BN_bin2bn(reinterpret_cast<const unsigned char*>(sig.data()), 32, nullptr),
                   BN_bin2bn(reinterpret_cast<const unsigned char*>(sig.data()) + 32, 32, nullptr));
    unsigned char* der = nullptr;
    int n = i2d_ECDSA_SIG(es, &der);
    ECDSA_SIG_free(es);
    if (n <= 0) return false;
    sig.assign(reinterpret_cast<const char*>(der), static_cast<std::size_t>(n));
    OPENSSL_free(der);
  }
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  bool ok =
      EVP_DigestVerifyInit(ctx, nullptr, EVP_sha256(), nullptr, key.pkey) == 1 &&
      EVP_DigestVerify(ctx, reinterpret_cast<const unsigned char*>(sig.data()), sig.size(),
                       reinterpret_cast<const unsigned char*>(input.data()), input.size()) == 1;
  EVP_MD_CTX_free(ctx);
  ERR_clear_error();
  return ok;
}

/// A NumericDate claim (seconds since the epoch), if present and a number.
std::optional<int64_t> date(capnp::JsonValue::Reader claims, std::string_view name, bool* bad) {
  auto v = member(claims, name);
  if (!v) return std::nullopt;
  if (!v->isNumber() || !std::isfinite(v->getNumber())) {
    *bad = true;
    return std::nullopt;
  }
  return static_cast<int64_t>(std::floor(v->getNumber()));
}

}  // namespace

std::optional<std::string> base64url_decode(std::string_view in) {
  if (in.size() % 4 == 1) return std::nullopt;
  std::string b64;
  b64.reserve(in.size() + 3);
  for (char c : in) {
    if (c == '-') {
      b64 += '+';
    } else if (c == '_') {
      b64 += '/';
    } else if (absl::ascii_isalnum(static_cast<unsigned char>(c))) {
      b64 += c;
    } else {
      return std::nullopt;  // '+', '/', '=' and anything else are not base64url
    }
  }
  std::size_t pad = (4 - b64.size() % 4) % 4;
  b64.append(pad, '=');
  std::string out(b64.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(b64.data()),
                          static_cast<int>(b64.size()));
  if (n < 0) return std::nullopt;
  out.resize(static_cast<std::size_t>(n) - pad);  // DecodeBlock counts the padding's bytes
  return out;
}

JwtVerifier::JwtVerifier(const JwtOptions& options) : options_(options) {
  for (const JwtOptions::Key& k : options.keys()) {
    switch (k.source) {
      case JwtOptions::Source::kSecret: {
        if (k.value.size() < 32) {
          throw std::runtime_error("bus::http: JWT: an HS256 secret needs at least 32 bytes");
        }
        auto key = std::make_unique<Key>();
        key->alg = Alg::kHS256;
        key->kid = k.kid;
        key->secret = k.value;
        keys_.push_back(std::move(key));
        break;
      }
      case JwtOptions::Source::kPem:
        for (EVP_PKEY* pkey : pem_keys(k.value)) {
          auto key = std::make_unique<Key>();
          key->pkey = pkey;
          key->alg = alg_of(pkey, k.value);
          key->kid = k.kid;
          keys_.push_back(std::move(key));
        }
        break;
      case JwtOptions::Source::kJwks: {
        capnp::MallocMessageBuilder b;
        std::optional<capnp::JsonValue::Reader> set = parse_json(read_file(k.value), b);
        auto list = set ? member(*set, "keys") : std::nullopt;
        if (!list || !list->isArray()) {
          throw std::runtime_error("bus::http: JWT keys: " + k.value +
                                   " is not a JWK Set (an object with a \"keys\" array)");
        }
        unsigned i = 0;
        for (auto jwk : list->getArray()) {
          std::string kid = string_member(jwk, "kid").value_or("");
          std::string what =
              absl::StrCat(k.value, " keys[", i++, "]", kid.empty() ? "" : " (kid " + kid + ")");
          std::string kty = string_member(jwk, "kty").value_or("");
          auto key = std::make_unique<Key>();
          key->kid = kid;
          if (kty == "oct") {
            std::optional<std::string> secret =
                base64url_decode(string_member(jwk, "k").value_or(""));
            if (!secret || secret->size() < 32) {
              throw std::runtime_error("bus::http: JWT key " + what +
                                       ": \"k\" must be a base64url secret of 32 bytes or more");
            }
            key->alg = Alg::kHS256;
            key->secret = std::move(*secret);
          } else if (kty == "RSA" || kty == "EC") {
            key->pkey = jwk_key(jwk, kty, what);
            key->alg = alg_of(key->pkey, what);
          } else {
            throw std::runtime_error("bus::http: JWT key " + what + ": kty \"" + kty +
                                     "\" (RSA, EC or oct)");
          }
          if (auto alg = string_member(jwk, "alg"); alg && *alg != alg_name(key->alg)) {
            throw std::runtime_error("bus::http: JWT key " + what + ": alg " + *alg +
                                     " does not fit the key (" + std::string(alg_name(key->alg)) +
                                     ")");
          }
          keys_.push_back(std::move(key));
        }
        break;
      }
    }
  }
  if (keys_.empty()) throw std::runtime_error("bus::http: JWT: JwtOptions names no key");
}

JwtVerifier::~JwtVerifier() = default;

absl::StatusOr<Verified> JwtVerifier::verify(std::string_view token, int64_t now) const {
  std::vector<absl::string_view> split = absl::StrSplit(av(token), '.');
  if (split.size() != 3) return refused("the token is not a JWT (three base64url parts)");
  std::string_view parts[3];
  for (int i = 0; i < 3; ++i) parts[i] = std::string_view(split[i].data(), split[i].size());
  std::optional<std::string> header_text = base64url_decode(parts[0]);
  std::optional<std::string> claims_text = base64url_decode(parts[1]);
  std::optional<std::string> signature = base64url_decode(parts[2]);
  if (!header_text || !claims_text || !signature) {
    return refused("the token is not a JWT (its parts are not base64url)");
  }
  capnp::MallocMessageBuilder header_msg(64);
  std::optional<capnp::JsonValue::Reader> header = parse_json(*header_text, header_msg);
  if (!header || !header->isObject()) return refused("the token's header is not a JSON object");
  std::optional<std::string> alg_text = string_member(*header, "alg");
  if (!alg_text) return refused("the token's header has no alg");
  if (*alg_text == "none") return refused("unsigned tokens (alg none) are not accepted");
  std::optional<Alg> alg = alg_named(*alg_text);
  if (!alg) return refused("alg " + *alg_text + " is not accepted (RS256, ES256, HS256)");
  if (auto crit = member(*header, "crit")) {
    return refused("the token names critical extensions (crit) this server does not know");
  }

  // The key decides the algorithm: a token whose alg is not its key's is refused, whatever
  // it says (an RSA public key is never an HMAC secret).
  std::optional<std::string> kid = string_member(*header, "kid");
  std::string_view input(token.data(), parts[0].size() + 1 + parts[1].size());
  // A token that names its key is checked with that key (or keys without a name).
  int tried = 0;
  bool verified = false;
  for (const auto& key : keys_) {
    if (kid && !key->kid.empty() && key->kid != *kid) continue;
    if (key->alg != *alg) continue;
    ++tried;
    if (verify_signature(*key, input, *signature)) {
      verified = true;
      break;
    }
  }
  if (!verified) {
    if (tried == 0) {
      return refused(absl::StrCat("no ", av(alg_name(*alg)), " key",
                                  kid ? " has kid " + *kid : std::string(" here")));
    }
    return refused("the token's signature does not verify with the server's " +
                   std::string(alg_name(*alg)) + " keys");
  }

  capnp::MallocMessageBuilder claims_msg(256);
  std::optional<capnp::JsonValue::Reader> claims = parse_json(*claims_text, claims_msg);
  if (!claims || !claims->isObject()) return refused("the token's claims are not a JSON object");
  bool bad = false;
  std::optional<int64_t> exp = date(*claims, "exp", &bad);
  std::optional<int64_t> nbf = date(*claims, "nbf", &bad);
  if (bad) return refused("exp and nbf must be numbers (seconds since the epoch)");
  if (!exp) return refused("the token has no exp: tokens must expire");
  int64_t skew = options_.clock_skew().count();
  Verified out;
  out.expires = *exp + skew;
  if (nbf) out.not_before = *nbf - skew;
  if (now > out.expires) return refused("the token expired");
  if (now < out.not_before) return refused("the token is not valid yet (nbf)");
  auto iss = string_member(*claims, "iss");
  if (!options_.issuer().empty() && iss != options_.issuer()) {
    return refused("the token's issuer is not " + options_.issuer());
  }
  if (!options_.audience().empty()) {
    bool found = false;
    if (auto aud = member(*claims, "aud")) {
      if (aud->isString()) found = aud->getString() == options_.audience().c_str();
      if (aud->isArray()) {
        for (auto a : aud->getArray()) {
          found = found || (a.isString() && a.getString() == options_.audience().c_str());
        }
      }
    }
    if (!found) return refused("the token is not for audience " + options_.audience());
  }

  auto p = std::make_shared<Principal>();
  p->subject = string_member(*claims, "sub").value_or("");
  p->issuer = iss.value_or("");
  if (auto scope = string_member(*claims, "scope")) {
    for (absl::string_view s : absl::StrSplit(*scope, ' ', absl::SkipEmpty())) {
      p->scopes.emplace_back(s);
    }
  } else if (auto scp = member(*claims, "scp"); scp && scp->isArray()) {
    for (auto s : scp->getArray()) {
      if (s.isString()) p->scopes.emplace_back(s.getString().cStr());
    }
  }
  p->claims = std::move(*claims_text);
  out.principal = std::move(p);
  return out;
}

absl::StatusOr<PrincipalPtr> TokenCache::verify(std::string_view token, int64_t now) {
  auto it = verified_.find(av(token));
  if (it == verified_.end()) {
    absl::StatusOr<Verified> v = verifier_.verify(token, now);
    if (!v.ok()) return v.status();
    if (verified_.size() >= kMaxEntries) verified_.clear();
    it = verified_.emplace(std::string(token), std::move(*v)).first;
  }
  const Verified& v = it->second;
  if (now > v.expires) {
    verified_.erase(it);
    return refused("the token expired");
  }
  if (now < v.not_before) return refused("the token is not valid yet (nbf)");
  return v.principal;
}

}  // namespace bus::http::detail
