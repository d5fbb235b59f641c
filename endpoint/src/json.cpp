// JSON <-> Cap'n Proto through Cap'n Proto's JSON codec (capnp-json).
#include "bus/http/json.hpp"

#include <absl/container/flat_hash_map.h>
#include <absl/container/inlined_vector.h>
#include <absl/strings/match.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <capnp/any.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/encoding.h>

#include <limits>
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
/// schema's encoded node on each call, a cost per parameter and request, so the fields found
/// are kept per thread and schema; names that are no field are looked up each time
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
  if (name.find('\0') != std::string_view::npos) return std::nullopt;  // "id%00x" is not "id"
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

/// Why a percent-decoded parameter cannot be a Text field's value, or empty. A NUL would cut it
/// short (Cap'n Proto Text is a C string) and replies and JSON bodies are UTF-8: both are refused
/// (400) rather than silently changed. Data fields take any bytes.
std::string bad_text(std::string_view kind, std::string_view name, std::string_view value) {
  if (value.find('\0') != std::string_view::npos) {
    return absl::StrCat(av(kind), " parameter '", av(name),
                        "' holds a NUL (%00), which no text may contain");
  }
  for (char c : value) {
    if (static_cast<unsigned char>(c) >= 0x80) {
      // Only a value with non-ASCII bytes needs the (allocating) check.
      if (kj::encodeUtf32(kj::ArrayPtr<const char>(value.data(), value.size())).hadErrors) {
        return absl::StrCat(av(kind), " parameter '", av(name),
                            "' is not UTF-8 once percent-decoded");
      }
      break;
    }
  }
  return {};
}

/// Sets `field` from a parameter's text, converted to the field's type (no JSON involved).
/// `text` is NUL-terminated (a whole std::string of the request's fields).
absl::Status set_param(capnp::DynamicStruct::Builder out, const FieldInfo& f, std::string_view kind,
                       std::string_view name, std::string_view text) {
  if (f.type == capnp::schema::Type::TEXT) {
    if (std::string why = bad_text(kind, name, text); !why.empty()) {
      return absl::InvalidArgumentError(why);
    }
  }
  auto wrong = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", av(name), "' must be ", av(what), ", not '", av(text), "'"));
  };
  const capnp::StructSchema::Field& field = f.field;
  if (f.pointer >= 0) {
    // What DynamicStruct::Builder::set does for such a field, without reading the schema again.
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
      int bits = f.type == capnp::schema::Type::INT8    ? 8
                 : f.type == capnp::schema::Type::INT16 ? 16
                 : f.type == capnp::schema::Type::INT32 ? 32
                                                        : 64;
      int64_t hi =
          bits == 64 ? std::numeric_limits<int64_t>::max() : (int64_t{1} << (bits - 1)) - 1;
      int64_t lo = -hi - 1;
      int64_t v;
      if (!absl::SimpleAtoi(av(value), &v) || v < lo || v > hi) {
        return wrong(absl::StrCat("an integer from ", lo, " to ", hi));
      }
      out.set(field, v);
      break;
    }
    case capnp::schema::Type::UINT8:
    case capnp::schema::Type::UINT16:
    case capnp::schema::Type::UINT32:
    case capnp::schema::Type::UINT64: {
      int bits = f.type == capnp::schema::Type::UINT8    ? 8
                 : f.type == capnp::schema::Type::UINT16 ? 16
                 : f.type == capnp::schema::Type::UINT32 ? 32
                                                         : 64;
      uint64_t hi = bits == 64 ? std::numeric_limits<uint64_t>::max() : (uint64_t{1} << bits) - 1;
      uint64_t v;
      if (!absl::SimpleAtoi(av(value), &v) || v > hi) {
        return wrong(absl::StrCat("an integer from 0 to ", hi));
      }
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

/// The JSON type of `v`, as a caller reads it.
std::string_view json_type(capnp::JsonValue::Reader v) {
  switch (v.which()) {
    case capnp::JsonValue::NULL_: return "null";
    case capnp::JsonValue::BOOLEAN: return "a boolean";
    case capnp::JsonValue::NUMBER: return "a number";
    case capnp::JsonValue::STRING: return "a string";
    case capnp::JsonValue::ARRAY: return "an array";
    case capnp::JsonValue::OBJECT: return "an object";
    default: return "a value";
  }
}

/// An integer field's range, for a message that says what would fit.
template <class T>
std::string int_range() {
  return absl::StrCat("an integer from ", std::numeric_limits<T>::min(), " to ",
                      std::numeric_limits<T>::max());
}

/// Whether `v` (a JSON number, or a string as the codec writes 64-bit integers) is an integer
/// of T's range.
template <class T>
bool fits(capnp::JsonValue::Reader v) {
  if (v.isNumber()) {
    double d = v.getNumber();
    return d == static_cast<double>(static_cast<int64_t>(d)) &&
           d >= static_cast<double>(std::numeric_limits<T>::min()) &&
           d <= static_cast<double>(std::numeric_limits<T>::max());
  }
  if constexpr (sizeof(T) == 8) {
    T n;
    return v.isString() &&
           absl::SimpleAtoi(absl::string_view(v.getString().cStr(), v.getString().size()), &n);
  }
  return false;
}

std::string explain_struct(capnp::JsonValue::Reader v, capnp::StructSchema schema,
                           const std::string& path);

/// How an error names the value at `path` ("address.street", "tags[2]"; "" is the body).
std::string label(const std::string& path) {
  return path.empty() ? std::string("the body") : absl::StrCat("field '", path, "'");
}

/// Why `v` is not a `type`, in JSON terms ("must be an integer from 0 to 255, not a string"),
/// or empty when it is.
std::string explain_value(capnp::JsonValue::Reader v, capnp::Type type, const std::string& path) {
  if (v.isNull()) return {};  // the codec leaves the field unset
  const std::string where = label(path);
  auto need = [&](std::string_view what) {
    return absl::StrCat(where, " must be ", av(what), ", not ", av(json_type(v)));
  };
  switch (type.which()) {
    case capnp::schema::Type::BOOL: return v.isBoolean() ? "" : need("true or false");
    case capnp::schema::Type::INT8: return fits<int8_t>(v) ? "" : need(int_range<int8_t>());
    case capnp::schema::Type::INT16: return fits<int16_t>(v) ? "" : need(int_range<int16_t>());
    case capnp::schema::Type::INT32: return fits<int32_t>(v) ? "" : need(int_range<int32_t>());
    case capnp::schema::Type::INT64:
      return fits<int64_t>(v) ? "" : need(int_range<int64_t>() + " (a number or a string)");
    case capnp::schema::Type::UINT8: return fits<uint8_t>(v) ? "" : need(int_range<uint8_t>());
    case capnp::schema::Type::UINT16: return fits<uint16_t>(v) ? "" : need(int_range<uint16_t>());
    case capnp::schema::Type::UINT32: return fits<uint32_t>(v) ? "" : need(int_range<uint32_t>());
    case capnp::schema::Type::UINT64:
      return fits<uint64_t>(v) ? "" : need(int_range<uint64_t>() + " (a number or a string)");
    case capnp::schema::Type::FLOAT32:
    case capnp::schema::Type::FLOAT64: return v.isNumber() ? "" : need("a number");
    case capnp::schema::Type::TEXT: return v.isString() ? "" : need("a string");
    case capnp::schema::Type::DATA: {
      if (!v.isArray()) return need("an array of bytes (integers from 0 to 255)");
      unsigned i = 0;
      for (auto e : v.getArray()) {
        if (!fits<uint8_t>(e)) {
          return absl::StrCat(label(absl::StrCat(path, "[", i, "]")), " must be a byte (0 to 255)");
        }
        ++i;
      }
      return {};
    }
    case capnp::schema::Type::ENUM: {
      capnp::EnumSchema e = type.asEnum();
      if (v.isString()) {
        if (e.findEnumerantByName(v.getString()) != nullptr) return {};
      } else if (v.isNumber()) {
        return {};
      }
      std::string names;
      for (auto en : e.getEnumerants()) {
        absl::StrAppend(&names, names.empty() ? "" : ", ", en.getProto().getName().cStr());
      }
      if (v.isString()) {
        return absl::StrCat(where, " must be one of ", names, ", not '", v.getString().cStr(), "'");
      }
      return need("one of " + names);
    }
    case capnp::schema::Type::STRUCT: return explain_struct(v, type.asStruct(), path);
    case capnp::schema::Type::LIST: {
      if (!v.isArray()) return need("an array");
      capnp::Type element = type.asList().getElementType();
      unsigned i = 0;
      for (auto e : v.getArray()) {
        std::string why = explain_value(e, element, absl::StrCat(path, "[", i++, "]"));
        if (!why.empty()) return why;
      }
      return {};
    }
    default: return {};
  }
}

/// Why `v` is not a `schema` struct: not an object, an unknown field (the known ones listed), or
/// a field of the wrong type. Empty when nothing is found.
std::string explain_struct(capnp::JsonValue::Reader v, capnp::StructSchema schema,
                           const std::string& path) {
  if (!v.isObject()) {
    return absl::StrCat(label(path), " must be an object (", schema.getShortDisplayName().cStr(),
                        "), not ", av(json_type(v)));
  }
  for (auto f : v.getObject()) {
    std::string name = absl::StrCat(path, path.empty() ? "" : ".", f.getName().cStr());
    KJ_IF_MAYBE (field, schema.findFieldByName(f.getName())) {
      std::string why = explain_value(f.getValue(), field->getType(), name);
      if (!why.empty()) return why;
    } else {
      std::string known;
      for (auto k : schema.getFields()) {
        absl::StrAppend(&known, known.empty() ? "" : ", ", k.getProto().getName().cStr());
      }
      return absl::StrCat("unknown field '", name, "' (", schema.getShortDisplayName().cStr(),
                          " has: ", known, ")");
    }
  }
  return {};
}

/// A failed decode of `body` into `schema`, in the caller's terms.
absl::Status body_error(capnp::JsonValue::Reader body, capnp::StructSchema schema) {
  std::string why = explain_struct(body, schema, "");
  if (why.empty()) {
    why = absl::StrCat("the body does not fit ", schema.getShortDisplayName().cStr());
  }
  return absl::InvalidArgumentError(why);
}

}  // namespace

absl::Status fill(const Request& req, capnp::DynamicStruct::Builder out) {
  try {
    // Parameters that name a field, path ones first (a query parameter cannot override them).
    capnp::StructSchema schema = out.getSchema();
    struct Param {
      FieldInfo field;
      std::string_view kind, name, value;
    };
    absl::InlinedVector<Param, 4> params;
    auto take = [&](const Request::Fields& fields, std::string_view kind) {
      for (const auto& [k, v] : fields) {
        if (std::optional<FieldInfo> f = find_field(schema, k)) {
          bool seen = false;
          for (const Param& p : params) seen = seen || p.name == k;
          if (!seen) params.push_back(Param{*f, kind, k, v});
        }
      }
    };
    take(req.params(), "path");
    take(req.query(), "query");

    std::string_view text = req.body();
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
      // No body (a GET): the parameters go straight into their fields.
      for (const Param& p : params) {
        if (absl::Status st = set_param(out, p.field, p.kind, p.name, p.value); !st.ok()) return st;
      }
      return absl::OkStatus();
    }

    capnp::MallocMessageBuilder scratch(256);
    auto body = scratch.initRoot<capnp::JsonValue>();
    try {
      codec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), body);
    } catch (const kj::Exception& e) {
      return absl::InvalidArgumentError(
          absl::StrContains(e.getDescription().cStr(), "nest")
              ? "the body is not valid JSON: it nests deeper than 64 levels"
              : "the body is not valid JSON");
    }
    if (!body.isObject()) return body_error(body.asReader(), schema);
    if (params.empty()) {
      try {
        codec().decode(body.asReader(), out);
      } catch (const kj::Exception&) {
        return body_error(body.asReader(), schema);
      }
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
    try {
      codec().decode(merged.getReader(), out);
    } catch (const kj::Exception&) {
      return body_error(merged.getReader(), schema);
    }
    for (const Param& p : params) {
      if (absl::Status st = set_param(out, p.field, p.kind, p.name, p.value); !st.ok()) return st;
    }
    return absl::OkStatus();
  } catch (const kj::Exception& e) {
    // Not expected (the codec's errors are taken above): still the caller's fault, as 400.
    return absl::InvalidArgumentError(
        absl::StrCat("the request does not fit ", out.getSchema().getShortDisplayName().cStr()));
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
