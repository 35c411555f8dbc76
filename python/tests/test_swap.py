"""Swaps and waiting wakes through the package on the host backend: a swap
puts one tag to sleep while another wakes, for every policy the waking tag
slept with; refusals change nothing; a side that fails raises with both
sides' outcome; a device too small for both makes the wake wait for the
sleep; a waiting wake fails at its deadline naming the tag, and wakes once
another tag's memory is given back meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded

MIB = 1 << 20


@pytest.fixture
def ckpt(tmp_path):
    return write_sharded(tmp_path / "ckpt", llama_like(), shards=2)


def model(pool, path, tag, seed):
    dests, _ = vw.load(path, pool, tag)
    extra = pool.alloc(16 * MIB, tag)
    pool.write(extra, bytes((i * seed) % 251 for i in range(64 * 1024)))
    return dests, extra


def contents(pool, dests, extra):
    out = {n: pool.read(d.ptr, d.bytes) for n, d in dests.items()}
    out["extra"] = pool.read(extra, 64 * 1024)
    return out


@pytest.mark.parametrize("asleep", ["offload", "offload_compressed", "reload", "discard"])
def test_swap_wakes_one_tag_while_the_other_sleeps(ckpt, asleep):
    with vw.Pool(backend="host") as pool:
        a = model(pool, ckpt, "swap-a", 3)
        b = model(pool, ckpt, "swap-b", 5)
        before_a, before_b = contents(pool, *a), contents(pool, *b)
        pool.sleep({"swap-b": asleep})
        r = pool.swap({"swap-a": "offload"}, ["swap-b"])
        assert r["sleep_status"] == 0 and r["wake_status"] == 0
        assert r["slept_tags"] == 1 and r["woken_tags"] == 1
        assert r["released_bytes"] >= 16 * MIB and r["mapped_bytes"] >= 16 * MIB
        assert {t["name"] for t in r["tags"]} == {"swap-a", "swap-b"}
        assert vw.tag_usage(pool.report(), "swap-a")["asleep"]
        assert not vw.tag_usage(pool.report(), "swap-b")["asleep"]
        if asleep != "discard":
            assert contents(pool, *b) == before_b
        pool.swap({"swap-b": "discard"}, ["swap-a"])
        assert contents(pool, *a) == before_a


def test_refusals_change_nothing(ckpt):
    with vw.Pool(backend="host") as pool:
        a = model(pool, ckpt, "swap-a", 3)
        model(pool, ckpt, "swap-b", 5)
        pool.sleep({"swap-b": "offload"})
        before = contents(pool, *a)
        for sleep, wake, status in [
            ({"swap-a": "offload"}, ["swap-a"], "VMMW_INVALID_ARGUMENT"),
            ({"swap-a": "offload"}, ["swap-nobody"], "VMMW_UNKNOWN_TAG"),
        ]:
            with pytest.raises(vw.VmmwError) as e:
                pool.swap(sleep, wake)
            assert e.value.status_name == status
            assert not hasattr(e.value, "swap_result")
        with pytest.raises(ValueError):
            pool.swap({"swap-a": "sideways"}, ["swap-b"])
        with pytest.raises(ValueError):
            pool.swap({"swap-a": "offload"}, ["swap-b"], wait_memory_s=-1)
        assert not vw.tag_usage(pool.report(), "swap-a")["asleep"]
        assert vw.tag_usage(pool.report(), "swap-b")["asleep"]
        assert contents(pool, *a) == before


def test_a_small_device_makes_the_wake_wait(ckpt, monkeypatch):
    # Room for one model and a half: the wake maps as the sleep releases.
    monkeypatch.setenv("VMMW_HOST_MEMORY", "28M")
    with vw.Pool(backend="host") as pool:
        a = model(pool, ckpt, "swap-a", 3)
        pool.sleep({"swap-a": "offload"})
        b = model(pool, ckpt, "swap-b", 5)
        before_b = contents(pool, *b)
        pool.sleep({"swap-b": "offload"})
        pool.wake("swap-a")
        before_a = contents(pool, *a)
        with pytest.raises(vw.VmmwError) as e:
            pool.wake("swap-b")
        assert e.value.status_name == "VMMW_OUT_OF_MEMORY"
        pool.swap({"swap-a": "offload"}, ["swap-b"])
        assert contents(pool, *b) == before_b
        # A waiting wake with nobody making room fails at its deadline,
        # naming the tag, which stays asleep.
        t = time.monotonic()
        with pytest.raises(vw.VmmwError) as e:
            pool.wake("swap-a", wait_memory_s=0.03)
        assert e.value.status_name == "VMMW_OUT_OF_MEMORY" and "swap-a" in e.value.message
        assert time.monotonic() - t >= 0.03
        assert vw.tag_usage(pool.report(), "swap-a")["asleep"]
        # Another tag's memory given back meanwhile: the wake waits for it.
        pool.sleep({"swap-b": "offload"})
        filler = pool.alloc(16 * MIB, "swap-filler")

        def give_back():
            time.sleep(0.05)
            pool.free(filler)
            pool.trim()

        th = threading.Thread(target=give_back)
        th.start()
        pool.wake("swap-a", wait_memory_s=20)
        th.join()
        assert contents(pool, *a) == before_a


def test_torch_module_exports_swap():
    torch = pytest.importorskip("torch")
    del torch
    import vmmweights.torch as vt

    assert callable(vt.swap) and "swap" in vt.__all__
