// The WebSocket test client (Boost.Beast, synchronous, over a socket with receive and send
// timeouts).
#include "endpoint/ws_client.hpp"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/buffers_to_string.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/websocket.hpp>
#include <boost/beast/websocket/ssl.hpp>
#include <deque>
#include <stdexcept>
#include <variant>

namespace ws_test {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace websocket = beast::websocket;
using tcp = asio::ip::tcp;

struct Client::Impl {
  asio::io_context ioc;
  asio::ssl::context tls{asio::ssl::context::tls_client};
  using Plain = websocket::stream<tcp::socket>;
  using Tls = websocket::stream<asio::ssl::stream<tcp::socket>>;
  std::variant<std::unique_ptr<Plain>, std::unique_ptr<Tls>> stream;
  /// Calls `f` with the WebSocket stream, whichever it is.
  template <class F>
  decltype(auto) with(F&& f) {
    return std::visit([&](auto& ws) -> decltype(auto) { return f(*ws); }, stream);
  }
  tcp::socket& socket() {
    return with([](auto& ws) -> tcp::socket& { return beast::get_lowest_layer(ws); });
  }
  beast::flat_buffer buffer;
  std::deque<std::string> pending;  // split JSON messages not handed out yet
  std::string subprotocol;
  uint64_t pings = 0;
  int close_code = 0;
  std::string error;
  bool binary = false;
  std::chrono::milliseconds timeout;
  // A read in flight (async, so that it can time out: Asio's blocking reads ignore
  // SO_RCVTIMEO), and its result once it completed.
  bool reading = false;
  std::optional<beast::error_code> result;

  void start_read() {
    if (reading) return;
    reading = true;
    result.reset();
    buffer.clear();
    with([&](auto& ws) {
      ws.async_read(buffer, [this](beast::error_code ec, std::size_t) {
        reading = false;
        result = ec;
      });
    });
  }
  /// Runs until `done()` or the timeout; false on timeout.
  template <class F>
  bool run_until(F done) {
    auto until = std::chrono::steady_clock::now() + timeout;
    ioc.restart();
    while (!done()) {
      if (ioc.run_one_until(until) == 0 && std::chrono::steady_clock::now() >= until) {
        return done();
      }
    }
    return true;
  }
};

Client::Client(uint16_t port, Options o) : impl_(std::make_unique<Impl>()) {
  impl_->timeout = o.timeout;
  if (o.ca_file.empty()) {
    impl_->stream = std::make_unique<Impl::Plain>(impl_->ioc);
  } else {
    impl_->tls.load_verify_file(o.ca_file);
    impl_->tls.set_verify_mode(asio::ssl::verify_peer);
    auto ws = std::make_unique<Impl::Tls>(impl_->ioc, impl_->tls);
    SSL_set_tlsext_host_name(ws->next_layer().native_handle(), "localhost");
    ws->next_layer().set_verify_callback(asio::ssl::host_name_verification("localhost"));
    impl_->stream = std::move(ws);
  }
  auto& s = impl_->socket();
  s.open(tcp::v4());
  if (o.receive_buffer > 0) {
    int n = o.receive_buffer;
    ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVBUF, &n, sizeof n);
  }
  timeval tv{};  // bounds the blocking writes
  tv.tv_sec = o.timeout.count() / 1000;
  tv.tv_usec = (o.timeout.count() % 1000) * 1000;
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  s.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  if (auto* tls = std::get_if<std::unique_ptr<Impl::Tls>>(&impl_->stream)) {
    beast::error_code ec;
    (*tls)->next_layer().handshake(asio::ssl::stream_base::client, ec);
    if (ec) throw std::runtime_error("TLS handshake failed: " + ec.message());
  }
  websocket::response_type res;
  beast::error_code ec;
  impl_->with([&](auto& ws) {
    ws.set_option(websocket::stream_base::decorator([&](websocket::request_type& req) {
      if (o.binary) req.set(beast::http::field::sec_websocket_protocol, "bus.capnp");
      for (const auto& [name, value] : o.headers) req.set(name, value);
    }));
    ws.control_callback([this](websocket::frame_type kind, beast::string_view) {
      if (kind == websocket::frame_type::ping) ++impl_->pings;
    });
    ws.handshake(res, "127.0.0.1:" + std::to_string(port), o.path, ec);
  });
  if (ec) {
    throw std::runtime_error("websocket handshake failed: " + ec.message() + " (HTTP " +
                             std::to_string(res.result_int()) + ")");
  }
  impl_->subprotocol = std::string(res[beast::http::field::sec_websocket_protocol]);
}

Client::~Client() {
  beast::error_code ignored;
  impl_->socket().close(ignored);
}

void Client::send_text(std::string_view text) {
  impl_->with([&](auto& ws) {
    ws.text(true);
    ws.write(asio::buffer(text.data(), text.size()));
  });
}

void Client::send_binary(std::string_view bytes) {
  impl_->with([&](auto& ws) {
    ws.binary(true);
    ws.write(asio::buffer(bytes.data(), bytes.size()));
  });
}

std::optional<std::string> Client::read() {
  impl_->start_read();
  if (!impl_->run_until([&] { return impl_->result.has_value(); })) {
    impl_->error = "read timed out";
    return std::nullopt;
  }
  beast::error_code ec = *std::exchange(impl_->result, std::nullopt);
  if (ec) {
    impl_->error = ec.message();
    if (ec == websocket::error::closed) {
      impl_->close_code = impl_->with([](auto& ws) { return int(ws.reason().code); });
    }
    return std::nullopt;
  }
  impl_->binary = impl_->with([](auto& ws) { return ws.got_binary(); });
  return beast::buffers_to_string(impl_->buffer.data());
}

bool Client::last_was_binary() const { return impl_->binary; }

std::optional<std::string> Client::next_json() {
  while (impl_->pending.empty()) {
    std::optional<std::string> frame = read();
    if (!frame) return std::nullopt;
    for (auto& m : split_array(*frame)) impl_->pending.push_back(std::move(m));
  }
  std::string m = std::move(impl_->pending.front());
  impl_->pending.pop_front();
  return m;
}

std::string Client::subprotocol() const { return impl_->subprotocol; }
uint64_t Client::pings() const { return impl_->pings; }

bool Client::wait_for_pings(uint64_t n) {
  impl_->start_read();  // pings are answered while a read is in flight
  return impl_->run_until([&] { return impl_->pings >= n || impl_->result.has_value(); }) &&
         impl_->pings >= n;
}
int Client::close_code() const { return impl_->close_code; }
std::string Client::error() const { return impl_->error; }

void Client::close() {
  beast::error_code ec;
  impl_->with([&](auto& ws) { ws.close(websocket::close_code::normal, ec); });
  while (!ec && read()) {  // until the server's close frame arrives
  }
}

namespace {
capnp::JsonCodec& codec() {
  thread_local capnp::JsonCodec c;
  return c;
}
}  // namespace

std::vector<std::string> split_array(std::string_view json) {
  capnp::MallocMessageBuilder b;
  auto root = b.initRoot<capnp::JsonValue>();
  codec().decodeRaw(kj::ArrayPtr<const char>(json.data(), json.size()), root);
  std::vector<std::string> out;
  if (!root.isArray()) {
    out.emplace_back(json);
    return out;
  }
  for (auto v : root.asReader().getArray()) {
    kj::String s = codec().encodeRaw(v);
    out.emplace_back(s.cStr(), s.size());
  }
  return out;
}

std::string field(std::string_view json, std::string_view name) {
  capnp::MallocMessageBuilder b;
  auto root = b.initRoot<capnp::JsonValue>();
  codec().decodeRaw(kj::ArrayPtr<const char>(json.data(), json.size()), root);
  if (!root.isObject()) return "";
  for (auto f : root.asReader().getObject()) {
    if (std::string_view(f.getName().cStr(), f.getName().size()) == name) {
      kj::String s = codec().encodeRaw(f.getValue());
      return std::string(s.cStr(), s.size());
    }
  }
  return "";
}

}  // namespace ws_test
