#!/usr/bin/env bash
# Instructions per proxied h2c request (callgrind, user space): kactivator (h2c front, h2c to the
# pod, `--driver epoll`: valgrind does not follow io_uring) against nginx (`listen … http2` +
# `grpc_pass`), each run twice under `valgrind --tool=callgrind` with N1 and N2 requests, and
# (I(N2) − I(N1)) / (N2 − N1) reported, so start-up and shutdown cancel out.
#
# The proxy runs on cpu0; the backend (kactivator-testbackend --grpc, which answers GET / over
# h2c) and the client (kactivator-loadgen --h2, C connections × M streams, GET /) on cpu1.
#
#   bash benches/load/h2-callgrind.sh [N1 N2]          # default 5000 25000
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/load/h2-callgrind.sh
#
# Loopback only; every process it starts is stopped at the end. Needs valgrind and nginx.
set -euo pipefail
{
n1=${1:-5000}
n2=${2:-25000}
readonly CONNECTIONS=8 STREAMS=16
readonly BACKEND_PORT=18602 KACT_PORT=18600 KACT_ADMIN=18601 NGINX_PORT=18603
readonly AUTHORITY=bench.default.svc.cluster.local

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
log() { printf '[h2-callgrind %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }
command -v valgrind >/dev/null || die "valgrind is not installed"
command -v nginx >/dev/null || die "nginx is not installed"

log "building kactivator-testbackend and kactivator-loadgen (release)"
env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator-testkit --bin kactivator-testbackend
env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator-loadgen
if [[ -z ${KACTIVATOR_BIN:-} ]]; then
  log "building kactivator (release)"
  env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator --bin kactivator
fi
kactivator_bin=${KACTIVATOR_BIN:-$repo/target/release/kactivator}
backend_bin=$repo/target/release/kactivator-testbackend
loadgen_bin=$repo/target/release/kactivator-loadgen

work=$(mktemp -d /tmp/kactivator-h2-callgrind.XXXXXX)
chmod 755 "$work" # nginx runs as nobody and reads below it
pids=()
cleanup() {
  local pid
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

cat >"$work/kactivator.toml" <<EOF
[listen]
http = "127.0.0.1:$KACT_PORT"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:$KACT_ADMIN"

[[revisions]]
namespace = "default"
name = "bench"
container_concurrency = 0
pods = ["127.0.0.1:$BACKEND_PORT"]
EOF
mkdir -p "$work/nginx-temp"
cat >"$work/nginx.conf" <<EOF
daemon off;
master_process off;
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  http2_max_concurrent_streams 256;
  client_body_temp_path $work/nginx-temp/body;
  proxy_temp_path $work/nginx-temp/proxy;
  fastcgi_temp_path $work/nginx-temp/fastcgi;
  uwsgi_temp_path $work/nginx-temp/uwsgi;
  scgi_temp_path $work/nginx-temp/scgi;
  upstream be { server 127.0.0.1:$BACKEND_PORT; keepalive 256; keepalive_requests 10000000; }
  server {
    listen 127.0.0.1:$NGINX_PORT http2;
    location / { grpc_pass grpc://be; }
  }
}
EOF

taskset -c 1 "$backend_bin" --grpc --listen "127.0.0.1:$BACKEND_PORT" --name bench >"$work/backend.log" 2>&1 &
pids+=($!)

# one PROXY N: the proxy under callgrind, N requests through it, a clean stop; prints I(N).
one() {
  local proxy=$1 n=$2 out="$work/$1-$2.callgrind" pid port i
  local valgrind=(valgrind --tool=callgrind "--callgrind-out-file=$out")
  if [[ $proxy == kactivator ]]; then
    port=$KACT_PORT
    taskset -c 0 "${valgrind[@]}" "$kactivator_bin" --config "$work/kactivator.toml" --shards 1 \
      --driver epoll --drain-grace-seconds 0 >"$work/$proxy-$n.log" 2>&1 &
    pid=$!
    for ((i = 0; i < 600; i++)); do
      curl -s -o /dev/null "http://127.0.0.1:$KACT_ADMIN/readyz" && break
      sleep 0.1
    done
  else
    port=$NGINX_PORT
    taskset -c 0 "${valgrind[@]}" nginx -p "$work" -e "$work/nginx.err" -c "$work/nginx.conf" \
      >"$work/$proxy-$n.log" 2>&1 &
    pid=$!
    # nginx has no readiness endpoint: one request through it, in both runs alike.
    for ((i = 0; i < 600; i++)); do
      curl -s --http2-prior-knowledge -o /dev/null -H "Host: $AUTHORITY" "http://127.0.0.1:$port/" && break
      sleep 0.1
    done
  fi
  pids+=("$pid")
  taskset -c 1 "$loadgen_bin" --url "http://127.0.0.1:$port/" --h2 --streams "$STREAMS" \
    --connections "$CONNECTIONS" --requests "$n" -H "Host: $AUTHORITY" >"$work/$proxy-$n.loadgen" ||
    die "$proxy: the load generator reported errors: $(cat "$work/$proxy-$n.loadgen")"
  if [[ $proxy == kactivator ]]; then
    curl -s -o /dev/null -X POST "http://127.0.0.1:$KACT_ADMIN/quitquitquit" || true
  else
    kill -QUIT "$pid"
  fi
  wait "$pid" || die "$proxy did not exit cleanly: its profile is incomplete"
  awk '/^totals:/ { print $2 }' "$out"
}

declare -A total
for proxy in kactivator nginx; do
  for n in "$n1" "$n2"; do
    log "$proxy under callgrind, $n requests"
    total["$proxy $n"]=$(one "$proxy" "$n")
  done
done

echo "## Instructions per proxied h2c request (callgrind, user space; (I(N2) - I(N1)) / (N2 - N1); GET /, $CONNECTIONS connections x $STREAMS streams)"
echo
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown), kactivator $kactivator_bin"
echo
echo "| proxy | I(N1=$n1) | I(N2=$n2) | instructions/request |"
echo "|---|---|---|---|"
for proxy in kactivator nginx; do
  a=${total["$proxy $n1"]} b=${total["$proxy $n2"]}
  echo "| $proxy | $a | $b | $(((b - a) / (n2 - n1))) |"
done
}
