"""Updates: new weights into the destinations a load registered, by
checkpoint name, through the load's rules (docs/UPDATES.md).

    with vw.Loader(path) as ld:
        ld.preset("qwen3")
        ld.allocate(pool, "weights")
        ld.load(pool)
        src = UpdateSource()
        src.add("model.embed_tokens.weight", "BF16", [151936, 4096], ptr)  # device memory
        r = update(ld, pool, src, expected_version=pool.tag_version("weights"))
        assert r.version == 2

Every problem (a missing, unknown or mis-shaped tensor, a wrong version) is
reported in one ``VmmwError`` before any byte moves; each destination ends
untouched or wholly new. PyTorch: :func:`vmmweights.torch.update_`.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

from . import _structs as S
from ._native import call
from ._owned import OwnedHandle
from .loader import Loader
from .pool import Pool
from .tags import tag_id, tag_name

#: Where a source tensor's bytes lie: memory the pool's device can read, or
#: host memory of this process.
MEMORY = {"device": 0, "host": 1}


@dataclass(frozen=True)
class UpdateResult:
    """What an update did."""

    tag: str
    """The tag versioned."""
    version: int
    """Its new version."""
    bytes: int
    """Bytes written into destinations."""
    destinations: int
    copies: int
    staged: bool
    """True when the update went through scratch device memory first."""
    retried: bool
    """True when the copies into the destinations failed once and ran again."""
    seconds: float
    gbps: float
    plan_seconds: float = 0.0
    """Checks and plan, up to the first copy queued."""
    issue_seconds: float = 0.0
    """Queuing the copies on the device."""
    wait_seconds: float = 0.0
    """Waiting for the device to finish them."""
    bookkeeping_seconds: float = 0.0
    """Reload retirement (while the device copies), version publish, release."""

    @staticmethod
    def of(out: S.UpdateResult) -> "UpdateResult":
        """From a ``vmmw_update_result_t``."""
        return UpdateResult(tag=tag_name(out.tag), version=out.version, bytes=out.bytes,
                            destinations=out.destinations, copies=out.copies, staged=bool(out.staged),
                            retried=bool(out.retried), seconds=out.seconds, gbps=out.gbps,
                            plan_seconds=out.plan_seconds, issue_seconds=out.issue_seconds,
                            wait_seconds=out.wait_seconds, bookkeeping_seconds=out.bookkeeping_seconds)


class UpdateSource(OwnedHandle):
    """Whole tensors, by checkpoint name, that :func:`update` reads. The
    memory stays the caller's: keep it alive, unchanged, while updates read
    it. One source serves any number of updates. Use as a context manager,
    or call :meth:`close` (which frees the source, not the memory it names,
    and lets go of the objects `add` kept)."""

    _free = "vmmw_update_source_free"

    def __init__(self) -> None:
        handle = ctypes.c_void_p()
        call("vmmw_update_source_new", ctypes.byref(handle))
        self._handle: Optional[ctypes.c_void_p] = handle
        self._keep: List[Any] = []

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ``vmmw_update_source_t*``."""
        if self._handle is None:
            raise ValueError("the update source is closed")
        return self._handle

    def add(self, name: str, dtype: str, shape: Sequence[int], ptr: int, memory: str = "device",
            keep: Any = None) -> None:
        """Add tensor `name` of `dtype` ("BF16", "bfloat16", ...) and `shape`
        lying contiguously at `ptr` in `memory` ("device" or "host").
        `keep`: an object held as long as the source (the tensor whose
        memory this is)."""
        if memory not in MEMORY:
            raise ValueError(f"memory {memory!r}: expected one of {sorted(MEMORY)}")
        dims = (ctypes.c_uint64 * max(len(shape), 1))(*shape)
        call("vmmw_update_source_add", self.handle, name.encode("utf-8"), dtype.encode(), dims,
             ctypes.c_size_t(len(shape)), ctypes.c_uint64(ptr), ctypes.c_int32(MEMORY[memory]))
        if keep is not None:
            self._keep.append(keep)

    def close(self) -> None:
        super().close()
        self._keep.clear()


def update(
    loader: Loader,
    pool: Pool,
    source: UpdateSource,
    expected_version: int,
    *,
    tag: Optional[str] = None,
    allow_missing: bool = False,
    allow_unexpected: bool = False,
    staged: bool = False,
) -> UpdateResult:
    """Write `source` into the destinations `loader` registered, through its
    rules, on `pool`'s device, replacing version `expected_version` of their
    tag (:meth:`Pool.tag_version`) with the next one. `tag`: the tag to
    version (needed when the destinations lie outside the pool; by default
    the one pool tag they lie in). `allow_missing`: update only the
    destinations the source fills. `staged`: go through scratch device
    memory even for tensors of this process. Raises ``VmmwError``:
    ``VMMW_VERSION_MISMATCH``, ``VMMW_PLAN_MISMATCH`` (every problem listed),
    nothing written; ``VMMW_UPDATE_TORN`` when the copies failed twice."""
    opts = S.UpdateOptions(expected_version=expected_version, tag_set=int(tag is not None),
                           tag=tag_id(tag) if tag is not None else 0, allow_missing=int(allow_missing),
                           allow_unexpected=int(allow_unexpected), staging=int(staged))
    out = S.UpdateResult()
    call("vmmw_update", loader.handle, pool.handle, source.handle, ctypes.byref(opts), ctypes.byref(out))
    return UpdateResult.of(out)
