# Messages of the multi-process demo (examples/demo).
@0xa543b0e4c51ddfea;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("demo");

# Published by the producer on "demo.readings".
struct Reading {
  sensor @0 :Text;
  value @1 :Float64;
  seq @2 :UInt64;      # per-producer counter, starting at 1
  unixNanos @3 :Int64; # when it was taken
}

# Asked of the aggregator on "demo.stats".
struct StatsRequest {
  sensor @0 :Text;     # empty: every sensor
}

struct StatsReply {
  readings @0 :UInt64;
  sensors @1 :List(SensorStats);
  missed @2 :UInt64;   # readings the aggregator saw gaps for (per-producer seq)
}

struct SensorStats {
  sensor @0 :Text;
  count @1 :UInt64;
  mean @2 :Float64;
  min @3 :Float64;
  max @4 :Float64;
  last @5 :Float64;
}
