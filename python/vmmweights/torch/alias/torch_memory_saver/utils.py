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


#: Names vmmweights' interposer (libvmmw_preload.so, one build for every
#: CUDA major) for the preload hook mode when no library of upstream's
#: naming is next to this package: an explicit choice, as loading an
#: interposer into every child is.
INTERPOSER_ENV = "VMMW_TMS_INTERPOSER"


def get_binary_path_from_package(stem: str) -> Path:
    """The shared library `stem` built for this process's GPU runtime, next
    to this package or in the folder above it (``<stem>_cu<major>.*.so`` for
    CUDA, ``<stem>.*.so`` for ROCm and XPU); else, for the preload hook
    mode's stem, the file ``VMMW_TMS_INTERPOSER`` names. ``RuntimeError``
    unless exactly one is found."""
    import os

    import torch  # looked up at each call: the build PyTorch says decides

    torch_module = sys.modules.get("torch", torch)
    xpu = bool(getattr(torch_module, "xpu", None)) and is_xpu()
    try:
        return Path(binary_in_package(str(Path(__file__).parent), stem, torch_module, xpu=xpu))
    except RuntimeError:
        chosen = os.environ.get(INTERPOSER_ENV, "")
        if stem == "torch_memory_saver_hook_mode_preload" and chosen and Path(chosen).is_file():
            return Path(chosen)
        raise
