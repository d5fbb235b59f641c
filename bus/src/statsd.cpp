#include "bus/statsd.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace bus {

std::string statsd_name(std::string_view name) {
  std::string out(name);
  for (char& c : out) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-';
    if (!ok) c = '_';
  }
  return out;
}

StatsdOptions& StatsdOptions::address(std::string_view host_port) {
  auto colon = host_port.rfind(':');
  uint32_t port = 0;
  if (colon == std::string_view::npos ||
      !absl::SimpleAtoi(
          absl::string_view(host_port.data() + colon + 1, host_port.size() - colon - 1), &port) ||
      port == 0 || port > 65535) {
    throw std::invalid_argument(absl::StrCat("bus::StatsdOptions: '", std::string(host_port),
                                             "' is not host:port (e.g. 127.0.0.1:8125)"));
  }
  host_ = std::string(host_port.substr(0, colon));
  port_ = static_cast<uint16_t>(port);
  return *this;
}

namespace {

/// Turns totals into lines and lines into datagrams.
class Writer final : public StatsdSink {
 public:
  Writer(std::string prefix, std::size_t max_packet)
      : prefix_(prefix.empty() ? "" : statsd_name(prefix) + "."), max_packet_(max_packet) {}

  void counter(std::string_view name, uint64_t total) override {
    std::string n = full(name);
    uint64_t& last = counters_[n];
    // A total that went down (a source restarted): send it whole.
    uint64_t delta = total >= last ? total - last : total;
    last = total;
    if (delta > 0) line(absl::StrCat(n, ":", delta, "|c"));
  }
  void gauge(std::string_view name, double value) override {
    line(absl::StrFormat("%s:%g|g", full(name), value < 0 ? 0.0 : value));
  }
  void timing(std::string_view name, uint64_t count, double sum_ms) override {
    std::string n = full(name);
    auto& [last_count, last_sum] = timings_[n];
    uint64_t dc = count >= last_count ? count - last_count : count;
    double ds = count >= last_count ? sum_ms - last_sum : sum_ms;
    last_count = count;
    last_sum = sum_ms;
    if (dc == 0) return;
    double mean = ds / static_cast<double>(dc);
    if (dc == 1) {
      line(absl::StrFormat("%s:%.3f|ms", n, mean));
    } else {
      line(absl::StrFormat("%s:%.3f|ms|@%.9g", n, mean, 1.0 / static_cast<double>(dc)));
    }
  }

  /// The datagrams of this push (taken: the next push starts empty).
  std::vector<std::string> take() {
    if (!current_.empty()) packets_.push_back(std::move(current_));
    current_.clear();
    return std::exchange(packets_, {});
  }
  uint64_t lines = 0;

 private:
  std::string full(std::string_view name) const { return prefix_ + statsd_name(name); }
  void line(const std::string& l) {
    ++lines;
    if (!current_.empty() && current_.size() + 1 + l.size() > max_packet_) {
      packets_.push_back(std::move(current_));
      current_.clear();
    }
    if (!current_.empty()) current_ += '\n';
    current_ += l;
  }

  const std::string prefix_;
  const std::size_t max_packet_;
  absl::flat_hash_map<std::string, uint64_t> counters_;
  absl::flat_hash_map<std::string, std::pair<uint64_t, double>> timings_;
  std::string current_;
  std::vector<std::string> packets_;
};

}  // namespace

void detail::bus_figures(Bus& bus, StatsdSink& out) {
  Stats s = bus.stats();
  for (const ChannelStats& c : s.channels) {
    std::string base = absl::StrCat("channel.", c.name, ".");
    for (const ChannelFigure& f : kChannelFigures) out.counter(base + f.name, c.*f.member);
  }
  for (const InboxStats& in : s.inboxes) {
    std::string base = absl::StrCat(in.external ? "external_inbox." : "executor.", in.index, ".");
    out.gauge(base + "depth_bytes", static_cast<double>(in.depth_bytes));
    out.gauge(base + "capacity_bytes", static_cast<double>(in.capacity_bytes));
  }
  out.gauge("held_records", static_cast<double>(s.held_records));
}

namespace {}  // namespace

struct StatsdExporter::Impl {
  Impl(Bus& b, StatsdOptions o)
      : bus(b), opts(std::move(o)), writer(opts.prefix(), opts.max_packet()) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo* res = nullptr;
    std::string port = std::to_string(opts.port());
    if (int rc = getaddrinfo(opts.host().c_str(), port.c_str(), &hints, &res); rc != 0) {
      throw std::invalid_argument(absl::StrCat("bus::StatsdExporter: cannot resolve '", opts.host(),
                                               "': ", gai_strerror(rc)));
    }
    fd = ::socket(res->ai_family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0 && ::connect(fd, res->ai_addr, res->ai_addrlen) != 0) err = errno;
    freeaddrinfo(res);
    if (err != 0) {
      if (fd >= 0) ::close(fd);
      throw std::invalid_argument(absl::StrCat("bus::StatsdExporter: cannot use ", opts.host(), ":",
                                               opts.port(), ": ", std::strerror(err)));
    }
  }
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  void push() {
    std::lock_guard lock(push_mu);
    std::vector<StatsdSource> now;
    {
      std::lock_guard l(mu);
      now = sources;
    }
    uint64_t lines_before = writer.lines;
    detail::bus_figures(bus, writer);
    for (auto& src : now) src(writer);
    uint64_t sent = 0, errors = 0;
    for (const std::string& p : writer.take()) {
      // Non-blocking: a full buffer or an ICMP "port unreachable" from an earlier datagram
      // (ECONNREFUSED) loses this datagram, never the thread.
      if (::send(fd, p.data(), p.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(p.size())) {
        ++sent;
      } else {
        ++errors;
      }
    }
    std::lock_guard l(mu);
    ++st.pushes;
    st.datagrams += sent;
    st.send_errors += errors;
    st.lines += writer.lines - lines_before;
  }

  void run() {
    std::unique_lock lock(mu);
    while (!stopping) {
      if (cv.wait_for(lock, opts.interval(), [&] { return stopping; })) break;
      lock.unlock();
      push();
      lock.lock();
    }
  }

  Bus& bus;
  const StatsdOptions opts;
  int fd = -1;
  std::mutex push_mu;  // one push at a time; guards `writer`
  Writer writer;
  mutable std::mutex mu;  // guards what follows
  std::condition_variable cv;
  bool stopping = false;
  std::vector<StatsdSource> sources;
  StatsdStats st;
  std::thread thread;
};

StatsdExporter::StatsdExporter(Bus& bus, StatsdOptions options)
    : impl_(std::make_unique<Impl>(bus, std::move(options))) {
  if (impl_->opts.interval().count() <= 0) {
    throw std::invalid_argument("bus::StatsdExporter: the interval must be positive");
  }
  impl_->thread = std::thread([this] { impl_->run(); });
}

StatsdExporter::~StatsdExporter() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  impl_->thread.join();
  impl_->push();  // the last figures
}

void StatsdExporter::add_source(StatsdSource source) {
  std::lock_guard lock(impl_->mu);
  impl_->sources.push_back(std::move(source));
}

void StatsdExporter::push() { impl_->push(); }

StatsdStats StatsdExporter::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

}  // namespace bus
