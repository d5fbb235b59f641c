// What the JSON codec reads and writes, as JSON Schema. The rules were read off capnp-json 0.9.2
// itself (tests/endpoint/openapi_test.cpp checks real replies and requests against them):
//   written: every non-pointer field (Void as null, 64-bit integers as decimal strings, NaN and
//     infinities as "NaN"/"Infinity"/"-Infinity", enums by name); a text, data, list or struct
//     field only when set; of a union, the member set; Data as an array of bytes.
//   read: any field may be missing (it keeps its default); integers from numbers with no
//     fraction or from strings holding one, floats from numbers, strings or null; no null for
//     a text, data, list, struct, enum or integer; enums by name only; unknown fields refused
//     (the endpoint's codec sets rejectUnknownFields); of a union's members given, the last.
// The endpoint registers no annotation handlers, so $Json.name, $Json.base64 and the like do not
// apply and the schemas ignore them too.
#include "json_schema.hpp"

#include <absl/strings/str_cat.h>
#include <capnp/dynamic.h>
#include <capnp/message.h>

#include <cmath>
#include <limits>

#include "bus/http/json.hpp"

namespace bus::http::detail {

JsonOrphan json_string(capnp::Orphanage o, std::string_view s) {
  JsonOrphan v = o.newOrphan<capnp::JsonValue>();
  v.get().setString(capnp::Text::Reader(s.data(), s.size()));
  return v;
}

JsonOrphan json_number(capnp::Orphanage o, double n) {
  JsonOrphan v = o.newOrphan<capnp::JsonValue>();
  v.get().setNumber(n);
  return v;
}

JsonOrphan json_bool(capnp::Orphanage o, bool b) {
  JsonOrphan v = o.newOrphan<capnp::JsonValue>();
  v.get().setBoolean(b);
  return v;
}

JsonObject& JsonObject::add(std::string_view name, JsonOrphan value) {
  members_.emplace_back(std::string(name), std::move(value));
  return *this;
}

JsonOrphan JsonObject::finish() {
  JsonOrphan v = orphanage_.newOrphan<capnp::JsonValue>();
  auto fields = v.get().initObject(static_cast<unsigned>(members_.size()));
  for (unsigned i = 0; i < members_.size(); ++i) {
    fields[i].setName(members_[i].first);
    fields[i].adoptValue(std::move(members_[i].second));
  }
  members_.clear();
  return v;
}

JsonOrphan JsonArray::finish() {
  JsonOrphan v = orphanage_.newOrphan<capnp::JsonValue>();
  auto items = v.get().initArray(static_cast<unsigned>(elements_.size()));
  for (unsigned i = 0; i < elements_.size(); ++i) {
    items.setWithCaveats(i, elements_[i].getReader());
  }
  elements_.clear();
  return v;
}

namespace {

using Which = capnp::schema::Type::Which;

bool is_pointer(capnp::Type t) {
  switch (t.which()) {
    case Which::TEXT:
    case Which::DATA:
    case Which::LIST:
    case Which::STRUCT:
    case Which::INTERFACE:
    case Which::ANY_POINTER: return true;
    default: return false;
  }
}

/// Bits and signedness of an integer type; {0, false} for others.
std::pair<int, bool> integer_of(capnp::Type t) {
  switch (t.which()) {
    case Which::INT8: return {8, true};
    case Which::INT16: return {16, true};
    case Which::INT32: return {32, true};
    case Which::INT64: return {64, true};
    case Which::UINT8: return {8, false};
    case Which::UINT16: return {16, false};
    case Which::UINT32: return {32, false};
    case Which::UINT64: return {64, false};
    default: return {0, false};
  }
}

/// minimum and maximum of an integer type of at most 32 bits (wider bounds are not exact as the
/// doubles JSON numbers are).
void add_range(JsonObject& s, capnp::Orphanage o, int bits, bool is_signed) {
  if (bits > 32) {
    if (!is_signed) s.add("minimum", json_number(o, 0));
    return;
  }
  double hi = is_signed ? std::ldexp(1.0, bits - 1) - 1 : std::ldexp(1.0, bits) - 1;
  double lo = is_signed ? -hi - 1 : 0;
  s.add("minimum", json_number(o, lo));
  s.add("maximum", json_number(o, hi));
}

JsonArray enumerants(capnp::Orphanage o, capnp::EnumSchema e) {
  JsonArray names(o);
  for (auto en : e.getEnumerants()) names.add(std::string_view(en.getProto().getName().cStr()));
  return names;
}

JsonArray types(capnp::Orphanage o, std::initializer_list<std::string_view> names) {
  JsonArray a(o);
  for (std::string_view n : names) a.add(n);
  return a;
}

}  // namespace

JsonOrphan JsonSchemas::of(capnp::Type type, Direction d) { return schema_of(type, d).finish(); }

JsonObject JsonSchemas::schema_of(capnp::Type type, Direction d) {
  capnp::Orphanage o = orphanage_;
  const bool in = d == Direction::kIn;
  JsonObject s(o);
  switch (type.which()) {
    case Which::VOID:
      // Written as null; read from anything (the value is ignored).
      if (!in) s.add("type", "null");
      break;
    case Which::BOOL: s.add("type", "boolean"); break;
    case Which::INT8:
    case Which::INT16:
    case Which::INT32:
    case Which::UINT8:
    case Which::UINT16:
    case Which::UINT32:
    case Which::INT64:
    case Which::UINT64: {
      auto [bits, is_signed] = integer_of(type);
      if (bits == 64 && !in) {
        // JSON numbers are doubles: the codec writes 64-bit integers as decimal strings.
        s.add("type", "string");
        s.add("pattern", is_signed ? "^-?[0-9]+$" : "^[0-9]+$");
        break;
      }
      if (in) {
        // Read from a number with no fraction, or from a string holding an integer (the
        // pattern applies to strings only).
        s.add("type", types(o, {"integer", "string"}).finish());
        s.add("pattern", is_signed ? "^-?[0-9]+$" : "^[0-9]+$");
      } else {
        s.add("type", "integer");
      }
      if (bits == 32 && is_signed) s.add("format", "int32");
      if (bits == 64) s.add("format", "int64");
      add_range(s, o, bits, is_signed);
      break;
    }
    case Which::FLOAT32:
    case Which::FLOAT64:
      if (in) {
        s.add("type", types(o, {"number", "string", "null"}).finish());
      } else {
        JsonObject number(o);
        number.add("type", "number");
        number.add("format", type.which() == Which::FLOAT32 ? "float" : "double");
        JsonObject special(o);
        special.add("enum", types(o, {"NaN", "Infinity", "-Infinity"}).finish());
        s.add("anyOf", JsonArray(o).add(std::move(number)).add(std::move(special)).finish());
      }
      break;
    case Which::TEXT: s.add("type", "string"); break;
    case Which::DATA: {
      JsonObject byte(o);
      byte.add("type", in ? types(o, {"integer", "string"}).finish() : json_string(o, "integer"));
      add_range(byte, o, 8, false);
      s.add("type", "array");
      s.add("items", std::move(byte));
      break;
    }
    case Which::LIST:
      s.add("type", "array");
      s.add("items", of(type.asList().getElementType(), d));
      break;
    case Which::ENUM:
      s.add("type", "string");
      s.add("enum", enumerants(o, type.asEnum()).finish());
      break;
    case Which::STRUCT: s.add("$ref", ref(type.asStruct(), d)); break;
    case Which::INTERFACE:
    case Which::ANY_POINTER:
      s.add("description", "not available in JSON");
      if (in) s.add("not", JsonObject(o));
      break;
  }
  return s;
}

bool JsonSchemas::settable_from_text(capnp::Type type) {
  switch (type.which()) {
    case Which::VOID:
    case Which::LIST:
    case Which::STRUCT:
    case Which::INTERFACE:
    case Which::ANY_POINTER: return false;
    default: return true;
  }
}

JsonOrphan JsonSchemas::parameter(capnp::Type type) {
  // What the server accepts in a parameter's text (json.cpp's set_param), not JSON.
  capnp::Orphanage o = orphanage_;
  JsonObject s(o);
  switch (type.which()) {
    case Which::BOOL: s.add("type", "boolean"); break;
    case Which::FLOAT32:
    case Which::FLOAT64: s.add("type", "number"); break;
    case Which::ENUM:
      s.add("type", "string");
      s.add("enum", enumerants(o, type.asEnum()).finish());
      break;
    case Which::DATA:
      s.add("type", "string");
      s.add("description", "any bytes, percent-encoded");
      break;
    case Which::TEXT: s.add("type", "string"); break;
    default: {
      auto [bits, is_signed] = integer_of(type);
      if (bits == 0) break;  // not settable from text: any text is refused (400)
      s.add("type", "integer");
      if (bits == 32 && is_signed) s.add("format", "int32");
      if (bits == 64) s.add("format", "int64");
      add_range(s, o, bits, is_signed);
    }
  }
  return std::move(s).finish();
}

std::string JsonSchemas::component_name(capnp::StructSchema s) {
  uint64_t id = s.getProto().getId();
  if (auto it = names_.find(id); it != names_.end()) return it->second;
  // "bus/schemas/http.capnp:Health.Executor" -> "Health.Executor"; the file's id tells apart two
  // structs of the same name in different files.
  std::string_view display = s.getProto().getDisplayName().cStr();
  std::string name(display.substr(display.find(':') + 1));
  if (taken_.count(name) != 0) name = absl::StrCat(name, "_", absl::Hex(id));
  taken_[name] = id;
  names_[id] = name;
  return name;
}

std::string JsonSchemas::ref(capnp::StructSchema s, Direction d) {
  auto key = std::make_pair(s.getProto().getId(), d);
  if (auto it = made_.find(key); it != made_.end()) return "#/components/schemas/" + it->second;
  std::string name = component_name(s);
  if (d == Direction::kIn) name += ".input";
  made_[key] = name;  // before its fields: a struct may contain itself
  components_.emplace(name, struct_schema(s, d, true));
  return "#/components/schemas/" + name;
}

JsonOrphan JsonSchemas::struct_schema(capnp::StructSchema s, Direction d, bool component) {
  capnp::Orphanage o = orphanage_;
  const bool in = d == Direction::kIn;
  capnp::MallocMessageBuilder scratch(64);
  capnp::DynamicStruct::Reader defaults = component
                                              ? scratch.initRoot<capnp::DynamicStruct>(s).asReader()
                                              : capnp::DynamicStruct::Reader();

  JsonObject schema(o);
  schema.add("type", "object");
  if (component) {
    std::string_view display = s.getProto().getDisplayName().cStr();
    schema.add("title", display.substr(display.find(':') + 1));
  }
  JsonObject properties(o);
  JsonArray required(o);
  std::vector<std::string> members;  // of the unnamed union
  for (capnp::StructSchema::Field field : s.getFields()) {
    auto proto = field.getProto();
    capnp::Type type = field.getType();
    if (type.isInterface() || type.isAnyPointer()) continue;  // the codec has no JSON for them
    std::string name = proto.getName().cStr();
    bool member = proto.getDiscriminantValue() != capnp::schema::Field::NO_DISCRIMINANT;
    JsonOrphan property;
    if (proto.isGroup()) {
      property = struct_schema(type.asStruct(), d, false);
    } else {
      JsonObject p = schema_of(type, d);
      if (in && component && !member && !is_pointer(type) && !type.isVoid()) {
        // What a missing field is read as, written by the codec itself.
        JsonOrphan value = o.newOrphan<capnp::JsonValue>();
        codec().encode(defaults.get(field), type, value.get());
        p.add("default", std::move(value));
      }
      property = std::move(p).finish();
    }
    properties.add(name, std::move(property));
    if (member) {
      members.push_back(name);
    } else if (!in && (proto.isGroup() || !is_pointer(type))) {
      required.add(name);  // written whatever its value
    }
  }
  if (members.size() > 1) {
    std::string list;
    for (const std::string& m : members) absl::StrAppend(&list, list.empty() ? "" : ", ", m);
    schema.add("description",
               in ? absl::StrCat("A union: at most one of ", list,
                                 " (given several, the last one is taken).")
                  : absl::StrCat("A union: one of ", list,
                                 " (a text, data, list or struct member is left out when unset)."));
    if (!in) {
      // No two members written together.
      JsonObject exclusive(o);
      for (const std::string& m : members) {
        JsonArray others(o);
        for (const std::string& other : members) {
          if (other != m)
            others.add(JsonObject(o).add("required", JsonArray(o).add(other).finish()));
        }
        exclusive.add(
            m, JsonObject(o).add("not", JsonObject(o).add("anyOf", std::move(others).finish())));
      }
      schema.add("dependentSchemas", std::move(exclusive));
    }
  }
  if (!properties.empty()) schema.add("properties", std::move(properties));
  if (!required.empty()) schema.add("required", std::move(required).finish());
  // Unknown fields are refused in requests, and replies have none.
  schema.add("additionalProperties", json_bool(o, false));
  return std::move(schema).finish();
}

JsonOrphan JsonSchemas::finish() && {
  JsonObject all(orphanage_);
  for (auto& [name, schema] : components_) all.add(name, std::move(schema));
  components_.clear();
  return std::move(all).finish();
}

}  // namespace bus::http::detail
