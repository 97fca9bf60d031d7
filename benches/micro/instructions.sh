#!/usr/bin/env bash
# Instructions per call of one function under a criterion micro-benchmark, counted by callgrind:
# the benchmark runs for a second in criterion's profiling mode, and the inclusive cost of the
# calls made to FUNCTION from outside itself is divided by their number.
#
# Usage: benches/micro/instructions.sh BENCH FILTER FUNCTION
#   e.g. benches/micro/instructions.sh request_log knative_1_18 'exec::Context>::walk'
# (FUNCTION is the end of the demangled name callgrind gives it; needs valgrind.)
set -euo pipefail
bench=$1 filter=$2 function=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
executable=$(cargo bench -p kactivator-microbench --bench "$bench" --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m.get("target", {}).get("kind") == ["bench"]: print(m["executable"])' | tail -1)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
valgrind --tool=callgrind --callgrind-out-file="$out" "$executable" --bench --profile-time 1 "$filter" >/dev/null 2>&1
python3 - "$out" "$function" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().split("\n")
names = {}
for line in lines:
    m = re.match(r"^c?fn=\((\d+)\) (.*)$", line)
    if m:
        names[m.group(1)] = m.group(2)
target = {i for i, name in names.items() if name.endswith(sys.argv[2])}
if not target:
    sys.exit(f"no function ending in {sys.argv[2]!r} ran")
current, calls, cost = None, 0, 0
for k, line in enumerate(lines):
    m = re.match(r"^fn=\((\d+)\)", line)
    if m:
        current = m.group(1)
    m = re.match(r"^cfn=\((\d+)\)", line)
    if m and m.group(1) in target and current not in target:
        calls += int(re.match(r"^calls=(\d+)", lines[k + 1]).group(1))
        cost += int(lines[k + 2].split()[1])
print(f"{sys.argv[2]}: {calls} calls, {cost // max(calls, 1)} instructions per call")
PY
