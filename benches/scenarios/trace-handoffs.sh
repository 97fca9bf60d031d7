#!/usr/bin/env bash
# Where a CC=1 hand-off spends its time: runs one scarcity round under `perf record` (scheduler,
# syscall and io_uring tracepoints, whole machine, 1.5 s in the middle of the measured window)
# and prints, per pod, the idle gap from the pod's response write (`sendto`) to the arrival of
# its next request (`recvfrom` returning bytes), split by whether the next request came on the
# same connection (same kactivator shard) or on another (a slot handed to another shard).
#
#   bash benches/scenarios/trace-handoffs.sh [io-uring|epoll]
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/scenarios/trace-handoffs.sh epoll
#
# Needs `perf` with tracepoint access (root, or kernel.perf_event_paranoid <= -1). Tracing slows
# every syscall a little, so the gaps it reports are longer than untraced ones; compare builds
# with this script, not with the scenario's own figures. The raw trace stays in
# target/bench-results/handoffs-<driver>-<stamp>.txt for reading single hand-offs
# (`grep -n exact-<port>` and read around a `sendto`).
set -euo pipefail
{

driver=${1:-io-uring}
case $driver in io-uring | epoll) ;; *) echo "trace-handoffs.sh: driver is io-uring or epoll" >&2; exit 2 ;; esac
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
log() { printf '[trace %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FATAL: $*"
  exit 1
}
command -v perf >/dev/null || die "perf is not installed (apt-get install linux-perf)"

results_dir="$repo/target/bench-results"
mkdir -p "$results_dir"
stamp=$(date +%Y%m%d-%H%M%S)
raw="$results_dir/handoffs-$driver-$stamp.txt"
data=$(mktemp --suffix=.perf.data)
runner_pid=
cleanup() {
  [[ -n $runner_pid ]] && kill "$runner_pid" 2>/dev/null
  rm -f "$data"
}
trap cleanup EXIT

# shellcheck source=benches/scenarios/build.sh
source "$repo/benches/scenarios/build.sh"

# One round: the ceiling row (1 s warm-up + 4 s), then kactivator (1 s warm-up + 4 s). The
# recording starts 2.5 s into kactivator's row, well inside its measured window.
"$scenarios_bin" --kactivator "$kactivator_bin" --drivers "$driver" \
  scarcity --rounds 1 --duration 4 >"$raw.report" 2>&1 &
runner_pid=$!
sleep 8.5
kill -0 "$runner_pid" 2>/dev/null || { log "the scenario ended early:"; cat "$raw.report" >&2; exit 1; }
log "recording 1.5 s of the $driver row"
perf record -a -o "$data" \
  -e sched:sched_switch,sched:sched_waking,sched:sched_wakeup \
  -e syscalls:sys_enter_sendto,syscalls:sys_exit_sendto,syscalls:sys_enter_recvfrom,syscalls:sys_exit_recvfrom \
  -e syscalls:sys_enter_io_uring_enter,syscalls:sys_exit_io_uring_enter,syscalls:sys_enter_epoll_wait,syscalls:sys_exit_epoll_wait \
  -e io_uring:io_uring_submit_req,io_uring:io_uring_complete,io_uring:io_uring_task_add \
  -- sleep 1.5 >/dev/null 2>&1 || { log "perf record failed (tracepoint access?)"; exit 1; }
wait "$runner_pid" || true
runner_pid=
perf script -i "$data" -F comm,tid,cpu,time,event,trace 2>/dev/null >"$raw"

echo "# hand-off gaps at the pods, $driver, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD)"
echo
grep -E '^- round 1 kactivator' "$raw.report" | sed 's/^- /Traced /' || true
echo
# Pod threads are named exact-<port>; kactivator holds one connection per shard to each pod,
# each served by its own thread, so "same thread" means "same shard".
gaps=$(awk '
  $1 ~ /^exact-/ && ($5 ~ /sys_enter_sendto/ || $5 ~ /sys_exit_recvfrom/) {
    pod = $1; tid = $2; t = $4; sub(":", "", t)
    if ($5 ~ /sendto/) { sent[pod] = t; sent_tid[pod] = tid; next }
    ret = $6
    if (ret !~ /^0x/ || ret == "0x0" || ret ~ /^0xffffffff/) next   # nothing read, or an error
    if (!(pod in sent)) next
    printf "%s %.1f\n", (tid == sent_tid[pod]) ? "same" : "other", (t - sent[pod]) * 1e6
    delete sent[pod]
  }' "$raw")
total=$(grep -c . <<<"$gaps" || true)
echo "| next request came on | hand-offs | share | mean gap | p50 | p90 | p99 |"
echo "|---|---|---|---|---|---|---|"
for kind in same other; do
  label="the same shard"
  [[ $kind == other ]] && label="another shard"
  awk -v k="$kind" '$1 == k { print $2 }' <<<"$gaps" | sort -n | awk -v label="$label" -v total="$total" '
    { v[NR] = $1; sum += $1 }
    END {
      if (!NR) { printf "| %s | 0 | | | | | |\n", label; exit }
      printf "| %s | %d | %.0f %% | %.0f µs | %.0f µs | %.0f µs | %.0f µs |\n", label, NR, \
        100 * NR / total, sum / NR, v[int(NR * 0.5) + 1], v[int(NR * 0.9) + 1], v[int(NR * 0.99) + 1]
    }'
done
echo
echo "Raw trace: $raw"
rm -f "$raw.report"
}
