"""vllm.device_allocator: the allocator instance later test_cumem.py versions ask for."""

from .cumem import CuMemAllocator


def get_mem_allocator_instance() -> CuMemAllocator:
    return CuMemAllocator.get_instance()


__all__ = ["get_mem_allocator_instance"]
