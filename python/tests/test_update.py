"""Updates through the package on the host backend: a Llama-shaped
checkpoint loaded with the llama preset (q/k/v and gate/up fused), then
updated from a trainer's tensors in host and device memory; the reference is
the new values loaded through the same rules. Versions, every problem in
one error with nothing written, a Reload sleep keeping the update."""

from __future__ import annotations

import ctypes

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


def contents(pool, loader):
    return {n: pool.read(d.ptr, d.bytes) for n, d in loader.destinations().items()}


@pytest.fixture
def loaded(pool, tmp_path):
    old, new = llama_like(seed=1), llama_like(seed=2)
    ld = vw.Loader(write_sharded(tmp_path / "old", old, shards=2))
    ld.preset("llama", head_dim=16)
    ld.allocate(pool, "py-update")
    ld.load(pool)
    with vw.Loader(write_sharded(tmp_path / "new", new, shards=2)) as ref:
        ref.preset("llama", head_dim=16)
        ref.allocate(pool, "py-update-reference")
        ref.load(pool)
        want = contents(pool, ref)
    yield ld, new, want
    ld.close()


def host_source(tensors):
    src = vw.UpdateSource()
    for name, (dtype, shape, data) in tensors.items():
        buf = ctypes.create_string_buffer(data, len(data))
        src.add(name, dtype, shape, ctypes.addressof(buf), "host", keep=buf)
    return src


def device_source(pool, tensors):
    src = vw.UpdateSource()
    for name, (dtype, shape, data) in tensors.items():
        ptr = pool.alloc(len(data), "py-update-trainer")
        pool.write(ptr, data)
        src.add(name, dtype, shape, ptr, "device")
    return src


def test_update_from_host_and_device_tensors_is_bitwise(pool, loaded):
    ld, new, want = loaded
    assert pool.tag_version("py-update") == 1
    before = contents(pool, ld)
    assert before != want
    with host_source(new) as src:
        r = vw.update(ld, pool, src, expected_version=1)
    assert (r.tag, r.version, r.staged) == ("py-update", 2, False)
    assert r.destinations == len(want) and r.bytes == sum(len(v) for v in want.values())
    assert contents(pool, ld) == want
    with device_source(pool, new) as src:
        r = vw.update(ld, pool, src, expected_version=2, staged=True)
    assert (r.version, r.staged) == (3, True)
    assert contents(pool, ld) == want
    assert pool.tag_version("py-update") == 3 and not pool.tag_torn("py-update")
    assert pool.publish("py-update") == 4


def test_every_problem_is_listed_and_nothing_written(pool, loaded):
    ld, new, _ = loaded
    before = contents(pool, ld)
    bad = dict(new)
    del bad["model.norm.weight"]
    bad["model.extra.weight"] = ("BF16", [4], bytes(8))
    dtype, shape, data = bad["lm_head.weight"]
    bad["lm_head.weight"] = (dtype, [shape[0] - 1, shape[1]], data[: (shape[0] - 1) * shape[1] * 2])
    with host_source(bad) as src:
        with pytest.raises(vw.VmmwError) as e:
            vw.update(ld, pool, src, expected_version=5)
    assert e.value.status_name == "VMMW_PLAN_MISMATCH"
    for needle in ["model.norm.weight", "model.extra.weight", "lm_head.weight", "expects 5", "nothing written"]:
        assert needle in str(e.value), needle
    with host_source(new) as src:
        with pytest.raises(vw.VmmwError) as e:
            vw.update(ld, pool, src, expected_version=5)
    assert e.value.status_name == "VMMW_VERSION_MISMATCH"
    assert contents(pool, ld) == before
    assert pool.tag_version("py-update") == 1
    with pytest.raises(ValueError, match="memory"):
        vw.UpdateSource().add("x", "BF16", [1], 1, "disk")


def test_reload_after_an_update_brings_the_update_back(pool, loaded):
    ld, new, want = loaded
    with host_source(new) as src:
        vw.update(ld, pool, src, expected_version=1)
    pool.sleep({"py-update": "reload"})
    pool.wake("py-update")
    assert contents(pool, ld) == want


def test_a_partial_update_keeps_the_rest(pool, loaded):
    ld, new, want = loaded
    before = contents(pool, ld)
    part = {n: v for n, v in new.items() if n.startswith("model.layers.1.")}
    with host_source(part) as src:
        vw.update(ld, pool, src, expected_version=1, allow_missing=True)
    got = contents(pool, ld)
    for name in got:
        assert got[name] == (want[name] if name.startswith("model.layers.1.") else before[name]), name
