#!/usr/bin/env python3
"""Checks that Cargo.toml's `rust-version` is true for the committed Cargo.lock.

Every package the lock resolves for this platform (the library's dependencies,
the `cli` feature's and the tests') declares the oldest Rust it builds with;
the crate's own number must be at least the largest of them, and
docs/BUILDING.md must state the same number. Prints the packages that set the
floor. With --self-test, first shows the check failing on a number below it.

This reads what each dependency declares; building with that toolchain
(`cargo +1.88 check --locked --all-features`, run by scripts/test.d/08-msrv.sh
where the toolchain is installed) also checks this crate's own code.
"""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def version_tuple(v):
    """"1.88" and "1.88.0" compare equal."""
    parts = [int(x) for x in v.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def declared_by_dependencies():
    host = re.search(r"^host: (\S+)$", subprocess.run(
        ["rustc", "-vV"], capture_output=True, text=True, check=True).stdout, re.M).group(1)
    meta = json.loads(subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--locked", "--all-features",
         "--filter-platform", host],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    packages = {p["id"]: p for p in meta["packages"]}
    root = meta["resolve"]["root"]
    deps = []
    for node in meta["resolve"]["nodes"]:
        p = packages[node["id"]]
        if node["id"] != root and p.get("rust_version"):
            deps.append((version_tuple(p["rust_version"]), p["name"], p["version"]))
    return packages[root], sorted(deps, reverse=True)


def check(ours, deps, building_md):
    """The problems, as lines (none when the number is true)."""
    problems = []
    floor = deps[0][0] if deps else (0,)
    if version_tuple(ours) < floor:
        needing = [f"{n} {v} needs {'.'.join(map(str, rv))}" for rv, n, v in deps if rv > version_tuple(ours)]
        problems.append(f"Cargo.toml says rust-version = \"{ours}\", but the lock holds: " + "; ".join(needing))
    stated = re.search(r"stable, (\d+\.\d+(?:\.\d+)?)\+", building_md)
    if not stated or stated.group(1) != ours:
        problems.append(f"docs/BUILDING.md states Rust {stated.group(1) if stated else '(nothing)'}+, "
                        f"Cargo.toml {ours}")
    return problems


def main():
    root, deps = declared_by_dependencies()
    ours = root.get("rust_version")
    if not ours:
        sys.exit("Cargo.toml has no rust-version")
    building_md = (ROOT / "docs/BUILDING.md").read_text()
    if "--self-test" in sys.argv:
        floor = deps[0][0]
        below = f"{floor[0]}.{floor[1] - 1}"
        if not check(below, deps, building_md.replace(ours, below)):
            sys.exit(f"MSRV self-test: rust-version {below} passed, below the lock's {floor}")
        if not check(ours, deps, building_md.replace(f"stable, {ours}+", "stable, 1.0+")):
            sys.exit("MSRV self-test: a BUILDING.md number that differs passed")
        print(f"MSRV self-test: {below}, below the lock's floor, and a stale BUILDING.md are caught")
    problems = check(ours, deps, building_md)
    if problems:
        sys.exit("MSRV check failed:\n  " + "\n  ".join(problems))
    top = [f"{n} {v} ({'.'.join(map(str, rv))})" for rv, n, v in deps if rv == deps[0][0]]
    print(f"MSRV check: rust-version {ours} covers all {len(deps)} locked packages that declare one; "
          f"the floor is set by {', '.join(top)}")


if __name__ == "__main__":
    main()
