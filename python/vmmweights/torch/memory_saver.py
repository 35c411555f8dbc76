"""A drop-in for torch_memory_saver on vmmweights memory.

Switch with one import; the calls stay as they are:

    from vmmweights.torch.memory_saver import torch_memory_saver
    with torch_memory_saver.region(tag="weights", enable_cpu_backup=True):
        model = build_model().cuda()
    with torch_memory_saver.region(tag="kv_cache"):
        kv = torch.empty(...)
    torch_memory_saver.pause()            # weights offloaded, kv_cache discarded
    torch_memory_saver.resume()

Or with no changed line at all: put :func:`alias_path` on ``PYTHONPATH`` and
``import torch_memory_saver`` is this module.

As torch_memory_saver does: a region with ``enable_cpu_backup=True`` keeps its
bytes in pinned host memory over a pause, one with ``enable_disk_backup=True``
in a file of :meth:`TorchMemorySaver.set_disk_backup_dir` (or
``TMS_DISK_BACKUP_DIR``), any other is discarded; ``pause`` and ``resume`` act
on every device; ``resume`` releases the host backup unless
``retain_cpu_backup`` is set (``TMS_RETAIN_CPU_BACKUP=1``).

Differences:
- Retained mode (``retain_cpu_backup = True``) is our persistent pinned arena:
  the next pause copies at the link's rate without pinning again.
- The shim acts only on its own tags. ``pause("x")`` of a tag it never made
  raises :class:`~vmmweights.saver.ForeignTagError` (torch_memory_saver does
  nothing); its tags show in reports as ``tms:<tag>/<cpu|disk|none>``.
- The preload hook mode (``configure_subprocess()``, ``TMS_INIT_ENABLE=1``)
  keeps PyTorch's caching allocator and needs no LD_PRELOAD. Regions use our
  memory pools as in torch mode; with ``TMS_INIT_ENABLE`` every thread's
  allocations outside regions go to the tag "default" from the process's
  start (:mod:`vmmweights.torch.process_route`). CUDA allocations made outside PyTorch (raw
  ``cudaMalloc``) are not ours to pause.
- ``get_cpu_backup`` reads the pool's pinned backup arena: ``zero_copy=True``
  is a view of it (the same address across cycles, as torch_memory_saver's).
- ``cpu_backup_backend`` is checked as torch_memory_saver checks it; our
  backup is pinned either way. ``memory_margin_bytes`` is accepted: wake
  checks free device memory itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import torch

from .._native import VmmwError
from ..saver import ForeignTagError, SaverCore, StartPlan, set_process_tag, start_plan
from ..saver import configure_subprocess as _configure_subprocess
from . import allocator as _allocator
from . import graph as _graph
from . import mem_pool as _mem_pool
from . import pool as _pool
from . import use_pool as _use_pool
from .process_route import ProcessRoute

__all__ = ["ForeignTagError", "TorchMemorySaver", "alias_path", "configure_subprocess", "torch_memory_saver"]

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")
_BACKENDS = ("mmap", "pinned")


def alias_path() -> str:
    """A directory that, first on ``PYTHONPATH``, makes ``import
    torch_memory_saver`` (and its submodules) this shim."""
    return str(Path(__file__).parent / "alias")


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """Processes started inside the block run in the preload hook mode once
    they import this shim (torch_memory_saver's preload mode, without
    LD_PRELOAD; with ``TMS_INIT_ENABLE`` their allocations outside regions
    are pauseable from the first one)."""
    with _configure_subprocess():
        yield


def _is_xpu() -> bool:
    """Whether PyTorch runs on Intel XPU, through the name torch_memory_saver's
    callers replace (``torch_memory_saver.entrypoint.is_xpu``) when that module
    is loaded."""
    probe = getattr(sys.modules.get("torch_memory_saver.entrypoint"), "is_xpu", None)
    if probe is not None:
        return bool(probe())
    return hasattr(torch, "xpu") and bool(torch.xpu.is_available())


class TorchMemorySaver:
    """torch_memory_saver's ``TorchMemorySaver``: ``region``, ``cuda_graph``,
    ``disable``, ``pause``, ``resume``, ``retain_cpu_backup``,
    ``set_disk_backup_dir``, ``get_cpu_backup``, ``hook_mode``,
    ``memory_margin_bytes``, ``enabled``."""

    def __init__(self, plan: Optional[StartPlan] = None) -> None:
        self._plan = start_plan() if plan is None else plan
        self._core = SaverCore(
            shim="torch_memory_saver",
            namespace="tms",
            pool_of=_pool,
            ranges=self._ranges,
            synchronize=torch.cuda.synchronize,
        )
        self._core.retain_cpu_backup = self._plan.retain_cpu_backup
        if self._plan.disk_dir:
            self._core.disk.set_directory(self._plan.disk_dir)
        self._lock = threading.Lock()
        self._hook_mode = "torch"
        self._route: Optional[ProcessRoute] = None
        self._margin = 0
        self._backend = self._plan.cpu_backup_backend
        if self._plan.route_all:
            self._preload()

    # --- start --------------------------------------------------------------------

    def _preload(self) -> None:
        """The preload hook mode: with ``TMS_INIT_ENABLE``, every allocation
        outside regions goes to the init tag from now on."""
        with self._lock:
            self._hook_mode = "preload"
            tag = self._plan.init_tag
            if tag is None or self._route is not None or not torch.cuda.is_available():
                return
            devices = list(range(torch.cuda.device_count()))
            name = ""
            for dev in devices:
                name = self._core.region_tag(dev, tag, self._plan.init_kind)
            # Threads with no region open (autograd's included) allocate under it.
            set_process_tag(name)
            self._route = ProcessRoute(lambda dev: torch.cuda.MemPool(_allocator().allocator()))
            self._route.start(devices)

    def _ensure_initialized(self) -> None:
        """Nothing to do: the shim is ready when imported (kept for callers of
        torch_memory_saver's private name)."""

    @property
    def hook_mode(self) -> str:
        return self._hook_mode

    @hook_mode.setter
    def hook_mode(self, mode: str) -> None:
        if mode not in _HOOK_MODES:
            raise ValueError(f"hook_mode {mode!r}: expected one of {_HOOK_MODES}")
        if mode == "preload":
            self._preload()
        # "torch" in a routed process: regions work alike; the route stays.

    @property
    def enabled(self) -> bool:
        return True

    @property
    def memory_margin_bytes(self) -> int:
        raise NotImplementedError("Only setter is supported")

    @memory_margin_bytes.setter
    def memory_margin_bytes(self, value: int) -> None:
        if int(value) < 0:
            raise ValueError(f"memory_margin_bytes must be >= 0, not {value}")
        self._margin = int(value)  # wake checks free device memory itself before mapping

    @property
    def retain_cpu_backup(self) -> bool:
        """Keep the host backup after resume (our persistent pinned arena: the
        next pause does not pin again). False by default, as upstream."""
        return self._core.retain_cpu_backup

    @retain_cpu_backup.setter
    def retain_cpu_backup(self, value: bool) -> None:
        self._core.retain_cpu_backup = bool(value)

    def set_disk_backup_dir(self, path: str) -> None:
        """The directory disk-backed regions are copied to on pause (created if needed)."""
        self._core.disk.set_directory(str(path))

    # --- regions ------------------------------------------------------------------

    def _check_backend(self, enable_cpu_backup: bool, cpu_backup_backend: Optional[str]) -> None:
        if cpu_backup_backend is None:
            return
        if not enable_cpu_backup:
            raise ValueError("cpu_backup_backend requires enable_cpu_backup=True")
        if cpu_backup_backend not in _BACKENDS:
            raise ValueError(f"cpu_backup_backend {cpu_backup_backend!r}: expected one of {_BACKENDS}")
        if _is_xpu():
            raise ValueError("cpu_backup_backend is not supported on XPU; host shadows use malloc")
        if cpu_backup_backend == "mmap" and torch.version.hip:
            raise ValueError("cpu_backup_backend='mmap' is not supported on ROCm")

    @contextlib.contextmanager
    def region(
        self,
        tag: str = _TAG_DEFAULT,
        enable_cpu_backup: bool = False,
        enable_disk_backup: bool = False,
        cpu_backup_backend: Optional[str] = None,
    ) -> Iterator[None]:
        """Allocations in the block are pauseable under `tag`: with
        `enable_cpu_backup` their bytes survive a pause in pinned host memory,
        with `enable_disk_backup` in a file; otherwise they are discarded."""
        self._check_backend(enable_cpu_backup, cpu_backup_backend)
        if enable_cpu_backup and enable_disk_backup:
            raise ValueError("enable_cpu_backup and enable_disk_backup are mutually exclusive")
        kind = "cpu" if enable_cpu_backup else "disk" if enable_disk_backup else "none"
        dev = torch.cuda.current_device()
        name = self._core.region_tag(dev, tag, kind)
        with contextlib.ExitStack() as stack:
            with self._ahead_of_route(dev):
                stack.enter_context(_use_pool(name, dev))
            stack.enter_context(self._backend_set(cpu_backup_backend))
            yield

    def _ahead_of_route(self, dev: int) -> "contextlib.AbstractContextManager[None]":
        """PyTorch pool entries made inside come ahead of the process route's."""
        return self._route.behind(dev) if self._route is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def _backend_set(self, backend: Optional[str]) -> Iterator[None]:
        old, self._backend = self._backend, backend or self._backend
        try:
            yield
        finally:
            self._backend = old

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
        self._check_backend(enable_cpu_backup, cpu_backup_backend)
        dev = torch.cuda.current_device()
        name = self._core.region_tag(dev, tag, "cpu" if enable_cpu_backup else "none")
        if pool is not None:
            warnings.warn("torch_memory_saver (vmmweights): cuda_graph(pool=...) is ignored; the graph's memory goes to the tag's pool")
        with contextlib.ExitStack() as stack:
            with self._ahead_of_route(dev):
                stack.enter_context(_graph(cuda_graph, name, device=dev, stream=stream, capture_error_mode=capture_error_mode))
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations in the block are not pauseable; their memory is returned
        when the block ends."""
        if self._route is not None:
            with self._route.stepped_aside(_torch_empty_cache):
                yield
            return
        mp = torch.cuda.MemPool()
        with torch.cuda.use_mem_pool(mp):
            yield
        del mp

    # --- pause and resume ---------------------------------------------------------

    def pause(self, tag: Optional[str] = None) -> None:
        """Release the memory of `tag` (every tag of this shim when None) on
        every device, keeping every pointer."""
        self._core.pause(tag)

    def resume(self, tag: Optional[str] = None) -> None:
        """Map the memory of `tag` (every paused tag of this shim when None)
        again on every device, at the same addresses."""
        self._core.resume(tag)

    def get_cpu_backup(self, x: torch.Tensor, zero_copy: bool = False) -> Optional[torch.Tensor]:
        """A CPU tensor of `x`'s shape, strides and dtype holding the bytes the
        last pause of `x`'s CPU-backup tag kept in the pool's pinned backup:
        while the tag is paused, and after a resume while the backup is
        retained (``retain_cpu_backup``); ``None`` where no backup holds `x`
        (not in a CPU-backup tag of this shim, or released by a resume).

        ``zero_copy=True`` returns a view of the pinned backup itself, at the
        same host address across pause cycles of the tag. The pool owns that
        memory: the view is valid until a resume releases the backup (one
        without ``retain_cpu_backup``) or `x`'s memory is freed; drop it
        before then. Without ``zero_copy`` the bytes are copied out."""
        dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
        storage = x.untyped_storage()
        ptr, nbytes = storage.data_ptr(), storage.nbytes()
        names = self._core.own.pool_tags(dev)
        if not nbytes or not any(SaverCore.kind_of(n) == "cpu" for n in names):
            return None
        try:
            owner, host = _pool(dev).backup_view(ptr, nbytes)
        except VmmwError as e:
            # Not in the pool, or no backup of it: none to return. A backup in
            # several pieces of the arena is copied out piece by piece instead.
            if e.status_name not in ("VMMW_UNKNOWN_POINTER", "VMMW_INVALID_STATE"):
                raise
            if zero_copy or "separate pieces" not in str(e):
                return None
            raw = torch.empty(nbytes, dtype=torch.uint8)
            owner = _pool(dev).read_backup_into(ptr, raw.data_ptr(), nbytes)
            return self._shaped(raw, x) if owner in names and SaverCore.kind_of(owner) == "cpu" else None
        if owner not in names or SaverCore.kind_of(owner) != "cpu":
            return None
        view = torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(host), dtype=torch.uint8)
        return self._shaped(view if zero_copy else view.clone(), x)

    @staticmethod
    def _shaped(raw: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """`raw` (the bytes of `x`'s storage) as a tensor shaped like `x`."""
        return raw.view(x.dtype).as_strided(x.size(), x.stride(), x.storage_offset())

    def _ranges(self, dev: int, pool_tag: str) -> List[Tuple[int, int]]:
        """The device ranges PyTorch's memory pool of `pool_tag` holds on `dev`."""
        pid = tuple(_mem_pool(pool_tag, dev).id)
        return [
            (int(s["address"]), int(s["total_size"]))
            for s in torch.cuda.memory_snapshot()
            if s.get("device") == dev and tuple(s.get("segment_pool_id", ())) == pid
        ]


_torch_empty_cache = torch.cuda.memory.empty_cache


#: The global instance, as ``from torch_memory_saver import torch_memory_saver``.
torch_memory_saver = TorchMemorySaver()
