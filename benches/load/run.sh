#!/usr/bin/env bash
# Load benchmark: kactivator (io-uring and epoll drivers) against nginx and haproxy, side by side
# on this machine, in the two 2-core layouts of BENCHMARKS.md (L1, L2), the same-CPU
# ping-pong (P1) and, on request, the many-core layout (M: the proxy on 1, 2, 4, 8 CPUs), plus
# callgrind instructions per proxied request. See benches/load/README.md for what the numbers
# mean.
#
#   bash benches/load/run.sh [--quick] [--rounds N] [--duration SECS] [--layouts L1,L2,P1,M]
#                            [--only-pingpong] [--many-core] [--cores 1,2,4,8] [--cpus LIST]
#                            [--connections C] [--high-connections C] [--no-load]
#                            [--no-callgrind] [--no-kactivator] [--queue-proxy]
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/load/run.sh   # measure that binary, no build
set -euo pipefail

# The whole script is one compound command, so bash parses all of it before running any of it and
# an edit to this file (git pull, a rebase) during a run cannot derail the run.
{

usage() {
  cat <<'EOF'
usage: bash benches/load/run.sh [options]

  --quick            3 s runs, 1 round, smaller callgrind counts (a smoke test, not a figure)
  --rounds N         rounds per layout, order alternating between rounds (default 3)
  --duration SECS    duration of each wrk or loadgen run (default 10)
  --layouts LIST     comma-separated load layouts to run, from L1, L2 (wrk -c50), P1
                     (same-CPU ping-pong, alias pingpong) and M (many cores, alias many-core);
                     default L1,L2,P1
  --only-pingpong    only the same-CPU ping-pong: --layouts P1 --no-callgrind
  --many-core        only the many-core layout: --layouts M --no-callgrind
  --cores LIST       M: proxy CPU counts to try, comma-separated (default 1,2,4,8); a count the
                     machine cannot give is skipped with the reason
  --cpus LIST        M: the CPUs it may use, as taskset takes them (default: this shell's
                     affinity mask, only NUMA node 0's CPUs when lscpu shows several nodes)
  --connections C    M: wrk connections of the throughput runs (default 256)
  --high-connections C
                     M: wrk connections of the latency run at the largest core count
                     (default 1024; 0 skips it)
  --no-load          skip the load layouts
  --no-callgrind     skip the callgrind instruction counts
  --no-kactivator    measure only the direct path and the peers
  --queue-proxy      run the kactivator rows as `kactivator queue-proxy` (the sidecar role,
                     started with the environment Knative gives its queue-proxy, container
                     concurrency 0) instead of the activator; the peers are unchanged
  --request-log      with --queue-proxy: request logs on, in Knative 1.18's default template
                     (SERVING_ENABLE_REQUEST_LOG; the lines go to the run's log file)
  --tracing          the activator traces every request ([tracing] over OTLP/HTTP at sampling
                     rate 1, to a closed port: the spans are made, encoded and their export
                     fails, counted; what tracing costs a request, collector aside)

Environment: KACTIVATOR_BIN=PATH measures that kactivator binary instead of building
target/release/kactivator. Results go to target/bench-results/load-<timestamp>.txt.
EOF
}

# === options ===

rounds=3
duration=10
warmup=1
callgrind_n1=5000
callgrind_n2=25000
callgrind_connections=10
layouts=(L1 L2 P1)
# The many-core layout (M): proxy CPU counts, CPU list (empty: detect), client connections.
m_cores=(1 2 4 8)
m_cpus_option=
m_connections=256
m_high_connections=1024
want_load=1
want_callgrind=1
want_kactivator=1
role=activator
request_log_env=()
while (($#)); do
  case "$1" in
    --quick) rounds=1 duration=3 callgrind_n1=1000 callgrind_n2=6000 ;;
    --rounds) rounds=${2:?--rounds needs a value}; shift ;;
    --duration) duration=${2:?--duration needs a value}; shift ;;
    --layouts)
      IFS=, read -r -a layouts <<<"${2:?--layouts needs a value}"
      shift
      ;;
    --only-pingpong) layouts=(P1) want_callgrind=0 ;;
    --many-core) layouts=(M) want_callgrind=0 ;;
    --cores)
      IFS=, read -r -a m_cores <<<"${2:?--cores needs a value}"
      shift
      ;;
    --cpus) m_cpus_option=${2:?--cpus needs a value}; shift ;;
    --connections) m_connections=${2:?--connections needs a value}; shift ;;
    --high-connections) m_high_connections=${2:?--high-connections needs a value}; shift ;;
    --no-load) want_load=0 ;;
    --no-callgrind) want_callgrind=0 ;;
    --no-kactivator) want_kactivator=0 ;;
    --queue-proxy) role=queue-proxy ;;
    --tracing) tracing_table=$'[tracing]\nprotocol = "http/protobuf"\nendpoint = "http://127.0.0.1:9/v1/traces"\nsampling_rate = 1.0\n' ;;
    --request-log)
      # Knative 1.18's `logging.request-log-template` (config-observability).
      request_log_env=(SERVING_ENABLE_REQUEST_LOG=true
        'SERVING_REQUEST_LOG_TEMPLATE={"httpRequest": {"requestMethod": "{{.Request.Method}}", "requestUrl": "{{js .Request.RequestURI}}", "requestSize": "{{.Request.ContentLength}}", "status": {{.Response.Code}}, "responseSize": "{{.Response.Size}}", "userAgent": "{{js .Request.UserAgent}}", "remoteIp": "{{js .Request.RemoteAddr}}", "serverIp": "{{.Revision.PodIP}}", "referer": "{{js .Request.Referer}}", "latency": "{{.Response.Latency}}s", "protocol": "{{.Request.Proto}}"}, "traceId": "{{index .Request.Header "X-B3-Traceid"}}"}')
      ;;
    -h | --help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [[ -n ${tracing_table:-} && $role == queue-proxy ]]; then
  echo "run.sh: --tracing measures the activator role (the file's [tracing])" >&2
  exit 2
fi
if ((${#request_log_env[@]})) && [[ $role != queue-proxy ]]; then
  echo "run.sh: --request-log needs --queue-proxy (the activator role writes no request log)" >&2
  exit 2
fi
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds must be a positive integer" >&2; exit 2; }
[[ $duration =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --duration must be a positive integer" >&2; exit 2; }
((${#layouts[@]})) || { echo "run.sh: --layouts needs at least one of L1, L2, P1, M" >&2; exit 2; }
for i in "${!layouts[@]}"; do
  case ${layouts[i]} in
    L1 | L2 | P1 | M) ;;
    pingpong) layouts[i]=P1 ;;
    many-core) layouts[i]=M ;;
    *) echo "run.sh: unknown layout '${layouts[i]}' (L1, L2, P1, pingpong, M or many-core)" >&2; exit 2 ;;
  esac
done
((${#m_cores[@]})) || { echo "run.sh: --cores needs at least one count" >&2; exit 2; }
for n in "${m_cores[@]}"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --cores takes positive integers, not '$n'" >&2; exit 2; }
done
[[ -z $m_cpus_option || $m_cpus_option =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] ||
  { echo "run.sh: --cpus takes a CPU list such as 0-7,16-23, not '$m_cpus_option'" >&2; exit 2; }
[[ $m_connections =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --connections must be a positive integer" >&2; exit 2; }
[[ $m_high_connections =~ ^[0-9]+$ ]] || { echo "run.sh: --high-connections must be an integer (0: no run)" >&2; exit 2; }
# Each layout once, in the order given.
deduped=()
for layout in "${layouts[@]}"; do
  [[ " ${deduped[*]} " == *" $layout "* ]] || deduped+=("$layout")
done
layouts=("${deduped[@]}")
# want_layout LAYOUT: whether LAYOUT was selected (and the wrk layouts are not skipped).
want_layout() { ((want_load)) && [[ " ${layouts[*]} " == *" $1 "* ]]; }
want_load_note() { if ((want_load)); then (IFS=,; echo "${layouts[*]}"); else echo none; fi; }

# === fixed layout of the benchmark ===

readonly BACKEND_PORT=18100
readonly KACT_URING_PORT=18400 KACT_URING_ADMIN=19400
readonly KACT_EPOLL_PORT=18403 KACT_EPOLL_ADMIN=19403
readonly NGINX_PORT=18401
readonly HAPROXY_PORT=18402
readonly PROXY_CPU=0 CLIENT_CPU=1
# Routing headers for kactivator; the backend and the peers ignore them.
readonly ROUTE_HEADERS=(-H 'Knative-Serving-Namespace: default' -H 'Knative-Serving-Revision: bench')
# Generous start-up timeouts: valgrind makes start-up 10-50x slower.
readonly START_TIMEOUT=10 VALGRIND_START_TIMEOUT=60 VALGRIND_EXIT_TIMEOUT=120
# A wrk run during which other processes used more than this share (%) of the CPUs is flagged.
readonly FOREIGN_CPU_LIMIT=5

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
export PATH="$PATH:/usr/sbin:/sbin"

stamp=$(date +%Y%m%d-%H%M%S)
results_dir="$repo/target/bench-results"
results="$results_dir/load-$stamp.txt"
mkdir -p "$results_dir"
: >"$results"

work=$(mktemp -d /tmp/kactivator-load.XXXXXX)
chmod 755 "$work" # nginx workers run as nobody and read below it
records="$work/records.tsv" # layout round row rps p50_us p99_us errors foreign_cpu_percent
: >"$records"

log() { printf '[load %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FATAL: $*"
  exit 1
}
# Appends to the raw results file.
raw() { printf '%s\n' "$*" >>"$results"; }

# === process bookkeeping and clean-up ===

started_pids=()

descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do
    descendants "$child"
    echo "$child"
  done
}

# wait_exit PID TIMEOUT_SECS: returns 0 once PID has exited, 1 if it still runs at the timeout.
wait_exit() {
  local pid=$1 timeout=$2 i
  for ((i = 0; i < timeout * 10; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  ! kill -0 "$pid" 2>/dev/null
}

# stop_pid PID [SIGNAL [TIMEOUT_SECS]]: signals PID (and its descendants, so that nginx workers do
# not outlive their master), waits, then SIGKILLs whatever is left. Returns PID's exit status
# when it was our child, 137 if it had to be killed.
stop_pid() {
  local pid=$1 signal=${2:-TERM} timeout=${3:-5} tree status=0
  kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || status=$?; return "$status"; }
  tree="$(descendants "$pid") $pid"
  # shellcheck disable=SC2086 # word splitting of the pid list is intended
  kill -s "$signal" $tree 2>/dev/null || true
  if ! wait_exit "$pid" "$timeout"; then
    # shellcheck disable=SC2086
    kill -KILL $tree 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 137
  fi
  # shellcheck disable=SC2086
  kill -KILL $tree 2>/dev/null || true # stray children of a master that already exited
  wait "$pid" 2>/dev/null || status=$?
  return "$status"
}

# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local status=$? pid stray
  trap - EXIT INT TERM
  for pid in "${started_pids[@]}"; do
    stop_pid "$pid" TERM 3 || true
  done
  # Anything still running from our work directory (e.g. a child re-parented after its parent
  # died) is ours.
  stray=$(pgrep -f "$work" || true)
  if [[ -n $stray ]]; then
    log "killing stray processes: $stray"
    # shellcheck disable=SC2086
    kill -KILL $stray 2>/dev/null || true
  fi
  if ((status != 0)); then
    local kept="$results_dir/load-$stamp-logs"
    mkdir -p "$kept"
    cp "$work"/*.log "$work"/*.err "$kept/" 2>/dev/null || true
    if rmdir "$kept" 2>/dev/null; then
      log "failed (exit $status)"
    else
      log "failed (exit $status); server logs kept in $kept/"
    fi
  fi
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# start NAME CPU COMMAND...: runs COMMAND pinned to CPU in the background, output in
# $work/NAME.log; sets $last_pid.
last_pid=
start() {
  local name=$1 cpu=$2
  shift 2
  taskset -c "$cpu" "$@" >"$work/$name.log" 2>&1 &
  last_pid=$!
  started_pids+=("$last_pid")
  raw "start $name (pid $last_pid, cpu $cpu): $*"
}

forget_pid() {
  local pid=$1 kept=() p
  for p in "${started_pids[@]}"; do [[ $p == "$pid" ]] || kept+=("$p"); done
  started_pids=("${kept[@]}")
}

log_tail() {
  local name=$1
  if [[ -s $work/$name.log ]]; then
    sed 's/^/    | /' "$work/$name.log" | tail -n 15 >&2
  fi
  if [[ -s $work/$name.err ]]; then
    sed 's/^/    | /' "$work/$name.err" | tail -n 15 >&2
  fi
}

# wake PORT: opens and closes a TCP connection to PORT, to wake a reactor (see valgrind_wake_port).
wake() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null || true
}

# http_status MAX_SECS WAKE_PORT CURL_ARGS...: prints the status of one curl request (000 if none).
# With a WAKE_PORT, that port is woken every 50 ms while the request is pending.
http_status() {
  local max_time=$1 wake_port=$2 curl_pid status_file="$work/status.$BASHPID"
  shift 2
  if [[ -z $wake_port ]]; then
    curl -s -o /dev/null -w '%{http_code}' --max-time "$max_time" "$@" || true
    return 0
  fi
  curl -s -o /dev/null -w '%{http_code}' --max-time "$max_time" "$@" >"$status_file" &
  curl_pid=$!
  while kill -0 "$curl_pid" 2>/dev/null; do
    wake "$wake_port"
    sleep 0.05
  done
  wait "$curl_pid" 2>/dev/null || true
  cat "$status_file"
  rm -f "$status_file"
}

# wait_http NAME PID URL TIMEOUT_SECS [WAKE_PORT]: polls URL until it answers 200 while PID lives,
# waking WAKE_PORT while each request is pending if given. Returns 1 (after saying why) if PID
# exits or the timeout passes.
wait_http() {
  local name=$1 pid=$2 url=$3 timeout=$4 wake_port=${5:-} code deadline
  deadline=$((SECONDS + timeout))
  while ((SECONDS < deadline)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      log "$name exited during start-up (pid $pid); last log lines:"
      log_tail "$name"
      return 1
    fi
    code=$(http_status 2 "$wake_port" "$url")
    [[ $code == 200 ]] && return 0
    sleep 0.1
  done
  log "$name did not answer 200 on $url within ${timeout}s (last status: ${code:-none}); last log lines:"
  log_tail "$name"
  return 1
}

# check_proxied NAME URL: one request through the data path must return 200 "ok" from the
# backend.
check_proxied() {
  local name=$1 url=$2 body
  body=$(curl -s --max-time 5 -f "${ROUTE_HEADERS[@]}" "$url") || {
    log "$name: GET $url failed: $(curl -s -o /dev/null -w 'status %{http_code}' --max-time 5 "${ROUTE_HEADERS[@]}" "$url" || true)"
    return 1
  }
  [[ $body == ok ]] || { log "$name: GET $url returned body '${body:0:80}', expected 'ok'"; return 1; }
}

require_port_free() {
  local port
  for port in "$@"; do
    if [[ -n $(ss -Htln "sport = :$port") ]]; then
      die "port $port is already in use (ss -tlnp 'sport = :$port' shows who); stop it first"
    fi
  done
}

# cpu_snapshot [CPUS]: prints "busy total ours" in clock ticks. busy = user + nice + system + steal
# of all CPUs, or of the CPUs given (one, as in P1, or a comma-separated list, as in M: the CPUs
# our processes run on); ours = CPU time of every process we started (and their children, e.g.
# nginx workers) plus that of this shell's reaped children (wrk). busy - ours is what other work
# on the machine (on those CPUs) took while we measured.
cpu_snapshot() {
  local pid p ticks ours=0 busy_total
  busy_total=$(awk -v cpus="${1:-}" 'BEGIN {
      if (cpus == "") want["cpu"] = 1
      else { n = split(cpus, c, ","); for (i = 1; i <= n; i++) want["cpu" c[i]] = 1 }
    }
    $1 in want { busy += $2 + $3 + $4 + $9; total += $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }
    END { print busy + 0, total + 0 }' /proc/stat)
  for pid in "${started_pids[@]}"; do
    for p in $pid $(descendants "$pid"); do
      # Fields after "pid (comm) ": utime and stime are the 12th and 13th.
      ticks=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
      ours=$((ours + ${ticks:-0}))
    done
  done
  ticks=$(sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }')
  echo "$busy_total $((ours + ticks))"
}

# foreign_percent: benches/foreign-cpu.sh
source "$repo/benches/foreign-cpu.sh"

# === tools ===

install_tools() {
  local missing=() tool
  for tool in wrk nginx haproxy valgrind curl; do
    command -v "$tool" >/dev/null || missing+=("$tool")
  done
  command -v callgrind_annotate >/dev/null || missing+=(valgrind)
  command -v ss >/dev/null || missing+=(iproute2)
  command -v taskset >/dev/null || missing+=(util-linux)
  ((${#missing[@]})) || return 0
  ((EUID == 0)) || die "missing ${missing[*]} and not root: apt-get install -y ${missing[*]}"
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}

kactivator_bin=${KACTIVATOR_BIN:-$repo/target/release/kactivator}
kactivator_note=

build() {
  # The instruction counts and the ping-pong (P1) need the loadgen; L1 and L2 use wrk.
  if ((want_callgrind)) || want_layout P1; then
    log "building kactivator-loadgen (release)"
    cargo build --release --quiet -p kactivator-loadgen || die "kactivator-loadgen did not build"
    local target_dir=${CARGO_TARGET_DIR:-target}
    [[ $target_dir == /* ]] || target_dir="$repo/$target_dir"
    loadgen_bin="$target_dir/release/kactivator-loadgen"
    [[ -x $loadgen_bin ]] || die "kactivator-loadgen built but $loadgen_bin is missing"
  fi

  ((want_kactivator)) || { kactivator_note="kactivator rows not requested (--no-kactivator)"; return 0; }
  if [[ -n ${KACTIVATOR_BIN:-} ]]; then
    [[ -x $KACTIVATOR_BIN ]] || die "KACTIVATOR_BIN=$KACTIVATOR_BIN is not an executable file"
    log "using KACTIVATOR_BIN=$KACTIVATOR_BIN (not building)"
    return 0
  fi
  log "building kactivator (release, target dir $repo/target)"
  if ! env -u CARGO_TARGET_DIR cargo build --release --quiet -p kactivator --bin kactivator \
    >"$work/kactivator-build.log" 2>&1; then
    log "kactivator does not build; its rows are skipped. Last lines of the build:"
    tail -n 20 "$work/kactivator-build.log" | sed 's/^/    | /' >&2
    kactivator_note="kactivator rows skipped: the binary does not build"
    want_kactivator=0
  fi
}

# === server configurations ===

# nginx_conf FILE NAME PORT MODE [WORKERS [AFFINITY [KEEPALIVE]]]: MODE is "backend" (return 200
# "ok"), "proxy" (to the backend) or "proxy-single" (proxy with master_process off, for valgrind).
# WORKERS (default 1), AFFINITY (worker_cpu_affinity masks, none by default) and KEEPALIVE (idle
# upstream connections each worker keeps, default 128) are for the many-core layout.
nginx_conf() {
  local file=$1 name=$2 port=$3 mode=$4 workers=${5:-1} affinity=${6:-} keepalive=${7:-128}
  local location master=""
  if [[ $mode == backend ]]; then
    location='return 200 "ok";'
  else
    location='proxy_pass http://be; proxy_http_version 1.1; proxy_set_header Connection "";'
  fi
  [[ $mode == proxy-single ]] && master="master_process off;"
  mkdir -p "$work/$name-temp"
  cat >"$file" <<EOF
daemon off;
$master
worker_processes $workers;${affinity:+ worker_cpu_affinity $affinity;}
pid $work/$name.pid;
error_log $work/$name.err warn;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  client_body_temp_path $work/$name-temp/body;
  proxy_temp_path $work/$name-temp/proxy;
  fastcgi_temp_path $work/$name-temp/fastcgi;
  uwsgi_temp_path $work/$name-temp/uwsgi;
  scgi_temp_path $work/$name-temp/scgi;
  upstream be { server 127.0.0.1:$BACKEND_PORT; keepalive $keepalive; keepalive_requests 10000000; }
  server {
    listen 127.0.0.1:$port reuseport backlog=4096;
    location / { $location }
  }
}
EOF
}

# start_nginx NAME CPUS PORT MODE [WORKERS [AFFINITY [KEEPALIVE]]]: see nginx_conf.
start_nginx() {
  local name=$1 cpu=$2 port=$3 mode=$4
  nginx_conf "$work/$name.conf" "$name" "$port" "$mode" "${@:5}"
  nginx -t -q -p "$work" -e "$work/$name.err" -c "$work/$name.conf" >"$work/$name.log" 2>&1 ||
    { log_tail "$name"; die "$name: nginx rejected its configuration"; }
  start "$name" "$cpu" nginx -p "$work" -e "$work/$name.err" -c "$work/$name.conf"
}

start_haproxy() {
  local name=$1 cpu=$2
  cat >"$work/$name.cfg" <<EOF
global
  nbthread 1
  maxconn 4000
defaults
  mode http
  option http-keep-alive
  http-reuse always
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend fe
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend be
backend be
  server s1 127.0.0.1:$BACKEND_PORT
EOF
  start "$name" "$cpu" haproxy -db -f "$work/$name.cfg"
}

# The quarantine gate is off: its prober wants the queue-proxy's `queue` answer on /healthz,
# which the nginx backend does not give (the pod would be quarantined and every request would
# wait), and the peers run no health checks either.
kactivator_conf() {
  local file=$1 port=$2 admin=$3
  cat >"$file" <<EOF
[listen]
http = "127.0.0.1:$port"
http2 = "127.0.0.1:0"
admin = "127.0.0.1:$admin"

[features]
"activator.pod-quarantine" = "disabled"

${tracing_table:-}
[[revisions]]
namespace = "default"
name = "bench"
container_concurrency = 0
pods = ["127.0.0.1:$BACKEND_PORT"]
EOF
}

# Where start_kactivator puts kactivator and how many shards it gets: cpu0 and one shard, except
# in the many-core layout, which sets both for each core count it measures.
proxy_cpus=$PROXY_CPU
proxy_shards=1

# start_kactivator NAME DRIVER PORT ADMIN [WRAPPER...]: the wrapper (valgrind) goes before the
# binary. No drain grace: it exists for endpoints to move off a terminating pod, and here it would
# only hold the stop (`/quitquitquit` drains like SIGTERM) for its 45 s default. With
# --queue-proxy, the queue-proxy role with Knative's environment instead (its quiet period is the
# drain grace, so it is 0 too); its autoscaler and drain ports are ADMIN+1 and ADMIN+2.
start_kactivator() {
  local name=$1 driver=$2 port=$3 admin=$4
  shift 4
  local common=(--shards "$proxy_shards" --driver "$driver" --drain-grace-seconds 0)
  if [[ $role == queue-proxy ]]; then
    start "$name" "$proxy_cpus" env \
      SERVING_NAMESPACE=default SERVING_SERVICE=bench SERVING_CONFIGURATION=bench \
      SERVING_REVISION=bench SERVING_POD=bench-deployment-0 SERVING_POD_IP=127.0.0.1 \
      QUEUE_SERVING_PORT="$port" QUEUE_SERVING_TLS_PORT="$((admin + 3))" USER_PORT="$BACKEND_PORT" \
      CONTAINER_CONCURRENCY=0 REVISION_TIMEOUT_SECONDS=300 ACTIVATOR_SERVICE_URL= \
      SERVING_READINESS_PROBE="{\"tcpSocket\":{\"port\":$BACKEND_PORT,\"host\":\"127.0.0.1\"},\"successThreshold\":1}" \
      "${request_log_env[@]}" "$@" "$kactivator_bin" queue-proxy "${common[@]}" --admin "127.0.0.1:$admin" \
      --autoscaler-metrics "127.0.0.1:$((admin + 1))" --drain-admin "127.0.0.1:$((admin + 2))"
    return
  fi
  kactivator_conf "$work/$name.toml" "$port" "$admin"
  start "$name" "$proxy_cpus" "$@" "$kactivator_bin" --config "$work/$name.toml" "${common[@]}"
}

# stop_kactivator PID ADMIN_PORT TIMEOUT_SECS [WAKE_PORT]: asks for a clean exit over the admin
# port (signals do not get through io_uring_enter under valgrind), waking WAKE_PORT until the
# process is gone if given; signals only if that did not work.
stop_kactivator() {
  local pid=$1 admin=$2 timeout=$3 wake_port=${4:-} quit_pid i
  curl -s -o /dev/null --max-time "$timeout" -X POST "http://127.0.0.1:$admin/quitquitquit" &
  quit_pid=$!
  for ((i = 0; i < timeout * 20; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    [[ -n $wake_port ]] && wake "$wake_port"
    sleep 0.05
  done
  if kill -0 "$pid" 2>/dev/null; then
    log "kactivator (pid $pid) still runs ${timeout}s after POST /quitquitquit; sending SIGTERM"
  fi
  kill "$quit_pid" 2>/dev/null || true
  wait "$quit_pid" 2>/dev/null || true
  stop_pid "$pid" TERM 5
}

# === the rows ===

rows=(direct kact-uring kact-epoll nginx haproxy)
declare -A label=(
  [direct]="direct to backend"
  [kact-uring]="kactivator io-uring"
  [kact-epoll]="kactivator epoll"
  [nginx]="nginx proxy"
  [haproxy]="haproxy"
)
if [[ $role == queue-proxy ]]; then
  label[kact-uring]="kactivator queue-proxy io-uring"
  label[kact-epoll]="kactivator queue-proxy epoll"
fi
declare -A port_of=(
  [direct]=$BACKEND_PORT
  [kact-uring]=$KACT_URING_PORT
  [kact-epoll]=$KACT_EPOLL_PORT
  [nginx]=$NGINX_PORT
  [haproxy]=$HAPROXY_PORT
)
declare -A skipped=() # row -> reason
url_of() { echo "http://127.0.0.1:${port_of[$1]}/"; }

# The load layouts. The proxies always run on $PROXY_CPU.
#   L1: backend on the proxies' CPU, wrk -c50 on the other one (proxy CPU cost).
#   L2: proxy alone on its CPU, backend and wrk -c50 on the other one.
#   P1: same-CPU ping-pong: backend, proxy and one client connection all on $PROXY_CPU, so no
#       request crosses CPUs (a cross-vCPU wake-up costs ~40 µs here) and the p50/p99 over
#       direct is the proxy's own added latency. Only the rows the target compares: direct,
#       kactivator, nginx. The client is kactivator-loadgen, not wrk: wrk 4.1 "corrects" its
#       latencies for coordinated omission (stats_correct: every sample longer than twice the
#       mean interval per connection, here ~20-50 µs, gets synthetic samples every interval
#       below it), so one 4 ms preemption becomes ~100 samples and its p99 measures stalls.
declare -A layout_backend_cpu=([L1]=$PROXY_CPU [L2]=$CLIENT_CPU [P1]=$PROXY_CPU)
declare -A layout_client=([L1]=wrk [L2]=wrk [P1]=loadgen)
declare -A layout_client_cpu=([L1]=$CLIENT_CPU [L2]=$CLIENT_CPU [P1]=$PROXY_CPU)
declare -A layout_connections=([L1]=50 [L2]=50 [P1]=1)
declare -A layout_rows=([L1]="${rows[*]}" [L2]="${rows[*]}" [P1]="direct kact-uring kact-epoll nginx")
# The CPU whose /proc/stat line the foreign-CPU check reads; empty: all CPUs.
declare -A layout_stat_cpu=([L1]="" [L2]="" [P1]=$PROXY_CPU)

# === load layouts (wrk, and kactivator-loadgen for P1) ===

to_us() { awk -v v="$1" 'BEGIN {
  n = v + 0
  if (v ~ /us$/) print n; else if (v ~ /ms$/) print n * 1000; else if (v ~ /s$/) print n * 1000000; else print n
}'; }

# kv KEY FILE: the value of KEY=value on kactivator-loadgen's summary line in FILE.
kv() { awk -v k="$1" '/^requests=/ { for (i = 1; i <= NF; i++) if (index($i, k "=") == 1) print substr($i, length(k) + 2) }' "$2"; }

# wrk_figures FILE: sets rps, p50, p99 (µs) and errors (socket errors plus non-2xx responses)
# from wrk's output in FILE.
wrk_figures() {
  rps=$(awk '/^Requests\/sec:/ { print $2 }' "$1")
  p50=$(to_us "$(awk '$1 == "50%" { print $2 }' "$1")")
  p99=$(to_us "$(awk '$1 == "99%" { print $2 }' "$1")")
  errors=$(awk '/Socket errors:/ { gsub(/,/, ""); n += $4 + $6 + $8 + $10 }
                /Non-2xx or 3xx responses:/ { n += $5 }
                END { print n + 0 }' "$1")
}

# measure LAYOUT ROUND ROW SECS: one run of the layout's client (wrk, or kactivator-loadgen for
# P1) on its CPU with its connection count; appends a record unless ROUND is "warmup".
measure() {
  local layout=$1 round=$2 row=$3 secs=$4 out rps p50 p99 errors before foreign
  local stat_cpu=${layout_stat_cpu[$layout]} client=${layout_client[$layout]}
  local cpu=${layout_client_cpu[$layout]} connections=${layout_connections[$layout]}
  out="$work/$client-$layout-$round-$row.txt"
  before=$(cpu_snapshot "$stat_cpu")
  if [[ $client == loadgen ]]; then
    # It exits 1 when a request failed; the errors are counted below.
    taskset -c "$cpu" "$loadgen_bin" --url "$(url_of "$row")" --connections "$connections" \
      --duration-secs "$secs" --latency "${ROUTE_HEADERS[@]}" >"$out" 2>&1 || true
  elif ! taskset -c "$cpu" wrk -t1 -c"$connections" -d"${secs}s" --latency \
    "${ROUTE_HEADERS[@]}" "$(url_of "$row")" >"$out" 2>&1; then
    cat "$out" >&2
    die "wrk failed against ${label[$row]} ($(url_of "$row"))"
  fi
  foreign=$(foreign_percent "$before" "$(cpu_snapshot "$stat_cpu")")
  [[ $round == warmup ]] && return 0
  if [[ $client == loadgen ]]; then
    rps=$(kv rps "$out")
    p50=$(kv p50_us "$out")
    p99=$(kv p99_us "$out")
    errors=$(kv errors "$out")
    [[ $p50 != - ]] || p50="" # no successful request
  else
    wrk_figures "$out"
  fi
  [[ -n $rps && -n $p50 && -n $p99 && -n $errors ]] || { cat "$out" >&2; die "could not parse $client output for ${label[$row]}"; }
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$layout" "$round" "$row" "$rps" "$p50" "$p99" "$errors" "$foreign" >>"$records"
  raw "--- $client layout=$layout round=$round row=$row rps=$rps p50_us=$p50 p99_us=$p99 errors=$errors foreign_cpu=$foreign%"
  cat "$out" >>"$results"
  local note=""
  ((errors == 0)) || note+=", $errors ERRORS"
  ((foreign <= FOREIGN_CPU_LIMIT)) || note+=", other processes used $foreign% of ${stat_cpu:+cpu}${stat_cpu:-the CPUs}"
  log "$layout round $round ${label[$row]}: ${rps} rps, p50 ${p50} us, p99 ${p99} us$note"
}

# in_layout LAYOUT ROW: whether the layout measures ROW.
in_layout() { [[ " ${layout_rows[$1]} " == *" $2 "* ]]; }

# run_layout LAYOUT: starts the layout's servers on their CPUs, measures its rows (warm-up, then
# --rounds rounds in alternating order) and stops the servers.
run_layout() {
  local layout=$1 backend_cpu=${layout_backend_cpu[$1]} row round pids=() order=() active=()
  log "layout $layout: proxies on cpu$PROXY_CPU, backend on cpu$backend_cpu, ${layout_client[$layout]} -c${layout_connections[$layout]} on cpu${layout_client_cpu[$layout]}"
  require_port_free "$BACKEND_PORT" "$NGINX_PORT" "$HAPROXY_PORT" \
    "$KACT_URING_PORT" "$KACT_URING_ADMIN" "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"

  start_nginx "backend-$layout" "$backend_cpu" "$BACKEND_PORT" backend
  pids+=("$last_pid")
  wait_http "backend-$layout" "$last_pid" "$(url_of direct)" "$START_TIMEOUT" ||
    die "the nginx backend (backend-$layout) did not start"
  check_proxied "backend" "$(url_of direct)" || die "the nginx backend answers wrongly"
  active+=(direct)

  if in_layout "$layout" nginx; then
    start_nginx "nginx-$layout" "$PROXY_CPU" "$NGINX_PORT" proxy
    pids+=("$last_pid")
    if ! { wait_http "nginx-$layout" "$last_pid" "$(url_of nginx)" "$START_TIMEOUT" &&
      check_proxied "nginx proxy" "$(url_of nginx)"; }; then
      die "the nginx proxy (nginx-$layout) did not start"
    fi
    active+=(nginx)
  fi

  if in_layout "$layout" haproxy; then
    start_haproxy "haproxy-$layout" "$PROXY_CPU"
    pids+=("$last_pid")
    if ! { wait_http "haproxy-$layout" "$last_pid" "$(url_of haproxy)" "$START_TIMEOUT" &&
      check_proxied "haproxy" "$(url_of haproxy)"; }; then
      die "haproxy (haproxy-$layout) did not start"
    fi
    active+=(haproxy)
  fi

  local kact_pid_uring="" kact_pid_epoll=""
  if ((want_kactivator)); then
    for row in kact-uring kact-epoll; do
      [[ -n ${skipped[$row]:-} ]] && continue
      in_layout "$layout" "$row" || continue
      local driver=io-uring port=$KACT_URING_PORT admin=$KACT_URING_ADMIN
      [[ $row == kact-epoll ]] && driver=epoll port=$KACT_EPOLL_PORT admin=$KACT_EPOLL_ADMIN
      start_kactivator "$row-$layout" "$driver" "$port" "$admin"
      if wait_http "$row-$layout" "$last_pid" "http://127.0.0.1:$admin/readyz" "$START_TIMEOUT" &&
        check_proxied "${label[$row]}" "$(url_of "$row")"; then
        active+=("$row")
        if [[ $row == kact-uring ]]; then kact_pid_uring=$last_pid; else kact_pid_epoll=$last_pid; fi
      else
        skipped[$row]="did not start (--driver $driver); see the log above"
        log "${label[$row]}: SKIPPED, ${skipped[$row]}"
        stop_pid "$last_pid" TERM 2 || true
        forget_pid "$last_pid"
      fi
    done
  fi

  # Fixed row order, restricted to what is up; rounds alternate forward and backward so that no
  # row always runs first (or right after the same neighbour).
  for row in "${rows[@]}"; do
    [[ " ${active[*]} " == *" $row "* ]] && order+=("$row")
  done
  for row in "${order[@]}"; do measure "$layout" warmup "$row" "$warmup"; done
  for ((round = 1; round <= rounds; round++)); do
    if ((round % 2 == 1)); then
      for row in "${order[@]}"; do measure "$layout" "$round" "$row" "$duration"; done
    else
      for ((i = ${#order[@]} - 1; i >= 0; i--)); do measure "$layout" "$round" "${order[i]}" "$duration"; done
    fi
  done

  if [[ -n $kact_pid_uring ]]; then
    stop_kactivator "$kact_pid_uring" "$KACT_URING_ADMIN" 5 || log "kactivator io-uring: exit status $? after quitquitquit"
    forget_pid "$kact_pid_uring"
  fi
  if [[ -n $kact_pid_epoll ]]; then
    stop_kactivator "$kact_pid_epoll" "$KACT_EPOLL_ADMIN" 5 || log "kactivator epoll: exit status $? after quitquitquit"
    forget_pid "$kact_pid_epoll"
  fi
  local pid
  for pid in "${pids[@]}"; do
    stop_pid "$pid" TERM 5 || true
    forget_pid "$pid"
  done
}

# === many-core layout (M) ===
#
# The proxy gets N CPUs (kactivator: --shards N under a taskset of those N, so each shard pins
# itself to one of them; nginx: N workers, each bound to one with worker_cpu_affinity), for each
# N of --cores. The backend (nginx return 200, one worker per CPU) and wrk (one thread per CPU)
# have CPUs of their own that stay the same for every N, so the direct row is one ceiling for all
# of them. The CPU list is split in two: the first half is where the proxy may go, the second
# half is shared by the backend (its first half) and wrk (the rest). With 2 CPUs that leaves one
# for both, and only N = 1 fits. CPU per request is the proxy's own CPU time (all threads, or
# master and workers) over the run divided by wrk's completed requests.

m_cpu_source=
m_all=() m_proxy_pool=() m_backend_cpus=() m_load_cpus=()
m_ran=()            # the core counts measured
m_skip_notes=()     # one sentence per core count not measured
m_high_layout=      # the records layout of the run at --high-connections, if any
declare -A m_pid=() # row -> pid whose process tree is that row's proxy (direct: the backend)
clk_tck=$(getconf CLK_TCK)

# expand_cpus LIST: the CPUs of a kernel CPU list ("0-3,8"), one per line.
expand_cpus() {
  awk -v list="$1" 'BEGIN {
    n = split(list, parts, ",")
    for (i = 1; i <= n; i++) {
      if (parts[i] == "") continue
      if (split(parts[i], r, "-") == 2) { for (c = r[1] + 0; c <= r[2] + 0; c++) print c }
      else print parts[i] + 0
    }
  }'
}

cpu_list() { (IFS=,; echo "$*"); }

# nginx_affinity CPU...: worker_cpu_affinity masks binding one worker to each CPU, in order.
nginx_affinity() {
  local cpu masks=()
  for cpu in "$@"; do
    masks+=("1$(printf "%${cpu}s" '' | tr ' ' 0)")
  done
  echo "${masks[*]}"
}

# many_core_plan: picks M's CPUs and splits them (see above), and decides which core counts fit.
many_core_plan() {
  local list cpu node n first_node pool half
  if [[ -n $m_cpus_option ]]; then
    list=$m_cpus_option
    m_cpu_source="--cpus $list"
  else
    list=$(awk '/^Cpus_allowed_list:/ { print $2 }' /proc/self/status)
    m_cpu_source="this shell's affinity mask ($list)"
  fi
  mapfile -t m_all < <(expand_cpus "$list" | sort -n | uniq)
  if [[ -z $m_cpus_option ]]; then
    # More than one NUMA node: stay on the node of the first CPU (node 0 unless the mask leaves it
    # out), so that no request crosses nodes and the figures do not depend on which node each
    # process landed on.
    declare -A node_of=()
    while IFS=, read -r cpu node; do
      [[ $cpu == \#* || -z $cpu ]] && continue
      node_of[$cpu]=${node:-0}
    done < <(lscpu -p=CPU,NODE 2>/dev/null || true)
    local nodes=() kept=()
    for cpu in "${m_all[@]}"; do
      [[ " ${nodes[*]} " == *" ${node_of[$cpu]:-0} "* ]] || nodes+=("${node_of[$cpu]:-0}")
    done
    if ((${#nodes[@]} > 1)); then
      first_node=${node_of[${m_all[0]}]:-0}
      for cpu in "${m_all[@]}"; do
        [[ ${node_of[$cpu]:-0} == "$first_node" ]] && kept+=("$cpu")
      done
      m_all=("${kept[@]}")
      m_cpu_source+=", NUMA node $first_node only (lscpu shows ${#nodes[@]} nodes)"
    fi
  fi
  if ((${#m_all[@]} < 2)); then
    m_skip_notes+=("the many-core layout needs at least 2 CPUs (the proxy on one, backend and wrk on another); it has ${#m_all[@]} (from $m_cpu_source)")
    return 0
  fi
  pool=$((${#m_all[@]} / 2))
  m_proxy_pool=("${m_all[@]:0:pool}")
  local rest=("${m_all[@]:pool}")
  if ((${#rest[@]} == 1)); then
    m_backend_cpus=("${rest[@]}")
    m_load_cpus=("${rest[@]}")
  else
    half=$((${#rest[@]} / 2))
    m_backend_cpus=("${rest[@]:0:half}")
    m_load_cpus=("${rest[@]:half}")
  fi
  m_ran=()
  for n in "${m_cores[@]}"; do
    [[ " ${m_ran[*]} " == *" $n "* ]] && continue
    if ((n > pool)); then
      m_skip_notes+=("N=$n not run: the proxy may use at most $pool of the ${#m_all[@]} CPUs (from $m_cpu_source); the other half runs the backend and wrk, which need about as many CPUs as the proxy to keep it busy")
      continue
    fi
    m_ran+=("$n")
  done
}

# tree_ticks PID: user + system clock ticks of PID (all its threads) and of its descendants.
tree_ticks() {
  local p ticks total=0
  for p in $1 $(descendants "$1"); do
    ticks=$(sed 's/^.*) //' "/proc/$p/stat" 2>/dev/null | awk '{ print $12 + $13 }')
    total=$((total + ${ticks:-0}))
  done
  echo "$total"
}

# reaped_ticks: user + system clock ticks of this shell's children that have exited (wrk).
reaped_ticks() { sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }'; }

# measure_m LAYOUT ROUND ROW CONNECTIONS SECS: one wrk run on M's load CPUs; appends a record
# (columns 9-15: proxy, backend and wrk ticks, wrk's completed requests, the proxy's CPU µs per
# request, and the cores the proxy and wrk kept busy) unless ROUND is "warmup".
measure_m() {
  local layout=$1 round=$2 row=$3 conns=$4 secs=$5 out before foreign t0 t1
  local p0 p1 b0 b1 c0 c1 rps p50 p99 errors requests threads=${#m_load_cpus[@]}
  ((threads <= conns)) || threads=$conns
  out="$work/wrk-$layout-$round-$row.txt"
  before=$(cpu_snapshot "$m_stat_cpus")
  p0=$(tree_ticks "${m_pid[$row]}")
  b0=$(tree_ticks "${m_pid[direct]}")
  c0=$(reaped_ticks)
  t0=$EPOCHREALTIME
  if ! taskset -c "$(cpu_list "${m_load_cpus[@]}")" wrk -t"$threads" -c"$conns" -d"${secs}s" --latency \
    "${ROUTE_HEADERS[@]}" "$(url_of "$row")" >"$out" 2>&1; then
    cat "$out" >&2
    die "wrk failed against ${label[$row]} ($(url_of "$row"))"
  fi
  t1=$EPOCHREALTIME
  c1=$(reaped_ticks)
  b1=$(tree_ticks "${m_pid[direct]}")
  p1=$(tree_ticks "${m_pid[$row]}")
  foreign=$(foreign_percent "$before" "$(cpu_snapshot "$m_stat_cpus")")
  [[ $round == warmup ]] && return 0
  wrk_figures "$out"
  requests=$(awk '/ requests in / { print $1 }' "$out")
  [[ -n $rps && -n $p50 && -n $p99 && -n $errors && -n $requests ]] ||
    { cat "$out" >&2; die "could not parse wrk output for ${label[$row]}"; }
  local per_req busy_proxy busy_load
  read -r per_req busy_proxy busy_load < <(awk -v p=$((p1 - p0)) -v c=$((c1 - c0)) -v n="$requests" \
    -v hz="$clk_tck" -v t0="$t0" -v t1="$t1" 'BEGIN {
      t = t1 - t0; if (t <= 0) t = 1
      printf "%.2f %.2f %.2f\n", (n > 0 ? p / hz * 1e6 / n : 0), p / hz / t, c / hz / t
    }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$layout" "$round" "$row" "$rps" \
    "$p50" "$p99" "$errors" "$foreign" $((p1 - p0)) $((b1 - b0)) $((c1 - c0)) "$requests" "$per_req" \
    "$busy_proxy" "$busy_load" >>"$records"
  raw "--- wrk layout=$layout round=$round row=$row connections=$conns rps=$rps p50_us=$p50 p99_us=$p99 errors=$errors foreign_cpu=$foreign% requests=$requests proxy_ticks=$((p1 - p0)) backend_ticks=$((b1 - b0)) wrk_ticks=$((c1 - c0)) cpu_us_per_request=$per_req"
  cat "$out" >>"$results"
  local note=""
  ((errors == 0)) || note+=", $errors ERRORS"
  ((foreign <= FOREIGN_CPU_LIMIT)) || note+=", other processes used $foreign% of CPUs $m_stat_cpus"
  log "$layout round $round ${label[$row]} (c=$conns): ${rps} rps, ${per_req} µs CPU/request, p50 ${p50} us, p99 ${p99} us$note"
}

# measure_rotated LAYOUT CONNECTIONS ROW...: a warm-up run per row, then --rounds rounds. Round r
# starts with the r-th row and goes round the list, so over as many rounds as there are rows each
# row runs once in each position: the first run of a round tends to do better (on the 16-core
# machine it did), and plain forward/backward alternation puts the same row first in rounds 1
# and 3.
measure_rotated() {
  local layout=$1 conns=$2 round i n
  shift 2
  local order=("$@")
  n=${#order[@]}
  for ((i = 0; i < n; i++)); do measure_m "$layout" warmup "${order[i]}" "$conns" "$warmup"; done
  for ((round = 1; round <= rounds; round++)); do
    for ((i = 0; i < n; i++)); do
      measure_m "$layout" "$round" "${order[(round - 1 + i) % n]}" "$conns" "$duration"
    done
  done
}

# run_many_core: the M layout (see above): the direct row once, then for each core count that fits
# the proxies on that many CPUs, and at the largest one also a run at --high-connections.
run_many_core() {
  local n row active proxy_list backend_list pids nofile
  many_core_plan
  if ((${#m_ran[@]} == 0)); then
    log "layout M: nothing to run: ${m_skip_notes[*]}"
    return 0
  fi
  backend_list=$(cpu_list "${m_backend_cpus[@]}")
  log "layout M: CPUs ${m_all[*]} (from $m_cpu_source); proxy on the first N of ${m_proxy_pool[*]}, backend on $backend_list, wrk on $(cpu_list "${m_load_cpus[@]}"); N = ${m_ran[*]}"
  for row in "${m_skip_notes[@]}"; do log "layout M: $row"; done
  require_port_free "$BACKEND_PORT" "$NGINX_PORT" "$KACT_URING_PORT" "$KACT_URING_ADMIN" "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"

  # Each connection is a descriptor in wrk and two in a proxy; 1 024 of them pass a common soft
  # limit of 1 024. Raised for this layout only, back at its end.
  nofile=$(ulimit -Sn)
  if [[ $nofile != unlimited ]] && ((nofile < 16384)); then
    ulimit -Sn "$(ulimit -Hn | awk '{ print ($1 == "unlimited" || $1 > 65536) ? 65536 : $1 }')" ||
      log "layout M: could not raise the descriptor limit ($nofile); runs with many connections may fail"
  fi

  start_nginx backend-M "$backend_list" "$BACKEND_PORT" backend "${#m_backend_cpus[@]}" \
    "$(nginx_affinity "${m_backend_cpus[@]}")"
  m_pid[direct]=$last_pid
  wait_http backend-M "$last_pid" "$(url_of direct)" "$START_TIMEOUT" || die "the nginx backend (backend-M) did not start"
  check_proxied "backend" "$(url_of direct)" || die "the nginx backend answers wrongly"
  # The direct row runs with only the backend's and wrk's CPUs in use.
  m_stat_cpus=$(cpu_list "${m_backend_cpus[@]}" "${m_load_cpus[@]}")
  [[ ${m_backend_cpus[*]} == "${m_load_cpus[*]}" ]] && m_stat_cpus=$backend_list
  measure_rotated Mdirect "$m_connections" direct

  for n in "${m_ran[@]}"; do
    proxy_list=$(cpu_list "${m_proxy_pool[@]:0:n}")
    m_stat_cpus=$(cpu_list "${m_proxy_pool[@]:0:n}" "${m_backend_cpus[@]}")
    [[ ${m_backend_cpus[*]} == "${m_load_cpus[*]}" ]] || m_stat_cpus+=",$(cpu_list "${m_load_cpus[@]}")"
    log "layout M, N=$n: proxies on CPUs $proxy_list"
    active=()
    pids=()
    start_nginx "nginx-M$n" "$proxy_list" "$NGINX_PORT" proxy "$n" "$(nginx_affinity "${m_proxy_pool[@]:0:n}")" \
      "$((m_connections > m_high_connections ? m_connections : m_high_connections))"
    m_pid[nginx]=$last_pid
    pids+=("$last_pid")
    if ! { wait_http "nginx-M$n" "$last_pid" "$(url_of nginx)" "$START_TIMEOUT" &&
      check_proxied "nginx proxy" "$(url_of nginx)"; }; then
      die "the nginx proxy (nginx-M$n) did not start"
    fi
    active+=(nginx)
    local kact_pids=() kact_admins=()
    if ((want_kactivator)); then
      proxy_cpus=$proxy_list
      proxy_shards=$n
      for row in kact-uring kact-epoll; do
        [[ -n ${skipped[$row]:-} ]] && continue
        local driver=io-uring port=$KACT_URING_PORT admin=$KACT_URING_ADMIN
        [[ $row == kact-epoll ]] && driver=epoll port=$KACT_EPOLL_PORT admin=$KACT_EPOLL_ADMIN
        start_kactivator "$row-M$n" "$driver" "$port" "$admin"
        if wait_http "$row-M$n" "$last_pid" "http://127.0.0.1:$admin/readyz" "$START_TIMEOUT" &&
          check_proxied "${label[$row]}" "$(url_of "$row")"; then
          active+=("$row")
          m_pid[$row]=$last_pid
          kact_pids+=("$last_pid")
          kact_admins+=("$admin")
        else
          skipped[$row]="did not start (--driver $driver --shards $n); see the log above"
          log "${label[$row]}: SKIPPED, ${skipped[$row]}"
          stop_pid "$last_pid" TERM 2 || true
          forget_pid "$last_pid"
        fi
      done
      proxy_cpus=$PROXY_CPU
      proxy_shards=1
    fi
    # Fixed starting order, the rows that are up; measure_rotated turns it from round to round.
    local order=()
    for row in kact-uring kact-epoll nginx; do
      [[ " ${active[*]} " == *" $row "* ]] && order+=("$row")
    done
    measure_rotated "M$n" "$m_connections" "${order[@]}"
    if ((m_high_connections > 0)) && [[ $n == "${m_ran[-1]}" ]]; then
      m_high_layout="M$n-c$m_high_connections"
      log "layout M, N=$n: $m_high_connections connections"
      measure_rotated "$m_high_layout" "$m_high_connections" "${order[@]}" direct
    fi

    local i
    for i in "${!kact_pids[@]}"; do
      stop_kactivator "${kact_pids[i]}" "${kact_admins[i]}" 5 || log "kactivator (pid ${kact_pids[i]}): exit status $? after quitquitquit"
      forget_pid "${kact_pids[i]}"
    done
    for row in "${pids[@]}"; do
      stop_pid "$row" TERM 5 || true
      forget_pid "$row"
    done
  done
  stop_pid "${m_pid[direct]}" TERM 5 || true
  forget_pid "${m_pid[direct]}"
  [[ $nofile == unlimited ]] || ulimit -Sn "$nofile" 2>/dev/null || true
}

median() { sort -g | awk '{ v[NR] = $1 } END {
  if (NR == 0) exit
  if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2
}'; }

# metric LAYOUT ROW COLUMN: median of a records column (4 rps, 5 p50, 6 p99); column 7 (errors)
# is summed over the rounds instead.
metric() {
  if (($3 == 7)); then
    awk -F'\t' -v l="$1" -v r="$2" '$1 == l && $3 == r { n += $7 } END { print n + 0 }' "$records"
  else
    awk -F'\t' -v l="$1" -v r="$2" -v c="$3" '$1 == l && $3 == r { print $c }' "$records" | median
  fi
}

fmt_rps() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.1fk", v / 1000 }' || printf '—'; }
fmt_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { if (v < 1000) printf "%d µs", v + 0.5; else printf "%.2f ms", v / 1000 }' || printf '—'; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else printf "—" }' || printf '—'; }

# noisy_note WHAT LAYOUT...: a sentence when, in some of those layouts' wrk runs, other processes
# used more than $FOREIGN_CPU_LIMIT % of WHAT (the CPUs the check reads); nothing otherwise.
noisy_note() {
  local what=$1
  shift
  awk -F'\t' -v limit="$FOREIGN_CPU_LIMIT" -v layouts=" $* " -v what="$what" 'index(layouts, " " $1 " ") {
      runs++
      if ($8 > limit) { n++; if ($8 > max) max = $8 }
    }
    END { if (n) printf "in %d of %d runs other processes used more than %d%% of %s (up to %d%%)", n, runs, limit, what, max }' "$records"
}

# report_load: the table of the 2-core layouts (L1, L2) that ran.
report_load() {
  local row layout cells err errors any_errors=0 shown=() header="| path |" rule="|---|"
  for layout in L1 L2; do
    want_layout "$layout" || continue
    shown+=("$layout")
    header+=" $layout rps | $layout p50 | $layout p99 |"
    rule+="---|---|---|"
  done
  ((${#shown[@]})) || return 0
  echo
  echo "## Throughput and latency (wrk -t1 -c50 -d${duration}s, median of $rounds alternating round(s))"
  echo
  echo "$header"
  echo "$rule"
  for row in "${rows[@]}"; do
    cells=""
    for layout in "${shown[@]}"; do
      if [[ -z $(metric "$layout" "$row" 4) ]]; then
        cells+=" skipped | — | — |"
        continue
      fi
      errors=$(metric "$layout" "$row" 7)
      err=""
      if ((errors > 0)); then
        any_errors=1
        err=" (!$errors errors)"
      fi
      cells+=" $(fmt_rps "$(metric "$layout" "$row" 4)")$err | $(fmt_us "$(metric "$layout" "$row" 5)") | $(fmt_us "$(metric "$layout" "$row" 6)") |"
    done
    echo "| ${label[$row]} |$cells"
  done
  if ((any_errors)); then
    echo
    echo "(!N errors) = wrk counted N socket errors or non-2xx responses over the rounds: that row's figures are not valid."
  fi
  local noisy
  noisy=$(noisy_note "the CPUs" "${shown[@]}")
  if [[ -n $noisy ]]; then
    echo
    echo "WARNING: $noisy. The wall-clock figures above are not trustworthy;"
    echo "rerun on a quiet machine (instruction counts are unaffected)."
  fi
  echo
  header="| rps ratio, same run |"
  rule="|---|"
  for layout in "${shown[@]}"; do
    header+=" $layout |"
    rule+="---|"
  done
  echo "$header"
  echo "$rule"
  local pair a b
  for pair in kact-uring:nginx kact-epoll:nginx kact-uring:haproxy kact-epoll:haproxy kact-uring:kact-epoll nginx:direct; do
    a=${pair%%:*} b=${pair##*:}
    cells=""
    for layout in "${shown[@]}"; do
      cells+=" $(ratio "$(metric "$layout" "$a" 4)" "$(metric "$layout" "$b" 4)") |"
    done
    echo "| ${label[$a]} ÷ ${label[$b]} |$cells"
  done
}

# fmt_added_us MICROSECONDS: a signed latency difference, "+18 µs" or "+1.25 ms".
fmt_added_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN {
  a = v < 0 ? -v : v
  if (a < 1000) printf "%+d µs", (v < 0 ? v - 0.5 : v + 0.5); else printf "%+.2f ms", v / 1000
}' || printf '—'; }

# added LAYOUT ROW COLUMN: ROW's median of a records column (5 p50, 6 p99) minus the direct row's,
# in µs; empty if either is missing.
added() {
  local a b
  a=$(metric "$1" "$2" "$3")
  b=$(metric "$1" direct "$3")
  [[ -n $a && -n $b ]] || return 0
  awk -v a="$a" -v b="$b" 'BEGIN { print a - b }'
}

# added_per_round LAYOUT ROW COLUMN: ROW's figure minus the direct row's in the same round, for
# each round, comma-separated, in µs.
added_per_round() {
  awk -F'\t' -v l="$1" -v r="$2" -v c="$3" '$1 == l && $3 == "direct" { d[$2] = $c }
    $1 == l && $3 == r { v[$2] = $c }
    END {
      for (k = 1; k in v || k in d; k++) if (k in v && k in d) {
        out = out sep sprintf("%+.0f", v[k] - d[k]); sep = ", "
      }
      print out
    }' "$records"
}

# report_pingpong: the same-CPU ping-pong (P1) table and the latency each proxy adds over direct.
report_pingpong() {
  want_layout P1 || return 0
  local row p50 p99 errors err any_errors=0 add50 add99 nginx_p99 verdict
  echo
  echo "## Same-CPU ping-pong (P1: backend, proxy and client on cpu$PROXY_CPU; kactivator-loadgen, 1 connection, ${duration}s, median of $rounds alternating round(s))"
  echo
  echo "| path | p50 | p99 | adds at p50 | adds at p99 | p50 added, per round (µs) | p99 added, per round (µs) | rps |"
  echo "|---|---|---|---|---|---|---|---|"
  for row in ${layout_rows[P1]}; do
    p50=$(metric P1 "$row" 5)
    if [[ -z $p50 ]]; then
      echo "| ${label[$row]} | skipped | — | — | — | — | — | — |"
      continue
    fi
    p99=$(metric P1 "$row" 6)
    errors=$(metric P1 "$row" 7)
    err=""
    if ((errors > 0)); then
      any_errors=1
      err=" (!$errors errors)"
    fi
    if [[ $row == direct ]]; then
      echo "| ${label[$row]} | $(fmt_us "$p50") | $(fmt_us "$p99") | — | — | — | — | $(fmt_rps "$(metric P1 "$row" 4)")$err |"
      continue
    fi
    echo "| ${label[$row]} | $(fmt_us "$p50") | $(fmt_us "$p99") | $(fmt_added_us "$(added P1 "$row" 5)") | $(fmt_added_us "$(added P1 "$row" 6)") | $(added_per_round P1 "$row" 5) | $(added_per_round P1 "$row" 6) | $(fmt_rps "$(metric P1 "$row" 4)")$err |"
  done
  if ((any_errors)); then
    echo
    echo "(!N errors) = wrk counted N socket errors or non-2xx responses over the rounds: that row's figures are not valid."
  fi
  local noisy
  noisy=$(noisy_note "cpu$PROXY_CPU" P1)
  if [[ -n $noisy ]]; then
    echo
    echo "WARNING: $noisy. The latency figures above are not trustworthy;"
    echo "rerun on a quiet machine."
  fi
  # The only peer in P1 is nginx, so it is the best peer of the p99 target.
  nginx_p99=$(metric P1 nginx 6)
  echo
  echo "Added latency over direct (p50 and p99 of each row minus those of direct, medians over the rounds);"
  echo "target (BENCHMARKS.md): kactivator adds ≤ 30 µs at p50, and its p99 is no worse than the best peer's (here nginx):"
  echo
  for row in ${layout_rows[P1]}; do
    [[ $row == direct ]] && continue
    add50=$(added P1 "$row" 5)
    add99=$(added P1 "$row" 6)
    [[ -n $add50 ]] || continue
    verdict=""
    if [[ $row == kact-* ]]; then
      if awk -v a="$add50" 'BEGIN { exit !(a <= 30) }'; then verdict=" (p50 target met"; else verdict=" (p50 target NOT met"; fi
      if [[ -n $nginx_p99 ]]; then
        if awk -v a="$(metric P1 "$row" 6)" -v b="$nginx_p99" 'BEGIN { exit !(a <= b) }'; then
          verdict+="; p99 no worse than nginx)"
        else
          verdict+="; p99 worse than nginx)"
        fi
      else
        verdict+=")"
      fi
    fi
    add50=$(fmt_added_us "$add50")
    add99=$(fmt_added_us "$add99")
    echo "- ${label[$row]} adds ${add50#+} at p50, ${add99#+} at p99$verdict"
  done
}

# m_round_ratios LAYOUT ROW COLUMN: ROW's figure ÷ nginx's in the same round, for each round,
# comma-separated.
m_round_ratios() {
  awk -F'\t' -v l="$1" -v r="$2" -v c="$3" '$1 == l && $3 == "nginx" { d[$2] = $c }
    $1 == l && $3 == r { v[$2] = $c }
    END {
      for (k = 1; k in v || k in d; k++) if (k in v && k in d && d[k] > 0) {
        out = out sep sprintf("%.2f", v[k] / d[k]); sep = ", "
      }
      print out
    }' "$records"
}

fmt_cpu_us() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.1f µs", v }' || printf '—'; }
fmt_cores() { [[ -n $1 ]] && awk -v v="$1" 'BEGIN { printf "%.2f", v }' || printf '—'; }

# report_many_core: the M table (rps and CPU per request per core count, kactivator's drivers
# beside nginx) and the table of the run at --high-connections.
report_many_core() {
  want_layout M || return 0
  local n row layout rps errors err any_errors=0 note threads=${#m_load_cpus[@]} shared=""
  ((threads <= m_connections)) || threads=$m_connections
  [[ ${m_backend_cpus[*]} == "${m_load_cpus[*]}" ]] && shared=" (the same CPU)"
  echo
  echo "## Many cores (M): proxy on N CPUs, backend and wrk on others (wrk -t$threads -c$m_connections -d${duration}s, median of $rounds round(s), row order rotated)"
  echo
  if ((${#m_ran[@]} == 0)); then
    for note in "${m_skip_notes[@]}"; do echo "- $note"; done
    return 0
  fi
  echo "CPUs ${m_all[*]} (from $m_cpu_source): the proxy on the first N of $(cpu_list "${m_proxy_pool[@]}"); the backend (nginx \`return 200\`, ${#m_backend_cpus[@]} worker(s)) on $(cpu_list "${m_backend_cpus[@]}") and wrk on $(cpu_list "${m_load_cpus[@]}")$shared."
  echo "CPU per request: the proxy's user + system time over the run ÷ the requests wrk completed (for direct: the backend's). Busy: CPU-seconds per second (cores kept busy)."
  echo
  echo "| cores | path | rps | CPU per request | p50 | p99 | busy: proxy / wrk | ÷ nginx: rps / CPU per request | ÷ nginx per round: rps / CPU per request |"
  echo "|---|---|---|---|---|---|---|---|---|"
  # m_row N LAYOUT ROW: one line of the table.
  m_row() {
    local n=$1 layout=$2 row=$3 rps errors err ratios
    rps=$(metric "$layout" "$row" 4)
    if [[ -z $rps ]]; then
      echo "| $n | ${label[$row]} | skipped | — | — | — | — | — | — |"
      return 0
    fi
    errors=$(metric "$layout" "$row" 7)
    err=""
    if ((errors > 0)); then
      any_errors=1
      err=" (!$errors errors)"
    fi
    ratios="— | —"
    if [[ $row != direct && $row != nginx ]]; then
      ratios="$(ratio "$rps" "$(metric "$layout" nginx 4)") / $(ratio "$(metric "$layout" "$row" 13)" "$(metric "$layout" nginx 13)") | $(m_round_ratios "$layout" "$row" 4) / $(m_round_ratios "$layout" "$row" 13)"
    fi
    echo "| $n | ${label[$row]} | $(fmt_rps "$rps")$err | $(fmt_cpu_us "$(metric "$layout" "$row" 13)")$([[ $row == direct ]] && echo " (backend)") | $(fmt_us "$(metric "$layout" "$row" 5)") | $(fmt_us "$(metric "$layout" "$row" 6)") | $(fmt_cores "$(metric "$layout" "$row" 14)")$([[ $row == direct ]] && echo " (backend)") / $(fmt_cores "$(metric "$layout" "$row" 15)") | $ratios |"
  }
  m_row — Mdirect direct
  for n in "${m_ran[@]}"; do
    for row in kact-uring kact-epoll nginx; do m_row "$n" "M$n" "$row"; done
  done
  if ((any_errors)); then
    echo
    echo "(!N errors) = wrk counted N socket errors or non-2xx responses over the rounds: that row's figures are not valid."
  fi
  echo
  # Where the proxy did not keep its N CPUs busy, something else (backend, wrk, a shared CPU) set
  # the pace: rps then says little about the proxy, CPU per request still does.
  for n in "${m_ran[@]}"; do
    for row in kact-uring kact-epoll nginx; do
      local busy
      busy=$(metric "M$n" "$row" 14)
      [[ -n $busy ]] || continue
      if awk -v b="$busy" -v n="$n" 'BEGIN { exit !(b < 0.9 * n) }'; then
        echo "- N=$n, ${label[$row]}: the proxy kept $(fmt_cores "$busy") of its $n CPU(s) busy, so something else set the pace (the backend, wrk, or other processes on the machine); compare CPU per request there, not rps."
      fi
    done
  done
  for note in "${m_skip_notes[@]}"; do echo "- $note"; done
  local layouts_m=(Mdirect) noisy
  for n in "${m_ran[@]}"; do layouts_m+=("M$n"); done
  [[ -n $m_high_layout ]] && layouts_m+=("$m_high_layout")
  noisy=$(noisy_note "the CPUs in use" "${layouts_m[@]}")
  if [[ -n $noisy ]]; then
    echo
    echo "WARNING: $noisy. The figures of this layout are not trustworthy; rerun on a quiet machine."
  fi

  [[ -n $m_high_layout ]] || return 0
  n=${m_ran[-1]}
  threads=${#m_load_cpus[@]}
  ((threads <= m_high_connections)) || threads=$m_high_connections
  echo
  echo "## At $m_high_connections connections (M, proxy on N=$n CPUs, wrk -t$threads -c$m_high_connections -d${duration}s, median of $rounds round(s))"
  echo
  echo "| path | rps | p50 | p99 | p99 ÷ nginx | p99 per round (µs) | CPU per request |"
  echo "|---|---|---|---|---|---|---|"
  layout=$m_high_layout
  any_errors=0
  for row in kact-uring kact-epoll nginx direct; do
    rps=$(metric "$layout" "$row" 4)
    if [[ -z $rps ]]; then
      echo "| ${label[$row]} | skipped | — | — | — | — | — |"
      continue
    fi
    errors=$(metric "$layout" "$row" 7)
    err=""
    if ((errors > 0)); then
      any_errors=1
      err=" (!$errors errors)"
    fi
    local p99_ratio="—"
    [[ $row == kact-* ]] && p99_ratio=$(ratio "$(metric "$layout" "$row" 6)" "$(metric "$layout" nginx 6)")
    echo "| ${label[$row]} | $(fmt_rps "$rps")$err | $(fmt_us "$(metric "$layout" "$row" 5)") | $(fmt_us "$(metric "$layout" "$row" 6)") | $p99_ratio | $(awk -F'\t' -v l="$layout" -v r="$row" '$1 == l && $3 == r { printf "%s%.0f", sep, $6; sep = ", " }' "$records") | $(fmt_cpu_us "$(metric "$layout" "$row" 13)")$([[ $row == direct ]] && echo " (backend)") |"
  done
  if ((any_errors)); then
    echo
    echo "(!N errors) = wrk counted N socket errors or non-2xx responses over the rounds: that row's figures are not valid."
  fi
}

# === callgrind ===

declare -A instructions=() # "row n" -> total instructions

# callgrind_total FILE: the program's total instruction count from a complete callgrind output.
# Callgrind writes the file only at exit and ends it with "totals:", so a missing totals line
# means the profile is incomplete.
callgrind_total() {
  awk '/^totals:/ { n = $2 } END { if (n != "") print n }' "$1"
}

# callgrind_one ROW N: runs ROW under callgrind, drives N requests through it, stops it cleanly.
#
# Valgrind 3.19 does not release its big lock while a thread blocks in io_uring_enter, so while an
# io-uring shard waits for completions every other thread of the process (the admin endpoint's
# among them) is frozen: /readyz and /quitquitquit hang. Opening and closing a connection to the
# data port wakes the shard and lets the other threads run; kactivator is woken that way while
# its admin endpoint is polled. A bare connect costs a few thousand instructions and no proxied
# request, the same few in both runs, so it does not show in the marginal figure.
callgrind_one() {
  local row=$1 n=$2 name="cg-$1-$2" out pid status=0 lg
  out="$work/$name.out"
  local valgrind=(valgrind --tool=callgrind "--callgrind-out-file=$out")
  case $row in
    nginx)
      nginx_conf "$work/$name.conf" "$name" "$NGINX_PORT" proxy-single
      start "$name" "$PROXY_CPU" "${valgrind[@]}" nginx -p "$work" -e "$work/$name.err" -c "$work/$name.conf"
      pid=$last_pid
      wait_http "$name" "$pid" "$(url_of nginx)" "$VALGRIND_START_TIMEOUT" ||
        die "nginx under valgrind ($name) did not start"
      ;;
    kact-uring | kact-epoll)
      local driver=io-uring port=$KACT_URING_PORT admin=$KACT_URING_ADMIN
      [[ $row == kact-epoll ]] && driver=epoll port=$KACT_EPOLL_PORT admin=$KACT_EPOLL_ADMIN
      start_kactivator "$name" "$driver" "$port" "$admin" "${valgrind[@]}"
      pid=$last_pid
      if ! wait_http "$name" "$pid" "http://127.0.0.1:$admin/readyz" "$VALGRIND_START_TIMEOUT" "$port"; then
        stop_pid "$pid" KILL 2 || true
        forget_pid "$pid"
        return 1
      fi
      ;;
  esac
  check_proxied "$name" "$(url_of "$row")" || die "$name does not proxy to the backend"

  lg=$(taskset -c "$CLIENT_CPU" "$loadgen_bin" --url "$(url_of "$row")" --requests "$n" \
    --connections "$callgrind_connections" "${ROUTE_HEADERS[@]}" 2>"$work/$name-loadgen.err") || {
    cat "$work/$name-loadgen.err" >&2
    die "$name: loadgen reported errors: $lg"
  }
  raw "--- callgrind $name loadgen: $lg"

  if [[ $row == nginx ]]; then
    stop_pid "$pid" QUIT "$VALGRIND_EXIT_TIMEOUT" || status=$?
  else
    stop_kactivator "$pid" "${admin:?}" "$VALGRIND_EXIT_TIMEOUT" "${port:?}" || status=$?
  fi
  forget_pid "$pid"
  ((status == 0)) || die "$name did not exit cleanly (status $status): its callgrind profile is incomplete"
  local total
  total=$(callgrind_total "$out")
  [[ -n $total ]] || die "$name: no totals line in $out: the profile is incomplete"
  instructions["$row $n"]=$total
  mkdir -p "$results_dir/load-$stamp-callgrind"
  cp "$out" "$results_dir/load-$stamp-callgrind/$row-$n.out"
  raw "--- callgrind $name instructions=$total"
  log "callgrind ${label[$row]}, $n requests: $total instructions"
}

run_callgrind() {
  local row n backend_pid cg_rows=(nginx)
  ((want_kactivator)) && cg_rows=(kact-uring kact-epoll nginx)
  log "callgrind: proxy under valgrind on cpu$PROXY_CPU, backend and loadgen on cpu$CLIENT_CPU, $callgrind_connections connections"
  require_port_free "$BACKEND_PORT" "$NGINX_PORT" "$KACT_URING_PORT" "$KACT_URING_ADMIN" "$KACT_EPOLL_PORT" "$KACT_EPOLL_ADMIN"
  start_nginx backend-cg "$CLIENT_CPU" "$BACKEND_PORT" backend
  backend_pid=$last_pid
  wait_http backend-cg "$backend_pid" "$(url_of direct)" "$START_TIMEOUT" || die "the nginx backend (backend-cg) did not start"
  for row in "${cg_rows[@]}"; do
    if [[ -n ${skipped[$row]:-} ]]; then
      log "${label[$row]} under callgrind: SKIPPED, it did not start without valgrind either"
      continue
    fi
    for n in "$callgrind_n1" "$callgrind_n2"; do
      if ! callgrind_one "$row" "$n"; then
        skipped["cg-$row"]="did not start under valgrind"
        log "${label[$row]} under callgrind: SKIPPED, did not start"
        break
      fi
    done
  done
  stop_pid "$backend_pid" TERM 5 || true
  forget_pid "$backend_pid"
}

# per_request ROW: marginal instructions per proxied request, (I(N2) - I(N1)) / (N2 - N1).
per_request() {
  local i1=${instructions["$1 $callgrind_n1"]:-} i2=${instructions["$1 $callgrind_n2"]:-}
  [[ -n $i1 && -n $i2 ]] || return 0
  awk -v a="$i1" -v b="$i2" -v n1="$callgrind_n1" -v n2="$callgrind_n2" 'BEGIN { printf "%.0f", (b - a) / (n2 - n1) }'
}

report_callgrind() {
  local row nginx_per per
  nginx_per=$(per_request nginx)
  echo
  echo "## Instructions per proxied request (callgrind, user space, all threads; (I(N2) - I(N1)) / (N2 - N1), $callgrind_connections connections)"
  echo
  echo "| proxy | I(N1=$callgrind_n1) | I(N2=$callgrind_n2) | instructions/request | ÷ nginx |"
  echo "|---|---|---|---|---|"
  for row in kact-uring kact-epoll nginx; do
    per=$(per_request "$row")
    if [[ -z $per ]]; then
      echo "| ${label[$row]} | skipped | — | — | — |"
      continue
    fi
    echo "| ${label[$row]} | ${instructions["$row $callgrind_n1"]} | ${instructions["$row $callgrind_n2"]} | $per | $(ratio "$per" "$nginx_per") |"
  done
}

# === main ===

started_at=$SECONDS
install_tools # before the header, which asks the tools for their versions
callgrind_note=no
((want_callgrind)) && callgrind_note="N1=$callgrind_n1 N2=$callgrind_n2"
{
  echo "kactivator load benchmark $stamp"
  echo "host: $(uname -r), $(nproc) CPUs; $(wrk --version 2>&1 | head -n 1); $(nginx -v 2>&1); $(haproxy -v | head -n 1)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
  echo "options: rounds=$rounds duration=${duration}s layouts=$(want_load_note) callgrind=$callgrind_note kactivator=$kactivator_bin role=$role"
  if want_layout M; then
    echo "many-core: cores=$(cpu_list "${m_cores[@]}") cpus=${m_cpus_option:-detect} connections=$m_connections high_connections=$m_high_connections; lscpu: $(lscpu | awk -F: '/^Model name|^NUMA node\(s\)/ { gsub(/^ +/, "", $2); printf "%s%s", sep, $2; sep = ", " }')"
  fi
} >>"$results"

build
if ((!want_kactivator)); then
  skipped[kact-uring]=$kactivator_note
  skipped[kact-epoll]=$kactivator_note
fi

if ((want_load)); then
  for layout in "${layouts[@]}"; do
    if [[ $layout == M ]]; then run_many_core; else run_layout "$layout"; fi
  done
fi
if ((want_callgrind)); then
  run_callgrind
fi

{
  echo
  echo "# kactivator load benchmark, $stamp ($(nproc) CPUs, $(uname -r))"
  if [[ $role == queue-proxy ]]; then
    echo
    echo "The kactivator rows are the queue-proxy role (\`kactivator queue-proxy\`, container concurrency 0)."
  fi
  if ((want_load)); then
    report_load
    report_pingpong
    report_many_core
  fi
  if ((want_callgrind)); then report_callgrind; fi
  echo
  for row in "${!skipped[@]}"; do
    if [[ $row == cg-* ]]; then
      echo "- skipped ${label[${row#cg-}]} under callgrind: ${skipped[$row]}"
    else
      echo "- skipped ${label[$row]}: ${skipped[$row]}"
    fi
  done
  echo "Raw results: $results ($((SECONDS - started_at)) s)"
} | tee -a "$results"

# A kactivator that builds but does not start is a failure; one that does not build yet is not.
for row in "${!skipped[@]}"; do
  [[ ${skipped[$row]} == "did not start"* ]] && exit 1
done
exit 0
}
