"""vllm.platforms.current_platform: CUDA."""

import torch


class _Cuda:
    device_type = "cuda"

    @staticmethod
    def is_rocm() -> bool:
        return False

    @staticmethod
    def mem_get_info():
        return torch.cuda.mem_get_info()

    @staticmethod
    def get_current_memory_usage() -> int:
        free, total = torch.cuda.mem_get_info()
        return total - free


current_platform = _Cuda()
