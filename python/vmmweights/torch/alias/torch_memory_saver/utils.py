"""torch_memory_saver.utils: the helpers its callers import."""

import functools
import sys
from pathlib import Path

from vmmweights.saver import binary_in_package
from vmmweights.saver import changed_env as change_env

__all__ = ["change_env", "get_binary_path_from_package", "is_xpu"]


@functools.lru_cache(maxsize=1)
def is_xpu() -> bool:
    """Whether PyTorch runs on Intel XPU (vmmweights drives CUDA only)."""
    import torch

    return hasattr(torch, "xpu") and torch.xpu.is_available()


def get_binary_path_from_package(stem: str) -> Path:
    """The shared library `stem` built for this process's GPU runtime, next
    to this package or in the folder above it (``<stem>_cu<major>.*.so`` for
    CUDA, ``<stem>.*.so`` for ROCm and XPU); ``RuntimeError`` unless exactly
    one is there. The preload hook mode's interposer is found this way."""
    import torch  # looked up at each call: the build PyTorch says decides

    torch_module = sys.modules.get("torch", torch)
    xpu = bool(getattr(torch_module, "xpu", None)) and is_xpu()
    return Path(binary_in_package(str(Path(__file__).parent), stem, torch_module, xpu=xpu))
