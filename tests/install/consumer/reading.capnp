# The consumer's own message type: a user compiles their schemas in their own project.
@0xc0ffeed2b222a738;
using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("consumer");

struct Reading {
  sensor @0 :Text;
  value @1 :Float64;
}
