// JSON Schema (draft 2020-12, the dialect of OpenAPI 3.1) for Cap'n Proto types, as the endpoint's
// JSON codec reads them from requests and writes them in replies, built as Cap'n Proto JsonValues
// for the same codec to write out.
#pragma once

#include <capnp/compat/json.h>
#include <capnp/orphan.h>
#include <capnp/schema.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace bus::http::detail {

using JsonOrphan = capnp::Orphan<capnp::JsonValue>;

JsonOrphan json_string(capnp::Orphanage o, std::string_view s);
JsonOrphan json_number(capnp::Orphanage o, double n);
JsonOrphan json_bool(capnp::Orphanage o, bool b);

class JsonArray;

/// A JSON object being built. JsonValue's objects are lists, sized when they are made; this
/// collects the members first (orphans, adopted without a copy by finish()). Adding an object
/// or an array finishes it: `JsonObject(o).add("type", "string")` can be added as it is.
class JsonObject {
 public:
  explicit JsonObject(capnp::Orphanage o) : orphanage_(o) {}
  JsonObject& add(std::string_view name, JsonOrphan value);
  JsonObject& add(std::string_view name, std::string_view text) {
    return add(name, json_string(orphanage_, text));
  }
  JsonObject& add(std::string_view name, const char* text) {
    return add(name, std::string_view(text));
  }
  JsonObject& add(std::string_view name, JsonObject& object) { return add(name, object.finish()); }
  JsonObject& add(std::string_view name, JsonObject&& object) { return add(name, object.finish()); }
  JsonObject& add(std::string_view name, JsonArray& array);
  JsonObject& add(std::string_view name, JsonArray&& array);
  bool empty() const { return members_.empty(); }
  /// The object; this is left empty.
  JsonOrphan finish();

 private:
  capnp::Orphanage orphanage_;
  std::vector<std::pair<std::string, JsonOrphan>> members_;
};

/// A JSON array being built (its elements are copied in by finish(): a list of structs holds
/// them inline).
class JsonArray {
 public:
  explicit JsonArray(capnp::Orphanage o) : orphanage_(o) {}
  JsonArray& add(JsonOrphan value) {
    elements_.push_back(std::move(value));
    return *this;
  }
  JsonArray& add(std::string_view text) { return add(json_string(orphanage_, text)); }
  JsonArray& add(const char* text) { return add(std::string_view(text)); }
  JsonArray& add(JsonObject& object) { return add(object.finish()); }
  JsonArray& add(JsonObject&& object) { return add(object.finish()); }
  bool empty() const { return elements_.empty(); }
  /// The array; this is left empty.
  JsonOrphan finish();

 private:
  capnp::Orphanage orphanage_;
  std::vector<JsonOrphan> elements_;
};

inline JsonObject& JsonObject::add(std::string_view name, JsonArray& array) {
  return add(name, array.finish());
}
inline JsonObject& JsonObject::add(std::string_view name, JsonArray&& array) {
  return add(name, array.finish());
}

/// Which way a schema describes a value. The codec reads more than it writes: a 64-bit integer
/// is written as a string and read from a string or a number, a missing field is read as its
/// default but every non-pointer field is written.
enum class Direction { kIn, kOut };

/// The JSON Schemas of the Cap'n Proto structs a document refers to, one component per struct
/// and direction ("Order" as replies are written, "Order.input" as requests are read).
class JsonSchemas {
 public:
  explicit JsonSchemas(capnp::Orphanage o) : orphanage_(o) {}

  /// The schema of a `type` value: a $ref for a struct (whose component is made on first use),
  /// inline for the rest.
  JsonOrphan of(capnp::Type type, Direction d);
  /// "#/components/schemas/<name>" of a struct, made on first use.
  std::string ref(capnp::StructSchema s, Direction d);
  /// A path or query parameter that sets a field of this type: the server converts the text
  /// itself (no JSON), so `123` for an integer, `true` for a Bool, an enumerant's name. False
  /// when such a field cannot be set from a parameter (a struct, a list).
  static bool settable_from_text(capnp::Type type);
  JsonOrphan parameter(capnp::Type type);

  /// components/schemas, in the order their names sort.
  JsonOrphan finish() &&;

 private:
  JsonObject schema_of(capnp::Type type, Direction d);
  JsonOrphan struct_schema(capnp::StructSchema s, Direction d, bool component);
  std::string component_name(capnp::StructSchema s);

  capnp::Orphanage orphanage_;
  std::map<std::string, JsonOrphan> components_;
  std::map<std::pair<uint64_t, Direction>, std::string> made_;  // struct id -> component name
  std::map<uint64_t, std::string> names_;                       // struct id -> base name
  std::map<std::string, uint64_t> taken_;                       // base name -> struct id
};

}  // namespace bus::http::detail
