#include "router.hpp"

#include <absl/strings/str_split.h>

#include <algorithm>
#include <stdexcept>

namespace bus::http::detail {

std::size_t Router::add(Method method, std::string_view path) {
  auto bad = [&](std::string_view why) {
    return std::invalid_argument("bus::http: route template '" + std::string(path) + "' " +
                                 std::string(why));
  };
  if (path.empty() || path.front() != '/') throw bad("must start with '/'");
  Route r{method, std::string(path), {}, {}};
  if (path.size() > 1) {
    for (absl::string_view seg :
         absl::StrSplit(absl::string_view(path.data() + 1, path.size() - 1), '/')) {
      if (seg.empty()) throw bad("has an empty segment");
      if (seg.front() == '{' || seg.back() == '}') {
        if (seg.size() < 3 || seg.front() != '{' || seg.back() != '}') {
          throw bad("has a malformed parameter '" + std::string(seg) + "'");
        }
        std::string name(seg.substr(1, seg.size() - 2));
        if (std::find(r.params.begin(), r.params.end(), name) != r.params.end()) {
          throw bad("names parameter '" + name + "' twice");
        }
        r.params.push_back(std::move(name));
        r.segments.emplace_back();
      } else {
        r.segments.emplace_back(seg);
      }
    }
  }
  for (const Route& o : routes_) {
    if (o.method == method && o.segments == r.segments) {
      throw bad("clashes with '" + o.path + "' for " + std::string(to_string(method)));
    }
  }
  routes_.push_back(std::move(r));
  return routes_.size() - 1;
}

bool Router::fits(const Route& r, absl::Span<const std::string_view> path) {
  if (r.segments.size() != path.size()) return false;
  for (std::size_t i = 0; i < path.size(); ++i) {
    // A parameter takes any non-empty segment; a literal must be equal.
    if (r.segments[i].empty() ? path[i].empty() : r.segments[i] != path[i]) return false;
  }
  return true;
}

std::optional<Router::Match> Router::match(Method method, absl::Span<const std::string_view> path,
                                           Miss* miss) const {
  // Literal segments beat parameters: "/orders/new" wins over "/orders/{id}" whatever the order
  // the routes were added in.
  const Route* best = nullptr;
  std::size_t best_literals = 0;
  for (const Route& r : routes_) {
    if (r.method != method && !(method == Method::kHead && r.method == Method::kGet)) continue;
    if (!fits(r, path)) continue;
    auto literals = static_cast<std::size_t>(
        std::count_if(r.segments.begin(), r.segments.end(), [](auto& s) { return !s.empty(); }));
    if (best == nullptr || literals > best_literals ||
        (literals == best_literals && r.method == method)) {
      best = &r;
      best_literals = literals;
    }
  }
  if (best != nullptr) {
    Match m;
    m.route = static_cast<std::size_t>(best - routes_.data());
    for (std::size_t i = 0, p = 0; i < path.size(); ++i) {
      if (best->segments[i].empty()) m.params.emplace_back(best->params[p++], path[i]);
    }
    return m;
  }
  // A miss (rare): which methods does this path have, for 405 and its Allow header?
  std::vector<Method> allowed;
  for (const Route& r : routes_) {
    if (fits(r, path)) allowed.push_back(r.method);
  }
  if (miss != nullptr) {
    miss->path_known = !allowed.empty();
    if (std::find(allowed.begin(), allowed.end(), Method::kGet) != allowed.end()) {
      allowed.push_back(Method::kHead);
    }
    std::sort(allowed.begin(), allowed.end());
    allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
    for (Method a : allowed) {
      if (!miss->allow.empty()) miss->allow += ", ";
      miss->allow += to_string(a);
    }
  }
  return std::nullopt;
}

}  // namespace bus::http::detail
