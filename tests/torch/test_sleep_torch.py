"""GPU test: a transformers model in our MemPool (tag "weights") and a cache
tensor (tag "kv_cache"); sleep (offload weights, discard cache); the device's
free memory rises by the tracked bytes; wake; the forward pass is bitwise the
same as before sleep. Skips with the reason when there is no GPU.
"""

import gc
import os
import time

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the PyTorch sleep test needs a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

import vmmweights_torch as vt  # noqa: E402

MiB = 1 << 20


def test_model_sleeps_and_wakes_bitwise():
    cfg = transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    with vt.use_pool("weights"):
        model = model.to("cuda")
    with vt.use_pool("kv_cache"):
        cache = torch.full((256 * MiB // 2,), 3.0, dtype=torch.bfloat16, device="cuda")
    model.eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits.clone()
    ptrs = [p.data_ptr() for p in model.parameters()]
    torch.cuda.synchronize()

    rep = vt.report()
    tracked = vt.tag_usage(rep, "weights")["tracked_bytes"] + vt.tag_usage(rep, "kv_cache")["tracked_bytes"]
    assert tracked >= sum(p.numel() * 2 for p in model.parameters())
    free0, _ = torch.cuda.mem_get_info()
    t = time.perf_counter()
    vt.sleep(weights="offload", kv_cache="discard")
    sleep_s = time.perf_counter() - t
    free1, _ = torch.cuda.mem_get_info()
    asleep = vt.report()
    w = vt.tag_usage(asleep, "weights")
    print(f"\nsleep {sleep_s*1e3:.1f} ms: free memory rose {(free1 - free0)/MiB:.1f} MiB, tracked was {tracked/MiB:.1f} MiB; "
          f"weights offloaded {w.get('offloaded_bytes', 0)/MiB:.1f} MiB, backup {w.get('host_backup_bytes', 0)/MiB:.1f} MiB")
    # The driver rounds its own bookkeeping; allow 2 MiB per tag.
    assert abs((free1 - free0) - tracked) <= 4 * MiB, (free1 - free0, tracked)
    assert vt.tag_usage(asleep, "weights")["tracked_bytes"] == 0

    t = time.perf_counter()
    vt.wake()
    wake_s = time.perf_counter() - t
    free2, _ = torch.cuda.mem_get_info()
    print(f"wake {wake_s*1e3:.1f} ms; free memory back within {(free2 - free0)/MiB:+.1f} MiB")
    assert abs(free2 - free0) <= 4 * MiB
    assert [p.data_ptr() for p in model.parameters()] == ptrs, "pointers changed"
    with torch.no_grad():
        after = model(ids).logits
    assert torch.equal(before, after), "forward output differs after sleep/wake"
    # The discarded cache is mapped again and usable.
    cache.fill_(1.0)
    torch.cuda.synchronize()
    assert cache.float().sum().item() == cache.numel()

    del model, cache, before, after
    gc.collect()
    vt.release_pools()
    vt.trim()
