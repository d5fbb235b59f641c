#!/usr/bin/env bash
# Writes the seed corpus of wire_fuzz: valid frames 2 + 3 (envelope, then payloads) of each kind
# of bus message, made with the capnp tool from the schemas. The files in corpus/ are committed;
# run this again when the schemas change:  bash tests/fuzz/make_corpus.sh
set -euo pipefail
cd "$(dirname "$0")"
schemas=../../schemas
out=corpus
mkdir -p "$out"

# Schema ids: `capnp compile -o-` lists every node with its id and name.
ids=$(capnp compile -I/usr/include -o- $schemas/envelope.capnp $schemas/demo.capnp |
  capnp convert --short binary:text /usr/include/capnp/schema.capnp CodeGeneratorRequest |
  grep -oE '\(id = [0-9]+, displayName = "[^"]+"')
id() { grep -F "capnp:$1\"" <<<"$ids" | grep -oE '[0-9]+' | head -1; }
reading=$(id Reading) request=$(id StatsRequest) reply=$(id StatsReply) heartbeat=$(id Heartbeat)

envelope() { capnp encode -I/usr/include $schemas/envelope.capnp Envelope <<<"$1"; }
demo() { capnp encode $schemas/demo.capnp "$@"; }

# A publish of two readings (one frame, two payloads).
{
  envelope "(kind = publish, typeId = $reading, sender = 1234, seq = 1, count = 2)"
  demo Reading <<<'(sensor = "s1", value = 21.5, seq = 1, unixNanos = 1700000000000000000)'
  demo Reading <<<'(sensor = "kitchen", value = -3.25, seq = 2, unixNanos = 1700000000000000001)'
} >"$out/publish-two-readings"

# A publish whose reading spans several segments (far pointers in the payload).
{
  envelope "(kind = publish, typeId = $reading, sender = 1234, seq = 3, count = 1)"
  demo --segment-size=2 Reading <<<'(sensor = "a sensor with a longer name", value = 1, seq = 3)'
} >"$out/publish-multi-segment"

# A request and its reply, and an error reply (no payload).
{
  envelope "(kind = request, typeId = $request, sender = 99, count = 1, correlation = 7, timeoutUs = 5000000)"
  demo StatsRequest <<<'(sensor = "kitchen")'
} >"$out/request"
{
  envelope "(kind = reply, typeId = $reply, sender = 1234, count = 1, correlation = 7)"
  demo StatsReply <<<'(readings = 42, missed = 1, sensors = [(sensor = "kitchen", count = 42, mean = 20.5, min = 18, max = 23, last = 21)])'
} >"$out/reply"
envelope '(kind = reply, sender = 1234, correlation = 8, code = 5, detail = "no sensor")' \
  >"$out/reply-error"

# A request batch (two requests) and a reply batch (one reply, one error).
{
  envelope "(kind = request, typeId = $request, sender = 99, count = 2, \
requests = [(correlation = 9, timeoutUs = 5000000), (correlation = 10, timeoutUs = 4999990)])"
  demo StatsRequest <<<'(sensor = "kitchen")'
  demo StatsRequest <<<'(sensor = "attic")'
} >"$out/request-batch"
{
  envelope "(kind = reply, typeId = $reply, sender = 1234, count = 1, \
replies = [(correlation = 10, code = 5, detail = \"no sensor\"), (correlation = 9)])"
  demo StatsReply <<<'(readings = 42, missed = 0)'
} >"$out/reply-batch"

# A queue message.
{
  envelope "(kind = send, typeId = $reading, sender = 99, seq = 1, count = 1)"
  demo Reading <<<'(sensor = "job", seq = 1)'
} >"$out/send"

# A heartbeat.
{
  envelope "(kind = heartbeat, typeId = $heartbeat, sender = 1234, count = 1)"
  capnp encode -I/usr/include $schemas/envelope.capnp Heartbeat <<<"(node = 1234, name = \"aggregator\", \
requestEndpoint = \"tcp://127.0.0.1:7002\", intervalMs = 200, \
serves = [(name = \"demo.stats\", typeId = $request, replyTypeId = $reply, kind = endpoint)], \
imports = [(name = \"demo.readings\", typeId = $reading, kind = topic)])"
} >"$out/heartbeat"
ls -l "$out"
