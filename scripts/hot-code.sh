#!/usr/bin/env bash
# Writes the ordering file of the shipped binary's link: every function kactivator runs to start
# and to serve, one symbol a line, in the order lld is to place them at the front of `.text`,
# instead of scattered through 10 MB of it. scripts/link-hot-first.sh runs it between its two
# links of the `dist` build (scripts/image.sh); it is not run by hand.
#
# Why: the kernel maps a binary's code into a process in 64 KiB windows around each page it runs
# ("fault-around"), so an idle process's resident memory is set by how many windows start-up and
# serving touch, not by how much code they run. Packed together, the same functions touch a third
# of the windows (BENCHMARKS.md, "Idle memory and the code layout").
#
# How: runs the binary under callgrind, as the queue-proxy and as the activator, under both
# drivers, through start-up, the kubelet's and the activator's probes, the autoscaler's scrape,
# requests over HTTP/1.1 and h2c, and a drain; every function that ran is named, the
# queue-proxy's first (the role whose footprint has a target). The names are the symbols of the
# binary traced, which the second link shares: nothing is matched across builds. About a minute
# on two cores.
#
# Usage: scripts/hot-code.sh BIN ORDER_FILE   (needs valgrind, curl, python3, and nginx for the
#                                              h2c backend)
#        scripts/hot-code.sh --tools          installs valgrind (apt-get) and nginx (its Debian
#                                              package unpacked under target/tools, no service)
#                                              when missing; as root, on Debian or Ubuntu
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
# The functions named in callgrind output files (each one's `fn=` and `cfn=` lines), sorted.
fns_of() { sed -n 's/^c\{0,1\}fn=([0-9]*) \(.*\)/\1/p' "$@" | sort -u; }

# Debian's nginx, unpacked here by `--tools` when the machine has none: installing the package
# would start it as a service on port 80.
nginx_dir=${CARGO_TARGET_DIR:-$root/target}/tools/nginx
nginx=$(command -v nginx || true)
[[ -n $nginx || ! -x $nginx_dir/usr/sbin/nginx ]] || nginx=$nginx_dir/usr/sbin/nginx

if [[ ${1:-} == --tools ]]; then
  if command -v valgrind >/dev/null && [[ -n $nginx ]]; then exit 0; fi
  [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null ||
    { echo "hot-code.sh: install valgrind and nginx (the image's code layout traces the build)" >&2; exit 1; }
  apt-get update -qq
  if ! command -v valgrind >/dev/null; then
    echo "hot-code.sh: installing valgrind" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends valgrind >/dev/null
  fi
  if [[ -z $nginx ]]; then
    echo "hot-code.sh: unpacking Debian's nginx into $nginx_dir" >&2
    rm -rf "$nginx_dir" && mkdir -p "$nginx_dir"
    (cd "$nginx_dir" && apt-get download -qq nginx 2>/dev/null && dpkg-deb -x nginx_*.deb . && rm nginx_*.deb)
    "$nginx_dir/usr/sbin/nginx" -v
  fi
  exit 0
fi

bin=${1:?usage: scripts/hot-code.sh BIN ORDER_FILE}
order=${2:?usage: scripts/hot-code.sh BIN ORDER_FILE}
for tool in valgrind callgrind_control curl python3 nm; do
  command -v "$tool" >/dev/null || { echo "hot-code.sh: needs $tool (scripts/hot-code.sh --tools)" >&2; exit 1; }
done
[[ -n $nginx ]] || { echo "hot-code.sh: needs nginx for the h2c backend (scripts/hot-code.sh --tools)" >&2; exit 1; }
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wake() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null || true; }
get() { curl -s -o /dev/null --max-time 10 "$@" || true; }

http1_port=$(free_port)
python3 -m http.server "$http1_port" --bind 127.0.0.1 >/dev/null 2>&1 &
pids+=($!)
# The h2c user container. Every temporary path is named: Debian's build points them into
# /var/lib/nginx, which an unpacked copy has none of.
h2c_port=$(free_port)
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events {}
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server { listen 127.0.0.1:$h2c_port http2; location / { return 200 "h2c\n"; } }
}
EOF
"$nginx" -e "$work/nginx/error.log" -p "$work/nginx" -c "$work/nginx/nginx.conf" &
pids+=($!)
sleep 0.5

# trace NAME DRIVER ROLE USER_PORT: one callgrind run; writes $work/NAME.fns (every function
# that ran) and $work/NAME.serving (those that ran after start-up, before the drain).
trace() {
  local name=$1 driver=$2 role=$3 user=$4 port admin stats= out=$work/$1 pid i
  port=$(free_port) admin=$(free_port)
  local common=(--shards 1 --driver "$driver" --drain-grace-seconds 0 --admin "127.0.0.1:$admin")
  local cg=(valgrind --tool=callgrind --fair-sched=yes --demangle=no "--callgrind-out-file=$out.cg")
  echo "hot-code.sh: tracing $name" >&2
  if [[ $role == queue-proxy ]]; then
    stats=$(free_port)
    env SERVING_NAMESPACE=default SERVING_SERVICE=hot SERVING_CONFIGURATION=hot \
      SERVING_REVISION=hot SERVING_POD=hot-0 SERVING_POD_IP=127.0.0.1 \
      QUEUE_SERVING_PORT="$port" QUEUE_SERVING_TLS_PORT="$(free_port)" USER_PORT="$user" \
      CONTAINER_CONCURRENCY=0 REVISION_TIMEOUT_SECONDS=300 ACTIVATOR_SERVICE_URL= \
      SERVING_READINESS_PROBE="{\"tcpSocket\":{\"port\":$user,\"host\":\"127.0.0.1\"}}" \
      "${cg[@]}" "$bin" queue-proxy "${common[@]}" \
      --autoscaler-metrics "127.0.0.1:$stats" --drain-admin "127.0.0.1:$(free_port)" \
      >"$out.log" 2>&1 &
  else
    cat >"$out.toml" <<EOF
[listen]
http = "127.0.0.1:$port"
admin = "127.0.0.1:$admin"

[features]
"activator.pod-quarantine" = "disabled"

[[revisions]]
namespace = "default"
name = "hot"
container_concurrency = 1
pods = ["127.0.0.1:$user"]
EOF
    "${cg[@]}" "$bin" --config "$out.toml" "${common[@]}" >"$out.log" 2>&1 &
  fi
  pid=$!
  pids+=("$pid")
  # Under valgrind a reactor waiting in io_uring_enter holds every other thread of the process
  # until something arrives: a connection every 50 ms wakes it.
  (while kill -0 "$pid" 2>/dev/null; do wake "$port"; sleep 0.05; done) &
  pids+=($!)
  for ((i = 0; i < 600; i++)); do
    curl -s -o /dev/null --max-time 10 "http://127.0.0.1:$admin/readyz" && break
    sleep 0.1
  done
  # Start-up ends when the queue-proxy unmaps its code (`start::UNMAP_START_UP_CODE_AFTER`, 3 s):
  # what ran until then is dumped apart from what serving runs; the activator is cut at the same
  # time.
  sleep 5
  callgrind_control --dump=start-up "$pid" >/dev/null 2>&1
  local route=(-H 'Knative-Serving-Namespace: default' -H 'Knative-Serving-Revision: hot')
  local protocol=()
  [[ $user == "$h2c_port" ]] && protocol=(--http2-prior-knowledge)
  for ((i = 0; i < 3; i++)); do
    get -H 'User-Agent: kube-probe/1.30' -H 'K-Network-Probe: queue' "http://127.0.0.1:$port/"
    get -H 'Knative-Activator-Probe: true' "http://127.0.0.1:$port/"
    get "${protocol[@]}" "${route[@]}" "http://127.0.0.1:$port/"
    get "${protocol[@]}" "${route[@]}" -d 'a body' "http://127.0.0.1:$port/"
    get "http://127.0.0.1:$admin/metrics"
    get "http://127.0.0.1:$admin/healthz"
    # The autoscaler's scrape, once a second in a cluster.
    [[ -n $stats ]] && get "http://127.0.0.1:$stats/metrics"
    sleep 1
  done
  # Idle, as most pods are most of the time: the shard's sweep (every 5 s) and the stats ticks.
  sleep 6
  callgrind_control --dump=serving "$pid" >/dev/null 2>&1
  get -X POST "http://127.0.0.1:$admin/quitquitquit" &
  for ((i = 0; i < 1200; i++)); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  wait "$pid" || { echo "hot-code.sh: $name did not exit cleanly (log: $out.log)" >&2; exit 1; }
  # Every function callgrind saw run, named as the symbol table names it: those that ran while
  # serving, and all of them. Each dump holds the costs since the one before it.
  local dumps=("$out".cg*) serving
  serving=$(grep -l '^desc: Trigger: .*serving' "${dumps[@]}") ||
    { echo "hot-code.sh: $name: no dump of the serving phase" >&2; exit 1; }
  fns_of "$serving" >"$out.serving"
  fns_of "${dumps[@]}" >"$out.fns"
}

for driver in io-uring epoll; do
  trace "qp-http1-$driver" "$driver" queue-proxy "$http1_port"
  trace "qp-h2c-$driver" "$driver" queue-proxy "$h2c_port"
  trace "activator-$driver" "$driver" activator "$http1_port"
done

nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ {print $3}' | sort -u >"$work/code.syms"
{
  echo "# Generated by scripts/hot-code.sh from a trace of $(basename "$bin"); lld's --symbol-ordering-file."
  # Serving's functions first: the HTTP/1 queue-proxy's (the common sidecar), then what h2c adds,
  # then what the activator adds; then the rest of what start-up and the drain ran, the
  # queue-proxy's first. After start-up the queue-proxy unmaps its code
  # (`start::unmap_start_up_code`), and serving maps back only the windows of the first groups.
  kinds=(qp-http1 qp-h2c activator)
  : >"$work/seen"
  lists=()
  for kind in "${kinds[@]}"; do
    cat "$work/$kind"-*.serving 2>/dev/null | sort -u | comm -23 - "$work/seen" >"$work/$kind.serving"
    sort -u "$work/seen" "$work/$kind.serving" -o "$work/seen"
    lists+=("$kind.serving")
  done
  for kind in qp activator; do
    cat "$work/$kind"-*.fns | sort -u | comm -23 - "$work/seen" >"$work/$kind.rest"
    sort -u "$work/seen" "$work/$kind.rest" -o "$work/seen"
    lists+=("$kind.rest")
  done
  for list in "${lists[@]}"; do
    echo "# $list"
    comm -12 "$work/$list" "$work/code.syms"
  done
} >"$order"
count=$(grep -vc '^#' "$order")
((count > 500)) || { echo "hot-code.sh: only $count functions traced; did the runs serve?" >&2; exit 1; }
echo "hot-code.sh: wrote $order ($count functions)" >&2
