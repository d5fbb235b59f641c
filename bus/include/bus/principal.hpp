// Who a request comes from, as the edge authenticated them (a bearer token, a client
// certificate). It travels with the request to the handler that serves it, in this process or on
// another node, and to the requests that handler makes in turn.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bus {

/// Immutable once made; shared by every request it comes with.
struct Principal {
  std::string subject;              // the token's "sub", or the client certificate's subject
  std::string issuer;               // the token's "iss" (empty for a certificate)
  std::vector<std::string> scopes;  // the token's "scope" (space-separated) or "scp"
  std::string claims;               // the token's claims as JSON ("" for a certificate)

  bool has_scope(std::string_view scope) const {
    for (const std::string& s : scopes) {
      if (s == scope) return true;
    }
    return false;
  }
};

using PrincipalPtr = std::shared_ptr<const Principal>;

namespace detail {
// The principal of what this thread does now: a pointer to the PrincipalPtr of the innermost
// PrincipalScope (trivial, so reading it costs a TLS load, not a guard check).
inline thread_local const PrincipalPtr* tl_principal = nullptr;
/// What a request made now carries.
inline PrincipalPtr current_principal() {
  return tl_principal != nullptr ? *tl_principal : PrincipalPtr();
}
}  // namespace detail

/// The principal of the request being served: in a handler of an endpoint while it runs (and in
/// the route functions of the HTTP server), null when the request carries none. Requests the
/// handler makes meanwhile carry it on; a reply callback runs outside it.
inline const Principal* principal() {
  return detail::tl_principal != nullptr ? detail::tl_principal->get() : nullptr;
}

/// Makes `p` the principal of what the calling thread does in this scope: requests made in it
/// carry `p`, and bus::principal() returns it. `p` must outlive the scope.
class PrincipalScope {
 public:
  explicit PrincipalScope(const PrincipalPtr& p) : prev_(detail::tl_principal) {
    detail::tl_principal = &p;
  }
  ~PrincipalScope() { detail::tl_principal = prev_; }
  PrincipalScope(const PrincipalScope&) = delete;
  PrincipalScope& operator=(const PrincipalScope&) = delete;

 private:
  const PrincipalPtr* prev_;
};

}  // namespace bus
