// What a bearer token costs the server per request: JwtVerifier::verify (a signature check and
// the claims) for RS256, ES256 and HS256, and the I/O thread's TokenCache when the token was seen
// before. Keys and tokens are made here with OpenSSL.
//
//   build/bench/bench_jwt --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include <cstdio>
#include <ctime>
#include <string>

#include "../endpoint/src/jwt.hpp"

namespace {

std::string b64url(const std::string& in) {
  std::string out(4 * ((in.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(in.data()),
                          static_cast<int>(in.size()));
  out.resize(static_cast<std::size_t>(n));
  while (!out.empty() && out.back() == '=') out.pop_back();
  for (char& c : out) c = c == '+' ? '-' : c == '/' ? '_' : c;
  return out;
}

std::string sign(EVP_PKEY* key, const std::string& input, bool ecdsa) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  std::size_t len = 0;
  EVP_DigestSignInit(ctx, nullptr, EVP_sha256(), nullptr, key);
  EVP_DigestSign(ctx, nullptr, &len, reinterpret_cast<const unsigned char*>(input.data()),
                 input.size());
  std::string sig(len, '\0');
  EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &len,
                 reinterpret_cast<const unsigned char*>(input.data()), input.size());
  sig.resize(len);
  EVP_MD_CTX_free(ctx);
  if (!ecdsa) return sig;
  // DER -> r || s, 32 bytes each (JWS).
  const unsigned char* p = reinterpret_cast<const unsigned char*>(sig.data());
  ECDSA_SIG* es = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
  std::string raw(64, '\0');
  BN_bn2binpad(ECDSA_SIG_get0_r(es), reinterpret_cast<unsigned char*>(raw.data()), 32);
  BN_bn2binpad(ECDSA_SIG_get0_s(es), reinterpret_cast<unsigned char*>(raw.data()) + 32, 32);
  ECDSA_SIG_free(es);
  return raw;
}

struct Setup {
  std::string dir = "/tmp/bench-jwt-" + std::to_string(::getpid());
  std::string secret = std::string(32, 's');
  EVP_PKEY* rsa = EVP_RSA_gen(2048);
  EVP_PKEY* ec = EVP_EC_gen("P-256");
  std::string rs256, es256, hs256;
  std::unique_ptr<bus::http::detail::JwtVerifier> verifier;

  Setup() {
    std::system(("mkdir -p " + dir).c_str());
    auto write_pub = [&](EVP_PKEY* k, const std::string& name) {
      FILE* f = std::fopen((dir + "/" + name).c_str(), "w");
      PEM_write_PUBKEY(f, k);
      std::fclose(f);
    };
    write_pub(rsa, "rsa.pem");
    write_pub(ec, "ec.pem");
    std::string claims = b64url(R"({"sub":"ada","scope":"orders:read","exp":)" +
                                std::to_string(std::time(nullptr) + 3600) + "}");
    auto token = [&](const std::string& alg, const std::string& kid, auto signer) {
      std::string input =
          b64url(R"({"alg":")" + alg + R"(","kid":")" + kid + R"("})") + "." + claims;
      return input + "." + b64url(signer(input));
    };
    rs256 = token("RS256", "rsa", [&](const std::string& in) { return sign(rsa, in, false); });
    es256 = token("ES256", "ec", [&](const std::string& in) { return sign(ec, in, true); });
    hs256 = token("HS256", "hs", [&](const std::string& in) {
      unsigned char mac[32];
      unsigned len = 0;
      HMAC(EVP_sha256(), secret.data(), 32, reinterpret_cast<const unsigned char*>(in.data()),
           in.size(), mac, &len);
      return std::string(reinterpret_cast<char*>(mac), len);
    });
    verifier =
        std::make_unique<bus::http::detail::JwtVerifier>(bus::http::JwtOptions()
                                                             .key_file(dir + "/rsa.pem", "rsa")
                                                             .key_file(dir + "/ec.pem", "ec")
                                                             .hmac_secret(secret, "hs"));
  }
};

Setup& setup() {
  static Setup s;
  return s;
}

void Verify(benchmark::State& state, const std::string* token) {
  auto& v = *setup().verifier;
  int64_t now = std::time(nullptr);
  for (auto _ : state) {
    auto r = v.verify(*token, now);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(r);
  }
}

void Cached(benchmark::State& state, const std::string* token) {
  bus::http::detail::TokenCache cache(*setup().verifier);
  int64_t now = std::time(nullptr);
  for (auto _ : state) {
    auto r = cache.verify(*token, now);
    if (!r.ok()) state.SkipWithError(std::string(r.status().message()).c_str());
    benchmark::DoNotOptimize(r);
  }
}

BENCHMARK_CAPTURE(Verify, RS256, &setup().rs256);
BENCHMARK_CAPTURE(Verify, ES256, &setup().es256);
BENCHMARK_CAPTURE(Verify, HS256, &setup().hs256);
BENCHMARK_CAPTURE(Cached, RS256, &setup().rs256);

}  // namespace

BENCHMARK_MAIN();
