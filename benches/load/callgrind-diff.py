#!/usr/bin/env python3
"""Where two builds' instructions per request differ, function by function.

`benches/load/run.sh` keeps each run's callgrind profiles under
`target/bench-results/load-<stamp>-callgrind/` (`kact-<driver>-<N>.out` for the two request
counts N1 < N2). For each function this takes the marginal cost per request,
(I(N2) - I(N1)) / (N2 - N1), exclusive of callees, in a base run and a new run, and prints the
functions whose cost moved most, new minus base. File and binary paths are stripped from the
names, so builds from different directories compare.

    python3 benches/load/callgrind-diff.py BASE_DIR NEW_DIR [uring|epoll] [--top N]
                                           [--strip REGEX ...]

`--strip REGEX` deletes what REGEX matches from every name before comparing, so a function that
only gained or lost a type argument (a front made generic over its stream, say) is compared with
itself instead of showing as one function gone and another new.

Needs `callgrind_annotate` (valgrind). The totals line is the sum over every function, which is
the figure run.sh prints.
"""

import argparse
import collections
import pathlib
import re
import subprocess
import sys

LINE = re.compile(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(.*)$")


STRIP: list = []


def per_function(profile: pathlib.Path) -> collections.Counter:
    """Exclusive instructions per function name in one profile."""
    text = subprocess.run(
        ["callgrind_annotate", "--auto=no", "--inclusive=no", "--threshold=100", str(profile)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = collections.Counter()
    for line in text.splitlines():
        found = LINE.match(line)
        if not found:
            continue
        name = found.group(2).strip()
        if not name or name.startswith(("PROGRAM TOTALS", "=>")) or "file:function" in name:
            continue
        name = re.sub(r"\s*\[[^\]]*\]$", "", name)  # the binary's path
        name = re.sub(r"^(?:\?\?\?|\S*?\.(?:rs|c|S|h|cc)):", "", name)  # the source file
        for pattern in STRIP:
            name = re.sub(pattern, "", name)
        counts[name] += int(found.group(1).replace(",", ""))
    return counts


def marginal(run: pathlib.Path, driver: str) -> dict:
    """Per function: instructions per request between the run's two request counts."""
    profiles = sorted(
        run.glob(f"kact-{driver}-*.out"), key=lambda path: int(path.stem.rsplit("-", 1)[1])
    )
    if len(profiles) != 2:
        sys.exit(f"{run}: expected two kact-{driver}-<N>.out profiles, found {len(profiles)}")
    (low, high) = profiles
    requests = int(high.stem.rsplit("-", 1)[1]) - int(low.stem.rsplit("-", 1)[1])
    before, after = per_function(low), per_function(high)
    return {name: (after[name] - before[name]) / requests for name in set(before) | set(after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=pathlib.Path)
    parser.add_argument("new", type=pathlib.Path)
    parser.add_argument("driver", nargs="?", default="uring", choices=["uring", "epoll"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--strip", action="append", default=[], metavar="REGEX")
    args = parser.parse_args()
    STRIP.extend(args.strip)
    base, new = marginal(args.base, args.driver), marginal(args.new, args.driver)
    print(f"instructions per request: base {sum(base.values()):.0f}, new {sum(new.values()):.0f}")
    moved = sorted(
        ((new.get(name, 0) - base.get(name, 0), name) for name in set(base) | set(new)),
        key=lambda item: -abs(item[0]),
    )
    for delta, name in moved[: args.top]:
        print(f"{delta:+9.1f}  {base.get(name, 0):9.1f} -> {new.get(name, 0):9.1f}  {name[:140]}")


if __name__ == "__main__":
    main()
