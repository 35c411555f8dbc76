"""GPU test: updates through ``vmmweights.torch.update_``. A transformers
model (Qwen2 with tied embeddings and q/k/v biases; Llama untied), written by
save_pretrained, is loaded in place into our pool with ``load_``; a trainer's
model of the same config with other values is then pushed in with
``update_(model, trainer.state_dict())``. The logits equal the trainer's,
bitwise; the tag's version moves by one; a refused update (a tensor
missing, a stale version) changes nothing; a Reload sleep and wake keep the
update. Run with PYTHONPATH=python:tests/torch and VMMW_LIB set.
"""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: this test needs a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
pytest.importorskip("transformers", reason="transformers is not installed")

import hf_models  # noqa: E402
import vmmweights as vw  # noqa: E402
import vmmweights.torch as vt  # noqa: E402


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.clone()


def trainer(cfg, seed):
    """A model of `cfg` with other values than the checkpoint's (biases too)."""
    torch.manual_seed(seed)
    m = hf_models.build(cfg).to("cuda").eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.5)
    return m


@pytest.mark.parametrize("name", sorted(hf_models.CONFIGS))
def test_update_gives_the_trainers_logits_bitwise(tmp_path, name):
    tag = f"update-{name}"
    cfg = hf_models.CONFIGS[name]()
    ids, checkpoint_logits = hf_models.write(cfg, tmp_path)
    model = hf_models.empty_in_pool(cfg, vt, tag)
    vt.load_(model, str(tmp_path))
    torch.cuda.synchronize()
    assert torch.equal(logits(model, ids), checkpoint_logits)
    pool = vt.pool()
    v0 = pool.tag_version(tag)

    t = trainer(cfg, seed=11)
    want = logits(t, ids)
    assert not torch.equal(want, checkpoint_logits)

    # Refused before any byte moves: a tensor missing, then a stale version.
    partial = {k: v for k, v in t.state_dict().items() if k != "model.norm.weight"}
    with pytest.raises(vw.VmmwError) as e:
        vt.update_(model, partial)
    assert e.value.status_name == "VMMW_PLAN_MISMATCH" and "model.norm.weight" in str(e.value)
    with pytest.raises(vw.VmmwError) as e:
        vt.update_(model, t.state_dict(), expected_version=v0 + 5)
    assert e.value.status_name == "VMMW_VERSION_MISMATCH"
    assert torch.equal(logits(model, ids), checkpoint_logits), "a refused update wrote bytes"

    r = vt.update_(model, t.state_dict())
    print(f"{name}: update {r.bytes / 1e6:.1f} MB in {r.seconds * 1e3:.2f} ms, version {r.version}")
    assert r.version == v0 + 1 and r.tag == tag and not r.staged
    assert torch.equal(logits(model, ids), want), "the updated model's logits differ from the trainer's"

    # A Reload cycle keeps the update (the update marked what it wrote).
    vt.sleep(**{tag: "reload"})
    vt.wake(tag)
    assert torch.equal(logits(model, ids), want), "the Reload wake reverted the update"

    # Staged, from a second trainer whose tensors sit on the CPU.
    t2 = trainer(cfg, seed=12)
    want2 = logits(t2, ids)
    cpu = {k: v.detach().cpu() for k, v in t2.state_dict().items()}
    r2 = vt.update_(model, cpu, staged=True)
    assert r2.version == v0 + 2 and r2.staged
    assert torch.equal(logits(model, ids), want2)
    del model, t, t2
    torch.cuda.synchronize()
    vt.release_pools(tag)


def test_repeated_updates_follow_the_tensors_they_are_given(tmp_path):
    """update_ keeps what it derived from a target and a source between
    calls; every call still reads the tensors as they are now: moved tensors
    at their new addresses, a changed shape refused with nothing written, a
    target whose tensors changed no longer taken for the loaded one."""
    tag = "update-repeat"
    name = sorted(hf_models.CONFIGS)[0]
    cfg = hf_models.CONFIGS[name]()
    ids, _ = hf_models.write(cfg, tmp_path)
    model = hf_models.empty_in_pool(cfg, vt, tag)
    vt.load_(model, str(tmp_path))
    pool = vt.pool()
    v0 = pool.tag_version(tag)
    t1, t2 = trainer(cfg, seed=21), trainer(cfg, seed=22)
    want1, want2 = logits(t1, ids), logits(t2, ids)
    sd1, sd2 = dict(t1.state_dict()), dict(t2.state_dict())
    # A plain dict of the model's tensors is the loaded target too.
    target = dict(model.state_dict(keep_vars=True))

    source = dict(sd1)
    assert vt.update_(target, source).version == v0 + 1
    assert torch.equal(logits(model, ids), want1)
    # The same dict, every tensor moved to the second trainer's memory.
    source.update(sd2)
    assert vt.update_(target, source).version == v0 + 2
    assert torch.equal(logits(model, ids), want2), "the moved tensors were not read at their new addresses"
    # Back to the first trainer's tensors, then one tensor reshaped in place.
    source.update(sd1)
    assert vt.update_(target, source).version == v0 + 3
    assert torch.equal(logits(model, ids), want1)
    first = sorted(k for k in source if source[k].dim() == 2)[0]
    source[first] = source[first].reshape(-1)
    with pytest.raises(vw.VmmwError) as e:
        vt.update_(target, source)
    assert e.value.status_name == "VMMW_PLAN_MISMATCH" and first in str(e.value)
    assert pool.tag_version(tag) == v0 + 3
    assert torch.equal(logits(model, ids), want1), "a refused update wrote bytes"
    source[first] = sd1[first]

    # Timing on: the parts of the call and the library's phases.
    vt.update_timing(True)
    try:
        r = vt.update_(target, sd2)
        parts = vt.update_timing()
    finally:
        vt.update_timing(False)
    assert list(parts) == ["state_dict", "target", "source", "synchronize", "version", "update"], parts
    assert all(v >= 0 for v in parts.values())
    assert r.plan_seconds > 0 and r.issue_seconds > 0 and r.wait_seconds >= 0 and r.bookkeeping_seconds > 0
    assert r.version == v0 + 4 and torch.equal(logits(model, ids), want2)

    # A Reload cycle keeps the last update.
    vt.sleep(**{tag: "reload"})
    vt.wake(tag)
    assert torch.equal(logits(model, ids), want2)

    # A target whose tensor changed is not the loaded one any more.
    key = next(k for k, v in target.items() if v.numel() > 0)
    target[key] = torch.empty_like(target[key])
    with pytest.raises(ValueError, match="load_"):
        vt.update_(target, sd1)
    assert pool.tag_version(tag) == v0 + 4
    del model, target, t1, t2, sd1, sd2, source
    torch.cuda.synchronize()
    vt.release_pools(tag)
