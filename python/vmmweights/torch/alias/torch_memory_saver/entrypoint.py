"""torch_memory_saver.entrypoint: the saver class."""

from vmmweights.torch.memory_saver import TorchMemorySaver

__all__ = ["TorchMemorySaver"]
