"""torch_memory_saver.hooks.mode_preload: ``configure_subprocess`` (the
routing is vmmweights' pluggable allocator, not LD_PRELOAD)."""

from vmmweights.torch.memory_saver import configure_subprocess

__all__ = ["configure_subprocess"]
