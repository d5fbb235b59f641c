// Inside the HTTP server: the I/O threads and their connections. Boost.Beast lives behind this
// header, which only endpoint/src includes.
#pragma once

#include <absl/container/flat_hash_set.h>

#include <atomic>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "bus/http/server.hpp"
#include "bus/http/websocket.hpp"
#include "jwt.hpp"
#include "metrics.hpp"
#include "router.hpp"
#include "tls.hpp"

namespace bus::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bh = boost::beast::http;
using tcp = asio::ip::tcp;

namespace detail {

/// A Beast string as a std::string_view.
inline std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }
/// An Asio socket owning `fd`, a connected TCP socket (closed when Asio cannot take it).
tcp::socket adopt(asio::io_context& ioc, int fd);

class IoThread;
class WsSession;
struct WsHub;
struct WsHubDeleter {
  void operator()(WsHub* h) const;
};
WsHub* make_ws_hub();

/// WebSocket counters of one I/O thread (written by it, read by stats()).
struct WsCounters {
  std::atomic<uint64_t> open{0}, accepted{0}, frames_in{0}, messages_out{0}, frames_out{0},
      refused{0}, bad_frames{0}, dropped{0}, closed_slow{0}, published{0}, calls{0},
      queued_bytes{0};
};

/// What a WebSocket takes over from an HTTP connection.
struct Handover {
  tcp::socket socket;
  SSL* ssl;                // the established TLS session (owned now), or null
  PrincipalPtr principal;  // the client certificate's (mTLS), or null
};

/// One connection: reads a request, has it answered, writes the reply, and again while the
/// client keeps the connection alive. Pipelined requests wait in the buffer and are answered in
/// order.
///
/// A connection's reads and writes are plain non-blocking syscalls on a socket registered once,
/// edge-triggered, in its I/O thread's connection poller (IoThread::poll_connections), not Asio
/// socket operations: Asio 1.74 starts every read either with a recv that finds nothing yet or
/// with an epoll_ctl re-arm, one syscall per request more than needed (how many that is: docs/
/// benchmarks.md, "The figures behind the code"). Like nginx, a recv that returns
/// less than it asked for means the socket is drained until its next edge. Beast still parses
/// the requests; the responses are formatted into out_.
///
/// The I/O thread owns an open session (`self_`); an unanswered Responder or a queued turn keeps
/// a closed one alive until it lets go.
class Session final : public Exchange, public std::enable_shared_from_this<Session> {
 public:
  enum class Phase { kHandshake, kIdle, kReading, kQueued, kHandling, kWriting, kClosed };

  /// Takes `fd`, a connected non-blocking TCP socket; start() registers it. With `tls` it is a
  /// TLS connection of that context, and start() begins its handshake.
  Session(IoThread& io, int fd, SSL_CTX* tls);
  ~Session() override;
  void start();
  void answer(uint64_t ticket, Reply&& reply) override;
  /// Closes the socket. The I/O thread lets go of the session after the current handler.
  void close();
  /// The connection poller saw `events` (EPOLLIN, EPOLLOUT, ...) on the socket.
  void on_events(uint32_t events);

  /// Hands the request read to its route (after admission, see IoThread::admit).
  void invoke();
  IoThread& io() const { return io_; }
  Phase phase() const { return phase_; }
  /// When the current phase times out (none while a route handles the request: its bus
  /// deadline answers it).
  std::optional<Clock::time_point> deadline() const { return deadline_; }

 private:
  enum class Received { kSome, kNothing, kEnd, kFailed };
  void wait_for_request();
  /// Reads into buffer_ (at most `want` bytes) when the socket has something.
  Received receive(std::size_t want);
  Received receive_tls(std::size_t want);
  void handshake();
  void read_request();
  /// Parses what buffer_ holds into parser_, reading more while the socket has it.
  void parse();
  void on_read(beast::error_code ec);

  /// What dispatch() does after a phase: the next phase, or nothing more (the phase answered the
  /// request, or handed the connection over).
  enum class Next { kContinue, kAnswered };
  /// What the phases learn of a request, for the phases after them (request_phases.cpp).
  struct Routing;
  /// Runs the request's phases in order (request_phases.cpp), up to the route's handler.
  void dispatch();
  // Its phases, in order: inline (defined and called in request_phases.cpp alone) so that the
  // compiler may fold them into dispatch().
  inline Next read_head(Routing& r);
  inline void allow_origin(const Routing& r);
  inline Next resolve_target(Routing& r);
  inline Next upgrade_websocket(const Routing& r);
  inline Next split_path(Routing& r);
  inline Next match_route(Routing& r);
  inline Next answer_preflight(const Routing& r, const Router::Miss& miss);
  inline Next authenticate(Routing& r);
  inline Next authorize(const Routing& r);
  inline void admit(Routing& r);

  /// Answers a request that could not be read (400, 413, 431): counted as a bad request.
  void refuse(Reply reply, bool close_after);
  void write(Reply&& reply, const std::string* allow);
  /// The response to `reply` into out_.
  void format(const Reply& reply, const std::string* allow);
  /// Sends what out_ has left; waits for the next EPOLLOUT when the socket is full.
  void send();
  /// Gives the socket (and TLS session) to the WebSocket bridge (a GET of its path with an
  /// upgrade).
  Handover hand_over();

  IoThread& io_;
  const bool tls_;
  // Readiness is cleared when a syscall finds the socket drained (or full), set by the poller's
  // next event.
  PolledSocket sock_;
  SSL* ssl_ = nullptr;             // a TLS connection's, else null
  PrincipalPtr client_principal_;  // its client certificate's subject (mTLS), or null
  std::shared_ptr<Session> self_;  // while open
  beast::flat_buffer buffer_;
  /// What an idle connection reads at once when its next request begins (most requests whole).
  static constexpr std::size_t kFirstRead = 512;
  std::optional<bh::request_parser<bh::string_body>> parser_;
  std::optional<Request> request_;  // what the route sees; views into parser_'s message
  std::string absolute_target_;     // the origin-form of an absolute-form target
  std::string_view cors_allowed_;   // Access-Control-Allow-Origin of this response, or empty
  std::string out_;                 // the response being sent
  std::size_t sent_ = 0;
  /// out_ keeps its capacity between responses up to this size.
  static constexpr std::size_t kKeptOut = 4096;
  bool keep_open_ = true;  // after the response being sent
  Phase phase_ = Phase::kIdle;
  std::optional<Clock::time_point> deadline_;
  uint64_t ticket_ = 0;
  std::size_t route_ = 0;  // metrics label of the request being answered
  Clock::time_point started_;
  unsigned version_ = 11;
  bool keep_alive_ = true;
  bool head_ = false;
  bool close_after_ = false;  // the response ends the connection (a request that could not be read)
};

/// A routed path and what answers it.
struct Entry {
  RouteSpec spec;
  Handler handler;
};

}  // namespace detail

struct Server::Impl {
  Impl(Bus& b, ServerOptions o) : bus(b), options(std::move(o)) {}

  Bus& bus;
  ServerOptions options;
  detail::Router router;
  std::vector<detail::Entry> entries;      // by router index
  std::vector<detail::RouteLabel> labels;  // by router index, then "unmatched"
  std::size_t unmatched = 0;               // label index of requests no route took
  std::vector<std::unique_ptr<detail::IoThread>> threads;
  std::atomic<uint64_t> open{0};      // connections, every thread (max_connections)
  std::atomic<uint16_t> port{0};      // 0 until start() has bound; read from any thread
  std::atomic<uint16_t> tls_port{0};  // the same for the TLS listener
  std::mutex tls_mu;                  // serializes reload_tls()
  bool started = false;
  std::atomic<bool> stopping{false};

  std::mutex mu;  // guards `running` (threads still serving)
  std::condition_variable cv;
  unsigned running = 0;

  // /health: one probe endpoint per executor, answered on that executor.
  std::vector<std::unique_ptr<Endpoint<uint32_t, uint32_t>>> probes;
  std::vector<Subscription> probe_servers;

  std::unique_ptr<WebSocketBridge> websocket;  // null: no WebSocket bridge
  std::unique_ptr<detail::JwtVerifier> jwt;    // null: no bearer tokens
  std::string openapi;                         // the OpenAPI document, made by start()

  void serve_health(const Request& req, Responder respond);
  Reply serve_metrics() const;
  /// The WebSocket bridge's counters, summed over the I/O threads.
  WebSocketStats websocket_stats() const;
};

namespace detail {

/// An I/O thread: an io_context with its own listening socket (SO_REUSEPORT), its connections,
/// and an ExternalInbox woken through its eventfd, where the replies of the bus requests its
/// routes make are run.
class IoThread {
 public:
  IoThread(Server::Impl& server, unsigned index);
  ~IoThread();
  /// Binds the listeners given (throws std::runtime_error on failure) and starts the thread.
  void start(const std::optional<tcp::endpoint>& plain, const std::optional<tcp::endpoint>& tls,
             std::mutex& mu, std::condition_variable& cv, bool& ready);
  /// From any thread: begins the graceful shutdown on this thread.
  void shutdown();
  void join();
  uint16_t port() const { return port_; }
  uint16_t tls_port() const { return tls_port_; }

  Server::Impl& server;
  const unsigned index;
  asio::io_context ioc{1};
  IoCounters io;
  std::vector<std::unique_ptr<RouteCounters>> counters;  // by route label
  absl::flat_hash_set<Session*> sessions;
  bool draining = false;
  // The WebSocket bridge's connections and topic subscriptions on this thread.
  WsCounters ws;
  absl::flat_hash_set<WsSession*> ws_sessions;
  std::unique_ptr<WsHub, WsHubDeleter> ws_hub;
  ExternalInbox& inbox() { return *inbox_; }
  /// The tokens this thread has verified (with ServerOptions::jwt).
  std::optional<TokenCache> tokens;
  /// A request's principal: its bearer token's (verified), or `fallback` (the connection's
  /// client certificate's) when it has none. Unauthenticated when the token is refused.
  absl::StatusOr<PrincipalPtr> authenticate(const bh::request<bh::string_body>& msg,
                                            const PrincipalPtr& fallback);
  /// The realm of WWW-Authenticate.
  const std::string& realm() const;
  /// The context new TLS connections get: set before the thread starts, then replaced on this
  /// thread by Server::reload_tls (connections keep the one they began with).
  std::shared_ptr<asio::ssl::context> tls_context;

  /// Called before a route handler runs: the bus requests made until the current round of
  /// ready I/O ends are published together (one release and at most one wake per executor,
  /// instead of one per request), and the inbox's deadline timer is re-armed after them.
  void batch_round();
  /// Admission: true when `s` may call its route now; otherwise it waits its turn (FIFO).
  /// Bounding what one I/O thread has in flight bounds its rings to the executors, so an
  /// overload waits in the kernel's socket buffers (TCP back-pressure), not in 503s.
  bool admit(Session& s);
  /// A request admitted earlier was answered: the next waiting one goes.
  void finished_one();
  void arm_bus_timer();
  /// Called when a session ends.
  void forget(Session* s);
  /// Adds a connection's socket to the connection poller (edge-triggered, in and out).
  bool watch(int fd, Session* s);
  /// Removes it (the socket goes on, elsewhere).
  void unwatch(int fd);
  /// Stops the event loop (shutdown: every connection is gone).
  void finish();
  /// "HTTP/1.1 200 OK\r\n": the status line of a response, kept for the last version and status
  /// this thread sent (nearly every response repeats them).
  const std::string& status_line(unsigned version, unsigned status);

 private:
  void run(std::mutex& mu, std::condition_variable& cv, bool& ready);
  uint16_t listen(tcp::acceptor& acceptor, const tcp::endpoint& at, const char* option);
  void accept(tcp::acceptor& acceptor, bool tls);
  /// A new connection (a non-blocking socket): a session, or a 503 past max_connections.
  void admit(int fd, bool tls);
  void refuse(int fd);
  /// Waits until a connection's socket is ready, then runs poll_connections.
  void wait_for_connections();
  /// Takes the ready connections' events (kRound at most) to their sessions.
  void poll_connections();
  static constexpr int kRound = 32;
  /// Connections accepted per wakeup of the listening socket at most, beyond the first.
  static constexpr int kAcceptBurst = 1024;
  void sweep();
  void begin_shutdown();

  std::string status_line_;
  unsigned status_line_key_ = 0;  // version * 1000 + status of status_line_; 0: none yet
  tcp::acceptor acceptor_{ioc};
  tcp::acceptor tls_acceptor_{ioc};
  uint16_t port_ = 0;
  uint16_t tls_port_ = 0;
  std::optional<ExternalInbox> inbox_;
  // The connection poller: an epoll set of the HTTP connections' sockets and the inbox's
  // eventfd, itself watched by Asio's reactor.
  std::optional<asio::posix::stream_descriptor> poller_;
  asio::steady_timer bus_timer_{ioc};
  std::optional<Clock::time_point> bus_timer_at_;
  asio::steady_timer sweep_timer_{ioc};
  asio::steady_timer grace_timer_{ioc};
  asio::steady_timer accept_retry_{ioc};
  asio::steady_timer tls_accept_retry_{ioc};
  std::optional<Batch> batch_;  // open until the end of the current round
  std::size_t in_flight_ = 0;
  std::deque<std::shared_ptr<Session>> waiting_;
  bool waiters_posted_ = false;  // a handler admitting waiters is queued
  bool finished_ = false;
  std::thread thread_;
};

/// A GET of the WebSocket path: upgrades the connection (taking what `take` gives, and the
/// request) and returns nullopt; or, without calling `take`, the answer to write instead: 426
/// for no upgrade request, 401 for a client without valid credentials, 403 for an Origin the
/// server does not allow.
std::optional<Reply> upgrade(IoThread& io, bh::request_parser<bh::string_body>& parser,
                             const PrincipalPtr& connection_principal,
                             const std::function<Handover()>& take);
/// 401 (RFC 6750 §3): `error` and `description` say what was wrong with the token; both empty
/// when there was none.
Reply unauthorized(std::string_view realm, std::string_view error, std::string_view description);
/// 403: the token is valid but lacks `scope`.
Reply forbidden(std::string_view realm, std::string_view scope);
/// 403 when the request's Origin is not one the server's CORS rules allow (a browser's
/// cross-site WebSocket), else nullopt.
std::optional<Reply> cross_origin_refusal(IoThread& io, const bh::request<bh::string_body>& msg);
/// Closes the thread's WebSocket connections: with a closing handshake, or `now`.
void close_websockets(IoThread& io, bool now);

}  // namespace detail
}  // namespace bus::http
