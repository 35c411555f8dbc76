"""GPU: the two drop-in shims running unchanged torch_memory_saver-style and
vLLM-style code (only the import differs)."""

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the shim tests need a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models as hf  # noqa: E402
import vmmweights.torch as vt  # noqa: E402

MiB = hf.MiB


def test_torch_memory_saver_style():
    from vmmweights.torch.memory_saver import torch_memory_saver  # the one changed line

    cfg = hf.qwen2_tied()
    torch.manual_seed(0)
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = hf.build(cfg).to("cuda").eval()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.full((32 * MiB // 4,), 2.0, device="cuda")
    ids = hf.inputs(cfg)
    with torch.no_grad():
        want = model(ids).logits.clone()

    free0, _ = torch.cuda.mem_get_info()
    torch_memory_saver.pause()
    free1, _ = torch.cuda.mem_get_info()
    assert free1 - free0 >= 32 * MiB + sum(p.numel() * 2 for p in model.parameters()) - 4 * MiB
    torch_memory_saver.resume()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want), "weights with cpu backup must survive"

    torch_memory_saver.pause("kv_cache")
    torch_memory_saver.resume("kv_cache")
    kv.fill_(1.0)
    assert kv.sum().item() == kv.numel()

    # A graph whose memory pauses (torch_memory_saver.cuda_graph).
    static_in = torch.randn(16, 512, device="cuda")
    lin = torch.nn.Linear(512, 512, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        lin(static_in)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch_memory_saver.cuda_graph(g, tag="graph"):
        out = lin(static_in).relu()
    g.replay()
    torch.cuda.synchronize()
    ref = out.clone()
    torch_memory_saver.pause("graph")
    torch_memory_saver.resume("graph")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)

    del model, kv, g, out, lin
    gc.collect()
    vt.release_pools()
    vt.trim()


def test_vllm_cumem_allocator_style():
    from vmmweights.torch.cumem import CuMemAllocator  # the one changed line

    allocator = CuMemAllocator.get_instance()
    assert CuMemAllocator.get_instance() is allocator
    cfg = hf.llama_untied()
    torch.manual_seed(0)
    with allocator.use_memory_pool(tag="weights"):
        model = hf.build(cfg).to("cuda").eval()
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty((48 * MiB // 2,), dtype=torch.bfloat16, device="cuda")
    usage = allocator.get_current_usage()
    assert usage >= 48 * MiB + sum(p.numel() * 2 for p in model.parameters())
    ids = hf.inputs(cfg)
    with torch.no_grad():
        want = model(ids).logits.clone()

    free0, _ = torch.cuda.mem_get_info()
    allocator.sleep(offload_tags=("weights",))
    free1, _ = torch.cuda.mem_get_info()
    assert free1 - free0 >= usage - 8 * MiB, (free1 - free0, usage)
    allocator.wake_up(tags=["weights"])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)
    allocator.wake_up(tags=["kv_cache"])
    kv.fill_(1.0)
    assert kv.float().sum().item() == kv.numel()
    allocator.sleep()  # level 2 in vLLM: nothing offloaded but the default tag
    allocator.wake_up()
    del model, kv
    gc.collect()
    vt.release_pools()
    vt.trim()


def _asleep(device=0):
    return {t["tag"]: t["asleep"] for t in vt.report(device)["tags"]}


def _backup(tag, device=0):
    return next(t["host_backup_bytes"] for t in vt.report(device)["tags"] if t["tag"] == tag)


def test_memory_saver_acts_only_on_its_own_tags_and_releases_its_backup(tmp_path):
    from vmmweights.torch.memory_saver import ForeignTagError, torch_memory_saver as tms

    with vt.use_pool("weights"):
        theirs = torch.full((4 * MiB,), 3, dtype=torch.uint8, device="cuda")
    with tms.region(tag="weights", enable_cpu_backup=True):
        mine = torch.full((8 * MiB,), 7, dtype=torch.uint8, device="cuda")
    with pytest.raises(ForeignTagError, match="'kv_cache_never_made'"):
        tms.pause("kv_cache_never_made")
    tms.pause()
    assert _asleep()["tms:weights/cpu"] and not _asleep()["weights"]
    assert int(theirs.sum()) == 3 * theirs.numel(), "a foreign tag stays awake and intact"
    assert _backup("tms:weights/cpu") >= mine.numel()
    vt.sleep(weights="offload")
    tms.resume()
    assert _asleep()["weights"], "resume() wakes only the shim's own tags"
    vt.wake("weights")
    assert int(mine.sum()) == 7 * mine.numel()
    assert _backup("tms:weights/cpu") == 0, "upstream's default: the backup goes after resume"

    tms.retain_cpu_backup = True
    try:
        tms.pause("weights")
        tms.resume("weights")
        assert _backup("tms:weights/cpu") >= mine.numel(), "retained"
    finally:
        tms.retain_cpu_backup = False

    tms.set_disk_backup_dir(str(tmp_path))
    with tms.region(tag="spilled", enable_disk_backup=True):
        spilled = torch.arange(3 * MiB, dtype=torch.int32, device="cuda")
    want = spilled.clone().cpu()
    tms.pause("spilled")
    assert sum(p.stat().st_size for p in tmp_path.iterdir()) >= spilled.numel() * 4
    tms.resume("spilled")
    assert torch.equal(spilled.cpu(), want)
    del theirs, mine, spilled
    gc.collect()
    vt.release_pools()
    vt.trim()


def test_cumem_allocator_acts_only_on_its_own_tags():
    from vmmweights.torch.cumem import CuMemAllocator, ForeignTagError

    allocator = CuMemAllocator.get_instance()
    with vt.use_pool("kv_cache"):
        theirs = torch.full((4 * MiB,), 5, dtype=torch.uint8, device="cuda")
    with allocator.use_memory_pool(tag="weights"):
        mine = torch.full((4 * MiB,), 9, dtype=torch.uint8, device="cuda")
    with pytest.raises(ForeignTagError, match="'nope'"):
        allocator.sleep(offload_tags=("weights", "nope"))
    with pytest.raises(ForeignTagError, match="'nope'"):
        allocator.wake_up(tags=["nope"])
    allocator.sleep(offload_tags=("weights",))
    assert not _asleep()["kv_cache"] and int(theirs.sum()) == 5 * theirs.numel()
    vt.sleep(kv_cache="offload")
    allocator.wake_up()
    assert _asleep()["kv_cache"], "wake_up() wakes only the allocator's own tags"
    vt.wake("kv_cache")
    assert int(mine.sum()) == 9 * mine.numel()
    del theirs, mine
    gc.collect()
    vt.release_pools()
    vt.trim()


_PRELOAD_CHILD = r"""
import threading, torch
import vmmweights.torch as vt
from vmmweights.torch.memory_saver import torch_memory_saver as tms

MiB = 1 << 20
assert tms.hook_mode == "preload"

def live(tag):
    return sum(t["live_bytes"] for t in vt.report()["tags"] if t["tag"] == tag)

DEFAULT = "tms:default/cpu"
a = torch.full((64 * MiB,), 5, dtype=torch.uint8, device="cuda")
assert live(DEFAULT) >= 64 * MiB, vt.report_table()

# Another thread, no region: the route takes it too.
out = {}
def other():
    out["t"] = torch.full((32 * MiB,), 6, dtype=torch.uint8, device="cuda")
before = live(DEFAULT)
th = threading.Thread(target=other); th.start(); th.join()
assert live(DEFAULT) >= before + 32 * MiB, vt.report_table()

# A region's allocations go to its tag, ahead of the route.
with tms.region(tag="w"):
    w = torch.full((16 * MiB,), 7, dtype=torch.uint8, device="cuda")
assert live("tms:w/none") >= 16 * MiB, vt.report_table()

# PyTorch's caching stays: a freed temporary is cached, not returned at once.
t = torch.empty((256 * MiB,), dtype=torch.uint8, device="cuda")
cached = live(DEFAULT)
del t
assert live(DEFAULT) == cached, "the caching allocator keeps the freed block"
t = torch.empty((256 * MiB,), dtype=torch.uint8, device="cuda")
assert live(DEFAULT) == cached, "and hands it out again"
del t

# disable(): PyTorch's own memory, returned at the block's end.
with tms.disable():
    d = torch.empty((128 * MiB,), dtype=torch.uint8, device="cuda")
    assert live(DEFAULT) <= cached
    del d
tms.pause()
tms.resume()
assert int(a.sum()) == 5 * a.numel() and int(out["t"].sum()) == 6 * out["t"].numel()
print("preload route ok")
"""


def test_memory_saver_preload_route_keeps_pytorchs_caching(tmp_path):
    """TMS_INIT_ENABLE: every thread's allocations outside regions go to the
    shim's "default" tag through a PyTorch memory pool, regions go ahead of
    it, PyTorch still caches freed blocks, disable() stays out of our pools,
    and the process exits cleanly (the route ends before PyTorch's teardown)."""
    import subprocess
    import sys

    env = dict(os.environ, TMS_INIT_ENABLE="1", TMS_INIT_ENABLE_CPU_BACKUP="1")
    r = subprocess.run([sys.executable, "-c", _PRELOAD_CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "preload route ok" in r.stdout, r.stdout + r.stderr
