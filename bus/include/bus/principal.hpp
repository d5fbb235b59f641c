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

}  // namespace bus
