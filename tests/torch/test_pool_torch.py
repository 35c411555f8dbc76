"""GPU tests: PyTorch tensors in vmmweights memory through CUDAPluggableAllocator + MemPool.

Run with the vmmweights package importable (installed, or PYTHONPATH=python with VMMW_LIB).
Skips (with the reason) without PyTorch, CUDA or transformers.
"""

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the PyTorch pool tests need a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)

import vmmweights.torch as vt  # noqa: E402

MiB = 1 << 20


def settle():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def small_llama():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    cfg = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=4,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16), cfg


def tensor_bytes(model):
    return sum(t.numel() * t.element_size() for t in list(model.parameters()) + list(model.buffers()))


def test_llama_weights_in_the_pool_are_reported_and_come_back():
    model, cfg = small_llama()  # built on the CPU: only the move to CUDA allocates in the pool
    settle()
    free0, _ = torch.cuda.mem_get_info()
    allocated0 = torch.cuda.memory_allocated()
    reserved0 = torch.cuda.memory_reserved()
    before = vt.tag_usage(vt.report(), "weights")

    with vt.use_pool("weights"):
        model = model.to("cuda")
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    allocated_delta = torch.cuda.memory_allocated() - allocated0
    reserved_delta = torch.cuda.memory_reserved() - reserved0
    w = vt.tag_usage(vt.report(), "weights")
    live = w["live_bytes"] - before["live_bytes"]
    tracked = w["tracked_bytes"] - before["tracked_bytes"]
    device_delta = free0 - free1
    weights = tensor_bytes(model)
    print(
        f"\nweights {weights / MiB:.1f} MiB; torch allocated +{allocated_delta / MiB:.1f} MiB, "
        f"reserved +{reserved_delta / MiB:.1f} MiB; vmmw live +{live / MiB:.1f} MiB, "
        f"tracked +{tracked / MiB:.1f} MiB, segments {w['segments']}; "
        f"device used +{device_delta / MiB:.1f} MiB"
    )
    print(vt.report_table())

    assert allocated_delta >= weights
    # Every segment PyTorch holds for the pool is one live block of ours, fully backed.
    assert live == reserved_delta, "our live bytes must equal PyTorch's reserved delta"
    assert tracked == live, "dedicated segments are fully backed"
    # PyTorch splits our segments: its waste is bounded by its segment rounding.
    assert allocated_delta <= live <= allocated_delta + max(allocated_delta // 20, 64 * MiB)
    # The device's free memory dropped by what we track (other allocators idle meanwhile).
    assert abs(device_delta - tracked) <= 32 * MiB, (device_delta, tracked)

    # A forward pass runs on weights in our memory.
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda")
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (2, 64, cfg.vocab_size)
    assert torch.isfinite(logits.float()).all()

    # The forward pass itself takes device memory outside any allocator (lazily
    # loaded kernel modules, the cuBLAS handle), so "memory is back" is measured
    # from here: deleting and trimming must return what we tracked.
    torch.cuda.synchronize()
    free_loaded, _ = torch.cuda.mem_get_info()
    del model, logits, ids
    vt.release_pools()
    released = vt.trim()
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    settle()
    after = vt.tag_usage(vt.report(), "weights")
    free2, _ = torch.cuda.mem_get_info()
    print(
        f"trim released {released / MiB:.1f} MiB; device free rose {(free2 - free_loaded) / MiB:.1f} MiB "
        f"(tracked was {tracked / MiB:.1f} MiB); {(free2 - free0) / MiB:+.1f} MiB against the start"
    )
    assert after["live_bytes"] == before["live_bytes"], after
    assert after["tracked_bytes"] == before["tracked_bytes"], after
    assert torch.cuda.memory_allocated() == allocated0
    assert free2 - free_loaded >= tracked - 32 * MiB, "device memory must come back after delete + release + trim"


def test_each_tag_gets_its_own_segments():
    with vt.use_pool("kv_cache"):
        kv = torch.empty(64 * MiB, dtype=torch.uint8, device="cuda")
        with vt.use_pool("scratch"):
            sc = torch.empty(48 * MiB, dtype=torch.uint8, device="cuda")
        kv2 = torch.empty(6 * MiB, dtype=torch.uint8, device="cuda")
    rep = vt.report()
    assert vt.tag_usage(rep, "kv_cache")["live_bytes"] >= 70 * MiB
    assert vt.tag_usage(rep, "scratch")["live_bytes"] == 48 * MiB
    del kv2
    del kv, sc
    vt.release_pools()
    vt.trim()
    rep = vt.report()
    assert vt.tag_usage(rep, "kv_cache")["live_bytes"] == 0
    assert vt.tag_usage(rep, "scratch")["live_bytes"] == 0


def test_out_of_memory_raises_in_pytorch_and_the_pool_recovers():
    _, total = torch.cuda.mem_get_info()
    with vt.use_pool("oom-probe"):
        with pytest.raises(torch.cuda.OutOfMemoryError):
            torch.empty(2 * total, dtype=torch.uint8, device="cuda")
        ok = torch.empty(8 * MiB, dtype=torch.uint8, device="cuda")
    assert vt.tag_usage(vt.report(), "oom-probe")["live_bytes"] >= 8 * MiB
    del ok
    vt.release_pools()
    vt.trim()
    assert vt.tag_usage(vt.report(), "oom-probe")["live_bytes"] == 0
