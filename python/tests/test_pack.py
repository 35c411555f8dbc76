"""Packed checkpoints through the package: vw.pack / vw.unpack give the
files back bit for bit, a packed checkpoint loads the same bytes as its
original (vw.load), progress reaches the total, a progress callback that
raises stops the pack and leaves nothing behind, and a packed checkpoint
is refused as input to pack."""

from __future__ import annotations

import os

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


@pytest.fixture
def ckpt(tmp_path):
    tensors = llama_like()
    return write_sharded(tmp_path / "ckpt", tensors, shards=2), tensors


def test_pack_unpack_bitwise_and_load(pool, ckpt, tmp_path):
    path, tensors = ckpt
    seen = []
    r = vw.pack(path, tmp_path / "packed", frame_bytes=64 << 10, cpu=True,
                progress=lambda d, t: seen.append((d, t)))
    assert r.files == 2 and r.tensors == len(tensors) and r.packed_bytes > 0
    assert seen and seen[-1][0] == seen[-1][1]
    back = tmp_path / "back"
    vw.unpack(tmp_path / "packed", back)
    for name in os.listdir(path):
        with open(os.path.join(path, name), "rb") as a, open(back / name, "rb") as b:
            assert a.read() == b.read(), name
    dests, result = vw.load(tmp_path / "packed", pool, "weights")
    assert result.bytes == sum(len(t[2]) for t in tensors.values())
    for name, (_, _, data) in tensors.items():
        assert pool.read(dests[name].ptr, dests[name].bytes) == data, name


def test_a_raising_progress_stops_the_pack_and_leaves_nothing(ckpt, tmp_path):
    path, _ = ckpt

    def boom(done, total):
        raise KeyError("stop here")

    with pytest.raises(KeyError):
        vw.pack(path, tmp_path / "out", frame_bytes=64 << 10, cpu=True, progress=boom)
    assert not (tmp_path / "out").exists()
    assert not [n for n in os.listdir(tmp_path) if "vmmw-tmp" in n]


def test_packing_a_packed_checkpoint_or_onto_an_output_is_refused(ckpt, tmp_path):
    path, _ = ckpt
    vw.pack(path, tmp_path / "p", cpu=True)
    with pytest.raises(vw.VmmwError, match="already packed"):
        vw.pack(tmp_path / "p", tmp_path / "q", cpu=True)
    with pytest.raises(vw.VmmwError, match="exists"):
        vw.pack(path, tmp_path / "p", cpu=True)
