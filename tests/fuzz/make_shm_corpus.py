#!/usr/bin/env python3
"""Writes the seed corpus of shm_fuzz (tests/fuzz/shm_corpus): rings as a link's writer leaves
them (docs/wire-protocol.md section 15): tail, head, then the ring's bytes. The files are
committed; run this again when the frame layout changes:  python3 tests/fuzz/make_shm_corpus.py
"""
import os
import struct

DATA, BLOCK, SUBSCRIBE, UNSUBSCRIBE, PAD = 1, 2, 3, 4, 5


def r8(n):
    return (n + 7) & ~7


def pad8(b):
    return b + b"\0" * (r8(len(b)) - len(b))


def frame(kind, channel=b"", envelope=b"", payload=b"", block=None, payload_bytes=None):
    body = b""
    if block is not None:
        body += struct.pack("<QIIQ", block[0], block[1], 0, block[2])
    body += pad8(channel) + pad8(envelope)
    if kind == DATA:
        body += pad8(payload)
    size = 32 + len(body)
    n = len(payload) if payload_bytes is None else payload_bytes
    return struct.pack("<IHHIIQQ", size, kind, 0, len(channel), len(envelope), n, 0) + body


def ring(frames, ring_bytes=1024, head=0):
    data = b"".join(frames)
    buf = bytearray(ring_bytes)
    start = head % ring_bytes
    buf[start:start + len(data)] = data
    return struct.pack("<QQ", head + len(data), head) + bytes(buf)


here = os.path.dirname(os.path.abspath(__file__))
out = os.path.join(here, "shm_corpus")
os.makedirs(out, exist_ok=True)
seeds = {
    "data": ring([frame(DATA, b"demo.readings", b"E" * 40, b"P" * 100)]),
    "block": ring([frame(BLOCK, b"demo.readings", b"E" * 40, block=(7, 1, 4096),
                         payload_bytes=65536)]),
    "subscribe": ring([frame(SUBSCRIBE, b"demo."), frame(UNSUBSCRIBE, b"demo.")]),
    "mixed": ring([frame(SUBSCRIBE, b"t"), frame(DATA, b"t", b"e" * 16, b"p" * 9),
                   frame(BLOCK, b"t", b"e" * 8, block=(1, 0, 0), payload_bytes=32768)]),
}
# A frame that does not fit before the ring's end: a pad frame, then the frame at the start.
f = frame(DATA, b"x", b"y" * 24, b"z" * 40)
tail_part = 1024 - 960
pad = struct.pack("<IHHIIQQ", tail_part, PAD, 0, 0, 0, 0, 0) + b"\0" * (tail_part - 32)
buf = bytearray(1024)
buf[960:1024] = pad
buf[0:len(f)] = f
seeds["wrap"] = struct.pack("<QQ", 1024 + len(f), 960) + bytes(buf)
for name, b in seeds.items():
    with open(os.path.join(out, name), "wb") as fh:
        fh.write(b)
