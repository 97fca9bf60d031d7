#!/usr/bin/env python3
"""A gRPC pod that speaks only HTTP/2: grpcio's server (C core) serving kactivator's Echo test
service, as users run gRPC servers standalone. grpcio refuses HTTP/1.1 (it closes a connection
that does not start with the HTTP/2 preface), so a proxy or a prober that talks HTTP/1.1 to this
pod fails, as it would with a real one. Stubs come from testkit/proto/echo.proto at run time
(echo_stubs.py).

Needs: python3 -m pip install grpcio grpcio-tools grpcio-health-checking

Usage:
    echo_server.py --listen 127.0.0.1:0 --name pod-a [--health serving|not-serving]

Without --health the server has no health service: a health check gets UNIMPLEMENTED, as from
a plain server. With it, the standard grpc.health.v1 service (grpcio-health-checking) answers
for the server as a whole ("") with that status.

Prints `listening <host:port>` once it accepts connections, then one line per call:
`call <Method>` for each Echo call, `health <STATUS>` for each health check the health service
answered, `unimplemented <path>` for each call of a method the server does not have. Stops on
SIGTERM, SIGINT, or when its standard input closes (so it never outlives the test that started
it).
"""

import argparse
import signal
import sys
import threading
import time
from concurrent import futures

from echo_stubs import load_stubs

MAX_MESSAGE_SIZE = 64 * 1024 * 1024
PATTERN = bytes(range(251))


def say(line):
    print(line, flush=True)


def pattern(length):
    """The testkit's pattern from offset 0: byte i is i mod 251."""
    return (PATTERN * (length // len(PATTERN) + 1))[:length]


def sleep_ms(milliseconds):
    if milliseconds:
        time.sleep(milliseconds / 1000)


def make_servicer(pb, pb_grpc, name):
    class Echo(pb_grpc.EchoServicer):
        """As testkit's Rust Echo service (testkit/src/grpc.rs)."""

        def _answer(self, request, seq):
            sleep_ms(request.delay_ms)
            payload = pattern(request.reply_bytes) if request.reply_bytes else request.payload
            return pb.EchoReply(payload=payload, backend=name, seq=seq)

        def Unary(self, request, context):
            say("call Unary")
            return self._answer(request, 0)

        def ServerStream(self, request, context):
            say("call ServerStream")
            for seq in range(request.count):
                if seq:
                    sleep_ms(request.interval_ms)
                yield pb.EchoReply(payload=pattern(request.reply_bytes), backend=name, seq=seq)

        def ClientStream(self, requests, context):
            say("call ClientStream")
            payload = bytearray()
            received = 0
            reply_bytes = 0
            for request in requests:
                sleep_ms(request.delay_ms)
                payload += request.payload
                reply_bytes = request.reply_bytes
                received += 1
            payload = pattern(reply_bytes) if reply_bytes else bytes(payload)
            return pb.EchoReply(payload=payload, backend=name, seq=received)

        def Bidi(self, requests, context):
            say("call Bidi")
            for seq, request in enumerate(requests):
                yield self._answer(request, seq)

    return Echo()


def add_health(server, status_name):
    """The standard health service, saying `status_name` for the server as a whole."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    class Health(health.HealthServicer):
        def Check(self, request, context):
            response = super().Check(request, context)
            say(f"health {health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)}")
            return response

    servicer = Health()
    servicer.set("", health_pb2.HealthCheckResponse.ServingStatus.Value(status_name))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)


def unimplemented_logger():
    """A last handler that records calls no service took (grpcio answers them UNIMPLEMENTED)."""
    import grpc

    class Logger(grpc.GenericRpcHandler):
        def service(self, handler_call_details):
            say(f"unimplemented {handler_call_details.method}")
            return None

    return Logger()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listen", required=True, help="host:port (port 0: any free one)")
    parser.add_argument("--name", required=True, help="the backend name in every reply")
    parser.add_argument("--health", choices=["serving", "not-serving"])
    args = parser.parse_args()

    import grpc

    pb, pb_grpc = load_stubs()
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=32),
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
            ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
            # grpcio binds with SO_REUSEPORT by default: a second server on the same port
            # would share it silently.
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_EchoServicer_to_server(make_servicer(pb, pb_grpc, args.name), server)
    if args.health:
        add_health(server, args.health.upper().replace("-", "_"))
    server.add_generic_rpc_handlers((unimplemented_logger(),))
    port = server.add_insecure_port(args.listen)
    if port == 0:
        print(f"cannot listen on {args.listen}", file=sys.stderr, flush=True)
        return 1
    server.start()
    host = args.listen.rsplit(":", 1)[0]
    say(f"listening {host}:{port}")

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    def watch_stdin():
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    while not stop.wait(0.5):
        pass
    server.stop(grace=None).wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
