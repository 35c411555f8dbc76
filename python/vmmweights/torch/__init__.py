"""PyTorch on vmmweights memory: tensors in our pool by tag, loaded in place
from safetensors, put to sleep and woken at the same addresses.

    import vmmweights.torch as vt
    with vt.use_pool("weights"):
        model = build_model().cuda()          # every segment tagged "weights"
    vt.load_(model, "/models/qwen", progress=True)
    vt.sleep(weights="offload")               # or vt.sleep(): every tag, its default policy
    vt.wake()
    print(vt.report_table())

`use_pool` routes this thread's allocations inside the block to a
``torch.cuda.MemPool`` over the library's two exported C functions
(``vmmw_torch_malloc`` / ``vmmw_torch_free``, loaded by
``torch.cuda.memory.CUDAPluggableAllocator`` from :func:`library_path`), and
opens the tag's scope, so each segment PyTorch asks for is tagged. No Python
runs in the allocation path. Drop-in shims: :mod:`vmmweights.torch.memory_saver`
(torch_memory_saver) and :mod:`vmmweights.torch.cumem` (vLLM's CuMemAllocator).
Tensors over weights another process shares: :mod:`vmmweights.torch.shared`.
"""

from __future__ import annotations

import contextlib
import gc
import operator
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from .. import tags as _tags
from .._native import VmmwError, library_path
from ..loader import Destination, Loader, LoadResult
from ..pool import Pool
from ..update import UpdateResult, UpdateSource
from ..update import update as _update
from ..report import table, tag_usage
from .dtypes import _TYPESTR, DTYPES

__all__ = [
    "VmmwError",
    "allocator",
    "as_tensor",
    "forget_reload",
    "graph",
    "library_path",
    "load_",
    "mark_written",
    "mem_pool",
    "pool",
    "release_pools",
    "release_staging",
    "report",
    "report_table",
    "reserve_backup",
    "shared",
    "sleep",
    "staging_bytes",
    "swap",
    "tag_usage",
    "take_mem_pool",
    "tensors",
    "trim",
    "update_",
    "update_timing",
    "use_pool",
    "wake",
]

_lock = threading.RLock()
_allocator: Optional[Any] = None
_pools: Dict[Tuple[int, str], Any] = {}


def _device(device: Union[int, torch.device, None]) -> int:
    if device is None:
        return int(torch.cuda.current_device())
    if isinstance(device, torch.device):
        return int(device.index if device.index is not None else torch.cuda.current_device())
    return int(device)


def pool(device: Union[int, torch.device, None] = None) -> Pool:
    """The process-global pool of `device` (the one PyTorch's allocations through
    :func:`use_pool` land in)."""
    return Pool.default(_device(device))


def allocator() -> Any:
    """The ``CUDAPluggableAllocator`` over our two entry points (created once)."""
    global _allocator
    with _lock:
        if _allocator is None:
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                library_path(), "vmmw_torch_malloc", "vmmw_torch_free"
            )
        return _allocator


def mem_pool(tag: str = "weights", device: Union[int, torch.device, None] = None) -> Any:
    """The ``torch.cuda.MemPool`` of `tag` on `device` (created once). One per
    tag: PyTorch caches blocks inside a MemPool, so sharing one between tags
    would mix tags inside a segment. Its ``.id`` is what
    ``torch.cuda.graph(..., pool=...)`` takes (see :func:`graph`)."""
    dev = _device(device)
    with _lock:
        key = (dev, tag)
        if key not in _pools:
            with torch.cuda.device(dev):
                _pools[key] = torch.cuda.MemPool(allocator().allocator())
        return _pools[key]


@contextlib.contextmanager
def use_pool(
    tag: str = "weights",
    device: Union[int, torch.device, None] = None,
    *,
    policy: Optional[str] = None,
) -> Iterator[Any]:
    """Allocations this thread makes on `device` inside the block come from
    our memory, tagged `tag`. `policy` sets the tag's default sleep policy
    (what a bare :func:`sleep` does to it). Yields the MemPool."""
    dev = _device(device)
    if policy is not None:
        pool(dev).set_default_policy(tag, policy)
    mp = mem_pool(tag, dev)
    _tags.push(tag)
    try:
        with torch.cuda.device(dev), torch.cuda.memory.use_mem_pool(mp, device=dev):
            yield mp
    finally:
        _tags.pop()


@contextlib.contextmanager
def graph(
    cuda_graph: "torch.cuda.CUDAGraph",
    tag: str = "graph",
    *,
    device: Union[int, torch.device, None] = None,
    policy: Optional[str] = None,
    **graph_kwargs: Any,
) -> Iterator[None]:
    """``torch.cuda.graph(cuda_graph, pool=<our MemPool of tag>)``: the
    graph's private memory lands in `tag`, so it sleeps and wakes with it and
    the graph replays at the same addresses afterwards. Extra keyword
    arguments (stream, capture_error_mode) go to ``torch.cuda.graph``."""
    dev = _device(device)
    if policy is not None:
        pool(dev).set_default_policy(tag, policy)
    mp = mem_pool(tag, dev)
    _tags.push(tag)
    try:
        with torch.cuda.device(dev), torch.cuda.graph(cuda_graph, pool=mp.id, **graph_kwargs):
            yield
    finally:
        _tags.pop()


def take_mem_pool(tag: str, device: Union[int, torch.device, None] = None) -> Optional[Any]:
    """Remove the ``torch.cuda.MemPool`` of `tag` on `device` from the ones
    kept here and return it (None when there is none): once the caller drops
    it, with the tensors allocated in it, PyTorch returns its segments to us.
    A later :func:`use_pool` of the tag makes a new one."""
    with _lock:
        return _pools.pop((_device(device), tag), None)


def release_pools(tag: Optional[str] = None) -> None:
    """Drop our MemPools (of `tag`, or all) so PyTorch returns their cached
    segments. Delete the tensors allocated in them first."""
    with _lock:
        for key in [k for k in _pools if tag is None or k[1] == tag]:
            del _pools[key]
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# --- views of pool memory ---------------------------------------------------------


class _DeviceArray:
    """A device range described by __cuda_array_interface__ (v3), which
    ``torch.as_tensor`` wraps without copying."""

    def __init__(self, ptr: int, shape: Tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "strides": None, "version": 3,
        }


def as_tensor(
    dest: Union[Destination, int],
    shape: Optional[Tuple[int, ...]] = None,
    dtype: Union[str, "torch.dtype", None] = None,
    device: Union[int, torch.device, None] = None,
) -> torch.Tensor:
    """A ``torch.Tensor`` viewing pool memory without a copy: a
    :class:`~vmmweights.Destination` (from ``Loader.allocate`` or
    ``vmmweights.load``), or a device address with `shape` and `dtype`. The
    memory stays the pool's: the view must not outlive the block, and reading
    it while its tag sleeps faults."""
    if isinstance(dest, Destination):
        ptr, shape, name = dest.ptr, dest.shape if shape is None else shape, dest.dtype if dtype is None else dtype
    else:
        if shape is None or dtype is None:
            raise ValueError("as_tensor(ptr, shape, dtype): a bare address needs a shape and a dtype")
        ptr, name = int(dest), dtype
    if isinstance(name, torch.dtype):
        name = DTYPES[name]
    name = {"bfloat16": "BF16", "float16": "F16", "float32": "F32"}.get(str(name), str(name).upper())
    if name not in _TYPESTR:
        raise ValueError(f"as_tensor: no view for dtype {name!r}: expected one of {sorted(_TYPESTR)}")
    typestr, view = _TYPESTR[name]
    dev = _device(device)
    t = torch.as_tensor(_DeviceArray(ptr, tuple(shape), typestr), device=f"cuda:{dev}")
    return t.view(view) if view is not None else t


def tensors(dests: Mapping[str, Destination], device: Union[int, torch.device, None] = None) -> Dict[str, torch.Tensor]:
    """:func:`as_tensor` of every destination, by name."""
    return {n: as_tensor(d, device=device) for n, d in dests.items()}


# --- loading --------------------------------------------------------------------------


def _state_dict(target: Union[torch.nn.Module, Mapping[str, torch.Tensor]]) -> Mapping[str, torch.Tensor]:
    if isinstance(target, torch.nn.Module):
        # keep_vars: parameters themselves; buffers included (a checkpoint may hold them).
        state: Mapping[str, torch.Tensor] = target.state_dict(keep_vars=True)
        return state
    return target


def _progress_bar(progress: Union[bool, Callable[[int, int], Any], None], path: str) -> Tuple[Optional[Callable[[int, int], Any]], Callable[[], None]]:
    if progress is None or progress is False:
        return None, lambda: None
    if callable(progress):
        return progress, lambda: None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # a plain line on stderr instead
        last = [0.0]

        def plain(done: int, total: int) -> None:
            if total and (done == total or done / total - last[0] >= 0.1):
                last[0] = done / total
                print(f"vmmweights: loaded {done / 1e9:.2f} of {total / 1e9:.2f} GB from {path}", file=sys.stderr)

        return plain, lambda: None
    bar = tqdm(total=0, unit="B", unit_scale=True, desc="vmmweights load")

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return update, bar.close


def load_(
    target: Union[torch.nn.Module, Mapping[str, torch.Tensor]],
    path: str,
    *,
    preset: Optional[str] = None,
    tp_rank: int = 0,
    tp_world: int = 0,
    head_dim: int = 0,
    rules: Union[str, Mapping[str, Any], None] = None,
    strategy: str = "auto",
    progress: Union[bool, Callable[[int, int], Any], None] = None,
    allow_missing: bool = False,
    allow_unexpected: bool = False,
    threads: int = 0,
    reload_check: bool = False,
) -> LoadResult:
    """Load the safetensors checkpoint at `path` in place into the tensors of
    `target` (a module: its ``state_dict(keep_vars=True)``; or a dict of
    tensors), by name. Tensors must be contiguous CUDA tensors on one device;
    tied parameters (one storage under two names) are one destination.
    `preset` ("llama", "qwen2", ...) maps Hugging Face names to fused
    destinations (``qkv_proj``, ``gate_up_proj``), sharded for `tp_rank` of
    `tp_world`. `progress`: True for a tqdm bar, or ``f(done, total)``.
    `reload_check`: keep checksums so a Reload wake proves the checkpoint
    unchanged (see ``vmmweights.Loader.reload_check``).

    Tensors in our pool (:func:`use_pool`) can then sleep with ``"reload"``.
    Returns what the load did (bytes, seconds, gbps). Every problem
    (missing, unexpected, mis-shaped tensor) is reported before any byte is
    written."""
    tensors = _state_dict(target)
    devices = {t.device for t in tensors.values()}
    if not tensors:
        raise ValueError("nothing to load into: the state dict is empty")
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        raise ValueError(f"load_ needs every tensor on one CUDA device; found {sorted(map(str, devices))}")
    dev = _device(next(iter(devices)))
    bad = [n for n, t in tensors.items() if not t.is_contiguous()]
    if bad:
        raise ValueError(f"load_ writes contiguous tensors only; not contiguous: {', '.join(bad[:5])}")
    odd = [f"{n} ({t.dtype})" for n, t in tensors.items() if t.dtype not in DTYPES]
    if odd:
        raise ValueError(f"load_ cannot fill these dtypes: {', '.join(odd[:5])}")
    callback, done = _progress_bar(progress, str(path))
    torch.cuda.synchronize(dev)  # nothing queued may still read or write the tensors
    ld = Loader(path)
    try:
        if preset is not None:
            ld.preset(preset, tp_rank, tp_world, head_dim)
        if rules is not None:
            ld.rules(rules)
        ld.options(strategy, threads=threads, allow_missing=allow_missing, allow_unexpected=allow_unexpected)
        if reload_check:
            ld.reload_check()
        for name, t in tensors.items():
            if t.numel() == 0:
                continue
            ld.register(name, t.data_ptr(), DTYPES[t.dtype], list(t.shape))
            # The caller hands these tensors over: memory outside our pool
            # (PyTorch's own allocator) is theirs; pool memory is checked anyway.
            ld.declare_foreign(t.data_ptr(), t.numel() * t.element_size())
        result = ld.load(pool(dev), callback)
    except BaseException:
        ld.close()
        raise
    finally:
        done()
    _remember_load(tensors, ld)
    return result


# Each load_'s loader (its rules and registered tensors), by the tensors it
# filled, so update_ writes through the same rules.
_loads: Dict[Tuple[Tuple[str, int, int], ...], Loader] = {}
# The last update source per loaded target, with the trainer tensors it was
# built from (see _Seen): an RL loop updating from the same trainer tensors
# every step builds it once.
_sources: Dict[Tuple[Tuple[str, int, int], ...], Tuple["_Seen", UpdateSource]] = {}
# What update_ derived from a target mapping (its loader, device, tag), by
# the mapping's id, with the tensors it was derived from: a call whose
# target holds the same tensors skips the signature.
_targets: Dict[int, Tuple["_Seen", "_Target"]] = {}
_TARGETS_KEPT = 8

_data_ptr = torch.Tensor.data_ptr
_stride = torch.Tensor.stride
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")
_is_cuda = operator.attrgetter("is_cuda")
_deref = weakref.ref.__call__


def _signature(tensors: Mapping[str, torch.Tensor]) -> Tuple[Tuple[str, int, int], ...]:
    return tuple(sorted((n, t.data_ptr(), t.numel() * t.element_size())
                        for n, t in tensors.items() if t.numel() > 0))


def _remember_load(tensors: Mapping[str, torch.Tensor], ld: Loader) -> None:
    key = _signature(tensors)
    with _lock:
        old = _loads.pop(key, None)
        _loads[key] = ld
    if old is not None:
        old.close()


def update_(
    target: Union[torch.nn.Module, Mapping[str, torch.Tensor]],
    source: Union[torch.nn.Module, Mapping[str, torch.Tensor]],
    *,
    expected_version: Optional[int] = None,
    tag: Optional[str] = None,
    allow_missing: bool = False,
    allow_unexpected: bool = False,
    staged: bool = False,
) -> UpdateResult:
    """Write new weights into `target` in place: `source` is a trainer's
    model or state dict, by checkpoint name (Hugging Face names, as
    ``save_pretrained`` writes them), whole tensors (contiguous, CUDA on
    `target`'s device, or CPU). They go through the rules of the
    :func:`load_` that filled `target` (fused q/k/v and gate/up,
    tensor-parallel slices, ties): each rank keeps its slices.

    Versions: `target`'s tag (by default the pool tag its tensors lie in, or
    `tag`) moves from `expected_version` (by default its current version) to
    the next; importers of a share of the tag see it. Every problem is
    reported in one ``VmmwError`` before any byte moves, and each tensor ends
    untouched or wholly new (docs/UPDATES.md). A Reload sleep afterwards
    keeps the update. Returns what the update did (bytes, seconds, gbps,
    version)."""
    laps = _update_laps()
    tensors = _state_dict(target)
    laps.lap("state_dict")
    tgt = _target_of(target, tensors, tag)
    laps.lap("target")
    src_map = _state_dict(source)
    with _lock:
        cached = _sources.get(tgt.key)
    if cached is not None and cached[0].holds(src_map):
        src = cached[1]
    else:
        # The source moved, changed, or is new: check every tensor again.
        items = [(n, t) for n, t in src_map.items() if t.numel() > 0]
        src = _update_source(items, tgt.dev)
        with _lock:
            old = _sources.pop(tgt.key, None)
            _sources[tgt.key] = (_Seen(src_map), src)
        if old is not None:
            old[1].close()
    laps.lap("source")
    torch.cuda.synchronize(tgt.dev)  # the trainer's kernels wrote the source; nothing may read the target
    laps.lap("synchronize")
    version = tgt.pool.tag_version(tgt.tag) if expected_version is None else expected_version
    laps.lap("version")
    # The source names the source tensors' memory: they are alive (the caller's) for the call.
    done = _update(tgt.loader, tgt.pool, src, version, tag=tgt.tag, allow_missing=allow_missing,
                   allow_unexpected=allow_unexpected, staged=staged)
    laps.lap("update")
    return done


class _Target:
    """What update_ needs of a loaded target: the loader whose rules it
    writes through, its device and pool, the tag to version (`asked`: the
    tag the caller named, None when it was found from the tensors)."""

    __slots__ = ("key", "loader", "dev", "pool", "tag", "asked")

    def __init__(self, key: Tuple[Tuple[str, int, int], ...], loader: Loader, dev: int, p: Pool,
                 tag: str, asked: Optional[str]) -> None:
        self.key, self.loader, self.dev, self.pool, self.tag, self.asked = key, loader, dev, p, tag, asked


def _layout(tensors: Mapping[str, torch.Tensor]) -> Tuple[Any, ...]:
    """Everything an update reads of `tensors` (names, addresses, shapes,
    dtypes, strides, device kind), in their order, built without a Python
    loop: equal layouts name the same bytes the same way."""
    values = tensors.values()
    return (tuple(tensors), tuple(map(_data_ptr, values)), tuple(map(_shape, values)),
            tuple(map(_dtype, values)), tuple(map(_stride, values)), tuple(map(_is_cuda, values)))


class _Seen:
    """A mapping's tensors as update_ saw them: their names, the tensor
    objects themselves (weakly: the cache keeps no trainer memory alive),
    their addresses and their layout."""

    __slots__ = ("names", "refs", "ptrs", "layout")

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        values = tensors.values()
        self.names = tuple(tensors)
        self.refs = tuple(map(weakref.ref, values))
        self.ptrs = tuple(map(_data_ptr, values))
        self.layout = _layout(tensors)

    def holds(self, tensors: Mapping[str, torch.Tensor]) -> bool:
        """True when `tensors` are the ones seen, where they were: the same
        names and addresses, and the same tensor objects (a tensor's shape,
        dtype and strides change in place only by ``resize_``, ``set_`` or
        ``as_strided_``, which a trainer's parameters do not go through) or,
        for other objects (``state_dict()`` detaches new ones each call), the
        same layout read again."""
        values = tensors.values()
        if tuple(tensors) != self.names or tuple(map(_data_ptr, values)) != self.ptrs:
            return False
        return all(map(operator.is_, values, map(_deref, self.refs))) or _layout(tensors) == self.layout


def _target_of(target: Any, tensors: Mapping[str, torch.Tensor], tag: Optional[str]) -> _Target:
    """The loaded target `tensors` (of `target`) is: cached per mapping,
    found again by the signature when its layout changed."""
    with _lock:
        hit = _targets.get(id(target))
    if hit is not None and hit[1].asked == tag and hit[0].holds(tensors):
        with _lock:
            alive = _loads.get(hit[1].key) is hit[1].loader
        if alive:
            return hit[1]
    key = _signature(tensors)
    with _lock:
        ld = _loads.get(key)
    if ld is None:
        raise ValueError("update_ writes through the rules of the load_ that filled these tensors: "
                         "call vmmweights.torch.load_ on this model or state dict first")
    first = next(t for t in tensors.values() if t.numel() > 0)
    dev = _device(first.device)
    p = pool(dev)
    found_tag = tag
    if found_tag is None:
        try:
            found_tag = p.tag_of(first.data_ptr())
        except VmmwError as e:
            raise ValueError("update_: the tensors lie outside this library's pool; pass tag= to name "
                             "the version counter to move") from e
    found = _Target(key, ld, dev, p, found_tag, tag)
    with _lock:
        _targets.pop(id(target), None)
        _targets[id(target)] = (_Seen(tensors), found)
        while len(_targets) > _TARGETS_KEPT:  # the oldest first (dicts keep insertion order)
            del _targets[next(iter(_targets))]
    return found


class _Laps:
    """Seconds between the marks update_ makes, when timing is on."""

    def __init__(self) -> None:
        self.last = time.perf_counter()
        self.seconds: Dict[str, float] = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = now - self.last
        self.last = now


class _NoLaps:
    """Timing off: marks cost a call that does nothing."""

    def lap(self, name: str) -> None:
        pass


_NO_LAPS = _NoLaps()
_last_laps: Optional[_Laps] = None
_timing = bool(os.environ.get("VMMW_UPDATE_TIMING"))


def _update_laps() -> Union[_Laps, _NoLaps]:
    global _last_laps
    if not _timing:
        return _NO_LAPS
    _last_laps = _Laps()
    return _last_laps


def update_timing(on: Optional[bool] = None) -> Dict[str, float]:
    """Time the parts of :func:`update_` (also on when the environment sets
    ``VMMW_UPDATE_TIMING``): `on` switches it; returns the last timed call's
    seconds by part ("state_dict", "target", "source", "synchronize",
    "version", "update": the library call), in order."""
    global _timing
    if on is not None:
        _timing = bool(on)
    return dict(_last_laps.seconds) if _last_laps is not None else {}


def _update_source(items: List[Tuple[str, torch.Tensor]], dev: int) -> UpdateSource:
    """An update source naming `items`' memory (checked: contiguous, known
    dtype, on `dev` or the CPU). It holds no reference: each update_ passes
    the tensors it reads."""
    src = UpdateSource()
    try:
        for name, t in items:
            if not t.is_contiguous():
                raise ValueError(f"update_ reads contiguous tensors only; `{name}` is not")
            if t.dtype not in DTYPES:
                raise ValueError(f"update_ cannot read `{name}` of dtype {t.dtype}")
            if t.is_cuda:
                if _device(t.device) != dev:
                    raise ValueError(f"update_: `{name}` is on {t.device}, the target on cuda:{dev}")
                memory = "device"
            elif t.device.type == "cpu":
                memory = "host"
            else:
                raise ValueError(f"update_: `{name}` is on {t.device}: CUDA or CPU tensors only")
            src.add(name, DTYPES[t.dtype], list(t.shape), t.data_ptr(), memory)
    except BaseException:
        src.close()
        raise
    return src


# --- sleep, wake, report ------------------------------------------------------------


def sleep(device: Union[int, torch.device, None] = None, **policies: str) -> List[Dict[str, Any]]:
    """Release the device memory behind tags, keeping every pointer:
    ``sleep(weights="offload", kv_cache="discard")``; ``sleep()`` sleeps every
    awake tag with its default policy (offload unless set through
    ``use_pool(..., policy=)``). Waits for the device first. A misspelled
    tag raises ``VmmwError`` (``VMMW_UNKNOWN_TAG``) before anything moves."""
    dev = _device(device)
    torch.cuda.synchronize(dev)
    return pool(dev).sleep(policies)


def wake(
    *tags: str, device: Union[int, torch.device, None] = None, wait_memory_s: float = 0.0
) -> List[Dict[str, Any]]:
    """Bring the listed tags back (every sleeping tag when none is named) at
    the same addresses. ``wait_memory_s`` > 0: wait up to that long for
    device memory another process is releasing instead of failing at once
    (see :meth:`vmmweights.Pool.wake`)."""
    return pool(device).wake(*tags, wait_memory_s=wait_memory_s)


def swap(
    sleep: Mapping[str, str],
    wake: Sequence[str],
    device: Union[int, torch.device, None] = None,
    wait_memory_s: float = 0.0,
) -> Dict[str, Any]:
    """Put the tags of ``sleep`` (tag -> policy) to sleep while the tags of
    ``wake`` wake, at once, the two directions of the link overlapping:
    ``swap({"model_a": "offload"}, ["model_b"])``. Waits for the device
    first, as :func:`sleep` does. Returns both sides' outcome; see
    :meth:`vmmweights.Pool.swap`."""
    dev = _device(device)
    torch.cuda.synchronize(dev)
    return pool(dev).swap(sleep, wake, wait_memory_s=wait_memory_s)


def mark_written(target: Union[torch.Tensor, torch.nn.Module, Mapping[str, torch.Tensor]]) -> None:
    """Say a tensor (or every parameter of a module or state dict) was
    written since ``load_`` filled it, e.g. by an RL weight update: a Reload
    sleep keeps those bytes in the host backup instead of restoring the
    checkpoint's. Optional: a Reload sleep also finds changed bytes by itself,
    by hashing what was loaded on the device; marking names them ahead of
    time. Each tensor must live in this library's pool."""
    if isinstance(target, torch.Tensor):
        items = [target]
    else:
        items = list(_state_dict(target).values())
    for t in items:
        if t.numel() == 0:
            continue
        if not t.is_cuda:
            raise ValueError(f"mark_written: a tensor on {t.device} is not in a device pool")
        torch.cuda.synchronize(t.device)
        if t.is_contiguous():
            ptr, nbytes = t.data_ptr(), t.numel() * t.element_size()
        else:  # a strided view: its whole storage, which holds every element
            ptr, nbytes = t.untyped_storage().data_ptr(), t.untyped_storage().nbytes()
        pool(t.device).mark_written(ptr, nbytes)


def forget_reload(tag: str, device: Union[int, torch.device, None] = None) -> None:
    """Drop what loads registered to restore `tag` from (see ``Pool.forget_reload``)."""
    pool(device).forget_reload(tag)


def reserve_backup(nbytes: int, device: Union[int, torch.device, None] = None) -> None:
    """Pin `nbytes` of host backup ahead of time (the first offload then runs
    at the link's rate)."""
    pool(device).reserve_backup(nbytes)


def report(device: Union[int, torch.device, None] = None) -> Dict[str, Any]:
    """The memory report of our pool on `device`, as a dict (see ``Pool.report``)."""
    return pool(device).report()


def report_table(device: Union[int, torch.device, None] = None) -> str:
    """The report as a table."""
    return table(report(device))


def trim(device: Union[int, torch.device, None] = None) -> int:
    """Return our pool's cached memory to the device; the bytes released."""
    return pool(device).trim()


def staging_bytes(device: Union[int, torch.device, None] = None) -> int:
    """Pinned staging the loader keeps cached for `device`."""
    return pool(device).staging_bytes()


def release_staging(device: Union[int, torch.device, None] = None) -> int:
    """Unpin the loader's staging ring for `device`; bytes unpinned."""
    return pool(device).release_staging()


# Tensors over another process's shared weights (needs the names above).
from . import shared  # noqa: E402
