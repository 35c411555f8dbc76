"""torch_memory_saver.testing_utils: device helpers its test suite imports."""

import torch

from .utils import is_xpu

__all__ = ["empty_cache", "get_and_print_gpu_memory", "get_device", "is_xpu"]


def get_device() -> str:
    return "xpu" if is_xpu() else "cuda"


def empty_cache() -> None:
    torch.cuda.empty_cache()


def get_and_print_gpu_memory(message: str, gpu_id: int = 0) -> int:
    """Device memory in use on `gpu_id` (every process, as the driver counts it)."""
    mem = int(torch.cuda.device_memory_used(gpu_id))
    print(f"GPU {gpu_id} memory: {mem / 1024 ** 3:.2f} GB ({message})")
    return mem
