"""Process B of tests/torch/test_share_torch.py: attach to the weights process
A serves, build the same transformers model with its parameters replaced by
torch tensors over the imported (read-only) memory, run the forward on A's
input ids, and save the logits.

    python tests/torch/share_importer.py --socket S --family llama-untied \\
        --device 0 --inputs ids.pt --out logits.pt --report report.json

What B computes itself: the model's non-persistent buffers (the rotary
embedding's ``inv_freq``, and ``original_inv_freq`` where the transformers
version registers it), built by the model's constructor exactly as A's are;
the report lists them. Tied weights (Qwen2's ``lm_head.weight``) are bound to
the shared embedding, as the model ties them. Everything else is the share's.

Also the helpers both processes use to put a model over given tensors.
PyTorch is imported only to run, so ``--help`` works without it.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Dict, List, Optional


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--socket", required=True, help="the share's Unix socket path (process A serves it)")
    p.add_argument("--family", required=True, help="a model of tests/torch/hf_models.py CONFIGS")
    p.add_argument("--device", type=int, default=0, help="CUDA device this process reads and computes on")
    p.add_argument("--inputs", required=True, help="input ids saved by A (torch.save)")
    p.add_argument("--out", required=True, help="where to save the logits (torch.save, on the CPU)")
    p.add_argument("--report", required=True, help="where to write what was bound and computed (JSON)")
    a = p.parse_args(argv)
    if a.device < 0:
        p.error(f"--device {a.device}: expected a CUDA ordinal >= 0")
    return a


def install(model: Any, tensors: Any, device: str, tied: bool) -> Dict[str, Any]:
    """Put `model` (built on the CPU) over `tensors` (a share's Attachment or a
    name -> tensor mapping) with ``vmmweights.torch.shared.bind_``; tie the
    LM head to the embedding when `tied`; move the non-persistent buffers it
    computed to `device`. Returns what came from where."""
    import torch
    import vmmweights.torch as vt

    missing = vt.shared.bind_(model, tensors, device=torch.device(device).index)
    if tied and missing == ["lm_head.weight"]:
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = []
    if missing:
        raise RuntimeError(f"the shared tensors lack {missing}")
    persistent = set(model.state_dict())
    computed = []
    for mname, mod in model.named_modules():
        for bname, b in list(mod._buffers.items()):
            if b is None:
                continue
            full = f"{mname}.{bname}" if mname else bname
            if full in persistent:
                raise RuntimeError(f"persistent buffer {full} is not in the share")
            mod._buffers[bname] = b.to(device)
            computed.append(full)
    on_cpu = [n for n, p in model.named_parameters() if p.device != torch.device(device)]
    if on_cpu:
        raise RuntimeError(f"parameters not on {device}: {on_cpu[:5]}")
    return {"computed_buffers": sorted(set(computed)),
            "parameters": sum(1 for _ in model.parameters())}


def main(argv: Optional[List[str]] = None) -> int:
    a = parse(argv)
    import gc

    import torch

    import hf_models as hf
    from vmmweights import share

    device = f"cuda:{a.device}"
    torch.cuda.set_device(a.device)
    cfg = hf.CONFIGS[a.family]()
    att = share.attach(a.socket, device=a.device)
    imported = {n: (t.ptr, t.bytes) for n, t in att.tensors().items()}
    model = hf.build(cfg).eval()
    report = install(model, att, device, cfg.tie_word_embeddings)
    # Every parameter is the imported memory itself, not a copy.
    for name, p in model.named_parameters():
        ptr, nbytes = imported["model.embed_tokens.weight" if name == "lm_head.weight" and name not in imported
                                else name]
        if p.data_ptr() != ptr or p.numel() * p.element_size() != nbytes:
            raise RuntimeError(f"{name}: at {p.data_ptr():#x}, imported at {ptr:#x}: a copy")
    ids = torch.load(a.inputs).to(device)
    with torch.no_grad():
        logits = model(ids).logits
    torch.cuda.synchronize(a.device)
    torch.save(logits.cpu(), a.out)
    report.update(version=att.version, tensors=len(imported), device=str(logits.device),
                  param_device=str(next(model.parameters()).device), backend=att.backend)
    with open(a.report, "w") as f:
        json.dump(report, f)
    # Tensors over the mapping go before the detach unmaps it.
    del model, logits
    gc.collect()
    att.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main())
