// JSON <-> Cap'n Proto through Cap'n Proto's JSON codec (capnp-json).
#include "bus/http/json.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/container/inlined_vector.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <capnp/any.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>

#include <optional>
#include <stdexcept>

namespace bus::http::detail {
capnp::JsonCodec& codec() {
  thread_local capnp::JsonCodec c;
  thread_local bool configured = false;
  if (!configured) {
    c.setRejectUnknownFields(true);  // a misspelt field is an error, not silently dropped
    c.setMaxNestingDepth(64);
    configured = true;
  }
  return c;
}

namespace {

// Debian's Abseil has its own string_view type.
absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// A field of a struct schema and its type's kind, as a parameter of that name sets it.
/// `pointer` is the pointer slot of a text or data field outside any union (set directly),
/// else -1 (set through the dynamic API).
struct FieldInfo {
  capnp::StructSchema::Field field;
  capnp::schema::Type::Which type;
  int pointer = -1;
};

/// The field of `schema` named `name`, if any. `findFieldByName` and `Field::getType` read the
/// schema's encoded node on each call (about 600 instructions per parameter and request), so the
/// fields found are kept per thread and schema; names that are no field are looked up each time
/// (a client choosing query parameter names must not grow the cache).
std::optional<FieldInfo> find_field(capnp::StructSchema schema, std::string_view name) {
  using Fields = absl::flat_hash_map<std::string, FieldInfo>;
  thread_local std::vector<std::pair<capnp::StructSchema, Fields>> known;
  Fields* fields = nullptr;
  for (auto& [s, f] : known) {
    if (s == schema) fields = &f;
  }
  if (fields == nullptr) fields = &known.emplace_back(schema, Fields()).second;
  if (auto it = fields->find(av(name)); it != fields->end()) return it->second;
  std::string key(name);  // NUL-terminated for kj::StringPtr
  KJ_IF_MAYBE (f, schema.findFieldByName(kj::StringPtr(key.c_str()))) {
    FieldInfo info{*f, f->getType().which()};
    capnp::schema::Field::Reader proto = f->getProto();
    if ((info.type == capnp::schema::Type::TEXT || info.type == capnp::schema::Type::DATA) &&
        proto.isSlot() && proto.getDiscriminantValue() == capnp::schema::Field::NO_DISCRIMINANT) {
      info.pointer = static_cast<int>(proto.getSlot().getOffset());
    }
    fields->try_emplace(std::move(key), info);
    return info;
  }
  return std::nullopt;
}

/// Sets `field` from a parameter's text, converted to the field's type (no JSON involved).
/// `text` is NUL-terminated (a whole std::string of the request's fields).
absl::Status set_param(capnp::DynamicStruct::Builder out, const FieldInfo& f, std::string_view name,
                       std::string_view text) {
  auto wrong = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", av(name), "' must be ", av(what), ", not '", av(text), "'"));
  };
  const capnp::StructSchema::Field& field = f.field;
  if (f.pointer >= 0) {
    // What DynamicStruct::Builder::set does for such a field, without reading the schema again
    // (about 500 instructions per parameter).
    auto slots = out.as<capnp::AnyStruct>().getPointerSection();
    if (static_cast<unsigned>(f.pointer) < slots.size()) {
      if (f.type == capnp::schema::Type::TEXT) {
        slots[f.pointer].setAs<capnp::Text>(capnp::Text::Reader(text.data(), text.size()));
      } else {
        slots[f.pointer].setAs<capnp::Data>(
            capnp::Data::Reader(reinterpret_cast<const kj::byte*>(text.data()), text.size()));
      }
      return absl::OkStatus();
    }
  }
  switch (f.type) {
    case capnp::schema::Type::TEXT:
      out.set(field, capnp::Text::Reader(text.data(), text.size()));
      return absl::OkStatus();
    case capnp::schema::Type::DATA:
      out.set(field,
              capnp::Data::Reader(reinterpret_cast<const kj::byte*>(text.data()), text.size()));
      return absl::OkStatus();
    default: break;
  }
  std::string value(text);
  switch (f.type) {
    case capnp::schema::Type::BOOL:
      if (value != "true" && value != "false") return wrong("true or false");
      out.set(field, value == "true");
      break;
    case capnp::schema::Type::INT8:
    case capnp::schema::Type::INT16:
    case capnp::schema::Type::INT32:
    case capnp::schema::Type::INT64: {
      int64_t v;
      if (!absl::SimpleAtoi(av(value), &v)) return wrong("an integer");
      out.set(field, v);  // the dynamic API range-checks (a kj exception: 400 below)
      break;
    }
    case capnp::schema::Type::UINT8:
    case capnp::schema::Type::UINT16:
    case capnp::schema::Type::UINT32:
    case capnp::schema::Type::UINT64: {
      uint64_t v;
      if (!absl::SimpleAtoi(av(value), &v)) return wrong("an unsigned integer");
      out.set(field, v);
      break;
    }
    case capnp::schema::Type::FLOAT32:
    case capnp::schema::Type::FLOAT64: {
      double v;
      if (!absl::SimpleAtod(av(value), &v)) return wrong("a number");
      out.set(field, v);
      break;
    }
    case capnp::schema::Type::ENUM: {
      capnp::EnumSchema e = field.getType().asEnum();
      KJ_IF_MAYBE (en, e.findEnumerantByName(value.c_str())) {
        out.set(field, capnp::DynamicEnum(*en));
      } else {
        return wrong("one of the enumerants of " + std::string(e.getShortDisplayName().cStr()));
      }
      break;
    }
    default: return wrong("JSON in the body (its field is a struct or a list)");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status fill(const Request& req, capnp::DynamicStruct::Builder out) {
  try {
    // Parameters that name a field, path ones first (a query parameter cannot override them).
    capnp::StructSchema schema = out.getSchema();
    struct Param {
      FieldInfo field;
      std::string_view name, value;
    };
    absl::InlinedVector<Param, 4> params;
    auto take = [&](const Request::Fields& fields) {
      for (const auto& [k, v] : fields) {
        if (std::optional<FieldInfo> f = find_field(schema, k)) {
          bool seen = false;
          for (const Param& p : params) seen = seen || p.name == k;
          if (!seen) params.push_back(Param{*f, k, v});
        }
      }
    };
    take(req.params());
    take(req.query());

    std::string_view text = req.body();
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
      // No body (a GET): the parameters go straight into their fields.
      for (const Param& p : params) {
        if (absl::Status st = set_param(out, p.field, p.name, p.value); !st.ok()) return st;
      }
      return absl::OkStatus();
    }

    capnp::MallocMessageBuilder scratch(256);
    auto body = scratch.initRoot<capnp::JsonValue>();
    codec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), body);
    if (!body.isObject()) return absl::InvalidArgumentError("the body must be a JSON object");
    if (params.empty()) {
      codec().decode(body.asReader(), out);
      return absl::OkStatus();
    }
    // The body's fields that no parameter overrides go through the codec; the parameters are
    // set afterwards.
    auto fields = body.asReader().getObject();
    std::vector<capnp::JsonValue::Field::Reader> kept;
    for (auto f : fields) {
      bool overridden = false;
      for (const Param& p : params) overridden = overridden || p.name == f.getName().cStr();
      if (!overridden) kept.push_back(f);
    }
    auto merged = scratch.getOrphanage().newOrphan<capnp::JsonValue>();
    auto obj = merged.get().initObject(static_cast<unsigned>(kept.size()));
    for (unsigned i = 0; i < kept.size(); ++i) {
      obj[i].setName(kept[i].getName());
      obj[i].setValue(kept[i].getValue());
    }
    codec().decode(merged.getReader(), out);
    for (const Param& p : params) {
      if (absl::Status st = set_param(out, p.field, p.name, p.value); !st.ok()) return st;
    }
    return absl::OkStatus();
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad request: ", e.getDescription().cStr()));
  }
}

std::string encode(capnp::DynamicValue::Reader value, capnp::Type type) {
  kj::String s = codec().encode(value, type);
  return std::string(s.cStr(), s.size());
}

void check_fields(capnp::StructSchema schema, const std::vector<std::string>& names,
                  std::string_view route) {
  for (const std::string& n : names) {
    if (schema.findFieldByName(kj::StringPtr(n.c_str())) == nullptr) {
      throw std::invalid_argument(absl::StrCat("bus::http: route ", av(route), ": path parameter '",
                                               n, "' names no field of ",
                                               schema.getShortDisplayName().cStr()));
    }
  }
}

}  // namespace bus::http::detail
