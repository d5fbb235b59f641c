# Membership through etcd: what a node registers under its key, and the few etcd v3 messages a
# node exchanges with etcd's JSON gateway (grpc-gateway's JSON of etcd's rpc.proto: 64-bit
# integers as strings, bytes in base64, field names as in the .proto). Read and written by
# Cap'n Proto's JSON codec; fields the gateway sends and these structs do not name are ignored.
@0xba08567b5b5a6ea7;

using Cxx = import "/capnp/c++.capnp";
using Json = import "/capnp/compat/json.capnp";
$Cxx.namespace("bus::schemas::membership");

# The value of `<prefix><node id in hex>`, held by a lease whose TTL follows the node's
# heartbeat x dead_after: written when the node starts and again when its channels change,
# deleted when it stops (the lease is revoked) or dies (the lease runs out).
struct Member {
  id @0 :Text;              # the node id, hex (as in the key)
  name @1 :Text;
  publish @2 :Text;         # where its publisher can be reached (topics, heartbeats)
  requests @3 :Text;        # where its request socket can be reached
  publicKey @4 :Text;       # CURVE public key (Z85), empty without CURVE
  exports @5 :List(Text);   # topics it publishes
  serves @6 :List(Text);    # endpoints and queues it serves
  imports @7 :List(Text);   # topics, endpoints and queues it uses
}

struct Header {
  revision @0 :Int64;
}

struct LeaseGrantRequest {
  ttl @0 :Int64 $Json.name("TTL");
}
struct LeaseGrantResponse {
  id @0 :Int64 $Json.name("ID");
  ttl @1 :Int64 $Json.name("TTL");
  error @2 :Text;
}

# Also the body of /v3/lease/keepalive and /v3/lease/revoke.
struct LeaseId {
  id @0 :Int64 $Json.name("ID");
}
# /v3/lease/keepalive answers `{"result": ...}`; a TTL of 0 (absent) means the lease is gone.
struct LeaseKeepAliveResponse {
  result @0 :LeaseGrantResponse;
}

struct PutRequest {
  key @0 :Data $Json.base64;
  value @1 :Data $Json.base64;
  lease @2 :Int64;
}

struct RangeRequest {
  key @0 :Data $Json.base64;
  rangeEnd @1 :Data $Json.base64 $Json.name("range_end");
}

struct KeyValue {
  key @0 :Data $Json.base64;
  value @1 :Data $Json.base64;
  modRevision @2 :Int64 $Json.name("mod_revision");
}

struct RangeResponse {
  header @0 :Header;
  kvs @1 :List(KeyValue);
}

struct WatchRequest {
  createRequest @0 :Create $Json.name("create_request");
  struct Create {
    key @0 :Data $Json.base64;
    rangeEnd @1 :Data $Json.base64 $Json.name("range_end");
    startRevision @2 :Int64 $Json.name("start_revision");
  }
}

struct Event {
  type @0 :Text;  # "DELETE", or absent for a put
  kv @1 :KeyValue;
}

# One line of /v3/watch's stream: `{"result": ...}`, or `{"error": ...}` when it ends badly.
struct WatchStreamItem {
  result @0 :Result;
  error @1 :Error;
  struct Result {
    header @0 :Header;
    created @1 :Bool;
    canceled @2 :Bool;
    compactRevision @3 :Int64 $Json.name("compact_revision");
    events @4 :List(Event);
  }
}

# What the gateway answers instead when a call fails.
struct Error {
  error @0 :Text;
  message @1 :Text;
  code @2 :Int32;
}
