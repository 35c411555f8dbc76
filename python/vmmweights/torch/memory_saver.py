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
  routes every PyTorch allocation of the process through our pluggable
  allocator from the first one; no LD_PRELOAD. CUDA allocations made outside
  PyTorch (raw ``cudaMalloc``) are not ours to pause.
- ``get_cpu_backup`` copies a paused tensor's bytes out of the pool's host
  backup; it returns ``None`` where torch_memory_saver holds no backup. Our
  backup arena is not exposed as tensors: ``zero_copy=True`` and the retained
  backup of a resumed tensor raise.
- ``cpu_backup_backend`` is checked as torch_memory_saver checks it; our
  backup is pinned either way. ``memory_margin_bytes`` is accepted: wake
  checks free device memory itself.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Iterator, List, Optional, Tuple

import torch

from .. import tags as _tags
from .._native import VmmwError
from ..saver import ROUTE_ENV, ForeignTagError, SaverCore, StartPlan, held, set_process_tag, start_plan
from ..saver import configure_subprocess as _configure_subprocess
from . import allocator as _allocator
from . import graph as _graph
from . import mem_pool as _mem_pool
from . import pool as _pool
from . import use_pool as _use_pool

__all__ = ["ForeignTagError", "TorchMemorySaver", "alias_path", "configure_subprocess", "torch_memory_saver"]

_TAG_DEFAULT = "default"
_HOOK_MODES = ("preload", "torch")
_BACKENDS = ("mmap", "pinned")
# The tag of allocations that are nobody's to pause (outside every region, inside disable()).
_UNTRACKED_TAG = "default"


def alias_path() -> str:
    """A directory that, first on ``PYTHONPATH``, makes ``import
    torch_memory_saver`` (and its submodules) this shim."""
    return str(Path(__file__).parent / "alias")


@contextlib.contextmanager
def configure_subprocess() -> Iterator[None]:
    """Processes started inside the block route every PyTorch allocation
    through our allocator from their first one, once they import this shim
    (torch_memory_saver's preload mode, without LD_PRELOAD)."""
    with _configure_subprocess():
        yield


def _route_process() -> None:
    """Make our pluggable allocator the process's PyTorch allocator."""
    try:
        torch.cuda.memory.change_current_allocator(_allocator())
    except RuntimeError as e:
        raise RuntimeError(
            "torch_memory_saver (vmmweights): hook_mode='preload' routes every allocation through "
            "our allocator, which must happen before the process's first CUDA allocation; start the "
            f"process inside configure_subprocess() (or with {ROUTE_ENV}=1 or TMS_INIT_ENABLE=1) and "
            f"import this module first ({e})"
        ) from None


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
        self._routed = False
        self._graph_captured = False
        self._hook_mode = "torch"
        self._margin = 0
        self._backend = self._plan.cpu_backup_backend
        if self._plan.route_all:
            self._route()

    # --- start --------------------------------------------------------------------

    def _route(self) -> None:
        with self._lock:
            if self._routed:
                return
            _route_process()
            self._routed = True
            self._hook_mode = "preload"
            if self._plan.init_tag is not None:
                for dev in range(max(torch.cuda.device_count(), 1)):
                    name = self._core.region_tag(dev, self._plan.init_tag, self._plan.init_kind)
                set_process_tag(name)

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
            self._route()
        # "torch" in a routed process: regions still tag our allocations.

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
        if enable_disk_backup and self._routed:
            raise NotImplementedError(
                "torch_memory_saver (vmmweights): enable_disk_backup needs hook_mode='torch' here "
                "(the disk copy lists the region's memory through its PyTorch memory pool)"
            )
        kind = "cpu" if enable_cpu_backup else "disk" if enable_disk_backup else "none"
        dev = torch.cuda.current_device()
        name = self._core.region_tag(dev, tag, kind)
        if self._routed:
            with _tags.scope(name), self._backend_set(cpu_backup_backend):
                yield
        else:
            with _use_pool(name, dev), self._backend_set(cpu_backup_backend):
                yield

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
        if self._routed:
            # Our allocator maps new memory with driver calls, which "global" capture
            # forbids; PyTorch's caching allocator relaxes its own the same way.
            # The graph's blocks stay in the tag's segments: eager work never reuses them.
            mode = "relaxed" if capture_error_mode == "global" else capture_error_mode
            self._graph_captured = True
            with torch.cuda.graph(cuda_graph, pool=pool, stream=stream, capture_error_mode=mode):
                with _tags.scope(name):
                    yield
            return
        if pool is not None:
            warnings.warn("torch_memory_saver (vmmweights): cuda_graph(pool=...) is ignored; the graph's memory goes to the tag's pool")
        with _graph(cuda_graph, name, device=dev, stream=stream, capture_error_mode=capture_error_mode):
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations in the block are not pauseable; their memory is returned
        when the block ends."""
        if self._routed:
            with _tags.scope(_UNTRACKED_TAG):
                yield
            # Return what the block freed. Not after a routed graph capture: blocks a
            # graph freed while capturing look free to the pool but replays use them.
            if not self._graph_captured:
                torch.cuda.synchronize()
                for dev in self._core.own.devices() or [torch.cuda.current_device()]:
                    _pool(dev).trim()
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
        pause of `x`'s tag copied to the host backup, read out of the pool's
        backup without waking it; ``None`` where torch_memory_saver holds no
        backup (`x` in no paused CPU-backup tag of this shim, and the backup
        not retained). Backups kept after ``resume`` (retained) are not
        readable: the pool reads backups of asleep memory only."""
        dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
        ptr, nbytes = x.untyped_storage().data_ptr(), x.untyped_storage().nbytes()
        names = self._core.own.pool_tags(dev)
        offloaded = {n for n, asleep in held(_pool(dev), names).items() if asleep and SaverCore.kind_of(n) == "cpu"}
        if offloaded and nbytes:
            raw = torch.empty(nbytes, dtype=torch.uint8)
            try:
                owner: Optional[str] = _pool(dev).read_backup_into(ptr, raw.data_ptr(), nbytes)
            except VmmwError as e:
                # Not in the pool, or in memory with no backup of it: not ours to return.
                if e.status_name not in ("VMMW_UNKNOWN_POINTER", "VMMW_INVALID_STATE"):
                    raise
                owner = None
            if owner in offloaded:
                if zero_copy:
                    raise NotImplementedError(
                        "torch_memory_saver (vmmweights): get_cpu_backup(zero_copy=True) is not available: the "
                        f"backup of tag {names[owner]!r} lies in the pool's pinned arena, which is not exposed "
                        "as tensors; call it without zero_copy for a copy"
                    )
                return raw.view(x.dtype).as_strided(x.size(), x.stride(), x.storage_offset())
        if not self._core.retain_cpu_backup:
            return None
        raise NotImplementedError(
            "torch_memory_saver (vmmweights): get_cpu_backup of a tensor that is not paused is not available: "
            f"its retained backup stays in the pool's pinned arena (paused CPU-backup tags: {sorted(offloaded)})"
        )

    def _ranges(self, dev: int, pool_tag: str) -> List[Tuple[int, int]]:
        """The device ranges PyTorch's memory pool of `pool_tag` holds on `dev`."""
        pid = tuple(_mem_pool(pool_tag, dev).id)
        return [
            (int(s["address"]), int(s["total_size"]))
            for s in torch.cuda.memory_snapshot()
            if s.get("device") == dev and tuple(s.get("segment_pool_id", ())) == pid
        ]


#: The global instance, as ``from torch_memory_saver import torch_memory_saver``.
torch_memory_saver = TorchMemorySaver()
