# The JSON bodies the HTTP endpoint writes itself (bus::http): error replies and /health.
# They are Cap'n Proto structs so that Cap'n Proto's JSON codec writes (and escapes) them.
@0x8126815fc65bbe32;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("bus::schemas::http");

# Every error reply: {"error": "not_found", "detail": "no route for GET /nope"}.
struct ErrorBody {
  error @0 :Text;   # a stable, machine-readable name (bad_request, not_found, ...)
  detail @1 :Text;  # what went wrong, for a human
}

# GET /health.
struct Health {
  status @0 :Text;               # "ok" or "unavailable" (HTTP 200 or 503)
  executors @1 :List(Executor);
  services @2 :List(Service);
  bridge @3 :Bridge;

  struct Executor {
    index @0 :UInt32;
    alive @1 :Bool;              # answered a probe within the health timeout
  }
  struct Service {
    route @0 :Text;              # "GET /greeting/{name}"
    endpoint @1 :Text;           # the bus endpoint it calls
    handlers @2 :UInt32;         # servers in this process plus live remote nodes serving it
  }
  struct Bridge {
    enabled @0 :Bool;            # a bus::net::Node is attached to the server
    node @1 :Text;               # its id (hex)
    peers @2 :List(Peer);
  }
  struct Peer {
    id @0 :Text;
    name @1 :Text;
    serves @2 :List(Text);
    sinceHeartbeatMs @3 :UInt64;
  }
}
