// The OpenAPI 3.1 document, built as Cap'n Proto JsonValues and written by its JSON codec. It
// says what the server does, not what a route could in theory: the statuses listed are those the
// server itself gives for that route (its checks, its limits, the bus's outcomes), and `default`
// stands for whatever else a handler may return (status_for's table).
#include "openapi.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <bus/schemas/http.capnp.h>
#include <capnp/message.h>

#include <map>
#include <set>

#include "bus/http/json.hpp"
#include "json_schema.hpp"

namespace bus::http::detail {
namespace {

bool takes_body(Method m) { return m == Method::kPost || m == Method::kPut || m == Method::kPatch; }

/// "get_orders_id" for GET /orders/{id}: unique, and usable as a name by client generators.
std::string operation_id(Method m, std::string_view path, std::set<std::string>& taken) {
  std::string id = absl::AsciiStrToLower(std::string(to_string(m)));
  std::string_view rest = path;
  if (rest == "/") id += "_root";
  for (char c : rest) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) {
      id += c;
    } else if (c == '/' || c == '.' || c == '-') {
      if (id.back() != '_') id += '_';
    }
  }
  while (id.back() == '_') id.pop_back();
  std::string unique = id;
  for (int n = 2; !taken.insert(unique).second; ++n) unique = absl::StrCat(id, "_", n);
  return unique;
}

/// The error responses, each written once under components/responses and referred to.
struct ErrorResponse {
  std::string_view name;
  unsigned status;
  std::string_view description;
};
constexpr ErrorResponse kBadRequest{
    "BadRequest", 400,
    "Malformed HTTP or request target, ambiguous framing (the connection is closed), a body "
    "that is not a JSON object of the request's fields, or a parameter of the wrong type."};
constexpr ErrorResponse kUnauthorized{
    "Unauthorized", 401,
    "No credentials where the route requires them, or a bearer token refused (expired, not yet "
    "valid, bad signature, wrong issuer or audience); WWW-Authenticate says which."};
constexpr ErrorResponse kForbidden{"Forbidden", 403,
                                   "The token is valid but lacks a scope the route requires."};
constexpr ErrorResponse kNotFound{"NotFound", 404, "The handler found nothing (NotFound)."};
constexpr ErrorResponse kPayloadTooLarge{
    "PayloadTooLarge", 413, "The body is larger than the server takes; the connection is closed."};
constexpr ErrorResponse kTooManyRequests{
    "TooManyRequests", 429, "The route's rate limit is reached for this caller; retry later."};
constexpr ErrorResponse kInternal{"Internal", 500, "The handler failed or threw."};
constexpr ErrorResponse kUnavailable{
    "Unavailable", 503,
    "No live handler (none here, no node serving it), its node died, its queue is full, or the "
    "server is stopping."};
constexpr ErrorResponse kDeadlineExceeded{
    "DeadlineExceeded", 504, "The route's deadline passed before the handler answered."};
constexpr ErrorResponse kOtherError{
    "Error", 0,
    "Any other error a handler returns (409 AlreadyExists, 501 Unimplemented, ...), or the "
    "server's own: 405 for a method the path lacks (Allow lists its methods), 413 for a body "
    "over the limit, 431 for headers over the limit, 501 for a transfer coding other than "
    "chunked."};

class Document {
 public:
  explicit Document(const ApiSurface& api) : api_(api), o_(message_.getOrphanage()), schemas_(o_) {
    const ServerOptions& options = *api.options;
    bearer_ = options.jwt().has_value();
    mtls_ = options.tls() && !options.tls()->client_ca().empty();
  }

  std::string write() {
    const ServerOptions& options = *api_.options;
    JsonObject doc(o_);
    doc.add("openapi", "3.1.0");
    JsonObject info(o_);
    info.add("title", options.openapi().title());
    info.add("version", options.openapi().version());
    info.add("description",
             options.openapi().description().empty()
                 ? std::string_view(
                       "Bodies are JSON written and read by Cap'n Proto's JSON codec: 64-bit "
                       "integers are strings, Data is an array of bytes, enums are their names. "
                       "Every error is a JSON ErrorBody. A GET route answers HEAD too; OPTIONS "
                       "on a routed path answers 200 with Allow, and another method 405.")
                 : std::string_view(options.openapi().description()));
    doc.add("info", std::move(info));
    JsonArray servers(o_);
    for (const OpenApiOptions::Server& s : options.openapi().servers()) {
      JsonObject server(o_);
      server.add("url", s.url);
      if (!s.description.empty()) server.add("description", s.description);
      servers.add(server);
    }
    // Relative to where the document was fetched: the same document serves HTTP and HTTPS.
    if (servers.empty()) servers.add(JsonObject(o_).add("url", "/"));
    doc.add("servers", servers);
    // Said outright when no one is authenticated: no operation needs credentials.
    if (!bearer_ && !mtls_) doc.add("security", JsonArray(o_).add(JsonObject(o_)));
    doc.add("paths", paths());
    JsonArray tags(o_);
    for (const auto& [name, description] : tags_) {
      tags.add(JsonObject(o_).add("name", name).add("description", description));
    }
    if (!tags.empty()) doc.add("tags", std::move(tags).finish());
    doc.add("components", components());
    JsonOrphan root = doc.finish();
    kj::String text = codec().encodeRaw(root.getReader());
    return std::string(text.cStr(), text.size());
  }

 private:
  JsonOrphan paths() {
    // One path item per template, its operations in the order the routes were added.
    std::vector<std::string> order;
    std::map<std::string, std::vector<const ApiSurface::Route*>> by_path;
    for (const ApiSurface::Route& r : api_.routes) {
      auto& ops = by_path[r.spec->path];
      if (ops.empty()) order.push_back(r.spec->path);
      ops.push_back(&r);
    }
    JsonObject paths(o_);
    for (const std::string& path : order) {
      // The WebSocket bridge answers its path before any route could.
      if (api_.websocket != nullptr && path == api_.websocket->path()) continue;
      JsonObject item(o_);
      std::vector<std::string> methods;
      for (const ApiSurface::Route* r : by_path[path]) {
        methods.emplace_back(to_string(r->spec->method));
        if (r->spec->method == Method::kGet) methods.emplace_back("HEAD");
        item.add(absl::AsciiStrToLower(std::string(to_string(r->spec->method))), operation(*r));
      }
      item.add("description", absl::StrCat("Methods other than ", absl::StrJoin(methods, ", "),
                                           " and OPTIONS are answered 405 with Allow."));
      paths.add(path, std::move(item));
    }
    if (api_.websocket != nullptr) {
      paths.add(api_.websocket->path(), JsonObject(o_).add("get", websocket()));
    }
    return std::move(paths).finish();
  }

  JsonOrphan operation(const ApiSurface::Route& r) {
    const RouteSpec& spec = *r.spec;
    RouteDoc d = spec.doc ? spec.doc() : RouteDoc();
    const Access* access = spec.access.get();
    const bool authenticated = access != nullptr && access->authenticated;
    const bool scoped = authenticated && !access->scopes.empty();

    JsonObject op(o_);
    if (!d.tag.empty()) {
      op.add("tags", JsonArray(o_).add(d.tag).finish());
      tags_.emplace(d.tag, d.bus ? absl::StrCat("Routes to the bus endpoint '", d.tag, "'")
                                 : std::string("Answered by the server itself"));
    }
    op.add("operationId", operation_id(spec.method, spec.path, operation_ids_));
    op.add("summary", !d.summary.empty() ? d.summary
                      : d.bus ? absl::StrCat("Calls the bus endpoint '", spec.endpoint, "'")
                              : std::string("Answered by the server"));
    if (!d.description.empty()) op.add("description", d.description);

    JsonArray params(o_);
    std::set<std::string> in_path(r.params.begin(), r.params.end());
    for (const std::string& name : r.params) {
      JsonObject p(o_);
      p.add("name", name).add("in", "path").add("required", json_bool(o_, true));
      JsonOrphan schema = JsonObject(o_).add("type", "string").finish();
      if (d.request) {
        KJ_IF_MAYBE (f, d.request->findFieldByName(name)) {
          schema = schemas_.parameter(f->getType());
          p.add("description", absl::StrCat("Sets the request's field '", name, "'."));
        }
      }
      p.add("schema", std::move(schema));
      params.add(std::move(p));
    }
    if (d.request) {
      // Any field a text can set may come as a query parameter too (it overrides the body's).
      for (capnp::StructSchema::Field f : d.request->getFields()) {
        std::string name = f.getProto().getName().cStr();
        if (f.getProto().isGroup() || in_path.count(name) != 0) continue;
        if (!JsonSchemas::settable_from_text(f.getType())) continue;
        JsonObject p(o_);
        p.add("name", name).add("in", "query").add("required", json_bool(o_, false));
        p.add("description",
              absl::StrCat("Sets the request's field '", name, "' (over the body's, if any)."));
        p.add("schema", schemas_.parameter(f.getType()));
        params.add(std::move(p));
      }
    }
    if (!params.empty()) op.add("parameters", std::move(params).finish());

    if (d.request && takes_body(spec.method)) {
      JsonObject body(o_);
      body.add("description",
               "The request's fields as a JSON object (none: every field keeps its default).");
      body.add("required", json_bool(o_, false));
      body.add("content", json_content(schemas_.of(capnp::Type(*d.request), Direction::kIn)));
      op.add("requestBody", std::move(body));
    }

    JsonObject responses(o_);
    for (unsigned status : d.reply_statuses) {
      JsonObject ok(o_);
      ok.add("description", status == 200 ? "The reply." : "The reply, reporting a failure.");
      if (!d.media_type.empty()) {
        JsonObject media(o_);
        if (d.reply) media.add("schema", schemas_.of(*d.reply, Direction::kOut));
        ok.add("content", JsonObject(o_).add(d.media_type, std::move(media)));
      }
      responses.add(std::to_string(status), std::move(ok));
    }
    auto error = [&](const ErrorResponse& e, bool when) {
      if (!when) return;
      for (unsigned s : d.reply_statuses) {
        if (s == e.status) return;
      }
      responses.add(std::to_string(e.status), refer(e));
    };
    error(kBadRequest, true);
    error(kUnauthorized, authenticated || bearer_);
    error(kForbidden, scoped);
    error(kNotFound, d.bus);
    error(kPayloadTooLarge, takes_body(spec.method));
    error(kTooManyRequests, d.limited);
    error(kInternal, d.bus || spec.doc == nullptr);
    error(kUnavailable, d.bus);
    error(kDeadlineExceeded, d.bus);
    responses.add("default", refer(kOtherError));
    op.add("responses", std::move(responses));
    if (JsonOrphan s = security(authenticated, access ? access->scopes : kNoScopes); s != nullptr) {
      op.add("security", std::move(s));
    }
    return std::move(op).finish();
  }

  JsonOrphan websocket() {
    const WebSocketOptions& ws = *api_.websocket;
    JsonObject op(o_);
    op.add("tags", JsonArray(o_).add("server").finish());
    tags_.emplace("server", "Answered by the server itself");
    op.add("operationId", operation_id(Method::kGet, ws.path(), operation_ids_));
    op.add("summary", "Opens a WebSocket to the bus (subscribe, publish, call)");
    op.add("description",
           "An upgrade (RFC 6455). The frames are JSON; docs/websocket.md describes them. A "
           "browser's Origin must be the server's own or one CORS allows.");
    if (bearer_) {
      JsonObject p(o_);
      p.add("name", "access_token").add("in", "query").add("required", json_bool(o_, false));
      p.add("description", "A bearer token, for browsers, which cannot set Authorization here.");
      p.add("schema", JsonObject(o_).add("type", "string"));
      op.add("parameters", JsonArray(o_).add(std::move(p)).finish());
    }
    JsonObject responses(o_);
    responses.add("101", JsonObject(o_).add("description", "Switched to the WebSocket protocol."));
    responses.add("400", refer(kBadRequest));
    if (ws.require_authentication() || bearer_) responses.add("401", refer(kUnauthorized));
    responses.add("403", refer(ErrorResponse{"OriginRefused", 403,
                                             "The browser's Origin is not allowed here."}));
    responses.add("426", refer(ErrorResponse{"UpgradeRequired", 426,
                                             "The request asked for no WebSocket upgrade."}));
    responses.add("default", refer(kOtherError));
    op.add("responses", std::move(responses));
    if (JsonOrphan s = security(ws.require_authentication(), kNoScopes); s != nullptr) {
      op.add("security", std::move(s));
    }
    return std::move(op).finish();
  }

  /// The operation's security requirements: null when the server authenticates no one.
  JsonOrphan security(bool required, const std::vector<std::string>& scopes) {
    if (!bearer_ && !mtls_) return JsonOrphan();
    JsonArray options(o_);
    // Credentials are optional where not required, but a bearer token given is checked (401).
    if (!required) options.add(JsonObject(o_));
    if (bearer_) {
      JsonArray needed(o_);
      for (const std::string& s : scopes) needed.add(s);
      options.add(JsonObject(o_).add("bearerAuth", std::move(needed).finish()));
    }
    // A client certificate's principal carries no scopes.
    if (mtls_ && scopes.empty())
      options.add(JsonObject(o_).add("mutualTLS", JsonArray(o_).finish()));
    if (options.empty()) return JsonArray(o_).finish();  // required, and nothing can satisfy it
    return std::move(options).finish();
  }

  JsonOrphan json_content(JsonOrphan schema) {
    return JsonObject(o_)
        .add("application/json", JsonObject(o_).add("schema", std::move(schema)))
        .finish();
  }

  JsonOrphan refer(const ErrorResponse& e) {
    used_responses_.emplace(std::string(e.name), e);
    return JsonObject(o_)
        .add("$ref", absl::StrCat("#/components/responses/", std::string(e.name)))
        .finish();
  }

  JsonOrphan components() {
    JsonObject components(o_);
    std::string error_body =
        schemas_.ref(capnp::Schema::from<schemas::http::ErrorBody>(), Direction::kOut);
    JsonObject responses(o_);
    for (const auto& [name, e] : used_responses_) {
      JsonObject r(o_);
      r.add("description", e.description);
      JsonObject headers(o_);
      if (e.status == 401 || e.status == 403) {
        headers.add("WWW-Authenticate",
                    header("The challenge (RFC 6750): realm, error, error_description, scope."));
      }
      if (e.status == 429) headers.add("Retry-After", header("Seconds to wait (RFC 9110)."));
      if (name == kOtherError.name) headers.add("Allow", header("With 405: the path's methods."));
      if (!headers.empty()) r.add("headers", std::move(headers));
      r.add("content", json_content(JsonObject(o_).add("$ref", error_body).finish()));
      responses.add(name, std::move(r));
    }
    components.add("schemas", std::move(schemas_).finish());
    components.add("responses", std::move(responses));
    JsonObject schemes(o_);
    if (bearer_) {
      schemes.add("bearerAuth", JsonObject(o_)
                                    .add("type", "http")
                                    .add("scheme", "bearer")
                                    .add("bearerFormat", "JWT")
                                    .add("description",
                                         "A JWT (RS256, ES256 or HS256) in Authorization: Bearer. "
                                         "Scopes come from its scope (or scp) claim."));
    }
    if (mtls_) {
      schemes.add("mutualTLS",
                  JsonObject(o_)
                      .add("type", "mutualTLS")
                      .add("description",
                           "A client certificate issued by the server's client CA; its subject is "
                           "the caller."));
    }
    if (!schemes.empty()) components.add("securitySchemes", std::move(schemes));
    return std::move(components).finish();
  }

  JsonOrphan header(std::string_view description) {
    return JsonObject(o_)
        .add("description", description)
        .add("schema", JsonObject(o_).add("type", "string"))
        .finish();
  }

  static inline const std::vector<std::string> kNoScopes;

  const ApiSurface& api_;
  capnp::MallocMessageBuilder message_;
  capnp::Orphanage o_;
  JsonSchemas schemas_;
  bool bearer_ = false;
  bool mtls_ = false;
  std::set<std::string> operation_ids_;
  std::map<std::string, std::string> tags_;
  std::map<std::string, ErrorResponse> used_responses_;
};

}  // namespace

std::string openapi_document(const ApiSurface& api) { return Document(api).write(); }

}  // namespace bus::http::detail
