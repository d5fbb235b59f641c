// The WebSocket bridge on each I/O thread: one bus subscription per topic its clients subscribe
// to, whose messages are encoded once per format there and queued, shared, on every subscribed
// connection; closing the thread's connections; their counters, summed over the threads.
#include <absl/strings/str_cat.h>
#include <capnp/message.h>

#include <boost/beast/websocket.hpp>

#include "bus/http/json.hpp"
#include "bus/http/websocket.hpp"
#include "bus/schemas/websocket.capnp.h"
#include "io.hpp"
#include "ws_session.hpp"

namespace bus::http {
namespace detail {
namespace {

/// A topic message, encoded once per format for all of the topic's connections.
std::shared_ptr<const std::string> encode_msg_json(const WsHub::Topic& t, const WsMessage& m) {
  kj::String body = codec().encode(m.reader, m.reader.getSchema());
  return std::make_shared<const std::string>(
      absl::StrCat(t.json_head, absl::string_view(body.cStr(), body.size()), "}"));
}

std::shared_ptr<const std::string> encode_msg_binary(const std::string& name, const WsMessage& m) {
  capnp::MallocMessageBuilder b;
  auto f = b.initRoot<wire::Frame>();
  f.setOp(wire::Frame::Op::MSG);
  f.setChannel(name);
  f.setBody(m.bytes);
  return std::make_shared<const std::string>(to_bytes(b));
}

}  // namespace

void WsHubDeleter::operator()(WsHub* h) const { delete h; }
WsHub* make_ws_hub() { return new WsHub; }

void WsHub::join(const WsChannel& ch, ExternalInbox& inbox, WsSession* session) {
  auto& topic = topics[ch.name];
  if (!topic) {
    topic = std::make_unique<Topic>();
    topic->json_head =
        absl::StrCat(R"({"op":"msg","channel":)", json_string(ch.name), R"(,"body":)");
    Topic* t = topic.get();
    std::string name = ch.name;
    topic->sub = ch.subscribe(inbox, [t, name](const WsMessage& m) {
      std::shared_ptr<const std::string> json, binary;
      for (WsSession* s : t->sessions) {  // push() never changes the list (see kClose)
        auto& frame = s->binary() ? binary : json;
        if (!frame) frame = s->binary() ? encode_msg_binary(name, m) : encode_msg_json(*t, m);
        s->push(frame, true);
      }
    });
  }
  topic->sessions.push_back(session);
}

void WsHub::leave(const std::string& name, WsSession* session) {
  auto it = topics.find(name);
  if (it == topics.end()) return;
  std::erase(it->second->sessions, session);
  if (it->second->sessions.empty()) topics.erase(it);  // cancels the bus subscription
}

void close_websockets(IoThread& io, bool now) {
  for (WsSession* s : std::vector<WsSession*>(io.ws_sessions.begin(), io.ws_sessions.end())) {
    if (now) {
      s->drop();
    } else {
      s->close(websocket::close_code::going_away, "server shutting down");
    }
  }
}

}  // namespace detail

WebSocketStats Server::websocket_stats() const { return impl_->websocket_stats(); }

WebSocketStats Server::Impl::websocket_stats() const {
  WebSocketStats s;
  for (const auto& t : threads) {
    const detail::WsCounters& c = t->ws;
    auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
    s.connections_open += get(c.open);
    s.connections_accepted += get(c.accepted);
    s.frames_in += get(c.frames_in);
    s.messages_out += get(c.messages_out);
    s.frames_out += get(c.frames_out);
    s.refused += get(c.refused);
    s.bad_frames += get(c.bad_frames);
    s.dropped += get(c.dropped);
    s.closed_slow += get(c.closed_slow);
    s.published += get(c.published);
    s.calls += get(c.calls);
    s.queued_bytes += get(c.queued_bytes);
  }
  return s;
}

}  // namespace bus::http
