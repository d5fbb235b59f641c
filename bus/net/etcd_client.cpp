#include "etcd_client.hpp"

#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "bus/schemas/membership.capnp.h"

namespace bus::net::detail {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
namespace ms = bus::schemas::membership;
using asio::awaitable;
using asio::use_awaitable;
using tcp = asio::ip::tcp;

EtcdUrl parse_url(const std::string& endpoint) {
  absl::string_view s = endpoint;
  if (absl::StartsWith(s, "http://")) s.remove_prefix(7);
  if (absl::StartsWith(s, "https://")) {
    throw std::invalid_argument(absl::StrCat("bus.net: etcd endpoint ", endpoint,
                                             ": https is not supported, give http://host:port"));
  }
  if (!s.empty() && s.back() == '/') s.remove_suffix(1);
  auto colon = s.rfind(':');
  if (colon == absl::string_view::npos || colon + 1 == s.size()) {
    throw std::invalid_argument(
        absl::StrCat("bus.net: etcd endpoint ", endpoint, ": expected http://host:port"));
  }
  return EtcdUrl{std::string(s.substr(0, colon)), std::string(s.substr(colon + 1))};
}

}  // namespace

EtcdClient::EtcdClient(const std::vector<std::string>& endpoints) {
  codec_.handleByAnnotation<ms::Member>();
  codec_.handleByAnnotation<ms::PutRequest>();
  codec_.handleByAnnotation<ms::RangeRequest>();
  codec_.handleByAnnotation<ms::RangeResponse>();
  codec_.handleByAnnotation<ms::WatchRequest>();
  codec_.handleByAnnotation<ms::WatchStreamItem>();
  codec_.handleByAnnotation<ms::LeaseGrantRequest>();
  codec_.handleByAnnotation<ms::LeaseGrantResponse>();
  codec_.handleByAnnotation<ms::LeaseId>();
  codec_.handleByAnnotation<ms::LeaseKeepAliveResponse>();
  codec_.handleByAnnotation<ms::Error>();
  for (const auto& e : endpoints) urls_.push_back(parse_url(e));
}

awaitable<void> EtcdClient::connect(boost::beast::tcp_stream& s, const EtcdUrl& u) {
  tcp::resolver resolver(co_await asio::this_coro::executor);
  auto found = co_await resolver.async_resolve(u.host, u.port, use_awaitable);
  s.expires_after(kEtcdCallTimeout);
  co_await s.async_connect(found, use_awaitable);
}

http::request<http::string_body> EtcdClient::request(const EtcdUrl& u, const char* target,
                                                     std::string body) {
  http::request<http::string_body> req{http::verb::post, target, 11};
  req.set(http::field::host, absl::StrCat(u.host, ":", u.port));
  req.set(http::field::content_type, "application/json");
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  return req;
}

awaitable<std::string> EtcdClient::call(boost::beast::tcp_stream& s, boost::beast::flat_buffer& buf,
                                        const EtcdUrl& u, const char* target, std::string body) {
  auto req = request(u, target, std::move(body));
  s.expires_after(kEtcdCallTimeout);
  co_await http::async_write(s, req, use_awaitable);
  http::response<http::string_body> res;
  co_await http::async_read(s, buf, res, use_awaitable);
  if (res.result() != http::status::ok) {
    std::string why = res.body();
    if (absl::StartsWith(why, "{")) {
      capnp::MallocMessageBuilder mb;
      why = decode<ms::Error>(why, mb).getMessage().cStr();
    }
    throw EtcdError(absl::StrCat("etcd ", target, ": HTTP ", res.result_int(), " ", why));
  }
  co_return std::move(res.body());
}

}  // namespace bus::net::detail
