"""The progress contract (docs/ABI.md), the same in every language: a falsy
return (None included) continues and never cancels, however often and
whenever the callback is called; a truthy one while bytes are still to come
cancels (unless the copies in flight were the last: then the load succeeds).
The checkpoint (32 MiB) is large enough for calls during the copy,
not only at its end, so a reversed reading would show. And `vw.load` frees
what it allocated when the load fails."""

from __future__ import annotations

import struct

import pytest

import vmmweights as vw
from safetensors_writer import write_file

N = 8 << 20  # float32 elements


@pytest.fixture
def big(tmp_path):
    path = tmp_path / "big.safetensors"
    write_file(path, {"w.weight": ("F32", [N], struct.pack("<f", 1.5) * N)})
    return path


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


@pytest.mark.parametrize("answer", [False, None, 0])
def test_a_callback_asking_to_continue_never_cancels(pool, big, answer):
    midway = 0
    with vw.Loader(big) as ld:
        ld.allocate(pool, "weights")
        for _ in range(20):
            calls = []

            def progress(done, total):
                calls.append(done < total)
                return answer

            assert ld.load(pool, progress).bytes == N * 4
            assert calls, "the callback was never called"
            midway += sum(calls)
            if midway:
                break
    assert midway, "no call came before the end: the test proved nothing"


def test_a_callback_asking_to_stop_midway_cancels(pool, big):
    with vw.Loader(big) as ld:
        ld.allocate(pool, "weights")
        for _ in range(20):
            calls = []

            def progress(done, total):
                calls.append(done < total)
                return True

            try:
                ld.load(pool, progress)  # may succeed: asked after the last copies
            except vw.VmmwError as e:
                assert e.status_name == "VMMW_CANCELLED" and any(calls)
                return
    pytest.fail("a truthy return never cancelled in 20 loads")


def test_a_failed_load_frees_what_it_allocated(pool, big):
    for _ in range(20):
        def stop(done, total):
            return True

        try:
            vw.load(big, pool, "weights", progress=stop)
        except vw.VmmwError as e:
            assert e.status_name == "VMMW_CANCELLED"
            break
        # Called only at the end, the load succeeded: free it and try again.
        for t in pool.report()["tags"]:
            assert t["tag"] == "weights"
        pool.close()
        pool = vw.Pool(backend="host")
    else:
        pytest.fail("no load was cancelled in 20 tries")
    total = pool.report()["total"]
    assert (total["live_bytes"], total["live_blocks"]) == (0, 0), total
