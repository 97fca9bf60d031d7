#!/usr/bin/env bash
# TLS termination, kactivator against nginx with OpenSSL, on this machine (issue 38).
#
# Layout (as run.sh's L1): the proxy under test on cpu0 with one worker or shard; an nginx
# backend (plain HTTP, `return 200 "ok"`) and wrk on cpu1. Both proxies terminate TLS 1.3 with
# the same ECDSA P-256 certificate, X25519, no session resumption (kactivator has none; nginx's
# tickets and cache are off), and proxy in plain HTTP/1.1 with keep-alive to the backend.
# TLS on both sides: the same backend nginx also serves `return 200 "ok"` over TLS 1.3 on a port
# of its own with that certificate, and each proxy has a route that dials it over TLS (nginx: a
# second server block, `proxy_pass https://`; kactivator: a second revision, `bench-tls`, with
# `[revisions.tls]`), verifying the certificate (self-signed, so its own CA) for bench.test.
#
# Figures, each the median of --rounds rounds in alternating order:
#   keep-alive    wrk -c50 over HTTPS keep-alive: requests/s and the proxy's CPU time per
#                 request (utime + stime of its process over the run / requests)
#   both-keepalive  the same, client --TLS--> proxy --TLS--> backend: TLS on both sides, the
#                 upstream connections kept alive (so this is the records' cost, not handshakes)
#   handshakes    wrk -c50 with `Connection: close`: every request a new connection and a full
#                 handshake; handshakes/s and the proxy's CPU time per handshake
#   idle memory   1000 TLS connections opened, one request each, then left idle: the proxy's
#                 resident set grown, per connection
#
#   instructions  (--callgrind, instead of the above) callgrind's instructions per request in
#                 user space, (I(N2) - I(N1)) / (N2 - N1), for kactivator (--driver epoll:
#                 valgrind does not follow io_uring) over TLS and over plain HTTP, and nginx over
#                 TLS; the client is Python's ssl module, 10 keep-alive connections, requests one
#                 at a time (the client's own work is not counted)
#
# Usage: bash benches/load/tls.sh [--rounds N] [--duration SECS] [--idle N] [--callgrind]
#   KACTIVATOR_BIN=/path/to/kactivator measures that binary (default: a release build)
set -euo pipefail

rounds=3
duration=10
idle=1000
callgrind=0
while (($#)); do
  case $1 in
    --callgrind) callgrind=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --idle) idle=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done

cd "$(dirname "$0")/../.."
for tool in wrk nginx openssl python3 taskset curl; do
  command -v "$tool" >/dev/null || { echo "tls.sh needs $tool" >&2; exit 1; }
done
if [[ -z ${KACTIVATOR_BIN:-} ]]; then
  cargo build --release --quiet --bin kactivator
  KACTIVATOR_BIN=target/release/kactivator
fi

work=$(mktemp -d /tmp/kactivator-tls-bench.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
log() { printf '[tls %s] %s\n' "$(date +%T)" "$*" >&2; }

BACKEND=18301
NGINX=18302
KACT=18303
KACT_PLAIN=18304
KACT_ADMIN=18305
BACKEND_TLS=18306 # the backend over TLS, for TLS on both sides
NGINX_BOTH=18307  # nginx proxying to BACKEND_TLS over TLS

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -subj /CN=bench.test -addext subjectAltName=DNS:bench.test \
  -addext basicConstraints=critical,CA:FALSE \
  -keyout "$work/tls.key" -out "$work/tls.crt" 2>/dev/null

nginx_conf() {
  local name=$1 body=$2
  mkdir -p "$work/$name-temp"
  cat >"$work/$name.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/$name.pid;
error_log $work/$name.err warn;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path $work/$name-temp/body;
  proxy_temp_path $work/$name-temp/proxy;
  fastcgi_temp_path $work/$name-temp/fastcgi;
  uwsgi_temp_path $work/$name-temp/uwsgi;
  scgi_temp_path $work/$name-temp/scgi;
  upstream be { server 127.0.0.1:$BACKEND; keepalive 128; keepalive_requests 10000000; }
  $body
}
EOF
}

nginx_conf backend "server { listen 127.0.0.1:$BACKEND reuseport backlog=4096; location / { return 200 \"ok\"; } }
  server {
    listen 127.0.0.1:$BACKEND_TLS ssl reuseport backlog=4096;
    ssl_certificate $work/tls.crt;
    ssl_certificate_key $work/tls.key;
    ssl_protocols TLSv1.3;
    ssl_session_tickets off;
    ssl_session_cache off;
    location / { return 200 \"ok\"; }
  }"
nginx_conf proxy "server {
    listen 127.0.0.1:$NGINX ssl reuseport backlog=4096;
    ssl_certificate $work/tls.crt;
    ssl_certificate_key $work/tls.key;
    ssl_protocols TLSv1.3;
    ssl_session_tickets off;
    ssl_session_cache off;
    location / { proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection \"\"; }
  }
  upstream be_tls { server 127.0.0.1:$BACKEND_TLS; keepalive 128; keepalive_requests 10000000; }
  # TLS on both sides. kactivator has no TLS session resumption to its pods either, so nginx's
  # is off too (proxy_ssl_session_reuse): a new upstream connection is a full handshake on both.
  server {
    listen 127.0.0.1:$NGINX_BOTH ssl reuseport backlog=4096;
    ssl_certificate $work/tls.crt;
    ssl_certificate_key $work/tls.key;
    ssl_protocols TLSv1.3;
    ssl_session_tickets off;
    ssl_session_cache off;
    location / {
      proxy_pass https://be_tls;
      proxy_http_version 1.1;
      proxy_set_header Connection \"\";
      proxy_ssl_protocols TLSv1.3;
      proxy_ssl_server_name on;
      proxy_ssl_name bench.test;
      proxy_ssl_verify on;
      proxy_ssl_trusted_certificate $work/tls.crt;
      proxy_ssl_session_reuse off;
    }
  }"
cat >"$work/kactivator.toml" <<EOF
[listen]
http = "127.0.0.1:$KACT_PLAIN"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:$KACT_ADMIN"
https = "127.0.0.1:$KACT"
[listen.tls]
certificates = [{ chain = "$work/tls.crt", key = "$work/tls.key" }]
alpn = ["http/1.1"]

[features]
"activator.pod-quarantine" = "disabled"

[[revisions]]
namespace = "default"
name = "bench"
container_concurrency = 0
pods = ["127.0.0.1:$BACKEND"]

# TLS on both sides: the backend's TLS port, the self-signed certificate its own CA.
[[revisions]]
namespace = "default"
name = "bench-tls"
container_concurrency = 0
pods = ["127.0.0.1:$BACKEND_TLS"]
[revisions.tls]
ca = "$work/tls.crt"
server_name = "bench.test"
EOF

taskset -c 1 nginx -p "$work" -e "$work/backend.err" -c "$work/backend.conf" &
pids+=($!)

# === instructions per request (--callgrind) ===
if ((callgrind)); then
  command -v valgrind >/dev/null || { log "--callgrind needs valgrind"; exit 1; }
  N1=2000
  N2=10000
  # client.py SCHEME PORT N: N requests over 10 keep-alive connections, one at a time.
  cat >"$work/client.py" <<'PYEOF'
import socket, ssl, sys
scheme, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
context.set_alpn_protocols(["http/1.1"])
def connect():
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return context.wrap_socket(raw, server_hostname="bench.test") if scheme == "https" else raw
conns = [connect() for _ in range(10)]
request = b"GET / HTTP/1.1\r\nHost: bench\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: bench\r\n\r\n"
for i in range(n):
    s = conns[i % 10]
    s.sendall(request)
    got = b""
    while not (b"\r\n\r\n" in got and got.endswith(b"ok")):
        chunk = s.recv(65536)
        if not chunk:
            sys.exit("closed")
        got += chunk
PYEOF
  # total NAME N SCHEME PORT CMD...: I(N) of CMD under callgrind on cpu0 after N requests.
  total() {
    local name=$1 n=$2 scheme=$3 port=$4 pid out="$work/$1-$2.callgrind"
    shift 4
    taskset -c 0 valgrind --tool=callgrind "--callgrind-out-file=$out" "$@" 2>"$work/$name-$n.log" &
    pid=$!
    for _ in $(seq 600); do
      curl -sk --max-time 2 -o /dev/null "${ROUTE[@]}" "$scheme://127.0.0.1:$port/" && break
      sleep 0.2
    done
    taskset -c 1 python3 "$work/client.py" "$scheme" "$port" "$n" || { log "$name: the client failed"; exit 1; }
    if [[ $name == nginx* ]]; then kill -QUIT "$pid"; else
      curl -s -o /dev/null --max-time 120 -X POST "http://127.0.0.1:$KACT_ADMIN/quitquitquit" || true
    fi
    wait "$pid" || true
    awk '/^totals:/ { print $2 }' "$out"
  }
  ROUTE=(-H "Knative-Serving-Namespace: default" -H "Knative-Serving-Revision: bench")
  kact=("$KACTIVATOR_BIN" --config "$work/kactivator.toml" --shards 1 --driver epoll --drain-grace-seconds 0)
  printf '\n%-20s %14s %14s %12s\n' proxy "I(N1=$N1)" "I(N2=$N2)" "per request"
  for row in "kactivator https" "kactivator http" "nginx https"; do
    counts=()
    for n in $N1 $N2; do
      case $row in
        "kactivator https") counts+=("$(total kact-tls "$n" https $KACT "${kact[@]}")") ;;
        "kactivator http") counts+=("$(total kact-plain "$n" http $KACT_PLAIN "${kact[@]}")") ;;
        "nginx https") counts+=("$(total nginx-tls "$n" https $NGINX nginx -p "$work" -e "$work/proxy.err" -c "$work/proxy.conf")") ;;
      esac
    done
    printf '%-20s %14s %14s %12s\n' "$row" "${counts[0]}" "${counts[1]}" $(((counts[1] - counts[0]) / (N2 - N1)))
  done
  exit 0
fi
taskset -c 0 nginx -p "$work" -e "$work/proxy.err" -c "$work/proxy.conf" &
nginx_pid=$!
pids+=($nginx_pid)
taskset -c 0 "$KACTIVATOR_BIN" --config "$work/kactivator.toml" --shards 1 --drain-grace-seconds 0 \
  2>"$work/kactivator.log" &
kact_pid=$!
pids+=($kact_pid)

ROUTE=(-H "Knative-Serving-Namespace: default" -H "Knative-Serving-Revision: bench")
for port in $NGINX $KACT; do
  for _ in $(seq 100); do
    curl -sk --max-time 1 "${ROUTE[@]}" "https://127.0.0.1:$port/" 2>/dev/null | grep -q ok && break
    sleep 0.1
  done
  curl -sk "${ROUTE[@]}" "https://127.0.0.1:$port/" | grep -q ok || { log "port $port does not answer"; exit 1; }
done
# TLS on both sides: the backend's TLS port, then each proxy through it, with the certificate
# verified for bench.test (not -k), so a route that falls back to plain or to the wrong
# revision is caught here rather than measured.
ROUTE_TLS=(-H "Knative-Serving-Namespace: default" -H "Knative-Serving-Revision: bench-tls")
for port in $BACKEND_TLS $NGINX_BOTH $KACT; do
  for _ in $(seq 100); do
    [[ $(curl -s --max-time 1 -o /dev/null -w '%{http_code}' --cacert "$work/tls.crt" \
      --resolve "bench.test:$port:127.0.0.1" "${ROUTE_TLS[@]}" "https://bench.test:$port/") == 200 ]] && break
    sleep 0.1
  done
  answer=$(curl -sS --max-time 5 -w ' %{http_code}' --cacert "$work/tls.crt" \
    --resolve "bench.test:$port:127.0.0.1" "${ROUTE_TLS[@]}" "https://bench.test:$port/" 2>&1) || true
  if [[ $answer != "ok 200" ]]; then
    log "port $port does not answer 200 through the TLS backend: $answer"
    tail -n 20 "$work/kactivator.log" "$work/proxy.err" "$work/backend.err" >&2 2>/dev/null || true
    exit 1
  fi
done

for port in $NGINX $KACT; do
  log "$port: $(openssl s_client -connect 127.0.0.1:$port -servername bench.test -brief </dev/null 2>&1 |
    grep -E 'Protocol version|Ciphersuite|Server Temp Key|Negotiated TLS1.3 group' | tr '\n' ' ')"
done

cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)

# run NAME PID PORT MODE: one wrk run; prints "rate cpu_us_per_request".
run() {
  local pid=$2 port=$3 mode=$4 before after out rate requests extra=() route=("${ROUTE[@]}")
  [[ $mode == handshakes ]] && extra=(-H "Connection: close")
  [[ $mode == both-keepalive ]] && route=("${ROUTE_TLS[@]}")
  before=$(cpu_ticks "$pid")
  out=$(taskset -c 1 wrk -t1 -c50 -d"${duration}s" "${route[@]}" "${extra[@]}" "https://127.0.0.1:$port/")
  after=$(cpu_ticks "$pid")
  rate=$(awk '/^Requests\/sec:/ { print $2 }' <<<"$out")
  requests=$(awk '/requests in/ { print $1 }' <<<"$out")
  if grep -q "Socket errors\|Non-2xx" <<<"$out"; then log "$1 $mode: $(grep -E 'Socket errors|Non-2xx' <<<"$out")"; fi
  # Answers other than 200 are not what is measured (a route lost mid-run answers 404 fast).
  if grep -q "Non-2xx" <<<"$out"; then log "$1 $mode: not every answer was 200; stopping"; exit 1; fi
  awk -v r="$rate" -v n="$requests" -v t=$((after - before)) -v hz="$hz" \
    'BEGIN { printf "%.0f %.1f\n", r, t / hz * 1e6 / n }'
}

median() { sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

declare -A rates cpus
for mode in keepalive both-keepalive handshakes; do
  # kactivator routes by revision on its one TLS port; nginx by port.
  nginx_port=$NGINX
  [[ $mode == both-keepalive ]] && nginx_port=$NGINX_BOTH
  for round in $(seq "$rounds"); do
    order=(nginx kactivator)
    ((round % 2 == 0)) && order=(kactivator nginx)
    for who in "${order[@]}"; do
      if [[ $who == nginx ]]; then read -r rate cpu < <(run nginx $nginx_pid $nginx_port $mode)
      else read -r rate cpu < <(run kactivator $kact_pid $KACT $mode); fi
      [[ -n ${cpu:-} ]] || exit 1 # run said why
      log "$mode round $round $who: $rate /s, $cpu us CPU each"
      rates[$who-$mode]+="$rate "
      cpus[$who-$mode]+="$cpu "
    done
  done
done

# Idle connections: the resident set before and after $idle TLS connections that made one
# request each and then wait.
rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
idle_kib() {
  local pid=$1 port=$2 before after
  before=$(rss_kib "$pid")
  python3 - "$port" "$idle" "$work/idle-$port.ready" <<'EOF' &
import socket, ssl, sys, time, os
port, count, ready = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE
context.set_alpn_protocols(["http/1.1"])
conns = []
for _ in range(count):
    s = context.wrap_socket(socket.create_connection(("127.0.0.1", port)), server_hostname="bench.test")
    s.sendall(b"GET / HTTP/1.1\r\nHost: bench\r\nKnative-Serving-Namespace: default\r\nKnative-Serving-Revision: bench\r\n\r\n")
    got = b""
    while not got.endswith(b"ok"):
        got += s.recv(4096)
    conns.append(s)
open(ready, "w").close()
time.sleep(30)
EOF
  local client=$!
  for _ in $(seq 600); do [[ -e $work/idle-$port.ready ]] && break; sleep 0.1; done
  sleep 2 # the idle buffers are given back after a second
  after=$(rss_kib "$pid")
  kill "$client" 2>/dev/null || true
  wait "$client" 2>/dev/null || true
  awk -v a="$after" -v b="$before" -v n="$idle" 'BEGIN { printf "%.1f\n", (a - b) / n }'
}
nginx_idle=$(idle_kib $nginx_pid $NGINX)
kact_idle=$(idle_kib $kact_pid $KACT)

printf '\n%-14s %-11s %12s %14s\n' mode proxy "rate (/s)" "CPU us each"
for mode in keepalive both-keepalive handshakes; do
  for who in nginx kactivator; do
    printf '%-14s %-11s %12s %14s\n' "$mode" "$who" \
      "$(tr ' ' '\n' <<<"${rates[$who-$mode]}" | grep . | median)" \
      "$(tr ' ' '\n' <<<"${cpus[$who-$mode]}" | grep . | median)"
  done
done
printf '%-14s %-11s %12s\n' "idle KiB" nginx "$nginx_idle"
printf '%-14s %-11s %12s\n' "idle KiB" kactivator "$kact_idle"
