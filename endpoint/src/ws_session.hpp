// The WebSocket bridge's connections and topics: declared here for the websocket_*.cpp files,
// the only ones that include this header (Beast's websocket stays in them).
#pragma once

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <absl/status/statusor.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/array.h>

#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/websocket.hpp>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bus/http/websocket.hpp"
#include "io.hpp"

namespace bus::http {

namespace websocket = beast::websocket;

namespace detail {

/// The subprotocol of a client that sends and receives wire::Frame messages (binary).
inline constexpr std::string_view kBinaryProtocol = "bus.capnp";

/// `s` as a JSON string.
std::string json_string(std::string_view s);
/// The message `b` built, as flat bytes.
std::string to_bytes(capnp::MessageBuilder& b);
/// What the `claim` of a token grants: {"subscribe": [...], "publish": [...], "request": [...]}.
std::vector<WebSocketBridge::Rule> granted_by(const Principal& p, const std::string& claim);

/// Topics subscribed on one I/O thread, and the connections subscribed to each. The thread owns
/// it (IoThread::ws_hub) and alone touches it.
struct WsHub {
  struct Topic {
    Subscription sub;       // delivers on the I/O thread's inbox; erasing the topic cancels it
    std::string json_head;  // {"op":"msg","channel":"...","body":
    std::vector<WsSession*> sessions;
  };
  /// Adds `session` to the topic `ch`, subscribing on the bus (delivering on `inbox`) when it is
  /// the first.
  void join(const WsChannel& ch, ExternalInbox& inbox, WsSession* session);
  /// Removes `session` from the topic `name`; the last to leave cancels its bus subscription.
  void leave(const std::string& name, WsSession* session);

  absl::flat_hash_map<std::string, std::unique_ptr<Topic>> topics;
};

/// A WebSocket connection as its thread's hub and shutdown see it, whatever its transport.
/// Every member is called on the connection's I/O thread.
class WsSession {
 public:
  virtual ~WsSession() = default;
  /// Queues one message; nothing when the connection is closed or closes for it. `droppable`:
  /// a topic message, which the SlowClient policy may drop; replies and notices are kept.
  virtual void push(std::shared_ptr<const std::string> bytes, bool droppable) = 0;
  virtual bool binary() const = 0;
  /// Starts the closing handshake with `code` (graceful; the timeout bounds it).
  virtual void close(websocket::close_code code, std::string_view why) = 0;
  /// Closes the socket now.
  virtual void drop() = 0;
};

/// One connection over `Stream`: beast::tcp_stream (ws://) or TlsStream (wss://).
///
/// Lives on its I/O thread, where every member runs. Owned by the shared_ptrs its pending
/// operations hold (each completion handler keeps `self`): it dies once the last one finishes.
/// Meanwhile IoThread::ws_sessions points to it until the destructor, and the WsHub topics it
/// subscribes to until it closes or drops.
template <class Stream>
class WsConn final : public WsSession, public std::enable_shared_from_this<WsConn<Stream>> {
 public:
  /// Counts it in `io`'s WebSocket counters (upgrade() counted it in the server's open
  /// connections; the destructor uncounts both). `granted`: what the client's token grants
  /// beyond the bridge's permit()s.
  WsConn(IoThread& io, Stream stream, bool binary, PrincipalPtr principal,
         std::vector<WebSocketBridge::Rule> granted);
  /// Finishes the thread's shutdown when it was the last connection of a draining thread.
  ~WsConn() override;

  /// Accepts the upgrade `req` (the bridge's timeouts and frame limit; the binary subprotocol
  /// when `binary`), then reads client frames and writes the queue until closed.
  void start(bh::request<bh::string_body> req);

  void push(std::shared_ptr<const std::string> bytes, bool droppable) override;
  bool binary() const override { return binary_; }
  void close(websocket::close_code code, std::string_view why) override;
  void drop() override;

 private:
  struct Item {
    std::shared_ptr<const std::string> bytes;
    bool droppable;
  };
  /// One client message, from a JSON object or a binary wire::Frame.
  struct Frame {
    std::string op;
    std::string channel;
    std::string id;  // JSON text of the client's id, echoed ("" if none)
    uint64_t timeout_ms = 0;
    WsInput body;
    bool has_body = false;
  };

  /// Adds `delta` to the queued bytes: out_bytes_ and the thread's queued_bytes gauge.
  void account(int64_t delta);

  void read();
  /// The frame in in_: a JSON object or array of them (text), or one wire::Frame (binary).
  void on_frame();
  void on_json(capnp::JsonValue::Reader root);
  /// Bounds for reading a client's binary frame and its body.
  capnp::ReaderOptions reader_options() const;
  /// Does what `f` asks (sub, unsub, pub, call) if the client may; refusals, acks and replies go
  /// back on the connection.
  void handle(Frame& f);
  bool permitted(Permit what, std::string_view name) const;

  /// Joins the thread's topic `ch` (subscribing on the bus when it is the first) and acks; past
  /// max_subscriptions, refuses.
  void subscribe(const WsChannel& ch);
  void unsubscribe(const std::string& name, bool ack);
  void unsubscribe_all();

  void send_reply(const std::string& id, const absl::StatusOr<WsMessage>& rep);
  void send_ack(std::string_view op, const std::string& channel);
  /// An error for a frame the client should not have sent (counted as a bad frame).
  void bad(const std::string& id, std::string_view detail);
  void send_error(const std::string& id, std::string_view code, std::string_view detail);
  /// The "dropped" notice: how many topic messages were dropped since the last one.
  std::shared_ptr<const std::string> drop_notice();
  /// Writes the drop notice and what is queued, about kMaxWriteBytes, as one message (unless a
  /// write is under way or the connection is not open); the write's end writes the rest.
  void write_more();

  IoThread& io_;
  const WebSocketBridge& bridge_;
  websocket::stream<Stream> ws_;
  beast::flat_buffer in_;
  kj::Array<capnp::word> body_words_;
  const bool binary_;
  std::deque<Item> out_;
  std::size_t out_bytes_ = 0;
  uint64_t unreported_drops_ = 0;
  std::string writing_buf_;
  bool writing_ = false;
  bool open_ = false;  // handshake done
  bool closed_ = false;
  std::optional<websocket::close_reason> close_after_write_;
  absl::flat_hash_set<std::string> subs_;
  std::size_t pending_calls_ = 0;
  const PrincipalPtr principal_;                      // who the client is, or null
  const std::vector<WebSocketBridge::Rule> granted_;  // what its token grants beyond permit()s
};

// Instantiated once, in websocket_connection.cpp.
extern template class WsConn<beast::tcp_stream>;
extern template class WsConn<TlsStream>;

}  // namespace detail
}  // namespace bus::http
