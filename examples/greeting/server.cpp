// The greeting example's HTTP front: GET /greeting/{name} and GET /services/myservice/ping, and
// a web page (GET /, examples/greeting/web) that watches the greetings live over the WebSocket
// bridge (GET /bus) and asks for its own, and Swagger UI (GET /docs) over GET /openapi.json.
//
//   greeting_server --port 8080                      service in this process
//   greeting_server --port 8080 --peers tcp://127.0.0.1:7501
//                                                    service in greeting_service, over the bridge
//   greeting_server --port 8080 --direct             answered on the I/O thread (no bus hop;
//                                                    the benchmark's baseline)
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/strings/str_split.h>

#include <bus/http/server.hpp>
#include <bus/net/node.hpp>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "../usage.hpp"
#include "greeting.hpp"

ABSL_FLAG(std::string, address, "127.0.0.1", "address to listen on");
ABSL_FLAG(uint16_t, port, 8080, "HTTP port");
ABSL_FLAG(unsigned, io_threads, 1, "HTTP I/O threads");
ABSL_FLAG(unsigned, executors, 1, "bus executors");
ABSL_FLAG(bool, yield_after_round, true,
          "an I/O thread yields its CPU after each round that sent requests to the bus");
ABSL_FLAG(int, spin_us, 50, "how long an idle executor spins before it parks (microseconds)");
ABSL_FLAG(size_t, max_connections, 20000, "open connections allowed");
ABSL_FLAG(size_t, max_in_flight, 256,
          "requests one I/O thread has out to the bus at most (more wait their turn)");
ABSL_FLAG(size_t, ring_kib, 64, "ring size between two threads of the bus, KiB");
ABSL_FLAG(bool, direct, false, "answer on the I/O thread, without the bus");
ABSL_FLAG(std::string, peers, "",
          "publish addresses of nodes serving the endpoints (empty: serve them here)");
ABSL_FLAG(std::string, publish, "tcp://127.0.0.1:7500", "where this node publishes (--peers)");
ABSL_FLAG(std::string, web, GREETING_WEB_DIR, "folder of the web page served at GET /");
ABSL_FLAG(std::string, swagger_ui, SWAGGER_UI_DIR,
          "folder of npm's swagger-ui-dist (bash scripts/npm_tools.sh installs it), for /docs");
ABSL_FLAG(std::string, tls_cert, "",
          "HTTPS: PEM certificate chain (with --tls_key; SIGHUP reloads both)");
ABSL_FLAG(std::string, tls_key, "", "HTTPS: PEM private key of --tls_cert");
ABSL_FLAG(uint16_t, tls_port, 8443, "HTTPS port (with --tls_cert; 0 picks one)");
ABSL_FLAG(std::string, tls_client_ca, "",
          "HTTPS: require client certificates issued by a CA in this PEM file (mTLS)");
ABSL_FLAG(bool, plain, true, "serve plain HTTP on --port too (false: HTTPS only)");
ABSL_FLAG(std::string, jwt_key, "",
          "accept bearer JWTs signed with this PEM public key (RS256/ES256), and require one on "
          "GET /greeting/{name}");
ABSL_FLAG(std::string, jwt_jwks, "",
          "accept bearer JWTs verified with the keys of this JWK Set file (RSA, EC P-256, or oct "
          "for HS256), and require one on GET /greeting/{name}");

using namespace greeting_app;

namespace {

/// A file's bytes; empty (and a warning naming `flag`) when it cannot be read.
std::string read_file(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().empty())
    std::fprintf(stderr, "[greeting] nothing at %s (%s)\n", path.c_str(), flag);
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  examples::usage(
      "the greeting example's HTTP server: GET /greeting/{name}, GET /services/myservice/ping, a "
      "web page at / and its WebSocket at /bus, the OpenAPI document at /openapi.json and Swagger "
      "UI at /docs");
  absl::ParseCommandLine(argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  bus::Bus bus(bus::Options()
                   .executors(absl::GetFlag(FLAGS_executors))
                   .ring_bytes(absl::GetFlag(FLAGS_ring_kib) << 10)
                   .spin(std::chrono::microseconds(absl::GetFlag(FLAGS_spin_us))));

  std::unique_ptr<bus::net::Node> node;
  std::string peers = absl::GetFlag(FLAGS_peers);
  if (peers.empty()) {
    bus.service<GreetingService>()
        .serve(greet, &GreetingService::hello)
        .serve(ping, &GreetingService::on_ping);
  } else {
    auto o = bus::net::NodeOptions().name("greeting-http").publish_on(absl::GetFlag(FLAGS_publish));
    for (absl::string_view p : absl::StrSplit(peers, ',', absl::SkipEmpty()))
      o.peer(std::string(p));
    node = std::make_unique<bus::net::Node>(bus, o);
    node->import_endpoint(greet).import_endpoint(ping);
  }

  auto options = bus::http::ServerOptions()
                     .address(absl::GetFlag(FLAGS_address))
                     .port(absl::GetFlag(FLAGS_port))
                     .io_threads(absl::GetFlag(FLAGS_io_threads))
                     .max_connections(absl::GetFlag(FLAGS_max_connections))
                     .max_in_flight(absl::GetFlag(FLAGS_max_in_flight))
                     .yield_after_round(absl::GetFlag(FLAGS_yield_after_round))
                     .plain(absl::GetFlag(FLAGS_plain))
                     .node(node.get());
  const bool tokens =
      !absl::GetFlag(FLAGS_jwt_key).empty() || !absl::GetFlag(FLAGS_jwt_jwks).empty();
  if (tokens) {
    bus::http::JwtOptions jwt;
    if (!absl::GetFlag(FLAGS_jwt_key).empty()) jwt.key_file(absl::GetFlag(FLAGS_jwt_key));
    if (!absl::GetFlag(FLAGS_jwt_jwks).empty()) jwt.jwks_file(absl::GetFlag(FLAGS_jwt_jwks));
    options.jwt(std::move(jwt));
  }
  options.openapi(
      bus::http::OpenApiOptions()
          .title("Greeting")
          .version("1.0.0")
          .description(
              "The greeting example: Quarkus' and QBit's seed services, served over the bus."));
  if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
    options.tls(bus::http::TlsOptions()
                    .port(absl::GetFlag(FLAGS_tls_port))
                    .certificate_chain(absl::GetFlag(FLAGS_tls_cert))
                    .private_key(absl::GetFlag(FLAGS_tls_key))
                    .client_ca(absl::GetFlag(FLAGS_tls_client_ca)));
  }
  bus::http::Server http(bus, options);
  using bus::http::Method;
  using bus::http::Reply;
  if (absl::GetFlag(FLAGS_direct)) {
    http.handle(
        Method::kGet, "/greeting/{name}",
        [](const bus::http::Request& r) {
          return Reply::text("Hello " + std::string(*r.param("name")));
        },
        tokens ? std::vector<std::string>{""} : std::vector<std::string>{});
  } else {
    // The path parameter fills GreetingRequest.name; the reply is plain text, as Quarkus'. Each
    // greeting is also published on `greeted` (nearly free while nobody subscribes).
    auto route = http.route(Method::kGet, "/greeting/{name}", greet)
                     .reply([&bus](const Greeting& g) {
                       (void)bus.publish(greeted, g);
                       return Reply::text(g->getMessage().cStr());
                     })
                     .produces("text/plain; charset=utf-8")
                     .describe("Greets `name`",
                               "Answers `Hello {name}` and publishes it on "
                               "`greeting.greeted` for the web page.");
    if (tokens) route.require();
  }
  // The web page and its WebSocket: it may watch `greeting.greeted` and call `greeting`;
  // nothing else on the bus is reachable from a browser.
  std::string page = read_file(absl::GetFlag(FLAGS_web) + "/index.html", "--web");
  http.handle(Method::kGet, "/", [&page](const bus::http::Request&) {
    return Reply{200, "text/html; charset=utf-8", page, {}};
  });
  // Swagger UI over GET /openapi.json: its page, and the files it loads (read once, here).
  std::string docs = read_file(absl::GetFlag(FLAGS_web) + "/docs.html", "--web");
  http.handle(Method::kGet, "/docs", [&docs](const bus::http::Request&) {
    return Reply{200, "text/html; charset=utf-8", docs, {}};
  });
  std::map<std::string, Reply, std::less<>> swagger_ui;
  for (auto [file, type] : {std::pair{"swagger-ui.css", "text/css; charset=utf-8"},
                            {"swagger-ui-bundle.js", "text/javascript; charset=utf-8"},
                            {"swagger-ui-standalone-preset.js", "text/javascript; charset=utf-8"},
                            {"favicon-32x32.png", "image/png"}}) {
    swagger_ui[file] = Reply{
        200, type, read_file(absl::GetFlag(FLAGS_swagger_ui) + "/" + file, "--swagger_ui"), {}};
  }
  http.handle(Method::kGet, "/docs/{file}", [&swagger_ui](const bus::http::Request& r) {
    auto it = swagger_ui.find(*r.param("file"));
    if (it == swagger_ui.end()) return Reply::error(404, "not_found", "no such file");
    return it->second;
  });
  http.websocket()
      .topic(greeted)
      .endpoint(greet)
      .permit(bus::http::Permit::kSubscribe, "greeting.greeted", bus::http::Match::kExact)
      .permit(bus::http::Permit::kRequest, "greeting", bus::http::Match::kExact);
  // QBit answers a JSON array: the reply's list, written by Cap'n Proto's JSON codec.
  http.route(Method::kGet, "/services/myservice/ping", ping)
      .reply([](const PingReply& r) { return Reply::json(bus::http::to_json(r->getGreetings())); })
      .produces<capnp::List<capnp::Text>>()
      .describe("Pings the service", "Answers `[\"Hello World!\"]`, as QBit's seed does.");
  http.start();
  const char* mode = absl::GetFlag(FLAGS_direct) ? "direct"
                     : peers.empty()             ? "in-process"
                                                 : "bridged";
  if (options.plain()) {
    std::printf("[greeting] http://%s:%u/greeting/Sergio (%s)\n", options.address().c_str(),
                http.port(), mode);
  }
  if (options.tls()) {
    std::printf("[greeting] https://%s:%u/greeting/Sergio (%s)\n", options.address().c_str(),
                http.tls_port(), mode);
  }
  http.run_until_signal();
  std::printf("[greeting] stopped: %llu requests\n",
              static_cast<unsigned long long>(http.stats().requests));
  if (node) node->stop();
  return 0;
}
