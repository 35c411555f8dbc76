#!/usr/bin/env python3
"""Writes a GGUF model that llama.cpp runs: the Qwen3 architecture with random
F16 weights and the Qwen2 tokenizer that llama.cpp's own tree ships
(models/ggml-vocab-qwen2.gguf, 151936 tokens), through llama.cpp's `gguf`
package (gguf-py in the fetched tree, or the `gguf` wheel).

The default shape is an 8B model's, as the project's other benchmarks use
(hidden 4096, intermediate 12288, 36 layers, 32 query heads and 8 kv heads of
128, untied output, q/k norms): 16.4 GB in F16. `--small` writes the same
architecture at a few hundred MB, to check outputs quickly.

The weights are random (normal, std 0.02, drawn once into a pool that each
tensor reads at its own offset, so writing 16 GB costs the disk, not the
random generator); greedy decoding of them is deterministic, which is what a
check of outputs before and after a sleep needs.

    python3 scripts/llama/make_gguf.py OUT.gguf [--small] [--layers N] ...
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
LLAMA_SRC = Path(os.environ.get("LLAMA_SRC", ROOT / ".llama" / "src"))
if (LLAMA_SRC / "gguf-py").is_dir():
    sys.path.insert(0, str(LLAMA_SRC / "gguf-py"))

import numpy as np  # noqa: E402
import gguf  # noqa: E402

VOCAB_FILE = LLAMA_SRC / "models" / "ggml-vocab-qwen2.gguf"


def read_tokenizer(path: Path) -> dict:
    """The tokenizer fields of a vocabulary-only GGUF, as Python values."""
    r = gguf.GGUFReader(str(path))
    out: dict = {}
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        t = f.types
        if t[0] == gguf.GGUFValueType.ARRAY:
            if t[1] == gguf.GGUFValueType.STRING:
                out[key] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                out[key] = [int(f.parts[i][0]) for i in f.data]
        elif t[0] == gguf.GGUFValueType.STRING:
            out[key] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            out[key] = int(f.parts[f.data[0]][0])
    return out


def tensor_shapes(a: argparse.Namespace, vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) in the order llama.cpp's converter writes them."""
    h, f, hd = a.hidden, a.ffn, a.head_dim
    q, kv = a.heads * hd, a.kv_heads * hd
    out = [("token_embd.weight", (vocab, h), "w")]
    for i in range(a.layers):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", (h,), "norm"),
            (p + "attn_q.weight", (q, h), "w"),
            (p + "attn_k.weight", (kv, h), "w"),
            (p + "attn_v.weight", (kv, h), "w"),
            (p + "attn_output.weight", (h, q), "w"),
            (p + "attn_q_norm.weight", (hd,), "norm"),
            (p + "attn_k_norm.weight", (hd,), "norm"),
            (p + "ffn_norm.weight", (h,), "norm"),
            (p + "ffn_gate.weight", (f, h), "w"),
            (p + "ffn_up.weight", (f, h), "w"),
            (p + "ffn_down.weight", (h, f), "w"),
        ]
    out += [("output_norm.weight", (h,), "norm"), ("output.weight", (vocab, h), "w")]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path)
    ap.add_argument("--small", action="store_true", help="2 layers, hidden 512: the same architecture, small")
    ap.add_argument("--layers", type=int, default=36)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=12288)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--name", default=None)
    a = ap.parse_args()
    if a.small:
        a.layers, a.hidden, a.ffn, a.heads, a.kv_heads, a.head_dim = 2, 512, 1536, 8, 2, 64
    if not VOCAB_FILE.is_file():
        print(f"make_gguf: {VOCAB_FILE} is missing; run scripts/llama/fetch.sh (or set LLAMA_SRC)", file=sys.stderr)
        return 2

    tok = read_tokenizer(VOCAB_FILE)
    vocab = len(tok["tokenizer.ggml.tokens"])
    shapes = tensor_shapes(a, vocab)
    largest = max(int(np.prod(s)) for _, s, k in shapes if k == "w")

    t0 = time.time()
    rng = np.random.default_rng(a.seed)
    # One pool a little larger than the largest tensor; tensor k reads a
    # window at its own offset (a view, no copy).
    pool_len = largest + 1_000_003
    pool = np.empty(pool_len, dtype=np.float16)
    step = 1 << 24
    for s in range(0, pool_len, step):
        n = min(step, pool_len - s)
        pool[s : s + n] = (rng.standard_normal(n, dtype=np.float32) * 0.02).astype(np.float16)

    arch = "qwen3"
    w = gguf.GGUFWriter(str(a.out), arch)
    name = a.name or (f"random qwen3 {a.layers}x{a.hidden}")
    w.add_name(name)
    w.add_block_count(a.layers)
    w.add_context_length(40960)
    w.add_embedding_length(a.hidden)
    w.add_feed_forward_length(a.ffn)
    w.add_head_count(a.heads)
    w.add_head_count_kv(a.kv_heads)
    w.add_key_length(a.head_dim)
    w.add_value_length(a.head_dim)
    w.add_rope_freq_base(1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        w.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    w.add_token_list(tok["tokenizer.ggml.tokens"])
    w.add_token_types(tok["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in tok:
        w.add_token_merges(tok["tokenizer.ggml.merges"])
    for key, add in (
        ("tokenizer.ggml.eos_token_id", w.add_eos_token_id),
        ("tokenizer.ggml.bos_token_id", w.add_bos_token_id),
        ("tokenizer.ggml.padding_token_id", w.add_pad_token_id),
    ):
        if key in tok:
            add(tok[key])
    w.add_add_bos_token(False)
    if "tokenizer.chat_template" in tok:
        w.add_chat_template(tok["tokenizer.chat_template"])

    for tname, shape, kind in shapes:
        n = int(np.prod(shape))
        if kind == "norm":
            w.add_tensor_info(tname, shape, np.dtype(np.float32), n * 4)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float16), n * 2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    total = 0
    for k, (tname, shape, kind) in enumerate(shapes):
        n = int(np.prod(shape))
        if kind == "norm":
            w.write_tensor_data(np.ones(shape, dtype=np.float32))
            total += n * 4
        else:
            off = (k * 7_919_993) % (pool_len - n + 1)
            w.write_tensor_data(pool[off : off + n].reshape(shape))
            total += n * 2
    w.close()
    secs = time.time() - t0
    size = a.out.stat().st_size
    print(
        f"make_gguf: {a.out} ({name}, {len(shapes)} tensors, {size / 1e9:.2f} GB, "
        f"vocab {vocab}) in {secs:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
