"""A loader never writes into memory that changed hands (host backend): a
destination whose block was freed and handed to a new owner at the same
address is refused, naming it, with the new owner's bytes intact, by
``Loader.load`` and ``load_devices``; a Reload wake after the refused load
keeps them too. An arena whose reservation cannot be made is out of memory."""

from __future__ import annotations

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded

NEW_OWNER = b"\x55"


@pytest.fixture
def path(tmp_path):
    return write_sharded(tmp_path / "ckpt", llama_like(), shards=2)


def change_hands(pool: vw.Pool, d: vw.Destination, tag: str) -> None:
    """Free `d`'s block and give its address to a new owner writing NEW_OWNER."""
    pool.free(d.ptr)
    again = pool.alloc(d.bytes, tag)
    assert again == d.ptr, "the pool hands the same address out again"
    pool.write(again, NEW_OWNER * d.bytes)


def lowest(dests):
    return min(dests.values(), key=lambda d: d.ptr)


def assert_refused(e, name):
    assert e.value.status_name == "VMMW_UNKNOWN_POINTER", e.value
    assert f"`{name}`" in e.value.message and "changed hands" in e.value.message, e.value.message


def test_a_load_into_memory_that_changed_hands_is_refused(path):
    with vw.Pool(backend="host") as pool, vw.Loader(path) as ld:
        dests = ld.allocate(pool, "py-identity")
        ld.load(pool)
        d = lowest(dests)
        change_hands(pool, d, "py-identity")
        others = {n: o for n, o in dests.items() if n != d.name}
        for o in others.values():
            pool.write(o.ptr, b"\xa5" * o.bytes)
        with pytest.raises(vw.VmmwError) as e:
            ld.load(pool)
        assert_refused(e, d.name)
        assert pool.read(d.ptr, d.bytes) == NEW_OWNER * d.bytes, "the new owner's bytes are intact"
        for n, o in others.items():
            assert pool.read(o.ptr, o.bytes) == b"\xa5" * o.bytes, f"{n} written by a refused load"
        # A Reload wake after the refused load keeps the new owner's bytes.
        pool.sleep({"py-identity": "reload"})
        pool.wake("py-identity")
        assert pool.read(d.ptr, d.bytes) == NEW_OWNER * d.bytes


def test_a_multi_device_load_refuses_memory_that_changed_hands(path):
    pools = [vw.Pool(backend="host", device=k) for k in range(2)]
    loaders = [vw.Loader(path) for _ in pools]
    try:
        dests = [ld.allocate(p, "py-identity-devices") for ld, p in zip(loaders, pools)]
        vw.load_devices(loaders, pools)
        d = lowest(dests[1])
        change_hands(pools[1], d, "py-identity-devices")
        for mode in ("replicas", "ranks"):
            with pytest.raises(vw.VmmwError) as e:
                vw.load_devices(loaders, pools, mode)
            assert_refused(e, d.name)
            assert pools[1].read(d.ptr, d.bytes) == NEW_OWNER * d.bytes
        pools[1].sleep({"py-identity-devices": "reload"})
        pools[1].wake("py-identity-devices")
        assert pools[1].read(d.ptr, d.bytes) == NEW_OWNER * d.bytes
    finally:
        for ld in loaders:
            ld.close()
        for p in pools:
            p.close()


def test_an_impossible_arena_is_out_of_memory():
    with vw.Pool(backend="host") as pool:
        pool.set_tag_arena("py-identity-arena", 1 << 56)
        with pytest.raises(vw.VmmwError) as e:
            pool.alloc(4096, "py-identity-arena")
        assert e.value.status_name == "VMMW_OUT_OF_MEMORY", e.value
