"""``import torch_memory_saver`` bound to vmmweights' shim: put the folder
above this one first on ``PYTHONPATH`` (see
``vmmweights.torch.memory_saver.alias_path()``)."""

from vmmweights.torch.memory_saver import TorchMemorySaver, torch_memory_saver

from .hooks.mode_preload import configure_subprocess

__all__ = ["TorchMemorySaver", "configure_subprocess", "torch_memory_saver"]
