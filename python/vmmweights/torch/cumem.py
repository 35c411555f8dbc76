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
other tag of the allocator is discarded. The allocator acts only on its own
tags (``cumem:<tag>`` in reports): naming a tag it never created in
`offload_tags` or `wake_up(tags=...)` raises
:class:`~vmmweights.saver.ForeignTagError`, and ``wake_up()`` wakes only its
own sleeping tags.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Dict, Iterator, Optional, Sequence, Tuple, Union

import torch

from ..saver import ForeignTagError, OwnTags, held
from . import pool as _pool
from . import use_pool as _use_pool

__all__ = ["CuMemAllocator", "ForeignTagError"]


class CuMemAllocator:
    """vLLM's CuMemAllocator API: ``get_instance``, ``use_memory_pool``,
    ``sleep`` (with ``keep_tags``), ``discard``, ``wake_up``,
    ``get_current_usage``."""

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
        self._own = OwnTags("CuMemAllocator", "cumem")

    @contextlib.contextmanager
    def use_memory_pool(self, tag: Optional[str] = None) -> Iterator[None]:
        """Allocations in the block live in our memory under `tag`."""
        tag = CuMemAllocator.default_tag if tag is None else tag
        assert isinstance(tag, str)
        dev = torch.cuda.current_device()
        name = self._own.note(dev, tag)
        old, self.current_tag = self.current_tag, tag
        try:
            with _use_pool(name, dev):
                yield
        finally:
            self.current_tag = old

    def sleep(self, offload_tags: Union[Tuple[str, ...], str, None] = None,
              keep_tags: Union[Tuple[str, ...], str, None] = None) -> None:
        """Offload the tags in `offload_tags` (default: the default tag),
        leave those in `keep_tags` mapped and untouched, discard every other
        tag's memory, on every device. A tag in both is an ``AssertionError``,
        as in vLLM; asleep tags stay as they are."""
        if offload_tags is None:
            offload_tags = (CuMemAllocator.default_tag,)
        else:
            offload_tags = (offload_tags,) if isinstance(offload_tags, str) else tuple(offload_tags)
            self._own.check(offload_tags)
        keep = () if keep_tags is None else (keep_tags,) if isinstance(keep_tags, str) else tuple(keep_tags)
        assert not set(keep) & set(offload_tags), f"tags both kept and offloaded: {sorted(set(keep) & set(offload_tags))}"
        self._sleep({t: "offload" for t in offload_tags}, keep, default="discard")
        gc.collect()
        torch.cuda.empty_cache()

    def discard(self, tags: Union[Tuple[str, ...], str]) -> None:
        """Release the memory of `tags` (contents dropped) on every device,
        keeping every other tag mapped; ``wake_up`` maps it again."""
        names = (tags,) if isinstance(tags, str) else tuple(tags)
        self._own.check(names)
        self._sleep({t: "discard" for t in names}, (), default=None)

    def _sleep(self, policies: Dict[str, str], keep: Sequence[str], default: Optional[str]) -> None:
        """Sleep each awake own tag with its policy in `policies` (`default`
        for the others; None leaves them), never those in `keep`."""
        for dev in self._own.devices():
            names = self._own.pool_tags(dev)
            awake = [n for n, asleep in held(_pool(dev), names).items() if not asleep and names[n] not in keep]
            chosen: Dict[str, str] = {}
            for n in awake:
                p = policies.get(names[n], default)
                if p is not None:
                    chosen[n] = p
            if chosen:
                torch.cuda.synchronize(dev)
                _pool(dev).sleep(chosen)

    def wake_up(self, tags: Optional[Sequence[str]] = None) -> None:
        """Map the memory of `tags` (every sleeping tag of this allocator when
        None) again at the same addresses, on every device; offloaded contents
        are restored."""
        if tags is not None:
            self._own.check(list(tags))
        for dev in self._own.devices():
            names = self._own.pool_tags(dev, None if tags is None else list(tags))
            asleep = sorted(n for n, a in held(_pool(dev), names).items() if a)
            if asleep:
                _pool(dev).wake(*asleep)

    def get_current_usage(self) -> int:
        """Bytes of memory the allocator's tags hold (asleep or not), on every device."""
        total = 0
        for dev in self._own.devices():
            mine = self._own.pool_tags(dev)
            total += sum(t["reserved_bytes"] for t in _pool(dev).report()["tags"] if t["tag"] in mine)
        return total
