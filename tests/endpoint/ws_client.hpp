// A small blocking WebSocket client for the WebSocket bridge tests (Boost.Beast, kept in
// ws_client.cpp). Every read has a timeout, so a test whose server misbehaves fails instead of
// hanging.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ws_test {

struct Options {
  std::string path = "/bus";
  bool binary = false;       // asks for the "bus.capnp" subprotocol
  std::string ca_file = {};  // wss://: TLS, the server's certificate verified against this CA
  std::vector<std::pair<std::string, std::string>> headers = {};  // more upgrade request fields
  int receive_buffer = 0;  // SO_RCVBUF before connecting (0: the system's)
  std::chrono::milliseconds timeout{10'000};
};

class Client {
 public:
  /// Connects and upgrades; throws std::runtime_error when the handshake fails (its message
  /// holds "HTTP <status>" when the server answered the upgrade with an error).
  explicit Client(uint16_t port, Options options = {});
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  void send_text(std::string_view text);
  void send_binary(std::string_view bytes);
  /// The next WebSocket message; nullopt when the connection closed or the read timed out
  /// (error() says which, close_code() the server's close status).
  std::optional<std::string> read();
  bool last_was_binary() const;
  /// The next server message as JSON (the server's frames are arrays: they are split here).
  std::optional<std::string> next_json();
  /// The server's subprotocol answer.
  std::string subprotocol() const;
  /// Pings seen from the server (answered automatically while reading).
  uint64_t pings() const;
  /// Reads (answering pings) until `n` pings came; false when a message, a close or the
  /// timeout came first.
  bool wait_for_pings(uint64_t n);
  int close_code() const;
  std::string error() const;
  /// Starts the closing handshake and waits for its end.
  void close();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The elements of a JSON array, each as compact JSON (the input itself if it is no array).
std::vector<std::string> split_array(std::string_view json);
/// A field of a JSON object as compact JSON ("" if absent), e.g. field(m, "op") == "\"msg\"".
std::string field(std::string_view json, std::string_view name);

}  // namespace ws_test
