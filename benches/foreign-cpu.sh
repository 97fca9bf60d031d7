# Sourced by the benchmark scripts (benches/load/run.sh, benches/scenarios/run.sh).
#
# foreign_percent BEFORE AFTER: the share of the machine's CPU capacity that other work used
# between two snapshots. Each snapshot is "busy total ours" in clock ticks, as the scripts'
# own cpu_snapshot prints it (what counts as "ours" differs per script).
foreign_percent() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    split(a, x, " "); split(b, y, " ")
    total = y[2] - x[2]; foreign = (y[1] - x[1]) - (y[3] - x[3])
    if (foreign < 0) foreign = 0
    printf "%d", (total > 0 ? 100 * foreign / total : 0)
  }'
}
