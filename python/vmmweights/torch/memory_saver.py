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

Speed: the default is the fast mode. A releasing resume drops the backup
(``get_cpu_backup`` returns None after it, as upstream's) but keeps the
pinned host memory under it in the pool's backup arena, so from the second
cycle on a pause copies at the link's rate without pinning again, and a
resume does not unpin; torch_memory_saver allocates and pins its backup at
every pause and frees it at every resume. ``retain_cpu_backup`` adds only
that the backup stays readable after resume. ``cpu_backup_backend="mmap"``
(or ``TMS_INIT_CPU_BACKUP_BACKEND=mmap``) is the mode that gives the host
memory back at every resume, as upstream's mmap backend does, and pins again
at the next pause. Memory freed while it holds a backup gives that backup's
pinned memory back at once.

Differences:
- The host memory under a released backup stays pinned in the pool until
  ``vmmweights.torch.pool().release_backup()``, an "mmap" region's resume,
  or the memory's free (see Speed).
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
  backup is pinned either way (the backends differ in when the host memory
  goes, see Speed). ``memory_margin_bytes`` is accepted: wake checks free
  device memory itself.
- Upstream's own test suite reaches into ``torch_memory_saver._impl``
  (``_mem_pools``, ``_with_region_config``, ``_binary_wrapper.cdll``): the
  shim answers those names from its own state (:class:`_Internals`), so
  those tests check what they check of user-visible behaviour here too.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch

from .._native import VmmwError
from ..saver import HOST_KINDS, ForeignTagError, RegionConfigs, SaverCore, StartPlan, set_process_tag, start_plan
from ..saver import configure_subprocess as _configure_subprocess
from . import allocator as _allocator
from . import graph as _graph
from . import mem_pool as _mem_pool
from . import pool as _pool
from . import take_mem_pool as _take_mem_pool
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
        self._configs = RegionConfigs(self._plan)
        self._internals: Optional[_Internals] = None
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
    def _impl(self) -> "_Internals":
        """The private object torch_memory_saver's own tests reach into."""
        if self._internals is None:
            self._internals = _Internals(self)
        return self._internals

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
        dev = torch.cuda.current_device()
        with contextlib.ExitStack() as stack:
            config = stack.enter_context(self._configs.entered(tag, enable_cpu_backup, cpu_backup_backend,
                                                               enable_disk_backup))
            name = self._core.region_tag(dev, tag, config.kind)
            with self._ahead_of_route(dev):
                stack.enter_context(_use_pool(name, dev))
            yield

    def _ahead_of_route(self, dev: int) -> "contextlib.AbstractContextManager[None]":
        """PyTorch pool entries made inside come ahead of the process route's."""
        return self._route.behind(dev) if self._route is not None else contextlib.nullcontext()

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
        if pool is not None:
            warnings.warn("torch_memory_saver (vmmweights): cuda_graph(pool=...) is ignored; the graph's memory goes to the tag's pool")
        with contextlib.ExitStack() as stack:
            config = stack.enter_context(self._configs.entered(tag, enable_cpu_backup, cpu_backup_backend, False))
            name = self._core.region_tag(dev, tag, config.kind)
            with self._ahead_of_route(dev):
                stack.enter_context(_graph(cuda_graph, name, device=dev, stream=stream, capture_error_mode=capture_error_mode))
            yield

    @contextlib.contextmanager
    def disable(self) -> Iterator[None]:
        """Allocations in the block are not pauseable; their memory is returned
        when the block ends."""
        was = self._configs.current().interesting
        self._configs.set(interesting=False)
        try:
            if self._route is not None:
                with self._route.stepped_aside(_torch_empty_cache):
                    yield
                return
            mp = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(mp):
                yield
            del mp
        finally:
            self._configs.set(interesting=was)

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
        if not nbytes or not any(SaverCore.kind_of(n) in HOST_KINDS for n in names):
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
            return self._shaped(raw, x) if owner in names and SaverCore.kind_of(owner) in HOST_KINDS else None
        if owner not in names or SaverCore.kind_of(owner) not in HOST_KINDS:
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


class _MemPools:
    """The shim's PyTorch memory pools by torch_memory_saver's key, ``(tag,
    enable_cpu_backup, enable_disk_backup, backend or "", device)``: the
    ``_impl._mem_pools`` its tests pop a region's pool from, to free it."""

    def __init__(self, saver: TorchMemorySaver) -> None:
        self._saver = saver

    def _pool_tag(self, key: Tuple[str, bool, bool, str, int]) -> Tuple[str, int]:
        tag, cpu, disk, backend, dev = key
        kind = ("mmap" if backend == "mmap" else "cpu") if cpu else "disk" if disk else "none"
        return self._saver._core.own.pool_tag(tag, kind), int(dev)

    def __getitem__(self, key: Tuple[str, bool, bool, str, int]) -> Any:
        name, dev = self._pool_tag(key)
        return _mem_pool(name, dev)

    def pop(self, key: Tuple[str, bool, bool, str, int], *default: Any) -> Any:
        """Forget the pool: dropped with its tensors, its memory is freed."""
        name, dev = self._pool_tag(key)
        mp = _take_mem_pool(name, dev)
        if mp is None:
            if default:
                return default[0]
            raise KeyError(key)
        return mp


def _cudart() -> ctypes.CDLL:
    """The CUDA runtime library this process loaded (PyTorch's)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "libcudart.so" in line and line.split()[-1].startswith("/")}
    if not paths:
        raise OSError("no CUDA runtime (libcudart.so) is loaded in this process")
    return ctypes.CDLL(sorted(paths)[0])


class _Library:
    """What torch_memory_saver's tests read through
    ``_impl._binary_wrapper.cdll``: upstream's C library's per-thread region
    settings (``tms_get_current_tag``, ``tms_get_interesting_region``,
    ``tms_get_enable_cpu_backup``, ``tms_get_cpu_backup_backend``,
    ``tms_get_enable_disk_backup``, their setters, retain, pause and resume),
    answered from the shim's own state; any other name is a CUDA runtime
    function of this process (``cudaHostGetFlags``)."""

    def __init__(self, saver: TorchMemorySaver) -> None:
        cfg = saver._configs
        self._calls: Dict[str, Callable[..., Any]] = {
            "tms_get_current_tag": lambda: cfg.current().tag.encode(),
            "tms_set_current_tag": lambda t: cfg.set(tag=_text(t)),
            "tms_get_interesting_region": lambda: cfg.current().interesting,
            "tms_set_interesting_region": lambda on: cfg.set(interesting=bool(on)),
            "tms_get_enable_cpu_backup": lambda: cfg.current().cpu_backup,
            "tms_set_enable_cpu_backup": lambda on: cfg.set(cpu_backup=bool(on)),
            "tms_get_cpu_backup_backend": lambda: cfg.current().backend.encode(),
            "tms_set_cpu_backup_backend": lambda b: cfg.set(backend=_text(b)),
            "tms_get_enable_disk_backup": lambda: cfg.current().disk_backup,
            "tms_set_enable_disk_backup": lambda on: cfg.set(disk_backup=bool(on)),
            "tms_set_disk_backup_dir": lambda d: saver.set_disk_backup_dir(_text(d)),
            "tms_get_retain_cpu_backup": lambda: saver.retain_cpu_backup,
            "tms_set_retain_cpu_backup": lambda on: setattr(saver, "retain_cpu_backup", bool(on)),
            "tms_pause": lambda t: _status(saver.pause, t),
            "tms_resume": lambda t: _status(saver.resume, t),
        }

    def __getattr__(self, name: str) -> Any:
        call = self.__dict__.get("_calls", {}).get(name)
        if call is not None:
            return call
        return getattr(_cudart(), name)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _status(act: Callable[[Optional[str]], None], tag: Any) -> int:
    """`act` on `tag` (None: every tag) as upstream's C call does it: 0 when done."""
    act(_text(tag) if tag else None)
    return 0


class _BinaryWrapper:
    def __init__(self, saver: TorchMemorySaver) -> None:
        self.cdll = _Library(saver)


class _Internals:
    """``torch_memory_saver._impl`` over the shim: the three names upstream's
    test suite reaches into (``_mem_pools``, ``_with_region_config``,
    ``_binary_wrapper``), each answered from the shim's own state."""

    def __init__(self, saver: TorchMemorySaver) -> None:
        self._saver = saver
        self._mem_pools = _MemPools(saver)
        self._binary_wrapper = _BinaryWrapper(saver)

    @contextlib.contextmanager
    def _with_region_config(self, tag: str, enable_cpu_backup: bool, cpu_backup_backend: Optional[str],
                            enable_disk_backup: bool = False) -> Iterator[None]:
        """This thread's region settings for `tag` inside the block, without
        entering the region's memory pool."""
        with self._saver._configs.entered(tag, enable_cpu_backup, cpu_backup_backend, enable_disk_backup):
            yield


#: The global instance, as ``from torch_memory_saver import torch_memory_saver``.
torch_memory_saver = TorchMemorySaver()
