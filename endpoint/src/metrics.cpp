#include "metrics.hpp"

#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>

namespace bus::http::detail {

void RouteCounters::record(unsigned status, std::chrono::steady_clock::duration took) {
  if (status >= 100 && status < 600) bump(by_status[status - 100]);
  double s = std::chrono::duration<double>(took).count();
  std::size_t b = 0;
  while (b < kLatencyBounds.size() && s > kLatencyBounds[b]) ++b;
  bump(latency[b]);
  bump(latency_ns,
       static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()));
}

namespace {

/// A label value in the text format: backslash, double quote and newline escaped.
std::string label(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

class Writer {
 public:
  void family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  void sample(absl::string_view name, absl::string_view labels, uint64_t v) {
    line(name, labels, absl::StrCat(v));
  }
  void sample(absl::string_view name, absl::string_view labels, double v) {
    line(name, labels, absl::StrFormat("%.9g", v));
  }
  std::string take() { return std::move(out_); }

 private:
  void line(absl::string_view name, absl::string_view labels, absl::string_view value) {
    absl::StrAppend(&out_, name, labels.empty() ? "" : "{", labels, labels.empty() ? "" : "}", " ",
                    value, "\n");
  }
  std::string out_;
};

std::string route_labels(const RouteLabel& r) {
  return absl::StrCat("method=\"", label(r.method), "\",route=\"", label(r.route), "\"");
}

/// The I/O threads' counters, summed over threads: one row each for /metrics and StatsD. Rows
/// of one /metrics family (told apart by a label) follow each other; the first carries the help.
struct IoFigure {
  const char* metric;
  const char* labels;
  const char* statsd;
  bool gauge;
  std::atomic<uint64_t> IoCounters::*member;
  const char* help;
};
constexpr IoFigure kIoFigures[] = {
    {"bus_http_connections_accepted_total", "", "http.connections.accepted", false,
     &IoCounters::accepted, "HTTP connections accepted."},
    {"bus_http_connections_refused_total", "", "http.connections.refused", false,
     &IoCounters::refused,
     "Connections answered 503 and closed because max_connections were open."},
    {"bus_http_connections_timed_out_total", "", "http.connections.timed_out", false,
     &IoCounters::timed_out, "Connections closed by the read, idle or write timeout."},
    {"bus_http_requests_waiting", "", "http.requests.waiting", true, &IoCounters::waiting,
     "Requests read and waiting for a turn (the I/O thread has max_in_flight out)."},
    {"bus_http_bad_requests_total", "", "http.bad_requests", false, &IoCounters::bad_requests,
     "Requests refused before routing: malformed HTTP, headers or body over the limits."},
    {"bus_http_tls_handshakes_total", "", "http.tls.handshakes", false, &IoCounters::tls_handshakes,
     "TLS handshakes completed."},
    {"bus_http_tls_handshake_failures_total", "", "http.tls.handshake_failures", false,
     &IoCounters::tls_failed,
     "TLS connections closed before their handshake completed: not TLS, a version, cipher or "
     "ALPN protocol in common with none, a client certificate refused."},
    {"bus_http_auth_refused_total", "reason=\"invalid_token\"", "http.auth.invalid_token", false,
     &IoCounters::auth_invalid,
     "Requests refused for their credentials: invalid_token (401), missing (401: a route that "
     "requires a principal), insufficient_scope (403)."},
    {"bus_http_auth_refused_total", "reason=\"missing\"", "http.auth.missing", false,
     &IoCounters::auth_missing, nullptr},
    {"bus_http_auth_refused_total", "reason=\"insufficient_scope\"", "http.auth.insufficient_scope",
     false, &IoCounters::auth_forbidden, nullptr},
};

uint64_t io_total(const MetricsView& v, std::atomic<uint64_t> IoCounters::*member) {
  uint64_t n = 0;
  for (const IoCounters* io : v.io) n += (io->*member).load(std::memory_order_relaxed);
  return n;
}

void http_metrics(const MetricsView& v, Writer& w) {
  const auto& routes = *v.routes;
  w.family("bus_http_connections_open", "gauge", "Open HTTP connections.");
  w.sample("bus_http_connections_open", "", v.connections_open);
  for (const IoFigure& f : kIoFigures) {
    if (f.help != nullptr) w.family(f.metric, f.gauge ? "gauge" : "counter", f.help);
    w.sample(f.metric, f.labels, io_total(v, f.member));
  }

  w.family("bus_http_requests_total", "counter", "HTTP requests answered, by route and status.");
  for (std::size_t r = 0; r < routes.size(); ++r) {
    for (unsigned s = 0; s < 500; ++s) {
      uint64_t n = 0;
      for (const auto* per : v.counters)
        n += (*per)[r]->by_status[s].load(std::memory_order_relaxed);
      if (n == 0) continue;
      w.sample("bus_http_requests_total",
               absl::StrCat(route_labels(routes[r]), ",code=\"", s + 100, "\""), n);
    }
  }
  w.family("bus_http_request_duration_seconds", "histogram",
           "Time from a request's arrival to its answer being handed to the socket.");
  for (std::size_t r = 0; r < routes.size(); ++r) {
    std::array<uint64_t, kLatencyBounds.size() + 1> buckets{};
    uint64_t ns = 0;
    for (const auto* per : v.counters) {
      const RouteCounters& c = *(*per)[r];
      for (std::size_t b = 0; b < buckets.size(); ++b) {
        buckets[b] += c.latency[b].load(std::memory_order_relaxed);
      }
      ns += c.latency_ns.load(std::memory_order_relaxed);
    }
    uint64_t count = 0;
    for (uint64_t b : buckets) count += b;
    if (count == 0) continue;
    std::string l = route_labels(routes[r]);
    uint64_t cumulative = 0;
    for (std::size_t b = 0; b < kLatencyBounds.size(); ++b) {
      cumulative += buckets[b];
      w.sample("bus_http_request_duration_seconds_bucket",
               absl::StrCat(l, ",le=\"", absl::StrFormat("%g", kLatencyBounds[b]), "\""),
               cumulative);
    }
    w.sample("bus_http_request_duration_seconds_bucket", absl::StrCat(l, ",le=\"+Inf\""), count);
    w.sample("bus_http_request_duration_seconds_sum", l, static_cast<double>(ns) / 1e9);
    w.sample("bus_http_request_duration_seconds_count", l, count);
  }
}

void bus_metrics(const Stats& s, Writer& w) {
  for (const ChannelFigure& f : kChannelFigures) {
    const std::string name = absl::StrCat("bus_channel_", f.name, "_total");
    w.family(name, "counter", f.help);
    for (const ChannelStats& c : s.channels) {
      w.sample(name, absl::StrCat("channel=\"", label(c.name), "\",type=\"", label(c.type), "\""),
               c.*f.member);
    }
  }
  auto inbox_labels = [](const InboxStats& i) {
    return absl::StrCat("inbox=\"", i.index, "\",kind=\"", i.external ? "external" : "executor",
                        "\"");
  };
  w.family("bus_inbox_depth_bytes", "gauge", "Bytes waiting in an inbox's rings.");
  for (const InboxStats& i : s.inboxes)
    w.sample("bus_inbox_depth_bytes", inbox_labels(i), i.depth_bytes);
  w.family("bus_inbox_capacity_bytes", "gauge", "Total capacity of an inbox's rings.");
  for (const InboxStats& i : s.inboxes) {
    w.sample("bus_inbox_capacity_bytes", inbox_labels(i), i.capacity_bytes);
  }
  w.family("bus_inbox_rings", "gauge", "Producing threads that have a ring to an inbox.");
  for (const InboxStats& i : s.inboxes) {
    w.sample("bus_inbox_rings", inbox_labels(i), static_cast<uint64_t>(i.rings));
  }
  w.family("bus_held_records", "gauge", "Records executors hold back while rings are full.");
  w.sample("bus_held_records", "", s.held_records);
}

void node_metrics(const net::NodeStats& n, Writer& w) {
  w.family("bus_bridge_peers", "gauge", "Live bridge peers (nodes heard from).");
  w.sample("bus_bridge_peers", "", static_cast<uint64_t>(n.peers.size()));
  w.family("bus_bridge_peer", "gauge",
           "A live peer, with the transport it is reached by (shm: shared memory, zmq: ZeroMQ).");
  for (const net::PeerInfo& p : n.peers) {
    w.sample(
        "bus_bridge_peer",
        absl::StrCat("peer=\"", label(p.name), "\",peer_id=\"", absl::Hex(p.id, absl::kZeroPad16),
                     "\",transport=\"", net::transport_name(p.transport), "\""),
        uint64_t{1});
  }
  w.family("bus_bridge_shm_heap_bytes", "gauge",
           "Bytes of the process's shared-memory heap in use (large messages).");
  w.sample("bus_bridge_shm_heap_bytes", "", n.shm_heap_bytes);
  w.family("bus_bridge_shm_pinned_bytes", "gauge",
           "Bytes of this node's large messages that peers on its host still read in place.");
  w.sample("bus_bridge_shm_pinned_bytes", "", n.shm_pinned_bytes);
  for (const net::TrafficFigure& f : net::kTrafficFigures) {
    const std::string name = absl::StrCat("bus_bridge_", f.name, "_total");
    w.family(name, "counter", f.help);
    for (const net::ChannelTraffic& t : n.traffic) {
      w.sample(name,
               absl::StrCat("channel=\"", label(t.channel), "\",peer=\"", label(t.peer_name),
                            "\",peer_id=\"", absl::Hex(t.peer, absl::kZeroPad16), "\""),
               t.*f.member);
    }
  }
  for (const net::NodeFigure& f : net::kNodeFigures) {
    const std::string name = absl::StrCat("bus_bridge_", f.name, "_total");
    w.family(name, "counter", f.help);
    w.sample(name, "", n.*f.member);
  }
}

}  // namespace

namespace {
/// The WebSocket bridge's figures: one list for both formats (Prometheus names get a bus_ws_
/// prefix and a _total on counters; StatsD names a ws. prefix).
struct WsFigure {
  const char* name;
  bool gauge;
  uint64_t WebSocketStats::*field;
  const char* help;
};
constexpr WsFigure kWsFigures[] = {
    {"connections_open", true, &WebSocketStats::connections_open, "Open WebSocket connections."},
    {"connections_accepted", false, &WebSocketStats::connections_accepted,
     "WebSocket connections accepted (upgraded)."},
    {"frames_in", false, &WebSocketStats::frames_in, "Client WebSocket messages read."},
    {"messages_out", false, &WebSocketStats::messages_out,
     "Messages queued for WebSocket clients (msg, reply, error, notices)."},
    {"frames_out", false, &WebSocketStats::frames_out,
     "WebSocket messages written (each carries one or more messages)."},
    {"refused", false, &WebSocketStats::refused,
     "Client messages refused: not permitted, or not a channel of the bridge."},
    {"bad_frames", false, &WebSocketStats::bad_frames,
     "Client messages that were not understood (bad JSON, unknown op, body not of the type)."},
    {"dropped", false, &WebSocketStats::dropped,
     "Topic messages dropped for slow clients (SlowClient::kDropOldest)."},
    {"closed_slow", false, &WebSocketStats::closed_slow,
     "Connections closed because their outbound buffer was full (SlowClient::kClose)."},
    {"published", false, &WebSocketStats::published, "Client publishes accepted."},
    {"calls", false, &WebSocketStats::calls, "Client calls made."},
    {"queued_bytes", true, &WebSocketStats::queued_bytes,
     "Bytes waiting in WebSocket outbound buffers."},
};

void websocket_metrics(const WebSocketStats& s, Writer& w) {
  for (const WsFigure& f : kWsFigures) {
    std::string name = absl::StrCat("bus_ws_", f.name, f.gauge ? "" : "_total");
    w.family(name, f.gauge ? "gauge" : "counter", f.help);
    w.sample(name, "", s.*f.field);
  }
}
}  // namespace

std::string render_metrics(const MetricsView& v) {
  Writer w;
  http_metrics(v, w);
  if (v.websocket) websocket_metrics(*v.websocket, w);
  bus_metrics(v.bus, w);
  if (v.node) node_metrics(*v.node, w);
  return w.take();
}

namespace {
/// "GET /greeting/{name}" -> "GET.greeting_name": one dotted StatsD segment per part.
std::string statsd_route(const RouteLabel& r) {
  if (r.method.empty()) return "unmatched";  // requests no route took
  std::string path;
  for (char c : r.route) {
    if (c == '{' || c == '}') continue;
    path += c == '/' ? '_' : c;
  }
  if (!path.empty() && path[0] == '_') path.erase(0, 1);
  return absl::StrCat(r.method, ".", path.empty() ? "root" : path);
}
}  // namespace

void statsd_metrics(const MetricsView& v, StatsdSink& out) {
  out.gauge("http.connections.open", static_cast<double>(v.connections_open));
  for (const IoFigure& f : kIoFigures) {
    uint64_t n = io_total(v, f.member);
    if (f.gauge) {
      out.gauge(f.statsd, static_cast<double>(n));
    } else {
      out.counter(f.statsd, n);
    }
  }
  if (v.websocket) {
    for (const WsFigure& f : kWsFigures) {
      std::string name = absl::StrCat("ws.", f.name);
      uint64_t n = (*v.websocket).*f.field;
      if (f.gauge) {
        out.gauge(name, static_cast<double>(n));
      } else {
        out.counter(name, n);
      }
    }
  }
  const auto& routes = *v.routes;
  for (std::size_t r = 0; r < routes.size(); ++r) {
    std::string name = statsd_name(statsd_route(routes[r]));
    uint64_t ns = 0, count = 0;
    for (unsigned s = 0; s < 500; ++s) {
      uint64_t n = 0;
      for (const auto* per : v.counters)
        n += (*per)[r]->by_status[s].load(std::memory_order_relaxed);
      if (n > 0) out.counter(absl::StrCat("http.requests.", name, ".", s + 100), n);
    }
    for (const auto* per : v.counters) {
      const RouteCounters& c = *(*per)[r];
      for (const auto& b : c.latency) count += b.load(std::memory_order_relaxed);
      ns += c.latency_ns.load(std::memory_order_relaxed);
    }
    if (count > 0) {
      out.timing(absl::StrCat("http.latency.", name), count, static_cast<double>(ns) / 1e6);
    }
  }
}

}  // namespace bus::http::detail
