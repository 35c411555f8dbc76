"""torch_memory_saver.hooks.mode_torch: the allocator regions use in torch mode."""

from vmmweights.torch import allocator

__all__ = ["allocator"]
