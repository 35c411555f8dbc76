"""A drop-in for torch_memory_saver's ``TorchMemorySaver`` on vmmweights memory.

Switch with one import; the calls stay as they are:

    from vmmweights.torch.memory_saver import torch_memory_saver
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = build_model().cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(...)
    torch_memory_saver.pause()            # weights offloaded, kv_cache discarded
    torch_memory_saver.resume()

A region with ``enable_cpu_backup=True`` makes its tag sleep with "offload"
(contents kept), otherwise with "discard", as torch_memory_saver does; a tag
with both kinds of regions is offloaded. Memory lives in our pool through
PyTorch's pluggable allocator (torch_memory_saver's ``hook_mode="torch"``), so
no LD_PRELOAD is needed, also for CUDA graphs.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from typing import Any, Dict, Iterator, Optional

import torch

from . import graph as _graph
from . import pool as _pool
from . import use_pool as _use_pool

_TAG_DEFAULT = "default"


class TorchMemorySaver:
    """torch_memory_saver's public API: ``region``, ``cuda_graph``,
    ``disable``, ``pause``, ``resume``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._policies: Dict[int, Dict[str, str]] = {}  # device -> tag -> policy

    def _note(self, tag: str, enable_cpu_backup: bool) -> int:
        dev = int(torch.cuda.current_device())
        with self._lock:
            tags = self._policies.setdefault(dev, {})
            if enable_cpu_backup or tags.get(tag) != "offload":
                tags[tag] = "offload" if enable_cpu_backup else "discard"
            _pool(dev).set_default_policy(tag, tags[tag])
        return dev

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """Allocations in the block are pauseable under `tag`; with
        `enable_cpu_backup` their contents survive pause/resume (in pinned
        host memory, whatever `cpu_backup_backend` names)."""
        if enable_disk_backup:
            raise NotImplementedError("vmmweights keeps backups in pinned host memory; enable_disk_backup is not supported")
        dev = self._note(tag, enable_cpu_backup)
        with _use_pool(tag, dev):
            yield

    @contextlib.contextmanager
    def cuda_graph(
        self,
        cuda_graph: "torch.cuda.CUDAGraph",
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """As ``torch.cuda.graph``, with the graph's memory pauseable under `tag`."""
        if pool is not None:
            warnings.warn("vmmweights: cuda_graph(pool=...) is ignored; the graph's memory goes to the tag's pool")
        dev = self._note(tag, enable_cpu_backup)
        with _graph(cuda_graph, tag, device=dev, stream=stream, capture_error_mode=capture_error_mode):
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations in the block use PyTorch's own memory (not pauseable)."""
        mp = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(mp):
            yield
        del mp

    def _tags(self, tag: Optional[str]) -> Dict[str, str]:
        dev = torch.cuda.current_device()
        with self._lock:
            known = dict(self._policies.get(dev, {}))
        if tag is not None:
            return {tag: known.get(tag, "discard")}
        held = set(_pool(dev).tags())
        return {t: p for t, p in known.items() if t in held}

    def pause(self, tag: Optional[str] = None) -> None:
        """Release the memory of `tag` (every tag when None), keeping pointers."""
        torch.cuda.synchronize()
        items = self._tags(tag)
        if items:
            _pool().sleep(items)

    def resume(self, tag: Optional[str] = None) -> None:
        """Bring `tag` (every paused tag when None) back at the same addresses."""
        if tag is None:
            _pool().wake()
        else:
            _pool().wake(tag)

    @property
    def enabled(self) -> bool:
        return True

    @property
    def hook_mode(self) -> str:
        return "torch"

    @hook_mode.setter
    def hook_mode(self, mode: str) -> None:
        pass  # one mode here: PyTorch's pluggable allocator

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        pass  # wake checks free device memory itself before mapping anything


#: The global instance, as ``from torch_memory_saver import torch_memory_saver``.
torch_memory_saver = TorchMemorySaver()
