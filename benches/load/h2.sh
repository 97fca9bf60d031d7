#!/usr/bin/env bash
# HTTP/2 cleartext (h2c) load benchmark: the backend directly, through nginx (`listen … http2` +
# `grpc_pass`), through haproxy (`proto h2` on both sides) and through kactivator (h2c front, h2c
# to the pod), in two layouts: L1 of benches/load/run.sh (proxy and backend on cpu0, client on
# cpu1: requests per second and per proxy CPU-second) and P1, the same-CPU ping-pong (backend,
# proxy and one client stream all on cpu0: the latency each proxy adds over direct). See
# benches/load/README.md ("HTTP/2: h2.sh") for what the numbers mean.
#
# The client is our own `kactivator-loadgen --h2`: every req/s, percentile and error figure
# comes from it (h2load prints no percentiles, and does not read gRPC trailers), so a row's
# req/s and p99 come from the same run. It costs ~1.3x h2load's CPU per request on its own
# CPU. Whether its req/s agree with h2load's was not settled on the busy machine it was written
# on (see the README): `--h2load` adds one h2load run per row and round in L1 and an
# "h2load req/s" column, to check that on the machine that measures.
#
#   bash benches/load/h2.sh [--quick] [--rounds N] [--duration SECS] [--workloads get,grpc]
#                           [--layouts L1,P1] [--only-pingpong] [--clients C] [--streams M]
#                           [--h2load] [--callgrind] [--no-load]
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/load/h2.sh   # measure that binary, no build
set -euo pipefail

# One compound command: bash parses all of it before running any of it.
{

usage() {
  cat <<'EOF'
usage: bash benches/load/h2.sh [options]

  --quick            3 s runs, 1 round (a smoke test, not a figure)
  --rounds N         rounds, row order alternating between rounds (default 3)
  --duration SECS    duration of each client run (default 10)
  --workloads LIST   comma-separated, from get (GET /) and grpc (unary Echo call); default get,grpc
  --layouts LIST     comma-separated, from L1 (client on cpu1, C x M streams) and P1 (same-CPU
                     ping-pong, one stream; alias pingpong); default L1,P1
  --only-pingpong    only the same-CPU ping-pong: --layouts P1
  --clients C        L1 connections (default 8)
  --streams M        L1 concurrent streams per connection (default 16)
  --h2load           in L1, also run h2load -cC -mM against every row and round, a cross-check
                     of the loadgen's req/s (doubles the time of L1)
  --callgrind        also count instructions per proxied h2c request (GET /, C x M streams):
                     kactivator --driver epoll and nginx under callgrind, N1 and N2 requests
                     each, (I(N2) - I(N1)) / (N2 - N1) (needs valgrind; ~2 min)
  --no-load          skip the load layouts (with --callgrind: only the instruction counts)

Environment: KACTIVATOR_BIN=PATH measures that kactivator binary instead of building
target/release/kactivator. Results go to target/bench-results/h2-<timestamp>.txt.
EOF
}

rounds=3
duration=10
warmup=1
workloads=(get grpc)
layouts=(L1 P1)
clients=8
streams=16
with_h2load=0
with_callgrind=0
want_load=1
readonly CALLGRIND_N1=5000 CALLGRIND_N2=25000
while (($#)); do
  case "$1" in
    --quick) rounds=1 duration=3 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift ;;
    --duration) duration=${2:?--duration needs a value}; shift ;;
    --workloads) IFS=, read -r -a workloads <<<"${2:?--workloads needs a value}"; shift ;;
    --layouts) IFS=, read -r -a layouts <<<"${2:?--layouts needs a value}"; shift ;;
    --only-pingpong) layouts=(P1) ;;
    --clients) clients=${2:?--clients needs a value}; shift ;;
    --streams) streams=${2:?--streams needs a value}; shift ;;
    --h2load) with_h2load=1 ;;
    --callgrind) with_callgrind=1 ;;
    --no-load) want_load=0 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "h2.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for n in "$rounds" "$duration" "$clients" "$streams"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "h2.sh: --rounds, --duration, --clients, --streams take positive integers" >&2; exit 2; }
done
((${#workloads[@]})) || { echo "h2.sh: --workloads needs at least one of get, grpc" >&2; exit 2; }
for w in "${workloads[@]}"; do
  [[ $w == get || $w == grpc ]] || { echo "h2.sh: unknown workload '$w' (get, grpc)" >&2; exit 2; }
done
((${#layouts[@]})) || { echo "h2.sh: --layouts needs at least one of L1, P1" >&2; exit 2; }
deduped=()
for layout in "${layouts[@]}"; do
  case $layout in
    L1 | P1) ;;
    pingpong) layout=P1 ;;
    *) echo "h2.sh: unknown layout '$layout' (L1, P1 or pingpong)" >&2; exit 2 ;;
  esac
  [[ " ${deduped[*]} " == *" $layout "* ]] || deduped+=("$layout")
done
layouts=("${deduped[@]}")
want_layout() { ((want_load)) && [[ " ${layouts[*]} " == *" $1 "* ]]; }
((want_load || with_callgrind)) || { echo "h2.sh: --no-load leaves nothing to do without --callgrind" >&2; exit 2; }
((with_h2load)) && ! want_layout L1 && { echo "h2.sh: --h2load needs layout L1" >&2; exit 2; }

# === fixed layout ===

readonly BACKEND_PORT=18200
readonly NGINX_PORT=18201
readonly KACT_URING_PORT=18202 KACT_URING_ADMIN=19202
readonly KACT_EPOLL_PORT=18203 KACT_EPOLL_ADMIN=19203
readonly HAPROXY_PORT=18204
# --callgrind: nginx (master_process off) or kactivator under valgrind, one at a time.
readonly CALLGRIND_PORT=18205 CALLGRIND_ADMIN=19205
# The backend and the proxies always run on cpu0. The client runs on cpu1 in L1 and on cpu0
# with them in P1, with C x M streams in L1 and one stream in P1.
readonly PROXY_CPU=0 CLIENT_CPU=1
declare -A client_cpu=([L1]=$CLIENT_CPU [P1]=$PROXY_CPU)
declare -A client_connections=([L1]=$clients [P1]=1)
declare -A client_streams=([L1]=$streams [P1]=1)
# The CPU whose /proc/stat line the foreign-CPU check reads (empty: all CPUs).
declare -A stat_cpu=([L1]="" [P1]=$PROXY_CPU)
readonly AUTHORITY=bench.default.svc.cluster.local
readonly START_TIMEOUT=10
readonly FOREIGN_CPU_LIMIT=5
readonly GRPC_PATH=/kactivator.test.v1.Echo/Unary

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
export PATH="$PATH:/usr/sbin:/sbin"

stamp=$(date +%Y%m%d-%H%M%S)
results_dir="$repo/target/bench-results"
results="$results_dir/h2-$stamp.txt"
mkdir -p "$results_dir"
: >"$results"

work=$(mktemp -d /tmp/kactivator-h2.XXXXXX)
chmod 755 "$work" # nginx workers run as nobody and read below it
# One line per measured run:
#   1 layout, 2 workload, 3 round, 4 row, 5 client (loadgen or h2load), 6 req/s, 7 p50_us,
#   8 p99_us, 9 max_us (7-9 "-" for h2load), 10 errors, 11 foreign CPU %, 12 succeeded,
#   13 proxy ticks, 14 backend ticks
records="$work/records.tsv"
: >"$records"

log() { printf '[h2 %s] %s\n' "$(date +%T)" "$*" >&2; }
die() { log "FATAL: $*"; exit 1; }
raw() { printf '%s\n' "$*" >>"$results"; }

# === processes ===

started_pids=()
descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do
    descendants "$child"
    echo "$child"
  done
}
stop_pid() {
  local pid=$1 signal=${2:-TERM} i tree
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }
  tree="$(descendants "$pid") $pid"
  # shellcheck disable=SC2086
  kill -s "$signal" $tree 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  # shellcheck disable=SC2086
  kill -KILL $tree 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local status=$? pid
  trap - EXIT INT TERM
  for pid in "${started_pids[@]}"; do stop_pid "$pid" TERM; done
  if ((status != 0)); then
    local kept="$results_dir/h2-$stamp-logs"
    mkdir -p "$kept"
    cp "$work"/*.log "$work"/*.err "$work"/run-*.txt "$kept/" 2>/dev/null || true
    log "failed (exit $status); logs kept in $kept/"
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

last_pid=
start() { # start NAME CPU COMMAND...
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$work/$name.log" 2>&1 &
  last_pid=$!
  started_pids+=("$last_pid")
  raw "start $name (pid $last_pid, cpu $cpu): $*"
}
log_tail() {
  local f
  for f in "$work/$1.log" "$work/$1.err"; do
    [[ -s $f ]] && sed 's/^/    | /' "$f" | tail -n 15 >&2
  done
  return 0
}
require_port_free() {
  local port
  for port in "$@"; do
    [[ -z $(ss -Htln "sport = :$port") ]] || die "port $port is already in use; stop it first"
  done
}

# === tools and builds ===

for tool in nginx haproxy curl taskset ss; do
  command -v "$tool" >/dev/null || die "missing $tool (apt-get install -y nginx haproxy curl util-linux iproute2)"
done
if ((with_h2load)); then
  command -v h2load >/dev/null || die "--h2load: missing h2load (apt-get install -y nghttp2-client)"
fi
if ((with_callgrind)); then
  command -v valgrind >/dev/null || die "--callgrind: missing valgrind (apt-get install -y valgrind)"
fi

kactivator_bin=${KACTIVATOR_BIN:-$repo/target/release/kactivator}
if [[ -z ${KACTIVATOR_BIN:-} ]]; then
  log "building kactivator (release)"
  env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator --bin kactivator ||
    die "kactivator does not build"
fi
[[ -x $kactivator_bin ]] || die "$kactivator_bin is not executable"
log "building kactivator-testbackend and kactivator-loadgen (release)"
env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator-testkit --bin kactivator-testbackend ||
  die "kactivator-testbackend does not build"
env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator-loadgen --bin kactivator-loadgen ||
  die "kactivator-loadgen does not build"
backend_bin=$repo/target/release/kactivator-testbackend
loadgen_bin=$repo/target/release/kactivator-loadgen

# === request bodies ===

# A gRPC frame: flag 0, 4-byte big-endian length, then EchoRequest { payload = "hi" }, i.e. the
# protobuf bytes 0a 02 68 69 (field 1, length-delimited, 2 bytes).
grpc_body="$work/echo-request.bin"
printf '\x00\x00\x00\x00\x04\x0a\x02hi' >"$grpc_body"

# client_args WORKLOAD: sets loadgen_args and h2load_args for the workload. Both clients send
# `:authority: $AUTHORITY`, which is how kactivator finds the revision (the backend and the
# peers ignore it): the loadgen makes a Host header the :authority, h2load needs the
# pseudo-header itself (a `host` header would go out beside `:authority: 127.0.0.1:PORT`).
loadgen_args=() h2load_args=()
client_args() {
  loadgen_args=(-H "Host: $AUTHORITY")
  h2load_args=(-H ":authority: $AUTHORITY")
  if [[ $1 == grpc ]]; then
    loadgen_args+=(--grpc --data "$grpc_body")
    h2load_args+=(-d "$grpc_body" -H content-type:application/grpc -H te:trailers)
  fi
}
workload_path() { if [[ $1 == grpc ]]; then echo "$GRPC_PATH"; else echo /; fi; }

# === servers ===

start_backend() {
  start backend "$PROXY_CPU" "$backend_bin" --grpc --listen "127.0.0.1:$BACKEND_PORT" --name bench
}

# nginx_conf FILE PORT [single]: nginx listening h2c on PORT, grpc_pass to the backend; with
# "single", one process (master_process off), for valgrind.
nginx_conf() {
  local file=$1 port=$2 master=""
  [[ ${3:-} == single ]] && master="master_process off;"
  mkdir -p "$work/nginx-temp"
  cat >"$file" <<EOF
daemon off;
$master
worker_processes 1;
pid $work/nginx.pid;
error_log $work/nginx.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  http2_max_requests 10000000;
  http2_max_concurrent_streams 256;
  client_body_temp_path $work/nginx-temp/body;
  proxy_temp_path $work/nginx-temp/proxy;
  fastcgi_temp_path $work/nginx-temp/fastcgi;
  uwsgi_temp_path $work/nginx-temp/uwsgi;
  scgi_temp_path $work/nginx-temp/scgi;
  upstream be { server 127.0.0.1:$BACKEND_PORT; keepalive 256; keepalive_requests 10000000; }
  server {
    listen 127.0.0.1:$port http2 reuseport backlog=4096;
    location / { grpc_pass grpc://be; }
  }
}
EOF
}

start_nginx() {
  nginx_conf "$work/nginx.conf" "$NGINX_PORT"
  nginx -t -q -p "$work" -e "$work/nginx.err" -c "$work/nginx.conf" >"$work/nginx.log" 2>&1 ||
    { log_tail nginx; die "nginx rejected its configuration"; }
  start nginx "$PROXY_CPU" nginx -p "$work" -e "$work/nginx.err" -c "$work/nginx.conf"
}

# haproxy 2.6 with h2c on both sides: `proto h2` on the bind line (prior knowledge: there is no
# ALPN on cleartext) and on the server line. Unlike grpc_pass it multiplexes requests over its
# backend connections; `http-reuse always` lets every client connection share them.
start_haproxy() {
  cat >"$work/haproxy.cfg" <<EOF
global
  nbthread 1
  maxconn 4000
defaults
  mode http
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$HAPROXY_PORT proto h2
  default_backend be
backend be
  server s1 127.0.0.1:$BACKEND_PORT proto h2
EOF
  haproxy -c -q -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 ||
    { log_tail haproxy; die "haproxy rejected its configuration"; }
  start haproxy "$PROXY_CPU" haproxy -db -f "$work/haproxy.cfg"
}

# Quarantine at its default (enabled): the testkit backend answers the queue-proxy probe. A
# WRAPPER (valgrind) goes before the binary.
start_kactivator() { # start_kactivator NAME DRIVER PORT ADMIN [WRAPPER...]
  local name=$1 driver=$2 port=$3 admin=$4
  shift 4
  cat >"$work/$name.toml" <<EOF
[listen]
http = "127.0.0.1:$port"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:$admin"

[[revisions]]
namespace = "default"
name = "bench"
container_concurrency = 0
pods = ["127.0.0.1:$BACKEND_PORT"]
EOF
  # No drain grace (as in run.sh): /quitquitquit would otherwise hold the stop for 45 s.
  start "$name" "$PROXY_CPU" "$@" "$kactivator_bin" --config "$work/$name.toml" --shards 1 \
    --driver "$driver" --drain-grace-seconds 0
}

stop_kactivator() { # stop_kactivator PID ADMIN
  curl -s -o /dev/null --max-time 5 -X POST "http://127.0.0.1:$2/quitquitquit" || true
  stop_pid "$1" TERM
}

# check_h2 NAME PID PORT: within START_TIMEOUT, one h2c GET / and one gRPC call must succeed
# (status 200; grpc-status 0 in the trailers).
check_h2() {
  local name=$1 pid=$2 port=$3 deadline code out
  deadline=$((SECONDS + START_TIMEOUT))
  while :; do
    kill -0 "$pid" 2>/dev/null || { log "$name exited during start-up"; log_tail "$name"; return 1; }
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 --http2-prior-knowledge \
      -H "Host: $AUTHORITY" "http://127.0.0.1:$port/" || true)
    [[ $code == 200 ]] && break
    ((SECONDS < deadline)) || { log "$name: GET / over h2c answers '$code', not 200"; log_tail "$name"; return 1; }
    sleep 0.1
  done
  out=$(curl -s -v --max-time 5 --http2-prior-knowledge -H "Host: $AUTHORITY" \
    -H 'content-type: application/grpc' -H 'te: trailers' --data-binary "@$grpc_body" \
    "http://127.0.0.1:$port$GRPC_PATH" -o /dev/null 2>&1 || true)
  grep -qi '^< grpc-status: 0' <<<"$out" || {
    log "$name: the gRPC call did not end with grpc-status 0:"
    grep '^[<>]' <<<"$out" | sed 's/^/    | /' >&2
    return 1
  }
}

# === measurement ===

# cpu_snapshot [CPU]: "busy total ours" in clock ticks, of all CPUs or of CPU alone (see
# benches/foreign-cpu.sh); ours is every process started here and this shell's reaped children
# (the clients).
cpu_snapshot() {
  local pid p ticks ours=0 busy_total
  busy_total=$(awk -v line="cpu${1:-}" '$1 == line { print $2 + $3 + $4 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  for pid in "${started_pids[@]}"; do
    for p in $pid $(descendants "$pid"); do
      ticks=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
      ours=$((ours + ${ticks:-0}))
    done
  done
  ticks=$(sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }')
  echo "$busy_total $((ours + ticks))"
}
source "$repo/benches/foreign-cpu.sh"

rows=(direct kact-uring kact-epoll nginx haproxy)
declare -A label=([direct]="direct to backend" [kact-uring]="kactivator io-uring"
  [kact-epoll]="kactivator epoll" [nginx]="nginx (grpc_pass)" [haproxy]="haproxy (proto h2)")
declare -A port_of=([direct]=$BACKEND_PORT [kact-uring]=$KACT_URING_PORT
  [kact-epoll]=$KACT_EPOLL_PORT [nginx]=$NGINX_PORT [haproxy]=$HAPROXY_PORT)

# pid_ticks PID: CPU time (user + system, all threads) of PID and its descendants, in ticks.
pid_ticks() {
  local p ticks sum=0
  for p in "$1" $(descendants "$1"); do
    ticks=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
    sum=$((sum + ${ticks:-0}))
  done
  echo "$sum"
}

# kv KEY FILE: the value of KEY=value on kactivator-loadgen's summary line in FILE.
kv() { awk -v k="$1" '/^requests=/ { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$2"; }

# measure LAYOUT WORKLOAD ROUND ROW CLIENT SECS: one run of CLIENT (loadgen or h2load) against
# ROW on the layout's client CPU; appends a record unless ROUND is "warmup".
measure() {
  local layout=$1 workload=$2 round=$3 row=$4 client=$5 secs=$6 out before foreign
  local rps p50=- p99=- max=- errors done proxy_before backend_before proxy_ticks backend_ticks
  local cpu=${client_cpu[$layout]} connections=${client_connections[$layout]} streams=${client_streams[$layout]}
  local url="http://127.0.0.1:${port_of[$row]}$(workload_path "$workload")"
  out="$work/run-$layout-$workload-$round-$row-$client.txt"
  client_args "$workload"
  before=$(cpu_snapshot "${stat_cpu[$layout]}")
  proxy_before=$(pid_ticks "${pid_of[$row]}")
  backend_before=$(pid_ticks "${pid_of[direct]}")
  if [[ $client == loadgen ]]; then
    # It exits 1 when a request failed; the errors are counted below.
    taskset -c "$cpu" "$loadgen_bin" --h2 --url "$url" --connections "$connections" \
      --streams "$streams" --duration-secs "$secs" --latency "${loadgen_args[@]}" >"$out" 2>&1 || true
  else
    taskset -c "$cpu" h2load -t 1 -c "$connections" -m "$streams" -D "$secs" \
      "${h2load_args[@]}" "$url" >"$out" 2>&1 || true
  fi
  proxy_ticks=$(($(pid_ticks "${pid_of[$row]}") - proxy_before))
  backend_ticks=$(($(pid_ticks "${pid_of[direct]}") - backend_before))
  foreign=$(foreign_percent "$before" "$(cpu_snapshot "${stat_cpu[$layout]}")")
  [[ $round == warmup ]] && return 0
  if [[ $client == loadgen ]]; then
    rps=$(kv rps "$out") done=$(kv ok "$out") errors=$(kv errors "$out")
    p50=$(kv p50_us "$out") p99=$(kv p99_us "$out") max=$(kv max_us "$out")
  else
    done=$(awk '/^requests:/ { print $8 }' "$out")
    rps=$(awk '/^finished in/ { print $4 }' "$out")
    # Errors: failed + errored + timeout requests, and every response that was not 2xx.
    errors=$(awk '/^requests:/ { n += $10 + $12 + $14 } /^status codes:/ { n += $5 + $7 + $9 } END { print n + 0 }' "$out")
  fi
  [[ -n $rps && -n $done && -n $errors && -n $p50 ]] ||
    { cat "$out" >&2; die "could not parse $client output for ${label[$row]} ($layout $workload)"; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$layout" "$workload" "$round" "$row" "$client" \
    "$rps" "$p50" "$p99" "$max" "$errors" "$foreign" "$done" "$proxy_ticks" "$backend_ticks" >>"$records"
  raw "--- $client layout=$layout workload=$workload round=$round row=$row rps=$rps p50_us=$p50 p99_us=$p99 max_us=$max errors=$errors foreign_cpu=$foreign% done=$done proxy_ticks=$proxy_ticks backend_ticks=$backend_ticks"
  cat "$out" >>"$results"
  local note=""
  ((errors == 0)) || note+=", $errors ERRORS"
  ((foreign <= FOREIGN_CPU_LIMIT)) || note+=", other processes used $foreign% of ${stat_cpu[$layout]:+cpu}${stat_cpu[$layout]:-the CPUs}"
  if [[ $client == loadgen ]]; then
    log "$layout $workload round $round ${label[$row]}: $rps req/s, p50 $p50 us, p99 $p99 us, $(per_cpu_s "$done" "$proxy_ticks") req per proxy CPU-second$note"
  else
    log "$layout $workload round $round ${label[$row]} (h2load): $rps req/s$note"
  fi
}

median() { sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) exit
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2
}'; }
# metric LAYOUT WORKLOAD ROW CLIENT COLUMN: median over rounds of a records column (column 10,
# errors: the sum).
metric() {
  awk -F'\t' -v l="$1" -v w="$2" -v r="$3" -v c="$4" -v col="$5" '$1 == l && $2 == w && $4 == r && $5 == c {
    if (col == 10) n += $10; else if ($col != "-") print $col
  } END { if (col == 10) print n + 0 }' "$records" | if (($5 == 10)); then cat; else median; fi
}
# per_cpu_s REQUESTS TICKS: requests per CPU-second.
per_cpu_s() { awk -v n="$1" -v t="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (t > 0) printf "%.0f", n * hz / t }'; }
# per_core WORKLOAD ROW: median over the L1 loadgen rounds of requests per CPU-second of the
# row's proxy (direct: of the backend).
per_core() {
  awk -F'\t' -v w="$1" -v r="$2" -v hz="$(getconf CLK_TCK)" '$1 == "L1" && $2 == w && $4 == r && $5 == "loadgen" && $13 > 0 { print $12 * hz / $13 }' "$records" | median
}
# proxy_share WORKLOAD ROW: median share (%) of cpu0's busy time (proxy + backend) the proxy took.
proxy_share() {
  awk -F'\t' -v w="$1" -v r="$2" '$1 == "L1" && $2 == w && $4 == r && $5 == "loadgen" && $13 + $14 > 0 { print 100 * $13 / ($13 + $14) }' "$records" | median
}
per_round() { # per_round WORKLOAD ROW: L1 loadgen req/s of each round, in round order
  awk -F'\t' -v w="$1" -v r="$2" '$1 == "L1" && $2 == w && $4 == r && $5 == "loadgen" { printf "%s%.1fk", sep, $6 / 1000; sep = ", " }' "$records"
}
# added LAYOUT WORKLOAD ROW COLUMN: ROW's median of a loadgen column minus the direct row's (µs).
added() {
  local a b
  a=$(metric "$1" "$2" "$3" loadgen "$4")
  b=$(metric "$1" "$2" direct loadgen "$4")
  [[ -n $a && -n $b ]] || return 0
  awk -v a="$a" -v b="$b" 'BEGIN { print a - b }'
}
# added_per_round LAYOUT WORKLOAD ROW COLUMN: ROW's figure minus direct's in the same round, per
# round, comma-separated, in µs.
added_per_round() {
  awk -F'\t' -v l="$1" -v w="$2" -v r="$3" -v c="$4" '$1 == l && $2 == w && $5 == "loadgen" && $4 == "direct" { d[$3] = $c }
    $1 == l && $2 == w && $5 == "loadgen" && $4 == r { v[$3] = $c }
    END {
      for (k = 1; k in v || k in d; k++) if (k in v && k in d) {
        out = out sep sprintf("%+.0f", v[k] - d[k]); sep = ", "
      }
      print out
    }' "$records"
}
fmt_rps() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.1fk", v / 1000 }' || printf '—'; }
fmt_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { if (v < 1000) printf "%d µs", v + 0.5; else printf "%.2f ms", v / 1000 }' || printf '—'; }
fmt_added_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN {
  a = v < 0 ? -v : v
  if (a < 1000) printf "%+d µs", (v < 0 ? v - 0.5 : v + 0.5); else printf "%+.2f ms", v / 1000
}' || printf '—'; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "—" }' || printf '—'; }
# noisy_note LAYOUT WHAT: a sentence when other processes took more than FOREIGN_CPU_LIMIT % of
# WHAT in some of the layout's runs.
noisy_note() {
  awk -F'\t' -v l="$1" -v limit="$FOREIGN_CPU_LIMIT" -v what="$2" '$1 == l { runs++; if ($11 > limit) { n++; if ($11 > max) max = $11 } }
    END { if (n) printf "in %d of %d runs other processes used more than %d%% of %s (up to %d%%)", n, runs, limit, what, max }' "$records"
}
workload_title() {
  if [[ $1 == get ]]; then echo "h2c GET / (backend answers 200, 17-byte body)"; else echo "gRPC unary $GRPC_PATH (9-byte request frame)"; fi
}

report_l1() {
  local workload row share h2load_header="" h2load_rule="" h2load_cell=""
  if ((with_h2load)); then h2load_header=" h2load req/s |" h2load_rule="---|"; fi
  echo
  echo "## L1: backend and proxy share cpu$PROXY_CPU, kactivator-loadgen --h2 -c$clients --streams $streams on cpu$CLIENT_CPU (${duration}s, median of $rounds alternating round(s))"
  for workload in "${workloads[@]}"; do
    echo
    echo "### $(workload_title "$workload")"
    echo
    echo "| path | req/s | req per proxy CPU-second | proxy share of cpu0 | p50 | p99 | max | errors | req/s per round |$h2load_header"
    echo "|---|---|---|---|---|---|---|---|---|$h2load_rule"
    for row in "${rows[@]}"; do
      if [[ $row == direct ]]; then
        share="—"
      else
        share=$(proxy_share "$workload" "$row")
        share=${share:+$(printf '%.0f %%' "$share")}
      fi
      ((with_h2load)) && h2load_cell=" $(fmt_rps "$(metric L1 "$workload" "$row" h2load 6)") ($(metric L1 "$workload" "$row" h2load 10) errors) |"
      echo "| ${label[$row]} | $(fmt_rps "$(metric L1 "$workload" "$row" loadgen 6)") | $(fmt_rps "$(per_core "$workload" "$row")") | ${share:-—} | $(fmt_us "$(metric L1 "$workload" "$row" loadgen 7)") | $(fmt_us "$(metric L1 "$workload" "$row" loadgen 8)") | $(fmt_us "$(metric L1 "$workload" "$row" loadgen 9)") | $(metric L1 "$workload" "$row" loadgen 10) | $(per_round "$workload" "$row") |$h2load_cell"
    done
    echo
    echo "| ratio, same run | req/s | req per proxy CPU-second |"
    echo "|---|---|---|"
    local pair a b cpu_ratio
    for pair in kact-uring:nginx kact-epoll:nginx kact-uring:haproxy kact-epoll:haproxy kact-uring:kact-epoll haproxy:nginx nginx:direct haproxy:direct kact-uring:direct; do
      a=${pair%%:*} b=${pair##*:}
      if [[ $b == direct ]]; then cpu_ratio="—"; else cpu_ratio=$(ratio "$(per_core "$workload" "$a")" "$(per_core "$workload" "$b")"); fi
      echo "| ${label[$a]} ÷ ${label[$b]} | $(ratio "$(metric L1 "$workload" "$a" loadgen 6)" "$(metric L1 "$workload" "$b" loadgen 6)") | $cpu_ratio |"
    done
  done
  local noisy
  noisy=$(noisy_note L1 "the CPUs")
  [[ -z $noisy ]] || { echo; echo "WARNING: $noisy; the L1 figures are not trustworthy."; }
}

report_p1() {
  local workload row add50 add99
  echo
  echo "## P1: same-CPU ping-pong (backend, proxy and kactivator-loadgen --h2, 1 connection, 1 stream, all on cpu$PROXY_CPU; ${duration}s, median of $rounds alternating round(s))"
  for workload in "${workloads[@]}"; do
    echo
    echo "### $(workload_title "$workload")"
    echo
    echo "| path | p50 | p99 | adds at p50 | adds at p99 | p50 added, per round (µs) | p99 added, per round (µs) | req/s | errors |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for row in "${rows[@]}"; do
      if [[ $row == direct ]]; then
        echo "| ${label[$row]} | $(fmt_us "$(metric P1 "$workload" "$row" loadgen 7)") | $(fmt_us "$(metric P1 "$workload" "$row" loadgen 8)") | — | — | — | — | $(fmt_rps "$(metric P1 "$workload" "$row" loadgen 6)") | $(metric P1 "$workload" "$row" loadgen 10) |"
        continue
      fi
      echo "| ${label[$row]} | $(fmt_us "$(metric P1 "$workload" "$row" loadgen 7)") | $(fmt_us "$(metric P1 "$workload" "$row" loadgen 8)") | $(fmt_added_us "$(added P1 "$workload" "$row" 7)") | $(fmt_added_us "$(added P1 "$workload" "$row" 8)") | $(added_per_round P1 "$workload" "$row" 7) | $(added_per_round P1 "$workload" "$row" 8) | $(fmt_rps "$(metric P1 "$workload" "$row" loadgen 6)") | $(metric P1 "$workload" "$row" loadgen 10) |"
    done
    echo
    for row in "${rows[@]}"; do
      [[ $row == direct ]] && continue
      add50=$(fmt_added_us "$(added P1 "$workload" "$row" 7)")
      add99=$(fmt_added_us "$(added P1 "$workload" "$row" 8)")
      echo "- ${label[$row]} adds ${add50#+} at p50, ${add99#+} at p99"
    done
  done
  local noisy
  noisy=$(noisy_note P1 "cpu$PROXY_CPU")
  [[ -z $noisy ]] || { echo; echo "WARNING: $noisy; the P1 latencies are not trustworthy."; }
}

# === instructions per request (--callgrind) ===

declare -A instructions=() # "ROW N" -> I(N)

# callgrind_total ROW N: ROW (kactivator or nginx) under callgrind on cpu0, N GET / requests
# through it from the loadgen on cpu1 (C x M streams), a clean stop; I(N) goes to
# instructions["ROW N"]. kactivator runs with --driver epoll: valgrind does not follow io_uring.
callgrind_total() {
  local row=$1 n=$2 name="cg-$1-$2" out pid deadline status=0
  out="$work/$name.callgrind"
  local valgrind=(valgrind --tool=callgrind "--callgrind-out-file=$out")
  if [[ $row == kactivator ]]; then
    start_kactivator "$name" epoll "$CALLGRIND_PORT" "$CALLGRIND_ADMIN" "${valgrind[@]}"
  else
    nginx_conf "$work/$name.conf" "$CALLGRIND_PORT" single
    start "$name" "$PROXY_CPU" "${valgrind[@]}" nginx -p "$work" -e "$work/nginx.err" -c "$work/$name.conf"
  fi
  pid=$last_pid
  # Up once one GET / goes through (the same one request in both runs: it cancels out).
  deadline=$((SECONDS + 60))
  until curl -s -o /dev/null --max-time 2 --http2-prior-knowledge -H "Host: $AUTHORITY" \
    "http://127.0.0.1:$CALLGRIND_PORT/"; do
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
      log_tail "$name"
      die "$name did not come up"
    fi
    sleep 0.2
  done
  taskset -c "$CLIENT_CPU" "$loadgen_bin" --h2 --url "http://127.0.0.1:$CALLGRIND_PORT/" \
    --connections "$clients" --streams "$streams" --requests "$n" -H "Host: $AUTHORITY" \
    >"$work/$name.loadgen" 2>&1 || die "$name: the loadgen reported errors: $(cat "$work/$name.loadgen")"
  raw "--- callgrind $name loadgen: $(cat "$work/$name.loadgen")"
  if [[ $row == kactivator ]]; then
    curl -s -o /dev/null --max-time 120 -X POST "http://127.0.0.1:$CALLGRIND_ADMIN/quitquitquit" || true
  else
    kill -QUIT "$pid"
  fi
  wait "$pid" || status=$?
  ((status == 0)) || die "$name did not exit cleanly (status $status): its profile is incomplete"
  instructions["$row $n"]=$(awk '/^totals:/ { print $2 }' "$out")
  [[ -n ${instructions["$row $n"]} ]] || die "$name: no totals line in $out: the profile is incomplete"
}

run_callgrind() {
  local row n
  for row in kactivator nginx; do
    for n in "$CALLGRIND_N1" "$CALLGRIND_N2"; do
      log "callgrind: $row, $n requests"
      callgrind_total "$row" "$n"
    done
  done
}

report_callgrind() {
  local row a b
  declare -A name=([kactivator]="kactivator epoll" [nginx]="nginx (grpc_pass)")
  echo
  echo "## Instructions per proxied h2c request (callgrind, user space; (I(N2) - I(N1)) / (N2 - N1); GET /, $clients connections x $streams streams)"
  echo
  echo "| proxy | I(N1=$CALLGRIND_N1) | I(N2=$CALLGRIND_N2) | instructions/request |"
  echo "|---|---|---|---|"
  for row in kactivator nginx; do
    a=${instructions["$row $CALLGRIND_N1"]} b=${instructions["$row $CALLGRIND_N2"]}
    echo "| ${name[$row]} | $a | $b | $(((b - a) / (CALLGRIND_N2 - CALLGRIND_N1))) |"
  done
}

# === main ===

started_at=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
{
  echo "kactivator h2c load benchmark $stamp"
  echo "host: $(uname -r), $(nproc) CPUs; $(nginx -v 2>&1); $(haproxy -v | head -n 1)$( ((with_h2load)) && echo "; $(h2load --version | head -n 1)")"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
  echo "options: load=$want_load callgrind=$with_callgrind layouts=${layouts[*]} rounds=$rounds duration=${duration}s workloads=${workloads[*]} L1 client -c$clients --streams $streams h2load=$with_h2load kactivator=$kactivator_bin"
  echo "load average before: $load_before"
} >>"$results"

require_port_free "$BACKEND_PORT" "$NGINX_PORT" "$HAPROXY_PORT" "$KACT_URING_PORT" "$KACT_URING_ADMIN" "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN" "$CALLGRIND_PORT" "$CALLGRIND_ADMIN"
log "backend and proxies on cpu$PROXY_CPU; layouts ${layouts[*]}; load average $load_before"
declare -A pid_of=() # row -> the pid whose CPU time is that row's proxy (direct: the backend)
start_backend
pid_of[direct]=$last_pid
check_h2 backend "$last_pid" "$BACKEND_PORT" || die "the backend did not come up"

# measure_row LAYOUT WORKLOAD ROUND ROW SECS: the loadgen run, and in L1 with --h2load the h2load
# run right after it.
measure_row() {
  measure "$1" "$2" "$3" "$4" loadgen "$5"
  if [[ $1 == L1 && $with_h2load == 1 ]]; then measure "$1" "$2" "$3" "$4" h2load "$5"; fi
}

if ((want_load)); then
  start_nginx
  pid_of[nginx]=$last_pid
  check_h2 nginx "$last_pid" "$NGINX_PORT" || die "nginx did not come up"
  start_haproxy
  pid_of[haproxy]=$last_pid
  check_h2 haproxy "$last_pid" "$HAPROXY_PORT" || die "haproxy did not come up"
  start_kactivator kact-uring io-uring "$KACT_URING_PORT" "$KACT_URING_ADMIN"
  pid_of[kact-uring]=$last_pid
  check_h2 kact-uring "$last_pid" "$KACT_URING_PORT" || die "kactivator io-uring did not come up"
  start_kactivator kact-epoll epoll "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"
  pid_of[kact-epoll]=$last_pid
  check_h2 kact-epoll "$last_pid" "$KACT_EPOLL_PORT" || die "kactivator epoll did not come up"
  for layout in "${layouts[@]}"; do
    log "layout $layout: kactivator-loadgen --h2 -c${client_connections[$layout]} --streams ${client_streams[$layout]} on cpu${client_cpu[$layout]}"
    for workload in "${workloads[@]}"; do
      for row in "${rows[@]}"; do measure "$layout" "$workload" warmup "$row" loadgen "$warmup"; done
      for ((round = 1; round <= rounds; round++)); do
        if ((round % 2 == 1)); then
          for row in "${rows[@]}"; do measure_row "$layout" "$workload" "$round" "$row" "$duration"; done
        else
          for ((i = ${#rows[@]} - 1; i >= 0; i--)); do measure_row "$layout" "$workload" "$round" "${rows[i]}" "$duration"; done
        fi
      done
    done
  done

  stop_kactivator "${pid_of[kact-uring]}" "$KACT_URING_ADMIN"
  stop_kactivator "${pid_of[kact-epoll]}" "$KACT_EPOLL_ADMIN"
fi
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
if ((with_callgrind)); then run_callgrind; fi

{
  echo
  echo "# kactivator h2c load benchmark, $stamp ($(nproc) CPUs, $(uname -r), commit $(git rev-parse --short HEAD))"
  echo
  echo "Backend: kactivator-testbackend --grpc (tonic/hyper, current-thread) on cpu$PROXY_CPU with the proxy;"
  echo "every request carries :authority $AUTHORITY. Load average before: $load_before; after: $load_after."
  if want_layout L1; then report_l1; fi
  if want_layout P1; then report_p1; fi
  if ((with_callgrind)); then report_callgrind; fi
  errors_total=$(awk -F'\t' '{ n += $10 } END { print n + 0 }' "$records")
  ((errors_total == 0)) || { echo; echo "ERRORS: $errors_total failed requests (status, reset, grpc-status or I/O) in total; those rows are not valid (see the raw file)."; }
  echo
  echo "Raw results: $results ($((SECONDS - started_at)) s)"
} | tee -a "$results"
}
