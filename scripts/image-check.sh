#!/usr/bin/env bash
# Checks the images scripts/image.sh builds, as a user's runtime would see them:
#   1. the archive is reproducible: a second build, in another directory and under another umask,
#      gives the same bytes;
#   2. skopeo reads both images from it by name, and their entrypoints are the two roles;
#   3. each image's root filesystem, unpacked from the layer skopeo copied out, runs its binary
#      alone: in a chroot, as the image's user, in fresh mount and network namespaces with only
#      /proc and /sys mounted, as a container runtime would; the activator's entrypoint answers
#      `--version` with this commit and serves the demo's /healthz; the queue-proxy's entrypoint,
#      started as Knative starts it (no arguments) without its environment, exits 2 naming what
#      is missing;
#   4. the Containerfile, built with buildah from the root filesystem image.sh leaves, gives both
#      images the same files (names, modes, owners, contents) and the same user and entrypoint;
#   5. the binary's code starts with the functions its trace saw run (target/dist/hot-code/order,
#      scripts/link-hot-first.sh).
# Needs root (chroot, namespaces); installs skopeo and buildah from Debian when missing.
# Usage: scripts/image-check.sh   (builds the archive itself; reuses target/dist)
set -euo pipefail
cd "$(dirname "$0")/.."

[ "$(id -u)" -eq 0 ] || { echo "image-check.sh needs root (chroot and namespaces)" >&2; exit 1; }
missing=()
for tool in skopeo buildah; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "== installing ${missing[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
for tool in unshare chroot curl python3 ip; do
  command -v "$tool" >/dev/null || { echo "image-check.sh needs $tool" >&2; exit 1; }
done

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "image-check: $*" >&2; exit 1; }

echo "== building the image archive twice"
bash scripts/image.sh
archive=target/image/kactivator-oci.tar
dist=${CARGO_TARGET_DIR:-target}/dist
(umask 077 && IMAGE_DIR=$work/again KACTIVATOR_BINARY=${KACTIVATOR_BINARY:-$dist/kactivator} bash scripts/image.sh >/dev/null)
first=$(sha256sum "$archive" | cut -d' ' -f1)
second=$(sha256sum "$work/again/kactivator-oci.tar" | cut -d' ' -f1)
[ "$first" = "$second" ] || fail "two builds differ: $first vs $second"
echo "   reproducible: sha256 $first"

if [ -z "${KACTIVATOR_BINARY:-}" ]; then
  echo "== the code layout of $dist/kactivator ($dist/hot-code/order)"
  # The traced functions should fill the start of .text, apart from alignment: where the last of
  # them ends, against their total size. In the compiler's order they end near the end of .text.
  python3 - "$dist/kactivator" "$dist/hot-code/order" <<'EOF' || fail "the binary's code does not start with the traced functions"
import subprocess, sys
binary, order = sys.argv[1:]
names = {line.strip() for line in open(order) if line.strip() and not line.startswith("#")}
sections = subprocess.run(["readelf", "-SW", binary], capture_output=True, text=True, check=True).stdout
fields = next(line.split("]", 1)[1].split() for line in sections.splitlines() if " .text " in line)
start, size = int(fields[2], 16), int(fields[4], 16)
symbols = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
ends, total = {}, 0
for line in symbols.splitlines():
    parts = line.split()
    if len(parts) == 4 and parts[3] in names and start <= int(parts[0], 16) < start + size:
        address, length = int(parts[0], 16), int(parts[1], 16)
        if parts[3] not in ends:
            total += length
        ends[parts[3]] = max(ends.get(parts[3], 0), address + length)
span = max(ends.values()) - start
print(f"   {len(ends)} of {len(names)} traced functions, {total >> 10} KiB, in the first {span >> 10} KiB of {size >> 10} KiB of .text")
sys.exit(0 if len(ends) >= 0.95 * len(names) and span <= 1.25 * total else 1)
EOF
else
  echo "== the code layout: not checked (KACTIVATOR_BINARY is given)"
fi

commit=$(git rev-parse HEAD)

# Copies image <name> out of the archive with skopeo (which checks every digest), unpacks its
# layers into $work/<name>/rootfs, and writes its entrypoint, one word per line, to
# $work/<name>/entrypoint.
unpack() {
  local name=$1 dir=$work/$1
  mkdir -p "$dir"
  skopeo inspect "oci-archive:$archive:$name" >/dev/null
  skopeo copy --quiet "oci-archive:$archive:$name" "dir:$dir/image"
  mkdir -p "$dir/rootfs"
  python3 - "$dir" >"$dir/entrypoint" <<'EOF'
import json, subprocess, sys
dir = sys.argv[1]
manifest = json.load(open(f"{dir}/image/manifest.json"))
config = json.load(open(f"{dir}/image/" + manifest["config"]["digest"].split(":")[1]))
assert config["config"]["User"] == "65532:65532", config["config"]
for layer in manifest["layers"]:
    subprocess.run(["tar", "-xzf", f"{dir}/image/" + layer["digest"].split(":")[1], "-C", f"{dir}/rootfs"], check=True)
print("\n".join(config["config"]["Entrypoint"]))
EOF
}

# Runs the entrypoint in the unpacked root: chroot as 65532, fresh mount and network namespaces
# (loopback up), /proc and /sys as a runtime mounts them, an empty environment.
in_image() { # <name> <script>; the script sees `image ARGS...` running the entrypoint
  local name=$1 script=$2 rootfs=$work/$1/rootfs
  mkdir -p "$rootfs/proc" "$rootfs/sys"
  unshare --mount --net --fork -- bash -euo pipefail -c '
    chroot=$1; rootfs=$2; script=$3; shift 3
    ip link set lo up
    mount -t proc proc "$rootfs/proc"
    mount --rbind -o ro /sys "$rootfs/sys"
    image() { env -i "$chroot" --userspec=65532:65532 "$rootfs" "$@"; }
    # The same, replacing the calling (sub)shell, so that `(exec_image ...) &` leaves $! the
    # binary itself, for the signal that stops it.
    exec_image() { exec env -i "$chroot" --userspec=65532:65532 "$rootfs" "$@"; }
    eval "$script"
  ' check "$(command -v chroot)" "$rootfs" "$script" "${@:3}"
}

echo "== the activator image"
unpack kactivator
mapfile -t entrypoint <"$work/kactivator/entrypoint"
[ "${entrypoint[*]}" = "/kactivator" ] || fail "kactivator's entrypoint is ${entrypoint[*]}"
# Nothing else in the root: the binary, its loader and libraries, /etc and copyright files.
unexpected=$(cd "$work/kactivator/rootfs" && find . -type f | grep -Ev '^\./(kactivator|lib64/ld-linux[^/]*|lib/[^/]+/lib[^/]+\.so[.0-9]*|etc/(passwd|group|nsswitch\.conf)|usr/share/doc/[^/]+/copyright)$' || true)
[ -z "$unexpected" ] || fail "unexpected files in the image: $unexpected"
version=$(in_image kactivator 'image "$@" --version' "${entrypoint[@]}") || fail "--version failed in the image"
[ "$version" = "kactivator $(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml) (commit $commit)" ] ||
  fail "--version in the image says: $version"
echo "   $version"
# The demo on its default loopback ports (the network namespace is the image's own).
in_image kactivator '
  (exec_image "$@" demo >/dev/null 2>"$rootfs/../demo.log") &
  demo=$!
  for _ in $(seq 1 100); do
    if curl -fsS --max-time 2 http://127.0.0.1:9090/healthz >/dev/null 2>&1; then break; fi
    sleep 0.2
  done
  trap "kill -KILL $demo 2>/dev/null || true" EXIT
  curl -fsS --max-time 2 -o /dev/null -w "   demo /healthz: %{http_code}\n" http://127.0.0.1:9090/healthz
  curl -fsS --max-time 5 -H "Host: hello.default.svc.cluster.local" http://127.0.0.1:8012/ | sed "s/^/   demo proxied: /"
  kill -TERM "$demo"
  wait "$demo" || { echo "the demo exited $? after SIGTERM" >&2; exit 1; }
' "${entrypoint[@]}" || { cat "$work/kactivator/demo.log" >&2 2>/dev/null; fail "the demo did not serve from the image"; }

echo "== the queue-proxy image"
unpack kactivator-queue-proxy
mapfile -t entrypoint <"$work/kactivator-queue-proxy/entrypoint"
[ "${entrypoint[*]}" = "/kactivator queue-proxy" ] || fail "kactivator-queue-proxy's entrypoint is ${entrypoint[*]}"
cmp -s "$work/kactivator/rootfs/kactivator" "$work/kactivator-queue-proxy/rootfs/kactivator" ||
  fail "the two images hold different binaries"

echo "== the Containerfile (buildah, from target/image/rootfs)"
buildah() { command buildah --root "$work/buildah/root" --runroot "$work/buildah/run" --storage-driver vfs "$@"; }
# An image copied to a directory (`dir:`): its user and entrypoint, then every file of its layers
# as mode, owner, names, size, path and content checksum.
contents() { # <dir>
  python3 - "$1" <<'EOF'
import hashlib, json, sys, tarfile
image = sys.argv[1]
manifest = json.load(open(f"{image}/manifest.json"))
config = json.load(open(f"{image}/" + manifest["config"]["digest"].split(":")[1]))["config"]
print("user", config.get("User"), "entrypoint", config.get("Entrypoint"), "cmd", config.get("Cmd"))
for layer in manifest["layers"]:
    with tarfile.open(f"{image}/" + layer["digest"].split(":")[1]) as tar:
        for member in tar:
            digest = hashlib.sha256(tar.extractfile(member).read()).hexdigest() if member.isfile() else ""
            print(member.type, oct(member.mode & 0o7777), member.uid, member.gid, member.uname, member.gname, member.size, member.name.rstrip("/"), digest)
EOF
}
for name in kactivator kactivator-queue-proxy; do
  buildah build --quiet --isolation chroot --timestamp 0 --target "$name" -f Containerfile -t "$name" target/image/rootfs >/dev/null
  buildah push --quiet "$name" "dir:$work/$name/containerfile"
  diff <(contents "$work/$name/image") <(contents "$work/$name/containerfile") >&2 ||
    fail "the Containerfile's $name differs from the archive's (< archive, > Containerfile)"
done
echo "   same files, user and entrypoints as the archive"

echo "== the queue-proxy role, started as Knative starts it, without its environment"
status=0
message=$(in_image kactivator-queue-proxy 'image "$@" 2>&1' "${entrypoint[@]}") || status=$?
[ "$status" -eq 2 ] || fail "queue-proxy without its environment exited $status, not 2: $message"
grep -q SERVING_NAMESPACE <<<"$message" || fail "queue-proxy's error does not name SERVING_NAMESPACE: $message"
echo "   no environment: exit 2, $message"

size_compressed=$(stat -c %s "$archive")
size_rootfs=$(du -sb "$work/kactivator/rootfs" --exclude=proc --exclude=sys | cut -f1)
echo "== image check passed: archive $size_compressed bytes, root filesystem $size_rootfs bytes"
