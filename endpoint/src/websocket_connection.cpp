// A WebSocket connection of the bridge (Boost.Beast websocket on the HTTP server's I/O threads):
// the client's messages (sub, unsub, pub, call) and what goes back to it.
//
// A connection's queue is bounded in bytes; what happens past the bound is the SlowClient policy.
// Everything queued when a write ends goes out in one WebSocket message (a JSON array, or
// Cap'n Proto messages back to back), as SockJS does.
#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <capnp/message.h>
#include <capnp/serialize.h>

#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/websocket.hpp>

#include "bus/http/json.hpp"
#include "bus/http/websocket.hpp"
#include "bus/schemas/websocket.capnp.h"
#include "io.hpp"
#include "ws_session.hpp"

namespace bus::http::detail {
namespace {

// What one write takes from the queue at most (it may exceed it by one message).
constexpr std::size_t kMaxWriteBytes = 64 * 1024;

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// "deadline_exceeded", "unavailable", ...: the status code as a client reads it.
std::string error_code(const absl::Status& st) {
  return absl::AsciiStrToLower(absl::StatusCodeToString(st.code()));
}

}  // namespace

std::string json_string(std::string_view s) {
  capnp::MallocMessageBuilder b(16);
  auto v = b.initRoot<capnp::JsonValue>();
  v.setString(capnp::Text::Reader(s.data(), s.size()));
  kj::String out = codec().encodeRaw(v);
  return std::string(out.cStr(), out.size());
}

std::string to_bytes(capnp::MessageBuilder& b) {
  kj::Array<capnp::word> words = capnp::messageToFlatArray(b);
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

template <class Stream>
WsConn<Stream>::WsConn(IoThread& io, Stream stream, bool binary, PrincipalPtr principal,
                       std::vector<WebSocketBridge::Rule> granted)
    : io_(io),
      bridge_(*io.server.websocket),
      ws_(std::move(stream)),
      binary_(binary),
      principal_(std::move(principal)),
      granted_(std::move(granted)) {
  io_.ws_sessions.insert(this);
  bump(io_.ws.open);
  bump(io_.ws.accepted);
}

template <class Stream>
WsConn<Stream>::~WsConn() {
  account(-static_cast<int64_t>(out_bytes_));
  io_.ws_sessions.erase(this);
  io_.ws.open.fetch_sub(1, std::memory_order_relaxed);
  io_.server.open.fetch_sub(1, std::memory_order_relaxed);
  if (io_.draining && io_.sessions.empty() && io_.ws_sessions.empty()) io_.finish();
}

template <class Stream>
void WsConn<Stream>::start(bh::request<bh::string_body> req) {
  const WebSocketOptions& o = bridge_.options();
  websocket::stream_base::timeout t;
  t.handshake_timeout = o.handshake_timeout();
  t.idle_timeout = o.idle_timeout();
  t.keep_alive_pings = true;  // a ping at half the idle timeout; no pong by its end closes
  ws_.set_option(t);
  ws_.read_message_max(o.max_frame_bytes());
  bool binary = binary_;
  ws_.set_option(websocket::stream_base::decorator([binary](websocket::response_type& res) {
    res.set(bh::field::server, "bus");
    if (binary) res.set(bh::field::sec_websocket_protocol, std::string(kBinaryProtocol));
  }));
  ws_.async_accept(req, [self = this->shared_from_this()](beast::error_code ec) {
    if (ec) return self->drop();
    self->open_ = true;
    if (self->closed_) {  // shut down during the handshake
      self->closed_ = false;
      return self->close(websocket::close_code::going_away, "server shutting down");
    }
    self->read();
    self->write_more();
  });
}

template <class Stream>
void WsConn<Stream>::push(std::shared_ptr<const std::string> bytes, bool droppable) {
  if (closed_) return;
  bump(io_.ws.messages_out);
  std::size_t max = bridge_.options().max_outbound_bytes();
  if (out_bytes_ + bytes->size() > max && droppable) {
    if (bridge_.options().slow_client() == SlowClient::kClose) {
      bump(io_.ws.closed_slow);
      // Closed after the topic's delivery loop (which called us) ends: closing leaves the
      // topic, and the loop must not see its list change under it.
      closed_ = true;
      asio::post(ws_.get_executor(), [self = this->shared_from_this()] {
        if (!beast::get_lowest_layer(self->ws_).socket().is_open()) return;  // dropped since
        self->closed_ = false;
        self->close(websocket::close_code::policy_error,
                    "outbound buffer full: reading too slowly");
      });
      return;
    }
    // Drop the oldest topic messages until this one fits (replies and notices stay).
    for (auto it = out_.begin(); it != out_.end() && out_bytes_ + bytes->size() > max;) {
      if (!it->droppable) {
        ++it;
        continue;
      }
      account(-static_cast<int64_t>(it->bytes->size()));
      it = out_.erase(it);
      ++unreported_drops_;
      bump(io_.ws.dropped);
    }
    if (out_bytes_ + bytes->size() > max) {  // only replies wait: drop the newcomer
      ++unreported_drops_;
      bump(io_.ws.dropped);
      return write_more();
    }
  }
  account(static_cast<int64_t>(bytes->size()));
  out_.push_back({std::move(bytes), droppable});
  write_more();
}

template <class Stream>
void WsConn<Stream>::account(int64_t delta) {
  out_bytes_ += delta;
  auto& q = io_.ws.queued_bytes;  // written by this thread only
  q.store(q.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
}

template <class Stream>
void WsConn<Stream>::close(websocket::close_code code, std::string_view why) {
  if (closed_) return;
  closed_ = true;
  unsubscribe_all();
  out_.clear();
  account(-static_cast<int64_t>(out_bytes_));
  if (!open_) return;  // the handshake's completion closes it
  if (writing_) {
    close_after_write_ = websocket::close_reason(code, beast::string_view(why.data(), why.size()));
    return;
  }
  ws_.async_close(websocket::close_reason(code, beast::string_view(why.data(), why.size())),
                  [self = this->shared_from_this()](beast::error_code) {});
}

template <class Stream>
void WsConn<Stream>::drop() {
  closed_ = true;
  unsubscribe_all();
  beast::error_code ignored;
  beast::get_lowest_layer(ws_).socket().close(ignored);
}

template <class Stream>
void WsConn<Stream>::read() {
  ws_.async_read(in_, [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
    if (ec) {
      if (ec == websocket::error::message_too_big) bump(self->io_.ws.bad_frames);
      return self->drop();
    }
    if (self->closed_) return;
    bump(self->io_.ws.frames_in);
    self->on_frame();
    self->in_.consume(self->in_.size());
    self->read();
  });
}

template <class Stream>
void WsConn<Stream>::on_frame() {
  std::string_view data(static_cast<const char*>(in_.data().data()), in_.size());
  Frame f;
  capnp::MallocMessageBuilder json_msg;
  kj::Array<capnp::word> aligned;
  std::optional<capnp::FlatArrayMessageReader> reader;
  try {
    if (ws_.got_text()) {
      auto root = json_msg.initRoot<capnp::JsonValue>();
      codec().decodeRaw(kj::ArrayPtr<const char>(data.data(), data.size()), root);
      if (root.isArray()) {  // several messages in one frame, in order (as SockJS sends)
        for (auto v : root.asReader().getArray()) on_json(v);
      } else {
        on_json(root.asReader());
      }
      return;
    } else {
      aligned = kj::heapArray<capnp::word>((data.size() + 7) / 8);
      std::memcpy(aligned.begin(), data.data(), data.size());
      reader.emplace(aligned, reader_options());
      auto fr = reader->getRoot<wire::Frame>();
      switch (fr.getOp()) {
        case wire::Frame::Op::SUB: f.op = "sub"; break;
        case wire::Frame::Op::UNSUB: f.op = "unsub"; break;
        case wire::Frame::Op::PUB: f.op = "pub"; break;
        case wire::Frame::Op::CALL: f.op = "call"; break;
        default: f.op = "?"; break;
      }
      f.channel = fr.getChannel().cStr();
      f.id = absl::StrCat(fr.getId());
      f.timeout_ms = fr.getTimeoutMs();
      if (fr.hasBody()) {
        auto b = fr.getBody();
        body_words_ = kj::heapArray<capnp::word>((b.size() + 7) / 8);
        std::memcpy(body_words_.begin(), b.begin(), b.size());
        f.body.words = body_words_;
        f.body.options = reader_options();
        f.has_body = true;
      }
    }
  } catch (const kj::Exception& e) {
    return bad({}, absl::StrCat("unreadable frame: ", e.getDescription().cStr()));
  }
  handle(f);
}

template <class Stream>
void WsConn<Stream>::on_json(capnp::JsonValue::Reader root) {
  Frame f;
  if (!root.isObject()) {
    return bad({}, "a client message is a JSON object (or a frame an array of them)");
  }
  for (auto field : root.getObject()) {
    std::string_view name(field.getName().cStr(), field.getName().size());
    auto v = field.getValue();
    if (name == "op" && v.isString()) {
      f.op = v.getString().cStr();
    } else if (name == "channel" && v.isString()) {
      f.channel = v.getString().cStr();
    } else if (name == "id" && (v.isString() || v.isNumber())) {
      kj::String s = codec().encodeRaw(v);
      f.id.assign(s.cStr(), s.size());
    } else if (name == "timeout_ms" && v.isNumber() && v.getNumber() >= 0) {
      f.timeout_ms = static_cast<uint64_t>(v.getNumber());
    } else if (name == "body") {
      f.body.codec = &codec();
      f.body.json = v;
      f.has_body = true;
    } else {
      return bad(f.id, absl::StrCat("unexpected field '", av(name), "' (or of the wrong type)"));
    }
  }
  handle(f);
}

template <class Stream>
capnp::ReaderOptions WsConn<Stream>::reader_options() const {
  capnp::ReaderOptions o;
  o.traversalLimitInWords = bridge_.options().max_frame_bytes() / 8 + 64;
  o.nestingLimit = 64;
  return o;
}

template <class Stream>
void WsConn<Stream>::handle(Frame& f) {
  const WsChannel* ch = f.channel.empty() ? nullptr : bridge_.find(f.channel);
  auto refuse = [&](std::string_view code, std::string detail) {
    bump(io_.ws.refused);
    send_error(f.id, code, detail);
  };
  if (f.op == "sub" || f.op == "unsub" || f.op == "pub") {
    if (ch == nullptr || ch->endpoint) {
      return refuse("unknown_channel",
                    absl::StrCat("'", f.channel, "' is not a topic of this bridge"));
    }
    if (f.op == "unsub") return unsubscribe(f.channel, true);
    if (f.op == "sub") {
      if (!permitted(Permit::kSubscribe, f.channel)) {
        return refuse("forbidden",
                      absl::StrCat("subscribing to '", f.channel, "' is not permitted"));
      }
      return subscribe(*ch);
    }
    if (!permitted(Permit::kPublish, f.channel)) {
      return refuse("forbidden", absl::StrCat("publishing to '", f.channel, "' is not permitted"));
    }
    if (!f.has_body) return bad(f.id, "pub needs a body");
    io_.batch_round();  // this round's publishes go to the executors together
    absl::Status st = ch->publish(io_.server.bus, f.body);
    if (st.code() == absl::StatusCode::kInvalidArgument)
      return bad(f.id, std::string(st.message()));
    if (!st.ok()) return send_error(f.id, error_code(st), std::string(st.message()));
    bump(io_.ws.published);
    return;
  }
  if (f.op == "call") {
    if (ch == nullptr || !ch->endpoint) {
      return refuse("unknown_channel",
                    absl::StrCat("'", f.channel, "' is not an endpoint of this bridge"));
    }
    if (!permitted(Permit::kRequest, f.channel)) {
      return refuse("forbidden", absl::StrCat("calling '", f.channel, "' is not permitted"));
    }
    if (f.id.empty()) return bad({}, "call needs an id");
    if (pending_calls_ >= bridge_.options().max_pending_calls()) {
      return send_error(f.id, "too_many_calls",
                        absl::StrCat(pending_calls_, " calls are already waiting for replies"));
    }
    if (!f.has_body) return bad(f.id, "call needs a body");
    ++pending_calls_;
    bump(io_.ws.calls);
    Clock::duration timeout = f.timeout_ms > 0
                                  ? Clock::duration(std::chrono::milliseconds(f.timeout_ms))
                                  : io_.server.options.deadline();
    io_.batch_round();
    PrincipalScope acting_for(principal_);  // the call carries the client's principal
    ch->call(io_.server.bus, f.body, timeout,
             [self = this->shared_from_this(), id = f.id](absl::StatusOr<WsMessage> rep) {
               --self->pending_calls_;
               self->send_reply(id, rep);
             });
    return;
  }
  bad(f.id, absl::StrCat("unknown op '", f.op, "' (sub, unsub, pub, call)"));
}

template <class Stream>
void WsConn<Stream>::subscribe(const WsChannel& ch) {
  if (subs_.contains(ch.name)) return send_ack("subscribed", ch.name);
  if (subs_.size() >= bridge_.options().max_subscriptions()) {
    bump(io_.ws.refused);
    return send_error({}, "too_many_subscriptions",
                      absl::StrCat("at most ", subs_.size(), " topics per connection"));
  }
  io_.ws_hub->join(ch, io_.inbox(), this);
  subs_.insert(ch.name);
  send_ack("subscribed", ch.name);
}

template <class Stream>
void WsConn<Stream>::unsubscribe(const std::string& name, bool ack) {
  if (subs_.erase(name) > 0) io_.ws_hub->leave(name, this);
  if (ack) send_ack("unsubscribed", name);
}

template <class Stream>
void WsConn<Stream>::unsubscribe_all() {
  for (const std::string& name : subs_) io_.ws_hub->leave(name, this);
  subs_.clear();
}

template <class Stream>
void WsConn<Stream>::send_reply(const std::string& id, const absl::StatusOr<WsMessage>& rep) {
  if (closed_) return;
  if (binary_) {
    capnp::MallocMessageBuilder b;
    auto f = b.initRoot<wire::Frame>();
    f.setOp(wire::Frame::Op::REPLY);
    uint64_t n = 0;
    (void)absl::SimpleAtoi(id, &n);
    f.setId(n);
    if (rep.ok()) {
      f.setBody(rep->bytes);
    } else {
      f.setError(error_code(rep.status()));
      f.setDetail(std::string(rep.status().message()));
    }
    return push(std::make_shared<const std::string>(to_bytes(b)), false);
  }
  std::string out;
  if (rep.ok()) {
    kj::String body = codec().encode(rep->reader, rep->reader.getSchema());
    out = absl::StrCat(R"({"op":"reply","id":)", id, R"(,"body":)",
                       absl::string_view(body.cStr(), body.size()), "}");
  } else {
    out = absl::StrCat(R"({"op":"reply","id":)", id, R"(,"error":)",
                       json_string(error_code(rep.status())), R"(,"detail":)",
                       json_string(std::string(rep.status().message())), "}");
  }
  push(std::make_shared<const std::string>(std::move(out)), false);
}

template <class Stream>
void WsConn<Stream>::send_ack(std::string_view op, const std::string& channel) {
  if (binary_) {
    capnp::MallocMessageBuilder b;
    auto f = b.initRoot<wire::Frame>();
    f.setOp(op == "subscribed" ? wire::Frame::Op::SUBSCRIBED : wire::Frame::Op::UNSUBSCRIBED);
    f.setChannel(channel);
    return push(std::make_shared<const std::string>(to_bytes(b)), false);
  }
  push(std::make_shared<const std::string>(
           absl::StrCat(R"({"op":)", json_string(op), R"(,"channel":)", json_string(channel), "}")),
       false);
}

template <class Stream>
void WsConn<Stream>::bad(const std::string& id, std::string_view detail) {
  bump(io_.ws.bad_frames);
  send_error(id, "bad_frame", detail);
}

template <class Stream>
void WsConn<Stream>::send_error(const std::string& id, std::string_view code,
                                std::string_view detail) {
  if (binary_) {
    capnp::MallocMessageBuilder b;
    auto f = b.initRoot<wire::Frame>();
    f.setOp(wire::Frame::Op::ERROR);
    uint64_t n = 0;
    if (absl::SimpleAtoi(id, &n)) f.setId(n);
    f.setError(std::string(code));
    f.setDetail(std::string(detail));
    return push(std::make_shared<const std::string>(to_bytes(b)), false);
  }
  push(std::make_shared<const std::string>(absl::StrCat(
           R"({"op":"error",)", id.empty() ? "" : absl::StrCat(R"("id":)", id, ","), R"("error":)",
           json_string(code), R"(,"detail":)", json_string(detail), "}")),
       false);
}

template <class Stream>
std::shared_ptr<const std::string> WsConn<Stream>::drop_notice() {
  uint64_t n = std::exchange(unreported_drops_, 0);
  if (binary_) {
    capnp::MallocMessageBuilder b;
    auto f = b.initRoot<wire::Frame>();
    f.setOp(wire::Frame::Op::DROPPED);
    f.setCount(n);
    return std::make_shared<const std::string>(to_bytes(b));
  }
  return std::make_shared<const std::string>(absl::StrCat(R"({"op":"dropped","count":)", n, "}"));
}

template <class Stream>
void WsConn<Stream>::write_more() {
  if (writing_ || closed_ || !open_ || (out_.empty() && unreported_drops_ == 0)) return;
  writing_buf_.clear();
  if (!binary_) writing_buf_.push_back('[');
  auto append = [&](const std::string& s) {
    if (!binary_ && writing_buf_.size() > 1) writing_buf_.push_back(',');
    writing_buf_.append(s);
  };
  if (unreported_drops_ > 0) append(*drop_notice());
  while (!out_.empty() && writing_buf_.size() < kMaxWriteBytes) {
    append(*out_.front().bytes);
    account(-static_cast<int64_t>(out_.front().bytes->size()));
    out_.pop_front();
  }
  if (!binary_) writing_buf_.push_back(']');
  writing_ = true;
  ws_.text(!binary_);
  ws_.binary(binary_);
  bump(io_.ws.frames_out);
  ws_.async_write(asio::buffer(writing_buf_),
                  [self = this->shared_from_this()](beast::error_code ec, std::size_t) {
                    self->writing_ = false;
                    if (ec) return self->drop();
                    if (self->close_after_write_) {
                      auto reason = *self->close_after_write_;
                      self->close_after_write_.reset();
                      return self->ws_.async_close(reason, [self](beast::error_code) {});
                    }
                    self->write_more();
                  });
}

template <class Stream>
bool WsConn<Stream>::permitted(Permit what, std::string_view name) const {
  if (bridge_.permitted(what, name)) return true;
  for (const auto& r : granted_) {
    if (r.allows(what, name)) return true;
  }
  return false;
}

// Every connection is over one of the two (ws_session.hpp declares them extern).
template class WsConn<beast::tcp_stream>;
template class WsConn<TlsStream>;

}  // namespace bus::http::detail
