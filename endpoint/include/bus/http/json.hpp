// JSON <-> Cap'n Proto for routes, through Cap'n Proto's JSON codec: field names come from the
// schema, so a Cap'n Proto request type (or any type with a bus::Codec) needs no mapping code.
#pragma once

#include <absl/status/statusor.h>
#include <capnp/compat/json.h>
#include <capnp/dynamic.h>
#include <capnp/schema.h>

#include <string>
#include <string_view>
#include <vector>

#include "bus/http/request.hpp"
#include "bus/message.hpp"

namespace bus::http {

namespace detail {
/// This thread's JSON codec, as every JSON conversion of the endpoint uses it: unknown fields
/// are errors, nesting stops at 64 levels. Construction allocates, so there is one per thread.
capnp::JsonCodec& codec();
/// Fills `out` from the request: the body (a JSON object; none is `{}`), then path parameters,
/// then query parameters that name a field (others are ignored). A parameter overrides a body
/// field of the same name. Unknown body fields, wrong JSON types and nesting past 64 levels are
/// InvalidArgument.
absl::Status fill(const Request& req, capnp::DynamicStruct::Builder out);
/// `value` of `type` as compact JSON.
std::string encode(capnp::DynamicValue::Reader value, capnp::Type type);
/// Throws std::invalid_argument naming `route` unless every name is a field of `schema`.
void check_fields(capnp::StructSchema schema, const std::vector<std::string>& names,
                  std::string_view route);
}  // namespace detail

/// A Cap'n Proto struct or list reader as JSON (64-bit integers as strings, as the codec does).
template <class R>
std::string to_json(R reader) {
  using T = capnp::FromReader<R>;
  return detail::encode(capnp::DynamicValue::Reader(reader), capnp::Type::from<T>());
}

/// The request's JSON (body, path and query parameters) as a `T`.
template <Bridgeable T>
absl::StatusOr<T> from_request(const Request& req) {
  using S = typename Codec<T>::Schema;
  absl::Status status;
  Message<S> msg =
      build<S>([&](typename S::Builder b) { status = detail::fill(req, capnp::toDynamic(b)); });
  if (!status.ok()) return status;
  if constexpr (bus::detail::IsMessage<T>::value) {
    return msg;
  } else {
    return Codec<T>::decode(msg.reader());
  }
}

/// `value` as a JSON reply.
template <Bridgeable T>
Reply to_reply(const T& value) {
  using S = typename Codec<T>::Schema;
  if constexpr (bus::detail::IsMessage<T>::value) {
    return Reply::json(to_json(value.reader()));
  } else {
    Message<S> msg = build<S>([&](typename S::Builder b) { Codec<T>::encode(value, b); });
    return Reply::json(to_json(msg.reader()));
  }
}

}  // namespace bus::http
