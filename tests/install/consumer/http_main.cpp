// Uses the installed bus::http: serves one route and fetches it over a plain socket.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <bus/http/server.hpp>
#include <cstdio>
#include <string>

int main() {
  bus::Bus bus(bus::Options().executors(1));
  bus::http::Server http(bus);
  http.handle(bus::http::Method::kGet, "/hello/{name}", [](const bus::http::Request& r) {
    return bus::http::Reply::text("hello " + std::string(*r.param("name")));
  });
  http.start();

  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(http.port());
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0) return 1;
  const std::string req = "GET /hello/installed HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  if (::write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) return 1;
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(fd);
  bool ok = got.rfind("HTTP/1.1 200", 0) == 0 && got.find("hello installed") != std::string::npos;
  std::printf("%s\n", ok ? "http ok" : got.c_str());
  return ok ? 0 : 1;
}
