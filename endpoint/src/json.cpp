// JSON <-> Cap'n Proto through Cap'n Proto's JSON codec (capnp-json).
#include "bus/http/json.hpp"

#include <absl/container/inlined_vector.h>
#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>

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

/// Sets `field` from a parameter's text, converted to the field's type (no JSON involved).
absl::Status set_param(capnp::DynamicStruct::Builder out, capnp::StructSchema::Field field,
                       std::string_view name, std::string_view text) {
  auto wrong = [&](std::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", av(name), "' must be ", av(what), ", not '", av(text), "'"));
  };
  std::string value(text);  // NUL-terminated, as Cap'n Proto's text readers want
  switch (field.getType().which()) {
    case capnp::schema::Type::TEXT: out.set(field, capnp::Text::Reader(value.c_str())); break;
    case capnp::schema::Type::DATA:
      out.set(field,
              capnp::Data::Reader(reinterpret_cast<const kj::byte*>(value.data()), value.size()));
      break;
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
      capnp::StructSchema::Field field;
      std::string_view name, value;
    };
    absl::InlinedVector<Param, 4> params;
    auto take = [&](const Request::Fields& fields) {
      for (const auto& [k, v] : fields) {
        KJ_IF_MAYBE (f, schema.findFieldByName(kj::StringPtr(k.c_str()))) {
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
