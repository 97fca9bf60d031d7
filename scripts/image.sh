#!/usr/bin/env bash
# Builds kactivator's container images, offline and reproducibly, as one OCI image archive:
#
#   target/image/kactivator-oci.tar
#
# No base image is pulled. The root filesystem is made on this machine from:
#   /kactivator                 the release binary, stripped;
#   /lib*/...                   the shared libraries it links (`ldd`), copied from this machine's
#                               Debian packages (glibc, libgcc_s), with their copyright files;
#   /etc/passwd, /etc/group     root and the non-root user the images run as (65532, "nonroot");
#   /etc/nsswitch.conf          "hosts: files dns", so the autoscaler's name resolves as usual.
# No CA certificates: the only TLS peer is the API server, and kube-rs trusts exactly the CA of
# the kubeconfig or of the service account (/var/run/secrets/kubernetes.io/serviceaccount/ca.crt,
# mounted by the kubelet); the autoscaler link is plain ws://.
#
# Two images share that one layer and differ only in their entrypoint, each named in the archive's
# index by `org.opencontainers.image.ref.name`:
#   kactivator               ["/kactivator"]                 the activator
#   kactivator-queue-proxy   ["/kactivator", "queue-proxy"]  Knative starts the queue-proxy with
#                                                            the image's entrypoint, no arguments
# Pick one with skopeo, e.g. to push:
#   skopeo copy oci-archive:target/image/kactivator-oci.tar:kactivator docker://REGISTRY/kactivator:TAG
# The archive also holds a docker-archive `manifest.json`, so `docker load` / `podman load` take it
# as is (tagged kactivator:latest and kactivator-queue-proxy:latest).
#
# Reproducible: every timestamp is SOURCE_DATE_EPOCH (default: the commit's time), files are
# stored sorted, with fixed modes and owner 0:0 and no user or group names, and gzip stores no
# name or time. Two runs on the same commit and the same Debian packages give the same bytes.
#
# Usage: scripts/image.sh [--rootfs-only]
#   --rootfs-only   stop after assembling target/image/rootfs (for the Containerfile).
# Environment: IMAGE_DIR (default target/image), SOURCE_DATE_EPOCH, KACTIVATOR_BINARY (a binary
# already built; default: the `dist` profile's, target/dist/kactivator, built here).
#
# The `dist` build is the release build with the code serving runs first: its link traces the
# binary and links it again in the order traced (scripts/link-hot-first.sh, scripts/hot-code.sh;
# valgrind and nginx, which `scripts/hot-code.sh --tools` installs when missing). A plain
# `cargo build --release` links as usual.
set -euo pipefail
cd "$(dirname "$0")/.."

rootfs_only=false
case "${1:-}" in
  "") ;;
  --rootfs-only) rootfs_only=true ;;
  *) echo "usage: $0 [--rootfs-only]" >&2; exit 2 ;;
esac

# The user the images run as; deploy/activator.yaml's runAsUser says the same.
readonly IMAGE_UID=65532
out=${IMAGE_DIR:-target/image}

for tool in tar gzip sha256sum strip ldd; do
  command -v "$tool" >/dev/null || { echo "image.sh needs $tool (coreutils, tar, gzip, binutils, libc-bin)" >&2; exit 1; }
done

if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH=$(git log -1 --format=%ct 2>/dev/null || true)
  [ -n "$SOURCE_DATE_EPOCH" ] || { echo "not a git checkout: set SOURCE_DATE_EPOCH" >&2; exit 1; }
fi
created=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)

# Exported only after the build: cargo reruns the build scripts that watch SOURCE_DATE_EPOCH
# (cc's, so aws-lc-sys's and psm's, and what depends on them) whenever it changes, and it changes with
# every commit, so exporting it first rebuilt those crates on every run.
if [ -z "${KACTIVATOR_BINARY:-}" ]; then
  echo "== cargo rustc --profile dist, the code serving runs first (reused when target/dist is current)"
  bash scripts/hot-code.sh --tools
  # `cargo rustc` gives the linker to the binary's link alone: the dependencies are the same
  # whatever links them, and build scripts link as usual.
  cargo rustc --profile dist --locked --bin kactivator -- -C "linker=$PWD/scripts/link-hot-first.sh"
  KACTIVATOR_BINARY=${CARGO_TARGET_DIR:-target}/dist/kactivator
fi
export SOURCE_DATE_EPOCH
version_line=$("$KACTIVATOR_BINARY" --version) # "kactivator 0.1.0 (commit <hash>)"
version=$(echo "$version_line" | awk '{print $2}')
commit=$(echo "$version_line" | sed -n 's/.*(commit \(.*\))$/\1/p')

case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "unsupported architecture $(uname -m)" >&2; exit 1 ;;
esac

# --- the root filesystem ---------------------------------------------------------------------
rootfs=$out/rootfs
rm -rf "$rootfs"
mkdir -p "$rootfs/etc"
strip --strip-all -o "$rootfs/kactivator" "$KACTIVATOR_BINARY"

# Every library the dynamic loader maps, under the path it asks for, as a regular file (the
# merged-/usr symlinks of the host are not needed: the loader searches /lib/<triplet> itself).
# ldd prints "name => /path (addr)" for libraries and "/path (addr)" for the loader.
packages=()
while read -r lib; do
  [ -n "$lib" ] || continue
  mkdir -p "$rootfs$(dirname "$lib")"
  cp -L "$lib" "$rootfs$lib"
  package=$(dpkg -S "$(readlink -f "$lib")" 2>/dev/null | head -1 | cut -d: -f1 || true)
  [ -n "$package" ] || package=$(dpkg -S "$lib" 2>/dev/null | head -1 | cut -d: -f1 || true)
  if [ -n "$package" ]; then packages+=("$package"); fi
done < <(ldd "$KACTIVATOR_BINARY" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}')

# Each package's copyright file travels with its library (glibc is LGPL).
package_list=""
for package in $(printf '%s\n' "${packages[@]}" | LC_ALL=C sort -u); do
  package_version=$(dpkg-query -W -f='${Version}' "$package")
  package_list+="${package_list:+ }$package=$package_version"
  name=${package%%:*}
  if [ -f "/usr/share/doc/$name/copyright" ]; then
    mkdir -p "$rootfs/usr/share/doc/$name"
    cp "/usr/share/doc/$name/copyright" "$rootfs/usr/share/doc/$name/copyright"
  fi
done

cat >"$rootfs/etc/passwd" <<EOF
root:x:0:0:root:/:/sbin/nologin
nonroot:x:$IMAGE_UID:$IMAGE_UID:nonroot:/:/sbin/nologin
EOF
cat >"$rootfs/etc/group" <<EOF
root:x:0:
nonroot:x:$IMAGE_UID:
EOF
echo "hosts: files dns" >"$rootfs/etc/nsswitch.conf"

# Fixed modes, whatever the umask and the host's files said.
find "$rootfs" -type d -exec chmod 0755 {} +
find "$rootfs" -type f -exec chmod 0644 {} +
chmod 0755 "$rootfs/kactivator"
find "$rootfs" -type f -name '*.so*' -exec chmod 0755 {} +
find "$rootfs" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +

if $rootfs_only; then
  echo "root filesystem in $rootfs"
  exit 0
fi

# --- the OCI layout --------------------------------------------------------------------------
layout=$out/oci
rm -rf "$layout"
mkdir -p "$layout/blobs/sha256"
blobs=$layout/blobs/sha256

# Writes stdin as a blob; prints its digest (hex) and size.
put_blob() {
  local tmp digest
  tmp=$(mktemp "$blobs/.tmp.XXXXXX")
  cat >"$tmp"
  digest=$(sha256sum "$tmp" | cut -d' ' -f1)
  mv "$tmp" "$blobs/$digest"
  echo "$digest $(stat -c %s "$blobs/$digest")"
}

# One layer: the root filesystem, sorted, owned by 0:0 with no names, every time the epoch.
deterministic_tar() { # <dir> : a tar of <dir>'s contents on stdout
  (cd "$1" && find . -mindepth 1 -printf '%P\n' | LC_ALL=C sort) |
    tar --create --file=- --directory="$1" --no-recursion --verbatim-files-from --files-from=- \
      --format=ustar --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH"
}
layer_tar=$out/layer.tar
deterministic_tar "$rootfs" >"$layer_tar"
diff_id=$(sha256sum "$layer_tar" | cut -d' ' -f1)
uncompressed_size=$(stat -c %s "$layer_tar")
read -r layer_digest layer_size < <(gzip -9 -n <"$layer_tar" | put_blob)
rm "$layer_tar"

# The image config and manifest of one role; prints the manifest's digest and size.
image() { # <entrypoint JSON array> <title>
  local config_digest config_size
  read -r config_digest config_size < <(printf '%s' "{\"architecture\":\"$arch\",\"config\":{\"Entrypoint\":$1,\"Labels\":{\"org.opencontainers.image.description\":\"$2\",\"org.opencontainers.image.revision\":\"$commit\",\"org.opencontainers.image.title\":\"kactivator\",\"org.opencontainers.image.version\":\"$version\",\"io.kactivator.debian-packages\":\"$package_list\"},\"User\":\"$IMAGE_UID:$IMAGE_UID\"},\"created\":\"$created\",\"history\":[{\"created\":\"$created\",\"created_by\":\"scripts/image.sh\"}],\"os\":\"linux\",\"rootfs\":{\"diff_ids\":[\"sha256:$diff_id\"],\"type\":\"layers\"}}" | put_blob)
  printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",\"digest\":\"sha256:$config_digest\",\"size\":$config_size},\"layers\":[{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:$layer_digest\",\"size\":$layer_size}]}" | put_blob
  echo "$config_digest" >"$out/.config-$3"
}
read -r activator_digest activator_size < <(image '["/kactivator"]' "the Knative activator" activator)
read -r queue_proxy_digest queue_proxy_size < <(image '["/kactivator","queue-proxy"]' "the Knative queue-proxy" queue-proxy)

manifest_entry() { # <digest> <size> <ref name>
  printf '%s' "{\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:$1\",\"size\":$2,\"platform\":{\"architecture\":\"$arch\",\"os\":\"linux\"},\"annotations\":{\"io.containerd.image.name\":\"docker.io/library/$3:latest\",\"org.opencontainers.image.ref.name\":\"$3\"}}"
}
printf '%s' "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.index.v1+json\",\"manifests\":[$(manifest_entry "$activator_digest" "$activator_size" kactivator),$(manifest_entry "$queue_proxy_digest" "$queue_proxy_size" kactivator-queue-proxy)]}" >"$layout/index.json"
printf '%s' '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
# docker-archive's index, for `docker load` and `podman load`.
printf '%s' "[{\"Config\":\"blobs/sha256/$(cat "$out/.config-activator")\",\"RepoTags\":[\"kactivator:latest\"],\"Layers\":[\"blobs/sha256/$layer_digest\"]},{\"Config\":\"blobs/sha256/$(cat "$out/.config-queue-proxy")\",\"RepoTags\":[\"kactivator-queue-proxy:latest\"],\"Layers\":[\"blobs/sha256/$layer_digest\"]}]" >"$layout/manifest.json"
rm "$out/.config-activator" "$out/.config-queue-proxy"

find "$layout" -type d -exec chmod 0755 {} +
find "$layout" -type f -exec chmod 0644 {} +
archive=$out/kactivator-oci.tar
deterministic_tar "$layout" >"$archive.tmp"
mv "$archive.tmp" "$archive"
rm -rf "$layout"

echo "== $archive ($version, commit $commit, SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
echo "   sha256 $(sha256sum "$archive" | cut -d' ' -f1)"
echo "   kactivator             sha256:$activator_digest"
echo "   kactivator-queue-proxy sha256:$queue_proxy_digest"
echo "   layer: $layer_size bytes compressed, $uncompressed_size uncompressed; packages: $package_list"
