// Replies the server writes itself, and how a failed request's status becomes an HTTP status.
#include <bus/schemas/http.capnp.h>

#include "bus/http/json.hpp"
#include "bus/http/request.hpp"

namespace bus::http {

std::string_view to_string(Method m) {
  switch (m) {
    case Method::kGet: return "GET";
    case Method::kHead: return "HEAD";
    case Method::kPost: return "POST";
    case Method::kPut: return "PUT";
    case Method::kPatch: return "PATCH";
    case Method::kDelete: return "DELETE";
    case Method::kOptions: return "OPTIONS";
  }
  return "?";
}

Reply Reply::error(unsigned status, std::string_view error, std::string_view detail) {
  using schemas::http::ErrorBody;
  Message<ErrorBody> body = build<ErrorBody>([&](ErrorBody::Builder b) {
    b.setError(kj::StringPtr(std::string(error).c_str()));
    b.setDetail(kj::StringPtr(std::string(detail).c_str()));
  });
  return Reply::json(to_json(body.reader()), status);
}

namespace detail {
Reply rate_limited(std::string_view limiter, std::chrono::milliseconds retry_after) {
  // Retry-After is in whole seconds: round up, so that a client waiting that long is not early.
  auto seconds = std::max<int64_t>(1, (retry_after.count() + 999) / 1000);
  Reply r = Reply::error(429, "too_many_requests",
                         absl::StrCat("rate limit '", std::string(limiter),
                                      "' reached for this key; retry after ", seconds, " s"));
  r.headers.emplace_back("Retry-After", std::to_string(seconds));
  return r;
}
}  // namespace detail

unsigned status_for(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kResourceExhausted: return 429;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kAborted:                // the node serving it died ("peer gone")
    case absl::StatusCode::kCancelled: return 503;  // the bus or the server is stopping
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

Reply Reply::failure(const absl::Status& s) {
  unsigned code = status_for(s);
  std::string_view name;
  switch (code) {
    case 400: name = "bad_request"; break;
    case 401: name = "unauthenticated"; break;
    case 403: name = "forbidden"; break;
    case 404: name = "not_found"; break;
    case 409: name = "conflict"; break;
    case 429: name = "too_many_requests"; break;
    case 501: name = "not_implemented"; break;
    case 503: name = "unavailable"; break;
    case 504: name = "deadline_exceeded"; break;
    default: name = "internal"; break;
  }
  return error(code, name, std::string_view(s.message().data(), s.message().size()));
}

}  // namespace bus::http
