"""vmmweights.control on the host backend: this process serves its default
pools on a control socket and drives itself through it, as ``vmmw ctl``
drives a program under the interposer (docs/PRELOAD.md): status, sleep,
wake, every byte at its address; refusals carry the process's status."""

from __future__ import annotations

from pathlib import Path

import pytest

import vmmweights as vw
from vmmweights import control


def test_status_sleep_wake_through_the_socket(tmp_path: Path) -> None:
    sock = str(tmp_path / "control.sock")
    with control.serve(sock):
        with pytest.raises(vw.VmmwError) as e:
            control.serve(sock)
        assert e.value.status_name == "VMMW_IO"
        pool = vw.Pool.default()
        ptr = pool.alloc(4 << 20, tag="py-control")
        data = bytes(range(256)) * 64
        pool.write(ptr + 100, data)
        s = control.status(sock)
        assert s["state"] == "awake"
        assert any(t["tag"] == "py-control" for t in s["tags"])
        with pytest.raises(vw.VmmwError) as e:
            control.sleep(sock, "offload", tags=["py-nope"])
        assert e.value.status_name == "VMMW_UNKNOWN_TAG" and "py-nope" in e.value.message
        with pytest.raises(vw.VmmwError) as e:
            control.sleep(sock, "reload")
        assert e.value.status_name == "VMMW_INVALID_ARGUMENT"
        with pytest.raises(ValueError):
            control.sleep(sock, "sometimes")
        with pytest.raises(TypeError):
            control.sleep(sock, "offload", tags="py-control")
        r = control.sleep(sock, "offload", tags=["py-control"])
        assert r.bytes >= 4 << 20 and r.backup_bytes >= 4 << 20 and r.seconds >= r.sync_seconds
        s = control.status(sock)
        assert s["state"] == "asleep" and s["last"]["op"] == "sleep"
        r = control.wake(sock, wait_memory_ms=1000)
        assert r.bytes >= 4 << 20
        assert pool.read(ptr + 100, len(data)) == data
        pool.free(ptr)
    with pytest.raises(vw.VmmwError) as e:
        control.status(sock)
    assert e.value.status_name == "VMMW_IO"
