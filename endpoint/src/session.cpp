// Connections and I/O threads of the HTTP server (Boost.Beast on Asio).
#include <absl/strings/str_split.h>
#include <kj/compat/url.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <boost/asio/write.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>
#include <cstdio>

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

/// Connection-level failures end the connection quietly; HTTP parse errors are answered 400.
bool is_http_error(const beast::error_code& ec) {
  return ec.category() == bh::make_error_code(bh::error::bad_target).category();
}

std::string_view view(beast::string_view s) { return {s.data(), s.size()}; }

}  // namespace

// ==== Session
// ====================================================================================

Session::Session(IoThread& io, tcp::socket socket) : io_(io), socket_(std::move(socket)) {
  io_.sessions.insert(this);
  beast::error_code ignored;
  socket_.set_option(tcp::no_delay(true), ignored);  // a reply is one write: send it now
}

Session::~Session() { io_.forget(this); }

void Session::close() {
  if (phase_ == Phase::kClosed) return;
  phase_ = Phase::kClosed;
  deadline_.reset();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
}

void Session::wait_for_request() {
  if (io_.draining) return close();
  phase_ = Phase::kIdle;
  if (buffer_.size() > 0) return read_request();  // a pipelined request is already here
  deadline_ = Clock::now() + io_.server.options.idle_timeout();
  // Wait for the next request's first bytes with a read, not socket::async_wait: Asio starts a
  // wait without trying it first and re-arms epoll for it (an epoll_ctl per request, 8% of the
  // CPU at 10,000 connections), while a read is tried at once and, when nothing is there yet,
  // waits on the registration the socket already has.
  socket_.async_read_some(buffer_.prepare(kFirstRead),
                          [self = shared_from_this()](beast::error_code ec, std::size_t n) {
                            if (ec || self->phase_ == Phase::kClosed) return self->close();
                            self->buffer_.commit(n);
                            self->read_request();
                          });
}

void Session::read_request() {
  phase_ = Phase::kReading;
  started_ = Clock::now();  // latency counts from the request's first byte
  // The whole request must arrive within read_timeout of its first byte: a client trickling
  // its headers is closed by the sweep.
  deadline_ = Clock::now() + io_.server.options.read_timeout();
  parser_.emplace();
  parser_->header_limit(static_cast<uint32_t>(io_.server.options.max_header_bytes()));
  parser_->body_limit(io_.server.options.max_body_bytes());
  bh::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_read(ec); });
}

void Session::on_read(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec == bh::error::header_limit) {
    return refuse(
        Reply::error(431, "header_fields_too_large",
                     "the request line and headers exceed " +
                         std::to_string(io_.server.options.max_header_bytes()) + " bytes"),
        true);
  }
  if (ec == bh::error::body_limit) {
    return refuse(Reply::error(413, "payload_too_large",
                               "the body exceeds " +
                                   std::to_string(io_.server.options.max_body_bytes()) + " bytes"),
                  true);
  }
  if (ec == bh::error::end_of_stream || ec == bh::error::partial_message) return close();
  if (ec && is_http_error(ec)) {
    return refuse(Reply::error(400, "bad_request", "malformed HTTP request: " + ec.message()),
                  true);
  }
  if (ec) return close();  // reset, aborted by a timeout, ...
  dispatch();
}

void Session::refuse(Reply reply, bool close_after) {
  bump(io_.io.bad_requests);
  route_ = io_.server.unmatched;
  close_after_ = close_after;
  if (parser_ && parser_->is_header_done()) {
    version_ = parser_->get().version();
    head_ = parser_->get().method() == bh::verb::head;
  } else {
    version_ = 11;
    head_ = false;
  }
  write(std::move(reply), nullptr);
}

void Session::dispatch() {
  auto& msg = parser_->get();
  version_ = msg.version();
  keep_alive_ = msg.keep_alive();
  close_after_ = false;
  head_ = msg.method() == bh::verb::head;
  std::optional<Method> method = method_of(msg.method());
  if (!method) {
    route_ = io_.server.unmatched;
    return write(
        Reply::error(501, "not_implemented",
                     "method " + std::string(view(msg.method_string())) + " is not served"),
        nullptr);
  }

  std::string_view target = view(msg.target());
  if (const WebSocketBridge* ws = io_.server.websocket.get();
      ws != nullptr && target.substr(0, target.find('?')) == ws->options().path()) {
    route_ = io_.server.unmatched;
    if (*method == Method::kGet && upgrade(io_, socket_, *parser_)) {
      phase_ = Phase::kClosed;  // the socket is the WebSocket's now
      deadline_.reset();
      return;
    }
    return write(Reply::error(426, "upgrade_required",
                              "GET " + ws->options().path() + " is a WebSocket: send an upgrade"),
                 nullptr);
  }
  std::vector<std::string_view> path;
  Request::Fields query;
  kj::Maybe<kj::Url> url;
  if (target.front() == '/' && target.find_first_of("%?#.+\\") == std::string_view::npos) {
    // Nothing to decode, no query, no dot segments: the path is its '/'-separated segments
    // (empty ones dropped, as kj::Url does). Saves kj::Url's allocations on the common request.
    for (absl::string_view seg :
         absl::StrSplit(absl::string_view(target.data(), target.size()), '/', absl::SkipEmpty())) {
      path.emplace_back(seg.data(), seg.size());
    }
  } else {
    url = kj::Url::tryParse(std::string(target), kj::Url::HTTP_REQUEST);
    kj::Url* parsed = nullptr;
    KJ_IF_MAYBE (u, url) {
      parsed = u;
    }
    if (parsed == nullptr) {
      return refuse(
          Reply::error(400, "bad_request", "malformed request target: " + std::string(target)),
          false);
    }
    path.reserve(parsed->path.size());
    for (const kj::String& seg : parsed->path) path.emplace_back(seg.cStr(), seg.size());
    query.reserve(parsed->query.size());
    for (const auto& q : parsed->query) {
      query.emplace_back(std::string(q.name.cStr(), q.name.size()),
                         std::string(q.value.cStr(), q.value.size()));
    }
  }
  Router::Miss miss;
  std::optional<Router::Match> match = io_.server.router.match(*method, path, &miss);
  if (!match) {
    route_ = io_.server.unmatched;
    if (miss.path_known) {
      return write(Reply::error(405, "method_not_allowed",
                                std::string(to_string(*method)) + " is not allowed on " +
                                    std::string(target) + " (allowed: " + miss.allow + ")"),
                   &miss.allow);
    }
    return write(
        Reply::error(404, "not_found",
                     "no route for " + std::string(to_string(*method)) + " " + std::string(target)),
        nullptr);
  }

  route_ = match->route;
  request_.emplace(*method, target, msg.body(), std::move(match->params), std::move(query), &msg);
  deadline_.reset();  // the route's deadline answers it, whether it waits for a turn or runs
  if (!io_.admit(*this)) {
    phase_ = Phase::kQueued;  // the I/O thread has max_in_flight requests out: wait for a turn
    return;
  }
  invoke();
}

void Session::invoke() {
  phase_ = Phase::kHandling;
  io_.batch_round();
  io_.server.entries[route_].handler(*request_, Responder(shared_from_this(), ++ticket_));
}

void Session::answer(uint64_t ticket, Reply&& reply) {
  io_.finished_one();  // every Responder answers exactly once, stale or not
  // A stale answer: the connection was closed (timeout, shutdown) while the route worked.
  if (ticket != ticket_ || phase_ != Phase::kHandling) return;
  request_.reset();
  write(std::move(reply), nullptr);
}

void Session::write(Reply&& reply, const std::string* allow) {
  io_.counters[route_]->record(reply.status, Clock::now() - started_);
  bump(io_.io.requests);
  response_ = {};
  response_.version(version_);
  response_.result(reply.status);
  response_.set(bh::field::content_type, reply.content_type);
  if (allow != nullptr) response_.set(bh::field::allow, *allow);
  for (const auto& [name, value] : reply.headers) response_.set(name, value);
  bool keep = keep_alive_ && !close_after_ && !io_.draining;
  response_.keep_alive(keep);
  response_.body() = std::move(reply.body);
  response_.prepare_payload();
  // HEAD: the headers GET would send (Content-Length included), no body.
  if (head_) response_.body().clear();
  phase_ = Phase::kWriting;
  deadline_ = Clock::now() + io_.server.options.write_timeout();
  bh::async_write(
      socket_, response_,
      [self = shared_from_this()](beast::error_code ec, std::size_t) { self->on_write(ec); });
}

void Session::on_write(beast::error_code ec) {
  if (phase_ == Phase::kClosed) return;
  if (ec || !response_.keep_alive()) return close();
  wait_for_request();
}

// ==== IoThread
// ===================================================================================

IoThread::IoThread(Server::Impl& s, unsigned i) : server(s), index(i) {
  for (std::size_t r = 0; r < server.labels.size(); ++r) {
    counters.push_back(std::make_unique<RouteCounters>());
  }
}

IoThread::~IoThread() { join(); }

void IoThread::start(const tcp::endpoint& at, std::mutex& mu, std::condition_variable& cv,
                     bool& ready) {
  beast::error_code ec;
  if (index == 0 && at.port() != 0) {
    // SO_REUSEPORT would let this server share a port another server (of the same user)
    // listens on. A plain bind first tells whether the port is taken.
    tcp::acceptor probe(ioc);
    probe.open(at.protocol(), ec);
    if (!ec) probe.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) probe.bind(at, ec);
  }
  if (!ec) acceptor_.open(at.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) {
    // Every I/O thread listens on the same port; the kernel spreads the connections.
    using ReusePort = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
    acceptor_.set_option(ReusePort(true), ec);
  }
  if (!ec) acceptor_.bind(at, ec);
  if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor_.non_blocking(true, ec);
  if (ec) {
    throw std::runtime_error("bus::http: cannot listen on " + at.address().to_string() + ":" +
                             std::to_string(at.port()) + ": " + ec.message() +
                             " (is the port taken? choose another with ServerOptions::port)");
  }
  port_ = acceptor_.local_endpoint().port();
  thread_ = std::thread([this, &mu, &cv, &ready] { run(mu, cv, ready); });
}

void IoThread::run(std::mutex& mu, std::condition_variable& cv, bool& ready) {
  char name[16];
  std::snprintf(name, sizeof name, "bus-http-%u", index);
  pthread_setname_np(pthread_self(), name);
  inbox_.emplace(server.bus);  // this thread's bus inbox: replies to its requests come here
  ws_hub.reset(make_ws_hub());
  wake_.emplace(ioc, ::dup(inbox_->fd()));
  wait_for_wake();
  accept();
  sweep();
  {
    // Notified under the lock: start() owns `cv` and may return (destroying it) once it sees
    // `ready`.
    std::lock_guard lock(mu);
    ready = true;
    cv.notify_all();
  }

  ioc.run();

  // Stopped. Close what is left, let the aborted operations release their sessions, then close
  // the inbox: requests still pending are cancelled and their answers go nowhere.
  for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) s->close();
  close_websockets(*this, /*now=*/true);
  waiting_.clear();
  ioc.restart();
  ioc.poll();
  ws_hub.reset();  // its bus subscriptions, before the inbox they run on
  batch_.reset();
  inbox_.reset();
  ioc.poll();
  wake_.reset();
  std::lock_guard lock(server.mu);
  --server.running;
  server.cv.notify_all();
}

void IoThread::join() {
  if (thread_.joinable()) thread_.join();
}

void IoThread::shutdown() {
  asio::post(ioc, [this] { begin_shutdown(); });
}

void IoThread::accept() {
  acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
    if (ec == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (ec) {
      // Out of descriptors or memory: try again shortly rather than spin on the error.
      std::fprintf(stderr, "bus::http: accept failed: %s\n", ec.message().c_str());
      accept_retry_.expires_after(std::chrono::milliseconds(50));
      accept_retry_.async_wait([this](beast::error_code e) {
        if (!e && acceptor_.is_open()) accept();
      });
      return;
    }
    admit(std::move(socket));
    // Take what else waits in the backlog now (like nginx's multi_accept), a bounded number per
    // round: one accept per pass of the event loop leaves a burst of new connections (10,000 at
    // once) waiting behind every active one for many passes, their first requests unread.
    for (int i = 0; i < kAcceptBurst && acceptor_.is_open(); ++i) {
      tcp::socket more(acceptor_.get_executor());
      beast::error_code again;
      acceptor_.accept(more, again);  // the acceptor is non-blocking: would_block ends it
      if (again) break;
      admit(std::move(more));
    }
    accept();
  });
}

void IoThread::admit(tcp::socket socket) {
  if (server.open.fetch_add(1, std::memory_order_relaxed) >= server.options.max_connections()) {
    server.open.fetch_sub(1, std::memory_order_relaxed);
    refuse(std::move(socket));
  } else {
    bump(io.accepted);
    std::make_shared<Session>(*this, std::move(socket))->start();
  }
}

void IoThread::refuse(tcp::socket socket) {
  static const std::string kRefusal = [] {
    Reply r = Reply::error(503, "unavailable", "too many connections; try again later");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body;
  }();
  bump(io.refused);
  auto s = std::make_shared<tcp::socket>(std::move(socket));
  asio::async_write(*s, asio::buffer(kRefusal), [s](beast::error_code, std::size_t) {
    beast::error_code ignored;
    s->shutdown(tcp::socket::shutdown_send, ignored);
    s->close(ignored);
  });
}

void IoThread::wait_for_wake() {
  wake_->async_wait(asio::posix::stream_descriptor::wait_read, [this](beast::error_code ec) {
    if (ec) return;
    inbox_->drain();  // replies: their Responders start the writes
    arm_bus_timer();
    wait_for_wake();
  });
}

bool IoThread::admit(Session& s) {
  if (in_flight_ < server.options.max_in_flight()) {
    ++in_flight_;
    return true;
  }
  waiting_.push_back(s.shared_from_this());
  io.waiting.store(waiting_.size(), std::memory_order_relaxed);
  return false;
}

void IoThread::finished_one() {
  --in_flight_;
  while (!waiting_.empty() && in_flight_ < server.options.max_in_flight()) {
    std::shared_ptr<Session> next = std::move(waiting_.front());
    waiting_.pop_front();
    io.waiting.store(waiting_.size(), std::memory_order_relaxed);
    if (next->phase() != Session::Phase::kQueued) continue;  // closed while it waited
    ++in_flight_;
    // Posted, not called: a route answering at once would otherwise nest one call per waiter.
    asio::post(ioc, [next] {
      if (next->phase() == Session::Phase::kQueued) {
        next->invoke();
      } else {
        next->io().finished_one();
      }
    });
  }
}

void IoThread::batch_round() {
  if (batch_) return;
  batch_.emplace(server.bus);
  // A handler posted now runs after the completions Asio already has queued (this round's
  // ready sockets), so the batch spans every request they make.
  asio::post(ioc, [this] {
    batch_.reset();
    arm_bus_timer();
  });
}

void IoThread::arm_bus_timer() {
  if (!inbox_) return;
  std::optional<Clock::time_point> next = inbox_->next_timer();
  if (!next || (bus_timer_at_ && *bus_timer_at_ <= *next)) return;
  bus_timer_at_ = next;
  bus_timer_.expires_at(*next);
  bus_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    bus_timer_at_.reset();
    inbox_->drain();  // request deadlines: 504s
    arm_bus_timer();
  });
}

void IoThread::sweep() {
  auto& o = server.options;
  auto period = std::min({o.read_timeout(), o.idle_timeout(), o.write_timeout()}) / 4;
  period = std::clamp<Clock::duration>(period, std::chrono::milliseconds(5),
                                       std::chrono::milliseconds(500));
  sweep_timer_.expires_after(period);
  sweep_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    Clock::time_point now = Clock::now();
    std::vector<Session*> late;
    for (Session* s : sessions) {
      if (s->deadline() && *s->deadline() <= now) late.push_back(s);
    }
    for (Session* s : late) {
      bump(io.timed_out);
      s->close();
    }
    sweep();
  });
}

void IoThread::begin_shutdown() {
  if (draining) return;
  draining = true;
  beast::error_code ignored;
  acceptor_.close(ignored);
  accept_retry_.cancel();
  // Connections between requests (or in the middle of reading one) close now; those whose
  // request is being answered finish it, with "Connection: close".
  for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) {
    if (s->phase() == Session::Phase::kIdle || s->phase() == Session::Phase::kReading) s->close();
  }
  close_websockets(*this, /*now=*/false);  // "going away", with a closing handshake
  grace_timer_.expires_after(server.options.grace());
  grace_timer_.async_wait([this](beast::error_code ec) {
    if (ec) return;
    for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) s->close();
    close_websockets(*this, /*now=*/true);
    finish();
  });
  if (sessions.empty() && ws_sessions.empty()) finish();
}

void IoThread::forget(Session* s) {
  sessions.erase(s);
  server.open.fetch_sub(1, std::memory_order_relaxed);
  if (draining && sessions.empty() && ws_sessions.empty()) finish();
}

void IoThread::finish() {
  if (finished_) return;
  finished_ = true;
  grace_timer_.cancel();
  sweep_timer_.cancel();
  bus_timer_.cancel();
  ioc.stop();
}

}  // namespace bus::http::detail
