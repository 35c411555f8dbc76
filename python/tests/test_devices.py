"""Several simulated devices on the host backend: a replica load read once
from host memory, replicas slept on one host backup and woken on every
device from it (bytes exact, nothing lost when a device has no room), and the
checkpoint fan-out wake."""

from __future__ import annotations

import pytest

import vmmweights as vw
from safetensors_writer import llama_like, write_sharded


@pytest.fixture
def pools():
    ps = [vw.Pool(backend="host", device=d) for d in range(3)]
    yield ps
    for p in ps:
        p.close()


def test_replicas_sleep_on_one_backup_and_wake_everywhere(pools):
    data = [bytes((i * 31 + k) % 256 for i in range(n)) for k, n in enumerate((1000, 300_000, 5000))]
    ptrs = []
    for p in pools:
        row = []
        for d in data:
            ptr = p.alloc(len(d), "py-replicas")
            p.write(ptr, d)
            row.append(ptr)
        ptrs.append(row)
    group = [(p, "py-replicas") for p in pools]
    with pytest.raises(vw.VmmwError) as e:
        vw.sleep_replicas([group[0], group[0]])
    assert e.value.status_name == "VMMW_INVALID_ARGUMENT"
    with pytest.raises(vw.VmmwError) as e:
        vw.wake_replicas_from_backup(group)
    assert e.value.status_name == "VMMW_INVALID_STATE"
    # The former name still works through 0.x, and warns.
    with pytest.warns(DeprecationWarning, match="wake_replicas_from_backup"), pytest.raises(vw.VmmwError) as e:
        vw.wake_replicas(group)
    assert e.value.status_name == "VMMW_INVALID_STATE"

    s = vw.sleep_replicas(group)
    assert s["released_bytes"] == 3 * s["backup_bytes"] > 0
    with pytest.raises(vw.VmmwError):
        pools[2].read(ptrs[2][0], 8)
    w = vw.wake_replicas_from_backup(group, copy_piece_bytes=1 << 16)
    assert w["host_bytes"] == s["backup_bytes"], "host memory read once"
    assert w["peer_bytes"] == 2 * s["backup_bytes"]
    assert w["direct_pairs"] == 0
    for p, row in zip(pools, ptrs):
        for ptr, d in zip(row, data):
            assert p.read(ptr, len(d)) == d

    vw.sleep_replicas(group)
    w = vw.wake_replicas_from_backup(group, peer_copies=False)
    assert w["host_bytes"] == 3 * s["backup_bytes"] and w["direct_pairs"] == 6
    assert pools[1].read(ptrs[1][1], len(data[1])) == data[1]

    # The holder's backup compressed: every device decodes a share of its frames.
    with pytest.raises(vw.VmmwError) as e:
        vw.sleep_replicas(group, holder_policy="reload")
    assert e.value.status_name == "VMMW_INVALID_ARGUMENT"
    with pytest.raises(ValueError):
        vw.sleep_replicas(group, holder_policy="zip")
    assert pools[2].read(ptrs[2][0], len(data[0])) == data[0], "nothing slept"
    c = vw.sleep_replicas(group, holder_policy="offload_compressed")
    assert c["released_bytes"] == s["released_bytes"] and c["backup_bytes"] > 0
    w = vw.wake_replicas_from_backup(group)
    assert w["host_bytes"] == c["backup_bytes"] and w["delivered_bytes"] == c["released_bytes"]
    for p, row in zip(pools, ptrs):
        for ptr, d in zip(row, data):
            assert p.read(ptr, len(d)) == d


def test_replicas_load_once_and_wake_from_the_checkpoint(pools, tmp_path):
    tensors = llama_like()
    path = write_sharded(tmp_path / "ckpt", tensors, shards=2)
    loaders = [vw.Loader(path) for _ in pools]
    try:
        dests = [ld.allocate(p, "py-multi") for ld, p in zip(loaders, pools)]
        r = vw.load_devices(loaders, pools, "replicas")
        assert r["delivered_bytes"] == 3 * r["host_bytes"] > 0
        want = {n: pools[0].read(d.ptr, d.bytes) for n, d in dests[0].items()}
        for p in pools:
            p.sleep({"py-multi": "discard"})
        w = vw.wake_replicas_by_reload(loaders, pools)
        assert w["host_bytes"] == r["host_bytes"]
        for p in pools:
            p.sleep({"py-multi": "discard"})
        with pytest.warns(DeprecationWarning, match="wake_replicas_by_reload"):
            w = vw.wake_replicas_from_checkpoint(loaders, pools)
        assert w["host_bytes"] == r["host_bytes"]
        for p, ds in zip(pools, dests):
            assert {n: p.read(d.ptr, d.bytes) for n, d in ds.items()} == want
        with pytest.raises(ValueError):
            vw.load_devices(loaders, pools, "mirror")
        with pytest.raises(ValueError):
            vw.load_devices(loaders[:1], pools)
    finally:
        for ld in loaders:
            ld.close()
