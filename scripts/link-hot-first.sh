#!/usr/bin/env bash
# The linker of the shipped binary: scripts/image.sh builds it with
#
#   cargo rustc --profile dist --bin kactivator -- -C linker=$PWD/scripts/link-hot-first.sh
#
# (`cargo rustc` hands the flag to the binary's own link only; the dependencies, the build scripts
# and every other profile link as usual). It links twice, with the arguments rustc gives it:
#   1. as rustc would have: the code in the compiler's order;
#   2. after scripts/hot-code.sh has run that binary through start-up, serving and a drain and
#      written every function it saw run to target/dist/hot-code/order, again with that file as
#      lld's `--symbol-ordering-file`: those functions first in `.text`, in the file's order.
# Both links see the same object files, so the names traced are this build's own, whatever
# changed in the code since the last build; cargo links again, and traces again, only when the
# code has changed.
#
# Both links also pack relative relocations (`-z pack-relative-relocs`, DT_RELR) when the glibc
# linked against is 2.36 or later, the first that loads such a binary; the image carries the
# build machine's glibc.
#
# Left in target/dist/hot-code/: `order` (the ordering file), `trace.log`, and
# `compiler-order`, the first link, for comparisons (BENCHMARKS.md, "Idle memory and the code
# layout").
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

out=
previous=
for arg in "$@"; do
  [[ $previous == -o ]] && out=$arg
  previous=$arg
done
[[ -n $out ]] || { echo "link-hot-first.sh: no -o among the linker's arguments: $*" >&2; exit 1; }
# `--symbol-ordering-file` is lld's (and gold's); rustc links with its own lld on
# x86_64-unknown-linux-gnu since 1.90, and says so with `-fuse-ld=lld`.
[[ " $* " == *" -fuse-ld=lld "* ]] ||
  { echo "link-hot-first.sh: rustc did not ask for lld (-fuse-ld=lld); the layout needs it" >&2; exit 1; }

extra=()
glibc=$(getconf GNU_LIBC_VERSION 2>/dev/null || true) # "glibc 2.36"
if [[ $glibc =~ ^glibc\ ([0-9]+)\.([0-9]+) ]] &&
  ((BASH_REMATCH[1] > 2 || (BASH_REMATCH[1] == 2 && BASH_REMATCH[2] >= 36))); then
  extra+=(-Wl,-z,pack-relative-relocs)
fi

# target/dist/deps/kactivator-HASH -> target/dist/hot-code
dir=$(dirname "$(dirname "$out")")/hot-code
mkdir -p "$dir"

cc "$@" "${extra[@]}"
cp "$out" "$dir/compiler-order"
if ! bash "$root/scripts/hot-code.sh" "$out" "$dir/order.new" >"$dir/trace.log" 2>&1; then
  echo "link-hot-first.sh: tracing the binary failed; $dir/trace.log:" >&2
  cat "$dir/trace.log" >&2
  exit 1
fi
mv "$dir/order.new" "$dir/order"
cc "$@" "${extra[@]}" "-Wl,--symbol-ordering-file=$dir/order" -Wl,--no-warn-symbol-ordering
