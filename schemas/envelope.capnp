# The bus wire protocol: what travels in ZeroMQ frames between nodes. See docs/wire-protocol.md.
@0xadd54be79bb76725;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("bus::wire");

# Frame 2 of every bus message. Frame 1 is the channel name (UTF-8 bytes, no terminator), so
# that SUB prefix filtering works; frame 3 holds `count` payloads, each one Cap'n Proto message
# in the standard stream framing (segment table, then segments), back to back.
struct Envelope {
  kind @0 :Kind;
  typeId @1 :UInt64;       # schema id of every payload in frame 3 (the type identity)
  sender @2 :UInt64;       # node id: random, new at every start (a restarted node is a new node)
  seq @3 :UInt64;          # publish/send: sequence number of the first payload on
                           # (sender, channel); consecutive payloads take the next numbers
  count @4 :UInt32;        # payloads in frame 3
  correlation @5 :UInt64;  # request: chosen by the requester; reply: echoed
  timeoutUs @6 :UInt64;    # request: time left until its deadline, in microseconds
  code @7 :UInt16;         # reply: a gRPC status code (0 ok, 1 cancelled, 3 invalid argument,
                           # 4 deadline exceeded, 8 resource exhausted, 10 aborted = peer gone,
                           # 13 internal = handler failed, 14 unavailable = no handler, ...);
                           # one payload follows only when it is 0
  detail @8 :Text;         # reply: a human-readable reason when code is not 0
  requests @9 :List(RequestItem);  # request batch: one item per payload in frame 3, in order;
                                   # then `count` = the list's length and the single-request
                                   # fields (correlation, timeoutUs) are not used
  replies @10 :List(ReplyItem);    # reply batch: one item per reply; frame 3 holds the payloads
                                   # of the items whose code is 0, in order, and `count` = their
                                   # number; correlation, code and detail above are not used
  principal @11 :Principal;        # request (and every request of a batch): who it is for, as
                                   # the edge authenticated them; absent: nobody in particular

  enum Kind {
    publish @0;    # PUB -> SUB: topic messages
    request @1;    # DEALER -> ROUTER: one request (count = 1), or a batch (`requests`)
    reply @2;      # ROUTER -> DEALER: the reply to `correlation`, or a batch (`replies`)
    send @3;       # DEALER -> ROUTER: queue messages (each goes to one consumer)
    heartbeat @4;  # PUB -> SUB on the control topic: one Heartbeat payload
  }
}

# Who a request is for (bus::Principal): a bearer token's subject, issuer, scopes and claims, or
# a client certificate's subject. The serving node trusts it as it trusts the sender (CURVE).
struct Principal {
  subject @0 :Text;
  issuer @1 :Text;
  scopes @2 :List(Text);
  claims @3 :Text;         # the token's claims as JSON, or empty
}

# A request in a batch. Batches go only to nodes whose heartbeat says `batches`.
struct RequestItem {
  correlation @0 :UInt64;  # as Envelope.correlation
  timeoutUs @1 :UInt64;    # as Envelope.timeoutUs
}

# A reply in a batch (a reply batch answers requests of one requester on one endpoint).
struct ReplyItem {
  correlation @0 :UInt64;  # the request's
  code @1 :UInt16;         # as Envelope.code: 0 takes the next payload of frame 3
  detail @2 :Text;         # as Envelope.detail
}

# The control topic "$bus.heartbeat" carries one of these from every node, every interval.
struct Heartbeat {
  node @0 :UInt64;             # the sender's node id (as in Envelope.sender)
  name @1 :Text;               # a human-readable node name
  requestEndpoint @2 :Text;    # where its ROUTER listens: connect a DEALER here for requests
  intervalMs @3 :UInt32;       # how often it sends heartbeats
  serves @4 :List(Channel);    # endpoints and queues it takes from other nodes (exported)
  imports @5 :List(Channel);   # topics it subscribes to from other nodes
  leaving @6 :Bool;            # sent once at a clean stop: forget this node now
  publicKey @7 :Text;          # its CURVE public key (Z85), empty without CURVE
  goodbyes @8 :List(UInt64);   # nodes whose leaving heartbeat it received in the last few
                               # seconds: it has everything they published before leaving
                               # (the end-of-stream handshake a leaving node waits for)
  batches @9 :Bool;            # it reads request batches (Envelope.requests) and reply batches
                               # (Envelope.replies); send a node batches only when it says so
  missed @10 :List(Missed);    # what it counted missing from other nodes (sequence gaps), so
                               # that a publisher learns what each subscriber lost of its own
  published @11 :List(TopicSeq);  # per topic it publishes: the seq its next message will take.
                               # Everything below was handed to its publisher socket before this
                               # heartbeat, so a receiver counts the numbers it never got as
                               # gaps, even when nothing follows them (the tail of a stream)
  publishEndpoint @12 :Text;   # where its publisher listens, as bound (or advertised)
  shm @13 :SharedMemory;       # set when it takes shared-memory links from nodes on its host
  handover @14 :List(UInt64);  # nodes that take its heartbeats over a shared-memory link: the
                               # first heartbeat naming one is the first frame on that link, and
                               # everything it published before that went over ZeroMQ only; a
                               # node moves at the first one that reaches it over ZeroMQ (§16)
}

# How to reach a node over shared memory (docs/wire-protocol.md §15): connect to `socket`, if
# the three namespaces' identities are yours too.
struct SharedMemory {
  socket @0 :Text;             # its abstract Unix socket (SOCK_SEQPACKET), without the leading NUL
  bootId @1 :Text;             # /proc/sys/kernel/random/boot_id: the same kernel
  ipcNamespace @2 :UInt64;     # the inode of /proc/self/ns/ipc
  netNamespace @3 :UInt64;     # the inode of /proc/self/ns/net (abstract sockets live there)
}

# A running total of messages from `sender` on `channel` that the heartbeat's node never got.
struct Missed {
  sender @0 :UInt64;
  channel @1 :Text;
  count @2 :UInt64;
}

# How far a node's numbering of one of its topics has gone.
struct TopicSeq {
  channel @0 :Text;
  next @1 :UInt64;             # the seq of the next message it will publish on `channel`
}

struct Channel {
  name @0 :Text;
  typeId @1 :UInt64;       # request type for endpoints, message type otherwise
  replyTypeId @2 :UInt64;  # endpoints only
  kind @3 :Kind;
  enum Kind { topic @0; queue @1; endpoint @2; }
}

# Every node answers requests on the reserved endpoint "$bus.stats" (sent to it directly, it is
# not announced in `serves`) with its figures: what /metrics and StatsD show for its bus and its
# bridge. `busctl stats` asks for them.
struct NodeStatsRequest {}

struct NodeStatsReply {
  node @0 :UInt64;
  name @1 :Text;
  figures @2 :List(Figure);
}

struct Figure {
  name @0 :Text;      # "node.published", "channel.demo.readings.delivered", ...
  value @1 :Float64;
  gauge @2 :Bool;     # a level (ring depth, peers), not a running total
}
