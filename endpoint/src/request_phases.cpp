// The phases of a request between its parse and its route, run in order by Session::dispatch()
// as nginx runs its phase handlers: method and framing, CORS, target, WebSocket upgrade, path,
// route, authentication, authorization, admission. One translation unit, so that they inline.
#include <absl/container/inlined_vector.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <kj/compat/url.h>

#include "cors.hpp"
#include "framing.hpp"
#include "io.hpp"

namespace bus::http::detail {
namespace {

std::optional<Method> method_of(bh::verb v) {
  switch (v) {
    case bh::verb::get: return Method::kGet;
    case bh::verb::head: return Method::kHead;
    case bh::verb::post: return Method::kPost;
    case bh::verb::put: return Method::kPut;
    case bh::verb::patch: return Method::kPatch;
    case bh::verb::delete_: return Method::kDelete;
    case bh::verb::options: return Method::kOptions;
    default: return std::nullopt;
  }
}

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// `s` fit for a quoted-string of WWW-Authenticate (RFC 6750 §3 allows no '"' or '\\' in
/// error_description, and a token's kid is the client's text).
std::string quotable(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c < 0x20 || c > 0x7e || c == '"' || c == '\\') c = '?';
  }
  return out;
}

}  // namespace

Reply unauthorized(std::string_view realm, std::string_view error, std::string_view description) {
  Reply r = Reply::error(401, "unauthenticated",
                         description.empty() ? "this route needs a bearer token" : description);
  std::string challenge = absl::StrCat("Bearer realm=\"", quotable(realm), "\"");
  if (!error.empty()) {
    absl::StrAppend(&challenge, ", error=\"", av(error), "\", error_description=\"",
                    quotable(description), "\"");
  }
  r.headers.emplace_back("WWW-Authenticate", std::move(challenge));
  return r;
}

Reply forbidden(std::string_view realm, std::string_view scope) {
  Reply r =
      Reply::error(403, "forbidden",
                   absl::StrCat("this route needs scope '", av(scope), "', which the token lacks"));
  r.headers.emplace_back(
      "WWW-Authenticate",
      absl::StrCat("Bearer realm=\"", quotable(realm), "\", error=\"insufficient_scope\", scope=\"",
                   quotable(scope), "\""));
  return r;
}

/// What dispatch()'s phases learn of a request, for the phases after them. On dispatch()'s
/// stack: `path` views into the target or into `url`.
struct Session::Routing {
  explicit Routing(bh::request<bh::string_body>& m) : msg(m) {}

  bh::request<bh::string_body>& msg;
  Method method = Method::kGet;
  std::string_view target;
  TargetForm form = TargetForm::kInvalid;
  // A request path of up to 8 segments takes no allocation (a std::vector took two for
  // /greeting/{name}, growing).
  absl::InlinedVector<std::string_view, 8> path;
  Request::Fields query;
  kj::Maybe<kj::Url> url;
  std::optional<Router::Match> match;
  PrincipalPtr principal;  // who asks, or null
};

// The request's phases in order, as nginx runs its own: each either lets the next one go on or
// has answered the request itself.
void Session::dispatch() {
  Routing r(parser_->get());
  // A method this server implements (501), framing it can trust (400, then close).
  if (read_head(r) == Next::kAnswered) return;
  // Which origin may read the answer (CORS).
  allow_origin(r);
  // An origin-form target: '*' is answered here, an absolute-form one reduced to its path.
  if (resolve_target(r) == Next::kAnswered) return;
  // The WebSocket path is upgraded or refused, never routed.
  if (upgrade_websocket(r) == Next::kAnswered) return;
  // The path's segments and the query (400 when the target does not parse).
  if (split_path(r) == Next::kAnswered) return;
  // The route; without one a preflight, OPTIONS, 405 or 404 answers.
  if (match_route(r) == Next::kAnswered) return;
  // Who asks: a bearer token's principal, else the client certificate's (401 for a bad token).
  if (authenticate(r) == Next::kAnswered) return;
  // Whether the route lets them in: authenticated (401) and with its scopes (403).
  if (authorize(r) == Next::kAnswered) return;
  // The route runs now, or waits for a turn.
  admit(r);
}

Session::Next Session::read_head(Routing& r) {
  version_ = r.msg.version();
  keep_alive_ = r.msg.keep_alive();
  close_after_ = false;
  cors_allowed_ = {};
  head_ = r.msg.method() == bh::verb::head;
  std::optional<Method> method = method_of(r.msg.method());
  if (!method) {
    route_ = io_.server.unmatched;
    write(Reply::error(501, "not_implemented",
                       "method " + std::string(view(r.msg.method_string())) + " is not served"),
          nullptr);
    return Next::kAnswered;
  }
  r.method = *method;
  if (std::optional<Reply> bad = framing_error(r.msg)) {
    refuse(std::move(*bad), true);
    return Next::kAnswered;
  }
  return Next::kContinue;
}

void Session::allow_origin(const Routing& r) {
  if (const std::optional<CorsOptions>& cors = io_.server.options.cors()) {
    // A browser's cross-origin request: its answer says whether the page may read it.
    if (auto origin = r.msg.find(bh::field::origin); origin != r.msg.end()) {
      cors_allowed_ = allowed_origin(*cors, view(origin->value()));
    }
  }
}

Session::Next Session::resolve_target(Routing& r) {
  r.target = view(r.msg.target());
  r.form = classify_target(r.target);
  if (r.form == TargetForm::kAsterisk) {
    route_ = io_.server.unmatched;
    if (r.method != Method::kOptions) {
      refuse(Reply::error(400, "bad_request", "'*' is a request target for OPTIONS only"), false);
      return Next::kAnswered;
    }
    // A server-wide OPTIONS (RFC 9110 §9.3.7): what this server implements, and no content.
    static const std::string kMethods = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS";
    write(Reply{200, "", "", {}}, &kMethods);
    return Next::kAnswered;
  }
  if (r.form == TargetForm::kAbsolute) {
    // The path after the authority is the target (RFC 9112 §3.2.2: servers accept this form).
    std::optional<std::string> origin = origin_form(r.target);
    if (origin) {
      absolute_target_ = std::move(*origin);
      r.target = absolute_target_;
      r.form = classify_target(r.target);
    } else {
      r.form = TargetForm::kInvalid;
    }
  }
  if (r.form == TargetForm::kInvalid) {
    refuse(Reply::error(400, "bad_request",
                        "malformed request target: it must be a path starting with '/' in visible "
                        "ASCII (percent-encode other bytes)"),
           false);
    return Next::kAnswered;
  }
  return Next::kContinue;
}

Session::Next Session::upgrade_websocket(const Routing& r) {
  const WebSocketBridge* ws = io_.server.websocket.get();
  if (ws == nullptr || r.target.substr(0, r.target.find('?')) != ws->options().path()) {
    return Next::kContinue;
  }
  route_ = io_.server.unmatched;
  if (r.method != Method::kGet) {
    write(Reply::error(426, "upgrade_required",
                       "GET " + ws->options().path() + " is a WebSocket: send an upgrade"),
          nullptr);
    return Next::kAnswered;
  }
  std::optional<Reply> refused =
      upgrade(io_, *parser_, client_principal_, [this] { return hand_over(); });
  if (refused) write(std::move(*refused), nullptr);
  return Next::kAnswered;  // refused, or the connection is the WebSocket's now
}

Session::Next Session::split_path(Routing& r) {
  if (r.form == TargetForm::kPlain) {
    // Nothing to decode, no query, no dot segments: the path is its '/'-separated segments
    // (empty ones dropped, as kj::Url does). Saves kj::Url's allocations on the common request.
    for (absl::string_view seg : absl::StrSplit(av(r.target), '/', absl::SkipEmpty())) {
      r.path.emplace_back(seg.data(), seg.size());
    }
    return Next::kContinue;
  }
  r.url = kj::Url::tryParse(std::string(r.target), kj::Url::HTTP_REQUEST);
  kj::Url* parsed = nullptr;
  KJ_IF_MAYBE (u, r.url) {
    parsed = u;
  }
  if (parsed == nullptr) {
    refuse(Reply::error(400, "bad_request", "malformed request target: " + std::string(r.target)),
           false);
    return Next::kAnswered;
  }
  r.path.reserve(parsed->path.size());
  for (const kj::String& seg : parsed->path) r.path.emplace_back(seg.cStr(), seg.size());
  r.query.reserve(parsed->query.size());
  for (const auto& q : parsed->query) {
    r.query.emplace_back(std::string(q.name.cStr(), q.name.size()),
                         std::string(q.value.cStr(), q.value.size()));
  }
  return Next::kContinue;
}

Session::Next Session::match_route(Routing& r) {
  Router::Miss miss;
  r.match = io_.server.router.match(r.method, r.path, &miss);
  if (r.match) {
    route_ = r.match->route;
    return Next::kContinue;
  }
  if (answer_preflight(r, miss) == Next::kAnswered) return Next::kAnswered;
  route_ = io_.server.unmatched;
  if (miss.path_known && r.method == Method::kOptions) {
    // No OPTIONS route here: what the path allows, and no content (RFC 9110 §9.3.7).
    miss.allow += ", OPTIONS";
    write(Reply{200, "", "", {}}, &miss.allow);
  } else if (miss.path_known) {
    write(Reply::error(405, "method_not_allowed",
                       std::string(to_string(r.method)) + " is not allowed on " +
                           std::string(r.target) + " (allowed: " + miss.allow + ")"),
          &miss.allow);
  } else {
    write(Reply::error(
              404, "not_found",
              "no route for " + std::string(to_string(r.method)) + " " + std::string(r.target)),
          nullptr);
  }
  return Next::kAnswered;
}

Session::Next Session::answer_preflight(const Routing& r, const Router::Miss& miss) {
  const std::optional<CorsOptions>& cors = io_.server.options.cors();
  if (!cors || r.method != Method::kOptions) return Next::kContinue;
  auto requested = r.msg.find(bh::field::access_control_request_method);
  auto origin = r.msg.find(bh::field::origin);
  if (requested == r.msg.end() || origin == r.msg.end()) return Next::kContinue;
  // A preflight: answered here, before any credentials (browsers send none with it).
  route_ = io_.server.unmatched;
  if (cors_allowed_.empty()) {
    write(Reply::error(403, "forbidden",
                       absl::StrCat("CORS: origin ", av(view(origin->value())), " is not allowed")),
          nullptr);
  } else if (!miss.path_known) {
    write(Reply::error(404, "not_found", "no route for " + std::string(r.target)), nullptr);
  } else {
    std::string_view allowed = std::exchange(cors_allowed_, {});  // the preflight's own fields
    write(preflight(*cors, allowed, miss.allow, view(requested->value()),
                    view(r.msg[bh::field::access_control_request_headers])),
          nullptr);
  }
  return Next::kAnswered;
}

Session::Next Session::authenticate(Routing& r) {
  r.principal = client_principal_;
  if (!io_.tokens) return Next::kContinue;
  absl::StatusOr<PrincipalPtr> who = io_.authenticate(r.msg, client_principal_);
  if (!who.ok()) {
    bump(io_.io.auth_invalid);
    absl::string_view why = who.status().message();
    write(unauthorized(io_.realm(), "invalid_token", std::string_view(why.data(), why.size())),
          nullptr);
    return Next::kAnswered;
  }
  r.principal = *std::move(who);
  return Next::kContinue;
}

Session::Next Session::authorize(const Routing& r) {
  const Access* access = io_.server.entries[route_].spec.access.get();
  if (access == nullptr || !access->authenticated) return Next::kContinue;
  if (r.principal == nullptr) {
    bump(io_.io.auth_missing);
    write(unauthorized(io_.realm(), "", ""), nullptr);
    return Next::kAnswered;
  }
  for (const std::string& scope : access->scopes) {
    if (!r.principal->has_scope(scope)) {
      bump(io_.io.auth_forbidden);
      write(forbidden(io_.realm(), scope), nullptr);
      return Next::kAnswered;
    }
  }
  return Next::kContinue;
}

void Session::admit(Routing& r) {
  request_.emplace(r.method, r.target, r.msg.body(), std::move(r.match->params), std::move(r.query),
                   &r.msg, std::move(r.principal));
  deadline_.reset();  // the route's deadline answers it, whether it waits for a turn or runs
  if (!io_.admit(*this)) {
    phase_ = Phase::kQueued;  // the I/O thread has max_in_flight requests out: wait for a turn
    return;
  }
  invoke();
}

}  // namespace bus::http::detail
