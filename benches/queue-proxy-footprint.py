#!/usr/bin/env python3
"""The queue-proxy role's footprint (issue 25, items 7 and 8), against the direct path and nginx
as a sidecar, in one run.

Usage: python3 benches/queue-proxy-footprint.py <kactivator binary> [requests] [connections]

Starts a one-line Python backend as the user container, `kactivator queue-proxy` in front of it
with the environment Knative's reconciler sets (one shard, its default; the fork's push off), and
nginx (one worker, `proxy_pass` with upstream keep-alive) in front of the same backend. Then:

* idle RSS: the queue-proxy's VmRSS after one request, once just after start-up and once when
  it has been up for `SETTLED` seconds (it unmaps the code start-up ran 3 s after start,
  `start::UNMAP_START_UP_CODE_AFTER`);
* memory per connection: VmRSS growth with `connections` (default 2000) idle keep-alive
  connections that each had one request answered, divided by their number (socket buffers are
  kernel memory, not in VmRSS);
* added latency: `requests` (default 5000) sequential GETs on one keep-alive connection, direct
  to the backend, through the queue-proxy and through nginx, in alternating blocks of 500; p50
  and p99 of each path and the difference to the direct path. The client is Python, so the
  absolute times carry its cost on every path; the differences are what each proxy adds;
* CPU per request: the proxy process's user + system time over its requests (from
  /proc/PID/stat; nginx's one worker), and the ratio queue-proxy ÷ nginx;
* CPU per request under load, when `wrk` is installed: each proxy in turn under
  `wrk -t1 -c16` for `QP_FOOTPRINT_LOAD_SECONDS` (default 5; 0 leaves it out), two rounds in
  alternating order, the proxy's CPU time over the requests wrk completed. The Python backend
  shares the two cores with the proxy and the client on every path alike.

With `KNATIVE_QUEUE_PROXY=/path/to/queue` (Knative's own queue-proxy, `go build ./cmd/queue`
in knative/serving), the same measurements for it too, started with the same environment plus
the logging and metrics keys the reconciler adds; it binds its fixed ports 8022, 9090 and 9091,
which must be free.

Prints a markdown report. Loopback only; every process it starts is stopped at the end.
"""
import http.server
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

# Seconds after its start at which the queue-proxy's idle RSS is read: start-up's code is
# unmapped after 3 s (`start::UNMAP_START_UP_CODE_AFTER`).
SETTLED = 5
binary = sys.argv[1]
requests = int(sys.argv[2]) if len(sys.argv) > 2 else 5000
connections = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Backend(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Buffered: head and body leave in one write. Unbuffered, the body waits behind Nagle for
    # the ACK of the head, which the peer delays by 40 ms: every path would measure that.
    wbufsize = 1 << 16

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Backend)
threading.Thread(target=server.serve_forever, daemon=True).start()
user_port = server.server_address[1]
qp_port, admin_port, stats_port, drain_port, nginx_port, knative_port = (
    free_port() for _ in range(6))
# config-logging's default zap configuration, as the reconciler passes it.
KNATIVE_LOGGING_CONFIG = ('{"level": "info", "development": false, "outputPaths": ["stdout"], '
                          '"errorOutputPaths": ["stderr"], "encoding": "json", "encoderConfig": '
                          '{"timeKey": "timestamp", "levelKey": "severity", "nameKey": "logger", '
                          '"callerKey": "caller", "messageKey": "message", "stacktraceKey": '
                          '"stacktrace", "lineEnding": "", "levelEncoder": "", "timeEncoder": '
                          '"iso8601", "durationEncoder": "", "callerEncoder": ""}}')
work = tempfile.mkdtemp(prefix="kactivator-qp-footprint-")
processes = []


def die_with_parent():
    """In the child before exec: killed when this script dies, however it dies (a timeout's
    SIGKILL skips the `finally` below)."""
    import ctypes
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS"))
    return int(line.split()[1])


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    # utime and stime are fields 14 and 15 of stat(5); after the name, 12 and 13 (0-based 11, 12).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


env = {
    "PATH": os.environ.get("PATH", ""),
    "SERVING_NAMESPACE": "default",
    "SERVING_SERVICE": "hello",
    "SERVING_CONFIGURATION": "hello",
    "SERVING_REVISION": "hello-00001",
    "SERVING_POD": "hello-00001-deployment-bench",
    "SERVING_POD_IP": "127.0.0.1",
    "QUEUE_SERVING_PORT": str(qp_port),
    "QUEUE_SERVING_TLS_PORT": str(free_port()),
    "USER_PORT": str(user_port),
    "CONTAINER_CONCURRENCY": "0",
    "REVISION_TIMEOUT_SECONDS": "300",
    "SERVING_READINESS_PROBE": '{"tcpSocket":{"port":%d,"host":"127.0.0.1"},"successThreshold":1}'
    % user_port,
    "ACTIVATOR_SERVICE_URL": "",
}
try:
    qp_started = time.time()
    qp = subprocess.Popen(
        [binary, "queue-proxy", "--admin", f"127.0.0.1:{admin_port}",
         "--autoscaler-metrics", f"127.0.0.1:{stats_port}",
         "--drain-admin", f"127.0.0.1:{drain_port}"],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, preexec_fn=die_with_parent,
        stderr=open(os.path.join(work, "queue-proxy.log"), "w"),
    )
    processes.append(qp)
    # Knative's own queue-proxy, when given: the reconciler's environment on its own port.
    knative = os.environ.get("KNATIVE_QUEUE_PROXY")
    knative_qp = None
    if knative:
        for port in (8022, 9090, 9091):
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    raise RuntimeError(f"port {port} is taken; Knative's queue-proxy needs it")
        knative_env = dict(env, QUEUE_SERVING_PORT=str(knative_port),
                           QUEUE_SERVING_TLS_PORT=str(free_port()),
                           SERVING_LOGGING_CONFIG=KNATIVE_LOGGING_CONFIG,
                           SERVING_LOGGING_LEVEL="info",
                           SERVING_REQUEST_METRICS_BACKEND="prometheus",
                           SERVING_REQUEST_METRICS_REPORTING_PERIOD_SECONDS="5",
                           TRACING_CONFIG_BACKEND="none",
                           SERVING_ENABLE_PROBE_REQUEST_LOG="false",
                           SERVING_ENABLE_REQUEST_LOG="false")
        knative_qp = subprocess.Popen(
            [knative], env=knative_env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(work, "knative-queue-proxy.log"), "w"),
            preexec_fn=die_with_parent)
        processes.append(knative_qp)
    # nginx as the sidecar peer, when installed (QP_FOOTPRINT_NGINX=0 leaves it out).
    nginx = shutil.which("nginx") if os.environ.get("QP_FOOTPRINT_NGINX", "1") == "1" else None
    nginx_worker = None
    if nginx:
        conf = os.path.join(work, "nginx.conf")
        with open(conf, "w") as file:
            file.write(f"""worker_processes 1;
daemon off;
error_log {work}/nginx-error.log;
pid {work}/nginx.pid;
events {{ worker_connections 8192; }}
http {{
  access_log off;
  keepalive_requests 10000000;
  upstream app {{ server 127.0.0.1:{user_port}; keepalive 64; keepalive_requests 10000000; }}
  server {{
    listen 127.0.0.1:{nginx_port};
    location / {{
      proxy_pass http://app;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }}
  }}
}}
""")
        master = subprocess.Popen([nginx, "-c", conf, "-p", work], preexec_fn=die_with_parent,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        processes.append(master)
    deadline = time.time() + 15
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/readyz", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.time() > deadline:
            raise RuntimeError("the queue-proxy never became ready: "
                               + open(os.path.join(work, "queue-proxy.log")).read())
        time.sleep(0.05)
    if nginx:
        time.sleep(0.5)
        children = subprocess.run(["pgrep", "-P", str(processes[-1].pid)],
                                  capture_output=True, text=True).stdout.split()
        nginx_worker = int(children[0]) if children else None

    request = b"GET / HTTP/1.1\r\nHost: hello.default.example.com\r\n\r\n"

    def served(port):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(request)
        data = b""
        while not data.endswith(b"ok"):
            chunk = sock.recv(4096)
            if not chunk:
                raise RuntimeError(f"port {port} closed the connection")
            data += chunk
        return sock

    def ping_pong(sock, count):
        times = []
        for _ in range(count):
            start = time.perf_counter_ns()
            sock.sendall(request)
            data = b""
            while not data.endswith(b"ok"):
                chunk = sock.recv(4096)
                if not chunk:
                    raise RuntimeError(f"closed after {len(times)} requests: {data!r}")
                data += chunk
            times.append((time.perf_counter_ns() - start) / 1000)
        return times

    if knative_qp:
        deadline = time.time() + 15
        while True:
            try:
                served(knative_port).close()
                break
            except OSError:
                if time.time() > deadline or knative_qp.poll() is not None:
                    raise RuntimeError("Knative's queue-proxy never served: " + open(
                        os.path.join(work, "knative-queue-proxy.log")).read()[-1500:])
                time.sleep(0.05)
    print("ready; measuring memory", file=sys.stderr, flush=True)
    served(qp_port).close()
    time.sleep(0.3)
    start_up_rss = rss_kib(qp.pid)
    time.sleep(max(0.0, qp_started + SETTLED - time.time()))
    served(qp_port).close()
    time.sleep(0.3)
    idle_rss = rss_kib(qp.pid)
    knative_rss = rss_kib(knative_qp.pid) if knative_qp else None
    idle = [served(qp_port) for _ in range(connections)]
    time.sleep(0.5)
    with_idle = rss_kib(qp.pid)
    for sock in idle:
        sock.close()

    paths = [("direct", user_port, None), ("queue-proxy", qp_port, qp.pid)]
    if nginx_worker:
        paths.append(("nginx", nginx_port, nginx_worker))
    if knative_qp:
        paths.append(("Knative's queue-proxy", knative_port, knative_qp.pid))
    socks = {name: served(port) for name, port, _ in paths}
    for sock in socks.values():
        sock.settimeout(5)
    times = {name: [] for name, _, _ in paths}
    cpu = {name: 0.0 for name, _, _ in paths}
    for block in range(max(1, requests // 500)):
        order = paths if block % 2 == 0 else list(reversed(paths))
        for name, _, pid in order:
            before = cpu_seconds(pid) if pid else 0.0
            times[name] += ping_pong(socks[name], 500)
            if pid:
                cpu[name] += cpu_seconds(pid) - before

    # Under load: each proxy path in turn, two rounds in alternating order.
    load_seconds = int(os.environ.get("QP_FOOTPRINT_LOAD_SECONDS", "5"))
    wrk = shutil.which("wrk") if load_seconds > 0 else None
    loaded = {name: [0.0, 0] for name, _, pid in paths if pid}
    if wrk:
        for sock in socks.values():
            sock.close()
        proxies = [(name, port, pid) for name, port, pid in paths if pid]
        for round_ in range(2):
            order = proxies if round_ % 2 == 0 else list(reversed(proxies))
            for name, port, pid in order:
                before = cpu_seconds(pid)
                report = subprocess.run(
                    [wrk, "-t1", "-c16", f"-d{load_seconds}s", f"http://127.0.0.1:{port}/"],
                    capture_output=True, text=True, check=True).stdout
                spent = cpu_seconds(pid) - before
                done = int(re.search(r"(\d+) requests in", report).group(1))
                errors = re.search(r"Non-2xx or 3xx responses: (\d+)|Socket errors", report)
                if errors:
                    raise RuntimeError(f"{name} under load: {report}")
                loaded[name][0] += spent
                loaded[name][1] += done

    def pct(values, q):
        ordered = sorted(values)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    print(f"## queue-proxy footprint ({binary}, `kactivator --version`: "
          + subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
          + ")\n")
    print(f"* idle RSS: **{idle_rss / 1024:.1f} MiB** (VmRSS after one request, one shard, "
          f"{SETTLED} s after start); just after start-up {start_up_rss / 1024:.1f} MiB")
    print(f"* {connections} idle keep-alive connections: VmRSS {idle_rss} -> {with_idle} KiB, "
          f"**{(with_idle - idle_rss) * 1024 / connections:.0f} B per connection**\n")
    direct50, direct99 = pct(times["direct"], 0.5), pct(times["direct"], 0.99)
    print(f"{requests} sequential requests per path on one keep-alive connection, in alternating "
          "blocks of 500 (µs, Python client on loopback):\n")
    print("| path | p50 | p99 | added p50 | added p99 | CPU per request (proxy process) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, _, pid in paths:
        p50, p99 = pct(times[name], 0.5), pct(times[name], 0.99)
        per_request = f"{cpu[name] / len(times[name]) * 1e6:.1f} µs" if pid else "—"
        added = "—" if name == "direct" else f"{p50 - direct50:.1f}"
        added99 = "—" if name == "direct" else f"{p99 - direct99:.1f}"
        print(f"| {name} | {p50:.1f} | {p99:.1f} | {added} | {added99} | {per_request} |")
    if nginx_worker and cpu["nginx"] > 0:
        print(f"\nCPU per request, queue-proxy ÷ nginx: **{cpu['queue-proxy'] / cpu['nginx']:.2f}** "
              "(clock-tick resolution: 10 ms per reading)")
    elif not nginx:
        print("\nno nginx in this run (not installed, or QP_FOOTPRINT_NGINX=0)")
    if wrk:
        print(f"\nUnder load (`wrk -t1 -c16`, {load_seconds} s per proxy, two rounds):\n")
        print("| path | requests | rps | CPU per request (proxy process) |")
        print("|---|---:|---:|---:|")
        for name, (spent, done) in loaded.items():
            print(f"| {name} | {done} | {done / (2 * load_seconds):.0f} | "
                  f"{spent / max(done, 1) * 1e6:.1f} µs |")
        base = loaded["queue-proxy"][0] / max(loaded["queue-proxy"][1], 1)
        for name, (spent, done) in loaded.items():
            if name != "queue-proxy" and spent > 0:
                print(f"\nUnder load, CPU per request, queue-proxy ÷ {name}: "
                      f"**{base / (spent / done):.2f}**")
    if knative_qp:
        name = "Knative's queue-proxy"
        print(f"\nKnative's queue-proxy ({knative}): idle RSS **{knative_rss / 1024:.1f} MiB** "
              f"{SETTLED} s after start, one request served")
        if cpu[name] > 0:
            print(f"\nCPU per request, queue-proxy ÷ Knative's queue-proxy: "
                  f"**{cpu['queue-proxy'] / cpu[name]:.2f}**")
except Exception:
    for log in ("nginx-error.log", "queue-proxy.log", "knative-queue-proxy.log"):
        path = os.path.join(work, log)
        if os.path.exists(path):
            print(f"--- {log}", open(path).read()[-1500:], file=sys.stderr)
    raise
finally:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
    shutil.rmtree(work, ignore_errors=True)
