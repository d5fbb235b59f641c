// HTTPS and WSS: certificates made at test time with openssl, checked by real clients (curl,
// openssl s_client, OpenSSL in the test client, Beast's WebSocket over Asio's SSL stream).
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "endpoint/common.hpp"
#include "endpoint/pki.hpp"
#include "endpoint/ws_client.hpp"

using namespace endpoint_test_support;
using namespace std::chrono_literals;
using bus::http::TlsOptions;
using pki_test::capture;
using pki_test::Pki;

namespace {

/// The same certificates for every test: made once.
class Https : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ::signal(SIGPIPE, SIG_IGN);  // the test client writes with OpenSSL's socket BIO
    pki = new Pki;
    pki->ca("ca");
    pki->leaf("server", {.issuer = "ca"});
  }
  static void TearDownTestSuite() { delete pki; }
  /// Makes the certificate `name` the first time a test needs it.
  static void need(const std::string& name) {
    if (std::filesystem::exists(pki->pem(name))) return;
    if (name == "other-ca") return pki->ca(name);
    if (name == "mallory") need("other-ca");
    static const std::map<std::string, Pki::Leaf> leaves = {
        {"second", {.cn = "second", .issuer = "ca"}},
        {"rsa", {.issuer = "ca", .rsa = true}},
        {"self-signed", {}},
        {"expired", {.issuer = "ca", .expired = true}},
        {"wrong-host", {.issuer = "ca", .san = "DNS:other.example"}},
        {"alice", {.cn = "alice", .issuer = "ca", .san = "email:a@example.com", .client = true}},
        {"mallory",
         {.cn = "mallory", .issuer = "other-ca", .san = "email:m@example.com", .client = true}},
    };
    pki->leaf(name, leaves.at(name));
  }
  /// curl's arguments for a client certificate.
  static std::string client_cert(const std::string& name) {
    need(name);
    return "--cert " + pki->pem(name) + " --key " + pki->key(name);
  }

  static TlsOptions tls(const std::string& cert = "server") {
    need(cert);
    return TlsOptions().certificate_chain(pki->pem(cert)).private_key(pki->key(cert));
  }
  /// Starts a server with GET /greeting/{name} on a plain and a TLS port.
  void start(ServerOptions o) {
    http = std::make_unique<Server>(services.bus, std::move(o));
    http->route(Method::kGet, "/greeting/{name}", greet);
    http->handle(Method::kGet, "/whoami", [](const Request& r) {
      return Reply::text(r.principal() ? r.principal()->subject : "nobody");
    });
    http->start();
  }
  /// curl over HTTPS to this server's TLS port as "localhost", trusting `ca`.
  pki_test::Output curl(const std::string& path, const std::string& extra = "",
                        const std::string& ca = "ca") {
    std::string port = std::to_string(http->tls_port());
    return capture("curl -sS --cacert " + pki->pem(ca) + " --resolve localhost:" + port +
                   ":127.0.0.1 " + extra + " https://localhost:" + port + path);
  }
  http_test::Tls client(const std::string& alpn = "http/1.1") {
    http_test::Tls t;
    t.ca_file = pki->pem("ca");
    t.alpn = alpn;
    return t;
  }

  static inline Pki* pki = nullptr;
  Services services;
  std::unique_ptr<Server> http;
};

}  // namespace

TEST_F(Https, CurlGetsTheAnswerOverTlsAndPlainHttpStillServes) {
  start(ServerOptions().tls(tls()));
  auto r = curl("/greeting/tls", "-w ' %{http_version} %{ssl_verify_result}'");
  EXPECT_EQ(r.exit, 0) << r.text;
  EXPECT_EQ(r.text, R"({"message":"Hello tls"} 1.1 0)");
  EXPECT_EQ(http_test::get(http->port(), "/greeting/plain").body, R"({"message":"Hello plain"})");
  EXPECT_EQ(http->stats().tls_handshakes, 1u);
  EXPECT_NE(http->port(), http->tls_port());
}

TEST_F(Https, AnRsaCertificateServesToo) {
  start(ServerOptions().plain(false).tls(tls("rsa")));
  EXPECT_EQ(http->port(), 0u);
  auto r = curl("/greeting/rsa");
  EXPECT_EQ(r.exit, 0) << r.text;
  EXPECT_EQ(r.text, R"({"message":"Hello rsa"})");
}

TEST_F(Https, CertificatesCurlCannotTrustAreRefusedByIt) {
  struct Case {
    const char* cert;
    const char* why;  // in curl's message
  };
  for (Case c : {Case{"self-signed", "self-signed"}, Case{"expired", "expired"},
                 Case{"wrong-host", "localhost"}}) {
    SCOPED_TRACE(c.cert);
    start(ServerOptions().plain(false).tls(tls(c.cert)));
    auto r = curl("/greeting/x");
    EXPECT_EQ(r.exit, 60) << r.text;  // CURLE_PEER_FAILED_VERIFICATION
    EXPECT_NE(r.text.find(c.why), std::string::npos) << r.text;
    EXPECT_EQ(r.text.find("Hello"), std::string::npos) << r.text;
  }
}

TEST_F(Https, OnlyTls12And13AreSpoken) {
  start(ServerOptions().plain(false).tls(tls()));
  EXPECT_EQ(curl("/greeting/a", "--tlsv1.2 --tls-max 1.2").text, R"({"message":"Hello a"})");
  EXPECT_EQ(curl("/greeting/b", "--tlsv1.3").text, R"({"message":"Hello b"})");
  // OpenSSL's client would refuse TLS 1.1 itself at the default security level.
  auto old = capture("openssl s_client -connect 127.0.0.1:" + std::to_string(http->tls_port()) +
                     " -tls1_1 -cipher DEFAULT@SECLEVEL=0 </dev/null");
  EXPECT_NE(old.exit, 0) << old.text;
  EXPECT_NE(old.text.find("alert protocol version"), std::string::npos) << old.text;
  ASSERT_TRUE(bus_test::eventually([&] { return http->stats().tls_handshake_failures == 1; }));
}

TEST_F(Https, AlpnChoosesHttp11AndRefusesAClientThatOffersOnlyH2) {
  start(ServerOptions().plain(false).tls(tls()));
  http_test::Connection both(http->tls_port(), client("h2,http/1.1"));
  ASSERT_TRUE(both.connected()) << both.connect_error();
  EXPECT_EQ(both.alpn(), "http/1.1");
  EXPECT_EQ(both.request("GET", "/greeting/alpn").status, 200u);
  http_test::Connection none(http->tls_port(), client(""));
  ASSERT_TRUE(none.connected()) << none.connect_error();
  EXPECT_EQ(none.alpn(), "");
  EXPECT_EQ(none.request("GET", "/greeting/none").status, 200u);
  http_test::Connection h2(http->tls_port(), client("h2"));
  EXPECT_FALSE(h2.connected());
  EXPECT_NE(h2.connect_error().find("no application protocol"), std::string::npos)
      << h2.connect_error();
  ASSERT_TRUE(bus_test::eventually([&] { return http->stats().tls_handshake_failures == 1; }));
}

TEST_F(Https, GarbageOnTheTlsPortClosesThatConnectionAndCountsIt) {
  start(ServerOptions().tls(tls()).read_timeout(300ms));
  for (std::string garbage :
       {std::string("GET /greeting/x HTTP/1.1\r\nHost: a\r\n\r\n"),
        std::string("\x16\x03\x01\x00\x05hello", 10), std::string(70000, '\xff')}) {
    http_test::Connection c(http->tls_port());
    ASSERT_TRUE(c.connected());
    c.write_raw(garbage);  // the server may close before it has all of it
    EXPECT_TRUE(c.closed_by_peer());
    EXPECT_EQ(c.received().find("HTTP/1.1"), std::string::npos) << c.received();
  }
  // A client that says nothing is closed by the handshake's timeout (the read timeout).
  http_test::Connection silent(http->tls_port());
  EXPECT_TRUE(silent.closed_by_peer());
  EXPECT_TRUE(bus_test::eventually([&] { return http->stats().tls_handshake_failures == 4; }))
      << http->stats().tls_handshake_failures;
  EXPECT_EQ(curl("/greeting/after").text, R"({"message":"Hello after"})");
  auto metrics = http_test::get(http->port(), "/metrics").body;
  EXPECT_EQ(metric(metrics, "bus_http_tls_handshake_failures_total"), 4) << metrics;
  EXPECT_EQ(metric(metrics, "bus_http_tls_handshakes_total"), 1) << metrics;
}

TEST_F(Https, MutualTlsAdmitsOnlyClientsWithACertificateOfItsCa) {
  start(ServerOptions().plain(false).tls(tls().client_ca(pki->pem("ca"))));
  auto alice = curl("/whoami", client_cert("alice"));
  EXPECT_EQ(alice.exit, 0) << alice.text;
  EXPECT_EQ(alice.text, "CN=alice");
  // Without a certificate, or with one of another CA: the handshake fails (in TLS 1.3 the
  // client learns it at its first read).
  auto anonymous = curl("/whoami");
  EXPECT_NE(anonymous.exit, 0) << anonymous.text;
  EXPECT_EQ(anonymous.text.find("nobody"), std::string::npos) << anonymous.text;
  auto mallory = curl("/whoami", client_cert("mallory"));
  EXPECT_NE(mallory.exit, 0) << mallory.text;
  EXPECT_EQ(mallory.text.find("mallory"), std::string::npos) << mallory.text;
  ASSERT_TRUE(bus_test::eventually([&] { return http->stats().tls_handshake_failures == 2; }));
}

TEST_F(Https, OptionalClientCertificatesLetAnonymousClientsIn) {
  start(ServerOptions().plain(false).tls(
      tls().client_ca(pki->pem("ca")).require_client_certificate(false)));
  EXPECT_EQ(curl("/whoami").text, "nobody");
  EXPECT_EQ(curl("/whoami", client_cert("alice")).text, "CN=alice");
  EXPECT_NE(curl("/whoami", client_cert("mallory")).exit, 0);
}

TEST_F(Https, ReloadGivesNewConnectionsTheNewCertificateAndKeepsOpenOnes) {
  // The server reads the files it was given: copies that the test replaces.
  std::string chain = pki->dir() + "/live.pem", key = pki->dir() + "/live.key";
  auto install = [&](const std::string& name) {
    std::filesystem::copy_file(pki->pem(name), chain,
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::copy_file(pki->key(name), key,
                               std::filesystem::copy_options::overwrite_existing);
  };
  need("second");
  install("server");
  start(ServerOptions().plain(false).tls(TlsOptions().certificate_chain(chain).private_key(key)));
  http_test::Connection open(http->tls_port(), client());
  ASSERT_TRUE(open.connected()) << open.connect_error();
  EXPECT_EQ(open.peer_subject(), "/CN=localhost");
  EXPECT_EQ(open.request("GET", "/greeting/before").status, 200u);

  install("second");
  ASSERT_TRUE(http->reload_tls().ok());
  // The connection made before goes on, on the same TCP connection.
  uint16_t local = open.local_port();
  auto again = open.request("GET", "/greeting/again");
  EXPECT_EQ(again.body, R"({"message":"Hello again"})") << describe(again);
  EXPECT_EQ(open.local_port(), local);
  // A new one gets the new certificate (the reload reaches the I/O thread through its loop).
  ASSERT_TRUE(bus_test::eventually([&] {
    http_test::Connection fresh(http->tls_port(), client());
    return fresh.peer_subject() == "/CN=second";
  }));

  // A key that is no key: refused, and the certificate in use stays.
  std::ofstream(key) << "not a key\n";
  absl::Status bad = http->reload_tls();
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find(key), std::string::npos) << bad.message();
  http_test::Connection after(http->tls_port(), client());
  EXPECT_EQ(after.peer_subject(), "/CN=second");
  EXPECT_EQ(after.request("GET", "/greeting/after").status, 200u);
}

TEST_F(Https, StartRefusesACertificateItCannotUseAndSaysWhich) {
  need("second");
  Server s(services.bus,
           ServerOptions().tls(
               TlsOptions().certificate_chain(pki->pem("server")).private_key(pki->key("second"))));
  try {
    s.start();
    FAIL() << "start() accepted a key that is not the certificate's";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("is not the key of the certificate"), std::string::npos)
        << e.what();
  }
}

TEST_F(Https, WebSocketOverTlsCallsAndSubscribes) {
  http = std::make_unique<Server>(services.bus, ServerOptions().plain(false).tls(tls()));
  http->websocket().endpoint(greet).permit(bus::http::Permit::kRequest, "test.http.greet");
  http->start();
  ws_test::Client c(http->tls_port(), {.ca_file = pki->pem("ca")});
  c.send_text(R"({"op":"call","channel":"test.http.greet","id":1,"body":{"name":"wss"}})");
  auto reply = c.next_json();
  ASSERT_TRUE(reply) << c.error();
  EXPECT_EQ(*reply, R"({"op":"reply","id":1,"body":{"message":"Hello wss"}})");
  // Several frames in a row, bigger than one TLS record.
  std::string big(40000, 'x');
  for (int i = 2; i < 5; ++i) {
    c.send_text(R"({"op":"call","channel":"test.http.greet","id":)" + std::to_string(i) +
                R"(,"body":{"name":")" + big + R"("}})");
  }
  for (int i = 2; i < 5; ++i) {
    auto r = c.next_json();
    ASSERT_TRUE(r) << c.error();
    EXPECT_EQ(*r, R"({"op":"reply","id":)" + std::to_string(i) + R"(,"body":{"message":"Hello )" +
                      big + R"("}})");
  }
  c.close();
}
