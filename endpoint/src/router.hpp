// Route templates ("/orders/{id}") and matching a request path against them. No Beast here.
#pragma once

#include <absl/types/span.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bus/http/request.hpp"

namespace bus::http::detail {

class Router {
 public:
  struct Route {
    Method method;
    std::string path;                   // the template as given
    std::vector<std::string> segments;  // literal segments; "" where a parameter is
    std::vector<std::string> params;    // parameter names, in order
  };
  struct Match {
    std::size_t route = 0;  // index into routes()
    Request::Fields params;
  };
  struct Miss {
    bool path_known = false;  // some route has this path: the method is what is wrong (405)
    std::string allow;        // "GET, HEAD, POST" for the Allow header
  };

  /// Adds a route and returns its index. Throws std::invalid_argument for a malformed template
  /// or a second route with the same method and path shape.
  std::size_t add(Method method, std::string_view path);
  /// `path` is the request's decoded path segments. A GET route answers HEAD as well.
  std::optional<Match> match(Method method, absl::Span<const std::string_view> path,
                             Miss* miss) const;
  const std::vector<Route>& routes() const { return routes_; }

 private:
  static bool fits(const Route& r, absl::Span<const std::string_view> path);
  std::vector<Route> routes_;
};

}  // namespace bus::http::detail
