# The message the bridge benchmark moves (bench/bridge_bus.cpp): a sequence number and opaque
# bytes, so that "a 64 B payload" is the same 64 user bytes for the bus, raw ZeroMQ and NATS.
@0xa721214437bda2c5;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("bench");

struct Blob {
  seq @0 :UInt64;   # 1, 2, 3, ... per run: the receiver checks order and loss
  data @1 :Data;    # payload size - 8 bytes of a fixed pattern: the receiver checks one byte
}
