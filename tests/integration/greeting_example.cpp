// The greeting example as users run it: greeting_service and greeting_server as two processes
// on one bus (over the bridge), called by curl over real HTTP, then stopped with SIGTERM.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>

#include "endpoint/pki.hpp"
#include "integration/node_process.hpp"
#include "integration/process.hpp"
#include "support/test_support.hpp"

using namespace std::chrono_literals;

namespace {

std::string curl(const std::string& url, std::vector<std::string> args = {}) {
  args.push_back(url);
  return integ::curl(args);
}

std::string base_url(integ::Child& server) { return integ::printed_base_url(server, "/greeting"); }

}  // namespace

TEST(GreetingExample, ServesInOneProcess) {
  integ::Child server({GREETING_SERVER, "--port=0"});
  std::string base = base_url(server);
  ASSERT_FALSE(base.empty());
  EXPECT_EQ(curl(base + "/greeting/Sergio"), "Hello Sergio");
  EXPECT_EQ(curl(base + "/services/myservice/ping"), "[\"Hello World!\"]");
  ::kill(server.pid(), SIGTERM);
  int status = server.wait(30s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(GreetingExample, ServesFromASecondProcessOverTheBridge) {
  integ::Endpoints endpoints(integ::Transport::kIpc);
  std::string service_pub = endpoints.bind("service-pub");
  std::string service_req = endpoints.bind("service-req");
  std::string server_pub = endpoints.bind("server-pub");
  integ::Child service({GREETING_SERVICE, "--publish=" + service_pub, "--requests=" + service_req,
                        "--peers=" + server_pub});
  ASSERT_TRUE(service.read_line(30s).has_value());  // "[greeting-service] serving ..."
  integ::Child server(
      {GREETING_SERVER, "--port=0", "--publish=" + server_pub, "--peers=" + service_pub});
  std::string base = base_url(server);
  ASSERT_FALSE(base.empty());

  // The server learns of the service from its heartbeats; until then /health says 503.
  ASSERT_TRUE(bus_test::eventually(
      [&] { return curl(base + "/health").find("\"status\":\"ok\"") != std::string::npos; }));
  std::string health = curl(base + "/health");
  EXPECT_NE(health.find("\"name\":\"greeting-service\""), std::string::npos) << health;
  EXPECT_EQ(curl(base + "/greeting/Sergio"), "Hello Sergio");
  EXPECT_EQ(curl(base + "/services/myservice/ping"), "[\"Hello World!\"]");
  // Many requests on one keep-alive connection, all through the second process.
  std::vector<std::string> many = {"--http1.1"};
  std::string urls;
  for (int i = 0; i < 50; ++i) many.push_back(base + "/greeting/n" + std::to_string(i));
  std::string out;
  std::vector<std::string> argv = {"curl", "-s", "--max-time", "30"};
  argv.insert(argv.end(), many.begin(), many.end());
  integ::run_command(argv, &out);
  std::string expected;
  for (int i = 0; i < 50; ++i) expected += "Hello n" + std::to_string(i);
  EXPECT_EQ(out, expected);

  // The service goes away: requests fail fast with 503, not at their deadline.
  ::kill(service.pid(), SIGTERM);
  EXPECT_EQ(WEXITSTATUS(service.wait(30s)), 0);
  ASSERT_TRUE(bus_test::eventually([&] {
    return curl(base + "/greeting/Sergio", {"-o", "/dev/null", "-w", "%{http_code}"}) == "503";
  }));

  ::kill(server.pid(), SIGTERM);
  int status = server.wait(30s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(GreetingExample, ServesHttpsAndTakesANewCertificateOnSighup) {
  pki_test::Pki pki;
  pki.ca("ca");
  pki.leaf("first", {.cn = "first", .issuer = "ca"});
  pki.leaf("second", {.cn = "second", .issuer = "ca"});
  std::string chain = pki.dir() + "/live.pem", key = pki.dir() + "/live.key";
  auto install = [&](const std::string& name) {
    pki_test::Pki::run("cp " + pki.pem(name) + " " + chain + " && cp " + pki.key(name) + " " + key);
  };
  install("first");
  integ::Child server({GREETING_SERVER, "--plain=false", "--tls_port=0", "--tls_cert=" + chain,
                       "--tls_key=" + key});
  std::string base = integ::printed_base_url(server, "/greeting");
  ASSERT_EQ(base.substr(0, 8), "https://") << base;
  std::string port = base.substr(base.rfind(':') + 1);
  auto subject = [&] {
    return pki_test::capture("sh -c 'openssl s_client -connect 127.0.0.1:" + port +
                             " </dev/null 2>/dev/null | openssl x509 -noout -subject'")
        .text;
  };
  EXPECT_EQ(curl("https://localhost:" + port + "/greeting/Sergio",
                 {"--cacert", pki.pem("ca"), "--resolve", "localhost:" + port + ":127.0.0.1"}),
            "Hello Sergio");
  EXPECT_EQ(subject(), "subject=CN = first\n");
  install("second");
  ::kill(server.pid(), SIGHUP);
  ASSERT_TRUE(bus_test::eventually([&] { return subject() == "subject=CN = second\n"; }))
      << subject();
  EXPECT_EQ(curl("https://localhost:" + port + "/greeting/again",
                 {"--cacert", pki.pem("ca"), "--resolve", "localhost:" + port + ":127.0.0.1"}),
            "Hello again");
  ::kill(server.pid(), SIGTERM);
  int status = server.wait(30s);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}
