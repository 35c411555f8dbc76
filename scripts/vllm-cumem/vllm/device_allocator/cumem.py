"""vllm.device_allocator.cumem bound to vmmweights' CuMemAllocator."""

from vmmweights.torch.cumem import CuMemAllocator

__all__ = ["CuMemAllocator"]
