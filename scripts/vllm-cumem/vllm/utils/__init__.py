"""vllm.utils: the constant older test_cumem.py versions import from here."""

from .mem_constants import GiB_bytes

__all__ = ["GiB_bytes"]
