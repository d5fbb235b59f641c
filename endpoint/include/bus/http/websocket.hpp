// The WebSocket bridge: browsers and other edge clients subscribe to topics, publish and call
// endpoints of the bus over one WebSocket (`GET /bus`), like the Vert.x event bus bridge.
//
//   bus::http::Server http(bus, bus::http::ServerOptions().port(8080));
//   http.websocket()
//       .topic(readings).endpoint(greeting)                 // what a client can name
//       .permit(bus::http::Permit::kSubscribe, "demo.")     // by prefix: "demo.readings", ...
//       .permit(bus::http::Permit::kRequest, "greeting", bus::http::Match::kExact);
//
// Only channels given here are reachable, and only in the directions permitted; anything else is
// refused with an error frame and counted. Frames are JSON text by default (Cap'n Proto's JSON
// codec, field names from the schema), Cap'n Proto binary when the client asks for the
// "bus.capnp" subprotocol. The frame format is in docs/websocket.md.
#pragma once

#include <absl/status/statusor.h>
#include <capnp/compat/json.h>
#include <capnp/dynamic.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bus/bus.hpp"
#include "bus/message.hpp"

namespace bus::http {

/// Directions a client may use a channel in.
enum class Permit : unsigned {
  kPublish = 1,    // client -> topic
  kRequest = 2,    // client -> endpoint (a call with a reply)
  kSubscribe = 4,  // topic -> client
};
enum class Match { kPrefix, kExact };

/// What a connection does when its outbound buffer is full (the client reads too slowly).
enum class SlowClient {
  kDropOldest,  // drop the oldest topic messages, count them, tell the client ("dropped")
  kClose,       // close the connection with status 1008 (policy violation)
};

class WebSocketOptions {
 public:
  using Duration = std::chrono::steady_clock::duration;
  WebSocketOptions& path(std::string p) {
    path_ = std::move(p);
    return *this;
  }
  /// Largest client message accepted (a bigger one closes the connection with 1009).
  WebSocketOptions& max_frame_bytes(std::size_t n) {
    max_frame_bytes_ = n;
    return *this;
  }
  /// Bytes of messages waiting to be written to one client; past it, `slow_client` applies.
  /// Replies and error frames are never dropped (calls in flight are bounded instead).
  WebSocketOptions& max_outbound_bytes(std::size_t n) {
    max_outbound_bytes_ = n;
    return *this;
  }
  WebSocketOptions& slow_client(SlowClient p) {
    slow_client_ = p;
    return *this;
  }
  /// Calls a connection may have unanswered; more are refused ("too_many_calls").
  WebSocketOptions& max_pending_calls(std::size_t n) {
    max_pending_calls_ = n;
    return *this;
  }
  /// Topics one connection may subscribe to.
  WebSocketOptions& max_subscriptions(std::size_t n) {
    max_subscriptions_ = n;
    return *this;
  }
  /// The upgrade handshake must complete within this.
  WebSocketOptions& handshake_timeout(Duration d) {
    handshake_timeout_ = d;
    return *this;
  }
  /// A connection that sends nothing for this long is pinged at half of it, and closed when the
  /// pong does not come back by the end of it.
  WebSocketOptions& idle_timeout(Duration d) {
    idle_timeout_ = d;
    return *this;
  }

  /// Upgrades only for clients with a principal (a valid bearer token, or a client
  /// certificate); others get 401. Browsers cannot send Authorization on a WebSocket: they may
  /// give the token as the `access_token` query parameter (RFC 6750 §2.3).
  WebSocketOptions& require_authentication(bool r) {
    require_authentication_ = r;
    return *this;
  }
  /// The token claim that grants a client channels beyond the bridge's permit()s:
  /// {"subscribe": [...], "publish": [...], "request": [...]}, each a channel name, or a prefix
  /// ending in '*' ("demo.*"). Default "bus".
  WebSocketOptions& permissions_claim(std::string name) {
    permissions_claim_ = std::move(name);
    return *this;
  }

  const std::string& path() const { return path_; }
  bool require_authentication() const { return require_authentication_; }
  const std::string& permissions_claim() const { return permissions_claim_; }
  std::size_t max_frame_bytes() const { return max_frame_bytes_; }
  std::size_t max_outbound_bytes() const { return max_outbound_bytes_; }
  SlowClient slow_client() const { return slow_client_; }
  std::size_t max_pending_calls() const { return max_pending_calls_; }
  std::size_t max_subscriptions() const { return max_subscriptions_; }
  Duration handshake_timeout() const { return handshake_timeout_; }
  Duration idle_timeout() const { return idle_timeout_; }

 private:
  std::string path_ = "/bus";
  std::size_t max_frame_bytes_ = 64 * 1024;
  std::size_t max_outbound_bytes_ = 1024 * 1024;
  SlowClient slow_client_ = SlowClient::kDropOldest;
  std::size_t max_pending_calls_ = 256;
  std::size_t max_subscriptions_ = 256;
  Duration handshake_timeout_ = std::chrono::seconds(5);
  Duration idle_timeout_ = std::chrono::seconds(60);
  bool require_authentication_ = false;
  std::string permissions_claim_ = "bus";
};

/// Counters of the WebSocket bridge (every I/O thread).
struct WebSocketStats {
  uint64_t connections_open = 0;
  uint64_t connections_accepted = 0;
  uint64_t frames_in = 0;     // client messages read
  uint64_t messages_out = 0;  // messages queued for clients (msg, reply, error, notices)
  uint64_t frames_out = 0;    // WebSocket messages written (each carries one or more)
  uint64_t refused = 0;       // not permitted, or not a channel of the bridge
  uint64_t bad_frames = 0;    // not JSON, not an object, unknown op, body not of the type
  uint64_t dropped = 0;       // topic messages dropped for slow clients (SlowClient::kDropOldest)
  uint64_t closed_slow = 0;   // connections closed for a full outbound buffer (SlowClient::kClose)
  uint64_t published = 0;     // client publishes accepted
  uint64_t calls = 0;         // client calls made
  uint64_t queued_bytes = 0;  // waiting in outbound buffers now (each at most
                              // max_outbound_bytes, plus replies)
};

namespace detail {

/// A message of a bridged channel as the bridge encodes it (valid during the call).
struct WsMessage {
  capnp::DynamicStruct::Reader reader;
  kj::ArrayPtr<const kj::byte> bytes;  // one Cap'n Proto message, stream framing
};

/// What a client sent as a message body: JSON (through the codec) or Cap'n Proto words.
struct WsInput {
  const capnp::JsonCodec* codec = nullptr;  // with `json`
  capnp::JsonValue::Reader json;
  kj::ArrayPtr<const capnp::word> words;  // binary frames (aligned)
  capnp::ReaderOptions options;
};

using WsReply = absl::AnyInvocable<void(absl::StatusOr<WsMessage>)>;

/// One channel of the bridge, type-erased.
struct WsChannel {
  std::string name;
  bool endpoint = false;
  std::function<Subscription(ExternalInbox&, std::function<void(const WsMessage&)>)> subscribe;
  std::function<absl::Status(Bus&, const WsInput&)> publish;
  std::function<void(Bus&, const WsInput&, Clock::duration, WsReply)> call;
};

template <Bridgeable T>
absl::StatusOr<T> ws_decode(const WsInput& in) {
  using S = typename Codec<T>::Schema;
  try {
    if (in.codec != nullptr) {
      Message<S> m =
          build<S>([&](typename S::Builder b) { in.codec->decode(in.json, capnp::toDynamic(b)); });
      if constexpr (bus::detail::IsMessage<T>::value) {
        return m;
      } else {
        return Codec<T>::decode(m.reader());
      }
    }
    capnp::FlatArrayMessageReader reader(in.words, in.options);
    auto root = reader.getRoot<S>();
    if constexpr (bus::detail::IsMessage<T>::value) {
      return T(root);
    } else {
      root.totalSize();  // checks the whole message before the codec reads it
      return Codec<T>::decode(root);
    }
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(std::string(e.getDescription().cStr()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(e.what());
  }
}

template <Bridgeable T, class F>
void ws_view(const T& v, F&& fn) {
  using S = typename Codec<T>::Schema;
  if constexpr (bus::detail::IsMessage<T>::value) {
    fn(WsMessage{capnp::toDynamic(v.reader()), v.bytes()});
  } else {
    Message<S> m = build<S>([&](typename S::Builder b) { Codec<T>::encode(v, b); });
    fn(WsMessage{capnp::toDynamic(m.reader()), m.bytes()});
  }
}

}  // namespace detail

/// The channels a WebSocket client can reach, and in which directions (Server::websocket()).
/// Configure before Server::start().
class WebSocketBridge {
 public:
  explicit WebSocketBridge(WebSocketOptions options) : options_(std::move(options)) {}

  /// Makes `topic` nameable by clients (subscribe, publish: as permitted).
  template <Bridgeable T>
  WebSocketBridge& topic(const Topic<T>& topic) {
    detail::WsChannel ch;
    ch.name = topic.name();
    ch.subscribe = [&topic](ExternalInbox& inbox,
                            std::function<void(const detail::WsMessage&)> fn) {
      return inbox.subscribe(topic, [fn = std::move(fn)](const T& m) { detail::ws_view(m, fn); });
    };
    ch.publish = [&topic](Bus& bus, const detail::WsInput& in) -> absl::Status {
      absl::StatusOr<T> m = detail::ws_decode<T>(in);
      if (!m.ok()) return m.status();
      return bus.publish(topic, std::move(*m));
    };
    return add(std::move(ch));
  }
  /// Makes `endpoint` callable by clients (as permitted).
  template <Bridgeable Req, Bridgeable Rep>
  WebSocketBridge& endpoint(const Endpoint<Req, Rep>& endpoint) {
    detail::WsChannel ch;
    ch.name = endpoint.name();
    ch.endpoint = true;
    ch.call = [&endpoint](Bus& bus, const detail::WsInput& in, Clock::duration timeout,
                          detail::WsReply done) {
      absl::StatusOr<Req> req = detail::ws_decode<Req>(in);
      if (!req.ok()) return done(req.status());
      bus.request(endpoint, std::move(*req), timeout,
                  [done = std::move(done)](absl::StatusOr<Rep> rep) mutable {
                    if (!rep.ok()) return done(rep.status());
                    detail::ws_view(*rep, [&](const detail::WsMessage& m) { done(m); });
                  });
    };
    return add(std::move(ch));
  }
  /// Lets every client use channels named `name` (or starting with it) in direction `what`.
  /// A client's token may grant it more (WebSocketOptions::permissions_claim).
  WebSocketBridge& permit(Permit what, std::string name, Match match = Match::kPrefix);

  const WebSocketOptions& options() const { return options_; }
  /// The channel named `name`, or null.
  const detail::WsChannel* find(std::string_view name) const;
  bool permitted(Permit what, std::string_view name) const;

  struct Rule {
    Permit what;
    std::string name;
    Match match;
    bool allows(Permit w, std::string_view n) const {
      return w == what && (match == Match::kExact ? n == name : n.starts_with(name));
    }
  };

 private:
  WebSocketBridge& add(detail::WsChannel ch);

  WebSocketOptions options_;
  std::vector<std::unique_ptr<detail::WsChannel>> channels_;
  std::vector<Rule> rules_;
};

}  // namespace bus::http
