// Talking to etcd v3 through its JSON gateway (docs/net.md says why the gateway and not gRPC):
// the cluster's members, one HTTP/1.1 call at a time over a kept-alive connection, and JSON in and
// out through Cap'n Proto's codec (schemas/membership.capnp). Coroutines on the membership's
// io_context.
#pragma once

#include <absl/strings/str_cat.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/exception.h>

#include <boost/asio/awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace bus::net::detail {

// One etcd call (connect, request, answer): etcd answers in milliseconds; past this it is taken
// for unreachable and the next member is tried.
inline constexpr auto kEtcdCallTimeout = std::chrono::seconds(2);

/// What etcd refused, or an answer that does not read: the session ends and is tried again.
class EtcdError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One member of the etcd cluster, as NodeOptions::etcd() gives it (`http://host:port`).
struct EtcdUrl {
  std::string host, port;
};

/// etcd's JSON gateway at the members NodeOptions::etcd() lists, one at a time.
class EtcdClient {
 public:
  /// Throws std::invalid_argument for an endpoint that is not `http://host:port`.
  explicit EtcdClient(const std::vector<std::string>& endpoints);

  /// The member talked to now.
  const EtcdUrl& url() const { return urls_[at_]; }
  /// After a failure: the next member (round the list).
  void next() { at_ = (at_ + 1) % urls_.size(); }

  // ---- JSON through Cap'n Proto's codec ----
  template <class T>
  std::string encode(typename T::Reader r) {
    kj::String s = codec_.encode(r);
    return std::string(s.cStr(), s.size());
  }
  template <class T>
  typename T::Reader decode(const std::string& json, capnp::MallocMessageBuilder& mb) {
    auto root = mb.initRoot<T>();
    KJ_IF_MAYBE (e, kj::runCatchingExceptions(
                        [&] { codec_.decode(kj::StringPtr(json.c_str(), json.size()), root); })) {
      throw EtcdError(absl::StrCat("not the JSON expected (", e->getDescription().cStr(), ")"));
    }
    return root.asReader();
  }

  // ---- HTTP to etcd's gateway ----
  boost::asio::awaitable<void> connect(boost::beast::tcp_stream& s, const EtcdUrl& u);
  boost::beast::http::request<boost::beast::http::string_body> request(const EtcdUrl& u,
                                                                       const char* target,
                                                                       std::string body);
  /// POST `body` to `target`, the answer's body (EtcdError when etcd refuses).
  boost::asio::awaitable<std::string> call(boost::beast::tcp_stream& s,
                                           boost::beast::flat_buffer& buf, const EtcdUrl& u,
                                           const char* target, std::string body);

 private:
  capnp::JsonCodec codec_;
  std::vector<EtcdUrl> urls_;
  std::size_t at_ = 0;
};

}  // namespace bus::net::detail
