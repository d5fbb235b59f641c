// The OpenAPI 3.1 document (GET /openapi.json): what it says of routes, parameters, bodies,
// statuses and security, checked on its content; linted by Redocly's CLI; and its JSON Schemas
// checked by Ajv against what the server really writes and reads.
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "endpoint/common.hpp"
#include "endpoint/pki.hpp"

using namespace endpoint_test_support;

namespace {

using Note = bus::Message<endpoint_test::Note>;
inline const bus::Endpoint<Note, Note> notes{"test.openapi.notes", bus::Overflow::kFail};

constexpr char kNodeModules[] = BUS_SOURCE_DIR "/tools/npm/node_modules";

/// A JSON document parsed with Cap'n Proto's codec (the message on the heap: `root` survives a
/// move).
struct Json {
  explicit Json(std::string_view text) {
    auto b = message->initRoot<capnp::JsonValue>();
    capnp::JsonCodec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), b);
    root = b.asReader();
  }
  std::unique_ptr<capnp::MallocMessageBuilder> message =
      std::make_unique<capnp::MallocMessageBuilder>();
  capnp::JsonValue::Reader root;
};

/// The member `name` of an object, or the element `name` (a number) of an array.
std::optional<capnp::JsonValue::Reader> child(capnp::JsonValue::Reader v, std::string_view name) {
  if (v.isObject()) {
    for (auto f : v.getObject()) {
      if (std::string_view(f.getName().cStr(), f.getName().size()) == name) return f.getValue();
    }
  } else if (v.isArray()) {
    std::size_t i = std::stoul(std::string(name));
    if (i < v.getArray().size()) return v.getArray()[static_cast<unsigned>(i)];
  }
  return std::nullopt;
}

/// The value at `path` written as compact JSON, or "(none)".
std::string at(const Json& doc, std::initializer_list<std::string_view> path) {
  std::optional<capnp::JsonValue::Reader> v = doc.root;
  for (std::string_view name : path) {
    if (!v) break;
    v = child(*v, name);
  }
  if (!v) return "(none)";
  return capnp::JsonCodec().encodeRaw(*v).cStr();
}

/// The member names of the object at `path`.
std::vector<std::string> keys(const Json& doc, std::initializer_list<std::string_view> path) {
  std::optional<capnp::JsonValue::Reader> v = doc.root;
  for (std::string_view name : path) {
    if (!v) break;
    v = child(*v, name);
  }
  std::vector<std::string> out;
  if (v && v->isObject()) {
    for (auto f : v->getObject()) out.emplace_back(f.getName().cStr());
  }
  return out;
}

/// `s` as a JSON string literal.
std::string quoted(std::string_view s) {
  capnp::MallocMessageBuilder b;
  auto v = b.initRoot<capnp::JsonValue>();
  v.setString(capnp::Text::Reader(s.data(), s.size()));
  return capnp::JsonCodec().encodeRaw(v).cStr();
}

/// A parameter of an operation, by name ("(none)" when it has none of that name).
std::string parameter(const Json& doc, std::string_view path, std::string_view method,
                      std::string_view name) {
  for (int i = 0;; ++i) {
    std::string p = at(doc, {"paths", path, method, "parameters", std::to_string(i)});
    if (p == "(none)") return p;
    if (at(doc, {"paths", path, method, "parameters", std::to_string(i), "name"}) == quoted(name)) {
      return p;
    }
  }
}

pki_test::Pki::Leaf rsa_leaf() {
  pki_test::Pki::Leaf l;
  l.rsa = true;
  return l;
}

class OpenApi : public ::testing::Test {
 protected:
  /// Routes of every kind: parameters, bodies, custom replies, a direct handler, scopes.
  void add_routes(Server& http) {
    http.route(Method::kGet, "/orders/{id}", echo).describe("An order", "Echoes the request.");
    http.route(Method::kPost, "/orders", echo);
    http.route(Method::kGet, "/greeting/{name}", greet)
        .reply([](const Greeting& g) { return Reply::text(g->getMessage().cStr()); })
        .produces("text/plain; charset=utf-8");
    http.route(Method::kGet, "/ping", ping)
        .reply(
            [](const PingReply& r) { return Reply::json(bus::http::to_json(r->getGreetings())); })
        .produces<capnp::List<capnp::Text>>();
    http.route(Method::kPost, "/notes/{blob}", notes);
    http.route(Method::kPost, "/notes", notes);
    http.handle(Method::kGet, "/admin", [](const Request&) { return Reply::text("admin"); },
                {"admin"});
  }

  Json start(ServerOptions options = ServerOptions().port(0)) {
    http = std::make_unique<Server>(services.bus, std::move(options));
    add_routes(*http);
    http->start();
    return Json(http->openapi());
  }

  Services services;
  bus::Subscription noting = services.bus.serve(
      notes, [](Note&& n) { return std::move(n); }, bus::on_executor(1));
  std::unique_ptr<Server> http;
};

TEST_F(OpenApi, IsServedAtOpenapiJson) {
  start();
  auto r = http_test::get(http->port(), "/openapi.json");
  EXPECT_EQ(r.status, 200u) << describe(r);
  EXPECT_EQ(r.header("Content-Type"), "application/json");
  EXPECT_EQ(r.body, http->openapi());
  Json doc(r.body);
  EXPECT_EQ(at(doc, {"openapi"}), R"("3.1.0")");
  // The server's own routes are in it too.
  EXPECT_EQ(keys(doc, {"paths"}),
            (std::vector<std::string>{"/orders/{id}", "/orders", "/greeting/{name}", "/ping",
                                      "/notes/{blob}", "/notes", "/admin", "/health", "/metrics",
                                      "/openapi.json"}));
}

TEST_F(OpenApi, TitleVersionServersAndPathComeFromTheOptions) {
  Json doc = start(ServerOptions().port(0).openapi(bus::http::OpenApiOptions()
                                                       .title("Orders")
                                                       .version("2.1.0")
                                                       .description("Orders, as JSON.")
                                                       .server("https://api.example.com/v2", "prod")
                                                       .path("/api/openapi.json")));
  EXPECT_EQ(at(doc, {"info"}),
            R"({"title":"Orders","version":"2.1.0","description":"Orders, as JSON."})");
  EXPECT_EQ(at(doc, {"servers"}), R"([{"url":"https://api.example.com/v2","description":"prod"}])");
  EXPECT_EQ(http_test::get(http->port(), "/api/openapi.json").body, http->openapi());
  EXPECT_EQ(http_test::get(http->port(), "/openapi.json").status, 404u);
  EXPECT_EQ(at(doc, {"paths", "/api/openapi.json", "get", "summary"}),
            R"x("This document (OpenAPI 3.1)")x");
}

TEST_F(OpenApi, AnEmptyPathServesNoDocumentButTheServerStillHasIt) {
  start(ServerOptions().port(0).openapi(bus::http::OpenApiOptions().path("")));
  EXPECT_EQ(http_test::get(http->port(), "/openapi.json").status, 404u);
  Json doc(http->openapi());
  EXPECT_EQ(at(doc, {"paths", "/openapi.json"}), "(none)");
  EXPECT_NE(at(doc, {"paths", "/orders/{id}"}), "(none)");
}

TEST_F(OpenApi, PathParametersAreTypedByTheFieldsTheySet) {
  Json doc = start();
  EXPECT_EQ(
      parameter(doc, "/orders/{id}", "get", "id"),
      R"({"name":"id","in":"path","required":true,"description":"Sets the request's field 'id'.",)"
      R"("schema":{"type":"integer","minimum":0,"maximum":4294967295}})");
  // A Data field takes the parameter's bytes as they are.
  EXPECT_EQ(at(doc, {"paths", "/notes/{blob}", "post", "parameters", "0", "schema"}),
            R"({"type":"string","description":"any bytes, percent-encoded"})");
  // A route mapped by hand has no schema: its parameters are text.
  EXPECT_EQ(
      parameter(doc, "/greeting/{name}", "get", "name"),
      R"({"name":"name","in":"path","required":true,"description":"Sets the request's field 'name'.",)"
      R"("schema":{"type":"string"}})");
}

TEST_F(OpenApi, QueryParametersAreTheOtherFieldsAParameterCanSet) {
  Json doc = start();
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "1"}),
            R"({"name":"customer","in":"query","required":false,)"
            R"("description":"Sets the request's field 'customer' (over the body's, if any).",)"
            R"("schema":{"type":"string"}})");
  EXPECT_EQ(
      parameter(doc, "/orders/{id}", "get", "quantity"),
      R"({"name":"quantity","in":"query","required":false,)"
      R"("description":"Sets the request's field 'quantity' (over the body's, if any).",)"
      R"("schema":{"type":"integer","format":"int32","minimum":-2147483648,"maximum":2147483647}})");
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "3", "schema"}),
            R"({"type":"number"})");  // price
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "4", "schema"}),
            R"({"type":"boolean"})");  // express
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "5", "schema"}),
            R"({"type":"string","enum":["standard","gift"]})");  // kind
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "6", "schema"}),
            R"({"type":"integer","format":"int64"})");  // big
  // A struct field comes only in the body.
  EXPECT_EQ(parameter(doc, "/orders/{id}", "get", "address"), "(none)");
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "parameters", "7"}), "(none)");
}

TEST_F(OpenApi, BodiesAreTheJsonSchemasOfTheirCapnProtoStructs) {
  Json doc = start();
  EXPECT_EQ(at(doc, {"paths", "/orders", "post", "requestBody", "content"}),
            R"({"application/json":{"schema":{"$ref":"#/components/schemas/Order.input"}}})");
  EXPECT_EQ(at(doc, {"paths", "/orders", "post", "responses", "200", "content"}),
            R"({"application/json":{"schema":{"$ref":"#/components/schemas/Order"}}})");
  // A GET takes no body.
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "requestBody"}), "(none)");

  // Replies: every non-pointer field is written (required), 64-bit integers as strings.
  EXPECT_EQ(at(doc, {"components", "schemas", "Order", "required"}),
            R"(["id","quantity","price","express","kind","big"])");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order", "properties", "big"}),
            R"({"type":"string","pattern":"^-?[0-9]+$"})");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order", "properties", "kind"}),
            R"({"type":"string","enum":["standard","gift"]})");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order", "properties", "address"}),
            R"({"$ref":"#/components/schemas/Address"})");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order", "additionalProperties"}), "false");
  // Requests: any field may be missing (its default is said), integers also from strings.
  EXPECT_EQ(at(doc, {"components", "schemas", "Order.input", "required"}), "(none)");
  EXPECT_EQ(
      at(doc, {"components", "schemas", "Order.input", "properties", "big"}),
      R"({"type":["integer","string"],"pattern":"^-?[0-9]+$","format":"int64","default":"0"})");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order.input", "properties", "kind", "default"}),
            R"("standard")");
  EXPECT_EQ(at(doc, {"components", "schemas", "Order.input", "properties", "address"}),
            R"({"$ref":"#/components/schemas/Address.input"})");
}

TEST_F(OpenApi, DataUnionsAndListsAreWrittenAsTheCodecWritesThem) {
  Json doc = start();
  EXPECT_EQ(at(doc, {"components", "schemas", "Note", "properties", "blob"}),
            R"({"type":"array","items":{"type":"integer","minimum":0,"maximum":255}})");
  EXPECT_EQ(at(doc, {"components", "schemas", "Note", "properties", "none"}), R"({"type":"null"})");
  // Union members: not required, and never two at once.
  EXPECT_EQ(at(doc, {"components", "schemas", "Note", "required"}), "(none)");
  EXPECT_EQ(at(doc, {"components", "schemas", "Note", "dependentSchemas", "text"}),
            R"({"not":{"anyOf":[{"required":["none"]}]}})");
  // A reply that is a list (Route::produces<T>()).
  EXPECT_EQ(at(doc, {"paths", "/ping", "get", "responses", "200", "content"}),
            R"({"application/json":{"schema":{"type":"array","items":{"type":"string"}}}})");
  EXPECT_EQ(at(doc, {"paths", "/greeting/{name}", "get", "responses", "200", "content"}),
            R"({"text/plain; charset=utf-8":{}})");
}

TEST_F(OpenApi, EachOperationListsTheStatusesTheServerGivesForIt) {
  Json doc = start();
  // A bus route: bad input, the handler's NotFound, its failure, no handler, the deadline.
  EXPECT_EQ(keys(doc, {"paths", "/orders/{id}", "get", "responses"}),
            (std::vector<std::string>{"200", "400", "404", "500", "503", "504", "default"}));
  // With a body: too large.
  EXPECT_EQ(keys(doc, {"paths", "/orders", "post", "responses"}),
            (std::vector<std::string>{"200", "400", "404", "413", "500", "503", "504", "default"}));
  // A direct handler that requires a scope; no server-wide tokens, so no 401 for a bad one.
  EXPECT_EQ(keys(doc, {"paths", "/admin", "get", "responses"}),
            (std::vector<std::string>{"200", "400", "401", "403", "500", "default"}));
  // /health answers 503 with its own body when something is down.
  EXPECT_EQ(at(doc, {"paths", "/health", "get", "responses", "503", "content"}),
            R"({"application/json":{"schema":{"$ref":"#/components/schemas/Health"}}})");
  // Every error is the ErrorBody.
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "responses", "504"}),
            R"({"$ref":"#/components/responses/DeadlineExceeded"})");
  EXPECT_EQ(at(doc, {"components", "responses", "DeadlineExceeded", "content"}),
            R"({"application/json":{"schema":{"$ref":"#/components/schemas/ErrorBody"}}})");
  EXPECT_EQ(at(doc, {"components", "schemas", "ErrorBody", "required"}), "(none)");
  EXPECT_EQ(keys(doc, {"components", "schemas", "ErrorBody", "properties"}),
            (std::vector<std::string>{"error", "detail"}));
  // No security where the server authenticates no one.
  EXPECT_EQ(at(doc, {"security"}), "[{}]");
  EXPECT_EQ(at(doc, {"components", "securitySchemes"}), "(none)");
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "security"}), "(none)");
}

TEST_F(OpenApi, RateLimitedRoutesList429) {
  bus::net::RateLimiter limiter(services.bus, "openapi-test");
  http = std::make_unique<Server>(services.bus, ServerOptions().port(0));
  http->route(Method::kGet, "/orders/{id}", echo).limit(limiter, [](const Request&) {
    return std::string("everyone");
  });
  http->start();
  Json doc(http->openapi());
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "responses", "429"}),
            R"({"$ref":"#/components/responses/TooManyRequests"})");
  EXPECT_EQ(
      at(doc, {"components", "responses", "TooManyRequests", "headers", "Retry-After", "schema"}),
      R"({"type":"string"})");
}

TEST_F(OpenApi, BearerTokensAndScopesAreSecurityRequirements) {
  pki_test::Pki pki;
  pki.leaf("jwt", rsa_leaf());
  pki_test::Pki::run("openssl pkey -in " + pki.key("jwt") + " -pubout -out " + pki.pem("jwt-pub"));
  http = std::make_unique<Server>(
      services.bus,
      ServerOptions().port(0).jwt(bus::http::JwtOptions().key_file(pki.pem("jwt-pub"))));
  http->route(Method::kGet, "/orders/{id}", echo).require("orders:read");
  http->route(Method::kPost, "/orders", echo).require();
  http->route(Method::kGet, "/greeting/{name}", greet);
  http->start();
  Json doc(http->openapi());
  EXPECT_EQ(at(doc, {"components", "securitySchemes"}),
            R"({"bearerAuth":{"type":"http","scheme":"bearer","bearerFormat":"JWT",)"
            R"("description":"A JWT (RS256, ES256 or HS256) in Authorization: Bearer. Scopes come )"
            R"(from its scope (or scp) claim."}})");
  EXPECT_EQ(at(doc, {"paths", "/orders/{id}", "get", "security"}),
            R"([{"bearerAuth":["orders:read"]}])");
  EXPECT_EQ(at(doc, {"paths", "/orders", "post", "security"}), R"([{"bearerAuth":[]}])");
  // Open: no credentials, or a token (checked when given).
  EXPECT_EQ(at(doc, {"paths", "/greeting/{name}", "get", "security"}), R"([{},{"bearerAuth":[]}])");
  EXPECT_EQ(keys(doc, {"paths", "/orders/{id}", "get", "responses"}),
            (std::vector<std::string>{"200", "400", "401", "403", "404", "500", "503", "504",
                                      "default"}));
  // Any route: a token given and refused is a 401.
  EXPECT_EQ(at(doc, {"paths", "/greeting/{name}", "get", "responses", "401"}),
            R"({"$ref":"#/components/responses/Unauthorized"})");
  EXPECT_EQ(at(doc, {"paths", "/greeting/{name}", "get", "responses", "403"}), "(none)");
  EXPECT_EQ(keys(doc, {"components", "responses", "Unauthorized", "headers"}),
            (std::vector<std::string>{"WWW-Authenticate"}));
}

TEST_F(OpenApi, ClientCertificatesAreAMutualTlsScheme) {
  pki_test::Pki pki;
  pki.ca("ca");
  pki_test::Pki::Leaf server;
  server.issuer = "ca";
  pki.leaf("server", server);
  http = std::make_unique<Server>(
      services.bus, ServerOptions().port(0).tls(bus::http::TlsOptions()
                                                    .port(0)
                                                    .certificate_chain(pki.pem("server"))
                                                    .private_key(pki.key("server"))
                                                    .client_ca(pki.pem("ca"))));
  http->route(Method::kPost, "/orders", echo).require();
  http->start();
  Json doc(http->openapi());
  EXPECT_EQ(at(doc, {"components", "securitySchemes", "mutualTLS", "type"}), R"("mutualTLS")");
  EXPECT_EQ(at(doc, {"paths", "/orders", "post", "security"}), R"([{"mutualTLS":[]}])");
}

TEST_F(OpenApi, TheWebSocketIsAnOperationOfItsPath) {
  http = std::make_unique<Server>(services.bus, ServerOptions().port(0));
  http->websocket().endpoint(greet);
  http->start();
  Json doc(http->openapi());
  EXPECT_EQ(keys(doc, {"paths", "/bus", "get", "responses"}),
            (std::vector<std::string>{"101", "400", "403", "426", "default"}));
}

// ---- the document checked by real validators (npm, scripts/npm_tools.sh installs them)

/// Why the npm tools cannot run here, or empty.
std::string tools_missing() {
  if (pki_test::capture("node --version").exit != 0) {
    return "node is missing: bash scripts/npm_tools.sh (it installs Debian's nodejs and npm)";
  }
  if (!std::filesystem::exists(std::string(kNodeModules) + "/@redocly/cli") ||
      !std::filesystem::exists(std::string(kNodeModules) + "/ajv")) {
    return std::string(kNodeModules) + " lacks @redocly/cli or ajv: bash scripts/npm_tools.sh";
  }
  return {};
}

/// A scratch file that goes with the object.
class Scratch {
 public:
  explicit Scratch(std::string_view suffix)
      : path_("/tmp/bus-openapi-" + std::to_string(::getpid()) + "-" + std::to_string(++n_) +
              std::string(suffix)) {}
  ~Scratch() { std::filesystem::remove(path_); }
  const std::string& write(std::string_view text) {
    std::ofstream(path_) << text;
    return path_;
  }

 private:
  static inline int n_ = 0;
  std::string path_;
};

TEST_F(OpenApi, RedoclyLintsTheDocumentWithoutErrors) {
  if (std::string why = tools_missing(); !why.empty()) GTEST_SKIP() << why;
  pki_test::Pki pki;
  pki.leaf("jwt", rsa_leaf());
  pki_test::Pki::run("openssl pkey -in " + pki.key("jwt") + " -pubout -out " + pki.pem("jwt-pub"));
  bus::net::RateLimiter limiter(services.bus, "openapi-lint");
  http = std::make_unique<Server>(
      services.bus,
      ServerOptions().port(0).jwt(bus::http::JwtOptions().key_file(pki.pem("jwt-pub"))));
  add_routes(*http);
  http->route(Method::kPut, "/orders/{id}", echo)
      .require("orders:write")
      .limit(limiter, [](const Request&) { return std::string("all"); });
  http->websocket().endpoint(greet);
  http->start();

  // With tokens, and without (a server that authenticates no one).
  Server plain(services.bus, ServerOptions().port(0));
  add_routes(plain);
  plain.start();
  for (const std::string* document : {&http->openapi(), &plain.openapi()}) {
    Scratch file(".json");
    // The recommended rules; a warning (no license, say) is not an error.
    pki_test::Output lint = pki_test::capture(
        "env REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true node " +
        std::string(kNodeModules) + "/@redocly/cli/bin/cli.js lint --format=stylish " +
        file.write(*document));
    EXPECT_EQ(lint.exit, 0) << lint.text;
    EXPECT_TRUE(contains(lint.text, "Woohoo! Your API description is valid.")) << lint.text;
  }
}

TEST_F(OpenApi, TheSchemasAgreeWithWhatTheServerWritesAndReads) {
  if (std::string why = tools_missing(); !why.empty()) GTEST_SKIP() << why;
  start();
  std::string cases;
  auto add = [&](std::string_view label, std::string_view schema, std::string_view instance,
                 bool expect) {
    cases += std::string(cases.empty() ? "" : ",") + R"({"label":)" + quoted(label) +
             R"(,"schema":)" + quoted(schema) + R"(,"instance":)" + std::string(instance) +
             R"(,"expect":)" + (expect ? "true" : "false") + "}";
  };
  http_test::Connection c(http->port());
  // Replies, as the server writes them: each must fit its schema.
  for (std::string target :
       {"/orders/7?customer=Ada&quantity=-3&price=2.5&express=true&kind=gift&big=-9007199254740993",
        "/orders/0", "/orders/1?price=nan", "/orders/1?price=inf", "/orders/1?price=-inf",
        "/orders/4294967295?big=18446744073709551615"}) {
    auto r = c.request("GET", target);
    if (r.status == 200) {
      add("GET " + target, "Order", r.body, true);
    } else {
      add("GET " + target + " (refused)", "ErrorBody", r.body, true);
    }
  }
  auto posted = c.request("POST", "/orders", R"({"address":{"street":"Main","city":"Bern"}})");
  ASSERT_EQ(posted.status, 200u) << describe(posted);
  add("POST /orders with an address", "Order", posted.body, true);
  for (std::string body : {R"({"text":"a note"})", R"({"none":null})", "{}"}) {
    auto r = c.request("POST", "/notes/%00%01%FF", body);
    ASSERT_EQ(r.status, 200u) << body << ": " << describe(r);
    add("POST /notes " + body, "Note", r.body, true);
  }
  auto bad = c.request("GET", "/orders/x");
  ASSERT_EQ(bad.status, 400u);
  add("a 400", "ErrorBody", bad.body, true);
  auto health = c.request("GET", "/health");
  add("/health", "Health", health.body, true);

  // Request bodies: the schema takes what the server takes (200) and refuses what it refuses
  // (400). (Integers in strings: the schema gives the plain form; the server also takes "+5" and
  // " 5".)
  for (std::string body : {"{}",
                           R"({"id":5})",
                           R"({"id":"5"})",
                           R"({"id":-1})",
                           R"({"id":1.5})",
                           R"({"id":4294967296})",
                           R"({"id":true})",
                           R"({"id":null})",
                           R"({"big":"123"})",
                           R"({"big":-123})",
                           R"({"big":"x"})",
                           R"({"id":"-1"})",
                           R"({"big":1.5})",
                           R"({"quantity":2147483648})",
                           R"({"quantity":"-7"})",
                           R"({"price":1e300})",
                           R"({"price":"2.5"})",
                           R"({"price":null})",
                           R"({"price":"NaN"})",
                           R"({"price":"Infinity"})",
                           R"({"price":true})",
                           R"({"express":"true"})",
                           R"({"express":null})",
                           R"({"kind":"gift"})",
                           R"({"kind":"nope"})",
                           R"({"kind":1})",
                           R"({"kind":null})",
                           R"({"customer":null})",
                           R"({"customer":5})",
                           R"({"address":{"street":"a"}})",
                           R"({"address":{"zip":1}})",
                           R"({"address":null})",
                           R"({"address":[]})",
                           R"({"unknown":1})",
                           "[]"}) {
    auto r = c.request("POST", "/orders", body);
    ASSERT_TRUE(r.status == 200 || r.status == 400) << body << ": " << describe(r);
    add("POST /orders " + body, "Order.input", body, r.status == 200);
  }
  for (std::string body :
       {R"({"text":"x"})", R"({"none":null})", R"({"none":5})", R"({"text":"x","none":null})",
        R"({"blob":[1,2,255]})", R"({"blob":[256]})", R"({"blob":["7"]})", R"({"blob":"AAE="})",
        R"({"text":null})"}) {
    auto r = c.request("POST", "/notes", body);
    ASSERT_TRUE(r.status == 200 || r.status == 400) << body << ": " << describe(r);
    add("POST /notes " + body, "Note.input", body, r.status == 200);
  }

  Scratch file(".json");
  pki_test::Output check = pki_test::capture(
      "node " BUS_SOURCE_DIR "/tests/endpoint/tools/check_schemas.cjs " +
      std::string(kNodeModules) + " " +
      file.write(R"({"document":)" + http->openapi() + R"(,"cases":[)" + cases + "]}"));
  EXPECT_EQ(check.exit, 0) << check.text;
  EXPECT_TRUE(contains(check.text, "cases as expected")) << check.text;
}

}  // namespace
