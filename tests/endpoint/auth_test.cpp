// Bearer JWTs minted by PyJWT (Debian's python3-jwt: an implementation other than the server's)
// with keys made by openssl: what is accepted reaches the handler as its principal, what is not
// is a 401 that says why; routes' scopes are 403s; the WebSocket bridge grants channels from the
// token; CORS preflights and Origin checks.
#include <gtest/gtest.h>

#include <ctime>
#include <fstream>
#include <string>

#include "endpoint/common.hpp"
#include "endpoint/pki.hpp"
#include "endpoint/ws_client.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using bus::http::CorsOptions;
using bus::http::JwtOptions;
using pki_test::capture;
using pki_test::Pki;

namespace {

const bus::Endpoint<Tagged, Tagged> whoami{"test.auth.whoami", bus::Overflow::kFail};
const bus::Topic<Tagged> open_news{"test.auth.open"};
const bus::Topic<Tagged> granted_news{"test.auth.granted"};

/// Answers with the principal the request carried into the handler.
Tagged who(Tagged&&) {
  const bus::Principal* p = bus::principal();
  return tagged(p == nullptr ? "nobody" : p->subject);
}

class Auth : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki = new Pki;
    Pki::run("openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out " + key("rsa"));
    Pki::run("openssl pkey -in " + key("rsa") + " -pubout -out " + pub("rsa"));
    Pki::run("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out " + key("ec"));
    Pki::run("openssl pkey -in " + key("ec") + " -pubout -out " + pub("ec"));
    Pki::run("openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out " + key("other"));
    Pki::run("openssl rand -out " + key("hs") + " 32");
    Pki::run("/usr/bin/python3 " + std::string(kMint) + " --ec-key-with-short-x " + key("ecshort"));
    Pki::run("openssl pkey -in " + key("ecshort") + " -pubout -out " + pub("ecshort"));
    Pki::run("/usr/bin/python3 " + std::string(kMint) + " --jwks " + jwks() + " ec1=" + pub("ec") +
             " hs1=oct:" + key("hs") + " ec2=short:" + pub("ecshort"));
  }
  static void TearDownTestSuite() { delete pki; }
  static std::string key(const std::string& n) { return pki->dir() + "/" + n + ".key"; }
  static std::string pub(const std::string& n) { return pki->dir() + "/" + n + ".pub"; }
  static std::string jwks() { return pki->dir() + "/jwks.json"; }

  /// A token signed `alg` with the key file `key`, with these claims (JSON members) added to
  /// valid defaults.
  static std::string mint(const std::string& alg, const std::string& key_file,
                          const std::string& claims = "", const std::string& headers = "{}") {
    long now = static_cast<long>(std::time(nullptr));
    std::string all =
        R"({"iss":"https://id.test","aud":"bus-test","sub":"ada","scope":"orders:read",)"
        R"("exp":)" +
        std::to_string(now + 600) + (claims.empty() ? "" : ",") + claims + "}";
    // Later members win in PyJWT's json.loads: the test's claims override the defaults.
    auto out = capture("/usr/bin/python3 " + std::string(kMint) + " " + alg + " " + key_file +
                       " '" + all + "' '" + headers + "'");
    EXPECT_EQ(out.exit, 0) << out.text;
    while (!out.text.empty() && (out.text.back() == '\n')) out.text.pop_back();
    return out.text;
  }

  void start(ServerOptions o = ServerOptions()) {
    std::ifstream in(key("hs"), std::ios::binary);
    std::string secret((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    o.jwt(JwtOptions()
              .key_file(pub("rsa"))
              .jwks_file(jwks())
              .hmac_secret(secret, "hs-direct")
              .issuer("https://id.test")
              .audience("bus-test")
              .clock_skew(60s));
    http = std::make_unique<Server>(services.bus, std::move(o));
    http->route(Method::kGet, "/orders/{tag}", whoami).require("orders:read");
    http->route(Method::kGet, "/open/{tag}", whoami);
    http->handle(Method::kGet, "/admin", [](const Request&) { return Reply::text("admin"); },
                 {"admin"});
    http->websocket()
        .topic(open_news)
        .topic(granted_news)
        .endpoint(whoami)
        .permit(bus::http::Permit::kSubscribe, "test.auth.open");
    http->start();
  }
  /// A WebSocket upgrade request with `headers`, answered over plain HTTP when refused.
  http_test::Response upgrade(const std::string& target, http_test::Headers headers) {
    headers.insert(headers.end(), {{"Upgrade", "websocket"},
                                   {"Connection", "Upgrade"},
                                   {"Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="},
                                   {"Sec-WebSocket-Version", "13"}});
    http_test::Connection c(http->port());
    return c.request("GET", target, "", headers);
  }
  http_test::Response get(const std::string& target, const std::string& token) {
    http_test::Headers h;
    if (!token.empty()) h.emplace_back("Authorization", "Bearer " + token);
    http_test::Connection c(http->port());
    return c.request("GET", target, "", h);
  }
  /// The 401 for `token`, and that it says `why`.
  void expect_refused(const std::string& token, const std::string& why) {
    auto r = get("/open/x", token);
    EXPECT_EQ(r.status, 401u) << describe(r);
    EXPECT_EQ(r.body, error_json("unauthenticated", why));
    EXPECT_EQ(r.header("WWW-Authenticate"),
              R"(Bearer realm="bus", error="invalid_token", error_description=")" + why + "\"");
  }

  static constexpr char kMint[] = BUS_SOURCE_DIR "/tests/endpoint/tools/mint_jwt.py";
  static inline Pki* pki = nullptr;
  Services services;
  bus::Subscription whoami_server = services.bus.serve(whoami, who, bus::on_executor(1));
  std::unique_ptr<Server> http;
};

}  // namespace

TEST_F(Auth, AnEcKeyWhoseXLostItsLeadingZeroInTheJwksStillVerifies) {
  // The JWK Set's ec2 has a 31-byte x (RFC 7518 wants 32; PyJWT before 2.7 writes 31 for one key
  // in 256): the key loads, and its tokens verify.
  start();
  EXPECT_EQ(
      get("/orders/x", mint("ES256", key("ecshort"), R"("sub":"short")", R"({"kid":"ec2"})")).body,
      R"({"tag":"short"})");
}

TEST_F(Auth, TokensOfEachAlgorithmCarryTheirPrincipalToTheBusHandler) {
  start();
  EXPECT_EQ(get("/orders/x", mint("RS256", key("rsa"))).body, R"({"tag":"ada"})");
  EXPECT_EQ(get("/orders/x", mint("ES256", key("ec"), R"("sub":"ec")", R"({"kid":"ec1"})")).body,
            R"({"tag":"ec"})");
  EXPECT_EQ(get("/orders/x", mint("HS256", key("hs"), R"("sub":"hs")", R"({"kid":"hs1"})")).body,
            R"({"tag":"hs"})");
  EXPECT_EQ(get("/orders/x", mint("HS256", key("hs"), R"("sub":"direct")")).body,
            R"({"tag":"direct"})");
  // An open route serves anyone, and still knows who sent a token.
  EXPECT_EQ(get("/open/x", "").body, R"({"tag":"nobody"})");
  EXPECT_EQ(get("/open/x", mint("RS256", key("rsa"), R"("sub":"grace")")).body,
            R"({"tag":"grace"})");
}

TEST_F(Auth, RefusedTokensAre401sThatSayWhy) {
  start();
  long now = static_cast<long>(std::time(nullptr));
  expect_refused(mint("RS256", key("rsa"), R"("exp":)" + std::to_string(now - 120)),
                 "the token expired");
  expect_refused(mint("RS256", key("rsa"), R"("nbf":)" + std::to_string(now + 600)),
                 "the token is not valid yet (nbf)");
  expect_refused(mint("RS256", key("rsa"), R"("aud":"someone-else")"),
                 "the token is not for audience bus-test");
  expect_refused(mint("RS256", key("rsa"), R"("iss":"https://evil.test")"),
                 "the token's issuer is not https://id.test");
  expect_refused(mint("RS256", key("other")),
                 "the token's signature does not verify with the server's RS256 keys");
  expect_refused(mint("none", ""), "unsigned tokens (alg none) are not accepted");
  // Algorithm confusion: HS256 "signed" with the server's RSA public key as the secret.
  expect_refused(mint("HS256", pub("rsa")),
                 "the token's signature does not verify with the server's HS256 keys");
  expect_refused(mint("ES256", key("ec"), "", R"({"kid":"nope"})"), "no ES256 key has kid nope");
  expect_refused("not.a-token", "the token is not a JWT (three base64url parts)");
  expect_refused(mint("RS256", key("rsa"), R"("exp":"soon")"),
                 "exp and nbf must be numbers (seconds since the epoch)");
  // Within the clock skew (60 s), an expired token still passes.
  EXPECT_EQ(
      get("/open/x", mint("RS256", key("rsa"), R"("exp":)" + std::to_string(now - 30))).status,
      200u);
  auto metrics = http_test::get(http->port(), "/metrics").body;
  EXPECT_EQ(metric(metrics, R"(bus_http_auth_refused_total{reason="invalid_token"})"), 10);
}

TEST_F(Auth, RoutesAnswer401WithoutATokenAnd403WithoutTheScope) {
  start();
  auto none = get("/orders/x", "");
  EXPECT_EQ(none.status, 401u) << describe(none);
  EXPECT_EQ(none.header("WWW-Authenticate"), R"(Bearer realm="bus")");
  EXPECT_EQ(none.body, error_json("unauthenticated", "this route needs a bearer token"));
  auto scope = get("/orders/x", mint("RS256", key("rsa"), R"("scope":"orders:write profile")"));
  EXPECT_EQ(scope.status, 403u) << describe(scope);
  EXPECT_EQ(scope.header("WWW-Authenticate"),
            R"(Bearer realm="bus", error="insufficient_scope", scope="orders:read")");
  EXPECT_EQ(scope.body,
            error_json("forbidden", "this route needs scope 'orders:read', which the token lacks"));
  EXPECT_EQ(get("/admin", mint("RS256", key("rsa"), R"("scope":"admin")")).body, "admin");
  EXPECT_EQ(get("/admin", mint("RS256", key("rsa"))).status, 403u);
}

TEST_F(Auth, WebSocketClientsGetTheChannelsTheirTokenGrants) {
  start(ServerOptions());
  // No token: only what the bridge permits everyone.
  ws_test::Client anonymous(http->port());
  anonymous.send_text(R"({"op":"sub","channel":"test.auth.granted"})");
  auto refused = anonymous.next_json();
  ASSERT_TRUE(refused) << anonymous.error();
  EXPECT_EQ(ws_test::field(*refused, "error"), R"("forbidden")") << *refused;
  // A token granting the topic and the endpoint, sent as browsers can: ?access_token=.
  std::string token =
      mint("RS256", key("rsa"),
           R"("sub":"ws","bus":{"subscribe":["test.auth.gr*"],"request":["test.auth.whoami"]})");
  ws_test::Client granted(http->port(), {.path = "/bus?access_token=" + token});
  granted.send_text(R"({"op":"sub","channel":"test.auth.granted"})");
  EXPECT_EQ(granted.next_json(), R"({"op":"subscribed","channel":"test.auth.granted"})");
  granted.send_text(R"({"op":"call","channel":"test.auth.whoami","id":1,"body":{"tag":"x"}})");
  // The call carries the client's principal to the handler.
  EXPECT_EQ(granted.next_json(), R"({"op":"reply","id":1,"body":{"tag":"ws"}})");
  granted.send_text(R"({"op":"pub","channel":"test.auth.granted","body":{"tag":"x"}})");
  auto no_publish = granted.next_json();
  ASSERT_TRUE(no_publish) << granted.error();
  EXPECT_EQ(ws_test::field(*no_publish, "error"), R"("forbidden")") << *no_publish;
  // A bad token is refused at the upgrade.
  auto bad = upgrade("/bus?access_token=x.y.z", {});
  EXPECT_EQ(bad.status, 401u) << describe(bad);
  EXPECT_EQ(upgrade("/bus", {{"Authorization", "Bearer x.y.z"}}).status, 401u);
}

TEST_F(Auth, AWebSocketThatRequiresAuthenticationRefusesAnonymousClients) {
  http = std::make_unique<Server>(services.bus);
  http->websocket(bus::http::WebSocketOptions().require_authentication(true)).endpoint(whoami);
  http->start();
  auto anonymous = upgrade("/bus", {});
  EXPECT_EQ(anonymous.status, 401u) << describe(anonymous);
  EXPECT_EQ(anonymous.header("WWW-Authenticate"), R"(Bearer realm="bus")");
}

TEST_F(Auth, CorsAnswersPreflightsAndMarksResponsesForAllowedOrigins) {
  start(ServerOptions().cors(
      CorsOptions().allow_origin("https://app.test").expose_headers("WWW-Authenticate")));
  http_test::Connection c(http->port());
  auto pre = c.request("OPTIONS", "/orders/x", "",
                       {{"Origin", "https://app.test"},
                        {"Access-Control-Request-Method", "GET"},
                        {"Access-Control-Request-Headers", "authorization"}});
  EXPECT_EQ(pre.status, 204u) << describe(pre);
  EXPECT_EQ(pre.header("Access-Control-Allow-Origin"), "https://app.test");
  EXPECT_EQ(pre.header("Access-Control-Allow-Methods"), "GET, HEAD");
  EXPECT_EQ(pre.header("Access-Control-Allow-Headers"), "Authorization, Content-Type");
  EXPECT_EQ(pre.header("Access-Control-Max-Age"), "600");
  auto evil =
      c.request("OPTIONS", "/orders/x", "",
                {{"Origin", "https://evil.test"}, {"Access-Control-Request-Method", "GET"}});
  EXPECT_EQ(evil.status, 403u) << describe(evil);
  EXPECT_FALSE(evil.has_header("Access-Control-Allow-Origin"));
  auto method =
      c.request("OPTIONS", "/orders/x", "",
                {{"Origin", "https://app.test"}, {"Access-Control-Request-Method", "PUT"}});
  EXPECT_EQ(method.status, 403u) << describe(method);
  // The actual request, refused for want of a token: the page may read why.
  auto actual = c.request("GET", "/orders/x", "", {{"Origin", "https://app.test"}});
  EXPECT_EQ(actual.status, 401u);
  EXPECT_EQ(actual.header("Access-Control-Allow-Origin"), "https://app.test");
  EXPECT_EQ(actual.header("Access-Control-Expose-Headers"), "WWW-Authenticate");
  EXPECT_EQ(actual.header("Vary"), "Origin");
  EXPECT_FALSE(c.request("GET", "/open/x", "", {{"Origin", "https://evil.test"}})
                   .has_header("Access-Control-Allow-Origin"));
  // The WebSocket takes the allowed origin and its own, not another site's.
  ws_test::Client app(http->port(), {.headers = {{"Origin", "https://app.test"}}});
  ws_test::Client own(
      http->port(), {.headers = {{"Origin", "http://127.0.0.1:" + std::to_string(http->port())}}});
  auto evil_ws = upgrade("/bus", {{"Origin", "https://evil.test"}});
  EXPECT_EQ(evil_ws.status, 403u) << describe(evil_ws);
  EXPECT_EQ(evil_ws.body,
            error_json("forbidden", "origin https://evil.test may not open a WebSocket here"));
}
