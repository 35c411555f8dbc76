"""GPU: models written by transformers' save_pretrained (sharded, index.json;
Qwen2 with tied embeddings and q/k/v biases, Llama without), rebuilt inside
our pool with every parameter zeroed, loaded in place by
``vmmweights.torch.load_`` from ``model.state_dict()``: forward bitwise equal.
Skips with the reason without PyTorch, CUDA or transformers."""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the PyTorch load tests need a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models as hf  # noqa: E402
import vmmweights.torch as vt  # noqa: E402


@pytest.mark.parametrize("strategy", ["auto", "direct", "staged"])
@pytest.mark.parametrize("family", sorted(hf.CONFIGS))
def test_load_into_state_dict_forward_bitwise(tmp_path, family, strategy):
    cfg = hf.CONFIGS[family]()
    ids, want = hf.write(cfg, tmp_path)
    assert (tmp_path / "model.safetensors.index.json").is_file(), "save_pretrained sharded the model"
    model = hf.empty_in_pool(cfg, vt)
    sd = model.state_dict()
    if cfg.tie_word_embeddings:
        assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    seen = []
    r = vt.load_(model, str(tmp_path), strategy=strategy, progress=lambda d, t: seen.append((d, t)))
    total = sum(t.numel() * t.element_size() for n, t in sd.items()
                if not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    assert r.bytes == total and r.gbps > 0, (r, total)
    assert seen[-1] == (total, total)
    with torch.no_grad():
        got = model(ids).logits
    assert torch.equal(got, want), f"max abs diff {float((got.float() - want.float()).abs().max())}"
    del model, sd
    vt.release_pools("weights")
    vt.trim()


def test_load_reports_every_problem_before_writing(tmp_path):
    cfg = hf.llama_untied()
    hf.write(cfg, tmp_path)
    model = hf.empty_in_pool(cfg, vt)
    extra = {"not.in.checkpoint": torch.zeros(8, device="cuda", dtype=torch.bfloat16)}
    with pytest.raises(vt.VmmwError) as e:
        vt.load_({**model.state_dict(), **extra}, str(tmp_path))
    assert "not.in.checkpoint" in str(e.value)
    assert all(int(p.abs().sum()) == 0 for p in model.parameters()), "nothing written"
    del model
    vt.release_pools("weights")


def test_tensor_views_of_loader_allocated_memory(tmp_path):
    """vmmweights.load allocates fused destinations from the qwen2 preset in
    our pool; as_tensor views them (no copy) and they equal the file's."""
    import vmmweights as vw
    from safetensors import safe_open

    cfg = hf.qwen2_tied()
    hf.write(cfg, tmp_path)
    dests, r = vw.load(tmp_path, vt.pool(), "loader-weights", preset="qwen2")
    views = vt.tensors(dests)
    qkv = views["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.dtype == torch.bfloat16 and qkv.data_ptr() == dests["model.layers.0.self_attn.qkv_proj.weight"].ptr
    want = {}
    for f in tmp_path.glob("*.safetensors"):
        with safe_open(str(f), framework="pt", device="cpu") as sf:
            want.update({k: sf.get_tensor(k) for k in sf.keys()})
    q = want["model.layers.0.self_attn.q_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]].cpu(), q)
    assert torch.equal(views["model.embed_tokens.weight"].cpu(), want["model.embed_tokens.weight"])
    bias = views["model.layers.0.self_attn.qkv_proj.bias"]
    assert torch.equal(bias[: q.shape[0]].cpu(), want["model.layers.0.self_attn.q_proj.bias"])
    del views, qkv, bias
    pool = vt.pool()
    for d in dests.values():
        pool.free(d.ptr)
    pool.trim()
