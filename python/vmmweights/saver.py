"""What the drop-in memory savers decide, without PyTorch: which tags are
theirs, how each sleeps and wakes, where a disk backup goes, and whether a
process routes its allocations through us from the start.

The PyTorch shims (:mod:`vmmweights.torch.memory_saver`,
:mod:`vmmweights.torch.cumem`) only add what needs PyTorch (memory pools,
graphs, synchronizing); every decision here runs on the host backend in CI.

A shim's tags live under a namespace of their own in the pool ("tms:weights/cpu",
"cumem:kv_cache"), so a shim never touches a tag another part of the process
made (``vt.use_pool("weights")``), and a tag it never created is an error that
names it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

from ._native import call
from .pool import Pool
from .tags import tag_id

#: How a torch_memory_saver region keeps its bytes over a pause, and the pool
#: policy behind it: "cpu" (``enable_cpu_backup``) offloads to pinned host
#: memory; "mmap" (``enable_cpu_backup`` with ``cpu_backup_backend="mmap"``)
#: too, its host memory given back at every releasing resume; "disk"
#: (``enable_disk_backup``) copies to a file, then discards; "none" discards.
KIND_POLICY = {"none": "discard", "cpu": "offload", "mmap": "offload", "disk": "discard"}

#: The kinds whose bytes a pause keeps in host memory.
HOST_KINDS = ("cpu", "mmap")

#: Bytes copied per step between a disk backup file and device memory.
DISK_PIECE_BYTES = 64 << 20

Range = Tuple[int, int]  # (device address, bytes)


class ForeignTagError(ValueError):
    """A shim was asked to pause, sleep or wake a tag it never created."""

    def __init__(self, shim: str, tag: str, known: Sequence[str]) -> None:
        self.tag = tag
        mine = ", ".join(repr(t) for t in sorted(known)) or "none yet"
        super().__init__(
            f"{shim}: tag {tag!r} was not created by this shim (its tags: {mine}); "
            "it acts only on memory it allocated"
        )


def truthy(value: Optional[str]) -> bool:
    """An environment flag as torch_memory_saver reads it: "1" (or true/yes/on)."""
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


# --- own tags --------------------------------------------------------------------------


class OwnTags:
    """The tags one shim created, per device, each a pool tag named
    ``<namespace>:<tag>`` (with ``/<kind>`` when the kind is part of it).
    Thread-safe."""

    def __init__(self, shim: str, namespace: str) -> None:
        self.shim = shim
        self.namespace = namespace
        self._lock = threading.Lock()
        self._made: Dict[int, Dict[str, Set[str]]] = {}  # device -> tag -> pool tags

    def pool_tag(self, tag: str, kind: Optional[str] = None) -> str:
        """The pool tag holding `tag`'s memory (of `kind`, when kinds apply)."""
        if not isinstance(tag, str) or not tag:
            raise ValueError(f"{self.shim}: a tag is a non-empty string, not {tag!r}")
        name = f"{self.namespace}:{tag}" + (f"/{kind}" if kind is not None else "")
        tag_id(name)  # a name too long for the registry fails here, naming it
        return name

    def note(self, device: int, tag: str, kind: Optional[str] = None) -> str:
        """Record that the shim allocates `tag` on `device`; its pool tag."""
        name = self.pool_tag(tag, kind)
        with self._lock:
            self._made.setdefault(device, {}).setdefault(tag, set()).add(name)
        return name

    def devices(self) -> List[int]:
        with self._lock:
            return sorted(self._made)

    def tags(self) -> List[str]:
        """Every tag the shim created, on any device."""
        with self._lock:
            return sorted({t for per in self._made.values() for t in per})

    def check(self, tags: Sequence[str]) -> None:
        """Raise :class:`ForeignTagError` for the first tag the shim never created."""
        known = self.tags()
        for t in tags:
            if t not in known:
                raise ForeignTagError(self.shim, t, known)

    def pool_tags(self, device: int, tags: Optional[Sequence[str]] = None) -> Dict[str, str]:
        """Pool tag -> the shim's tag, for `tags` (every own tag when None) on `device`."""
        with self._lock:
            per = self._made.get(device, {})
            chosen = per if tags is None else {t: per[t] for t in tags if t in per}
            return {p: t for t, names in chosen.items() for p in names}


def held(pool: Pool, names: Mapping[str, str]) -> Dict[str, bool]:
    """Pool tag -> asleep, for those of `names` holding memory in `pool` now."""
    return {t["tag"]: bool(t["asleep"]) for t in pool.report()["tags"] if t["tag"] in names}


# --- disk backup ------------------------------------------------------------------------


class DiskBackup:
    """Copies of paused memory in files of one directory, one file per range:
    written before the memory is released, read back after it is mapped again."""

    def __init__(self, directory: Optional[str] = None) -> None:
        self.directory = directory
        self._files: Dict[Tuple[int, str], List[Tuple[str, Range]]] = {}  # (device, pool tag) -> files

    def set_directory(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)
        self.directory = path

    def _dir(self, pool_tag: str) -> str:
        if not self.directory:
            raise ValueError(
                f"tag {pool_tag!r} has a disk backup but no directory is set: call "
                "set_disk_backup_dir(path) or set TMS_DISK_BACKUP_DIR"
            )
        os.makedirs(self.directory, exist_ok=True)
        return self.directory

    def save(self, pool: Pool, device: int, pool_tag: str, ranges: Sequence[Range]) -> int:
        """Write each range of awake `pool` memory to a file; bytes written."""
        base = self._dir(pool_tag)
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in pool_tag)
        files: List[Tuple[str, Range]] = []
        total = 0
        try:
            for i, (ptr, size) in enumerate(sorted(ranges)):
                path = os.path.join(base, f"vmmw-{os.getpid()}-dev{device}-{safe}-{i}.bin")
                with open(path, "wb") as f:
                    files.append((path, (ptr, size)))
                    for off in range(0, size, DISK_PIECE_BYTES):
                        f.write(pool.read(ptr + off, min(DISK_PIECE_BYTES, size - off)))
                total += size
        except BaseException:
            for path, _ in files:
                with contextlib.suppress(OSError):
                    os.unlink(path)
            raise
        self.drop(device, pool_tag)
        self._files[(device, pool_tag)] = files
        return total

    def restore(self, pool: Pool, device: int, pool_tag: str) -> int:
        """Copy the files of `pool_tag` back into its (awake) memory; bytes read."""
        total = 0
        for path, (ptr, size) in self._files.get((device, pool_tag), []):
            with open(path, "rb") as f:
                for off in range(0, size, DISK_PIECE_BYTES):
                    data = f.read(min(DISK_PIECE_BYTES, size - off))
                    if len(data) != min(DISK_PIECE_BYTES, size - off):
                        raise OSError(f"disk backup {path} of tag {pool_tag!r} is shorter than the {size} bytes written")
                    pool.write(ptr + off, data)
            total += size
        return total

    def drop(self, device: int, pool_tag: str) -> None:
        """Delete the files of `pool_tag` on `device`."""
        for path, _ in self._files.pop((device, pool_tag), []):
            with contextlib.suppress(OSError):
                os.unlink(path)

    def files(self, device: int, pool_tag: str) -> List[str]:
        return [p for p, _ in self._files.get((device, pool_tag), [])]


# --- pause and resume ----------------------------------------------------------------------


class SaverCore:
    """torch_memory_saver's pause/resume over our pools, for the tags a shim
    created: pause offloads "cpu" and "mmap" tags, copies "disk" tags to
    files and discards the rest; resume wakes only the shim's own sleeping
    tags, restores disk copies, and (unless :attr:`retain_cpu_backup`)
    releases the host backups of the tags it woke, as torch_memory_saver
    does.

    What a releasing resume gives back: the backups (nothing of them is
    readable afterwards), not the pinned memory under "cpu" tags' backups,
    which stays in the pool's backup arena so the next pause copies at the
    link's rate without pinning again (torch_memory_saver allocates and
    pins at every pause). "mmap" tags (torch_memory_saver's reclaimable
    backend) also unpin every backup slab left holding nothing, so the
    process's host memory drops at each resume, at the cost of pinning
    again at the next pause. Memory freed while it holds a backup gives
    that backup's pinned memory back at once.

    `pool_of(device)` gives the pool of a device; `ranges(device, pool_tag)`
    the device ranges a disk-backed tag holds (from PyTorch's memory pools in
    the shim, from the caller in tests); `synchronize(device)` waits for queued
    work before memory is released."""

    def __init__(
        self,
        shim: str = "torch_memory_saver",
        namespace: str = "tms",
        pool_of: Callable[[int], Pool] = Pool.default,
        ranges: Optional[Callable[[int, str], Sequence[Range]]] = None,
        synchronize: Optional[Callable[[int], None]] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> None:
        env = os.environ if env is None else env
        self.own = OwnTags(shim, namespace)
        self.pool_of = pool_of
        self.ranges = ranges
        self.synchronize = synchronize
        self.retain_cpu_backup = truthy(env.get("TMS_RETAIN_CPU_BACKUP"))
        self.disk = DiskBackup(env.get("TMS_DISK_BACKUP_DIR") or None)
        self._lock = threading.RLock()

    def region_tag(self, device: int, tag: str, kind: str) -> str:
        """Note a region of `tag` with backup `kind` on `device`; the pool tag
        its allocations get (its pause policy set)."""
        if kind not in KIND_POLICY:
            raise ValueError(f"unknown backup kind {kind!r}: expected one of {sorted(KIND_POLICY)}")
        name = self.own.note(device, tag, kind)
        self.pool_of(device).set_default_policy(name, KIND_POLICY[kind])
        return name

    @staticmethod
    def kind_of(pool_tag: str) -> str:
        return pool_tag.rsplit("/", 1)[1]

    def pause(self, tag: Optional[str] = None) -> Dict[int, List[str]]:
        """Release the memory of `tag` (every own tag when None) on every
        device; the pool tags put to sleep, per device. A tag the shim never
        created raises :class:`ForeignTagError` before anything moves."""
        with self._lock:
            wanted = None if tag is None else [tag]
            if wanted is not None:
                self.own.check(wanted)
            done: Dict[int, List[str]] = {}
            for dev in self.own.devices():
                names = self.own.pool_tags(dev, wanted)
                pool = self.pool_of(dev)
                awake = sorted(n for n, asleep in held(pool, names).items() if not asleep)
                if not awake:
                    continue
                if self.synchronize is not None:
                    self.synchronize(dev)
                for name in awake:
                    if self.kind_of(name) == "disk":
                        if self.ranges is None:
                            raise ValueError(f"tag {names[name]!r} has a disk backup but this shim cannot list its memory")
                        self.disk.save(pool, dev, name, self.ranges(dev, name))
                pool.sleep({n: KIND_POLICY[self.kind_of(n)] for n in awake})
                done[dev] = awake
            return done

    def resume(self, tag: Optional[str] = None) -> Dict[int, List[str]]:
        """Map the memory of `tag` (every own sleeping tag when None) again on
        every device, at the same addresses; the pool tags woken, per device."""
        with self._lock:
            wanted = None if tag is None else [tag]
            if wanted is not None:
                self.own.check(wanted)
            done: Dict[int, List[str]] = {}
            for dev in self.own.devices():
                names = self.own.pool_tags(dev, wanted)
                pool = self.pool_of(dev)
                asleep = sorted(n for n, a in held(pool, names).items() if a)
                if not asleep:
                    continue
                try:
                    pool.wake(*asleep)
                finally:
                    # Each tag wakes all or nothing: a disk tag that woke gets its
                    # bytes back even when another tag of the call failed.
                    now = held(pool, names)
                    for name in asleep:
                        if self.kind_of(name) == "disk" and not now.get(name, True):
                            self.disk.restore(pool, dev, name)
                            if not self.retain_cpu_backup:
                                self.disk.drop(dev, name)
                if self.synchronize is not None:
                    self.synchronize(dev)
                if not self.retain_cpu_backup:
                    woke = held(pool, names)
                    kept = [n for n in asleep if self.kind_of(n) in HOST_KINDS and not woke.get(n, True)]
                    if kept:
                        pool.drop_backups(*kept, unpin=any(self.kind_of(n) == "mmap" for n in kept))
                done[dev] = asleep
            return done


# --- the per-thread region settings -----------------------------------------------------------


@dataclass(frozen=True)
class RegionConfig:
    """What a torch_memory_saver region sets for the allocations a thread
    makes inside it, as upstream's C library keeps it per thread: the tag,
    whether allocations are pauseable at all ("interesting"), and how they
    keep their bytes."""

    tag: str
    interesting: bool
    cpu_backup: bool
    backend: str  # "pinned" or "mmap": the host memory a CPU backup lives in
    disk_backup: bool

    @property
    def kind(self) -> str:
        """The backup kind of the pool tag these settings allocate under."""
        if self.cpu_backup:
            return "mmap" if self.backend == "mmap" else "cpu"
        return "disk" if self.disk_backup else "none"


class RegionConfigs:
    """Each thread's current :class:`RegionConfig`, starting from the
    process's start plan (``TMS_INIT_ENABLE`` makes every allocation
    pauseable, ``TMS_INIT_ENABLE_CPU_BACKUP`` backs it up,
    ``TMS_INIT_CPU_BACKUP_BACKEND`` names the backend), changed for the
    length of a region by :meth:`entered`."""

    def __init__(self, plan: "StartPlan") -> None:
        self._start = RegionConfig(
            tag="default",
            interesting=plan.init_tag is not None,
            cpu_backup=plan.init_kind in HOST_KINDS,
            backend=plan.cpu_backup_backend,
            disk_backup=plan.init_kind == "disk",
        )
        self._local = threading.local()

    def current(self) -> RegionConfig:
        return getattr(self._local, "config", self._start)

    def set(self, **changes: object) -> None:
        """Change this thread's settings from now on (what upstream's
        ``tms_set_*`` calls do)."""
        import dataclasses

        self._local.config = dataclasses.replace(self.current(), **changes)  # type: ignore[arg-type]

    @contextlib.contextmanager
    def entered(self, tag: str, cpu_backup: bool, backend: Optional[str], disk_backup: bool) -> Iterator[RegionConfig]:
        """This thread's settings for a region of `tag` inside the block (the
        backend unchanged when `backend` is None), restored after it."""
        old = self.current()
        self.set(tag=tag, interesting=True, cpu_backup=cpu_backup, backend=backend or old.backend,
                 disk_backup=disk_backup)
        try:
            yield self.current()
        finally:
            self._local.config = old


# --- the start: routing the process's allocations -------------------------------------------

#: Set by ``configure_subprocess()``: a child process starts in the preload
#: hook mode (torch_memory_saver's LD_PRELOAD mode, done with PyTorch memory
#: pools over our pluggable allocator instead).
ROUTE_ENV = "VMMW_TMS_PRELOAD"


@dataclass(frozen=True)
class StartPlan:
    """How a process starts under the torch_memory_saver shim, read from the
    environment variables torch_memory_saver itself reads."""

    route_all: bool  # the preload hook mode (with init_tag: allocations outside regions are ours)
    hook_mode: str  # "preload" when routed, else "torch"
    init_tag: Optional[str]  # the tag allocations outside any region get (TMS_INIT_ENABLE)
    init_kind: str  # how that tag keeps its bytes: "cpu", "mmap", "disk" or "none"
    cpu_backup_backend: str  # "pinned" or "mmap": the backend of CPU-backup regions that name none
    retain_cpu_backup: bool
    disk_dir: Optional[str]

    @property
    def reason(self) -> str:
        if not self.route_all:
            return f"regions only: {ROUTE_ENV} and TMS_INIT_ENABLE are unset"
        why = [k for k, on in ((ROUTE_ENV, True), ("TMS_INIT_ENABLE", self.init_tag is not None)) if on]
        return "preload hook mode (" + ", ".join(why) + ")"


def start_plan(env: Optional[Mapping[str, str]] = None) -> StartPlan:
    """The start-up decision for the environment `env` (os.environ by default).

    ``TMS_INIT_ENABLE=1`` (what training engines set) or ``configure_subprocess()``
    start the preload hook mode; with ``TMS_INIT_ENABLE`` the allocations
    outside any region belong to tag "default", backed up per ``TMS_INIT_ENABLE_CPU_BACKUP`` /
    ``TMS_INIT_ENABLE_DISK_BACKUP``. A backend other than pinned or mmap is an error."""
    env = os.environ if env is None else env
    init = truthy(env.get("TMS_INIT_ENABLE"))
    cpu = truthy(env.get("TMS_INIT_ENABLE_CPU_BACKUP"))
    disk = truthy(env.get("TMS_INIT_ENABLE_DISK_BACKUP"))
    if cpu and disk:
        raise ValueError("TMS_INIT_ENABLE_CPU_BACKUP and TMS_INIT_ENABLE_DISK_BACKUP are mutually exclusive")
    backend = (env.get("TMS_INIT_CPU_BACKUP_BACKEND") or "pinned").strip().lower()
    if backend not in ("pinned", "mmap"):
        raise ValueError(f"TMS_INIT_CPU_BACKUP_BACKEND={backend!r}: expected 'pinned' or 'mmap'")
    route = init or truthy(env.get(ROUTE_ENV))
    return StartPlan(
        route_all=route,
        hook_mode="preload" if route else "torch",
        init_tag="default" if init else None,
        init_kind=("mmap" if backend == "mmap" else "cpu") if cpu else "disk" if disk else "none",
        cpu_backup_backend=backend,
        retain_cpu_backup=truthy(env.get("TMS_RETAIN_CPU_BACKUP")),
        disk_dir=env.get("TMS_DISK_BACKUP_DIR") or None,
    )


def set_process_tag(name: str) -> None:
    """Allocations of threads with no open tag scope get `name` from now on."""
    call("vmmw_tag_set_process_default", ctypes.c_uint32(tag_id(name)))


@contextlib.contextmanager
def changed_env(key: str, value: str) -> Iterator[None]:
    """`key` set to `value` inside the block, restored (or removed) after."""
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def configure_subprocess() -> "contextlib.AbstractContextManager[None]":
    """Processes started inside the block route their allocations through us
    from the first one (torch_memory_saver's ``configure_subprocess``)."""
    return changed_env(ROUTE_ENV, "1")


@contextlib.contextmanager
def preloaded_subprocess(interposer: Callable[[], object]) -> Iterator[Optional[str]]:
    """Processes started inside the block start in the preload hook mode: with
    the interposer `interposer()` names first on ``LD_PRELOAD`` (what was
    there kept after it), as torch_memory_saver's ``configure_subprocess``
    does; when it names none (raises ``RuntimeError``: no such library
    here), through our memory pools from the first allocation instead
    (:func:`configure_subprocess`). Yields the library put on
    ``LD_PRELOAD``, or None."""
    try:
        lib: Optional[str] = str(interposer())
    except RuntimeError:
        lib = None
    if lib is None:
        with configure_subprocess():
            yield None
        return
    current = os.environ.get("LD_PRELOAD", "")
    with changed_env("LD_PRELOAD", f"{lib}:{current}" if current else lib):
        yield lib


def cuda_major(torch_module: object) -> int:
    """The CUDA major version the process's runtime is: PyTorch's build
    (``torch.version.cuda``), else the first of ``libcudart.so.13`` and
    ``.12`` that loads. ``RuntimeError`` when neither says."""
    cuda = getattr(getattr(torch_module, "version", None), "cuda", None)
    if cuda:
        try:
            return int(str(cuda).split(".", 1)[0])
        except ValueError:
            pass
    for major in (13, 12):
        try:
            ctypes.CDLL(f"libcudart.so.{major}")
            return major
        except OSError:
            continue
    raise RuntimeError("no CUDA runtime found: torch.version.cuda is unset and libcudart.so.13/.12 do not load")


def binary_in_package(directory: str, stem: str, torch_module: object, xpu: bool = False) -> str:
    """The one shared library of `stem` built for this process's GPU runtime,
    in `directory` or the folder above it, by the names torch_memory_saver's
    wheels use: ``<stem>_cu<major>.*.so`` for CUDA, ``<stem>.*.so`` for
    ROCm or Intel XPU. ``RuntimeError`` when not exactly one matches."""
    from pathlib import Path

    hip = getattr(getattr(torch_module, "version", None), "hip", None)
    if hip or xpu:
        pattern, runtime = f"{stem}.*.so", "ROCm" if hip else "Intel XPU"
    else:
        major = cuda_major(torch_module)
        pattern, runtime = f"{stem}_cu{major}.*.so", f"CUDA {major}"
    here = Path(directory)
    found = sorted(here.glob(pattern)) or sorted(here.parent.glob(pattern))
    if len(found) != 1:
        raise RuntimeError(
            f"expected exactly one library matching {pattern!r} ({runtime}) in {here} or {here.parent}, "
            f"found {len(found)}: {[str(p) for p in found]}"
        )
    return str(found[0])
