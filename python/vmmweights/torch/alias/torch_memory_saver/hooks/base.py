"""torch_memory_saver.hooks.base: the hook mode names."""

from typing import Literal

HookMode = Literal["preload", "torch"]

__all__ = ["HookMode"]
