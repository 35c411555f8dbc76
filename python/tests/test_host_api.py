"""The package's non-torch API on the host backend: load a generated sharded
checkpoint, sleep with each policy, wake, compare bytes; aliases; unknown
tags; progress and cancel; errors that change nothing."""

from __future__ import annotations

import os

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_file, write_sharded


@pytest.fixture
def pool():
    p = vw.Pool(backend="host")
    yield p
    p.close()


@pytest.fixture
def ckpt(tmp_path):
    tensors = llama_like()
    return write_sharded(tmp_path / "ckpt", tensors, shards=3), tensors


def contents(pool, dests):
    return {n: pool.read(d.ptr, d.bytes) for n, d in dests.items()}


def test_library_is_the_packaged_one_or_named():
    path = vw.library_path()
    assert path.endswith(".so")
    assert vw.version().count(".") == 2


def test_load_sharded_checkpoint_bytes_equal(pool, ckpt):
    path, tensors = ckpt
    seen = []
    dests, result = vw.load(path, pool, "weights", progress=lambda d, t: seen.append((d, t)))
    total = sum(len(t[2]) for t in tensors.values())
    assert result.bytes == total and result.seconds > 0 and result.gbps > 0
    assert seen and seen[-1] == (total, total)
    assert set(dests) == set(tensors)
    for name, (dtype, shape, data) in tensors.items():
        d = dests[name]
        assert (d.dtype, list(d.shape), d.bytes) == (dtype, shape, len(data))
        assert pool.read(d.ptr, d.bytes) == data, name


@pytest.mark.parametrize("strategy", sorted(vw.STRATEGIES))
def test_every_strategy_loads_the_same_bytes(pool, ckpt, strategy):
    path, tensors = ckpt
    dests, _ = vw.load(path, pool, "weights", strategy=strategy)
    assert contents(pool, dests) == {n: t[2] for n, t in tensors.items()}


@pytest.mark.parametrize("policy", ["offload", "discard", "reload", "offload_compressed"])
def test_sleep_with_each_policy_then_wake(pool, ckpt, policy):
    path, tensors = ckpt
    dests, _ = vw.load(path, pool, "weights")
    before = contents(pool, dests)
    pool.set_sleep_options(debug_fill=1, debug_fill_byte=0x5A)
    tracked = vw.tag_usage(pool.report(), "weights")["tracked_bytes"]
    assert tracked > 0

    cycle = pool.sleep(weights=policy)
    assert cycle[0]["name"] == "weights" and cycle[0]["policy"] == policy
    w = vw.tag_usage(pool.report(), "weights")
    assert w["asleep"] and w["tracked_bytes"] == 0
    state = {"offload": "offloaded_bytes", "discard": "discarded_bytes", "reload": "reloadable_bytes",
             "offload_compressed": "offloaded_bytes"}[policy]
    assert w[state] == tracked
    if policy == "offload_compressed":
        # The report gives the raw bytes the backup restores beside its size.
        assert w["host_backup_raw_bytes"] == tracked and 0 < w["host_backup_bytes"] <= tracked * 1.001
    some = next(iter(dests.values()))
    with pytest.raises(vw.VmmwError) as e:
        pool.read(some.ptr, 16)
    assert e.value.status_name == "VMMW_INVALID_STATE"

    pool.wake("weights")
    w = vw.tag_usage(pool.report(), "weights")
    assert not w["asleep"] and w["tracked_bytes"] == tracked
    after = contents(pool, dests)
    if policy == "discard":
        assert all(set(b) == {0x5A} for b in after.values()), "discarded memory comes back filled"
    else:
        assert after == before, f"{policy} lost bytes"


def test_bare_sleep_uses_each_tags_default_policy(pool, ckpt):
    path, tensors = ckpt
    dests, _ = vw.load(path, pool, "weights")
    kv = pool.alloc(3 << 20, "kv_cache")
    pool.write(kv, b"\x01" * 64)
    pool.set_default_policy("kv_cache", "discard")
    with pytest.raises(ValueError, match="unknown policy"):
        pool.set_default_policy("kv_cache", "dicsard")
    cycle = pool.sleep()
    assert {c["name"]: c["policy"] for c in cycle} == {"weights": "offload", "kv_cache": "discard"}
    rep = pool.report()
    assert all(t["asleep"] for t in rep["tags"])
    assert pool.sleep() == [], "nothing awake: nothing to do"
    pool.wake()
    assert contents(pool, dests) == {n: t[2] for n, t in tensors.items()}


def test_unknown_tag_at_sleep_and_wake_is_an_error_and_changes_nothing(pool, ckpt):
    path, _ = ckpt
    vw.load(path, pool, "weights")
    before = pool.report()["tags"]
    for act in (lambda: pool.sleep(weights="offload", weigths="offload"), lambda: pool.wake("weigths")):
        with pytest.raises(vw.VmmwError) as e:
            act()
        assert e.value.status_name == "VMMW_UNKNOWN_TAG"
        assert "weigths" in e.value.message and "weights" in e.value.message
    assert pool.report()["tags"] == before
    with pytest.raises(ValueError, match="unknown policy"):
        pool.sleep(weights="offlaod")
    assert pool.report()["tags"] == before


def test_reload_keeps_bytes_outside_the_plan(pool, ckpt):
    """Memory of a reload-tagged segment that the load did not write (a buffer
    the model computes itself, a block allocated later) survives the cycle."""
    path, tensors = ckpt
    dests, _ = vw.load(path, pool, "weights")
    extra = pool.alloc(4096, "weights")
    pattern = bytes(range(256)) * 16
    pool.write(extra, pattern)
    pool.sleep(weights="reload")
    w = vw.tag_usage(pool.report(), "weights")
    loaded = sum(d.bytes for d in dests.values())
    assert w["host_backup_bytes"] == w["live_bytes"] - loaded, "the host holds only the uncovered bytes"
    pool.wake("weights")
    assert contents(pool, dests) == {n: t[2] for n, t in tensors.items()}
    assert pool.read(extra, len(pattern)) == pattern, "bytes the plan does not cover were lost"


def test_reload_restores_weights_written_after_the_load(pool, ckpt):
    """An RL step writes new weights in place after the load: a Reload sleep
    and wake give back the written bytes, not the checkpoint's, whether the
    write was marked or only found by the sleep's hashes."""
    path, tensors = ckpt
    dests, _ = vw.load(path, pool, "weights")
    names = sorted(dests)
    found, marked = dests[names[0]], dests[names[1]]
    pool.write(found.ptr, b"\x11" * found.bytes)
    pool.mark_written(marked.ptr, marked.bytes)
    pool.write(marked.ptr, b"\x22" * marked.bytes)
    want = contents(pool, dests)
    pool.sleep(weights="reload")
    pool.wake("weights")
    assert contents(pool, dests) == want
    with pytest.raises(vw.VmmwError) as e:
        pool.mark_written(16, 4)
    assert e.value.status_name == "VMMW_UNKNOWN_POINTER"
    with pytest.raises(vw.VmmwError) as e:
        pool.mark_written(marked.ptr, marked.bytes + (1 << 30))
    assert e.value.status_name == "VMMW_INVALID_ARGUMENT"


def test_exact_alias_is_one_destination(pool, tmp_path):
    tensors = llama_like(tied=True)
    path = write_sharded(tmp_path / "tied", tensors, shards=2)
    with vw.Loader(path) as ld:
        dests = ld.allocate(pool, "weights")
        e = dests["model.embed_tokens.weight"]
        ld.register("lm_head.weight", e.ptr, e.dtype, e.shape)  # as state_dict() lists tied weights
        assert ld.destination("lm_head.weight").ptr == e.ptr
        assert len(ld.destinations()) == len(tensors), "listed once"
        assert ld.plan().missing == 0
        ld.load(pool)
        assert pool.read(e.ptr, e.bytes) == tensors["model.embed_tokens.weight"][2]
        # A partial overlap (a prefix of the embedding) stays an error, and registers nothing.
        with pytest.raises(vw.VmmwError) as err:
            ld.register("half", e.ptr, e.dtype, [e.shape[0] // 2, e.shape[1]])
        assert err.value.status_name == "VMMW_INVALID_ARGUMENT" and "overlaps" in err.value.message
        assert len(ld.destinations()) == len(tensors)


def test_cancel_and_callback_errors_propagate(pool, ckpt):
    path, _ = ckpt
    with vw.Loader(path) as ld:
        ld.allocate(pool, "weights")
        ld.cancel()  # before the load: it stops before any byte moves
        with pytest.raises(vw.VmmwError) as e:
            ld.load(pool)
        assert e.value.status_name == "VMMW_CANCELLED"

        class Stop(Exception):
            pass

        def boom(d, t):
            raise Stop("from the callback")

        with pytest.raises(Stop):
            ld.load(pool, progress=boom)
        assert ld.load(pool).bytes > 0, "a loader loads again after a cancel"


def test_preset_fuses_and_shards_for_tensor_parallel(pool, ckpt):
    path, tensors = ckpt
    for world in (1, 2):
        with vw.Loader(path) as ld:
            ld.preset("qwen2", tp_rank=0, tp_world=world, head_dim=16)
            dests = ld.allocate(pool, f"tp{world}")
            qkv = dests["model.layers.0.self_attn.qkv_proj.weight"]
            assert qkv.shape == ((4 + 2 + 2) * 16 // world, 64)
            ld.load(pool)
            q = tensors["model.layers.0.self_attn.q_proj.weight"][2]
            rows = 4 * 16 // world
            assert pool.read(qkv.ptr, rows * 64 * 2) == q[: rows * 64 * 2]


def test_bad_input_is_refused_clearly(pool, tmp_path):
    with pytest.raises(vw.VmmwError) as e:
        vw.Loader(tmp_path / "missing")
    assert e.value.status_name == "VMMW_IO" and "missing" in e.value.message
    with pytest.raises(ValueError, match="unknown backend"):
        vw.Pool(backend="gpu")
    with pytest.raises(ValueError, match="unknown sleep options"):
        pool.set_sleep_options(streems=2)
    with pytest.raises(vw.VmmwError) as e:
        pool.free(0x1234)
    assert e.value.status_name == "VMMW_UNKNOWN_POINTER"
    assert e.value.driver_code == 0  # only a VMMW_DRIVER_ERROR carries one


def test_report_table_names_every_tag(pool):
    pool.alloc(1 << 20, "weights")
    pool.alloc(1 << 20, "kv_cache")
    text = pool.report_table()
    assert "weights" in text and "kv_cache" in text and "total" in text
    assert set(pool.tags()) == {"weights", "kv_cache"}


def test_tag_scope_tags_allocations():
    with vw.tag_scope("scoped"):
        from vmmweights import tags

        assert tags.current() == "scoped"
    assert vw.tag_name(vw.tag_id("scoped")) == "scoped"


def test_reload_check_refuses_a_checkpoint_rewritten_in_place(pool, tmp_path):
    tensors = llama_like()
    path = tmp_path / "model.safetensors"
    write_file(path, tensors)
    dests, _ = vw.load(path, pool, "weights", reload_check=True)
    extra = pool.alloc(4096, "weights")
    pool.write(extra, b"\x07" * 4096)
    pool.sleep(weights="reload")
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-64:] = bytes(64)  # same size, same modification time: only the checksums see it
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(vw.VmmwError) as e:
        pool.wake("weights")
    assert e.value.status_name == "VMMW_CHECKPOINT_INVALID" and "model.safetensors" in e.value.message
    assert vw.tag_usage(pool.report(), "weights")["asleep"], "the refused tag stays asleep"
    pool.forget_reload("weights")
    pool.wake("weights")
    assert pool.read(extra, 4096) == b"\x07" * 4096, "bytes outside the plan come back"
    # Loaded again from the new file, the tag can sleep with reload once more.
    with vw.Loader(path) as ld:
        for n, d in dests.items():
            ld.register(n, d.ptr, d.dtype, d.shape)
        ld.load(pool)
    pool.sleep(weights="reload")
    pool.wake("weights")
    last = dests[list(tensors)[-1]]
    assert pool.read(last.ptr, last.bytes) == bytes(data[-last.bytes:]), "the new file's bytes"
    assert pool.read(extra, 4096) == b"\x07" * 4096


def test_remap_epoch_and_callback_follow_each_wake(pool):
    name = "remap-python"
    pool.alloc(1 << 20, tag=name)
    seen = []
    cb = vw.on_remap(lambda tag, epoch: seen.append((tag, epoch)) if tag == name else None)
    try:
        assert vw.remap_epoch(name) == 0
        for cycle in (1, 2):
            pool.sleep(**{name: "offload"})
            assert vw.remap_epoch(name) == cycle - 1, "a sleep does not remap"
            pool.wake(name)
            assert vw.remap_epoch(name) == cycle
        assert seen == [(name, 1), (name, 2)]
    finally:
        cb.remove()
    cb.remove()  # twice is a no-op
    pool.sleep(**{name: "offload"})
    pool.wake(name)
    assert len(seen) == 2, "a removed callback is not called"


def test_rdma_tag_is_set_before_its_first_allocation(pool):
    pool.set_tag_rdma("rdma-python")
    pool.alloc(1 << 20, tag="rdma-python")
    pool.alloc(1 << 20, tag="plain-python")
    with pytest.raises(vw.VmmwError) as e:
        pool.set_tag_rdma("plain-python")
    assert "before its first allocation" in str(e.value)
