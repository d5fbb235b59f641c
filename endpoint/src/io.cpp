// IoThread: one I/O thread of the server: its listeners, its epoll set of connections, the
// rounds that hand requests to the bus, and its shutdown (declared in io.hpp).
#include "io.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <boost/asio/write.hpp>

namespace bus::http::detail {

/// An Asio socket owning `fd`, a connected TCP socket (closed when Asio cannot take it).
tcp::socket adopt(asio::io_context& ioc, int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  tcp::socket socket(ioc);
  beast::error_code ec;
  socket.assign(addr.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
  if (ec) ::close(fd);
  return socket;
}

IoThread::IoThread(Server::Impl& s, unsigned i) : server(s), index(i) {
  for (std::size_t r = 0; r < server.labels.size(); ++r) {
    counters.push_back(std::make_unique<RouteCounters>());
  }
}

IoThread::~IoThread() { join(); }

uint16_t IoThread::listen(tcp::acceptor& acceptor, const tcp::endpoint& at, const char* option) {
  beast::error_code ec;
  if (index == 0 && at.port() != 0) {
    // SO_REUSEPORT would let this server share a port another server (of the same user)
    // listens on. A plain bind first tells whether the port is taken.
    tcp::acceptor probe(ioc);
    probe.open(at.protocol(), ec);
    if (!ec) probe.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) probe.bind(at, ec);
  }
  if (!ec) acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) {
    // Every I/O thread listens on the same port; the kernel spreads the connections.
    using ReusePort = asio::detail::socket_option::boolean<SOL_SOCKET, SO_REUSEPORT>;
    acceptor.set_option(ReusePort(true), ec);
  }
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (!ec) acceptor.non_blocking(true, ec);
  if (ec) {
    throw std::runtime_error("bus::http: cannot listen on " + at.address().to_string() + ":" +
                             std::to_string(at.port()) + ": " + ec.message() +
                             " (is the port taken? choose another with " + option + ")");
  }
  return acceptor.local_endpoint().port();
}

void IoThread::start(const std::optional<tcp::endpoint>& plain,
                     const std::optional<tcp::endpoint>& tls, std::mutex& mu,
                     std::condition_variable& cv, bool& ready) {
  if (plain) port_ = listen(acceptor_, *plain, "ServerOptions::port");
  if (tls) tls_port_ = listen(tls_acceptor_, *tls, "TlsOptions::port");
  int poller = ::epoll_create1(EPOLL_CLOEXEC);
  if (poller < 0) {
    throw std::runtime_error(std::string("bus::http: epoll_create1 failed: ") +
                             std::strerror(errno));
  }
  poller_.emplace(ioc, poller);
  thread_ = std::thread([this, &mu, &cv, &ready] { run(mu, cv, ready); });
}

void IoThread::run(std::mutex& mu, std::condition_variable& cv, bool& ready) {
  char name[16];
  std::snprintf(name, sizeof name, "bus-http-%u", index);
  pthread_setname_np(pthread_self(), name);
  inbox_.emplace(server.bus);  // this thread's bus inbox: replies to its requests come here
  if (server.jwt) tokens.emplace(*server.jwt);
  ws_hub.reset(make_ws_hub());
  // The inbox's eventfd is in the connection poller too (its events carry no session): replies
  // are taken in the same rounds as the connections' events, without a wait of their own.
  epoll_event wake{};
  wake.events = EPOLLIN | EPOLLET;
  wake.data.ptr = nullptr;
  if (::epoll_ctl(poller_->native_handle(), EPOLL_CTL_ADD, inbox_->fd(), &wake) != 0) {
    std::fprintf(stderr, "bus::http: cannot watch the inbox: %s\n", std::strerror(errno));
    std::abort();  // the thread could never hear its replies
  }
  wait_for_connections();
  if (acceptor_.is_open()) accept(acceptor_, false);
  if (tls_acceptor_.is_open()) accept(tls_acceptor_, true);
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
  ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_DEL, inbox_->fd(), nullptr);
  inbox_.reset();
  ioc.poll();
  poller_.reset();
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

void IoThread::accept(tcp::acceptor& acceptor, bool tls) {
  // Waits for the listening socket, then takes what waits in its backlog, a bounded number per
  // round (like nginx's multi_accept): one accept per pass of the event loop would leave a burst
  // of new connections (10,000 at once) waiting behind every active one for many passes.
  acceptor.async_wait(tcp::acceptor::wait_read, [this, &acceptor, tls](beast::error_code ec) {
    if (ec == asio::error::operation_aborted || !acceptor.is_open()) return;
    for (int i = 0; !ec && i <= kAcceptBurst && acceptor.is_open(); ++i) {
      int fd = ::accept4(acceptor.native_handle(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(fd, tls);
        continue;
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      // The connection went before it was taken: the next one.
      if (errno == ECONNABORTED || errno == EINTR || errno == EPROTO) continue;
      ec.assign(errno, beast::system_category());
    }
    if (ec) {
      // Out of descriptors or memory: try again shortly rather than spin on the error.
      std::fprintf(stderr, "bus::http: accept failed: %s\n", ec.message().c_str());
      auto& retry = tls ? tls_accept_retry_ : accept_retry_;
      retry.expires_after(std::chrono::milliseconds(50));
      retry.async_wait([this, &acceptor, tls](beast::error_code e) {
        if (!e && acceptor.is_open()) accept(acceptor, tls);
      });
      return;
    }
    accept(acceptor, tls);
  });
}

void IoThread::admit(int fd, bool tls) {
  if (server.open.fetch_add(1, std::memory_order_relaxed) >= server.options.max_connections()) {
    server.open.fetch_sub(1, std::memory_order_relaxed);
    if (!tls) return refuse(fd);
    bump(io.refused);  // a 503 in plain text would be garbage to a TLS client: just closed
    ::close(fd);
  } else {
    bump(io.accepted);
    std::make_shared<Session>(*this, fd, tls ? tls_context->native_handle() : nullptr)->start();
  }
}

void IoThread::refuse(int fd) {
  static const std::string kRefusal = [] {
    Reply r = Reply::error(503, "unavailable", "too many connections; try again later");
    return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
           "Content-Length: " +
           std::to_string(r.body.size()) + "\r\nConnection: close\r\n\r\n" + r.body;
  }();
  bump(io.refused);
  auto s = std::make_shared<tcp::socket>(adopt(ioc, fd));
  if (!s->is_open()) return;
  asio::async_write(*s, asio::buffer(kRefusal), [s](beast::error_code, std::size_t) {
    beast::error_code ignored;
    s->shutdown(tcp::socket::shutdown_send, ignored);
    s->close(ignored);
  });
}

bool IoThread::watch(int fd, Session* s) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
  ev.data.ptr = s;
  return ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_ADD, fd, &ev) == 0;
}

void IoThread::unwatch(int fd) {
  if (poller_) ::epoll_ctl(poller_->native_handle(), EPOLL_CTL_DEL, fd, nullptr);
}

void IoThread::wait_for_connections() {
  // Asio re-arms its registration of the poller for each wait, which also reports events this
  // round left in the poller.
  poller_->async_wait(asio::posix::stream_descriptor::wait_read, [this](beast::error_code ec) {
    if (ec) return;
    poll_connections();
    wait_for_connections();
  });
}

void IoThread::poll_connections() {
  // A round is short: its requests go to the executors together when it ends (batch_round), and
  // their replies are sent between rounds, so every request waits for the whole round it came in
  // (long rounds and what they cost: docs/benchmarks.md, "The figures behind the code").
  std::array<epoll_event, kRound> events;
  int n = ::epoll_wait(poller_->native_handle(), events.data(), kRound, 0);
  // Replies first, every round: the eventfd's event may wait behind thousands of connection
  // events in the poller's ready list, and the answers to the last round's requests are usually
  // here already (the executor ran when that round's batch woke it). That drain also answers the
  // eventfd's own event, when this round holds it.
  if (inbox_ && n > 0) {
    inbox_->drain();  // replies: their Responders start the writes
    arm_bus_timer();
  }
  // A session closed while this round runs stays alive until the round's end (Session::close).
  for (int i = 0; i < n; ++i) {
    if (auto* s = static_cast<Session*>(events[i].data.ptr)) s->on_events(events[i].events);
  }
}

bool IoThread::admit(Session& s) {
  // Behind the waiting ones, if any: turns are taken in order.
  if (in_flight_ < server.options.max_in_flight() && waiting_.empty()) {
    ++in_flight_;
    return true;
  }
  waiting_.push_back(s.shared_from_this());
  io.waiting.store(waiting_.size(), std::memory_order_relaxed);
  return false;
}

void IoThread::finished_one() {
  --in_flight_;
  if (waiting_.empty() || waiters_posted_) return;
  // The waiting requests go from a fresh handler, all that fit in one: a route answering at
  // once would otherwise nest a call per waiter, and a handler per waiter costs a post each.
  waiters_posted_ = true;
  asio::post(ioc, [this] {
    waiters_posted_ = false;
    while (!waiting_.empty() && in_flight_ < server.options.max_in_flight()) {
      std::shared_ptr<Session> next = std::move(waiting_.front());
      waiting_.pop_front();
      if (next->phase() != Session::Phase::kQueued) continue;  // closed while it waited
      ++in_flight_;
      next->invoke();
    }
    io.waiting.store(waiting_.size(), std::memory_order_relaxed);
  });
}

void IoThread::batch_round() {
  if (batch_) return;
  batch_.emplace(server.bus);
  // A handler posted now runs after the completions Asio already has queued (this round's
  // ready sockets), so the batch spans every request they make.
  asio::post(ioc, [this] {
    batch_.reset();  // the round's requests go to the executors, waking those that were parked
    // A woken executor waits for a CPU like any thread; when it shares this one (one core for
    // the server, or a machine busier than its cores) it would wait for this thread's time slice
    // while the round's answers wait for it. Yielding lets it run now, and the next round takes
    // its replies first. Where it has a core of its own, the call returns at once.
    if (server.options.yield_after_round()) ::sched_yield();
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
      if (s->phase() == Session::Phase::kHandshake) bump(io.tls_failed);
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
  tls_acceptor_.close(ignored);
  accept_retry_.cancel();
  tls_accept_retry_.cancel();
  // Connections between requests (or in the middle of reading one, or of their handshake)
  // close now; those whose request is being answered finish it, with "Connection: close".
  for (Session* s : std::vector<Session*>(sessions.begin(), sessions.end())) {
    if (s->phase() == Session::Phase::kIdle || s->phase() == Session::Phase::kReading ||
        s->phase() == Session::Phase::kHandshake) {
      s->close();
    }
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

absl::StatusOr<PrincipalPtr> IoThread::authenticate(const bh::request<bh::string_body>& msg,
                                                    const PrincipalPtr& fallback) {
  if (!tokens) return fallback;
  auto it = msg.find(bh::field::authorization);
  if (it == msg.end()) return fallback;
  std::string_view value = view(it->value());
  // The scheme is case-insensitive (RFC 9110 §11.1); others (Basic) are the route's business.
  if (value.size() < 7 || value[6] != ' ' ||
      !absl::EqualsIgnoreCase(absl::string_view(value.data(), 6), "Bearer")) {
    return fallback;
  }
  absl::string_view token =
      absl::StripAsciiWhitespace(absl::string_view(value.data() + 7, value.size() - 7));
  return tokens->verify(std::string_view(token.data(), token.size()), ::time(nullptr));
}

const std::string& IoThread::realm() const {
  static const std::string kDefault = "bus";
  return server.jwt ? server.jwt->options().realm() : kDefault;
}

const std::string& IoThread::status_line(unsigned version, unsigned status) {
  const unsigned key = version * 1000 + status;
  if (key != status_line_key_) {
    beast::string_view reason = bh::obsolete_reason(bh::int_to_status(status));
    status_line_ = absl::StrCat("HTTP/", version / 10, ".", version % 10, " ", status, " ",
                                absl::string_view(reason.data(), reason.size()), "\r\n");
    status_line_key_ = key;
  }
  return status_line_;
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
