"""vmmweights.share across real processes on the host backend: an owner
process loads a generated checkpoint and serves it; this process (and a
second importer process) attach, read the same bytes as the file, see a
published version, detach; the owner exits while an importer reads; wrong
and hostile socket paths raise VmmwError with a clear message; descriptors
are counted before and after."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_file
from vmmweights import share

HERE = Path(__file__).resolve().parent

# The owner: serve a checkpoint, then obey commands on stdin, one per line.
OWNER = textwrap.dedent(
    """
    import sys
    import vmmweights as vw
    from vmmweights import share
    ckpt, sock, policy = sys.argv[1:4]
    pool = vw.Pool(backend="host")
    server = share.serve_checkpoint(ckpt, sock, pool, "weights", policy=policy)
    print("serving", len(server.destinations), flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "publish":
            print("version", server.publish(), flush=True)
        elif cmd[0] == "reload":
            print("version", server.reload(), flush=True)
        elif cmd[0] == "attached":
            print("attached", server.attached(), flush=True)
        elif cmd[0] == "sleep":
            try:
                pool.sleep(weights="offload")
                print("slept", flush=True)
            except vw.VmmwError as e:
                print("refused", e.status_name, flush=True)
        elif cmd[0] == "exit":
            server.stop()
            print("stopped", flush=True)
            break
    """
)

# A second importer: attach, print a checksum, wait for a line, read again.
IMPORTER = textwrap.dedent(
    """
    import sys, hashlib
    from vmmweights import share
    with share.attach(sys.argv[1]) as att:
        def digest():
            h = hashlib.sha256()
            for n in sorted(att.names()):
                h.update(n.encode() + att.read(n))
            return h.hexdigest()
        print("attached", att.version, digest(), flush=True)
        sys.stdin.readline()
        print("again", att.owner_connected, digest(), flush=True)
    """
)


def env() -> dict:
    e = dict(os.environ, VMMW_BACKEND="host")
    e["PYTHONPATH"] = os.pathsep.join([str(HERE), *sys.path])
    return e


class Proc:
    """A Python child driven line by line."""

    def __init__(self, script: str, *args: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())

    def line(self, timeout: float = 60) -> str:
        out: list = []
        t = threading.Thread(target=lambda: out.append(self.p.stdout.readline()), daemon=True)
        t.start()
        t.join(timeout)
        if not out or not out[0]:
            self.p.kill()
            raise AssertionError(f"no line from the child (exit {self.p.wait()}): {self.p.stderr.read()}")
        return out[0].strip()

    def send(self, text: str) -> None:
        self.p.stdin.write(text + "\n")
        self.p.stdin.flush()

    def finish(self) -> int:
        try:
            self.p.stdin.close()
        except BrokenPipeError:
            pass
        rc = self.p.wait(60)
        self.p.stdout.close()
        self.p.stderr.close()
        return rc


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def digest_of(tensors) -> str:
    import hashlib

    h = hashlib.sha256()
    for n in sorted(tensors):
        h.update(n.encode() + tensors[n][2])
    return h.hexdigest()


@pytest.fixture
def ckpt(tmp_path):
    tensors = llama_like(layers=1)
    path = tmp_path / "model.safetensors"
    write_file(path, tensors)
    return path, tensors


@pytest.fixture
def owner(ckpt, tmp_path):
    sock = str(tmp_path / "w.sock")
    o = Proc(OWNER, str(ckpt[0]), sock, "refuse")
    assert o.line().startswith("serving"), "the owner serves"
    yield o, sock
    if o.p.poll() is None:
        o.send("exit")
        o.finish()


def test_attach_read_bytes_equal_publish_detach(ckpt, owner):
    _, tensors = ckpt
    o, sock = owner
    before = fd_count()
    with share.attach(sock) as att:
        assert att.backend == "host" and att.attached and att.owner_connected
        assert att.version == 1
        assert set(att.names()) == set(tensors)
        for name, (dtype, shape, data) in tensors.items():
            t = att.tensor(name)
            assert (t.dtype, list(t.shape), t.bytes) == (dtype, shape, len(data)), name
            assert att.read(name) == data, name
        assert set(att.tensors()) == set(tensors)
        o.send("attached")
        assert o.line() == "attached 1"
        o.send("publish")
        assert o.line() == "version 2"
        assert att.version == 2, "the published version is seen"
    assert not att.attached
    with pytest.raises(vw.VmmwError) as e:
        att.version
    assert "detached" in str(e.value)
    att.detach()  # idempotent
    assert fd_count() == before, "every descriptor the attach took is closed"
    for _ in range(100):  # the owner notices the closed connection
        o.send("attached")
        if o.line() == "attached 0":
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the owner still counts the detached importer")


def test_reload_rewritten_checkpoint_bumps_version_and_bytes(ckpt, owner, tmp_path):
    path, tensors = ckpt
    o, sock = owner
    with share.attach(sock) as att:
        name = "model.norm.weight"
        assert att.read(name) == tensors[name][2]
        changed = {n: (d, s, bytes(b ^ 0x01 for b in data)) for n, (d, s, data) in tensors.items()}
        write_file(path, changed)
        o.send("reload")
        assert o.line() == "version 2"
        assert att.version == 2
        for n, (_, _, data) in changed.items():
            assert att.read(n) == data, f"{n}: the importer sees the reloaded bytes in place"


def test_two_importers_and_owner_exit_while_reading(ckpt, owner):
    _, tensors = ckpt
    o, sock = owner
    want = digest_of(tensors)
    imp = Proc(IMPORTER, sock)
    first = imp.line().split()
    assert first[:2] == ["attached", "1"] and first[2] == want
    with share.attach(sock) as att:
        o.send("attached")
        assert o.line() == "attached 2"
        o.send("exit")
        assert o.line() == "stopped"
        assert o.finish() == 0
        assert not os.path.exists(sock), "the owner removed its socket"
        imp.send("go")
        again = imp.line().split()
        assert again == ["again", "False", want], "the importer reads the same bytes after the owner exited"
        assert not att.owner_connected
        assert {n: att.read(n) for n in tensors} == {n: t[2] for n, t in tensors.items()}
    assert imp.finish() == 0


def test_sleep_refused_while_attached(ckpt, owner):
    o, sock = owner
    with share.attach(sock):
        o.send("sleep")
        assert o.line() == "refused VMMW_INVALID_STATE"


def test_revoke_policy_importer_gets_clear_error(ckpt, tmp_path):
    sock = str(tmp_path / "r.sock")
    o = Proc(OWNER, str(ckpt[0]), sock, "revoke")
    assert o.line().startswith("serving")
    try:
        with share.attach(sock) as att:
            o.send("sleep")
            assert o.line() == "slept"
            for _ in range(200):  # the notice travels over the socket
                try:
                    att.version
                except vw.VmmwError as e:
                    assert e.status_name == "VMMW_SHARE_REVOKED"
                    break
                time.sleep(0.01)
            else:
                raise AssertionError("the revoke never reached the importer")
            with pytest.raises(vw.VmmwError) as e:
                att.read("model.norm.weight")
            assert e.value.status_name == "VMMW_SHARE_REVOKED"
    finally:
        o.send("exit")
        o.finish()


def test_wrong_paths_raise_clear_errors(tmp_path):
    before = fd_count()
    missing = tmp_path / "nothing.sock"
    with pytest.raises(vw.VmmwError) as e:
        share.attach(missing)
    assert e.value.status_name == "VMMW_IO" and str(missing) in str(e.value)

    plain = tmp_path / "file"
    plain.write_text("not a socket")
    with pytest.raises(vw.VmmwError) as e:
        share.attach(plain)
    assert str(plain) in str(e.value)

    # A peer that answers garbage: refused with the reason, nothing left behind.
    path = str(tmp_path / "hostile.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def hostile() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(4096)
            except OSError:
                pass
            conn.sendall(b"\xff" * 64)

    t = threading.Thread(target=hostile, daemon=True)
    t.start()
    with pytest.raises(vw.VmmwError) as e:
        share.attach(path)
    t.join(10)
    srv.close()
    assert e.value.status_name == "VMMW_SHARE_REFUSED", str(e.value)
    assert e.value.message, "the refusal says why"
    assert fd_count() == before, "no descriptor left behind by failed attaches"


def test_bad_arguments_change_nothing(tmp_path, ckpt):
    with pytest.raises(ValueError, match="unknown share policy"):
        share.serve_checkpoint(ckpt[0], tmp_path / "x.sock", vw.Pool(backend="host"), policy="sometimes")
    assert not (tmp_path / "x.sock").exists()
    with pytest.raises(ValueError, match="unknown backend"):
        share.attach(tmp_path / "x.sock", backend="tpu")


def test_serve_in_process_and_socket_exists_error(ckpt, tmp_path):
    sock = tmp_path / "in.sock"
    with vw.Pool(backend="host") as pool:
        with share.serve_checkpoint(ckpt[0], sock, pool, "weights") as server:
            assert server.serving and sock.exists()
            with pytest.raises(vw.VmmwError) as e:
                share.serve_checkpoint(ckpt[0], sock, pool, "weights-2")
            assert e.value.status_name == "VMMW_IO" and str(sock) in str(e.value)
            with share.attach(sock) as att:
                name = next(iter(ckpt[1]))
                d = server.destinations[name]
                assert att.read(name) == pool.read(d.ptr, d.bytes)
                assert server.attached() == 1
        assert not server.serving and not sock.exists()
        with pytest.raises(ValueError, match="stopped"):
            server.publish()


def test_connection_bound_and_group_allow_list_reach_the_server(ckpt, tmp_path):
    sock = tmp_path / "bound.sock"
    with vw.Pool(backend="host") as pool:
        with pytest.raises(ValueError, match="max_connections"):
            share.serve_checkpoint(ckpt[0], sock, pool, "weights", max_connections=-1)
        assert not sock.exists()
        with share.serve_checkpoint(ckpt[0], sock, pool, "weights", max_connections=1,
                                    allowed_uid=os.getuid() + 1, allowed_gid=os.getegid(),
                                    handshake_timeout=2.5) as server:
            with share.attach(sock) as att:  # admitted by its group
                assert server.attached() == 1
                with pytest.raises(vw.VmmwError) as e:
                    share.attach(sock)
                assert e.value.status_name == "VMMW_SHARE_REFUSED"
                assert "too many connections" in str(e.value)
                assert att.version == 1
