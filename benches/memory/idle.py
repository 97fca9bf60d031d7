#!/usr/bin/env python3
"""An idle queue-proxy's memory as its cgroup sees it, not only as `ps` does.

    sudo python3 benches/memory/idle.py [--rounds N] BIN [BIN ...]

For each round, each binary, and the start-up unmap on and off
(`KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE`), in turn: copies the binary to a file of its own
and drops that file's pages from the page cache, so that the run is charged for every page of it
it reads (the first pod of the image on a node; a later one finds them cached and charged to
another cgroup); starts the queue-proxy in a new memory cgroup in front of a Python user
container; once ready, waits past the unmap (3 s), serves a request, a kubelet probe and an
autoscaler scrape, waits 5 s more, and reads:

* VmRSS, RssAnon, RssFile (`/proc/PID/status`);
* the cgroup's charge: `memory.current` (v2) or `memory.usage_in_bytes` (v1), and from
  `memory.stat` anon, file, active_file, inactive_file (v1: rss, cache, total_active_file,
  total_inactive_file);
* the working set as the kubelet computes it (cAdvisor's `container_memory_working_set_bytes`,
  which `kubectl top` and eviction use): the charge minus inactive_file.

Then stops the process and removes the cgroup. Needs root (cgroups), curl and python3; uses the
memory controller of cgroup v2 when it has it, else v1's.

A page fault in a file mapping reads around it as far as the file's block device's read-ahead
(`/sys/block/DEV/queue/read_ahead_kb`, 128 KiB by default, often more on virtual disks): that
much of the binary is read into the page cache, and charged, whatever the process touches.
`--dir` picks where the copies run from, so a device's setting can be compared (BENCHMARKS.md,
"Idle memory and the code layout", runs them from a loop device's file system).
"""

import argparse
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

V2 = pathlib.Path("/sys/fs/cgroup")
V1 = pathlib.Path("/sys/fs/cgroup/memory")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_root() -> tuple[pathlib.Path, int]:
    controllers = V2 / "cgroup.controllers"
    if controllers.exists() and "memory" in controllers.read_text().split():
        return V2, 2
    if (V1 / "memory.usage_in_bytes").exists():
        return V1, 1
    sys.exit("idle.py: no memory cgroup controller (v2 or v1) here")


def evict(path: pathlib.Path) -> None:
    """Drops the file's clean pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def status(pid: int) -> dict[str, int]:
    values = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile"):
            values[key] = int(rest.split()[0]) * 1024
    return values


def charge(group: pathlib.Path, version: int) -> dict[str, int]:
    stat = {}
    for line in (group / "memory.stat").read_text().splitlines():
        key, value = line.split()
        stat[key] = int(value)
    if version == 2:
        current = int((group / "memory.current").read_text())
        anon, file = stat["anon"], stat["file"]
        active, inactive = stat["active_file"], stat["inactive_file"]
    else:
        current = int((group / "memory.usage_in_bytes").read_text())
        anon, file = stat["total_rss"], stat["total_cache"]
        active, inactive = stat["total_active_file"], stat["total_inactive_file"]
    return {
        "charge": current,
        "anon": anon,
        "file": file,
        "active_file": active,
        "inactive_file": inactive,
        "working_set": max(current - inactive, 0),
    }


def get(url: str, *headers: str) -> None:
    command = ["curl", "-s", "-o", "/dev/null", "--max-time", "5", url]
    for header in headers:
        command += ["-H", header]
    subprocess.run(command, check=False)


def measure(binary: pathlib.Path, unmap: bool, root: pathlib.Path, version: int, work: pathlib.Path) -> dict:
    copy = work / "kactivator"
    shutil.copyfile(binary, copy)
    copy.chmod(0o755)
    evict(copy)
    group = root / f"kactivator-idle-{os.getpid()}"
    group.mkdir()
    user_port, port, admin, stats = free_port(), free_port(), free_port(), free_port()
    user = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(user_port), "--bind", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SERVING_NAMESPACE": "default",
        "SERVING_SERVICE": "idle",
        "SERVING_CONFIGURATION": "idle",
        "SERVING_REVISION": "idle",
        "SERVING_POD": "idle-0",
        "SERVING_POD_IP": "127.0.0.1",
        "QUEUE_SERVING_PORT": str(port),
        "QUEUE_SERVING_TLS_PORT": str(free_port()),
        "USER_PORT": str(user_port),
        "CONTAINER_CONCURRENCY": "0",
        "REVISION_TIMEOUT_SECONDS": "300",
        "ACTIVATOR_SERVICE_URL": "",
        "SERVING_READINESS_PROBE": f'{{"tcpSocket":{{"port":{user_port},"host":"127.0.0.1"}}}}',
        "KACTIVATOR_QUEUE_PROXY_UNMAP_START_UP_CODE": "true" if unmap else "false",
    }
    # The shell joins the cgroup, then becomes the queue-proxy: every page it touches is charged
    # there from its first instruction.
    command = [
        "sh",
        "-c",
        'echo $$ > "$0/cgroup.procs" && exec "$@"',
        str(group),
        str(copy),
        "queue-proxy",
        "--admin",
        f"127.0.0.1:{admin}",
        "--autoscaler-metrics",
        f"127.0.0.1:{stats}",
        "--drain-admin",
        f"127.0.0.1:{free_port()}",
    ]
    proxy = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(
            ["curl", "-sf", "-o", "/dev/null", "--max-time", "1", f"http://127.0.0.1:{admin}/readyz"]
        ).returncode:
            if time.monotonic() > deadline or proxy.poll() is not None:
                raise RuntimeError(f"{binary}: not ready")
            time.sleep(0.1)
        time.sleep(5)
        get(f"http://127.0.0.1:{port}/")
        get(f"http://127.0.0.1:{port}/", "User-Agent: kube-probe/1.30", "K-Network-Probe: queue")
        get(f"http://127.0.0.1:{stats}/metrics")
        time.sleep(5)
        return {**status(proxy.pid), **charge(group, version)}
    finally:
        proxy.send_signal(signal.SIGKILL)
        proxy.wait()
        user.terminate()
        user.wait()
        # An emptied cgroup may take a moment to let go of its last task.
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--dir",
        type=pathlib.Path,
        help="where the copies run from (default: beside the first binary); its block device's "
        "read-ahead decides how much of the binary a page fault reads in, and is charged for",
    )
    parser.add_argument("binaries", nargs="+", type=pathlib.Path)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("idle.py: needs root (it makes a cgroup)")
    root, version = memory_root()
    columns = ["VmRSS", "RssAnon", "RssFile", "charge", "anon", "file", "active_file", "inactive_file", "working_set"]
    # Not in /tmp by default: on a tmpfs the copy's pages could not be dropped.
    where = args.dir or args.binaries[0].resolve().parent
    device = os.stat(where).st_dev
    print(
        f"cgroup v{version} ({root}); copies in {where} (device {os.major(device)}:{os.minor(device)}); "
        "MiB, 10 s after ready, one request served"
    )
    print("| binary | unmap | " + " | ".join(columns) + " |")
    print("|---|---|" + "---|" * len(columns))
    with tempfile.TemporaryDirectory(dir=where) as work:
        for _ in range(args.rounds):
            for binary in args.binaries:
                for unmap in (True, False):
                    row = measure(binary, unmap, root, version, pathlib.Path(work))
                    cells = " | ".join(f"{row[column] / 2**20:.1f}" for column in columns)
                    print(f"| {binary} | {'on' if unmap else 'off'} | {cells} |", flush=True)


if __name__ == "__main__":
    main()
