"""The torch_memory_saver shim's own code on the host backend, with a
stand-in for PyTorch (CI has none): the start-up routing (the process's
allocator swapped for ours at import, the "default" tag for allocations
outside regions), regions landing in the shim's pool tags, pause/resume on
them only, and disk ranges taken from PyTorch's memory pool of the tag.

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
        out["mode"] = tms.hook_mode
        """
    )
    assert out == {"swapped": 0, "mode": "torch"}


@pytest.mark.parametrize("env", [{"VMMW_TMS_PRELOAD": "1"}, {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}])
def test_preload_start_swaps_the_allocator_at_import(env):
    out = run_child(
        """
        import vmmweights.tags as tags
        swap = torch.cuda.memory.change_current_allocator
        out["swapped"] = swap.call_count
        out["ours"] = swap.call_args[0][0] is vt.allocator()
        out["mode"] = tms.hook_mode
        out["outside_regions"] = tags.current()
        tms.hook_mode = "preload"  # already routed: nothing more
        out["swapped_again"] = swap.call_count
        """,
        **env,
    )
    assert out["swapped"] == 1 and out["ours"] and out["mode"] == "preload" and out["swapped_again"] == 1
    want = "tms:default/cpu" if "TMS_INIT_ENABLE" in env else "default"
    assert out["outside_regions"] == want


def test_hook_mode_preload_after_the_first_allocation_says_how_to_start():
    out = run_child(
        """
        torch.cuda.memory.change_current_allocator.side_effect = RuntimeError("Can't swap an already initialized allocator")
        try:
            tms.hook_mode = "preload"
        except RuntimeError as e:
            out["error"] = str(e)
        try:
            tms.hook_mode = "ld_preload"
        except ValueError as e:
            out["bad"] = str(e)
        """
    )
    assert "configure_subprocess()" in out["error"] and "before the process's first CUDA allocation" in out["error"]
    assert "'ld_preload'" in out["bad"]


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


def test_get_cpu_backup_copies_a_paused_tensor_and_is_none_where_upstream_holds_none():
    out = run_child(
        """
        import ctypes
        def tensor(ptr, n):
            x = mock.MagicMock()
            x.device.index = 0
            x.untyped_storage.return_value.data_ptr.return_value = ptr
            x.untyped_storage.return_value.nbytes.return_value = n
            return x
        host = ctypes.create_string_buffer(64)
        torch.empty.return_value.data_ptr.return_value = ctypes.addressof(host)
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
        out["copy_is_view"] = tms.get_cpu_backup(x) is torch.empty.return_value.view.return_value.as_strided.return_value
        out["bytes"] = host.raw.decode()
        out["asleep_after_read"] = report()["tms:w/cpu"]
        out["foreign"] = tms.get_cpu_backup(y) is None  # asleep with a backup, but not the shim's
        try:
            tms.get_cpu_backup(x, zero_copy=True)
        except NotImplementedError as e:
            out["zero_copy"] = str(e)
        tms.resume("w")
        out["resumed"] = tms.get_cpu_backup(x) is None
        tms.retain_cpu_backup = True
        try:
            tms.get_cpu_backup(x)
        except NotImplementedError as e:
            out["retained"] = str(e)
        """
    )
    assert out["awake"] and out["copy_is_view"] and out["resumed"] and out["foreign"]
    assert out["bytes"] == "0123456789" * 6 + "abcd", "the paused bytes, from the host backup"
    assert out["asleep_after_read"] is True
    assert "zero_copy" in out["zero_copy"] and "'w'" in out["zero_copy"]
    assert "retained backup" in out["retained"]


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
