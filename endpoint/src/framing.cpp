#include "framing.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>

#include <boost/beast/http/rfc7230.hpp>

namespace bus::http::detail {
namespace {

namespace bh = boost::beast::http;

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }
absl::string_view av(boost::beast::string_view s) { return {s.data(), s.size()}; }

/// RFC 3986's uri-host [":" port] alphabet: unreserved, sub-delims, '%', ':', '[' and ']'.
/// Anything else (a space, '/', '@', a folded line's remains) is not a host.
bool host_value_ok(boost::beast::string_view v) {
  for (char c : v) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c))) continue;
    switch (c) {
      case '-':
      case '.':
      case '_':
      case '~':
      case '!':
      case '$':
      case '&':
      case '\'':
      case '(':
      case ')':
      case '*':
      case '+':
      case ',':
      case ';':
      case '=':
      case '%':
      case ':':
      case '[':
      case ']': continue;
      default: return false;
    }
  }
  return true;
}

}  // namespace

std::string describe_parse_error(const boost::beast::error_code& ec) {
  switch (static_cast<bh::error>(ec.value())) {
    case bh::error::bad_line_ending:
      return "malformed HTTP request: every line must end with CR LF";
    case bh::error::bad_method: return "malformed HTTP request: the method is not a token";
    case bh::error::bad_target:
      return "malformed HTTP request: the request line's target is malformed (or the line has "
             "no HTTP version)";
    case bh::error::bad_version:
      return "malformed HTTP request: the request line does not end with HTTP/1.0 or HTTP/1.1 "
             "and CR LF";
    case bh::error::bad_field:
      return "malformed HTTP request: a header field name is not a token, or is followed by "
             "whitespace before its colon";
    case bh::error::bad_value:
      return "malformed HTTP request: a header field value holds a control character (or a "
             "line ends with a bare LF)";
    case bh::error::bad_content_length:
      return "malformed HTTP request: Content-Length is not one decimal number (or repeats "
             "with another value, or comes with Transfer-Encoding: chunked)";
    case bh::error::bad_transfer_encoding:
      return "malformed HTTP request: Transfer-Encoding repeats chunked or comes after "
             "Content-Length";
    case bh::error::bad_chunk:
      return "malformed HTTP request: a chunk's size line is not a hexadecimal size (or is too "
             "large) or its data does not end with CR LF";
    case bh::error::bad_chunk_extension:
      return "malformed HTTP request: a chunk extension is malformed";
    case bh::error::bad_obs_fold:
      return "malformed HTTP request: a folded header line is malformed";
    default: return "malformed HTTP request: " + ec.message();
  }
}

std::optional<Reply> framing_error(const bh::request<bh::string_body>& msg) {
  int hosts = 0;
  bool host_ok = true;
  bool content_length = false;
  bool transfer_encoding = false;
  bool final_chunked = false;
  std::string unsupported;  // transfer codings other than chunked
  for (const auto& f : msg) {
    switch (f.name()) {
      case bh::field::host:
        ++hosts;
        host_ok = host_ok && host_value_ok(f.value());
        break;
      case bh::field::content_length: content_length = true; break;
      case bh::field::transfer_encoding:
        // Every field line adds to one list (RFC 9110 §5.3): the last coding decides.
        transfer_encoding = true;
        for (auto coding : bh::token_list(f.value())) {
          final_chunked = absl::EqualsIgnoreCase(av(coding), "chunked");
          if (!final_chunked && unsupported.empty()) unsupported = std::string(av(coding));
        }
        break;
      default: break;
    }
  }
  auto bad = [](std::string_view detail) { return Reply::error(400, "bad_request", detail); };
  if (transfer_encoding) {
    if (msg.version() < 11) {
      return bad("Transfer-Encoding in an HTTP/1.0 request: its framing cannot be trusted");
    }
    if (!final_chunked) {
      return bad(
          "Transfer-Encoding must end with chunked in a request: its length cannot be "
          "known otherwise");
    }
    if (content_length) return bad("Content-Length and Transfer-Encoding together");
    if (!unsupported.empty()) {
      return Reply::error(501, "not_implemented",
                          "transfer coding '" + unsupported + "' is not supported (only chunked)");
    }
  }
  if (hosts > 1) return bad("more than one Host header field");
  if (hosts == 0 && msg.version() >= 11)
    return bad("an HTTP/1.1 request needs a Host header field");
  if (!host_ok) return bad("the Host header field is not a host name and port");
  return std::nullopt;
}

TargetForm classify_target(std::string_view target) {
  if (target.empty()) return TargetForm::kInvalid;
  if (target.front() != '/') {
    if (target == "*") return TargetForm::kAsterisk;
    if (absl::StartsWithIgnoreCase(av(target), "http://") ||
        absl::StartsWithIgnoreCase(av(target), "https://")) {
      return TargetForm::kAbsolute;
    }
    return TargetForm::kInvalid;
  }
  TargetForm form = TargetForm::kPlain;
  for (char c : target) {
    switch (c) {
      case '%':
      case '?':
      case '#':
      case '.':
      case '+':
      case '\\': form = TargetForm::kDecode; break;
      default:
        // Beast lets obs-text through; a target is visible ASCII (RFC 9112 §3.2, RFC 3986).
        if (static_cast<unsigned char>(c) >= 0x7f) return TargetForm::kInvalid;
        break;
    }
  }
  return form;
}

std::optional<std::string> origin_form(std::string_view absolute) {
  std::size_t scheme = absolute.find("://");
  if (scheme == std::string_view::npos) return std::nullopt;
  std::size_t path = absolute.find_first_of("/?#", scheme + 3);
  if (path == std::string_view::npos) return std::string("/");
  if (absolute[path] == '/') return std::string(absolute.substr(path));
  return absl::StrCat("/", av(absolute.substr(path)));
}

}  // namespace bus::http::detail
