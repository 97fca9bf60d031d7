#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, lints, then every test once per I/O
# driver (io_uring and epoll), then a loom model check of the admission gate, then a replay of
# every fuzz target's seeds.
#
# Works on a fresh machine with a Rust toolchain: it installs the few system tools the
# end-to-end tests drive (curl, iproute2 for the pod addresses of the Kubernetes tests, and
# Python's grpcio, the second gRPC implementation of tests/grpc.rs) when they are missing, and
# provides a real kube-apiserver with etcd and kubectl through
# scripts/kube-apiserver.sh (built once, about 5 minutes; cached in target/kube afterwards).
set -euo pipefail
cd "$(dirname "$0")/.."

need_packages=()
command -v curl >/dev/null 2>&1 || need_packages+=(curl)
command -v ip >/dev/null 2>&1 || need_packages+=(iproute2)
if ((${#need_packages[@]})); then
  echo "== installing ${need_packages[*]}"
  if [ "$(id -u)" -eq 0 ]; then
    apt-get update -qq && apt-get install -y -qq "${need_packages[@]}"
  else
    sudo apt-get update -qq && sudo apt-get install -y -qq "${need_packages[@]}"
  fi
fi

# grpcio's wheels carry their C core; grpcio-tools generates the test stubs at run time;
# grpcio-health-checking is the standard health service of the HTTP/2-only test pods.
if ! python3 -c 'import grpc, grpc_tools, grpc_health' >/dev/null 2>&1; then
  echo "== installing grpcio, grpcio-tools and grpcio-health-checking (Python) for tests/grpc.rs"
  python3 -m pip install --quiet --disable-pip-version-check 'grpcio==1.85.3' 'grpcio-tools==1.85.1' 'grpcio-health-checking==1.85.1'
fi

echo "== kube-apiserver, etcd and kubectl for the Kubernetes tests"
bash scripts/kube-apiserver.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

for driver in io-uring epoll; do
  echo "== test suite, driver: $driver"
  KACTIVATOR_DRIVER=$driver cargo test --workspace --locked
done

# loom explores the interleavings of the admission gate's cross-shard hand-off (the
# `loom_tests` in shards/src/throttle/gate.rs). `--cfg loom` changes every crate's build, hence
# a target directory of its own. Unbounded it takes about 15 minutes on two cores; bounded at 5
# preemptions it takes seconds, and every mutation of the hand-off we tried fails already at 3.
echo "== loom model check of the admission gate (LOOM_MAX_PREEMPTIONS=5)"
LOOM_MAX_PREEMPTIONS=5 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p kactivator-shards --release --lib --locked loom

echo "== replaying the HTTP/1 codec's fuzz seeds"
cargo test --manifest-path shards/h1/fuzz/Cargo.toml --locked
echo "== replaying the fuzz seeds of registrations, the config file, Kubernetes objects and HTTP/2"
cargo test --manifest-path fuzz/Cargo.toml --locked

echo "== all green"
