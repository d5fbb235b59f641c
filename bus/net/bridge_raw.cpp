// Untyped access to the bridge, for tools that learn types at run time (busctl): taps, direct
// publishes, calls by name, and the "$bus.stats" endpoint every node answers.
#include <absl/strings/str_cat.h>
#include <capnp/message.h>

#include "bridge.hpp"

namespace bus::net::detail {
namespace {

/// A channel known by name and type ids only.
class RawChannel final : public Bridged {
 public:
  RawChannel(Role role, std::string name, uint64_t type, uint64_t reply)
      : Bridged(role, std::move(name), type, reply) {}
};

struct RawCall final : PendingCall {
  RawCall(std::string ch, uint64_t type, RawReply d)
      : channel(std::move(ch)), type_id(type), done(std::move(d)) {}
  void finish(absl::Status status, kj::ArrayPtr<const capnp::word> payload) override {
    if (!status.ok()) return done(status);
    done(RawMessage{channel, type_id, 0, payload});
  }
  std::string channel;
  uint64_t type_id;
  RawReply done;
};

/// Collects figures into a NodeStatsReply.
class FigureList final : public StatsdSink {
 public:
  void counter(std::string_view name, uint64_t total) override {
    add(name, static_cast<double>(total), false);
  }
  void gauge(std::string_view name, double value) override { add(name, value, true); }
  void timing(std::string_view name, uint64_t count, double sum_ms) override {
    add(absl::StrCat(absl::string_view(name.data(), name.size()), ".count"),
        static_cast<double>(count), false);
    add(absl::StrCat(absl::string_view(name.data(), name.size()), ".mean_ms"),
        count > 0 ? sum_ms / static_cast<double>(count) : 0.0, true);
  }
  struct Figure {
    std::string name;
    double value;
    bool gauge;
  };
  std::vector<Figure> figures;

 private:
  void add(std::string_view name, double value, bool gauge) {
    figures.push_back({std::string(name), value, gauge});
  }
};

}  // namespace

void Bridge::tap(std::string topic, RawHandler fn) {
  taps_[topic] = std::move(fn);
  update_subscriptions();
}

absl::StatusOr<std::size_t> Bridge::publish_raw(const std::string& topic, uint64_t type_id,
                                                const std::string& payload) {
  if (payload.size() > opt_.message_limit_of(topic)) {
    return absl::ResourceExhaustedError(absl::StrCat("bus.net: message of ", payload.size(),
                                                     " bytes is over the limit of '", topic, "' (",
                                                     opt_.message_limit_of(topic), ")"));
  }
  std::size_t sent = 0;
  std::string other_type;
  bool refused = false;
  for (auto& [id, p] : peers_) {
    if (p.route == nullptr) continue;
    for (const auto& c : p.imports) {
      if (c.name != topic) continue;
      if (c.type_id != type_id) {
        other_type = absl::StrCat("node '", p.name, "' imports '", topic, "' as type ",
                                  absl::Hex(c.type_id), ", not ", absl::Hex(type_id));
        break;
      }
      EnvelopeFields env;
      env.kind = wire::Envelope::Kind::PUBLISH;
      env.type_id = type_id;
      env.sender = id_;
      env.count = 1;
      uint64_t& seq = p.send_seq[topic];
      env.seq = seq + 1;
      if (p.route->send(topic, env, payload)) {
        ++seq;
        ++sent;
        ++traffic(topic, id).sent;
      } else {
        ++counters_.send_refused;
        refused = true;
      }
      break;
    }
  }
  if (sent > 0) return sent;
  if (refused) {
    return absl::ResourceExhaustedError(
        absl::StrCat("bus.net: no room toward the nodes importing '", topic, "'"));
  }
  if (!other_type.empty()) return absl::InvalidArgumentError(other_type);
  return absl::UnavailableError(
      absl::StrCat("bus.net: no live node subscribes to '", topic, "' (nobody would receive it)"));
}

void Bridge::call_raw(std::string endpoint, uint64_t type_id, uint64_t reply_type_id, uint64_t peer,
                      std::string payload, Clock::time_point deadline, RawReply done) {
  std::string key = absl::StrCat(endpoint, "/", type_id, "/", reply_type_id);
  auto& ch = raw_calls_[key];
  if (!ch) {
    ch = std::make_unique<RawChannel>(Bridged::Role::kImportEndpoint, endpoint, type_id,
                                      reply_type_id);
  }
  OutPayload out;
  out.bytes = std::move(payload);
  call_to(peer, *ch, std::move(out), deadline, nullptr,
          std::make_unique<RawCall>(std::move(endpoint), reply_type_id, std::move(done)));
}

void Bridge::serve_stats(const RemoteCall& call) {
  auto& ch = raw_calls_[kStatsEndpoint];
  if (!ch) {
    ch = std::make_unique<RawChannel>(Bridged::Role::kExportEndpoint, kStatsEndpoint,
                                      capnp::typeId<wire::NodeStatsRequest>(),
                                      capnp::typeId<wire::NodeStatsReply>());
  }
  FigureList list;
  bus::detail::bus_figures(bus_, list);
  NodeStats st = stats();
  node_figures(st, list);
  peer_figures(st, list);
  capnp::MallocMessageBuilder builder;
  auto out = builder.initRoot<wire::NodeStatsReply>();
  out.setNode(id_);
  out.setName(opt_.name());
  auto figures = out.initFigures(static_cast<unsigned>(list.figures.size()));
  for (unsigned i = 0; i < list.figures.size(); ++i) {
    figures[i].setName(list.figures[i].name);
    figures[i].setValue(list.figures[i].value);
    figures[i].setGauge(list.figures[i].gauge);
  }
  OutPayload payload;
  append_message(builder, payload.bytes);
  reply(*ch, call, absl::OkStatus(), std::move(payload));
}

}  // namespace bus::net::detail

namespace bus::net {

Node& Node::tap(std::string topic, RawHandler fn) {
  auto f = std::make_shared<RawHandler>(std::move(fn));
  bridge_->query([&] {
    bridge_->tap(std::move(topic), [f](const RawMessage& m) { (*f)(m); });
    return 0;
  });
  return *this;
}

absl::StatusOr<std::size_t> Node::publish_raw(std::string topic, uint64_t type_id,
                                              std::string payload) {
  return bridge_->query([&] { return bridge_->publish_raw(topic, type_id, payload); });
}

void Node::call_raw(std::string endpoint, uint64_t type_id, uint64_t reply_type_id, uint64_t peer,
                    std::string payload, Clock::duration timeout, RawReply done) {
  auto deadline = Clock::now() + timeout;
  bridge_->query([&] {
    bridge_->call_raw(std::move(endpoint), type_id, reply_type_id, peer, std::move(payload),
                      deadline, std::move(done));
    return 0;
  });
}

}  // namespace bus::net
