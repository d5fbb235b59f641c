// The OpenAPI 3.1 document of a server (GET /openapi.json): its routes, their parameters,
// bodies and statuses, and how callers authenticate. No Beast here.
#pragma once

#include <string>
#include <vector>

#include "bus/http/options.hpp"
#include "bus/http/server.hpp"
#include "bus/http/websocket.hpp"

namespace bus::http::detail {

/// What the document describes: the server's routes (in the order they were added), its
/// options (authentication, limits) and its WebSocket bridge, if any.
struct ApiSurface {
  struct Route {
    const RouteSpec* spec;
    std::vector<std::string> params;  // the template's parameter names, in order
  };
  const ServerOptions* options = nullptr;
  std::vector<Route> routes;
  const WebSocketOptions* websocket = nullptr;
};

/// The document as compact JSON, written by Cap'n Proto's JSON codec.
std::string openapi_document(const ApiSurface& api);

}  // namespace bus::http::detail
