# The WebSocket bridge's binary frames (a client asks for them with the subprotocol
# "bus.capnp"). See docs/websocket.md. A client frame holds one Frame; a server frame holds one
# or more Frames, each a Cap'n Proto message in stream framing, back to back.
@0xd2c4a7b81e5f3a60;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("bus::wire");

struct Frame {
  op @0 :Op;
  channel @1 :Text;
  id @2 :UInt64;         # call / reply: the client's correlation id; also echoed by error frames
  timeoutMs @3 :UInt32;  # call: the deadline (0: the server's default)
  body @4 :Data;         # pub / call / msg / reply: one Cap'n Proto message of the channel's
                         # type (stream framing)
  error @5 :Text;        # error / reply that failed: a short code ("forbidden", "timeout", ...)
  detail @6 :Text;       # error: what went wrong, for people
  count @7 :UInt64;      # dropped: messages dropped for this client since the last notice

  enum Op {
    sub @0;         # client: subscribe to `channel`; server: "subscribed" is `subscribed`
    unsub @1;       # client: unsubscribe
    pub @2;         # client: publish `body` on `channel`
    call @3;        # client: request `body` from endpoint `channel`, answer tagged `id`
    msg @4;         # server: a message of topic `channel`
    reply @5;       # server: the answer to call `id` (`body`, or `error` + `detail`)
    error @6;       # server: a client frame was refused
    dropped @7;     # server: `count` messages were dropped (the client reads too slowly)
    subscribed @8;  # server: `sub` of `channel` took effect
    unsubscribed @9;
  }
}
