// JSON <-> Cap'n Proto through Cap'n Proto's JSON codec (capnp-json).
#include "bus/http/json.hpp"

#include <absl/strings/numbers.h>
#include <absl/strings/str_cat.h>
#include <capnp/compat/json.h>
#include <capnp/message.h>

#include <stdexcept>

namespace bus::http::detail {
namespace {

/// One codec per thread: construction allocates, and encode/decode keep no state between calls.
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

// Debian's Abseil has its own string_view type.
absl::string_view av(std::string_view s) { return {s.data(), s.size()}; }

/// Sets `out` to the JSON form of a parameter's text for `field`'s type.
absl::Status param_value(capnp::StructSchema::Field field, std::string_view name,
                         std::string_view text, capnp::JsonValue::Builder out) {
  capnp::Type t = field.getType();
  if (t.isBool()) {
    if (text == "true" || text == "false") {
      out.setBoolean(text == "true");
      return absl::OkStatus();
    }
    return absl::InvalidArgumentError(
        absl::StrCat("parameter '", av(name), "' must be true or false, not '", av(text), "'"));
  }
  if (t.isFloat32() || t.isFloat64()) {
    double d;
    if (!absl::SimpleAtod(av(text), &d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", av(name), "' must be a number, not '", av(text), "'"));
    }
    out.setNumber(d);
    return absl::OkStatus();
  }
  // Text, Data, enums (by enumerant name) and integers (the codec parses and range-checks
  // integers given as strings, as it writes 64-bit ones) all go as JSON strings.
  out.setString(kj::StringPtr(std::string(text).c_str()));
  return absl::OkStatus();
}

}  // namespace

absl::Status fill(const Request& req, capnp::DynamicStruct::Builder out) {
  try {
    capnp::MallocMessageBuilder scratch;
    auto body = scratch.initRoot<capnp::JsonValue>();
    std::string_view text = req.body();
    if (text.find_first_not_of(" \t\r\n") == std::string_view::npos) {
      body.initObject(0);
    } else {
      codec().decodeRaw(kj::ArrayPtr<const char>(text.data(), text.size()), body);
      if (!body.isObject()) return absl::InvalidArgumentError("the body must be a JSON object");
    }

    // Parameters that name a field, path ones first (a query parameter cannot override them).
    capnp::StructSchema schema = out.getSchema();
    struct Param {
      capnp::StructSchema::Field field;
      std::string_view name, value;
    };
    std::vector<Param> params;
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
    if (params.empty()) {
      codec().decode(body.asReader(), out);
      return absl::OkStatus();
    }

    auto fields = body.asReader().getObject();
    std::vector<capnp::JsonValue::Field::Reader> kept;
    for (auto f : fields) {
      bool overridden = false;
      for (const Param& p : params) overridden = overridden || p.name == f.getName().cStr();
      if (!overridden) kept.push_back(f);
    }
    auto merged = scratch.getOrphanage().newOrphan<capnp::JsonValue>();
    auto obj = merged.get().initObject(static_cast<unsigned>(kept.size() + params.size()));
    unsigned i = 0;
    for (auto f : kept) {
      obj[i].setName(f.getName());
      obj[i++].setValue(f.getValue());
    }
    for (const Param& p : params) {
      obj[i].setName(kj::StringPtr(std::string(p.name).c_str()));
      if (absl::Status st = param_value(p.field, p.name, p.value, obj[i++].initValue()); !st.ok()) {
        return st;
      }
    }
    codec().decode(merged.getReader(), out);
    return absl::OkStatus();
  } catch (const kj::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("bad JSON: ", e.getDescription().cStr()));
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
