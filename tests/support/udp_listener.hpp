// A UDP socket on 127.0.0.1 with a kernel-chosen port: what a StatsD server would receive.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

namespace bus_test {

class UdpListener {
 public:
  UdpListener() {
    fd_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bound_ = fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    socklen_t len = sizeof a;
    if (bound_) ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
  }
  UdpListener(const UdpListener&) = delete;
  UdpListener& operator=(const UdpListener&) = delete;
  ~UdpListener() {
    if (fd_ >= 0) ::close(fd_);
  }

  bool bound() const { return bound_; }
  uint16_t port() const { return port_; }
  /// "127.0.0.1:<port>".
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  /// The datagrams waiting now (once a sender's send() returned, its datagrams are here).
  std::vector<std::string> take() {
    std::vector<std::string> out;
    char buf[65536];
    pollfd p{fd_, POLLIN, 0};
    while (::poll(&p, 1, 0) == 1) {
      ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
      if (n < 0) break;
      out.emplace_back(buf, static_cast<std::size_t>(n));
    }
    return out;
  }
  /// Blocks until one datagram comes (from a sender on another thread).
  std::string wait_one() {
    char buf[65536];
    ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
    return n < 0 ? "" : std::string(buf, static_cast<std::size_t>(n));
  }

 private:
  int fd_ = -1;
  bool bound_ = false;
  uint16_t port_ = 0;
};

}  // namespace bus_test
