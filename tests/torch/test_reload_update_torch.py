"""GPU test: Reload never reverts a write. A transformers model (3 layers,
written by save_pretrained) is loaded in place into our pool with ``load_``,
then, as an RL loop does, its weights are updated in place:

- by ``p.copy_(new)`` on every parameter of one layer, found by the sleep's
  device hashes alone;
- by ``load_state_dict`` of another model's weights for a second layer,
  marked with ``vt.mark_written``;
- and a tensor freed, its block handed by PyTorch's caching allocator to a
  new tensor of the tag without our free.

After a Reload sleep and wake the logits equal the updated model's,
bitwise, not the checkpoint's; a new ``load_`` makes the checkpoint the
source again. Run with PYTHONPATH=python:tests/torch and VMMW_LIB set.
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
import vmmweights.torch as vt  # noqa: E402


def logits(model, ids):
    with torch.no_grad():
        return model(ids).logits.clone()


@pytest.mark.parametrize("name", sorted(hf_models.CONFIGS))
def test_reload_wake_restores_the_update_not_the_checkpoint(tmp_path, name):
    tag = f"rl-{name}"
    cfg = hf_models.CONFIGS[name]()
    ids, checkpoint_logits = hf_models.write(cfg, tmp_path)
    model = hf_models.empty_in_pool(cfg, vt, tag)
    vt.load_(model, str(tmp_path))
    torch.cuda.synchronize()
    assert torch.equal(logits(model, ids), checkpoint_logits)

    # A trainer's step: layer 0 rewritten in place, found by hashing.
    g = torch.Generator("cuda").manual_seed(7)
    with torch.no_grad():
        for p in model.model.layers[0].parameters():
            p.copy_(p + 0.01 * torch.randn(p.shape, device="cuda", generator=g, dtype=torch.float32).to(p.dtype))
    # Layer 1 from another model's state dict, marked.
    other = hf_models.build(cfg).to("cuda").eval()
    model.model.layers[1].load_state_dict(other.model.layers[1].state_dict())
    vt.mark_written(model.model.layers[1])
    del other
    # A tensor of the tag freed and its block reused by the caching allocator.
    with vt.use_pool(tag):
        scratch = torch.full((1 << 20,), 3.0, device="cuda")
        del scratch
        reused = torch.full((1 << 20,), 5.0, device="cuda")
    torch.cuda.synchronize()
    updated = logits(model, ids)
    assert not torch.equal(updated, checkpoint_logits)

    out = vt.sleep(**{tag: "reload"})
    print(f"{name}: reload sleep {out}")
    u = vt.tag_usage(vt.report(), tag)
    assert u["tracked_bytes"] == 0, u
    vt.wake(tag)
    assert torch.equal(logits(model, ids), updated), "the wake reverted the update"
    assert torch.equal(reused, torch.full((1 << 20,), 5.0, device="cuda"))

    # A second cycle restores the same (the update now lives in the backup).
    vt.sleep(**{tag: "reload"})
    vt.wake(tag)
    assert torch.equal(logits(model, ids), updated)

    # Loading the checkpoint again makes it the source again.
    vt.load_(model, str(tmp_path))
    torch.cuda.synchronize()
    vt.sleep(**{tag: "reload"})
    vt.wake(tag)
    assert torch.equal(logits(model, ids), checkpoint_logits)
    del model, reused
    torch.cuda.synchronize()
    vt.release_pools(tag)
