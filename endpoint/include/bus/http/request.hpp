// What a route sees of an HTTP request, and what it answers. No Beast here: the server keeps
// Boost.Beast inside endpoint/src, so users and the rest of the build never compile it.
#pragma once

#include <absl/status/status.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bus/principal.hpp"

namespace bus::http {

enum class Method { kGet, kHead, kPost, kPut, kPatch, kDelete, kOptions };
std::string_view to_string(Method m);

/// A request as the route's mapping function reads it. Views stay valid while the mapping runs.
class Request {
 public:
  using Fields = std::vector<std::pair<std::string, std::string>>;

  Request(Method method, std::string_view target, std::string_view body, Fields params,
          Fields query, const void* native, PrincipalPtr principal = nullptr)
      : method_(method),
        target_(target),
        body_(body),
        params_(std::move(params)),
        query_(std::move(query)),
        native_(native),
        principal_(std::move(principal)) {}

  Method method() const { return method_; }
  /// The request target as sent: path and query, still percent-encoded.
  std::string_view target() const { return target_; }
  std::string_view body() const { return body_; }
  /// Path parameters (`{name}` in the route's template), percent-decoded, in template order.
  const Fields& params() const { return params_; }
  std::optional<std::string_view> param(std::string_view name) const { return find(params_, name); }
  /// Query parameters, percent-decoded (`+` is a space), in the order sent.
  const Fields& query() const { return query_; }
  std::optional<std::string_view> query(std::string_view name) const { return find(query_, name); }
  /// A header's value (case-insensitive name); the first one if it repeats.
  std::optional<std::string_view> header(std::string_view name) const;
  /// Who sent it, when the server authenticated them (a bearer token, a client certificate);
  /// null otherwise.
  const Principal* principal() const { return principal_.get(); }
  const PrincipalPtr& shared_principal() const { return principal_; }

 private:
  static std::optional<std::string_view> find(const Fields& f, std::string_view name) {
    for (const auto& [k, v] : f) {
      if (k == name) return v;
    }
    return std::nullopt;
  }
  Method method_;
  std::string_view target_;
  std::string_view body_;
  Fields params_;
  Fields query_;
  const void* native_;  // the server's parsed message (its headers)
  PrincipalPtr principal_;
};

/// An HTTP response. Content-Length, Connection and HEAD are the server's business.
struct Reply {
  unsigned status = 200;
  std::string content_type = "application/json";  // empty: no Content-Type (no content)
  std::string body;
  /// More header fields (Retry-After, Location, ...). The server sets Content-Type,
  /// Content-Length, Connection and Allow itself.
  std::vector<std::pair<std::string, std::string>> headers = {};

  static Reply json(std::string body, unsigned status = 200) {
    return Reply{status, "application/json", std::move(body), {}};
  }
  static Reply text(std::string body, unsigned status = 200) {
    return Reply{status, "text/plain; charset=utf-8", std::move(body), {}};
  }
  /// `{"error": error, "detail": detail}` with `status`.
  static Reply error(unsigned status, std::string_view error, std::string_view detail);
  /// The error reply for a failed request: its status code mapped to HTTP (see status_for).
  static Reply failure(const absl::Status& status);
};

/// The HTTP status for a request that failed with `s`: the bus's own outcomes (DeadlineExceeded
/// 504, Unavailable or Aborted "peer gone" 503, Internal "handler threw" 500) and what a handler
/// returns (InvalidArgument 400, NotFound 404, AlreadyExists 409, PermissionDenied 403,
/// Unauthenticated 401, ResourceExhausted 429, Unimplemented 501, anything else 500).
unsigned status_for(const absl::Status& s);

}  // namespace bus::http
