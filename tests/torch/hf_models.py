"""Small Hugging Face models written by transformers' own save_pretrained, for
the GPU tests: a Qwen2 (tied embeddings, q/k/v biases) and a Llama (untied,
no biases), sharded with an index, and inputs to compare forwards with."""

from __future__ import annotations

import torch
import transformers

MiB = 1 << 20


def qwen2_tied() -> "transformers.PretrainedConfig":
    return transformers.Qwen2Config(
        vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
        tie_word_embeddings=True,
    )


def llama_untied() -> "transformers.PretrainedConfig":
    return transformers.LlamaConfig(
        vocab_size=4096, hidden_size=512, intermediate_size=1376, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=512,
        tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )


CONFIGS = {"qwen2-tied": qwen2_tied, "llama-untied": llama_untied}


def build(cfg) -> torch.nn.Module:
    # Built in float32 then cast: the dtype keyword of from_config changed name across versions.
    return transformers.AutoModelForCausalLM.from_config(cfg).to(torch.bfloat16)


def write(cfg, folder) -> tuple:
    """Random model saved sharded to `folder`; returns (inputs, logits) of its forward."""
    torch.manual_seed(0)
    model = build(cfg).to("cuda").eval()
    with torch.no_grad():  # non-trivial biases, so a lost bias shows
        for n, p in model.named_parameters():
            if n.endswith(".bias"):
                p.normal_(0, 0.5)
    model.save_pretrained(folder, max_shard_size="2MB")  # safetensors, sharded, with an index
    ids = inputs(cfg)
    with torch.no_grad():
        want = model(ids).logits.clone()
    del model
    torch.cuda.empty_cache()
    return ids, want


def inputs(cfg) -> torch.Tensor:
    g = torch.Generator("cuda").manual_seed(1)
    return torch.randint(0, cfg.vocab_size, (2, 64), device="cuda", generator=g)


def empty_in_pool(cfg, vt, tag: str = "weights") -> torch.nn.Module:
    """The model built inside our pool under `tag`, every parameter zeroed."""
    with vt.use_pool(tag):
        model = build(cfg).to("cuda").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    return model
