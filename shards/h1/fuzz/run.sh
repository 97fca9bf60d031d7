#!/usr/bin/env bash
# Fuzz kactivator-h1 with cargo-fuzz (libFuzzer) for a fixed time per target.
#
#   shards/h1/fuzz/run.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Defaults: 20 seconds, every target (parse_request parse_response body_decoder).
# Exits non-zero as soon as a target finds a crash; the input is left in
# fuzz/artifacts/TARGET/ and can be replayed with
#   cargo fuzz run TARGET fuzz/artifacts/TARGET/crash-...   (from shards/h1, same env as below)
# or, without cargo-fuzz, with the replay fallback:
#   cargo run --manifest-path shards/h1/fuzz/Cargo.toml --bin TARGET -- FILE_OR_DIR...
#
# Why RUSTC_BOOTSTRAP=1: cargo-fuzz builds with AddressSanitizer by passing
# `-Zsanitizer=address`, a nightly-only flag. The machine has only a stable toolchain;
# RUSTC_BOOTSTRAP=1 makes stable rustc accept -Z flags (the stable sysroot ships the
# sanitizer runtimes). Nothing else needs it, so it is set only for the cargo-fuzz calls
# below, never globally. SANITIZER=none skips ASan and works on plain stable without it;
# the crate is #![forbid(unsafe_code)], so ASan mostly guards httparse's unsafe internals.
#
# The seed corpus (fuzz/seeds/TARGET, committed) is read alongside the working corpus
# (fuzz/corpus/TARGET, git-ignored) that libFuzzer grows across runs.
set -euo pipefail

seconds="${1:-20}"
if [ "$#" -gt 0 ]; then
    shift
fi
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=(parse_request parse_response body_decoder)
fi
sanitizer="${SANITIZER:-address}"

fuzz_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
crate_dir="$(dirname "$fuzz_dir")"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "cargo-fuzz not found; installing it from crates.io"
    cargo install cargo-fuzz --locked
fi

bootstrap=()
if [ "$sanitizer" != "none" ]; then
    bootstrap=(env RUSTC_BOOTSTRAP=1)
fi

cd "$crate_dir"
for target in "${targets[@]}"; do
    mkdir -p "fuzz/corpus/$target"
    echo "== fuzzing $target for ${seconds}s (sanitizer: $sanitizer)"
    "${bootstrap[@]}" cargo fuzz run --sanitizer "$sanitizer" "$target" \
        "fuzz/corpus/$target" "fuzz/seeds/$target" \
        -- -max_total_time="$seconds" -print_final_stats=1
done
echo "== no crashes in ${#targets[@]} target(s)"
