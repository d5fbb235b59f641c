// RFC 9112's rules for a request's framing and target that Beast's parser leaves to the server,
// and the caller's terms for what Beast refuses. Beast parses; this only inspects its results.
#pragma once

#include <boost/beast/http.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "bus/http/request.hpp"

namespace bus::http::detail {

/// What a parse error means to the client that sent the request (Beast's own messages name its
/// grammar: "bad value", "bad version").
std::string describe_parse_error(const boost::beast::error_code& ec);

/// The answer to a request whose framing or Host is ambiguous (RFC 9112 §3.2, §6.1, §6.3): a
/// Transfer-Encoding whose final coding is not chunked, or next to a Content-Length, or in an
/// HTTP/1.0 request; codings other than chunked (501); a missing (HTTP/1.1), repeated or
/// malformed Host. Such a request is answered and its connection closed: where it ends, and so
/// where the next request starts, cannot be trusted. Nullopt for a well-framed request.
std::optional<Reply> framing_error(
    const boost::beast::http::request<boost::beast::http::string_body>& msg);

/// How a request target is written.
enum class TargetForm {
  kPlain,     // origin-form with nothing to decode: no escape, query, dot segment, '+' or '\'
  kDecode,    // origin-form that needs decoding
  kAbsolute,  // "http://host/path": the path is what follows the authority (RFC 9112 §3.2.2)
  kAsterisk,  // "*" (OPTIONS only)
  kInvalid,   // bytes outside visible ASCII, or no form at all
};
/// One pass over the target (string_view::find_first_of calls memchr once per character; the
/// instructions each costs: docs/benchmarks.md, "The figures behind the code").
TargetForm classify_target(std::string_view target);

/// The origin-form of an absolute-form target ("http://a/x?y" -> "/x?y", "http://a" -> "/"),
/// or nullopt when it is not http(s).
std::optional<std::string> origin_form(std::string_view absolute);

}  // namespace bus::http::detail
