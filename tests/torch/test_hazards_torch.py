"""GPU test (issues 17 and 11): a transformers model built inside our MemPool,
loaded in place through the C API, then:

- slept with Reload: the bytes the loader wrote come back from the checkpoint,
  every other byte of the tag (the rotary `inv_freq` buffer the model computes,
  a tensor allocated in the tag after the load) from the host backup; the
  forward pass is bitwise equal;
- its checkpoint rewritten in place while it sleeps with Reload: the wake fails
  with VMMW_CHECKPOINT_INVALID naming the file, the tag stays asleep,
  vmmw_pool_forget_reload lets it wake (the other bytes intact), a new load
  and a forward pass work (the context is usable);
- a sleep asked from the load's progress callback is refused with
  VMMW_LOAD_IN_PROGRESS and the load completes (forward bitwise equal).

Run with the vmmweights package importable (PYTHONPATH=python, VMMW_LIB=<libvmmweights.so>).
"""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: this test needs a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
st = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

import vmmweights.torch as vt  # noqa: E402

VMMW_CHECKPOINT_INVALID = 10
VMMW_LOAD_IN_PROGRESS = 17


def config():
    return transformers.LlamaConfig(
        vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
        num_attention_heads=16, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False,
    )


def reference(tmp_path):
    """A checkpoint written from a seeded model, and that model's logits."""
    cfg = config()
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    path = tmp_path / "model.safetensors"
    st.save_file({k: v.contiguous() for k, v in ref.state_dict().items()}, str(path))
    ids = torch.randint(0, cfg.vocab_size, (2, 64), device="cuda",
                        generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad():
        want = ref(ids).logits.clone()
    del ref
    torch.cuda.empty_cache()
    return cfg, path, ids, want


def load_into(model, path, progress=None):
    vt.load_(model, str(path), progress=progress)
    torch.cuda.synchronize()


def forward_equal(model, ids, want):
    with torch.no_grad():
        got = model(ids).logits
    return torch.equal(got, want)


def test_reload_keeps_unloaded_bytes_and_a_changed_checkpoint_is_refused(tmp_path):
    tag = "hazards-weights"
    cfg, path, ids, want = reference(tmp_path)
    with vt.use_pool(tag):
        model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
        extra = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    load_into(model, path)
    assert forward_equal(model, ids, want)

    vt.sleep(**{tag: "reload"})
    u = vt.tag_usage(vt.report(), tag)
    print(f"reload sleep: tracked {u['tracked_bytes']} B, host backup {u['host_backup_bytes']} B "
          f"(live {u['live_bytes']} B)")
    assert u["tracked_bytes"] == 0 and 0 < u["host_backup_bytes"] < u["live_bytes"]
    vt.wake(tag)
    assert torch.equal(extra, torch.arange(1 << 20, device="cuda", dtype=torch.float32))
    assert forward_equal(model, ids, want), "forward after a Reload cycle"

    vt.sleep(**{tag: "reload"})
    original = path.read_bytes()
    with open(path, "r+b") as f:
        f.seek(-4096, os.SEEK_END)
        f.write(bytes(4096))
    with pytest.raises(vt.VmmwError) as refused:
        vt.wake(tag)
    print(f"changed checkpoint: {refused.value}")
    assert refused.value.status == VMMW_CHECKPOINT_INVALID
    assert "model.safetensors" in refused.value.message
    u = vt.tag_usage(vt.report(), tag)
    assert u["asleep"] and u["tracked_bytes"] == 0, u
    vt.forget_reload(tag)
    vt.wake(tag)
    assert torch.equal(extra, torch.arange(1 << 20, device="cuda", dtype=torch.float32))
    path.write_bytes(original)
    load_into(model, path)
    assert forward_equal(model, ids, want), "forward after the refused wake and a new load"
    del model, extra
    torch.cuda.synchronize()
    vt.release_pools(tag)


def test_sleep_from_the_load_progress_is_refused_and_the_load_completes(tmp_path):
    tag = "hazards-loading"
    cfg, path, ids, want = reference(tmp_path)
    with vt.use_pool(tag):
        model = transformers.LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    statuses = []

    def on_progress(done, total):
        try:
            vt.sleep(**{tag: "discard"})
            statuses.append(0)
        except vt.VmmwError as e:
            statuses.append(e.status)
        return False

    load_into(model, path, on_progress)
    print(f"sleeps asked during the load: {len(statuses)}, statuses {sorted(set(statuses))}")
    assert statuses and all(s == VMMW_LOAD_IN_PROGRESS for s in statuses), statuses
    assert forward_equal(model, ids, want), "forward after the load"
    del model
    torch.cuda.synchronize()
    vt.release_pools(tag)
