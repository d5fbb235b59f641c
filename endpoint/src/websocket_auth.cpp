// Upgrading an HTTP request to a WebSocket of the bridge: who the client is (its token or its
// certificate), whether its page's origin may open one, and what its token grants.
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <absl/strings/strip.h>
#include <kj/compat/url.h>

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/websocket.hpp>
#include <ctime>

#include "bus/http/websocket.hpp"
#include "cors.hpp"
#include "io.hpp"
#include "ws_session.hpp"

namespace bus::http::detail {
namespace {

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// The `access_token` query parameter of `target`, if any.
std::optional<std::string> access_token(std::string_view target) {
  if (target.find('?') == std::string_view::npos) return std::nullopt;
  KJ_IF_MAYBE (url, kj::Url::tryParse(std::string(target), kj::Url::HTTP_REQUEST)) {
    for (const auto& q : url->query) {
      if (q.name == "access_token") return std::string(q.value.cStr(), q.value.size());
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<Reply> upgrade(IoThread& io, bh::request_parser<bh::string_body>& parser,
                             const PrincipalPtr& connection_principal,
                             const std::function<Handover()>& take) {
  auto& msg = parser.get();
  const WebSocketOptions& o = io.server.websocket->options();
  if (!websocket::is_upgrade(msg)) {
    return Reply::error(426, "upgrade_required",
                        "GET " + o.path() + " is a WebSocket: send an upgrade");
  }
  if (std::optional<Reply> refused = cross_origin_refusal(io, msg)) return refused;
  // The client is who its token says (a header, or the access_token parameter that browsers
  // can send), else who its certificate says.
  absl::StatusOr<PrincipalPtr> who = io.authenticate(msg, connection_principal);
  if (who.ok() && *who == connection_principal && io.tokens) {
    std::string_view target(msg.target().data(), msg.target().size());
    if (std::optional<std::string> token = access_token(target)) {
      who = io.tokens->verify(*token, ::time(nullptr));
    }
  }
  if (!who.ok()) {
    bump(io.io.auth_invalid);
    absl::string_view why = who.status().message();
    return unauthorized(io.realm(), "invalid_token", std::string_view(why.data(), why.size()));
  }
  if (*who == nullptr && o.require_authentication()) {
    bump(io.io.auth_missing);
    return unauthorized(io.realm(), "", "");
  }
  bool binary = false;
  for (auto part : absl::StrSplit(absl::string_view(msg[bh::field::sec_websocket_protocol].data(),
                                                    msg[bh::field::sec_websocket_protocol].size()),
                                  ',', absl::SkipWhitespace())) {
    if (absl::StripAsciiWhitespace(part) == av(kBinaryProtocol)) binary = true;
  }
  std::vector<WebSocketBridge::Rule> granted;
  if (*who != nullptr) granted = granted_by(**who, o.permissions_claim());
  io.server.open.fetch_add(1, std::memory_order_relaxed);
  Handover h = take();
  if (h.ssl != nullptr) {
    std::make_shared<WsConn<TlsStream>>(io, TlsStream(std::move(h.socket), h.ssl), binary,
                                        std::move(*who), std::move(granted))
        ->start(parser.release());
  } else {
    std::make_shared<WsConn<beast::tcp_stream>>(io, beast::tcp_stream(std::move(h.socket)), binary,
                                                std::move(*who), std::move(granted))
        ->start(parser.release());
  }
  return std::nullopt;
}

std::optional<Reply> cross_origin_refusal(IoThread& io, const bh::request<bh::string_body>& msg) {
  auto origin = msg.find(bh::field::origin);
  if (origin == msg.end()) return std::nullopt;  // not a browser
  std::string_view from = view(origin->value());
  if (same_origin(from, view(msg[bh::field::host]))) return std::nullopt;
  if (const auto& cors = io.server.options.cors(); cors && !allowed_origin(*cors, from).empty()) {
    return std::nullopt;
  }
  // A page of another site would act with this browser's cookies and certificates.
  bump(io.ws.refused);
  return Reply::error(403, "forbidden",
                      absl::StrCat("origin ", av(from), " may not open a WebSocket here"));
}

}  // namespace bus::http::detail
