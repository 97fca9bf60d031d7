#!/usr/bin/env bash
# Writes src/hot-code.ld: the linker script that puts the code kactivator runs to start and to
# serve at the front of its code, in `.text.hot`, instead of scattered through 10 MB of `.text`.
#
# Why: the kernel maps a binary's code into a process in 64 KiB windows around each page it runs
# ("fault-around"), so an idle process's resident memory is set by how many windows start-up and
# serving touch, not by how much code they run. Packed together, the same functions touch a third
# of the windows (BENCHMARKS.md, "Idle RSS and the code layout").
#
# How: runs the release binary under callgrind, as the queue-proxy and as the activator, under
# both drivers, through start-up, the kubelet's and the activator's probes, the autoscaler's
# scrape, requests over HTTP/1.1 and h2c, and a drain; every function that ran is named in the
# script, the queue-proxy's first (the role whose footprint has a target). Names are v0-mangled
# (.cargo/config.toml) with the crates' disambiguators as `*`, so a rebuild, or a build in another
# checkout, matches the same functions; a function renamed since is simply left in `.text`.
# `scripts/hot-code.sh --check BIN` says how many of the names a build still matches.
#
# Usage: scripts/hot-code.sh [BIN]       (default target/release/kactivator; needs valgrind,
#                                          curl, python3 and nginx for the h2c backend)
#        scripts/hot-code.sh --check BIN
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
script=$root/src/hot-code.ld

# A symbol as the script names it: crate disambiguators as "*", and LLVM's ".N" suffix on a
# local copy (its section is named with it, its number changes from build to build) as ".*".
normalise='s/\.[0-9]+$/.*/; s/Cs[0-9A-Za-z]+_/Cs*_/g'

# Each pattern line of the script is "    *(.text*.PATTERN)".
patterns_of() { sed -n 's/^    \*(\.text\*\.\(.*\))$/\1/p' "$1"; }

# The functions named in callgrind output files (each one's `fn=` and `cfn=` lines), sorted.
fns_of() { sed -n 's/^c\{0,1\}fn=([0-9]*) \(.*\)/\1/p' "$@" | sort -u; }

if [[ ${1:-} == --check ]]; then
  bin=${2:?usage: scripts/hot-code.sh --check BIN}
  nm --defined-only "$bin" | awk '{print $3}' | sed -E "$normalise" | python3 -c '
import sys
symbols = set(sys.stdin.read().split())
patterns = [line.strip() for line in open(sys.argv[1]) if line.strip()]
matched = sum(pattern in symbols for pattern in patterns)
share = matched / max(len(patterns), 1)
print(f"{matched} of {len(patterns)} hot-code names match a function of this build ({share:.0%})")
sys.exit(0 if share >= 0.8 else 1)
' <(patterns_of "$script")
  exit
fi

bin=${1:-$root/target/release/kactivator}
for tool in valgrind curl python3; do
  command -v "$tool" >/dev/null || { echo "hot-code.sh: needs $tool" >&2; exit 1; }
done
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
h2c_port=
if command -v nginx >/dev/null; then
  h2c_port=$(free_port)
  mkdir -p "$work/nginx"
  cat >"$work/nginx/nginx.conf" <<EOF
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log;
events {}
http {
  access_log off;
  client_body_temp_path $work/nginx;
  server { listen 127.0.0.1:$h2c_port http2; location / { return 200 "h2c\n"; } }
}
EOF
  nginx -p "$work/nginx" -c "$work/nginx/nginx.conf" &
  pids+=($!)
else
  echo "hot-code.sh: no nginx, so no h2c backend: h2c responses are not traced" >&2
fi
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
  # Start-up ends when the process unmaps its code (`start::UNMAP_START_UP_CODE_AFTER`, 3 s):
  # what ran until then is dumped apart from what serving runs.
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
  [[ -n $h2c_port ]] && trace "qp-h2c-$driver" "$driver" queue-proxy "$h2c_port"
  trace "activator-$driver" "$driver" activator "$http1_port"
done

nm --defined-only "$bin" | awk '$2 ~ /^[tTwW]$/ {print $3}' | sort -u >"$work/code.syms"
{
  cat <<'EOF'
/* Generated by scripts/hot-code.sh from a traced release build; do not edit by hand.
 * The functions kactivator runs to serve, then those it runs only to start and to drain, packed
 * at the front of its code so that an idle process maps few 64 KiB windows of it (the
 * queue-proxy's first in each group). build.rs hands it to the release link; a name no longer in
 * the build matches nothing and costs nothing. */
SECTIONS {
  .text.hot : {
EOF
  # Serving's functions first: the HTTP/1 queue-proxy's (the common sidecar), then what h2c adds,
  # then what the activator adds; then the rest of what start-up and the drain ran, the
  # queue-proxy's first. After start-up the process unmaps its code
  # (`runtime::memory::unmap_clean_file_pages`), and serving maps back only the windows of the
  # first groups.
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
    echo "    /* $list */"
    comm -12 "$work/$list" "$work/code.syms" |
      sed -E "$normalise" | awk '!seen[$0]++ {print "    *(.text*." $0 ")"}'
  done
  cat <<'EOF'
  }
}
INSERT BEFORE .text;
EOF
} >"$script.new"
mv "$script.new" "$script"
echo "hot-code.sh: wrote $script ($(patterns_of "$script" | wc -l) functions)" >&2
