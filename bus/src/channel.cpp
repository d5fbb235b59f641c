#include "bus/channel.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/strings/str_cat.h>

#include <deque>
#include <mutex>

namespace bus::detail {
namespace {

struct Registry {
  std::mutex mu;
  absl::flat_hash_map<std::string, uint32_t> by_name;
  std::deque<ChannelInfo> infos;  // deque: references stay valid as it grows
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: channels are used during static exit
  return *r;
}

constexpr std::string_view kind_name(ChannelKind k) {
  switch (k) {
    case ChannelKind::kTopic: return "topic";
    case ChannelKind::kQueue: return "queue";
    case ChannelKind::kEndpoint: return "endpoint";
  }
  return "?";
}

}  // namespace

uint32_t register_channel(std::string_view name, ChannelKind kind, std::type_index type,
                          std::string type_name) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  std::string key(name);
  if (auto it = r.by_name.find(key); it != r.by_name.end()) {
    const ChannelInfo& have = r.infos[it->second];
    if (have.type != type || have.kind != kind) {
      throw ChannelTypeError(
          absl::StrCat("bus: channel '", key, "' is declared twice with different types: as ",
                       have.type_name, " (a ", std::string(kind_name(have.kind)), ") and as ",
                       type_name, " (a ", std::string(kind_name(kind)),
                       "). One name, one type: rename one of them or share one declaration."));
    }
    return it->second;
  }
  auto id = static_cast<uint32_t>(r.infos.size());
  r.infos.push_back(ChannelInfo{key, kind, type, std::move(type_name), id});
  r.by_name.emplace(key, id);
  return id;
}

const ChannelInfo& channel_info(uint32_t id) {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return r.infos[id];
}

uint32_t channel_count() {
  Registry& r = registry();
  std::lock_guard lock(r.mu);
  return static_cast<uint32_t>(r.infos.size());
}

}  // namespace bus::detail
