// CORS (the Fetch standard): which origin a response allows, and the answers to preflights.
// Beast's parsed request is read; nothing is parsed here.
#pragma once

#include <string>
#include <string_view>

#include "bus/http/options.hpp"
#include "bus/http/request.hpp"

namespace bus::http::detail {

/// What Access-Control-Allow-Origin says to a request from `origin`: the origin itself, "*", or
/// "" when `o` does not allow it.
std::string_view allowed_origin(const CorsOptions& o, std::string_view origin);

/// Whether `origin` is the server's own as the request names it (http or https + its Host).
bool same_origin(std::string_view origin, std::string_view host);

/// The answer to a preflight from `allowed` (allowed_origin's answer) for a path whose methods
/// are `allow`: 204 with the Access-Control fields, or 403 saying which method or header is
/// not allowed.
Reply preflight(const CorsOptions& o, std::string_view allowed, std::string_view allow,
                std::string_view method, std::string_view headers);

/// Appends the CORS fields of an actual response to `out`.
void append_cors_fields(const CorsOptions& o, std::string_view allowed, std::string& out);

}  // namespace bus::http::detail
