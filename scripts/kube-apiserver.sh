#!/usr/bin/env bash
# Provides a real Kubernetes API server for the Kubernetes tests, without the internet: builds
# kube-apiserver v1.20.2 from Debian bookworm's `kubernetes` source package (the full upstream
# tree, vendor/ included) and installs etcd and kubectl from apt. Prints the paths it provides.
#
#   target/kube/bin/kube-apiserver        (under $CARGO_TARGET_DIR when that is set)
#   etcd, kubectl                         (on PATH, from apt when missing)
#
# Cold: about 3-5 minutes on two cores (apt source download, `make`). Warm, when the binary is
# there and its stamp names this recipe: seconds, nothing is rebuilt. Recipe and pitfalls:
# /work/shared/reference/infra.md §4 (vendored reflect2 swap, rsync, make instead of go build).
#
# The whole script is one compound command, so bash has read all of it before running any of
# it: editing this file while it runs cannot change what the running copy does.
set -euo pipefail
{
  cd "$(dirname "$0")/.."

  # The Debian source package, and a recipe number to bump whenever the build steps change the
  # binary: both go into the stamp, and a stamp that differs means "rebuild".
  readonly PACKAGE_VERSION="1.20.5+really1.20.2-1.1+deb12u1"
  readonly RECIPE=1
  readonly STAMP_TEXT="kubernetes=$PACKAGE_VERSION recipe=$RECIPE"

  target="${CARGO_TARGET_DIR:-target}"
  mkdir -p "$target/kube/bin"
  # Absolute, because the build below runs in other directories.
  kube="$(cd "$target/kube" && pwd)"
  bin="$kube/bin/kube-apiserver"
  stamp="$kube/bin/kube-apiserver.stamp"

  say() { echo "[kube] $*"; }
  fail() {
    echo "[kube] FAILED: $*" >&2
    exit 1
  }
  trap 'echo "[kube] FAILED at line $LINENO (exit $?): $BASH_COMMAND" >&2' ERR

  # One build at a time per target directory (two CI jobs sharing a cache, a developer
  # running it twice).
  exec 9>"$kube/.lock"
  flock 9

  as_root() {
    if [ "$(id -u)" -eq 0 ]; then
      "$@"
    elif command -v sudo >/dev/null 2>&1; then
      sudo "$@"
    else
      fail "need root or sudo to run: $*"
    fi
  }

  installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
  }

  apt_updated=0
  # Installs the Debian packages given that are not installed yet.
  apt_install() {
    local missing=()
    local package
    for package in "$@"; do
      installed "$package" || missing+=("$package")
    done
    ((${#missing[@]})) || return 0
    say "installing ${missing[*]} with apt"
    if ((!apt_updated)); then
      as_root apt-get update -qq || fail "apt-get update"
      apt_updated=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive \
      apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
      fail "apt-get install ${missing[*]}"
  }

  # What running the tests needs, warm or cold: etcd (Debian's etcd-server, 3.4), openssl
  # (the service-account key pair), kubectl (the base image has 1.32; Debian's
  # kubernetes-client is 1.20.2 when there is none).
  runtime_packages=()
  command -v etcd >/dev/null 2>&1 || [ -x /usr/bin/etcd ] || runtime_packages+=(etcd-server)
  command -v openssl >/dev/null 2>&1 || runtime_packages+=(openssl)
  command -v kubectl >/dev/null 2>&1 || runtime_packages+=(kubernetes-client)
  apt_install "${runtime_packages[@]}"

  report() {
    say "kube-apiserver: $bin ($("$bin" --version 2>/dev/null || echo 'version unknown'))"
    say "etcd:           $(command -v etcd || echo /usr/bin/etcd)"
    say "kubectl:        $(command -v kubectl)"
  }

  if [ -x "$bin" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$STAMP_TEXT" ] &&
    "$bin" --version >/dev/null 2>&1; then
    say "up to date ($STAMP_TEXT)"
    report
    exit 0
  fi

  # === cold build ===
  started=$SECONDS
  say "building kube-apiserver from Debian's kubernetes=$PACKAGE_VERSION (3-5 minutes)"
  # rsync is required by the code generators `make` runs; the reflect2 package replaces the
  # vendored reflect2 1.0.1, which crashes under Go >= 1.18 ("fatal error: fault" in
  # UnsafeMapType.UnsafeIterate on the first custom-resource write).
  apt_install golang-go rsync make golang-github-modern-go-reflect2-dev
  reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
  [ -d "$reflect2" ] || fail "$reflect2 missing after installing golang-github-modern-go-reflect2-dev"
  # Debian's Go (1.19), even when another Go comes first on PATH: 1.20.2's build is known good
  # with it.
  go_bin=/usr/lib/go/bin
  [ -x "$go_bin/go" ] || fail "$go_bin/go missing after installing golang-go"

  # A private apt configuration that only knows bookworm's deb-src: the system's sources,
  # lists and cache are neither read nor written. The downloaded package (34 MB) is kept in
  # $kube/apt/src, so a rebuild after a recipe change does not download it again.
  apt_dir="$kube/apt"
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" \
    "$apt_dir/etc/sources.list.d" "$apt_dir/src"
  echo "deb-src http://deb.debian.org/debian bookworm main" >"$apt_dir/etc/sources.list"
  apt_options=(
    -o "Dir::Etc::SourceList=$apt_dir/etc/sources.list"
    -o "Dir::Etc::SourceParts=$apt_dir/etc/sources.list.d"
    -o "Dir::State::Lists=$apt_dir/lists"
    -o "Dir::Cache=$apt_dir/cache"
  )
  orig="kubernetes_${PACKAGE_VERSION%%-*}.orig.tar.gz"
  if [ ! -s "$apt_dir/src/$orig" ]; then
    say "downloading the source package (private apt sources list: $apt_dir/etc/sources.list)"
    apt-get "${apt_options[@]}" update -qq || fail "apt-get update of the private deb-src list"
    (cd "$apt_dir/src" &&
      apt-get "${apt_options[@]}" source --download-only -qq "kubernetes=$PACKAGE_VERSION") ||
      fail "apt-get source kubernetes=$PACKAGE_VERSION"
  fi
  [ -s "$apt_dir/src/$orig" ] || fail "$apt_dir/src/$orig not downloaded"

  # The build tree (1.5 GB once built) lives in $kube/build and is deleted after the binary is
  # installed: the binary and its stamp are the cache, and a rebuild only happens when the
  # recipe changes, which a kept tree would not make much faster (56 s warm vs ~3 min cold).
  build="$kube/build"
  rm -rf "$build"
  mkdir -p "$build"
  say "unpacking $orig"
  tar -xzf "$apt_dir/src/$orig" -C "$build"
  tree="$(find "$build" -mindepth 2 -maxdepth 2 -name cmd -type d -printf '%h\n' | head -n1)"
  [ -n "$tree" ] && [ -d "$tree/cmd/kube-apiserver" ] ||
    fail "no cmd/kube-apiserver in $orig"

  vendored="$tree/vendor/github.com/modern-go/reflect2"
  rm -rf "$vendored"
  mkdir -p "$vendored"
  cp "$reflect2"/*.go "$reflect2"/*.s "$vendored/"
  rm -f "$vendored"/*_test.go

  log="$kube/build.log"
  say "make WHAT=cmd/kube-apiserver (log: $log)"
  # Kubernetes' build sets up its own GOPATH (and Go build cache) under _output: GOPATH,
  # GO111MODULE and GOFLAGS from the caller would only confuse it, and nothing may be fetched.
  if ! (cd "$tree" && env -u GOPATH -u GO111MODULE -u GOFLAGS -u GOROOT \
    PATH="$go_bin:$PATH" GOPROXY=off make WHAT=cmd/kube-apiserver) >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    fail "make WHAT=cmd/kube-apiserver (whole log: $log)"
  fi
  built="$tree/_output/bin/kube-apiserver"
  [ -x "$built" ] || fail "make succeeded but $built is missing (log: $log)"

  # Binary first, stamp last: an interrupted install leaves no stamp and rebuilds next time.
  rm -f "$stamp"
  cp "$built" "$bin.new"
  mv "$bin.new" "$bin"
  "$bin" --version >/dev/null || fail "$bin does not run"
  echo "$STAMP_TEXT" >"$stamp"
  rm -rf "$build"
  say "built in $((SECONDS - started)) s"
  report
  exit 0
}
