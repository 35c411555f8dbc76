"""The torch_memory_saver shim's own code on the host backend, with a
stand-in for PyTorch (CI has none): the start-up routing (PyTorch's
allocator kept; with TMS_INIT_ENABLE every thread routed to a memory pool
over ours, the "default" tag for allocations outside regions, regions put
ahead of the route), regions landing in the shim's pool tags, pause/resume
on them only, disk ranges taken from PyTorch's memory pool of the tag, and
get_cpu_backup over the pool's backup.

Each case runs in a child process: the stand-in must never reach the other
tests (they would take it for PyTorch)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

# The child: a MagicMock as `torch` (recording what the shim asks of it), then the shim.
PRELUDE = textwrap.dedent(
    """
    import json, os, sys
    from unittest import mock
    torch = mock.MagicMock(name="torch")
    torch.cuda.current_device.return_value = 0
    torch.cuda.device_count.return_value = 2
    torch.device = type("device", (), {})  # a class, as isinstance needs
    sys.modules["torch"] = torch
    import vmmweights.torch as vt
    from vmmweights.torch import memory_saver as ms
    tms = ms.torch_memory_saver
    def report(device=0):
        return {t["tag"]: t["asleep"] for t in vt.pool(device).report()["tags"]}
    out = {}
    def torch_malloc(size, device=0):
        # the entry PyTorch's pluggable allocator calls: the tag of the thread's scope
        import ctypes
        fn = ctypes.CDLL(vt.library_path()).vmmw_torch_malloc
        fn.restype, fn.argtypes = ctypes.c_void_p, [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        return fn(size, device, None)
    """
)


def run_child(body, **env):
    child_env = dict(os.environ, VMMW_BACKEND="host")
    for k in ("VMMW_TMS_PRELOAD", "TMS_INIT_ENABLE", "TMS_INIT_ENABLE_CPU_BACKUP", "TMS_RETAIN_CPU_BACKUP"):
        child_env.pop(k, None)
    child_env.update(env)
    code = PRELUDE + textwrap.dedent(body) + "\nprint('RESULT' + json.dumps(out))\n"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(x for x in p.stdout.splitlines() if x.startswith("RESULT"))
    return json.loads(line[len("RESULT"):])


def test_without_the_preload_settings_nothing_is_rerouted():
    out = run_child(
        """
        out["swapped"] = torch.cuda.memory.change_current_allocator.call_count
        out["routed"] = torch._C._cuda_beginAllocateToPool.call_count
        out["mode"] = tms.hook_mode
        """
    )
    assert out == {"swapped": 0, "routed": 0, "mode": "torch"}


@pytest.mark.parametrize("env", [{"VMMW_TMS_PRELOAD": "1"}, {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}])
def test_preload_start_keeps_pytorchs_allocator(env):
    out = run_child(
        """
        import vmmweights.tags as tags
        begin = torch._C._cuda_beginAllocateToPool
        out["swapped"] = torch.cuda.memory.change_current_allocator.call_count
        out["routed"] = [c[0][0] for c in begin.call_args_list]
        out["settings"] = [c[0][0] for c in torch.cuda.memory._set_allocator_settings.call_args_list]
        out["mode"] = tms.hook_mode
        out["outside_regions"] = tags.current()
        tms.hook_mode = "preload"  # started already: nothing more
        out["routed_again"] = begin.call_count
        try:
            tms.hook_mode = "ld_preload"
        except ValueError as e:
            out["bad"] = str(e)
        """,
        **env,
    )
    assert out["swapped"] == 0, "PyTorch's caching allocator stays"
    assert out["mode"] == "preload" and "'ld_preload'" in out["bad"]
    if "TMS_INIT_ENABLE" in env:
        assert out["routed"] == [0, 1], "every device routed, for every thread"
        assert out["routed_again"] == 2
        assert out["settings"] == ["max_split_size_mb:1024"]
        assert out["outside_regions"] == "tms:default/cpu"
    else:
        assert out["routed"] == [] and out["settings"] == [] and out["outside_regions"] == "default"


def test_init_enable_puts_regions_and_graphs_ahead_of_the_route_and_disable_beside_it():
    out = run_child(
        """
        import contextlib
        order = []
        C = torch._C
        C._cuda_beginAllocateToPool.side_effect = lambda d, i: order.append(("route on", d))
        C._cuda_endAllocateToPool.side_effect = lambda d, i: order.append(("route off", d))
        def use_mem_pool(mp, device=None):
            order.append(("region", device))
            return contextlib.nullcontext()
        torch.cuda.memory.use_mem_pool.side_effect = use_mem_pool
        def graph(g, pool=None, **kw):
            order.append(("graph", pool))
            return contextlib.nullcontext()
        torch.cuda.graph.side_effect = graph
        with tms.region(tag="kv"):
            order.append("inside")
        out["region"], order[:] = list(order), []
        with tms.cuda_graph(mock.MagicMock(), tag="g"):
            order.append("inside")
        out["graph"], order[:] = [o if o[0] != "graph" else "graph" for o in order], []
        with tms.disable():
            order.append("inside")
        out["disable"], order[:] = list(order), []
        out["emptied"] = torch.cuda.memory.empty_cache.call_count
        tms._route.stop()
        with tms.region(tag="kv"):
            pass
        out["stopped"] = list(order)
        """,
        TMS_INIT_ENABLE="1",
    )
    as_lists = lambda xs: [list(x) if isinstance(x, (list, tuple)) else x for x in xs]
    assert as_lists(out["region"]) == [["route off", 0], ["region", 0], ["route on", 0], "inside"]
    assert as_lists(out["graph"]) == [["route off", 0], "graph", ["route on", 0], "inside"]
    assert as_lists(out["disable"]) == [["route off", 0], ["route off", 1], "inside", ["route on", 0], ["route on", 1]]
    assert out["emptied"] == 1, "what disable() cached is returned at its end"
    assert as_lists(out["stopped"]) == [["route off", 0], ["route off", 1], ["region", 0]], "stopped for good"


def test_routed_regions_tag_allocations_and_pause_only_the_shims_tags():
    out = run_child(
        """
        import vmmweights.tags as tags
        with tms.region(tag="weights", enable_cpu_backup=True):
            out["inside"] = tags.current()
            mine = torch_malloc(1 << 20)  # PyTorch's call into our allocator
        theirs = vt.pool().alloc(1 << 20, "weights")
        vt.pool().write(mine, b"M" * 8)
        tms.pause()
        out["paused"] = report()
        tms.resume()
        out["resumed"] = report()
        out["bytes"] = vt.pool().read(mine, 8).decode()
        with tms.disable():
            out["disabled"] = tags.current()
        try:
            tms.pause("kv_cache")
        except ms.ForeignTagError as e:
            out["foreign"] = str(e)
        """,
        VMMW_TMS_PRELOAD="1",
    )
    assert out["inside"] == "tms:weights/cpu"
    assert out["paused"] == {"tms:weights/cpu": True, "weights": False}
    assert out["resumed"] == {"tms:weights/cpu": False, "weights": False}
    assert out["bytes"] == "MMMMMMMM"
    assert out["disabled"] == "default"
    assert "'kv_cache'" in out["foreign"]


def test_torch_mode_disk_backup_takes_its_ranges_from_the_tags_memory_pool(tmp_path):
    out = run_child(
        f"""
        tms.set_disk_backup_dir({str(tmp_path)!r})
        with tms.region(tag="spill", enable_disk_backup=True):
            pass
        mp = vt.mem_pool("tms:spill/disk", 0)
        mp.id = (7, 1)
        ptr = vt.pool().alloc(3 << 20, "tms:spill/disk")
        vt.pool().write(ptr, b"abc" * (1 << 20))
        torch.cuda.memory_snapshot.return_value = [
            {{"device": 0, "address": ptr, "total_size": 3 << 20, "segment_pool_id": (7, 1)}},
            {{"device": 0, "address": 1, "total_size": 5, "segment_pool_id": (0, 0)}},
        ]
        tms.pause("spill")
        out["files"] = sorted(os.path.getsize(os.path.join({str(tmp_path)!r}, f)) for f in os.listdir({str(tmp_path)!r}))
        tms.resume("spill")
        out["back"] = vt.pool().read(ptr, 6).decode()
        out["left"] = os.listdir({str(tmp_path)!r})
        """
    )
    assert out == {"files": [3 << 20], "back": "abcabc", "left": []}


def test_get_cpu_backup_reads_the_pools_backup_and_is_none_where_upstream_holds_none():
    out = run_child(
        """
        import ctypes
        def tensor(ptr, n):
            x = mock.MagicMock()
            x.device.index = 0
            x.untyped_storage.return_value.data_ptr.return_value = ptr
            x.untyped_storage.return_value.nbytes.return_value = n
            return x
        def seen():
            # the host memory get_cpu_backup wrapped (torch.frombuffer's argument)
            buf = torch.frombuffer.call_args[0][0]
            return ctypes.addressof(buf), bytes(buf)
        with tms.region(tag="w", enable_cpu_backup=True):
            pass
        ptr = vt.pool().alloc(1 << 20, "tms:w/cpu")
        vt.pool().write(ptr, b"0123456789" * 6 + b"abcd")
        foreign = vt.pool().alloc(1 << 20, "theirs")
        vt.pool().write(foreign, b"F" * 64)
        vt.pool().sleep({"theirs": "offload"})
        x, y = tensor(ptr, 64), tensor(foreign, 64)
        out["awake"] = tms.get_cpu_backup(x) is None
        tms.pause("w")
        view = torch.frombuffer.return_value
        out["copy"] = tms.get_cpu_backup(x) is view.clone.return_value.view.return_value.as_strided.return_value
        at, data = seen()
        out["bytes"] = data.decode()
        out["at_backup"] = at == vt.pool().backup_view(ptr, 64)[1]
        out["zero_copy"] = tms.get_cpu_backup(x, zero_copy=True) is view.view.return_value.as_strided.return_value
        out["same_place"] = seen()[0] == at
        out["asleep_after_read"] = report()["tms:w/cpu"]
        out["foreign"] = tms.get_cpu_backup(y) is None  # asleep with a backup, but not the shim's
        tms.retain_cpu_backup = True
        tms.resume("w")
        out["retained"] = tms.get_cpu_backup(x, zero_copy=True) is not None and seen()[0] == at
        tms.retain_cpu_backup = False
        tms.pause("w")
        tms.resume("w")
        out["released"] = tms.get_cpu_backup(x) is None and tms.get_cpu_backup(x, zero_copy=True) is None
        """
    )
    assert out["awake"] and out["copy"] and out["zero_copy"] and out["foreign"]
    assert out["bytes"] == "0123456789" * 6 + "abcd", "the paused bytes, from the host backup"
    assert out["at_backup"] and out["same_place"], "a view of the pool's backup itself"
    assert out["asleep_after_read"] is True
    assert out["retained"], "a retained backup is read after resume, at the same address"
    assert out["released"], "a releasing resume leaves no backup to read"


def test_nested_region_under_init_enable_keeps_the_outer_tag_after_it():
    out = run_child(
        """
        import vmmweights.tags as tags
        weight = torch_malloc(1 << 20)  # outside any region: tag "default" with a CPU backup
        vt.pool().write(weight, b"W" * 8)
        with tms.region(tag="grad_buffer", enable_cpu_backup=False):
            out["inside"] = tags.current()
            torch_malloc(1 << 20)
        out["after"] = tags.current()
        tms.pause()
        out["paused"] = report()
        tms.resume()
        out["bytes"] = vt.pool().read(weight, 8).decode()
        rep = {t["tag"]: t for t in vt.pool().report()["tags"]}
        out["backup_left"] = rep["tms:default/cpu"]["host_backup_bytes"]
        """,
        TMS_INIT_ENABLE="1",
        TMS_INIT_ENABLE_CPU_BACKUP="1",
    )
    assert out["inside"] == "tms:grad_buffer/none" and out["after"] == "tms:default/cpu"
    assert out["paused"] == {"tms:default/cpu": True, "tms:grad_buffer/none": True}
    assert out["bytes"] == "WWWWWWWW" and out["backup_left"] == 0


def test_upstreams_private_names_report_the_shims_own_state():
    """What upstream's suite reads through torch_memory_saver._impl: the
    per-thread region settings (TMS_INIT_* at the start, a region's inside
    it, restored after), a region's MemPool popped by upstream's key, and
    pause/resume through the C names."""
    out = run_child(
        """
        torch.xpu.is_available.return_value = False
        torch.version.hip = None
        cdll = tms._impl._binary_wrapper.cdll
        start = [cdll.tms_get_interesting_region(), cdll.tms_get_enable_cpu_backup(),
                 cdll.tms_get_current_tag().decode(), cdll.tms_get_cpu_backup_backend().decode()]
        out["start"] = start
        with tms.region(tag="grad", enable_cpu_backup=False):
            out["grad"] = [cdll.tms_get_interesting_region(), cdll.tms_get_enable_cpu_backup(),
                           cdll.tms_get_current_tag().decode(), cdll.tms_get_cpu_backup_backend().decode()]
        with tms.region(enable_cpu_backup=True, cpu_backup_backend="mmap"):
            out["mmap"] = [cdll.tms_get_cpu_backup_backend().decode()]
            import vmmweights.tags as tags
            out["mmap_tag"] = tags.current()
        out["after"] = [cdll.tms_get_current_tag().decode(), cdll.tms_get_cpu_backup_backend().decode()]
        with tms._impl._with_region_config(tag="t", enable_cpu_backup=True, cpu_backup_backend="pinned"):
            out["config_only"] = [cdll.tms_get_current_tag().decode(), cdll.tms_get_enable_cpu_backup()]
        mp = tms._impl._mem_pools[("w", True, False, "pinned", 0)]
        out["same_pool"] = mp is vt.mem_pool("tms:w/cpu", 0)
        out["popped"] = tms._impl._mem_pools.pop(("w", True, False, "pinned", 0)) is mp
        out["fresh_after_pop"] = (0, "tms:w/cpu") not in vt._pools
        try:
            tms._impl._mem_pools.pop(("nothing", False, False, "", 0))
        except KeyError:
            out["missing"] = True
        out["retain"] = [cdll.tms_get_retain_cpu_backup()]
        cdll.tms_set_retain_cpu_backup(True)
        out["retain"].append(tms.retain_cpu_backup)
        with tms.region(tag="w", enable_cpu_backup=True):
            p = torch_malloc(1 << 20)
        vt.pool().write(p, b"W" * 8)
        out["pause"] = cdll.tms_pause(b"w")
        out["paused"] = report()["tms:w/cpu"]
        out["resume"] = cdll.tms_resume(None)
        out["back"] = vt.pool().read(p, 8).decode()
        """,
        TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1",
    )
    assert out["start"] == [True, True, "default", "pinned"]
    assert out["grad"] == [True, False, "grad", "pinned"]
    assert out["mmap"][0] == "mmap" and out["mmap_tag"] == "tms:default/mmap"
    assert out["after"] == ["default", "pinned"]
    assert out["config_only"] == ["t", True]
    assert out["same_pool"] and out["popped"] and out["fresh_after_pop"] and out["missing"]
    assert out["retain"] == [False, True]
    assert (out["pause"], out["paused"], out["resume"], out["back"]) == (0, True, 0, "WWWWWWWW")


def test_a_releasing_resume_keeps_the_pinned_memory_and_mmap_gives_it_back():
    out = run_child(
        """
        torch.xpu.is_available.return_value = False
        torch.version.hip = None
        with tms.region(tag="w", enable_cpu_backup=True):
            p = torch_malloc(4 << 20)
        vt.pool().write(p, b"P" * 8)
        tms.pause()
        tms.resume()
        out["pinned_kept"] = vt.pool().release_backup()
        with tms.region(tag="m", enable_cpu_backup=True, cpu_backup_backend="mmap"):
            q = torch_malloc(4 << 20)
        tms.pause()
        tms.resume()
        out["mmap_left"] = vt.pool().release_backup()
        out["back"] = vt.pool().read(p, 8).decode()
        """
    )
    assert out["pinned_kept"] >= 4 << 20, "the default keeps the arena for the next pause"
    assert out["mmap_left"] == 0, "an mmap region's resume unpins what holds nothing"
    assert out["back"] == "PPPPPPPP"


def test_cumem_keep_tags_and_discard_as_vllm_has_them():
    out = run_child(
        """
        from vmmweights.torch.cumem import CuMemAllocator
        a = CuMemAllocator.get_instance()
        with a.use_memory_pool(tag="weights"):
            w = torch_malloc(1 << 20)
        with a.use_memory_pool(tag="kv_cache"):
            kv = torch_malloc(1 << 20)
        vt.pool().write(w, b"W" * 4)
        vt.pool().write(kv, b"K" * 4)
        a.sleep(offload_tags=("weights",), keep_tags=("kv_cache",))
        out["kept"] = report()
        out["kv"] = vt.pool().read(kv, 4).decode()
        a.sleep(offload_tags=("kv_cache",))
        out["both"] = report()
        a.wake_up()
        out["back"] = vt.pool().read(w, 4).decode() + vt.pool().read(kv, 4).decode()
        try:
            a.sleep(offload_tags=("weights",), keep_tags=("weights",))
        except AssertionError:
            out["disjoint"] = True
        a.discard("kv_cache")
        out["discarded"] = report()
        a.wake_up()
        out["woke"] = report()
        """
    )
    assert out["kept"] == {"cumem:weights": True, "cumem:kv_cache": False}
    assert out["kv"] == "KKKK"
    assert out["both"] == {"cumem:weights": True, "cumem:kv_cache": True}
    assert out["back"] == "WWWWKKKK"
    assert out["disjoint"]
    assert out["discarded"] == {"cumem:weights": False, "cumem:kv_cache": True}
    assert out["woke"] == {"cumem:weights": False, "cumem:kv_cache": False}
