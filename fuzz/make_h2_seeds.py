#!/usr/bin/env python3
"""Writes the h2_front target's seeds (seeds/h2_front/): HTTP/2 frames a client could send after
the preface, each file prefixed by the target's two control bytes (routing and drain selector,
read-size seed; see src/h2_front.rs). HPACK is written by hand, literals without Huffman coding,
so the seeds show what they send. Run from this directory: python3 make_h2_seeds.py"""
import os
import struct

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20

# Selector byte, bits 0-1: routing; bits 2-4: drain after that many reads (0: never).
NO_REVISION, POD, POD_CC1, NO_PODS = 0, 1, 2, 3


def frame(kind, flags, stream, payload=b""):
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def integer(value, prefix_bits, first=0):
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = [first | limit]
    value -= limit
    while value >= 128:
        out.append(value % 128 + 128)
        value //= 128
    out.append(value)
    return bytes(out)


def literal(name, value):
    """Literal header field without indexing, new name."""
    name, value = name.encode(), value.encode() if isinstance(value, str) else value
    return b"\x00" + integer(len(name), 7) + name + integer(len(value), 7) + value


def request(method=b"\x82", path="/", extra=(), authority="hello.default.svc.cluster.local", revision=True):
    block = method + b"\x86"
    block += b"\x84" if path == "/" else b"\x04" + integer(len(path), 7) + path.encode()
    if authority is not None:
        block += b"\x01" + integer(len(authority), 7) + authority.encode()
    if revision:
        block += literal("knative-serving-namespace", "default") + literal("knative-serving-revision", "hello")
    for name, value in extra:
        block += literal(name, value)
    return block


def settings(*pairs):
    return frame(SETTINGS, 0, 0, b"".join(struct.pack(">HI", k, v) for k, v in pairs))


GET = b"\x82"
POST = b"\x83"
INIT = settings() + frame(SETTINGS, ACK, 0)


def seed(name, selector, frames, read_seed=7):
    with open(os.path.join("seeds", "h2_front", name), "wb") as out:
        out.write(bytes([selector, read_seed]) + frames)


os.makedirs(os.path.join("seeds", "h2_front"), exist_ok=True)
seed("get", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, request()))
seed("get_no_revision", NO_REVISION, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, request()))
seed("get_queued_no_pods", NO_PODS, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, request())
     + frame(HEADERS, END_HEADERS | END_STREAM, 3, request()))
seed("post_body_trailers", POD, INIT
     + frame(HEADERS, END_HEADERS, 1, request(POST, "/echo.Echo/Unary", [("content-type", "application/grpc"), ("te", "trailers")]))
     + frame(DATA, 0, 1, b"\x00\x00\x00\x00\x05hello")
     + frame(HEADERS, END_HEADERS | END_STREAM, 1, literal("x-trailer", "1")))
seed("post_window_updates", POD, INIT
     + frame(HEADERS, END_HEADERS, 1, request(POST))
     + frame(DATA, 0, 1, b"x" * 1000)
     + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 1 << 20))
     + frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 1 << 20))
     + frame(DATA, END_STREAM, 1, b"y" * 100))
for behaviour in ["reset", "refuse", "other", "headers"]:
    seed("pod_" + behaviour, POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, request(extra=[("x-pod", behaviour)])))
seed("concurrency_one", POD_CC1, INIT + b"".join(
    frame(HEADERS, END_HEADERS | END_STREAM, stream, request()) for stream in (1, 3, 5, 7)))
seed("client_resets", POD_CC1, INIT
     + frame(HEADERS, END_HEADERS, 1, request(POST)) + frame(HEADERS, END_HEADERS, 3, request(POST))
     + frame(RST_STREAM, 0, 3, struct.pack(">I", 8)) + frame(RST_STREAM, 0, 1, struct.pack(">I", 8)))
seed("rapid_reset", POD, INIT + b"".join(
    frame(HEADERS, END_HEADERS, s, request()) + frame(RST_STREAM, 0, s, struct.pack(">I", 8)) for s in range(1, 140, 2)))
seed("drain_midway", POD | (3 << 2), INIT + b"".join(
    frame(HEADERS, END_HEADERS | END_STREAM, s, request()) for s in (1, 3, 5)))
seed("probe", NO_REVISION, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1,
     request(path="/healthz", revision=False, extra=[("k-network-probe", "queue"), ("user-agent", "kube-probe/1.30")])))
seed("connect", POD, INIT + frame(HEADERS, END_HEADERS, 1, b"\x02\x07CONNECT" + b"\x01\x0bexample:443"))
seed("host_header_only", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1,
     GET + b"\x86\x84" + literal("host", "hello.default.svc.cluster.local")))
seed("continuation", POD, INIT
     + frame(HEADERS, 0, 1, request()[:10]) + frame(CONTINUATION, END_HEADERS, 1, request()[10:]))
seed("padded_priority", POD, INIT
     + frame(HEADERS, END_HEADERS | END_STREAM | PADDED | PRIORITY_FLAG, 1, b"\x04" + struct.pack(">IB", 0, 15) + request() + b"\0" * 4)
     + frame(PRIORITY, 0, 3, struct.pack(">IB", 1, 200)))
seed("ping_goaway", POD, INIT + frame(PING, 0, 0, b"12345678") + frame(GOAWAY, 0, 0, struct.pack(">II", 0, 0)))
seed("settings_edges", POD, settings((1, 0), (2, 0), (3, 0xFFFFFFFF), (4, 0x7FFFFFFF), (5, 16777215), (6, 0xFFFFFFFF), (9, 1))
     + frame(HEADERS, END_HEADERS | END_STREAM, 1, request()))
seed("bad_settings", POD, settings((4, 0x80000000)) + settings((5, 1)))
seed("window_overflow", POD, INIT + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF))
     + frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 0x7FFFFFFF)))
seed("huge_frame_length", POD, b"\xff\xff\xff\x00\x00\x00\x00\x00\x01")
seed("header_table_size_update", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x3f\xe1\x1f" + request()))
seed("hpack_huge_integer", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, b"\x7f" + b"\xff" * 12))
seed("long_header_value", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1, request(extra=[("x-long", "v" * 3000)])))
seed("invalid_header_bytes", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 1,
     request(extra=[("x-bin", b"\xff\x00\r\n".decode("latin-1")), ("Upper", "x"), ("connection", "keep-alive")])))
seed("push_promise_from_client", POD, INIT + frame(PUSH_PROMISE, END_HEADERS, 1, struct.pack(">I", 2) + request()))
seed("data_on_idle_stream", POD, INIT + frame(DATA, END_STREAM, 5, b"x"))
seed("even_stream_id", POD, INIT + frame(HEADERS, END_HEADERS | END_STREAM, 2, request()))
seed("unknown_frame_type", POD, INIT + frame(0xfa, 0xff, 1, b"ignored") + frame(HEADERS, END_HEADERS | END_STREAM, 1, request()))
seed("empty", POD, b"")
