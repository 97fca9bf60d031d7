#!/usr/bin/env bash
# HTTP/2 cleartext (h2c) load benchmark: h2load against the backend directly, through nginx
# (`listen … http2` + `grpc_pass`) and through kactivator (h2c front, h2c to the pod), in layout
# L1 of benches/load/run.sh (proxy and backend on cpu0, h2load on cpu1). See
# benches/load/README.md ("HTTP/2: h2.sh") for what the numbers mean.
#
#   bash benches/load/h2.sh [--quick] [--rounds N] [--duration SECS] [--workloads get,grpc]
#                           [--clients C] [--streams M]
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/load/h2.sh   # measure that binary, no build
set -euo pipefail

# One compound command: bash parses all of it before running any of it.
{

usage() {
  cat <<'EOF'
usage: bash benches/load/h2.sh [options]

  --quick            3 s runs, 1 round (a smoke test, not a figure)
  --rounds N         rounds, row order alternating between rounds (default 3)
  --duration SECS    duration of each h2load run (default 10)
  --workloads LIST   comma-separated, from get (GET /) and grpc (unary Echo call); default get,grpc
  --clients C        h2load -c (connections, default 8)
  --streams M        h2load -m (concurrent streams per connection, default 16)

Environment: KACTIVATOR_BIN=PATH measures that kactivator binary instead of building
target/release/kactivator. Results go to target/bench-results/h2-<timestamp>.txt.
EOF
}

rounds=3
duration=10
warmup=1
workloads=(get grpc)
clients=8
streams=16
while (($#)); do
  case "$1" in
    --quick) rounds=1 duration=3 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift ;;
    --duration) duration=${2:?--duration needs a value}; shift ;;
    --workloads) IFS=, read -r -a workloads <<<"${2:?--workloads needs a value}"; shift ;;
    --clients) clients=${2:?--clients needs a value}; shift ;;
    --streams) streams=${2:?--streams needs a value}; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "h2.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for n in "$rounds" "$duration" "$clients" "$streams"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "h2.sh: --rounds, --duration, --clients, --streams take positive integers" >&2; exit 2; }
done
for w in "${workloads[@]}"; do
  [[ $w == get || $w == grpc ]] || { echo "h2.sh: unknown workload '$w' (get, grpc)" >&2; exit 2; }
done

# === fixed layout (L1) ===

readonly BACKEND_PORT=18200
readonly NGINX_PORT=18201
readonly KACT_URING_PORT=18202 KACT_URING_ADMIN=19202
readonly KACT_EPOLL_PORT=18203 KACT_EPOLL_ADMIN=19203
readonly PROXY_CPU=0 CLIENT_CPU=1 # L1: proxy and backend on cpu0, h2load on cpu1
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
records="$work/records.tsv" # workload round row rps mean_us sd_us max_us errors foreign% succeeded proxy_ticks backend_ticks
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
    cp "$work"/*.log "$work"/*.err "$work"/h2load-*.txt "$kept/" 2>/dev/null || true
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

for tool in h2load nginx curl taskset ss; do
  command -v "$tool" >/dev/null || die "missing $tool (apt-get install -y nghttp2-client nginx curl util-linux iproute2)"
done

kactivator_bin=${KACTIVATOR_BIN:-$repo/target/release/kactivator}
if [[ -z ${KACTIVATOR_BIN:-} ]]; then
  log "building kactivator (release)"
  env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator --bin kactivator ||
    die "kactivator does not build"
fi
[[ -x $kactivator_bin ]] || die "$kactivator_bin is not executable"
log "building kactivator-testbackend (release)"
env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator-testkit --bin kactivator-testbackend ||
  die "kactivator-testbackend does not build"
backend_bin=$repo/target/release/kactivator-testbackend

# === request bodies ===

# A gRPC frame: flag 0, 4-byte big-endian length, then EchoRequest { payload = "hi" }, i.e. the
# protobuf bytes 0a 02 68 69 (field 1, length-delimited, 2 bytes).
grpc_body="$work/echo-request.bin"
printf '\x00\x00\x00\x00\x04\x0a\x02hi' >"$grpc_body"

# h2load arguments per workload (both send :authority, which is how kactivator finds the
# revision; the backend and nginx ignore it).
workload_args() {
  case $1 in
    get) echo "" ;;
    grpc) echo "-d $grpc_body -H content-type:application/grpc -H te:trailers" ;;
  esac
}
workload_path() { if [[ $1 == grpc ]]; then echo "$GRPC_PATH"; else echo /; fi; }

# === servers ===

start_backend() {
  start backend "$PROXY_CPU" "$backend_bin" --grpc --listen "127.0.0.1:$BACKEND_PORT" --name bench
}

start_nginx() {
  mkdir -p "$work/nginx-temp"
  cat >"$work/nginx.conf" <<EOF
daemon off;
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
    listen 127.0.0.1:$NGINX_PORT http2 reuseport backlog=4096;
    location / { grpc_pass grpc://be; }
  }
}
EOF
  nginx -t -q -p "$work" -e "$work/nginx.err" -c "$work/nginx.conf" >"$work/nginx.log" 2>&1 ||
    { log_tail nginx; die "nginx rejected its configuration"; }
  start nginx "$PROXY_CPU" nginx -p "$work" -e "$work/nginx.err" -c "$work/nginx.conf"
}

# Quarantine at its default (enabled): the testkit backend answers the queue-proxy probe.
start_kactivator() { # start_kactivator NAME DRIVER PORT ADMIN
  local name=$1 driver=$2 port=$3 admin=$4
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
  start "$name" "$PROXY_CPU" "$kactivator_bin" --config "$work/$name.toml" --shards 1 --driver "$driver"
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

# cpu_snapshot: "busy total ours" in clock ticks (all CPUs), see benches/foreign-cpu.sh.
cpu_snapshot() {
  local pid p ticks ours=0 busy_total
  busy_total=$(awk '$1 == "cpu" { print $2 + $3 + $4 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
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

to_us() { awk -v v="$1" 'BEGIN {
  n = v + 0
  if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n
}'; }

rows=(direct kact-uring kact-epoll nginx)
declare -A label=([direct]="direct to backend" [kact-uring]="kactivator io-uring"
  [kact-epoll]="kactivator epoll" [nginx]="nginx (grpc_pass)")
declare -A port_of=([direct]=$BACKEND_PORT [kact-uring]=$KACT_URING_PORT
  [kact-epoll]=$KACT_EPOLL_PORT [nginx]=$NGINX_PORT)

# pid_ticks PID: CPU time (user + system, all threads) of PID and its descendants, in ticks.
pid_ticks() {
  local p ticks sum=0
  for p in "$1" $(descendants "$1"); do
    ticks=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
    sum=$((sum + ${ticks:-0}))
  done
  echo "$sum"
}

# measure WORKLOAD ROUND ROW SECS: one h2load run on the client CPU.
measure() {
  local workload=$1 round=$2 row=$3 secs=$4 out before foreign rps mean sd max errors
  local proxy_before backend_before proxy_ticks backend_ticks done
  out="$work/h2load-$workload-$round-$row.txt"
  before=$(cpu_snapshot)
  proxy_before=$(pid_ticks "${pid_of[$row]}")
  backend_before=$(pid_ticks "${pid_of[direct]}")
  # shellcheck disable=SC2046 # workload_args is a word list
  taskset -c "$CLIENT_CPU" h2load -c "$clients" -m "$streams" -t 1 -D "$secs" \
    -H ":authority: $AUTHORITY" $(workload_args "$workload") \
    "http://127.0.0.1:${port_of[$row]}$(workload_path "$workload")" >"$out" 2>&1 || true
  proxy_ticks=$(($(pid_ticks "${pid_of[$row]}") - proxy_before))
  backend_ticks=$(($(pid_ticks "${pid_of[direct]}") - backend_before))
  foreign=$(foreign_percent "$before" "$(cpu_snapshot)")
  [[ $round == warmup ]] && return 0
  done=$(awk '/^requests:/ { print $8 }' "$out")
  rps=$(awk '/^finished in/ { print $4 }' "$out")
  read -r mean sd max < <(awk '/^time for request:/ { print $6, $7, $5 }' "$out")
  # Errors: failed + errored + timeout requests, and every response that was not 2xx.
  errors=$(awk '/^requests:/ { n += $10 + $12 + $14 } /^status codes:/ { n += $5 + $7 + $9 } END { print n + 0 }' "$out")
  [[ -n $rps && -n $mean ]] || { cat "$out" >&2; die "could not parse h2load output for ${label[$row]} ($workload)"; }
  mean=$(to_us "$mean") sd=$(to_us "$sd") max=$(to_us "$max")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$workload" "$round" "$row" "$rps" "$mean" "$sd" "$max" "$errors" "$foreign" "$done" "$proxy_ticks" "$backend_ticks" >>"$records"
  raw "--- h2load workload=$workload round=$round row=$row rps=$rps mean_us=$mean sd_us=$sd max_us=$max errors=$errors foreign_cpu=$foreign% done=$done proxy_ticks=$proxy_ticks backend_ticks=$backend_ticks"
  cat "$out" >>"$results"
  local note=""
  ((errors == 0)) || note+=", $errors ERRORS"
  ((foreign <= FOREIGN_CPU_LIMIT)) || note+=", other processes used $foreign% of the CPUs"
  log "$workload round $round ${label[$row]}: $rps req/s, mean $mean us (sd $sd), $(per_cpu_s "$done" "$proxy_ticks") req per proxy CPU-second$note"
}

median() { sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) exit
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2
}'; }
metric() { # metric WORKLOAD ROW COLUMN: median over rounds (errors, column 8: sum)
  if (($3 == 8)); then
    awk -F'\t' -v w="$1" -v r="$2" '$1 == w && $3 == r { n += $8 } END { print n + 0 }' "$records"
  else
    awk -F'\t' -v w="$1" -v r="$2" -v c="$3" '$1 == w && $3 == r { print $c }' "$records" | median
  fi
}
# per_cpu_s REQUESTS TICKS: requests per CPU-second.
per_cpu_s() { awk -v n="$1" -v t="$2" -v hz="$(getconf CLK_TCK)" 'BEGIN { if (t > 0) printf "%.0f", n * hz / t }'; }
# per_core WORKLOAD ROW: median over rounds of requests per CPU-second of the row's proxy (direct:
# of the backend).
per_core() {
  awk -F'\t' -v w="$1" -v r="$2" -v hz="$(getconf CLK_TCK)" '$1 == w && $3 == r && $11 > 0 { print $10 * hz / $11 }' "$records" | median
}
# proxy_share WORKLOAD ROW: median share (%) of cpu0's busy time (proxy + backend) the proxy took.
proxy_share() {
  awk -F'\t' -v w="$1" -v r="$2" '$1 == w && $3 == r && $11 + $12 > 0 { print 100 * $11 / ($11 + $12) }' "$records" | median
}
per_round() { # per_round WORKLOAD ROW: rps of each round, in round order
  awk -F'\t' -v w="$1" -v r="$2" '$1 == w && $3 == r { printf "%s%.1fk", sep, $4 / 1000; sep = ", " }' "$records"
}
fmt_rps() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.1fk", v / 1000 }' || printf '—'; }
fmt_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { if (v < 1000) printf "%d µs", v + 0.5; else printf "%.2f ms", v / 1000 }' || printf '—'; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "—" }' || printf '—'; }

# === main ===

started_at=$SECONDS
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
{
  echo "kactivator h2c load benchmark $stamp"
  echo "host: $(uname -r), $(nproc) CPUs; $(h2load --version | head -n 1); $(nginx -v 2>&1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
  echo "options: rounds=$rounds duration=${duration}s workloads=${workloads[*]} h2load -c$clients -m$streams kactivator=$kactivator_bin"
  echo "load average before: $load_before"
} >>"$results"

require_port_free "$BACKEND_PORT" "$NGINX_PORT" "$KACT_URING_PORT" "$KACT_URING_ADMIN" "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"
log "L1: backend and proxies on cpu$PROXY_CPU, h2load -c$clients -m$streams on cpu$CLIENT_CPU; load average $load_before"
declare -A pid_of=() # row -> the pid whose CPU time is that row's proxy (direct: the backend)
start_backend
pid_of[direct]=$last_pid
check_h2 backend "$last_pid" "$BACKEND_PORT" || die "the backend did not come up"
start_nginx
pid_of[nginx]=$last_pid
check_h2 nginx "$last_pid" "$NGINX_PORT" || die "nginx did not come up"
declare -A kact_pid=()
start_kactivator kact-uring io-uring "$KACT_URING_PORT" "$KACT_URING_ADMIN"
kact_pid[kact-uring]=$last_pid
check_h2 kact-uring "$last_pid" "$KACT_URING_PORT" || die "kactivator io-uring did not come up"
start_kactivator kact-epoll epoll "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"
kact_pid[kact-epoll]=$last_pid
pid_of[kact-uring]=${kact_pid[kact-uring]}
pid_of[kact-epoll]=${kact_pid[kact-epoll]}
check_h2 kact-epoll "$last_pid" "$KACT_EPOLL_PORT" || die "kactivator epoll did not come up"

for workload in "${workloads[@]}"; do
  for row in "${rows[@]}"; do measure "$workload" warmup "$row" "$warmup"; done
  for ((round = 1; round <= rounds; round++)); do
    if ((round % 2 == 1)); then
      for row in "${rows[@]}"; do measure "$workload" "$round" "$row" "$duration"; done
    else
      for ((i = ${#rows[@]} - 1; i >= 0; i--)); do measure "$workload" "$round" "${rows[i]}" "$duration"; done
    fi
  done
done

load_after=$(cut -d' ' -f1-3 /proc/loadavg)
stop_kactivator "${kact_pid[kact-uring]}" "$KACT_URING_ADMIN"
stop_kactivator "${kact_pid[kact-epoll]}" "$KACT_EPOLL_ADMIN"

{
  echo
  echo "# kactivator h2c load benchmark, $stamp ($(nproc) CPUs, $(uname -r), commit $(git rev-parse --short HEAD))"
  echo
  echo "L1: backend (kactivator-testbackend --grpc, tonic/hyper) and proxy share cpu$PROXY_CPU, h2load -t1 -c$clients -m$streams -D${duration} on cpu$CLIENT_CPU;"
  echo "median of $rounds alternating round(s). Load average before: $load_before; after: $load_after."
  for workload in "${workloads[@]}"; do
    echo
    if [[ $workload == get ]]; then
      echo "## h2c GET / (backend answers 200, 20-byte body)"
    else
      echo "## gRPC unary $GRPC_PATH (9-byte request frame)"
    fi
    echo
    echo "| path | req/s | req per proxy CPU-second | proxy share of cpu0 | mean | sd | max | errors | req/s per round |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for row in "${rows[@]}"; do
      if [[ $row == direct ]]; then
        share="—"
      else
        share=$(proxy_share "$workload" "$row")
        share=${share:+$(printf '%.0f %%' "$share")}
      fi
      echo "| ${label[$row]} | $(fmt_rps "$(metric "$workload" "$row" 4)") | $(fmt_rps "$(per_core "$workload" "$row")") | ${share:-—} | $(fmt_us "$(metric "$workload" "$row" 5)") | $(fmt_us "$(metric "$workload" "$row" 6)") | $(fmt_us "$(metric "$workload" "$row" 7)") | $(metric "$workload" "$row" 8) | $(per_round "$workload" "$row") |"
    done
    echo
    echo "| ratio, same run | req/s | req per proxy CPU-second |"
    echo "|---|---|---|"
    for pair in kact-uring:nginx kact-epoll:nginx kact-uring:kact-epoll nginx:direct kact-uring:direct; do
      a=${pair%%:*} b=${pair##*:}
      if [[ $b == direct ]]; then cpu_ratio="—"; else cpu_ratio=$(ratio "$(per_core "$workload" "$a")" "$(per_core "$workload" "$b")"); fi
      echo "| ${label[$a]} ÷ ${label[$b]} | $(ratio "$(metric "$workload" "$a" 4)" "$(metric "$workload" "$b" 4)") | $cpu_ratio |"
    done
  done
  noisy=$(awk -F'\t' -v limit="$FOREIGN_CPU_LIMIT" '{ runs++; if ($9 > limit) { n++; if ($9 > max) max = $9 } }
    END { if (n) printf "in %d of %d runs other processes used more than %d%% of the CPUs (up to %d%%)", n, runs, limit, max }' "$records")
  [[ -z $noisy ]] || { echo; echo "WARNING: $noisy; the figures are not trustworthy."; }
  errors_total=$(awk -F'\t' '{ n += $8 } END { print n + 0 }' "$records")
  ((errors_total == 0)) || { echo; echo "ERRORS: $errors_total failed/errored/timed-out or non-2xx requests in total (see the raw file)."; }
  echo
  echo "Raw results: $results ($((SECONDS - started_at)) s)"
} | tee -a "$results"
}
