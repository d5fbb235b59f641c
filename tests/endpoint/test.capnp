# Messages of the HTTP endpoint tests: one field of each kind the JSON mapping converts.
@0xd87658ba730ac8f4;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("endpoint_test");

struct Order {
  id @0 :UInt32;
  customer @1 :Text;
  quantity @2 :Int32;
  price @3 :Float64;
  express @4 :Bool;
  kind @5 :Kind;
  big @6 :Int64;
  address @7 :Address;

  enum Kind {
    standard @0;
    gift @1;
  }
}

struct Address {
  street @0 :Text;
  city @1 :Text;
}

# A request with no fields (a literal route).
struct Empty {}

# A blocking route's request: `tag` says which request it is.
struct Tagged {
  tag @0 :Text;
}

# Text and data parameters: a data field, and a text field in the struct's union (which the
# mapping must select as well as set).
struct Note {
  blob @0 :Data;
  union {
    none @1 :Void;
    text @2 :Text;
  }
}
