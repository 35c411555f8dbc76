"""Every thread's PyTorch allocations into one tag of our pools, with
PyTorch's caching allocator kept: torch_memory_saver's ``TMS_INIT_ENABLE``
start, done without LD_PRELOAD and without replacing the allocator.

PyTorch routes an allocation to a private memory pool when an entry of its
per-device "allocate to pool" list accepts it; the first entry that accepts
wins. :class:`ProcessRoute` keeps one entry per device that accepts every
stream of every thread (autograd's device threads included) for a
``torch.cuda.MemPool`` over our pluggable allocator, so PyTorch caches blocks
as usual and asks us only for new segments. Regions and graph captures put
their own entries ahead of it (:meth:`ProcessRoute.behind`), and
:meth:`ProcessRoute.stepped_aside` lifts it for allocations that are nobody's
to pause.

What PyTorch does with a private pool in use, and so with the route's:
- It frees its cached blocks on out-of-memory only when they are "oversize"
  (``max_split_size_mb``), so the route sets that size when the user has not
  (:data:`MAX_SPLIT_MB`): a large cached block is returned to us when a later
  allocation needs the room.
- ``torch.cuda.empty_cache()`` leaves its cached blocks alone; a pause
  releases them with the rest of the tag.
- A MemPool destroyed while any such entry stands aborts the process (PyTorch
  synchronizes, which an entry forbids), so the route ends its entries at
  interpreter exit (:meth:`ProcessRoute.stop`), before the MemPools go.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional

import torch

#: Blocks at least this large (MiB) are "oversize" for PyTorch while the
#: route stands, unless the user set ``max_split_size_mb``: oversize cached
#: blocks go back to our pool when an allocation runs out of device memory.
MAX_SPLIT_MB = 1024


def _binding(*names: str) -> Callable[..., Any]:
    """The first of PyTorch's private allocator bindings `names` it has."""
    for name in names:
        fn = getattr(torch._C, name, None)
        if fn is not None:
            return fn  # type: ignore[no-any-return]
    raise RuntimeError(
        f"this PyTorch ({torch.__version__}) has none of {names}: the memory saver's process-wide "
        "routing needs them (PyTorch 2.6 or later)"
    )


def _user_set_max_split() -> bool:
    conf = ",".join(os.environ.get(k, "") for k in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"))
    return "max_split_size_mb" in conf


class ProcessRoute:
    """The all-thread route of one process to our MemPools, one per device
    (made by `make_pool(device)`). Thread-safe."""

    def __init__(self, make_pool: Callable[[int], Any]) -> None:
        self._make_pool = make_pool
        self._pools: Dict[int, Any] = {}
        self._lifted = 0  # nesting depth of stepped_aside
        self._lock = threading.RLock()
        self._begin = _binding("_cuda_beginAllocateToPool")
        self._end = _binding("_cuda_endAllocateToPool", "_cuda_endAllocateCurrentStreamToPool")
        self._release = _binding("_cuda_releasePool")

    def start(self, devices: List[int]) -> None:
        """Route every allocation on `devices` to our MemPools from now on."""
        with self._lock:
            if not _user_set_max_split():
                try:
                    torch.cuda.memory._set_allocator_settings(f"max_split_size_mb:{MAX_SPLIT_MB}")
                except Exception as e:  # an older PyTorch: OOM then keeps cached blocks
                    warnings.warn(f"vmmweights: max_split_size_mb not set ({e}); cached blocks stay cached on OOM")
            if not self._pools:
                atexit.register(self.stop)
            for dev in devices:
                if dev not in self._pools:
                    with torch.cuda.device(dev):
                        self._pools[dev] = self._make_pool(dev)
                    self._on(dev)

    def stop(self) -> None:
        """End the route on every device: allocations are PyTorch's own again.
        The MemPools stay, with the blocks they hold."""
        with self._lock:
            for dev in self._pools:
                self._off(dev)
            self._lifted += 1

    @property
    def devices(self) -> List[int]:
        with self._lock:
            return sorted(self._pools)

    def _on(self, dev: int) -> None:
        if self._lifted == 0:
            self._begin(dev, self._pools[dev].id)

    def _off(self, dev: int) -> None:
        if self._lifted == 0:
            self._end(dev, self._pools[dev].id)
            self._release(dev, self._pools[dev].id)

    @contextlib.contextmanager
    def behind(self, dev: int) -> Iterator[None]:
        """Entries added to PyTorch's list on `dev` inside the block (a
        region's MemPool, a graph capture) come ahead of the route's."""
        with self._lock:
            if dev not in self._pools:
                yield
                return
            self._off(dev)
            try:
                yield
            finally:
                self._on(dev)

    @contextlib.contextmanager
    def stepped_aside(self, empty_cache: Callable[[], None]) -> Iterator[None]:
        """Allocations inside the block are PyTorch's own (no tag, not ours to
        pause); what they cached is returned by `empty_cache` at its end."""
        with self._lock:
            for dev in self._pools:
                self._off(dev)
            self._lifted += 1
        try:
            yield
        finally:
            with self._lock:
                self._lifted -= 1
                empty_cache()
                for dev in self._pools:
                    self._on(dev)
