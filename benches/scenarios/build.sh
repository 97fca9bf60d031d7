# shellcheck shell=bash disable=SC2034 # the variables set here are the caller's
# Sourced by benches/scenarios/run.sh and trace-handoffs.sh, from the repository root, with
# `log` and `die` defined: builds kactivator-scenarios and kactivator (release) and sets
# `target_dir`, `scenarios_bin` and `kactivator_bin`. KACTIVATOR_BIN=<binary> measures that
# binary instead of building one.

target_dir=${CARGO_TARGET_DIR:-$PWD/target}
[[ $target_dir == /* ]] || target_dir="$PWD/$target_dir"

log "building kactivator-scenarios (release, $target_dir)"
cargo build --release --quiet --locked --manifest-path benches/scenarios/Cargo.toml --target-dir "$target_dir" ||
  die "kactivator-scenarios did not build"
scenarios_bin="$target_dir/release/kactivator-scenarios"
if [[ -n ${KACTIVATOR_BIN:-} ]]; then
  [[ -x $KACTIVATOR_BIN ]] || die "KACTIVATOR_BIN=$KACTIVATOR_BIN is not an executable file"
  kactivator_bin=$KACTIVATOR_BIN
  log "using KACTIVATOR_BIN=$kactivator_bin (not building)"
else
  log "building kactivator (release, $target_dir)"
  cargo build --release --quiet --locked -p kactivator --bin kactivator --target-dir "$target_dir" ||
    die "kactivator did not build"
  kactivator_bin="$target_dir/release/kactivator"
fi
