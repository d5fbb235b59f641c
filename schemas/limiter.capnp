# What the nodes of a shared rate limiter (bus::net::RateLimiter) tell each other: each node's
# own count of admitted events per key in the current window. Counts are absolute (not deltas),
# so a lost message is repaired by the next one.
@0xdccc217e857d3fa8;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("bus::schemas::limiter");

struct Counts {
  limiter @0 :Text;   # the limiter's name: nodes share counts per name
  node @1 :UInt64;    # the sending limiter instance (random at start)
  window @2 :Int64;   # the window the counts belong to: wall-clock time / window length
  entries @3 :List(Entry);

  struct Entry {
    key @0 :Text;
    count @1 :UInt64;  # events this node admitted for `key` in `window`
  }
}
