// busctl: talk to a live bus from the command line. It joins the bus as a node over the bridge
// (like `nats` for NATS and `grpcurl` for gRPC) and learns message types at run time from
// .capnp files: no recompilation for new types.
//
//   busctl --peer tcp://127.0.0.1:7011 --schema schemas/demo.capnp sub demo.readings --count 5
//   busctl --peer tcp://127.0.0.1:7011 --schema schemas/demo.capnp call demo.stats '{}'
//   busctl --peer tcp://127.0.0.1:7011 peers
//
// Exit codes (for scripts): 0 done; 1 usage; 2 no peer reachable, nobody serves / imports
// the channel, or (stats NODE) no live node of that name; 3 schema or JSON problem (type not in
// the --schema files, field not in the schema); 4 the call failed (its status is printed); 5
// fewer messages than --count came before --timeout; 6 stats: a live node cannot be asked (it
// has no request socket), the others' counters are printed.
#include <absl/flags/flag.h>
#include <absl/flags/parse.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <absl/strings/str_join.h>
#include <absl/strings/str_split.h>
#include <absl/time/time.h>
#include <bus/schemas/envelope.capnp.h>
#include <capnp/compat/json.h>
#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <capnp/schema-parser.h>
#include <capnp/serialize.h>
#include <kj/filesystem.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bus/net/node.hpp>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../../examples/usage.hpp"

ABSL_FLAG(std::vector<std::string>, peer, {},
          "publish addresses of the nodes to join through (tcp://host:port, ipc://path); "
          "comma-separated or repeated. Required unless --etcd finds them.");
ABSL_FLAG(std::vector<std::string>, etcd, {},
          "etcd endpoints (http://host:port) where the nodes register: busctl joins every node "
          "registered under --prefix (without registering itself)");
ABSL_FLAG(std::string, prefix, "/bus/", "with --etcd: the key prefix the nodes register under");
ABSL_FLAG(std::string, config, "",
          "a node config file (bus::net::NodeOptions::load syntax) for a secured bus: its "
          "`peer = ADDRESS PUBLIC-KEY` lines, `curve_public`/`curve_secret` (busctl's own key "
          "pair: `busctl keygen` makes one; the nodes must allow its public key), heartbeat and "
          "limits. Its name and addresses are not used: busctl binds 127.0.0.1 only.");
ABSL_FLAG(std::vector<std::string>, schema, {},
          ".capnp files that define the message types (comma-separated or repeated)");
ABSL_FLAG(std::vector<std::string>, import_path, {"/usr/include"},
          "directories searched for absolute imports in the schema files");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5),
          "call: the request's deadline; sub/tap with --count: how long to wait for them");
ABSL_FLAG(absl::Duration, wait, absl::Seconds(3),
          "how long to wait for peers' heartbeats before giving up on a channel or node");
ABSL_FLAG(uint64_t, count, 0, "sub/tap: exit after this many messages (0: run until killed)");
ABSL_FLAG(std::string, name, "busctl", "this node's name, as peers see it");

namespace {

enum Exit {
  kOk = 0,
  kUsage = 1,
  kUnreachable = 2,
  kSchema = 3,
  kCallFailed = 4,
  kShort = 5,
  kNotAskable = 6
};

constexpr const char* kUsageText = R"(talks to a live bus.

usage: busctl --peer tcp://HOST:PORT [--schema FILE.capnp] COMMAND [ARGS]
       busctl --etcd http://HOST:2379 [--prefix /bus/] [--schema FILE.capnp] COMMAND [ARGS]
       busctl --config node.conf [--schema FILE.capnp] COMMAND [ARGS]   (a CURVE-secured bus)

commands:
  pub CHANNEL 'JSON'    publish one message to every node that subscribes to CHANNEL
  sub CHANNEL           print CHANNEL's messages as JSON lines (--count N: stop after N)
  call ENDPOINT 'JSON'  call ENDPOINT and print its reply as JSON (--timeout)
  peers                 live nodes: what they serve and import, the transport busctl reaches
                        each by (shm: shared memory, zmq: ZeroMQ), their last heartbeat
  stats [NODE]          the counters of every live node (or of NODE: a name or an id); a node
                        without a request socket is live but cannot be asked (exit 6)
  tap                   every topic message this node can see, one line each
  keygen                a fresh CURVE key pair, as curve_public/curve_secret lines for --config

Message types come from --schema files, matched by schema id with what the nodes announce.
--peer, --schema and --import_path take a comma-separated list, and may be repeated.

exit codes: 0 ok, 1 usage, 2 no peer / nobody serves the channel / no live node NODE,
            3 schema or JSON error, 4 call failed (stats: a node did not answer),
            5 --count not reached before --timeout, 6 stats: a live node cannot be asked
            (no request socket; the others' counters are printed).)";

int fail(int code, const std::string& what) {
  std::fprintf(stderr, "busctl: %s\n", what.c_str());
  return code;
}

std::chrono::milliseconds ms(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

/// The struct types of the --schema files, by schema id.
class Schemas {
 public:
  /// Parses every file; an error names the file and what is wrong.
  std::optional<std::string> load(const std::vector<std::string>& files,
                                  const std::vector<std::string>& import_path) {
    // KJ takes the current directory from $PWD and warns on stdout when it is stale (a parent
    // that changed directory without updating it): give it the real one.
    char cwd[4096];
    if (::getcwd(cwd, sizeof cwd) != nullptr) ::setenv("PWD", cwd, 1);
    fs_ = kj::newDiskFilesystem();
    for (const std::string& dir : import_path) {
      kj::Path p = fs_->getCurrentPath().eval(dir);
      KJ_IF_MAYBE (d, fs_->getRoot().tryOpenSubdir(p)) {
        dirs_.push_back(kj::mv(*d));
      }
    }
    for (auto& d : dirs_) import_.push_back(d.get());
    for (const std::string& file : files) {
      try {
        kj::Path p = fs_->getCurrentPath().eval(file);
        capnp::ParsedSchema parsed = parser_.parseFromDirectory(
            fs_->getRoot(), kj::mv(p), kj::arrayPtr(import_.data(), import_.size()));
        collect(parsed);
      } catch (const kj::Exception& e) {
        return absl::StrCat("cannot read schema ", file, ": ", e.getDescription().cStr());
      }
    }
    // The bus's own types (heartbeats, $bus.stats) are always known.
    add(capnp::Schema::from<bus::wire::NodeStatsReply>().asStruct());
    add(capnp::Schema::from<bus::wire::NodeStatsRequest>().asStruct());
    return std::nullopt;
  }
  std::optional<capnp::StructSchema> find(uint64_t id) const {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return std::nullopt;
    return it->second;
  }
  static std::string hex(uint64_t id) { return absl::StrCat("0x", absl::Hex(id)); }
  std::string missing(uint64_t id, std::string_view channel) const {
    return absl::StrCat("'", std::string(channel), "' carries type ", hex(id),
                        ", which no --schema file defines (give the .capnp file that does; "
                        "`capnp compile -ocapnp FILE` lists the ids of its structs)");
  }

 private:
  void collect(capnp::ParsedSchema s) {
    if (s.getProto().isStruct()) add(s.asStruct());
    for (auto nested : s.getAllNested()) collect(nested);
  }
  void add(capnp::StructSchema s) { by_id_.emplace(s.getProto().getId(), s); }

  kj::Own<kj::Filesystem> fs_;
  std::vector<kj::Own<const kj::ReadableDirectory>> dirs_;
  std::vector<const kj::ReadableDirectory*> import_;
  capnp::SchemaParser parser_;
  std::map<uint64_t, capnp::StructSchema> by_id_;
};

capnp::JsonCodec& codec() {
  static capnp::JsonCodec c;
  static bool configured = false;
  if (!configured) {
    c.setRejectUnknownFields(true);  // a misspelt field is an error, not silently dropped
    configured = true;
  }
  return c;
}

/// JSON -> one Cap'n Proto message of `type` (stream framing), or what is wrong with the JSON.
absl::StatusOr<std::string> encode(capnp::StructSchema type, const std::string& json) {
  try {
    capnp::MallocMessageBuilder b;
    auto root = b.initRoot<capnp::DynamicStruct>(type);
    codec().decode(kj::ArrayPtr<const char>(json.data(), json.size()), root);
    kj::Array<capnp::word> words = capnp::messageToFlatArray(b);
    auto bytes = words.asBytes();
    return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the JSON is not a ", type.getUnqualifiedName().cStr(), ": ", e.getDescription().cStr()));
  }
}

/// One message as JSON (compact).
std::string decode(capnp::StructSchema type, kj::ArrayPtr<const capnp::word> payload) {
  try {
    capnp::FlatArrayMessageReader r(payload);
    kj::String s = codec().encode(r.getRoot<capnp::DynamicStruct>(type));
    return std::string(s.cStr(), s.size());
  } catch (const kj::Exception& e) {
    return absl::StrCat("<undecodable ", type.getUnqualifiedName().cStr(), ": ",
                        e.getDescription().cStr(), ">");
  }
}

std::string kind_name(bus::net::ChannelInfo::Kind k) {
  switch (k) {
    case bus::net::ChannelInfo::Kind::kTopic: return "topic";
    case bus::net::ChannelInfo::Kind::kQueue: return "queue";
    case bus::net::ChannelInfo::Kind::kEndpoint: return "endpoint";
  }
  return "?";
}

class Tool {
 public:
  explicit Tool(const bus::net::NodeOptions& options)
      : secure_(options.secure()), peer_count_(options.peers().size()) {
    node_.emplace(bus_, options);
  }
  /// The nodes it was told to join (--peer and --config), and those etcd lists now (at least
  /// one, while etcd has not answered yet).
  std::size_t peer_count() const {
    if (absl::GetFlag(FLAGS_etcd).empty()) return peer_count_;
    bus::net::NodeStats st = node_->stats();
    return peer_count_ + std::max<uint64_t>(1, st.members_found - st.members_dropped);
  }
  ~Tool() { node_->stop(); }
  bus::net::Node& node() { return *node_; }

  /// Waits for heartbeats until `found(peers)` holds or --wait passes; returns the last peers.
  template <class F>
  std::vector<bus::net::PeerInfo> wait_for(F found) {
    auto until = std::chrono::steady_clock::now() + ms(absl::GetFlag(FLAGS_wait));
    for (;;) {
      std::vector<bus::net::PeerInfo> peers = node_->peers();
      if (found(peers) || std::chrono::steady_clock::now() >= until) return peers;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  /// The first live node announcing `channel` (served, or imported), or why there is none.
  absl::StatusOr<bus::net::ChannelInfo> channel(const std::string& name, bool served) {
    std::optional<bus::net::ChannelInfo> hit;
    auto peers = wait_for([&](const std::vector<bus::net::PeerInfo>& ps) {
      for (const auto& p : ps) {
        for (const auto& c : p.channels) {
          if (c.name == name && c.served == served) hit = c;
        }
      }
      return hit.has_value();
    });
    if (hit) return *hit;
    if (peers.empty()) return unreachable();
    return absl::NotFoundError(
        absl::StrCat("no live node ", served ? "serves" : "subscribes to", " '", name, "' (",
                     peers.size(), " node", peers.size() == 1 ? "" : "s",
                     " seen: `busctl peers` lists what they ", served ? "serve" : "import", ")"));
  }
  absl::Status unreachable() const {
    return absl::UnavailableError(absl::StrCat(
        "no peer reachable: no heartbeat from any --peer (or node registered in --etcd) within "
        "--wait (is the node running, and is --peer its publish address?",
        secure_ ? " With CURVE: is the peer's public key in --config right, and does the node "
                  "allow busctl's public key?"
                : "",
        ")"));
  }

 private:
  bus::Bus bus_{bus::Options().executors(1)};
  bool secure_;
  std::size_t peer_count_;
  std::optional<bus::net::Node> node_;
};

/// busctl's node: --config's peers, keys, heartbeat and limits (when given), --peer, --name;
/// its own sockets on 127.0.0.1 only (no node connects to busctl).
absl::StatusOr<bus::net::NodeOptions> node_options() {
  bus::net::NodeOptions o;
  if (std::string path = absl::GetFlag(FLAGS_config); !path.empty()) {
    std::ifstream in(path);
    if (!in) return absl::NotFoundError(absl::StrCat("--config: cannot read '", path, "'"));
    // A node config needs a `publish` line; busctl's own comes first (a line of the file's
    // would win, and is replaced below anyway).
    std::stringstream text;
    text << "publish = tcp://127.0.0.1:*\n" << in.rdbuf();
    absl::StatusOr<bus::net::NodeOptions> parsed = bus::net::NodeOptions::parse(text.str());
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--config ", path, ": ", parsed.status().message()));
    }
    o = *std::move(parsed);
  }
  o.name(absl::GetFlag(FLAGS_name))
      .publish_on("tcp://127.0.0.1:*")
      .requests_on("tcp://127.0.0.1:*")
      .advertise("");
  for (const std::string& p : absl::GetFlag(FLAGS_peer)) {
    if (o.secure()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--peer=", p,
                       ": with CURVE keys every peer needs its public key; give it in the "
                       "--config file as `peer = ",
                       p, " PUBLIC-KEY`"));
    }
    o.peer(p);
  }
  if (o.secure()) {
    // The nodes busctl is told to join are the ones it trusts: a node hears only peers whose
    // keys it allows.
    std::vector<std::string> allow = o.allow();
    for (const auto& p : o.peers()) {
      if (p.public_key.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--config: peer ", p.address,
            " has no public key; with CURVE keys every peer needs one (`peer = ", p.address,
            " PUBLIC-KEY`)"));
      }
      if (std::find(allow.begin(), allow.end(), p.public_key) == allow.end()) {
        allow.push_back(p.public_key);
      }
    }
    bus::net::CurveKeys keys = o.curve_keys();
    o.curve(std::move(keys), std::move(allow));
  }
  if (std::vector<std::string> etcd = absl::GetFlag(FLAGS_etcd); !etcd.empty()) {
    o.etcd(std::move(etcd), absl::GetFlag(FLAGS_prefix)).etcd_register(false);
  }
  if (o.peers().empty() && o.etcd().empty()) {
    return absl::InvalidArgumentError(
        "--peer or --etcd is required: the publish address of a node of the bus (or `peer =` "
        "lines in --config), or the etcd where the nodes register");
  }
  return o;
}

int cmd_keygen() {
  bus::net::CurveKeys k = bus::net::CurveKeys::generate();
  std::printf(
      "# busctl's CURVE key pair: keep the secret; add the public key to the nodes' allow lists\n"
      "curve_public = %s\ncurve_secret = %s\n",
      k.public_key.c_str(), k.secret_key.c_str());
  return kOk;
}

int exit_for(const absl::Status& st) {
  if (st.code() == absl::StatusCode::kUnavailable || st.code() == absl::StatusCode::kNotFound) {
    return kUnreachable;
  }
  return kSchema;
}

int cmd_pub(Tool& tool, const Schemas& schemas, const std::string& channel,
            const std::string& json) {
  auto ch = tool.channel(channel, /*served=*/false);
  if (!ch.ok()) return fail(exit_for(ch.status()), std::string(ch.status().message()));
  auto type = schemas.find(ch->type_id);
  if (!type) return fail(kSchema, schemas.missing(ch->type_id, channel));
  auto bytes = encode(*type, json);
  if (!bytes.ok()) return fail(kSchema, std::string(bytes.status().message()));
  auto sent = tool.node().publish_raw(channel, ch->type_id, *bytes);
  if (!sent.ok()) return fail(exit_for(sent.status()), std::string(sent.status().message()));
  std::printf("published to %zu node%s\n", *sent, *sent == 1 ? "" : "s");
  return kOk;
}

int cmd_call(Tool& tool, const Schemas& schemas, const std::string& endpoint,
             const std::string& json) {
  auto ch = tool.channel(endpoint, /*served=*/true);
  if (!ch.ok()) return fail(exit_for(ch.status()), std::string(ch.status().message()));
  if (ch->kind != bus::net::ChannelInfo::Kind::kEndpoint) {
    return fail(kUsage, absl::StrCat("'", endpoint, "' is a ", kind_name(ch->kind),
                                     ", not an endpoint (pub sends to topics)"));
  }
  auto req = schemas.find(ch->type_id);
  if (!req) return fail(kSchema, schemas.missing(ch->type_id, endpoint));
  auto rep = schemas.find(ch->reply_type_id);
  if (!rep) return fail(kSchema, schemas.missing(ch->reply_type_id, endpoint));
  auto bytes = encode(*req, json);
  if (!bytes.ok()) return fail(kSchema, std::string(bytes.status().message()));
  std::mutex mu;
  std::condition_variable cv;
  std::optional<std::pair<absl::Status, std::string>> result;
  tool.node().call_raw(endpoint, ch->type_id, ch->reply_type_id, 0, *bytes,
                       ms(absl::GetFlag(FLAGS_timeout)),
                       [&](absl::StatusOr<bus::net::RawMessage> m) {
                         std::string out = m.ok() ? decode(*rep, m->payload) : "";
                         std::lock_guard lock(mu);
                         result.emplace(m.status(), std::move(out));
                         cv.notify_all();
                       });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return result.has_value(); });  // the call's deadline bounds it
  if (!result->first.ok()) {
    return fail(kCallFailed, absl::StrCat("call failed: ", result->first.ToString()));
  }
  std::printf("%s\n", result->second.c_str());
  return kOk;
}

/// sub and tap: prints messages until --count (exit 5 if --timeout passes first) or forever.
int cmd_watch(Tool& tool, const Schemas& schemas, const std::string& channel) {
  uint64_t want = absl::GetFlag(FLAGS_count);
  // Subscribing before anyone publishes is fine; but no heartbeat at all means a wrong --peer.
  auto peers = tool.wait_for([](const auto& ps) { return !ps.empty(); });
  if (peers.empty()) return fail(kUnreachable, std::string(tool.unreachable().message()));
  std::mutex mu;
  std::condition_variable cv;
  uint64_t seen = 0;
  std::map<uint64_t, std::string> names;
  for (const auto& p : peers) names[p.id] = p.name;
  tool.node().tap(channel, [&, tap = channel.empty()](const bus::net::RawMessage& m) {
    std::lock_guard lock(mu);
    if (want != 0 && seen >= want) return;
    auto type = schemas.find(m.type_id);
    std::string body = type ? decode(*type, m.payload)
                            : absl::StrCat("<type ", Schemas::hex(m.type_id), ", ",
                                           m.payload.size() * 8, " bytes: not in --schema>");
    if (tap) {
      auto name = names.find(m.sender);
      std::printf("%.*s %s %s\n", static_cast<int>(m.channel.size()), m.channel.data(),
                  name != names.end() ? name->second.c_str() : absl::StrCat(m.sender).c_str(),
                  body.c_str());
    } else {
      std::printf("%s\n", body.c_str());
    }
    std::fflush(stdout);
    ++seen;
    cv.notify_all();
  });
  std::unique_lock lock(mu);
  if (want == 0) {
    cv.wait(lock, [] { return false; });  // until killed
  }
  if (!cv.wait_for(lock, ms(absl::GetFlag(FLAGS_timeout)), [&] { return seen >= want; })) {
    return fail(kShort, absl::StrCat("only ", seen, " of ", want, " messages within --timeout"));
  }
  return kOk;
}

int cmd_peers(Tool& tool) {
  // Every peer's first heartbeat comes at once on connect; wait for all --peer nodes or --wait.
  auto peers = tool.wait_for([&](const auto& ps) { return ps.size() >= tool.peer_count(); });
  if (peers.empty()) return fail(kUnreachable, std::string(tool.unreachable().message()));
  for (const auto& p : peers) {
    std::printf("%s  id=%llu  requests=%s  transport=%s  last heartbeat %lld ms ago\n",
                p.name.c_str(), static_cast<unsigned long long>(p.id),
                p.request_address.empty() ? "-" : p.request_address.c_str(),
                bus::net::transport_name(p.transport),
                static_cast<long long>(p.since_heartbeat.count()));
    for (const auto& c : p.channels) {
      std::printf("  %-7s %-8s %s  type %s%s\n", c.served ? "serves" : "imports",
                  kind_name(c.kind).c_str(), c.name.c_str(), Schemas::hex(c.type_id).c_str(),
                  c.kind == bus::net::ChannelInfo::Kind::kEndpoint
                      ? absl::StrCat(" -> ", Schemas::hex(c.reply_type_id)).c_str()
                      : "");
    }
  }
  return kOk;
}

int cmd_stats(Tool& tool, const std::string& which) {
  auto peers = tool.wait_for([&](const std::vector<bus::net::PeerInfo>& ps) {
    if (which.empty()) return ps.size() >= tool.peer_count();
    for (const auto& p : ps) {
      if (p.name == which || absl::StrCat(p.id) == which) return true;
    }
    return false;
  });
  if (peers.empty()) return fail(kUnreachable, std::string(tool.unreachable().message()));
  int code = kOk;
  bool any = false, unaskable = false;
  for (const auto& p : peers) {
    if (!which.empty() && p.name != which && absl::StrCat(p.id) != which) continue;
    any = true;
    if (p.request_address.empty()) {
      // Live (its heartbeats arrive), but $bus.stats is asked on a node's request socket.
      unaskable = true;
      std::fprintf(stderr,
                   "busctl: %s (id %llu) is live but cannot be asked: it has no request socket "
                   "(NodeOptions::requests_on)\n",
                   p.name.c_str(), static_cast<unsigned long long>(p.id));
      continue;
    }
    std::mutex mu;
    std::condition_variable cv;
    std::optional<absl::StatusOr<std::string>> result;
    capnp::MallocMessageBuilder empty;
    empty.initRoot<bus::wire::NodeStatsRequest>();
    kj::Array<capnp::word> words = capnp::messageToFlatArray(empty);
    tool.node().call_raw(
        "$bus.stats", capnp::typeId<bus::wire::NodeStatsRequest>(),
        capnp::typeId<bus::wire::NodeStatsReply>(), p.id,
        std::string(reinterpret_cast<const char*>(words.asBytes().begin()), words.asBytes().size()),
        ms(absl::GetFlag(FLAGS_timeout)), [&](absl::StatusOr<bus::net::RawMessage> m) {
          std::lock_guard lock(mu);
          if (m.ok()) {
            capnp::FlatArrayMessageReader r(m->payload);
            auto s = r.getRoot<bus::wire::NodeStatsReply>();
            std::string out = absl::StrCat(s.getName().cStr(), " (id ", s.getNode(), ")\n");
            for (auto f : s.getFigures()) {
              absl::StrAppend(&out, "  ", f.getName().cStr(), " ", f.getValue(),
                              f.getGauge() ? " (gauge)" : "", "\n");
            }
            result.emplace(std::move(out));
          } else {
            result.emplace(m.status());
          }
          cv.notify_all();
        });
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return result.has_value(); });
    if (result->ok()) {
      std::printf("%s", (*result)->c_str());
    } else {
      code = kCallFailed;
      std::fprintf(stderr, "busctl: %s: %s\n", p.name.c_str(), result->status().ToString().c_str());
    }
  }
  if (!any) {
    return fail(kUnreachable,
                absl::StrCat("no live node named '", which, "' (`busctl peers` lists them)"));
  }
  return code == kOk && unaskable ? kNotAskable : code;
}

/// Abseil keeps only the last of a repeated list flag; busctl's are documented "comma-separated
/// or repeated", so every occurrence of one is joined into a single flag before parsing.
std::vector<std::string> join_repeated_lists(int argc, char** argv) {
  static const char* const kLists[] = {"peer", "schema", "import_path"};
  std::vector<std::string> out, order;
  std::map<std::string, std::vector<std::string>> values;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (i > 0 && a == "--") {  // the rest are arguments, not flags
      for (; i < argc; ++i) out.emplace_back(argv[i]);
      break;
    }
    if (i == 0 || a.size() < 2 || a[0] != '-') {
      out.push_back(std::move(a));
      continue;
    }
    std::string name = a.substr(a[1] == '-' ? 2 : 1), value;
    bool inline_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
      inline_value = true;
    }
    if (std::find(std::begin(kLists), std::end(kLists), name) == std::end(kLists) ||
        (!inline_value && i + 1 == argc)) {
      out.push_back(std::move(a));  // not a list flag (or a bare one: Abseil says what is wrong)
      continue;
    }
    if (!inline_value) value = argv[++i];
    if (!values.contains(name)) order.push_back(name);
    if (!value.empty()) values[name].push_back(std::move(value));
  }
  std::size_t at = out.empty() ? 0 : 1;
  for (const std::string& name : order) {
    out.insert(out.begin() + static_cast<std::ptrdiff_t>(at++),
               absl::StrCat("--", name, "=", absl::StrJoin(values[name], ",")));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  examples::usage(kUsageText);
  std::vector<std::string> joined = join_repeated_lists(argc, argv);
  std::vector<char*> joined_argv;
  for (std::string& a : joined) joined_argv.push_back(a.data());
  std::vector<char*> args =
      absl::ParseCommandLine(static_cast<int>(joined_argv.size()), joined_argv.data());
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (args.size() < 2) return fail(kUsage, "no command (busctl --help lists them)");
  std::string cmd = args[1];
  if (cmd == "keygen") return cmd_keygen();
  auto arg = [&](std::size_t i) { return i < args.size() ? std::string(args[i]) : std::string(); };
  std::size_t need = cmd == "pub" || cmd == "call" ? 4 : cmd == "sub" ? 3 : 2;
  if (cmd != "pub" && cmd != "call" && cmd != "sub" && cmd != "peers" && cmd != "stats" &&
      cmd != "tap") {
    return fail(kUsage, absl::StrCat("unknown command '", cmd, "' (busctl --help lists them)"));
  }
  if (args.size() < need) {
    return fail(kUsage, absl::StrCat(cmd, ": missing arguments (busctl --help)"));
  }
  absl::StatusOr<bus::net::NodeOptions> options = node_options();
  if (!options.ok()) {
    return fail(kUsage, std::string(options.status().message()));
  }
  Schemas schemas;
  if (auto err = schemas.load(absl::GetFlag(FLAGS_schema), absl::GetFlag(FLAGS_import_path))) {
    return fail(kSchema, *err);
  }
  try {
    Tool tool(*options);
    if (cmd == "pub") return cmd_pub(tool, schemas, arg(2), arg(3));
    if (cmd == "call") return cmd_call(tool, schemas, arg(2), arg(3));
    if (cmd == "sub") return cmd_watch(tool, schemas, arg(2));
    if (cmd == "tap") return cmd_watch(tool, schemas, "");
    if (cmd == "peers") return cmd_peers(tool);
    return cmd_stats(tool, arg(2));
  } catch (const std::exception& e) {
    return fail(kUnreachable, e.what());
  }
}
