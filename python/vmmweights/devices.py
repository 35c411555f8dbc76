"""Several devices of one host: one load into pools on several devices, and
replicas put to sleep and woken together.

Each pool is one device's (``Pool(device=k)`` or ``Pool.default(k)``).

- :func:`load_devices`: one checkpoint into every loader's destinations on
  its pool's device at once; ``"replicas"`` reads host memory once and
  exchanges the shares over peer copies, ``"ranks"`` loads each loader's own
  plan (tensor-parallel ranks).
- :func:`sleep_replicas` / :func:`wake_replicas_from_backup`: replicas (the same bytes
  in a tag on every device) sleep on one pinned host backup taken from the
  first device (raw, or compressed with ``holder_policy="offload_compressed"``);
  the wake restores every device from it, each copying (or decoding) a
  different 1/N over its own link and the parts exchanged over peer copies.
  A failed wake leaves every replica asleep with the backup intact.
- :func:`wake_replicas_by_reload`: replicas slept with ``"discard"``
  woken by one checkpoint fan-out.

The former names ``wake_replicas`` and ``wake_replicas_from_checkpoint`` still
work through 0.x and warn (``DeprecationWarning``).
"""

from __future__ import annotations

import ctypes
import warnings
from typing import Any, Dict, Sequence, Tuple

from . import _structs as S
from ._native import call
from .loader import Loader
from .pool import POLICIES, Pool
from .tags import tag_id

MODES = {"replicas": 0, "ranks": 1}


def _fields(result: ctypes.Structure) -> Dict[str, Any]:
    return {f[0]: getattr(result, f[0]) for f in result._fields_}


def _handles(items: Sequence[Any]) -> Any:
    arr = (ctypes.c_void_p * max(len(items), 1))()
    for i, x in enumerate(items):
        arr[i] = x.handle.value
    return arr


def _pairs(loaders: Sequence[Loader], pools: Sequence[Pool]) -> Tuple[Any, Any, int]:
    if len(loaders) != len(pools):
        raise ValueError(f"one pool per loader: {len(loaders)} loaders, {len(pools)} pools")
    return _handles(loaders), _handles(pools), len(loaders)


def load_devices(loaders: Sequence[Loader], pools: Sequence[Pool], mode: str = "replicas") -> Dict[str, Any]:
    """Load one checkpoint into ``loaders[i]``'s destinations on
    ``pools[i]``'s device, for every i at once (``vmmw_loader_load_devices``).
    Returns the figures (host_bytes, peer_bytes, delivered_bytes, seconds, gbps...)."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {sorted(MODES)}")
    ls, ps, n = _pairs(loaders, pools)
    r = S.MultiResult()
    call("vmmw_loader_load_devices", ls, ps, n, MODES[mode], ctypes.byref(r))
    return _fields(r)


def wake_replicas_by_reload(loaders: Sequence[Loader], pools: Sequence[Pool]) -> Dict[str, Any]:
    """Wake replicas slept with ``"discard"``: their tags are woken, then the
    checkpoint is read from host memory once and fanned out over peer copies
    (``vmmw_replicas_wake_by_reload``)."""
    ls, ps, n = _pairs(loaders, pools)
    r = S.MultiResult()
    call("vmmw_replicas_wake_by_reload", ls, ps, n, ctypes.byref(r))
    return _fields(r)


def wake_replicas_from_checkpoint(loaders: Sequence[Loader], pools: Sequence[Pool]) -> Dict[str, Any]:
    """The former name of :func:`wake_replicas_by_reload`, kept through 0.x."""
    warnings.warn(
        "wake_replicas_from_checkpoint is renamed wake_replicas_by_reload", DeprecationWarning, stacklevel=2
    )
    return wake_replicas_by_reload(loaders, pools)


def _group(replicas: Sequence[Tuple[Pool, str]]) -> Tuple[Any, Any, int]:
    pools = [p for p, _ in replicas]
    tags = (ctypes.c_uint32 * max(len(replicas), 1))(*[tag_id(t) for _, t in replicas])
    return _handles(pools), tags, len(replicas)


def sleep_replicas(replicas: Sequence[Tuple[Pool, str]], *, holder_policy: str = "offload") -> Dict[str, Any]:
    """Put replicas ``[(pool, tag), ...]`` (one pool per device, the same
    bytes in each, allocated the same way) to sleep on one host backup taken
    from the first; the others release their memory without a copy
    (``vmmw_replicas_sleep_with``). ``holder_policy`` is ``"offload"`` (raw
    bytes) or ``"offload_compressed"`` (codec frames, decoded on every device
    at wake); any other policy raises ``VMMW_INVALID_ARGUMENT`` and nothing
    sleeps. Returns backup_bytes (encoded bytes when compressed),
    released_bytes, seconds."""
    if holder_policy not in POLICIES:
        raise ValueError(f"unknown holder_policy {holder_policy!r}: expected 'offload' or 'offload_compressed'")
    ps, ts, n = _group(replicas)
    o = S.ReplicaSleepOptions(holder_policy=POLICIES[holder_policy])
    r = S.ReplicaSleepResult()
    call("vmmw_replicas_sleep_with", ps, ts, n, ctypes.byref(o), ctypes.byref(r))
    return _fields(r)


def wake_replicas_from_backup(
    replicas: Sequence[Tuple[Pool, str]], *, peer_copies: bool = True, copy_piece_bytes: int = 0
) -> Dict[str, Any]:
    """Wake replicas slept by :func:`sleep_replicas` on every device from the
    one backup, host memory read once (``vmmw_replicas_wake_from_backup``); a
    compressed backup is decoded on every device, each a share of its frames. With
    ``peer_copies=False`` every device copies the whole backup. On an error
    every replica stays asleep with the backup intact; waking again can succeed."""
    ps, ts, n = _group(replicas)
    o = S.ReplicaWakeOptions(copy_piece_bytes=copy_piece_bytes, no_peer_copies=0 if peer_copies else 1)
    r = S.ReplicaWakeResult()
    call("vmmw_replicas_wake_from_backup", ps, ts, n, ctypes.byref(o), ctypes.byref(r))
    return _fields(r)


def wake_replicas(
    replicas: Sequence[Tuple[Pool, str]], *, peer_copies: bool = True, copy_piece_bytes: int = 0
) -> Dict[str, Any]:
    """The former name of :func:`wake_replicas_from_backup`, kept through 0.x."""
    warnings.warn("wake_replicas is renamed wake_replicas_from_backup", DeprecationWarning, stacklevel=2)
    return wake_replicas_from_backup(replicas, peer_copies=peer_copies, copy_piece_bytes=copy_piece_bytes)
