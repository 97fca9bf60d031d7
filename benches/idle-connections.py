#!/usr/bin/env python3
"""Memory per open client connection: idle keep-alive ones, ones that sent nothing, and idle
HTTP/2 ones.

Usage: python3 benches/idle-connections.py <kactivator binary> [count]

Starts a one-line Python backend and kactivator with one shard on 127.0.0.1:28112 (admin
28113), opens `count` (default 5000) connections that each get one request answered and then
sit idle, then `count` more that send nothing, then `count` HTTP/2 connections (h2c prior
knowledge) that each had one stream answered (the activator's own probe, no pod) and sit idle
for 7 s (past the 1 s after which one with no stream open gives back its frame buffers, and
the 5 s sweep that returns freed pages to the system), and prints kactivator's VmRSS after each stage and the growth per connection. Socket buffers are kernel memory and not in VmRSS.
"""
import http.server
import resource
import socket
import subprocess
import sys
import threading
import time

binary = sys.argv[1]
count = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
threading.Thread(target=server.serve_forever, daemon=True).start()
config = f"""[listen]
http = "127.0.0.1:28112"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:28113"
[features]
"activator.pod-quarantine" = "disabled"
[[revisions]]
namespace = "default"
name = "m"
pods = ["127.0.0.1:{server.server_address[1]}"]
"""
with open("/tmp/kactivator-idle-connections.toml", "w") as file:
    file.write(config)
process = subprocess.Popen(
    [binary, "--config", "/tmp/kactivator-idle-connections.toml", "--shards", "1"],
    stderr=subprocess.DEVNULL,
)
try:
    time.sleep(1.0)

    def rss_kib():
        with open(f"/proc/{process.pid}/status") as status:
            line = next(line for line in status if line.startswith("VmRSS"))
        return int(line.split()[1])

    request = b"GET / HTTP/1.1\r\nHost: m.default.svc.cluster.local\r\n\r\n"

    def served():
        sock = socket.create_connection(("127.0.0.1", 28112))
        sock.sendall(request)
        data = b""
        while not data.endswith(b"ok"):
            data += sock.recv(4096)
        return sock

    served().close()
    time.sleep(0.3)
    base = rss_kib()
    idle = [served() for _ in range(count)]
    time.sleep(0.5)
    after_idle = rss_kib()
    silent = [socket.create_connection(("127.0.0.1", 28112)) for _ in range(count)]
    time.sleep(0.5)
    after_silent = rss_kib()
    def frame(kind, flags, stream, payload=b""):
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    authority = b"m.default.svc.cluster.local"
    probe = b"k-network-probe"
    # HPACK: :method GET, :scheme http, :path / (static table), :authority and the probe header
    # as literals without indexing.
    block = (bytes([0x82, 0x86, 0x84, 0x01, len(authority)]) + authority
             + bytes([0x00, len(probe)]) + probe + bytes([len(b"activator")]) + b"activator")
    opening = (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0) + frame(4, 1, 0)
               + frame(1, 0x5, 1, block))

    def h2_served():
        sock = socket.create_connection(("127.0.0.1", 28112))
        sock.sendall(opening)
        data = b""
        while b"activator" not in data:
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError("HTTP/2 connection closed before the answer")
            data += chunk
        return sock

    h2_served().close()
    time.sleep(0.3)
    before_h2 = rss_kib()
    h2 = [h2_served() for _ in range(count)]
    # Past the time after which an HTTP/2 connection with no stream open gives back its frame
    # buffers (RELEASE_IDLE_AFTER in shards/src/http2/server.rs, 1 s) and the shard's next
    # sweep, which returns the freed pages to the system (SWEEP_INTERVAL in shards/src/hub.rs,
    # 5 s).
    time.sleep(7.0)
    after_h2 = rss_kib()
    print(f"idle keep-alive: {count} connections, VmRSS {base} -> {after_idle} KiB, "
          f"{(after_idle - base) * 1024 / count:.0f} B each")
    print(f"sent nothing:    {count} connections, VmRSS {after_idle} -> {after_silent} KiB, "
          f"{(after_silent - after_idle) * 1024 / count:.0f} B each")
    print(f"idle HTTP/2:     {count} connections, VmRSS {before_h2} -> {after_h2} KiB, "
          f"{(after_h2 - before_h2) * 1024 / count:.0f} B each")
finally:
    process.terminate()
    process.wait()
