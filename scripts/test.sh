#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it: formatting, lints, then every test once per I/O
# driver (io_uring and epoll), then the container images (scripts/image-check.sh), then a loom
# model check of the admission gate, then a replay of every fuzz target's seeds, and a locked
# build of every crate outside the workspace.
#
# What it needs and cannot install itself:
#   * root: the Kubernetes and pod tests create network namespaces and veth pairs, and the image
#     check runs the image in a chroot (run `sudo -E bash scripts/test.sh` as another user);
#   * Debian or Ubuntu (apt-get), and a Rust toolchain (rustup; rust-version in Cargo.toml);
#   * network access the first time: crates, apt packages, Python wheels, and the Kubernetes
#     sources scripts/kube-apiserver.sh builds (cached in target/kube afterwards).
# What it installs when missing: a C compiler (gcc, for ring), curl, iproute2, python3-venv, Go
# (golang-go, the reference for the request log's templates), valgrind and an unpacked nginx for
# the image build's code layout (scripts/hot-code.sh --tools), skopeo and buildah for the image
# check, and Python's grpcio packages in a virtual environment, target/venv, never in the
# system's Python.
# `cargo test` run by hand finds that environment by itself (testkit's grpcio::python).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh must run as root: the Kubernetes and pod tests create network" >&2
  echo "namespaces and veth pairs, and the image check uses chroot. Nothing was run." >&2
  echo "Run: sudo -E bash scripts/test.sh" >&2
  exit 1
fi
command -v cargo >/dev/null 2>&1 || { echo "scripts/test.sh needs a Rust toolchain (https://rustup.rs)" >&2; exit 1; }
command -v apt-get >/dev/null 2>&1 || { echo "scripts/test.sh installs its tools with apt-get (Debian, Ubuntu)" >&2; exit 1; }

need_packages=()
command -v cc >/dev/null 2>&1 || need_packages+=(gcc libc6-dev)
command -v curl >/dev/null 2>&1 || need_packages+=(curl)
# `openssl s_client`, a TLS client that is not ours (tests/tls.rs)
command -v openssl >/dev/null 2>&1 || need_packages+=(openssl)
command -v ip >/dev/null 2>&1 || need_packages+=(iproute2)
command -v python3 >/dev/null 2>&1 || need_packages+=(python3)
# Go's own text/template is the reference the request log's template engine is compared with
# (template/tests/go_differential.rs, run by `cargo test --workspace` below); Debian's Go, which
# the kube-apiserver build uses too.
command -v go >/dev/null 2>&1 || need_packages+=(golang-go)
# Debian's python3 leaves ensurepip, which `python3 -m venv` needs, to python3-venv.
python3 -c 'import ensurepip' >/dev/null 2>&1 || need_packages+=(python3-venv)
if ((${#need_packages[@]})); then
  echo "== installing ${need_packages[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_packages[@]}"
fi

# grpcio's wheels carry their C core; grpcio-tools generates the test stubs at run time;
# grpcio-health-checking is the standard health service of the HTTP/2-only test pods;
# opentelemetry-proto is OpenTelemetry's own Python build of the OTLP messages and TraceService,
# which the trace collector of telemetry/tests/otel_receiver.py is made of (1.45.2 takes the
# protobuf 5-7 that grpcio-tools brings).
venv=target/venv
if ! "$venv/bin/python3" -c 'import grpc, grpc_tools, grpc_health; from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc' >/dev/null 2>&1; then
  echo "== installing grpcio, grpcio-tools, grpcio-health-checking and opentelemetry-proto (Python) in $venv for tests/grpc.rs and telemetry/tests/collectors.rs"
  python3 -m venv "$venv"
  "$venv/bin/python3" -m pip install --quiet --disable-pip-version-check 'grpcio==1.85.3' 'grpcio-tools==1.85.1' 'grpcio-health-checking==1.85.1' 'opentelemetry-proto==1.45.2'
fi
export KACTIVATOR_PYTHON=$PWD/$venv/bin/python3

# Incremental compilation keeps a second copy of every workspace crate's build for each test
# binary, gigabytes that a one-off run of the suite never reads again; the suite builds without.
export CARGO_INCREMENTAL=0

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
# `loom_tests` in shards/src/throttle/gate/loom_tests.rs). `--cfg loom` changes every crate's
# build, hence a target directory of its own. Unbounded it takes about 15 minutes on two cores;
# bounded at 5 preemptions it takes seconds, and every mutation of the hand-off we tried fails
# already at 3.
echo "== loom model check of the admission gate (LOOM_MAX_PREEMPTIONS=5)"
LOOM_MAX_PREEMPTIONS=5 RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
  cargo test -p kactivator-shards --release --lib --locked loom

# The images' build is the `dist` profile's (target/dist, reused when current); its link traces
# the binary (valgrind, nginx: installed by scripts/hot-code.sh --tools) and links it again with
# the code serving runs first.
echo "== container images: reproducible archive, skopeo, the binary alone in the image's root"
bash scripts/image-check.sh

echo "== replaying the HTTP/1 codec's fuzz seeds"
cargo test --manifest-path shards/h1/fuzz/Cargo.toml --locked
echo "== replaying the fuzz seeds of registrations, the config file, Kubernetes objects, HTTP/2 and request log templates"
cargo test --manifest-path fuzz/Cargo.toml --locked

# The scenario benchmarks are a crate of their own with their own lock file: building them
# `--locked` keeps that file current (a stale one would make benchmark builds resolve whatever
# is newest that day). `cargo check` is enough to hold the lock and costs no release build.
echo "== locked check of the scenario benchmarks"
cargo check --manifest-path benches/scenarios/Cargo.toml --target-dir target --locked --all-targets

echo "== all green"
