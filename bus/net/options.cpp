#include "bus/net/options.hpp"

#include <absl/strings/ascii.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_split.h>
#include <grp.h>

#include <fstream>
#include <sstream>

namespace bus::net {

absl::StatusOr<NodeOptions> NodeOptions::parse(std::string_view config) {
  NodeOptions o;
  CurveKeys keys;
  std::vector<std::string> allow;
  std::vector<std::string> etcd;
  std::string etcd_prefix = "/bus/";
  int line_no = 0;
  for (absl::string_view line :
       absl::StrSplit(absl::string_view(config.data(), config.size()), '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line.front() == '#') continue;
    auto eq = line.find('=');
    auto fail = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("node config line ", line_no, ": ", why));
    };
    if (eq == absl::string_view::npos) return fail("expected `key = value`");
    std::string key(absl::StripAsciiWhitespace(line.substr(0, eq)));
    absl::string_view rest = absl::StripAsciiWhitespace(line.substr(eq + 1));
    // After the value, a comment starts at a '#' that follows a blank. Z85 keys hold '#' (even
    // first), so one inside or at the start of the value is kept.
    for (std::size_t hash = rest.find('#', 1); hash != absl::string_view::npos;
         hash = rest.find('#', hash + 1)) {
      if (rest[hash - 1] == ' ' || rest[hash - 1] == '\t') {
        rest = absl::StripTrailingAsciiWhitespace(rest.substr(0, hash));
        break;
      }
    }
    std::string value(rest);
    auto number = [&](uint64_t& out) {
      return absl::SimpleAtoi(value, &out)
                 ? absl::OkStatus()
                 : fail(absl::StrCat(key, " needs a number, not '", value, "'"));
    };
    uint64_t n = 0;
    if (key == "name") {
      o.name(value);
    } else if (key == "publish") {
      o.publish_on(value);
    } else if (key == "requests") {
      o.requests_on(value);
    } else if (key == "advertise") {
      o.advertise(value);
    } else if (key == "peer") {
      std::vector<std::string> parts = absl::StrSplit(value, ' ', absl::SkipWhitespace());
      if (parts.empty() || parts.size() > 2) return fail("peer = <address> [public key]");
      o.peer(parts[0], parts.size() == 2 ? parts[1] : "");
    } else if (key == "advertise_publish") {
      o.advertise_publish(value);
    } else if (key == "resolve_every_ms") {
      if (auto s = number(n); !s.ok()) return s;
      if (n == 0) return fail("resolve_every_ms needs a period above 0");
      o.resolve_every(std::chrono::milliseconds(n));
    } else if (key == "etcd") {
      etcd.push_back(value);
    } else if (key == "etcd_prefix") {
      etcd_prefix = value;
    } else if (key == "etcd_register") {
      if (value != "true" && value != "false") return fail("etcd_register is true or false");
      o.etcd_register(value == "true");
    } else if (key == "etcd_related_only") {
      if (value != "true" && value != "false") return fail("etcd_related_only is true or false");
      o.etcd_related_only(value == "true");
    } else if (key == "heartbeat_ms") {
      if (auto s = number(n); !s.ok()) return s;
      o.heartbeat_ = std::chrono::milliseconds(n);
    } else if (key == "dead_after") {
      if (auto s = number(n); !s.ok()) return s;
      o.dead_after_ = static_cast<unsigned>(n);
    } else if (key == "max_message_bytes") {
      if (auto s = number(n); !s.ok()) return s;
      o.max_message_bytes(n);
    } else if (key == "traversal_limit_words") {
      if (auto s = number(n); !s.ok()) return s;
      o.traversal_limit_words_ = n;
    } else if (key == "nesting_limit") {
      if (auto s = number(n); !s.ok()) return s;
      o.nesting_limit_ = static_cast<int>(n);
    } else if (key == "curve_public") {
      keys.public_key = value;
    } else if (key == "curve_secret") {
      keys.secret_key = value;
    } else if (key == "allow") {
      allow.push_back(value);
    } else if (key == "send_stall_limit_ms") {
      if (auto s = number(n); !s.ok()) return s;
      o.send_stall_limit(std::chrono::milliseconds(n));
    } else if (key == "subscription_queue") {
      if (auto s = number(n); !s.ok()) return s;
      if (n < 1 || n > 1'000'000) return fail("subscription_queue needs 1..1000000 frames");
      o.subscription_queue(static_cast<int>(n));
    } else if (key == "subscriber_timeout_ms") {
      if (auto s = number(n); !s.ok()) return s;
      o.subscriber_timeout(std::chrono::milliseconds(n));
    } else if (key == "connect_timeout_ms") {
      if (auto s = number(n); !s.ok()) return s;
      if (n > 3'600'000) return fail("connect_timeout_ms needs 0..3600000");
      o.connect_timeout(std::chrono::milliseconds(n));
    } else if (key == "message_limit") {
      std::vector<std::string> parts = absl::StrSplit(value, ' ', absl::SkipWhitespace());
      uint64_t bytes = 0;
      if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &bytes)) {
        return fail("message_limit = <channel> <bytes>");
      }
      o.message_limit(parts[0], bytes);
    } else if (key == "transport") {
      if (value == "auto") {
        o.transport(Transport::kAuto);
      } else if (value == "zmq") {
        o.transport(Transport::kZeroMq);
      } else if (value == "shm") {
        o.transport(Transport::kSharedMemory);
      } else {
        return fail("transport is auto, zmq or shm");
      }
    } else if (key == "shm_ring_bytes") {
      if (auto s = number(n); !s.ok()) return s;
      if (n < (256 << 10) || n > (uint64_t{1} << 30) || (n & (n - 1)) != 0) {
        return fail("shm_ring_bytes needs a power of two from 262144 to 1073741824");
      }
      o.shm_ring_bytes(n);
    } else if (key == "shm_heap_limit") {
      if (auto s = number(n); !s.ok()) return s;
      o.shm_heap_limit(n);
    } else if (key == "shm_spin_us") {
      if (auto s = number(n); !s.ok()) return s;
      o.shm_spin(std::chrono::microseconds(n));
    } else if (key == "shm_group") {
      if (absl::SimpleAtoi(value, &n)) {
        o.shm_group(static_cast<int>(n));
      } else if (const group* g = ::getgrnam(value.c_str()); g != nullptr) {
        o.shm_group(static_cast<int>(g->gr_gid));
      } else {
        return fail(absl::StrCat("shm_group: no group '", value, "'"));
      }
    } else {
      return fail(absl::StrCat(
          "unknown key '", key,
          "' (known: name, publish, requests, advertise, advertise_publish, peer, "
          "resolve_every_ms, etcd, etcd_prefix, etcd_register, etcd_related_only, heartbeat_ms, "
          "dead_after, "
          "max_message_bytes, traversal_limit_words, nesting_limit, curve_public, curve_secret, "
          "allow, send_stall_limit_ms, subscription_queue, subscriber_timeout_ms, "
          "connect_timeout_ms, message_limit, "
          "transport, "
          "shm_ring_bytes, shm_heap_limit, shm_spin_us, shm_group)"));
    }
  }
  if (keys.secret_key.empty() != keys.public_key.empty()) {
    return absl::InvalidArgumentError(
        "node config: curve_public and curve_secret go together (give both or neither)");
  }
  if (!keys.secret_key.empty()) o.curve(std::move(keys), std::move(allow));
  if (!etcd.empty()) {
    o.etcd(std::move(etcd), std::move(etcd_prefix));
  } else if (etcd_prefix != "/bus/") {
    return absl::InvalidArgumentError("node config: etcd_prefix needs `etcd = <url>`");
  }
  if (o.publish_on().empty()) {
    return absl::InvalidArgumentError("node config: `publish = <address>` is required");
  }
  return o;
}

absl::StatusOr<NodeOptions> NodeOptions::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read node config '", path, "'"));
  std::stringstream text;
  text << in.rdbuf();
  auto o = parse(text.str());
  if (!o.ok())
    return absl::Status(o.status().code(), absl::StrCat(path, ": ", o.status().message()));
  return o;
}

}  // namespace bus::net
