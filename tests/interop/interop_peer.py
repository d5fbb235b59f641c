#!/usr/bin/env python3
"""A bus peer written in Python from docs/wire-protocol.md alone: ZeroMQ through pyzmq, Cap'n Proto
through the `capnp` command-line tool (no generated code, no C++).

It starts the C++ side (interop_node), joins its bus and checks both directions:

  * heartbeats on "$bus.heartbeat": it announces what it serves and imports, and reads the C++
    node's (name, request endpoint, serves, imports, type ids, leaving);
  * topics: it reads interop.cpp.readings (envelope + payloads in stream framing, sequence numbers
    without gaps) and publishes interop.py.readings in batches, with one skipped sequence number
    and one frame of the wrong type, which the C++ node must count as a gap and a rejection;
  * requests: it serves interop.py.stats on its ROUTER (an answer, and a NOT_FOUND error), and
    calls interop.cpp.stats through a DEALER (answers, UNAVAILABLE for an unknown channel,
    INVALID_ARGUMENT for a wrong type id);
  * queues: it sends queue messages to interop.cpp.jobs;
  * with --curve, all of it over CURVE, with a ZAP handler that admits the C++ node's key only.

Exit status: 0 when every check on both sides passed, 1 otherwise, 77 when pyzmq is missing (the
ctest reports the test as skipped).
"""

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time

try:
    import zmq
    from zmq.utils import z85
except ImportError:
    print("interop: skipped: the Python zmq module is missing (Debian: apt-get install python3-zmq)")
    sys.exit(77)

HEARTBEAT_TOPIC = b"$bus.heartbeat"
HEARTBEAT_MS = 200
# How many of each, passed to the C++ side too so that both check the same numbers.
CPP_READINGS = 300
CPP_CALLS = 10  # the C++ node calls interop.py.stats this often, then once for "missing"
PY_BATCHES = [(1, 3), (4, 2), (7, 5)]  # (first seq, count) per frame: seq 6 is skipped
PY_GAPS = 1
PY_REJECTED = 1  # one more frame of one reading, sent with the Reading's id plus one
PY_CALLS = 5  # good calls to interop.cpp.stats (and one unknown channel, one wrong type)
JOBS = 10

# gRPC status codes used below.
OK, NOT_FOUND, INVALID_ARGUMENT, UNAVAILABLE = 0, 5, 3, 14


class Capnp:
    """Cap'n Proto through the capnp tool: JSON text in, standard stream framing out (and back)."""

    def __init__(self, tool, import_dir, schema_dir):
        self.tool = tool
        self.flags = ["-I" + import_dir]
        self.envelope = os.path.join(schema_dir, "envelope.capnp")
        self.demo = os.path.join(schema_dir, "demo.capnp")

    def _run(self, args, data):
        r = subprocess.run([self.tool] + args, input=data, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=30, check=False)
        if r.returncode != 0:
            raise RuntimeError("capnp %s failed: %s" % (" ".join(args), r.stderr.decode()))
        return r.stdout

    def encode(self, schema, struct, objects):
        """Messages (dicts in capnp's JSON mapping), back to back in stream framing."""
        text = "\n".join(json.dumps(o) for o in objects).encode()
        return self._run(["convert"] + self.flags + ["json:binary", schema, struct], text)

    def decode(self, schema, struct, data):
        """Every message of a stream (one frame 3, say), as dicts."""
        if not data:
            return []
        out = self._run(["convert"] + self.flags + ["--short", "binary:json", schema, struct], data)
        return [json.loads(line) for line in out.decode().splitlines() if line.strip()]

    def type_ids(self):
        """Schema id of every node in both schema files, by display name ("demo.capnp:Reading")."""
        request = self._run(["compile"] + self.flags + ["-o-", self.envelope, self.demo], b"")
        schema = os.path.join(self.flags[0][2:], "capnp", "schema.capnp")
        text = self._run(["convert"] + self.flags + ["--short", "binary:text", schema,
                                                     "CodeGeneratorRequest"], request).decode()
        ids = {}
        for node_id, name in re.findall(r'\(id = (\d+), displayName = "([^"]+)"', text):
            ids[name.split("/")[-1]] = int(node_id)
        return ids


def split_stream(frame):
    """Frame 3: payloads in stream framing, back to back. Returns each payload's bytes."""
    out, at = [], 0
    while at < len(frame):
        if len(frame) - at < 8:
            raise ValueError("payload frame ends early")
        segments = int.from_bytes(frame[at:at + 4], "little") + 1
        table = 4 * (1 + segments)
        table += table % 8  # padded to a whole word
        sizes = [int.from_bytes(frame[at + 4 + 4 * i:at + 8 + 4 * i], "little")
                 for i in range(segments)]
        end = at + table + 8 * sum(sizes)
        if end > len(frame):
            raise ValueError("payload frame ends early")
        out.append(frame[at:end])
        at = end
    return out


class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        print("%s: %s" % ("ok" if ok else "FAIL", what), flush=True)
        return ok

    def quiet(self, ok, what):
        """A check made for every message: counted, printed only when it fails."""
        if ok:
            self.passed += 1
            return True
        return self(ok, what)


class Peer:
    def __init__(self, args):
        self.capnp = Capnp(args.capnp, args.capnp_include, args.schemas)
        ids = self.capnp.type_ids()
        self.reading_id = ids["demo.capnp:Reading"]
        self.stats_request_id = ids["demo.capnp:StatsRequest"]
        self.stats_reply_id = ids["demo.capnp:StatsReply"]
        self.heartbeat_id = ids["envelope.capnp:Heartbeat"]
        self.check = Checks()
        self.node_id = int.from_bytes(os.urandom(8), "little") | 1  # random, never 0
        self.curve = args.curve
        self.ctx = zmq.Context()
        if self.curve:
            self.public, self.secret = zmq.curve_keypair()
            # The ZAP handler (RFC 27) must be bound before the sockets that use it.
            self.zap = self.ctx.socket(zmq.REP)
            self.zap.bind("inproc://zeromq.zap.01")
            self.allowed = None  # the C++ node's key, once known
            self.zap_allowed = self.zap_denied = 0
        else:
            self.public, self.secret, self.zap = b"", b"", None
        # XPUB out (topics, heartbeats); ROUTER in (requests, queue messages).
        self.xpub = self.ctx.socket(zmq.XPUB)
        self.xpub.setsockopt(zmq.XPUB_VERBOSER, 1)
        self.xpub.setsockopt(zmq.XPUB_NODROP, 1)
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 1)
        for s in (self.xpub, self.router):
            s.setsockopt(zmq.LINGER, 1000)
            if self.curve:
                s.setsockopt(zmq.CURVE_SERVER, 1)
                s.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
                s.setsockopt(zmq.ZAP_DOMAIN, b"bus")
        self.xpub.bind("tcp://127.0.0.1:*")
        self.router.bind("tcp://127.0.0.1:*")
        self.pub_endpoint = self.xpub.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.req_endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.setsockopt(zmq.SUBSCRIBE, HEARTBEAT_TOPIC)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"interop.cpp.readings")
        self.dealer = None
        # Progress.
        self.cpp = None  # the C++ node's ready line: pub, req, id, key
        self.cpp_heartbeat_ok = False
        self.cpp_left = False
        self.next_reading_seq = None  # expected envelope seq on interop.cpp.readings
        self.readings = 0
        self.readings_ok = True
        self.published = False
        self.served = 0
        self.correlations_seen = set()
        self.pending = {}  # correlation -> (channel, expected code, sensor)
        self.replies = 0
        self.requests_sent = False
        self.left = False
        self.goodbye_confirmed = False

    # ---- frames ---------------------------------------------------------------------------------

    def envelope(self, **fields):
        e = {"kind": "publish", "typeId": 0, "sender": self.node_id, "seq": 0, "count": 0,
             "correlation": 0, "timeoutUs": 0, "code": 0}
        e.update(fields)
        for k in ("typeId", "sender", "seq", "correlation", "timeoutUs"):
            e[k] = str(e[k])  # 64-bit integers are strings in capnp's JSON
        return self.capnp.encode(self.capnp.envelope, "Envelope", [e])

    def read_envelope(self, frame):
        (e,) = self.capnp.decode(self.capnp.envelope, "Envelope", frame)
        for k in ("typeId", "sender", "seq", "correlation", "timeoutUs"):
            e[k] = int(e.get(k, 0))
        e.setdefault("code", 0)
        e.setdefault("count", 0)
        return e

    def heartbeat(self, leaving=False):
        def channel(name, kind, type_id, reply_type_id=0):
            return {"name": name, "typeId": str(type_id), "replyTypeId": str(reply_type_id),
                    "kind": kind}

        hb = {"node": str(self.node_id), "name": "py-peer", "requestEndpoint": self.req_endpoint,
              "intervalMs": HEARTBEAT_MS,
              "serves": [channel("interop.py.stats", "endpoint", self.stats_request_id,
                                 self.stats_reply_id)],
              "imports": [channel("interop.cpp.readings", "topic", self.reading_id)],
              "leaving": leaving, "publicKey": self.public.decode()}
        payload = self.capnp.encode(self.capnp.envelope, "Heartbeat", [hb])
        env = self.envelope(kind="heartbeat", typeId=self.heartbeat_id, count=1)
        self.xpub.send_multipart([HEARTBEAT_TOPIC, env, payload])

    # ---- the C++ side ---------------------------------------------------------------------------

    def start_node(self, binary):
        cmd = [binary, "--peer=" + self.pub_endpoint, "--readings=%d" % CPP_READINGS,
               "--py_readings=%d" % sum(n for _, n in PY_BATCHES), "--py_gaps=%d" % PY_GAPS,
               "--py_rejected=%d" % PY_REJECTED, "--calls=%d" % CPP_CALLS,
               "--py_calls=%d" % PY_CALLS, "--jobs=%d" % JOBS]
        if self.curve:
            cmd.append("--peer_key=" + self.public.decode())
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline().decode() if ready else ""
        m = re.match(r"ready pub=(\S+) req=(\S+) id=(\d+) key=(\S+)", line)
        if not self.check(m is not None, "the C++ node started (%r)" % line.strip()):
            self.proc.kill()
            return False
        self.cpp = {"pub": m.group(1), "req": m.group(2), "id": int(m.group(3)),
                    "key": m.group(4).encode()}
        if self.curve:
            self.allowed = self.cpp["key"]
            self.sub.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
            self.sub.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
            self.sub.setsockopt(zmq.CURVE_SERVERKEY, self.cpp["key"])
        self.sub.connect(self.cpp["pub"])
        return True

    # ---- incoming -------------------------------------------------------------------------------

    def on_sub(self, parts):
        if not self.check.quiet(len(parts) == 3, "a publisher message has 3 frames"):
            return
        topic, env = parts[0], self.read_envelope(parts[1])
        if topic == HEARTBEAT_TOPIC:
            self.on_heartbeat(env, parts[2])
        elif topic == b"interop.cpp.readings":
            self.on_readings(env, parts[2])

    def on_heartbeat(self, env, frame):
        (hb,) = self.capnp.decode(self.capnp.envelope, "Heartbeat", frame)
        node = int(hb["node"])
        if self.left and str(self.node_id) in hb.get("goodbyes", []):
            self.goodbye_confirmed = True  # it has everything this side sent before leaving
        if hb.get("leaving"):
            self.cpp_left = node == self.cpp["id"]
            return
        if self.cpp_heartbeat_ok:
            return
        serves = {c["name"]: c for c in hb.get("serves", [])}
        imports = {c["name"]: c for c in hb.get("imports", [])}
        stats = serves.get("interop.cpp.stats", {})
        jobs = serves.get("interop.cpp.jobs", {})
        topic = imports.get("interop.py.readings", {})
        self.cpp_heartbeat_ok = self.check(
            env["kind"] == "heartbeat" and env["count"] == 1 and env["typeId"] == self.heartbeat_id
            and env["sender"] == node == self.cpp["id"] and hb.get("name") == "cpp-node"
            and hb.get("requestEndpoint") == self.cpp["req"] and hb.get("intervalMs") == 100
            and stats.get("kind") == "endpoint"
            and int(stats.get("typeId", 0)) == self.stats_request_id
            and int(stats.get("replyTypeId", 0)) == self.stats_reply_id
            and jobs.get("kind") == "queue" and int(jobs.get("typeId", 0)) == self.reading_id
            and topic.get("kind") == "topic" and int(topic.get("typeId", 0)) == self.reading_id
            and hb.get("publicKey", "") == ("" if not self.curve else self.cpp["key"].decode()),
            "the C++ heartbeat announces its node, endpoint, serves, imports and key: %s" % hb)
        if self.cpp_heartbeat_ok:
            self.connect_dealer(hb["requestEndpoint"], hb.get("publicKey", ""))

    def on_readings(self, env, frame):
        payloads = split_stream(frame)
        ok = (env["kind"] == "publish" and env["typeId"] == self.reading_id
              and env["sender"] == self.cpp["id"] and env["count"] == len(payloads) >= 1
              and (self.next_reading_seq is None or env["seq"] == self.next_reading_seq))
        readings = self.capnp.decode(self.capnp.demo, "Reading", frame)
        for i, r in enumerate(readings):
            n = env["seq"] + i  # the envelope's seq numbers the frame's first payload
            ok = ok and r.get("sensor") == "cpp" and int(r.get("seq", 0)) == n \
                and r.get("value") == 0.25 * n and int(r.get("unixNanos", 0)) == 1000 * n
        if not ok and self.readings_ok:
            self.check(False, "interop.cpp.readings frame: envelope %s, payloads %s"
                       % (env, readings[:3]))
        self.readings_ok = self.readings_ok and ok
        self.next_reading_seq = env["seq"] + env["count"]
        self.readings += len(readings)

    def on_router(self, parts):
        if not self.check.quiet(len(parts) == 4, "a ROUTER message has 4 frames (identity first)"):
            return
        identity, channel, env = parts[0], parts[1], self.read_envelope(parts[2])
        ok = (channel == b"interop.py.stats" and env["kind"] == "request" and env["count"] == 1
              and env["typeId"] == self.stats_request_id and env["sender"] == self.cpp["id"]
              and 0 < env["timeoutUs"] <= 5000000
              and env["correlation"] not in self.correlations_seen)
        self.correlations_seen.add(env["correlation"])
        (req,) = self.capnp.decode(self.capnp.demo, "StatsRequest", parts[3])
        sensor = req.get("sensor", "")
        self.check.quiet(ok, "request %d on %s: %s" % (env["correlation"], channel.decode(), sensor))
        reply = {"kind": "reply", "sender": self.node_id, "correlation": env["correlation"]}
        if sensor == "missing":
            frames = [self.envelope(code=NOT_FOUND, detail="no sensor 'missing'", **reply), b""]
        else:
            i = int(sensor[1:])
            rep = {"readings": str(1000 + i),
                   "sensors": [{"sensor": sensor, "count": "1", "mean": 2.5}]}
            frames = [self.envelope(typeId=self.stats_reply_id, count=1, **reply),
                      self.capnp.encode(self.capnp.demo, "StatsReply", [rep])]
        self.router.send_multipart([identity, channel] + frames)
        self.served += 1

    def connect_dealer(self, endpoint, key):
        self.dealer = self.ctx.socket(zmq.DEALER)
        self.dealer.setsockopt(zmq.LINGER, 0)
        if self.curve:
            self.dealer.setsockopt(zmq.CURVE_PUBLICKEY, self.public)
            self.dealer.setsockopt(zmq.CURVE_SECRETKEY, self.secret)
            self.dealer.setsockopt(zmq.CURVE_SERVERKEY, key.encode())
        self.dealer.connect(endpoint)
        # Requests: PY_CALLS good ones, one to a channel nobody exports, one of the wrong type.
        calls = [("p%d" % i, b"interop.cpp.stats", self.stats_request_id, OK)
                 for i in range(1, PY_CALLS + 1)]
        calls.append(("x", b"interop.nope", self.stats_request_id, UNAVAILABLE))
        calls.append(("y", b"interop.cpp.stats", self.reading_id, INVALID_ARGUMENT))
        for correlation, (sensor, channel, type_id, code) in enumerate(calls, start=1):
            env = self.envelope(kind="request", typeId=type_id, count=1, correlation=correlation,
                                timeoutUs=5000000)
            payload = self.capnp.encode(self.capnp.demo, "StatsRequest", [{"sensor": sensor}])
            self.dealer.send_multipart([channel, env, payload])
            self.pending[correlation] = (channel, code, sensor)
        # Queue messages: kind send, one payload each, seq 1, 2, ...
        payloads = self.capnp.encode(self.capnp.demo, "Reading",
                                     [{"sensor": "job", "seq": str(i)} for i in range(1, JOBS + 1)])
        for i, payload in enumerate(split_stream(payloads), start=1):
            env = self.envelope(kind="send", typeId=self.reading_id, count=1, seq=i)
            self.dealer.send_multipart([b"interop.cpp.jobs", env, payload])
        self.requests_sent = True

    def on_dealer(self, parts):
        if not self.check.quiet(len(parts) == 3, "a reply has 3 frames"):
            return
        channel, env = parts[0], self.read_envelope(parts[1])
        want = self.pending.pop(env["correlation"], None)
        if not self.check.quiet(want is not None and env["kind"] == "reply",
                                "reply %d matches a pending request" % env["correlation"]):
            return
        want_channel, code, sensor = want
        if code == OK:
            replies = self.capnp.decode(self.capnp.demo, "StatsReply", parts[2])
            ok = (env["code"] == OK and env["count"] == 1 and env["typeId"] == self.stats_reply_id
                  and len(replies) == 1 and int(replies[0].get("readings", 0)) == 7
                  and replies[0]["sensors"][0]["sensor"] == sensor)
            self.check(ok and channel == want_channel,
                       "reply %d from interop.cpp.stats: %s" % (env["correlation"], replies))
        else:
            self.check(env["code"] == code and env["count"] == 0 and parts[2] == b""
                       and env.get("detail", "") != "",
                       "reply %d on %s: code %d (want %d), detail %r"
                       % (env["correlation"], channel.decode(), env["code"], code,
                          env.get("detail")))
        self.replies += 1

    def on_xpub(self, msg):
        # VERBOSER: \x01topic for every subscription, \x00topic for every unsubscription.
        if msg == b"\x01interop.py.readings" and not self.published:
            self.publish_readings()

    def publish_readings(self):
        for first, count in PY_BATCHES:
            objs = [{"sensor": "py", "seq": str(s), "value": 1.5 * s, "unixNanos": str(1000 * s)}
                    for s in range(first, first + count)]
            payloads = self.capnp.encode(self.capnp.demo, "Reading", objs)
            env = self.envelope(typeId=self.reading_id, seq=first, count=count)
            self.xpub.send_multipart([b"interop.py.readings", env, payloads])
        # A frame that claims another type: the receiver rejects it (and counts it).
        last = PY_BATCHES[-1][0] + PY_BATCHES[-1][1]
        payload = self.capnp.encode(self.capnp.demo, "Reading", [{"sensor": "bad"}])
        env = self.envelope(typeId=self.reading_id + 1, seq=last, count=1)
        self.xpub.send_multipart([b"interop.py.readings", env, payload])
        self.published = True

    def on_zap(self):
        version, request_id, domain, address, identity, mechanism, *cred = \
            self.zap.recv_multipart()
        key = z85.encode(cred[0]) if mechanism == b"CURVE" and cred else b""
        ok = key == self.allowed
        if ok:
            self.zap_allowed += 1
        else:
            self.zap_denied += 1
        self.zap.send_multipart([b"1.0", request_id, b"200" if ok else b"400",
                                 b"OK" if ok else b"not allowed", key, b""])

    # ---- the loop -------------------------------------------------------------------------------

    def done(self):
        return (self.cpp_heartbeat_ok and self.readings >= CPP_READINGS and self.published
                and self.served >= CPP_CALLS + 1 and self.requests_sent and not self.pending)

    def run(self, binary, limit_s):
        if not self.start_node(binary):
            return
        poller = zmq.Poller()
        for s in (self.sub, self.router, self.xpub) + ((self.zap,) if self.zap else ()):
            poller.register(s, zmq.POLLIN)
        handlers = {self.sub: lambda: self.on_sub(self.sub.recv_multipart()),
                    self.router: lambda: self.on_router(self.router.recv_multipart()),
                    self.xpub: lambda: self.on_xpub(self.xpub.recv()),
                    self.zap: self.on_zap}
        deadline = time.monotonic() + limit_s
        next_heartbeat = 0.0
        exited_at = None
        while time.monotonic() < deadline:
            now = time.monotonic()
            if not self.left and now >= next_heartbeat:
                self.heartbeat()
                next_heartbeat = now + HEARTBEAT_MS / 1000
            if self.dealer is not None and self.dealer not in handlers:
                poller.register(self.dealer, zmq.POLLIN)
                handlers[self.dealer] = lambda: self.on_dealer(self.dealer.recv_multipart())
            for sock, _ in poller.poll(50):
                handlers[sock]()
            if not self.left and self.done():
                self.heartbeat(leaving=True)  # forget me now
                self.left = True
            if exited_at is None and self.proc.poll() is not None:
                exited_at = time.monotonic()
            if exited_at is not None and (self.cpp_left or time.monotonic() - exited_at > 2):
                break
        if self.proc.poll() is None:
            self.check(False, "the C++ node finished within %d s" % limit_s)
            self.proc.kill()
        out = self.proc.communicate()[0].decode()
        sys.stdout.write("---- interop_node (exit %d) ----\n%s----\n" % (self.proc.returncode, out))
        self.check(self.readings == CPP_READINGS and self.readings_ok,
                   "received %d/%d C++ readings, in order, no gaps, right content"
                   % (self.readings, CPP_READINGS))
        self.check(self.served == CPP_CALLS + 1, "served %d/%d C++ calls"
                   % (self.served, CPP_CALLS + 1))
        self.check(self.replies == PY_CALLS + 2 and not self.pending,
                   "got %d/%d replies from the C++ node" % (self.replies, PY_CALLS + 2))
        self.check(self.goodbye_confirmed, "the C++ node's heartbeat confirmed this side's goodbye")
        self.check(self.cpp_left, "the C++ node's leaving heartbeat arrived")
        if self.curve:
            # The C++ node's SUB and DEALER each passed this side's ZAP handler.
            self.check(self.zap_allowed >= 2 and self.zap_denied == 0,
                       "ZAP admitted the C++ node's key %d times, refused %d"
                       % (self.zap_allowed, self.zap_denied))
        self.check(self.proc.returncode == 0, "the C++ node's own checks passed")

    def close(self):
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        self.ctx.destroy(linger=0)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--node", required=True, help="the interop_node binary")
    p.add_argument("--schemas", required=True, help="the folder of envelope.capnp and demo.capnp")
    p.add_argument("--capnp", default="capnp", help="the capnp tool")
    p.add_argument("--capnp-include", default="/usr/include",
                   help="the folder holding capnp/c++.capnp and capnp/schema.capnp")
    p.add_argument("--curve", action="store_true", help="encrypt and authenticate with CURVE")
    p.add_argument("--time-limit", type=int, default=90, help="seconds for the whole exchange")
    args = p.parse_args()
    if args.curve and not zmq.has("curve"):
        print("interop: skipped: this libzmq has no CURVE")
        return 77
    peer = Peer(args)
    try:
        peer.run(args.node, args.time_limit)
    finally:
        peer.close()
    c = peer.check
    print("interop_peer: %d passed, %d failed" % (c.passed, c.failed))
    return 0 if c.failed == 0 and c.passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
