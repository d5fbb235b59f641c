// What WebSocket clients may name and do: the bridge's channels and permit() rules, and the
// rules a client's token grants beyond them.
#include <capnp/compat/json.h>
#include <capnp/message.h>

#include "bus/http/json.hpp"
#include "bus/http/websocket.hpp"
#include "io.hpp"
#include "ws_session.hpp"

namespace bus::http {

WebSocketBridge& WebSocketBridge::add(detail::WsChannel ch) {
  if (find(ch.name) != nullptr) {
    throw std::invalid_argument("bus::http: channel '" + ch.name +
                                "' is already on the WebSocket bridge");
  }
  channels_.push_back(std::make_unique<detail::WsChannel>(std::move(ch)));
  return *this;
}

WebSocketBridge& WebSocketBridge::permit(Permit what, std::string name, Match match) {
  rules_.push_back({what, std::move(name), match});
  return *this;
}

const detail::WsChannel* WebSocketBridge::find(std::string_view name) const {
  for (const auto& c : channels_) {
    if (c->name == name) return c.get();
  }
  return nullptr;
}

bool WebSocketBridge::permitted(Permit what, std::string_view name) const {
  for (const Rule& r : rules_) {
    if (r.allows(what, name)) return true;
  }
  return false;
}
namespace detail {

/// What the `claim` of a token grants: {"subscribe": [...], "publish": [...], "request": [...]}.
std::vector<WebSocketBridge::Rule> granted_by(const Principal& p, const std::string& claim) {
  std::vector<WebSocketBridge::Rule> out;
  if (p.claims.empty()) return out;
  capnp::MallocMessageBuilder b;
  auto root = b.initRoot<capnp::JsonValue>();
  try {
    codec().decodeRaw(kj::ArrayPtr<const char>(p.claims.data(), p.claims.size()), root);
  } catch (const kj::Exception&) {
    return out;  // verified claims are JSON: not reached
  }
  if (!root.isObject()) return out;
  for (auto f : root.asReader().getObject()) {
    if (f.getName() != claim.c_str() || !f.getValue().isObject()) continue;
    for (auto dir : f.getValue().getObject()) {
      std::string_view d(dir.getName().cStr(), dir.getName().size());
      Permit what = d == "subscribe" ? Permit::kSubscribe
                    : d == "publish" ? Permit::kPublish
                    : d == "request" ? Permit::kRequest
                                     : Permit{0};
      if (what == Permit{0} || !dir.getValue().isArray()) continue;
      for (auto name : dir.getValue().getArray()) {
        if (!name.isString()) continue;
        std::string n(name.getString().cStr(), name.getString().size());
        bool prefix = !n.empty() && n.back() == '*';
        if (prefix) n.pop_back();
        out.push_back({what, std::move(n), prefix ? Match::kPrefix : Match::kExact});
      }
    }
  }
  return out;
}

}  // namespace detail
}  // namespace bus::http
