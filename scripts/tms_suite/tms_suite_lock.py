"""A pytest plugin for scripts/tms-suite.sh, which runs torch_memory_saver's
suite against the real package and against the shim at the same time on one
GPU. Tests whose ids match TMS_SUITE_EXCLUSIVE (fnmatch patterns, comma
separated) measure the whole device's memory, so each runs alone: it holds
the lock file TMS_SUITE_LOCK exclusively, every other test holds it shared.
A gate lock taken around each acquisition lets a waiting exclusive test in
before the next shared one (no starvation). Without TMS_SUITE_LOCK the
plugin does nothing."""

import fcntl
import fnmatch
import os
from typing import Iterator

import pytest


def _exclusive(test_id: str) -> bool:
    patterns = [p.strip() for p in os.environ.get("TMS_SUITE_EXCLUSIVE", "").split(",") if p.strip()]
    return any(fnmatch.fnmatch(test_id, p) for p in patterns)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: object) -> Iterator[None]:
    path = os.environ.get("TMS_SUITE_LOCK")
    if not path:
        yield
        return
    test_id = f"{os.path.basename(str(item.fspath))}::{item.name}"
    mode = fcntl.LOCK_EX if _exclusive(test_id) else fcntl.LOCK_SH
    with open(path, "a") as lock, open(path + ".gate", "a") as gate:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, mode)
        finally:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
