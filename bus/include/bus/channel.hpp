// Typed channels: a name and a message type, declared once and shared as constants.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeindex>

#include "bus/options.hpp"

namespace bus {

enum class ChannelKind : uint8_t { kTopic, kQueue, kEndpoint };

/// Two channels declared with one name and different types or kinds.
class ChannelTypeError : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

namespace detail {

template <class T>
constexpr std::string_view type_name() {
  std::string_view p = __PRETTY_FUNCTION__;
  auto start = p.find("T = ") + 4;
  auto end = p.find_first_of(";]", start);
  return p.substr(start, end - start);
}

struct ChannelInfo {
  std::string name;
  ChannelKind kind;
  std::type_index type;
  std::string type_name;  // e.g. "Topic<Tick>"
  uint32_t id;
};

/// Registers `name` process-wide, or finds it; throws ChannelTypeError when the name is taken by
/// another type or kind. Ids are dense, so per-bus state is an array lookup on the hot path.
uint32_t register_channel(std::string_view name, ChannelKind kind, std::type_index type,
                          std::string type_name);
const ChannelInfo& channel_info(uint32_t id);
uint32_t channel_count();

template <class... T>
std::string describe(std::string_view kind) {
  std::string s(kind);
  s += '<';
  bool first = true;
  ((s += (first ? "" : ", "), s += type_name<T>(), first = false), ...);
  s += '>';
  return s;
}

/// What every channel carries: its id, name and overflow policy.
class ChannelBase {
 public:
  uint32_t id() const { return id_; }
  const std::string& name() const { return detail::channel_info(id_).name; }
  Overflow overflow() const { return overflow_; }

 protected:
  ChannelBase(uint32_t id, Overflow overflow) : id_(id), overflow_(overflow) {}

 private:
  uint32_t id_;
  Overflow overflow_;
};

}  // namespace detail

/// Routes a Queue or Endpoint by key: messages with one key always reach the same consumer.
template <class T>
using KeyFn = uint64_t (*)(const T&);

/// Every subscriber gets each message.
///   inline const bus::Topic<Tick> ticks{"market.ticks"};
template <class T>
class Topic : public detail::ChannelBase {
 public:
  using value_type = T;
  static constexpr ChannelKind kKind = ChannelKind::kTopic;
  explicit Topic(std::string_view name, Overflow overflow = Overflow::kBlock)
      : ChannelBase(
            detail::register_channel(name, kKind, typeid(Topic), detail::describe<T>("Topic")),
            overflow) {}
};

/// Each message goes to exactly one consumer: round-robin over the consumers, or, when a key
/// function is given, to consumer `hash(key) % consumers` (the consumers are its shards).
template <class T>
class Queue : public detail::ChannelBase {
 public:
  using value_type = T;
  static constexpr ChannelKind kKind = ChannelKind::kQueue;
  explicit Queue(std::string_view name, KeyFn<T> key = nullptr,
                 Overflow overflow = Overflow::kBlock)
      : ChannelBase(
            detail::register_channel(name, kKind, typeid(Queue), detail::describe<T>("Queue")),
            overflow),
        key_(key) {}
  Queue(std::string_view name, Overflow overflow) : Queue(name, nullptr, overflow) {}
  KeyFn<T> key() const { return key_; }

 private:
  KeyFn<T> key_;
};

/// Request/reply: requests are routed like a Queue's messages; each gets one reply or a status.
template <class Req, class Rep>
class Endpoint : public detail::ChannelBase {
 public:
  using request_type = Req;
  using reply_type = Rep;
  static constexpr ChannelKind kKind = ChannelKind::kEndpoint;
  explicit Endpoint(std::string_view name, KeyFn<Req> key = nullptr,
                    Overflow overflow = Overflow::kBlock)
      : ChannelBase(detail::register_channel(name, kKind, typeid(Endpoint),
                                             detail::describe<Req, Rep>("Endpoint")),
                    overflow),
        key_(key) {}
  Endpoint(std::string_view name, Overflow overflow) : Endpoint(name, nullptr, overflow) {}
  KeyFn<Req> key() const { return key_; }

 private:
  KeyFn<Req> key_;
};

}  // namespace bus
