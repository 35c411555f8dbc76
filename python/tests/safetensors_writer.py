"""Writes safetensors checkpoints without numpy or torch (8-byte header
length, JSON header, raw data), sharded with a Hugging Face index."""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path
from typing import Dict, List, Tuple

SIZES = {"BF16": 2, "F16": 2, "F32": 4}

Tensors = Dict[str, Tuple[str, List[int], bytes]]  # name -> (dtype, shape, bytes)


def finite_values(rng: random.Random, n: int, dtype: str) -> bytes:
    """`n` finite values of `dtype` (so conversions stay meaningful)."""
    floats = [rng.uniform(-4.0, 4.0) for _ in range(n)]
    raw = struct.pack(f"<{n}f", *floats)
    if dtype == "F32":
        return raw
    if dtype == "BF16":  # the high half of each float32
        return b"".join(raw[i + 2 : i + 4] for i in range(0, len(raw), 4))
    if dtype == "F16":
        return struct.pack(f"<{n}e", *floats)
    raise ValueError(dtype)


def llama_like(layers: int = 2, hidden: int = 64, inter: int = 96, vocab: int = 128,
               heads: int = 4, kv_heads: int = 2, dtype: str = "BF16", tied: bool = False,
               seed: int = 1) -> Tensors:
    """Tensors named and shaped like a small Llama/Qwen2 model."""
    hd = hidden // heads
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for l in range(layers):
        p = f"model.layers.{l}"
        shapes.update({
            f"{p}.input_layernorm.weight": [hidden],
            f"{p}.post_attention_layernorm.weight": [hidden],
            f"{p}.self_attn.q_proj.weight": [heads * hd, hidden],
            f"{p}.self_attn.k_proj.weight": [kv_heads * hd, hidden],
            f"{p}.self_attn.v_proj.weight": [kv_heads * hd, hidden],
            f"{p}.self_attn.o_proj.weight": [hidden, heads * hd],
            f"{p}.mlp.gate_proj.weight": [inter, hidden],
            f"{p}.mlp.up_proj.weight": [inter, hidden],
            f"{p}.mlp.down_proj.weight": [hidden, inter],
        })
    if not tied:
        shapes["lm_head.weight"] = [vocab, hidden]
    rng = random.Random(seed)
    out: Tensors = {}
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        out[name] = (dtype, shape, finite_values(rng, n, dtype))
    return out


def write_file(path: Path, tensors: Tensors) -> None:
    header: dict = {}
    offset = 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, data in tensors.values():
            f.write(data)


def write_sharded(folder: Path, tensors: Tensors, shards: int) -> Path:
    """`shards` files plus model.safetensors.index.json in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    names = list(tensors)
    per = -(-len(names) // shards)
    weight_map = {}
    for k in range(shards):
        part = names[k * per : (k + 1) * per]
        file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        write_file(folder / file, {n: tensors[n] for n in part})
        weight_map.update({n: file for n in part})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": sum(len(t[2]) for t in tensors.values())}, "weight_map": weight_map})
    )
    return folder
