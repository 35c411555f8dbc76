#!/usr/bin/env python3
"""The side-by-side table of torch_memory_saver's suite (scripts/tms-suite.sh):
one row per test, the real package's outcome and the shim's from one run of
one tree, N/A with its reason (upstream's release tooling, other platforms).
Exits 1 when a test that passes with the real package does not pass with the
shim and is not N/A, or when the real package's column is missing."""

import argparse
import fnmatch
import os
import sys
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple


def outcomes(path: str) -> Dict[str, str]:
    """Test id ("test_examples.py::test_simple[torch]") -> passed/failed/error/skipped."""
    if not os.path.isfile(path):
        return {}
    found: Dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")[-1]
        # A module that failed to import shows as a case with no class name.
        tid = f"{module}.py::{case.get('name')}" if module else f"{case.get('name')}.py (import)"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                state = {"failure": "failed"}.get(child.tag, child.tag)
        found[tid] = state
    return found


def na_list(path: str) -> List[Tuple[str, str]]:
    """(pattern, reason) lines: `PATTERN<TAB or two spaces>REASON`; # comments."""
    rows = []
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            pat, _, reason = line.partition("  ")
            rows.append((pat.strip(), reason.strip()))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--na", required=True)
    ap.add_argument("--commit", default="")
    ap.add_argument("--tree", default="", help="the tree both columns ran from")
    ap.add_argument("--real", required=True)
    ap.add_argument("--shim", required=True)
    a = ap.parse_args()
    real, shim, na = outcomes(a.real), outcomes(a.shim), na_list(a.na)
    if not shim:
        print(f"no shim results in {a.shim}", file=sys.stderr)
        return 1
    print(f"torch_memory_saver suite at {a.commit}: real package vs vmmweights shim, both from one run of "
          f"{a.tree or 'this tree'}\n")
    print("| test | real package | shim | N/A: why |")
    print("|---|---|---|---|")
    bad, counts = [], {"real": 0, "shim": 0, "na": 0}
    for tid in sorted(set(real) | set(shim)):
        r, s = real.get(tid, "-"), shim.get(tid, "-")
        reason = next((why for pat, why in na if fnmatch.fnmatch(tid, pat)), "")
        counts["real"] += r == "passed"
        counts["shim"] += s == "passed"
        counts["na"] += bool(reason)
        if r == "passed" and s != "passed" and not reason:
            bad.append(tid)
        print(f"| {tid} | {r} | {s} | {reason} |")
    total = len(set(real) | set(shim))
    print(f"\n{total} tests: {counts['real']} pass with the real package, {counts['shim']} with the shim, "
          f"{counts['na']} N/A")
    if bad:
        print(f"FAIL {len(bad)} pass with the real package but not with the shim: {', '.join(bad)}")
        return 1
    if not real:
        print("FAIL the real package did not run in this run: no column to compare (carry .tms/wheels)")
        return 1
    if counts["real"] == 0:
        print("FAIL no test passed with the real package: the run itself is broken (see real.log)")
        return 1
    print(f"PASS every test passing with the real package passes with the shim, N/A aside ({counts['shim']} pass)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
