"""GPU: tensor-parallel loads through ``vmmweights.torch.load_``, bitwise
against torch slices of the full tensors.

Small Qwen2 (tied embeddings, q/k/v biases), Llama and Qwen3 (q/k norms)
models are built by transformers from a config (random weights, nothing
downloaded) and written by ``save_pretrained``, sharded. For worlds 1, 2, 4
and 8, every rank and every copy strategy, fused destinations shaped for the
rank are allocated in our pool, filled with a marker, loaded with the
family's preset, and compared bit for bit with slices of the full tensors
taken here with torch: q/k/v fused (kv heads cut, or replicated when the world
exceeds them), gate/up fused, o_proj and down_proj column slices, embeddings
and lm_head row slices, norms whole.

Skips with the reason without PyTorch, CUDA or transformers."""

import os

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: the tensor-parallel load tests need a GPU", allow_module_level=True)
if os.environ.get("VMMW_BACKEND", "auto").lower() == "host":
    pytest.skip("VMMW_BACKEND=host: PyTorch needs real device memory", allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
safetensors_torch = pytest.importorskip("safetensors.torch", reason="safetensors is not installed")

import vmmweights.torch as vt  # noqa: E402

WORLDS = [1, 2, 4, 8]
STRATEGIES = ["auto", "direct", "staged", "read", "simple"]
TAG = "tp-test"
MARK = 0x5A5A  # every destination starts as this int16 pattern


def _qwen2():
    # 2 kv heads: cut at world 2, replicated at 4 and 8.
    return transformers.Qwen2Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=True,
    )


def _llama():
    # 4 kv heads: cut up to world 4, replicated at 8.
    return transformers.LlamaConfig(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )


def _qwen3():
    # 8 kv heads: cut at every world; head_dim set apart from hidden / heads.
    if not hasattr(transformers, "Qwen3Config"):
        pytest.skip(f"transformers {transformers.__version__} has no Qwen3")
    return transformers.Qwen3Config(
        vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=8, head_dim=16, max_position_embeddings=256,
        tie_word_embeddings=False,
    )


FAMILIES = {"qwen2": _qwen2, "llama": _llama, "qwen3": _qwen3}


def _head_dim(cfg) -> int:
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def checkpoint(request, tmp_path_factory):
    """(family, config, folder, full tensors) of a saved random model."""
    family = request.param
    cfg = FAMILIES[family]()
    folder = tmp_path_factory.mktemp(f"tp-{family}")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)
    with torch.no_grad():  # random biases and norms, so a lost or misplaced one shows
        for n, p in model.named_parameters():
            if n.endswith(".bias") or "norm" in n:
                p.normal_(0, 0.5)
    model.save_pretrained(folder, max_shard_size="1MB")
    del model
    full = {}
    for f in sorted(folder.glob("*.safetensors")):
        full.update(safetensors_torch.load_file(str(f)))
    assert len(list(folder.glob("*.safetensors"))) > 1, "save_pretrained sharded the model"
    return family, cfg, folder, full


def _kv_rows(full_kv: torch.Tensor, kv_heads: int, hd: int, rank: int, world: int) -> torch.Tensor:
    """Rank's part of a k or v projection (weight or bias): its heads, or the
    one head it shares with world / kv_heads ranks."""
    if world <= kv_heads:
        per = full_kv.shape[0] // world
        return full_kv[rank * per:(rank + 1) * per]
    head = rank // (world // kv_heads)
    return full_kv[head * hd:(head + 1) * hd]


def expected(full, cfg, rank: int, world: int):
    """Every destination of rank `rank` of `world`, sliced from the full tensors."""
    hd, kv = _head_dim(cfg), cfg.num_key_value_heads

    def rows(t):
        per = t.shape[0] // world
        return t[rank * per:(rank + 1) * per]

    def cols(t):
        per = t.shape[1] // world
        return t[:, rank * per:(rank + 1) * per]

    want = {}
    for name, t in full.items():
        layer, _, leaf = name.rpartition(".self_attn.")
        if leaf.startswith("q_proj."):
            kind = leaf.split(".")[1]
            parts = [rows(t)] + [_kv_rows(full[f"{layer}.self_attn.{p}_proj.{kind}"], kv, hd, rank, world)
                                 for p in ("k", "v")]
            want[f"{layer}.self_attn.qkv_proj.{kind}"] = torch.cat(parts)
        elif leaf.startswith(("k_proj.", "v_proj.")):
            continue
        elif name.endswith(".mlp.gate_proj.weight"):
            up = full[name.replace("gate_proj", "up_proj")]
            want[name.replace("gate_proj", "gate_up_proj")] = torch.cat([rows(t), rows(up)])
        elif name.endswith(".mlp.up_proj.weight"):
            continue
        elif name.endswith((".self_attn.o_proj.weight", ".mlp.down_proj.weight")):
            want[name] = cols(t)
        elif name in ("model.embed_tokens.weight", "lm_head.weight"):
            want[name] = rows(t)
        else:
            want[name] = t
    if "lm_head.weight" not in want:  # tied: fed from the embeddings
        want["lm_head.weight"] = rows(full["model.embed_tokens.weight"])
    return {n: t.contiguous() for n, t in want.items()}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("world", WORLDS)
def test_every_rank_holds_torch_slices_of_the_full_tensors(checkpoint, world, strategy):
    family, cfg, folder, full = checkpoint
    hd = _head_dim(cfg)
    checked = 0
    for rank in range(world):
        want = expected(full, cfg, rank, world)
        with vt.use_pool(TAG):
            dests = {n: torch.empty(t.shape, dtype=t.dtype, device="cuda") for n, t in want.items()}
        for t in dests.values():
            _bits(t).fill_(MARK)
        r = vt.load_(dests, str(folder), preset=family, tp_rank=rank, tp_world=world,
                     head_dim=hd, strategy=strategy)
        total = sum(t.numel() * t.element_size() for t in dests.values())
        assert r.bytes == total, (family, world, rank, strategy, r.bytes, total)
        torch.cuda.synchronize()
        for n, t in dests.items():
            got, w = _bits(t).cpu(), _bits(want[n])
            if not torch.equal(got, w):
                bad = (got != w).nonzero()
                raise AssertionError(
                    f"{family} rank {rank} of {world} ({strategy}): {n} {tuple(t.shape)} differs from "
                    f"the torch slice at {len(bad)} elements, first {bad[0].tolist()}")
            checked += 1
        del dests, t
    assert checked >= world * (2 * cfg.num_hidden_layers + 2)
    print(f"{family} world {world} {strategy}: {checked} destinations bitwise equal")
    vt.release_pools(TAG)
    vt.trim()
