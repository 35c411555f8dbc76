"""A drop-in for vLLM's ``CuMemAllocator`` on vmmweights memory.

    from vmmweights.torch.cumem import CuMemAllocator
    allocator = CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        model = build_model().cuda()
    with allocator.use_memory_pool(tag="kv_cache"):
        kv = torch.empty(...)
    allocator.sleep(offload_tags=("weights",))   # weights offloaded, the rest discarded
    allocator.wake_up()                           # or wake_up(tags=["weights"])

Same semantics as vLLM's: tags in `offload_tags` keep their contents, every
other tag of the allocator is discarded.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator, List, Optional, Sequence, Set, Tuple, Union

import torch

from . import pool as _pool
from . import use_pool as _use_pool


class CuMemAllocator:
    """vLLM's CuMemAllocator API: ``get_instance``, ``use_memory_pool``,
    ``sleep``, ``wake_up``, ``get_current_usage``."""

    instance: Optional["CuMemAllocator"] = None
    default_tag: str = "default"

    @staticmethod
    def get_instance() -> "CuMemAllocator":
        """The process-wide instance."""
        if CuMemAllocator.instance is None:
            CuMemAllocator.instance = CuMemAllocator()
        return CuMemAllocator.instance

    def __init__(self) -> None:
        self.current_tag: str = CuMemAllocator.default_tag
        self._tags: Set[Tuple[int, str]] = set()

    @contextlib.contextmanager
    def use_memory_pool(self, tag: Optional[str] = None) -> Iterator[None]:
        """Allocations in the block live in our memory under `tag`."""
        tag = CuMemAllocator.default_tag if tag is None else tag
        assert isinstance(tag, str)
        dev = torch.cuda.current_device()
        self._tags.add((dev, tag))
        old, self.current_tag = self.current_tag, tag
        try:
            with _use_pool(tag, dev):
                yield
        finally:
            self.current_tag = old

    def _held(self) -> List[str]:
        dev = torch.cuda.current_device()
        held = set(_pool(dev).tags())
        return sorted(t for d, t in self._tags if d == dev and t in held)

    def sleep(self, offload_tags: Union[Tuple[str, ...], str, None] = None) -> None:
        """Offload the tags in `offload_tags` (default: the default tag),
        discard every other tag's memory."""
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        elif isinstance(offload_tags, str):
            offload_tags = (offload_tags,)
        torch.cuda.synchronize()
        items = {t: ("offload" if t in offload_tags else "discard") for t in self._held()}
        if items:
            _pool().sleep(items)
        gc.collect()
        torch.cuda.empty_cache()

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """Map the memory of `tags` (every tag when None) again at the same
        addresses; offloaded contents are restored."""
        if tags is None:
            _pool().wake()
        else:
            _pool().wake(*tags)

    def get_current_usage(self) -> int:
        """Bytes of memory the allocator's tags hold (asleep or not)."""
        rep = _pool().report()
        mine = set(self._held())
        return sum(t["reserved_bytes"] for t in rep["tags"] if t["tag"] in mine)
