#!/usr/bin/env python3
"""A second, independent gRPC client for kactivator's Echo test service (grpcio, C core).

It checks that what works with the Rust (tonic/hyper) client also works with another
implementation's HTTP/2 stack. Stubs are generated at run time from testkit/proto/echo.proto
(echo_stubs.py), so no generated code is committed.

Needs: python3 -m pip install grpcio grpcio-tools

Usage:
    echo_client.py --target 127.0.0.1:8080 --authority hello-00001.default.svc.cluster.local unary
    echo_client.py --target ... server-stream 5
    echo_client.py --target ... bidi 5
    echo_client.py --target ... big 16

Prints one JSON object per line (one per call) and exits non-zero on any failure.
"""

import argparse
import json
import sys
import time

from echo_stubs import load_stubs

MAX_MESSAGE_SIZE = 64 * 1024 * 1024
MIB = 1024 * 1024


def pattern_ok(data):
    """Whether data is the testkit's pattern from offset 0 (byte i is i mod 251)."""
    period = 251
    return all(byte == index % period for index, byte in enumerate(data))


def run(args):
    import grpc

    pb, pb_grpc = load_stubs()
    options = [
        ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
        ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
    ]
    if args.authority:
        options.append(("grpc.default_authority", args.authority))
    # insecure_channel speaks h2c with prior knowledge, as the proxy's clients would.
    with grpc.insecure_channel(args.target, options=options) as channel:
        stub = pb_grpc.EchoStub(channel)
        started = time.monotonic()
        if args.call == "unary":
            reply, call = stub.Unary.with_call(
                pb.EchoRequest(payload=b"ping"), timeout=args.timeout
            )
            ok = reply.payload == b"ping"
            result = {
                "payload": reply.payload.decode(errors="replace"),
                "backend": reply.backend,
                "x-http-version": dict(call.initial_metadata()).get("x-http-version"),
                "x-request-authority": dict(call.initial_metadata()).get("x-request-authority"),
            }
        elif args.call == "server-stream":
            replies = list(
                stub.ServerStream(
                    pb.StreamRequest(count=args.n, interval_ms=10, reply_bytes=64),
                    timeout=args.timeout,
                )
            )
            seqs = [reply.seq for reply in replies]
            ok = seqs == list(range(args.n)) and all(
                pattern_ok(reply.payload) for reply in replies
            )
            result = {"replies": len(replies), "seqs": seqs, "backend": replies[0].backend if replies else None}
        elif args.call == "bidi":
            payloads = [f"message-{index}".encode() for index in range(args.n)]
            requests = (pb.EchoRequest(payload=payload) for payload in payloads)
            replies = list(stub.Bidi(requests, timeout=args.timeout))
            ok = [reply.payload for reply in replies] == payloads and [
                reply.seq for reply in replies
            ] == list(range(args.n))
            result = {"replies": len(replies)}
        elif args.call == "big":
            size = args.n * MIB
            payload = bytes(index % 251 for index in range(size))
            echoed = stub.Unary(pb.EchoRequest(payload=payload), timeout=args.timeout)
            generated = stub.Unary(pb.EchoRequest(reply_bytes=size), timeout=args.timeout)
            ok = echoed.payload == payload and len(generated.payload) == size and pattern_ok(
                generated.payload
            )
            result = {"echoed_bytes": len(echoed.payload), "generated_bytes": len(generated.payload)}
        else:
            raise ValueError(f"unknown call {args.call}")
        result.update(
            {
                "call": args.call,
                "ok": ok,
                "seconds": round(time.monotonic() - started, 3),
            }
        )
        print(json.dumps(result))
        return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True, help="host:port to connect to")
    parser.add_argument("--authority", help=":authority to send (default: the target)")
    parser.add_argument("--timeout", type=float, default=30.0, help="per call, seconds")
    parser.add_argument("call", choices=["unary", "server-stream", "bidi", "big"])
    parser.add_argument(
        "n", type=int, nargs="?", default=5, help="messages (server-stream, bidi) or MiB (big)"
    )
    args = parser.parse_args()
    try:
        ok = run(args)
    except Exception as error:  # a failed RPC raises grpc.RpcError, which is an Exception
        print(json.dumps({"call": args.call, "ok": False, "error": str(error)}))
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
