"""torch_memory_saver.utils: the helpers its callers import."""

import functools

from vmmweights.saver import changed_env as change_env

__all__ = ["change_env", "is_xpu"]


@functools.lru_cache(maxsize=1)
def is_xpu() -> bool:
    """Whether PyTorch runs on Intel XPU (vmmweights drives CUDA only)."""
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()
