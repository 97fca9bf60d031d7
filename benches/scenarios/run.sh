#!/usr/bin/env bash
# Scenario benchmarks through the real kactivator binary: builds kactivator and
# kactivator-scenarios (release), runs one scenario (or all), prints its markdown report and keeps
# it under target/bench-results/. See benches/scenarios/README.md.
#
#   bash benches/scenarios/run.sh scarcity [options]        # 8 pods × CC=1, 64 clients, ~2 min
#   bash benches/scenarios/run.sh queued-memory [options]   # RSS per queued request, ~1 min
#   bash benches/scenarios/run.sh routable-first-forward    # QP `ready` → first queued request at the pod, 1000 reps
#   bash benches/scenarios/run.sh cold-poke                 # cold revision's first request → autoscaler poke, 1000 revisions
#   bash benches/scenarios/run.sh kube-scale                # real kube-apiserver, 10 000 revisions × 10 pods: sync, RSS, event → applied
#   bash benches/scenarios/run.sh pod-scale                 # 1 000 and 5 000 revisions × 10 pods: idle CPU, RSS, reg → fwd; ~8 min
#   bash benches/scenarios/run.sh pod-scale --revisions 100 --idle 5 --settle 5 --repetitions 20   # a quick check
#   bash benches/scenarios/run.sh chaos [--duration-seconds 120] [--warm-up-seconds 60]   # soak: kills, QP flips, config rewrites; 10 min
#   bash benches/scenarios/run.sh priority                  # issue 27: B's wait behind A's 500, high vs 500 low, throughput on ÷ off; ~4 min
#   bash benches/scenarios/run.sh keda-load                 # issue 40: keda-http vs activator vs direct, 1 and 64 clients; ~2 min
#   bash benches/scenarios/run.sh keda-scale [--routes 5000] # keda-http watching 1 000 routes × 10 pods: sync, RSS, event → applied, CPU per event
#   bash benches/scenarios/run.sh all                       # every implemented scenario
#   KACTIVATOR_BIN=/path/to/kactivator bash benches/scenarios/run.sh ...   # that binary, no build
#
# Options after the scenario name go to `kactivator-scenarios <scenario>` (e.g. --rounds 5,
# --backend exact, --count 50000); `--drivers`, `--shards` go before the scenario name through
# SCENARIO_ARGS, e.g. SCENARIO_ARGS='--drivers epoll'.
set -euo pipefail

# One compound command: bash parses the whole script before running it, so editing the file
# during a run cannot derail the run.
{

usage() {
  # The comment block at the top, up to the first line that is not a comment.
  sed -n '2,/^[^#]/{/^#/p}' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

(($#)) || { usage >&2; exit 2; }
scenario=$1
shift
case $scenario in
  scarcity | queued-memory | routable-first-forward | cold-poke | kube-scale | pod-scale | chaos | priority | keda-load | keda-scale | all) ;;
  -h | --help) usage; exit 0 ;;
  *) echo "run.sh: unknown scenario '$scenario'" >&2; usage >&2; exit 2 ;;
esac
if [[ $scenario == all && $# -gt 0 ]]; then
  echo "run.sh: options are per scenario; run the scenarios one by one to pass '$*'" >&2
  exit 2
fi

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$repo"
log() { printf '[scenarios %s] %s\n' "$(date +%T)" "$*" >&2; }
die() {
  log "FATAL: $*"
  exit 1
}

stamp=$(date +%Y%m%d-%H%M%S)
results_dir="$repo/target/bench-results"
mkdir -p "$results_dir"

# The scenario binary starts kactivator with PR_SET_PDEATHSIG, and its backends live in its own
# process, so stopping it stops everything it started.
runner_pid=
# shellcheck disable=SC2317 # reached through the EXIT trap
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [[ -n $runner_pid ]] && kill -0 "$runner_pid" 2>/dev/null; then
    log "stopping kactivator-scenarios (pid $runner_pid)"
    kill -TERM "$runner_pid" 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      kill -0 "$runner_pid" 2>/dev/null || break
      sleep 0.2
    done
    kill -KILL "$runner_pid" 2>/dev/null || true
    # Its scratch directory (configs, kactivator logs), which it removes only when it exits itself.
    rm -rf "${TMPDIR:-/tmp}"/kactivator-scenario-*-"$runner_pid"
    stop_api_servers_of "$runner_pid"
  fi
  exit "$status"
}
# kube-scale's kube-apiserver and etcd (testkit's ApiServer) run without a parent-death signal
# and live in $TMPDIR/kactivator-kube/<pid>-<n>/, which their command lines name: kill exactly
# those processes, by pid, and remove the directory. (The next ApiServer would reclaim them too.)
# shellcheck disable=SC2317 # reached through cleanup
stop_api_servers_of() {
  local dir cmdline text
  for dir in "${TMPDIR:-/tmp}"/kactivator-kube/"$1"-*; do
    [[ -d $dir ]] || continue
    for cmdline in /proc/[0-9]*/cmdline; do
      text=$(tr '\0' ' ' <"$cmdline" 2>/dev/null) || continue
      if [[ $text == *"$dir/"* ]]; then
        cmdline=${cmdline#/proc/}
        kill -KILL "${cmdline%/cmdline}" 2>/dev/null || true
      fi
    done
    rm -rf "$dir"
  done
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# === build ===

# shellcheck source=benches/scenarios/build.sh
source "$repo/benches/scenarios/build.sh"

# kube-scale, keda-load and keda-scale run testkit's kube-apiserver: build it (cached; 3-5 minutes
# cold) unless it is there.
if [[ $scenario == kube-scale || $scenario == keda-load || $scenario == keda-scale || $scenario == all ]] &&
  [[ -z ${KACTIVATOR_KUBE_APISERVER:-} ]] &&
  [[ ! -x $target_dir/kube/bin/kube-apiserver ]]; then
  log "no kube-apiserver in $target_dir/kube/bin: building it with scripts/kube-apiserver.sh"
  CARGO_TARGET_DIR=$target_dir bash scripts/kube-apiserver.sh >&2 || die "scripts/kube-apiserver.sh failed"
fi

# chaos runs its pods as separate kactivator-testbackend processes, to SIGKILL them.
if [[ $scenario == chaos ]] && [[ -z ${KACTIVATOR_TESTBACKEND:-} ]]; then
  log "building kactivator-testbackend (release, $target_dir)"
  cargo build --release --quiet -p kactivator-testkit --bin kactivator-testbackend --target-dir "$target_dir" ||
    die "building kactivator-testbackend failed"
  export KACTIVATOR_TESTBACKEND=$target_dir/release/kactivator-testbackend
fi

# One descriptor per connection: the soft limit goes up to the hard one (which only
# CAP_SYS_RESOURCE can raise). kactivator inherits it and raises its own soft limit too.
ulimit -n "$(ulimit -Hn)"

# === CPU used by others while we ran (the same method as benches/load/run.sh) ===

# busy ticks of all CPUs, total ticks, and ticks of this shell's reaped children (the scenario
# binary, and through it the kactivators it waited for).
cpu_snapshot() {
  local busy_total ours
  busy_total=$(awk '/^cpu / { print $2 + $3 + $4 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat)
  ours=$(sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }')
  echo "$busy_total $ours"
}
# foreign_percent: benches/foreign-cpu.sh
source "$repo/benches/foreign-cpu.sh"

# === run ===

# run_one NAME ARGS...: one scenario; its report on stdout and in the results file.
run_one() {
  local name=$1 results before after foreign status=0
  shift
  results="$results_dir/scenario-$name-$stamp.txt"
  {
    echo "# kactivator scenario $name, $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo
    echo "- host: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo); RLIMIT_NOFILE $(ulimit -Sn)/$(ulimit -Hn); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "- commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (dirty tree)')"
    # The binary's own commit: with KACTIVATOR_BIN it need not be the checkout's.
    echo "- kactivator: $kactivator_bin ($("$kactivator_bin" --version 2>/dev/null | head -n 1 || echo 'no --version'))"
    echo "- command: $scenarios_bin --kactivator $kactivator_bin ${SCENARIO_ARGS:-} $name $*"
  } | tee "$results"
  before=$(cpu_snapshot)
  # shellcheck disable=SC2086 # SCENARIO_ARGS is a list of words on purpose
  "$scenarios_bin" --kactivator "$kactivator_bin" ${SCENARIO_ARGS:-} "$name" "$@" \
    >"$results.report" 2> >(tee "$results.log" >&2) &
  runner_pid=$!
  # In the background and waited for, so that Ctrl-C or SIGTERM reaches the trap at once.
  wait "$runner_pid" || status=$?
  runner_pid=
  wait # the tee of the progress lines
  tee -a "$results" <"$results.report"
  rm -f "$results.report"
  after=$(cpu_snapshot)
  foreign=$(foreign_percent "$before" "$after")
  {
    echo "Other processes used $foreign % of the machine's CPU time during the run; load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
    if ((foreign > 5)); then
      echo "WARNING: more than 5 % — wall-clock figures (throughput, latency) are not trustworthy; rerun on a quiet machine. Memory figures are not affected."
    fi
    echo "Raw: $results (progress lines: $results.log)"
  } | tee -a "$results"
  if ((status != 0)); then
    log "$name: kactivator-scenarios exited with status $status (see above)"
    return "$status"
  fi
}

overall=0
if [[ $scenario == all ]]; then
  run_one scarcity || overall=1
  run_one queued-memory || overall=1
  run_one routable-first-forward || overall=1
  run_one cold-poke || overall=1
  run_one kube-scale || overall=1
  run_one pod-scale || overall=1
  run_one priority || overall=1
  run_one keda-load || overall=1
  run_one keda-scale || overall=1
else
  run_one "$scenario" "$@" || overall=$?
fi
exit "$overall"
}
