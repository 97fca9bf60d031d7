#!/usr/bin/env bash
# Fuzz what strangers send kactivator, with cargo-fuzz (libFuzzer), one target at a time.
#
#   fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Targets: registration config kubernetes keda_http h2_front request_log tls_material trace_context (all by default); 20 seconds each by default.
# RUNS=N stops a target after N executions instead (whichever comes first); the figures in
# README.md come from
#   RUNS=10000000 nice -n 19 fuzz/run.sh 1800 TARGET
# Exits non-zero as soon as a target finds a crash or a timeout; the input is left in
# fuzz/artifacts/TARGET/ and can be replayed with
#   RUSTC_BOOTSTRAP=1 cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...   (from the repository root)
# or, without cargo-fuzz, with the replay fallback (the seeds are replayed so in CI):
#   cargo run --manifest-path fuzz/Cargo.toml --bin TARGET -- FILE_OR_DIR...
#
# Why RUSTC_BOOTSTRAP=1: cargo-fuzz builds with AddressSanitizer by passing
# `-Zsanitizer=address`, a nightly-only flag. The machine has only a stable toolchain;
# RUSTC_BOOTSTRAP=1 makes stable rustc accept -Z flags (the stable sysroot ships the sanitizer
# runtimes). Nothing else needs it, so it is set only for the cargo-fuzz calls below, never
# globally. SANITIZER=none skips ASan and works on plain stable without it.
#
# Each input must finish within 10 s (-timeout): a hang is a finding, as is an input that takes
# more than 2 GiB (-rss_limit_mb) or one allocation over 256 MiB (-malloc_limit_mb).
# The seed corpus (fuzz/seeds/TARGET, committed) is read alongside the working corpus
# (fuzz/corpus/TARGET, git-ignored) that libFuzzer grows across runs.
set -euo pipefail

seconds="${1:-20}"
if [ "$#" -gt 0 ]; then
    shift
fi
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(registration config kubernetes keda_http h2_front request_log tls_material trace_context)
fi
sanitizer="${SANITIZER:-address}"
runs="${RUNS:--1}"

fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root_dir="$(dirname "$fuzz_dir")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found; installing it from crates.io"
    cargo install cargo-fuzz --locked
fi

# cargo-fuzz builds with `--cfg fuzzing`, which turns on `vendor/h2`'s `fuzz_bridge` module; h2
# denies `missing_docs` and that module has none. A crate from crates.io has its lints capped,
# but `vendor/h2` is a path dependency, so the lint would stop the build: made a warning here.
export RUSTFLAGS="${RUSTFLAGS:-} --force-warn missing_docs"

bootstrap=()
if [ "$sanitizer" != "none" ]; then
    bootstrap=(env RUSTC_BOOTSTRAP=1)
fi

cd "$root_dir"
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    echo "== fuzzing $target for ${seconds}s or $runs runs (sanitizer: $sanitizer)"
    "${bootstrap[@]}" cargo fuzz run --sanitizer "$sanitizer" "$target" \
        "fuzz/corpus/$target" "fuzz/seeds/$target" \
        -- -max_total_time="$seconds" -runs="$runs" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=256 -print_final_stats=1
done
echo "== no crashes in ${#targets[@]} target(s)"
