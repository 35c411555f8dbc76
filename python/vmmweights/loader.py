"""Loading safetensors checkpoints in place into device memory."""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _structs as S
from ._native import VmmwError, call, call_text
from ._owned import OwnedHandle
from .pool import Pool, _json_object
from .tags import tag_id

#: Copy strategies: auto (page-cached data staged through a pinned ring sized
#: to the CPU cache, cold data read with pread), direct (DMA from registered
#: page-cache windows), staged (memcpy into pinned slots), read (pread into
#: pinned slots), simple (one thread, no pinning: the reference path).
STRATEGIES = {"auto": 0, "direct": 1, "staged": 2, "read": 3, "simple": 4}

#: ``progress(done_bytes, total_bytes)`` returns whether to cancel: a falsy
#: value (None included) continues, a truthy one asks the load to stop, as a
#: non-zero return does in C and ``true`` in C++ and Go (docs/ABI.md).
Progress = Callable[[int, int], Optional[bool]]


@dataclass(frozen=True)
class LoadResult:
    """What a load did."""

    bytes: int
    """Source bytes copied."""
    seconds: float
    """Wall time."""
    gbps: float
    """Source bytes per second, in GB/s (10^9)."""
    direct_bytes: int
    staged_bytes: int
    read_bytes: int
    filled_bytes: int
    threads: int


@dataclass(frozen=True)
class PlanSummary:
    """What a plan will do (nothing is written to build it)."""

    extents: int
    fills: int
    src_bytes: int
    dst_bytes: int
    sources: int
    skipped: int
    missing: int
    unexpected: int
    destinations: int


@dataclass(frozen=True)
class Destination:
    """A registered destination parameter."""

    name: str
    ptr: int
    bytes: int
    dtype: str
    shape: Tuple[int, ...]


def _fields(cls: Any, c: ctypes.Structure) -> Dict[str, Any]:
    return {name: getattr(c, name) for name in cls.__dataclass_fields__}


class Loader(OwnedHandle):
    """One checkpoint to load: a ``.safetensors`` file, or a folder with
    ``model.safetensors.index.json`` (sharded, also the Hugging Face cache's
    symlinked layout) or one ``model.safetensors``. Headers are read and
    checked when it opens.

    Destinations are registered by name (:meth:`register`, e.g. from a
    PyTorch ``state_dict()``), or allocated from the plan (:meth:`allocate`).
    Two names at one address with the same dtype and shape (tied weights) are
    one destination, filled from whichever name the checkpoint has.
    A destination remembers the pool block it was registered in: once that
    block is freed, :meth:`load` refuses it (``VmmwError`` with status
    ``VMMW_UNKNOWN_POINTER`` naming it) even when the pool handed the same
    address to a new tensor; register the new tensor to load into it.
    Use as a context manager, or call :meth:`close` (destinations it
    allocated stay in their pool).
    """

    _free = "vmmw_loader_free"

    def __init__(self, path: Union[str, os.PathLike[str]]) -> None:
        self.path = os.fspath(path)
        handle = ctypes.c_void_p()
        call("vmmw_loader_open", self.path.encode(), ctypes.byref(handle))
        self._handle: Optional[ctypes.c_void_p] = handle

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ``vmmw_loader_t*``."""
        if self._handle is None:
            raise ValueError("the loader is closed")
        return self._handle

    # --- rules and options ----------------------------------------------------------

    def preset(self, family: str, tp_rank: int = 0, tp_world: int = 0, head_dim: int = 0) -> "Loader":
        """Mapping rules for a Hugging Face family ("llama", "mistral",
        "qwen2", "qwen3", ...): q/k/v fused into ``qkv_proj``, gate/up into
        ``gate_up_proj``; with `tp_world` > 0, sharded for `tp_rank`."""
        call("vmmw_loader_set_rules_preset", self.handle, family.encode(),
             ctypes.c_uint32(tp_rank), ctypes.c_uint32(tp_world), ctypes.c_uint32(head_dim))
        return self

    def rules(self, rules: Union[str, Mapping[str, Any]]) -> "Loader":
        """Mapping rules in their JSON form (a string or a dict)."""
        text = rules if isinstance(rules, str) else json.dumps(rules)
        call("vmmw_loader_set_rules_json", self.handle, text.encode())
        return self

    def options(
        self,
        strategy: str = "auto",
        *,
        threads: int = 0,
        allow_missing: bool = False,
        allow_unexpected: bool = False,
        window_bytes: int = 0,
        slot_bytes: int = 0,
    ) -> "Loader":
        """Load options; see :data:`STRATEGIES`."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}: expected one of {sorted(STRATEGIES)}")
        opts = S.LoadOptions(
            allow_missing=int(allow_missing),
            allow_unexpected=int(allow_unexpected),
            strategy=STRATEGIES[strategy],
            threads=threads,
            window_bytes=window_bytes,
            slot_bytes=slot_bytes,
        )
        call("vmmw_loader_set_options", self.handle, ctypes.byref(opts))
        return self

    def reload_check(self, enable: bool = True) -> "Loader":
        """Keep a checksum of every loaded extent at this loader's next loads,
        so each wake of a tag asleep with ``"reload"`` first proves the
        checkpoint still holds the bytes loaded (a file rewritten in place
        fails the wake with ``VMMW_CHECKPOINT_INVALID``, the tag stays asleep;
        see ``Pool.forget_reload``). Costs one more read of the loaded bytes at
        load and at each Reload wake. Without it, the files' identity, size
        and modification time are still checked at every wake."""
        call("vmmw_loader_set_reload_check", self.handle, ctypes.c_uint32(1 if enable else 0))
        return self

    # --- destinations -------------------------------------------------------------------

    def register(self, name: str, ptr: int, dtype: str, shape: Sequence[int]) -> None:
        """Register a contiguous row-major destination of `dtype` ("BF16",
        "F16", "F32", ... or "bfloat16", ...) at device address `ptr`."""
        dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
        call("vmmw_loader_register", self.handle, name.encode(), ctypes.c_uint64(ptr),
             dtype.encode(), dims, ctypes.c_size_t(len(shape)))

    def declare_foreign(self, ptr: int, nbytes: int) -> None:
        """Declare ``[ptr, ptr + nbytes)`` as device memory you own outside the
        pool loads run on (PyTorch's own allocator, ``cudaMalloc``): a load
        refuses destinations outside its pool unless they lie in a declared
        range. Pool memory is checked all the same, so declaring each
        registered tensor's own range is safe."""
        call("vmmw_loader_declare_foreign", self.handle, ctypes.c_uint64(ptr), ctypes.c_uint64(nbytes))

    def allocate(self, pool: Pool, tag: str = "weights") -> Dict[str, Destination]:
        """Allocate every destination the rules produce (fused, sharded, padded)
        in `pool` under `tag`, register them, and return them by name."""
        call("vmmw_loader_allocate", self.handle, pool.handle, ctypes.c_uint32(tag_id(tag)))
        return self.destinations()

    def destination(self, name: str) -> Destination:
        """The destination registered under `name` (or an alias of it)."""
        d = S.Destination()
        call("vmmw_loader_destination", self.handle, name.encode(), ctypes.byref(d))
        return Destination(name, d.ptr, d.bytes, d.dtype.decode(), tuple(d.shape[: d.ndim]))

    def destinations(self) -> Dict[str, Destination]:
        """Every destination, once, by the name it is listed under."""
        n = ctypes.c_size_t()
        call("vmmw_loader_destination_count", self.handle, ctypes.byref(n))
        names = [call_text("vmmw_loader_destination_name", self.handle, ctypes.c_size_t(i)) for i in range(n.value)]
        return {name: self.destination(name) for name in names}

    # --- plan and load ----------------------------------------------------------------

    def plan(self) -> PlanSummary:
        """Check the plan against the destinations without writing anything;
        every problem is listed in one ``VMMW_PLAN_MISMATCH`` error."""
        out = S.PlanSummary()
        call("vmmw_loader_plan", self.handle, ctypes.byref(out))
        return PlanSummary(**_fields(PlanSummary, out))

    def load(self, pool: Pool, progress: Optional[Progress] = None) -> LoadResult:
        """Load into the registered destinations on `pool`'s device; blocks
        until done (other Python threads run meanwhile). `progress(done,
        total)` is called on this thread; returning True, or raising, cancels
        the load (``VMMW_CANCELLED``; the exception is re-raised). Tags owning
        destinations in `pool` can then sleep with the ``"reload"`` policy."""
        failure: List[BaseException] = []

        def on_progress(done: int, total: int, _user: Any) -> int:
            if progress is None or failure:
                return 1 if failure else 0
            try:
                return 1 if progress(done, total) else 0
            except BaseException as e:  # noqa: BLE001 - re-raised after the load
                failure.append(e)
                return 1

        cb = S.PROGRESS_FN(on_progress) if progress is not None else S.PROGRESS_FN()
        try:
            call("vmmw_loader_load", self.handle, pool.handle, cb, None)
        except Exception:
            if failure:
                raise failure[0] from None
            raise
        if failure:  # the copies had all completed when the callback raised
            raise failure[0]
        return self.result()

    def cancel(self) -> None:
        """Ask the running (or next) load to stop. Any thread."""
        call("vmmw_loader_cancel", self.handle)

    def result(self) -> LoadResult:
        """What the last successful load did."""
        out = S.LoadResult()
        call("vmmw_loader_result", self.handle, ctypes.byref(out))
        return LoadResult(**_fields(LoadResult, out))

    def result_json(self) -> Dict[str, Any]:
        """The last load's statistics and plan summary."""
        return _json_object(call_text("vmmw_loader_result_json", self.handle))


def load(
    path: Union[str, os.PathLike[str]],
    pool: Pool,
    tag: str = "weights",
    *,
    preset: Optional[str] = None,
    tp_rank: int = 0,
    tp_world: int = 0,
    head_dim: int = 0,
    rules: Union[str, Mapping[str, Any], None] = None,
    strategy: str = "auto",
    progress: Optional[Progress] = None,
    reload_check: bool = False,
) -> Tuple[Dict[str, Destination], LoadResult]:
    """Allocate the checkpoint's destinations in `pool` under `tag` and load
    them: the destinations by name, and what the load did. `reload_check`:
    see :meth:`Loader.reload_check`. A load that fails (cancelled, an I/O or
    driver error) frees the destinations it allocated before raising, since
    the caller gets nothing back to free."""
    with Loader(path) as ld:
        if preset is not None:
            ld.preset(preset, tp_rank, tp_world, head_dim)
        if rules is not None:
            ld.rules(rules)
        ld.options(strategy)
        if reload_check:
            ld.reload_check()
        dests = ld.allocate(pool, tag)
        try:
            return dests, ld.load(pool, progress)
        except BaseException:
            for ptr in {d.ptr for d in dests.values()}:
                with contextlib.suppress(VmmwError):  # the load's error is the one to raise
                    pool.free(ptr)
            raise
