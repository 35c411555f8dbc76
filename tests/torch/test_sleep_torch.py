"""GPU: a model loaded with load_ in tag "weights" and a cache in "kv_cache";
sleep with offload, discard and reload: free device memory rises by the
tracked bytes, pointers stay, and after wake the forward is bitwise equal
(after discard, once load_ has filled them again, the parameters are). A CUDA graph whose
memory lives in tag "graph" sleeps, wakes and replays to the same output."""

import gc
import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the PyTorch sleep tests need a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models as hf  # noqa: E402
import vmmweights.torch as vt  # noqa: E402

MiB = hf.MiB
SLACK = 4 * MiB  # the driver's own bookkeeping, per call


def tracked(*tags):
    rep = vt.report()
    return sum(vt.tag_usage(rep, t)["tracked_bytes"] for t in tags)


@pytest.mark.parametrize("policy", ["offload", "discard", "reload"])
@pytest.mark.parametrize("family", sorted(hf.CONFIGS))
def test_sleep_wake_forward_bitwise(tmp_path, family, policy):
    cfg = hf.CONFIGS[family]()
    ids, want = hf.write(cfg, tmp_path)
    model = hf.empty_in_pool(cfg, vt)
    vt.load_(model, str(tmp_path))
    with vt.use_pool("kv_cache"):
        cache = torch.full((64 * MiB // 2,), 3.0, dtype=torch.bfloat16, device="cuda")
    with torch.no_grad():
        before = model(ids).logits.clone()
    assert torch.equal(before, want)
    ptrs = [p.data_ptr() for p in model.parameters()]
    params_before = {n: p.detach().cpu().clone() for n, p in model.named_parameters()}
    torch.cuda.synchronize()
    held = tracked("weights", "kv_cache")
    assert held > 0

    free0, _ = torch.cuda.mem_get_info()
    vt.sleep(weights=policy, kv_cache="discard")
    free1, _ = torch.cuda.mem_get_info()
    print(f"\n{family} {policy}: free memory rose {(free1 - free0) / MiB:.1f} MiB, tracked {held / MiB:.1f} MiB")
    assert abs((free1 - free0) - held) <= SLACK, (free1 - free0, held)
    assert tracked("weights", "kv_cache") == 0

    vt.wake()
    free2, _ = torch.cuda.mem_get_info()
    assert abs(free2 - free0) <= SLACK
    assert [p.data_ptr() for p in model.parameters()] == ptrs, "pointers changed"
    if policy == "discard":
        # Discarded bytes are undefined until filled again: load_ refills the
        # parameters (buffers the model computed itself, such as rotary
        # inv_freq, are not in the checkpoint, so compare parameters here).
        vt.load_(model, str(tmp_path))
        for n, p in model.named_parameters():
            assert torch.equal(p.detach().cpu(), params_before[n]), f"discard + load_: {n} differs"
    else:
        with torch.no_grad():
            after = model(ids).logits
        assert torch.equal(after, want), f"{policy}: max abs diff {float((after.float() - want.float()).abs().max())}"
    cache.fill_(1.0)  # the discarded cache is mapped and usable
    torch.cuda.synchronize()
    assert cache.float().sum().item() == cache.numel()
    del model, cache, before
    gc.collect()
    vt.release_pools()
    vt.trim()


def test_cuda_graph_sleeps_and_replays():
    torch.manual_seed(0)
    with vt.use_pool("graph-weights"):
        w = torch.randn(1024, 1024, device="cuda")
    static_in = torch.randn(64, 1024, device="cuda")

    def step():
        h = torch.relu(static_in @ w)  # intermediates live in the graph's pool
        return (h @ w.t()).sum(dim=1)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with vt.graph(g, "graph"):
        static_out = step()
    g.replay()
    torch.cuda.synchronize()
    want = static_out.clone()
    graph_bytes = tracked("graph")
    assert graph_bytes > 0, "the graph's memory is in tag 'graph'"

    free0, _ = torch.cuda.mem_get_info()
    vt.sleep(graph="discard", **{"graph-weights": "offload"})
    free1, _ = torch.cuda.mem_get_info()
    assert abs((free1 - free0) - (graph_bytes + tracked_asleep("graph-weights"))) <= SLACK
    vt.wake("graph", "graph-weights")
    static_out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, want), "replay after sleep/wake differs"
    del g, static_out, w
    gc.collect()
    vt.release_pools()
    vt.trim()


def tracked_asleep(tag):
    """Bytes a sleeping tag had mapped (its committed bytes, now offloaded or discarded)."""
    u = vt.tag_usage(vt.report(), tag)
    return u["offloaded_bytes"] + u["discarded_bytes"] + u["reloadable_bytes"]
