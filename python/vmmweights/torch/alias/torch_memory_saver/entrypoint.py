"""torch_memory_saver.entrypoint: the saver class, and ``is_xpu`` (the
platform probe the saver's backend check reads through this module)."""

from vmmweights.torch.memory_saver import TorchMemorySaver

from .utils import is_xpu

__all__ = ["TorchMemorySaver", "is_xpu"]
