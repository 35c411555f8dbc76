"""Update transports from Python on the host backend: a sender in another
process (a child Python) updates this process's destinations, loaded with
the llama preset, through its ring or directly out of its pool, bitwise (the reference: the new values loaded through the
same rules); a sender that dies mid-handshake leaves the destinations and
the version as they were, with VMMW_UPDATE_SOURCE or an I/O error; a
receiver closed on one thread while another receives waits for that
receive; a missing NCCL is named; a broadcast load checks its communicator."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


def contents(pool, loader):
    return {n: pool.read(d.ptr, d.bytes) for n, d in loader.destinations().items()}


@pytest.fixture
def loaded(pool, tmp_path):
    ld = vw.Loader(write_sharded(tmp_path / "old", llama_like(seed=1), shards=2))
    ld.preset("llama", head_dim=16)
    ld.allocate(pool, "py-transport")
    ld.load(pool)
    with vw.Loader(write_sharded(tmp_path / "new", llama_like(seed=2), shards=2)) as ref:
        ref.preset("llama", head_dim=16)
        ref.allocate(pool, "py-transport-reference")
        ref.load(pool)
        want = contents(pool, ref)
    yield ld, want
    ld.close()


def sender(path: str, die: bool, direct: bool = False, rounds: int = 1, offer: bool = False) -> subprocess.Popen:
    """A sender in a child Python: host tensors through the ring, or
    (`direct`) tensors in its pool sent directly, `rounds` times (`offer`:
    offered first)."""
    script = textwrap.dedent(f"""
        import ctypes, os, sys
        sys.path.insert(0, {HERE!r})
        import vmmweights as vw
        from safetensors_writer import llama_like
        pool = vw.Pool(backend="host")
        src = vw.UpdateSource()
        for name, (dtype, shape, data) in llama_like(seed=2).items():
            if {direct!r}:
                ptr = pool.alloc(len(data), "trainer")
                pool.write(ptr, data)
                src.add(name, dtype, shape, ptr, "device")
            else:
                buf = ctypes.create_string_buffer(data, len(data))
                src.add(name, dtype, shape, ctypes.addressof(buf), "host", keep=buf)
        with vw.transport.Sender(pool, {path!r}, slot_bytes=8192, timeout_ms=20000) as tx:
            print("ready", flush=True)
            if {die!r}:
                os._exit(3)
            if {offer!r}:
                r = tx.offer_direct(src)
                print(f"offered {{r.version}}", flush=True)
            for _ in range({rounds!r}):
                r = tx.send_direct(src) if {direct!r} else tx.send(src)
                print(f"sent {{r.version}} {{r.buckets}}", flush=True)
    """)
    env = dict(os.environ, VMMW_BACKEND="host")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def test_update_from_another_process_is_bitwise(pool, loaded, tmp_path):
    ld, want = loaded
    path = str(tmp_path / "tx.sock")
    p = sender(path, die=False)
    r = vw.transport.receive_ipc(ld, pool, path, pool.tag_version("py-transport"), timeout_ms=20000)
    assert r.version == 2 and r.staged
    assert contents(pool, ld) == want
    out, _ = p.communicate(timeout=30)
    assert out.startswith("sent 2 "), out


def test_a_direct_update_from_another_process_is_bitwise_and_unstaged(pool, loaded, tmp_path):
    ld, want = loaded
    path = str(tmp_path / "direct.sock")
    p = sender(path, die=False, direct=True)
    r = vw.transport.receive_ipc(ld, pool, path, pool.tag_version("py-transport"), timeout_ms=20000)
    assert r.version == 2 and not r.staged
    assert contents(pool, ld) == want
    out, _ = p.communicate(timeout=30)
    assert out.strip() == "sent 2 0", out


def test_a_receiver_keeps_direct_imports_across_updates(pool, loaded, tmp_path):
    ld, want = loaded
    path = str(tmp_path / "kept.sock")
    p = sender(path, die=False, direct=True, rounds=3)
    assert p.stdout is not None
    with vw.transport.Receiver(pool, path, timeout_ms=20000) as rx:
        assert rx.stats().kept_imports == 0
        for round in range(3):
            v = pool.tag_version("py-transport")
            r = rx.receive(ld, pool, v)
            assert r.version == v + 1 and not r.staged
            assert contents(pool, ld) == want
            s = rx.stats()
            assert s.direct and (s.attached, s.reused) == ((1, 0) if round == 0 else (0, 1)), s
            assert s.kept_imports == 1 and s.kept_bytes > 0 and s.setup_seconds <= s.seconds, s
            assert p.stdout.readline().strip() == f"sent {v + 1} 0"
        p.wait(timeout=30)
        # The sender is gone: the next receive fails cleanly and drops the imports.
        before = contents(pool, ld)
        with pytest.raises(vw.VmmwError):
            rx.receive(ld, pool, pool.tag_version("py-transport"))
        assert rx.stats().kept_imports == 0 and rx.stats().kept_bytes == 0
        assert contents(pool, ld) == before
        rx.drop_imports()
    with pytest.raises(ValueError):
        rx.stats()


def test_a_receiver_that_takes_the_offer_attaches_nothing_at_the_first_update(pool, loaded, tmp_path):
    ld, want = loaded
    path = str(tmp_path / "offer.sock")
    p = sender(path, die=False, direct=True, rounds=2, offer=True)
    assert p.stdout is not None
    with vw.transport.Receiver(pool, path, timeout_ms=20000) as rx:
        before = contents(pool, ld)
        v = pool.tag_version("py-transport")
        s = rx.prepare(ld, pool, v)
        assert (s.attached, s.reused, s.kept_imports) == (1, 0, 1), s
        assert contents(pool, ld) == before and pool.tag_version("py-transport") == v, "nothing written"
        assert p.stdout.readline().strip() == "offered 0"
        for round in range(2):
            v = pool.tag_version("py-transport")
            r = rx.receive(ld, pool, v)
            assert r.version == v + 1 and contents(pool, ld) == want
            assert (rx.stats().attached, rx.stats().reused) == (0, 1), rx.stats()
            assert p.stdout.readline().strip() == f"sent {v + 1} 0"
    p.wait(timeout=30)


def test_a_dead_sender_changes_nothing(pool, loaded, tmp_path):
    ld, _ = loaded
    before = contents(pool, ld)
    path = str(tmp_path / "dead.sock")
    p = sender(path, die=True)
    p.wait(timeout=30)
    with pytest.raises(vw.VmmwError):
        vw.transport.receive_ipc(ld, pool, path, 1, timeout_ms=5000)
    assert contents(pool, ld) == before
    assert pool.tag_version("py-transport") == 1


def test_nccl_missing_is_named(monkeypatch):
    monkeypatch.setenv("VMMW_NCCL_LIBRARY", "/nonexistent/libnccl.so.2")
    with pytest.raises(vw.VmmwError) as e:
        vw.transport.nccl_unique_id()
    assert "/nonexistent/libnccl.so.2" in str(e.value)


def test_broadcast_load_checks_its_communicator(pool, loaded):
    # No communicator exists without NCCL: a NULL one is refused by the C
    # call, through the arguments this wrapper converts.
    import ctypes

    ld, _ = loaded
    comm = vw.transport.NcclComm(_handle=ctypes.c_void_p())
    with pytest.raises(vw.VmmwError) as e:
        comm.broadcast_load(ld, pool, [0, 1], slot_bytes=1 << 20, stage=True)
    assert e.value.status_name == "VMMW_NULL_ARGUMENT"
    assert e.value.function == "vmmw_load_broadcast"


def test_closing_a_receiver_waits_for_a_receive_on_another_thread(pool, loaded, tmp_path):
    """A peer that connects and says nothing holds a receive for its
    timeout; a close from another thread waits for it instead of freeing
    the receiver under it, and the destinations stay as they were."""
    import socket
    import threading
    import time

    ld, _ = loaded
    before = contents(pool, ld)
    path = str(tmp_path / "silent.sock")
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(1)
    rx = vw.transport.Receiver(pool, path, timeout_ms=1500)
    ended = {}

    def receive() -> None:
        try:
            rx.receive(ld, pool, pool.tag_version("py-transport"))
        except vw.VmmwError as e:
            ended["error"] = e
        ended["at"] = time.monotonic()

    t = threading.Thread(target=receive)
    t.start()
    conn, _ = silent.accept()  # the receive is running
    rx.close()
    closed_at = time.monotonic()
    t.join(timeout=30)
    assert "error" in ended, ended
    assert ended["at"] <= closed_at, "close returned while the receive still ran"
    with pytest.raises(ValueError):
        rx.stats()
    assert contents(pool, ld) == before
    conn.close()
    silent.close()
