#include "cors.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/match.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>

namespace bus::http::detail {
namespace {

absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// Whether the comma-separated `list` holds `item` (case-insensitive, as field names are).
bool listed(std::string_view list, absl::string_view item) {
  for (absl::string_view e : absl::StrSplit(av(list), ',')) {
    if (absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(e), item)) return true;
  }
  return false;
}

}  // namespace

std::string_view allowed_origin(const CorsOptions& o, std::string_view origin) {
  for (const std::string& allowed : o.origins()) {
    if (allowed == "*") return o.allow_credentials() ? origin : std::string_view("*");
    if (allowed == origin) return origin;
  }
  return {};
}

bool same_origin(std::string_view origin, std::string_view host) {
  for (std::string_view scheme : {std::string_view("http://"), std::string_view("https://")}) {
    if (origin.size() == scheme.size() + host.size() && origin.starts_with(scheme) &&
        absl::EqualsIgnoreCase(av(origin.substr(scheme.size())), av(host))) {
      return true;
    }
  }
  return false;
}

Reply preflight(const CorsOptions& o, std::string_view allowed, std::string_view allow,
                std::string_view method, std::string_view headers) {
  if (!listed(allow, av(method))) {
    return Reply::error(403, "forbidden",
                        absl::StrCat("CORS: method ", av(method),
                                     " is not allowed here (allowed: ", av(allow), ")"));
  }
  for (absl::string_view h : absl::StrSplit(av(headers), ',', absl::SkipWhitespace())) {
    h = absl::StripAsciiWhitespace(h);
    if (!listed(o.allow_headers(), h)) {
      return Reply::error(403, "forbidden",
                          absl::StrCat("CORS: request header ", h,
                                       " is not allowed (allowed: ", o.allow_headers(), ")"));
    }
  }
  Reply r{204, "", "", {}};
  r.headers = {{"Access-Control-Allow-Origin", std::string(allowed)},
               {"Access-Control-Allow-Methods", std::string(allow)},
               {"Access-Control-Allow-Headers", o.allow_headers()},
               {"Access-Control-Max-Age", std::to_string(o.max_age().count())},
               {"Vary", "Origin"}};
  if (o.allow_credentials()) r.headers.emplace_back("Access-Control-Allow-Credentials", "true");
  return r;
}

void append_cors_fields(const CorsOptions& o, std::string_view allowed, std::string& out) {
  absl::StrAppend(&out, "Access-Control-Allow-Origin: ", av(allowed), "\r\nVary: Origin\r\n");
  if (o.allow_credentials()) out += "Access-Control-Allow-Credentials: true\r\n";
  if (!o.expose_headers().empty()) {
    absl::StrAppend(&out, "Access-Control-Expose-Headers: ", o.expose_headers(), "\r\n");
  }
}

}  // namespace bus::http::detail
