"""The control channel (docs/PRELOAD.md): ask a process serving a control
socket for its memory status, to sleep, or to wake.

A CUDA program run under the interposer (``vmmw exec -- llama-server ...``)
serves one; so does a process that serves its own default pools with
:func:`serve`::

    from vmmweights import control
    control.status("/run/llama.sock")["state"]         # "awake", "asleep", ...
    r = control.sleep("/run/llama.sock", "offload")     # every device synchronized first
    print(r.bytes, r.seconds)
    control.wake("/run/llama.sock", wait_memory_ms=5000)

A refusal raises :class:`~vmmweights.VmmwError` with the status the process
named (``status_name == "VMMW_OUT_OF_MEMORY"`` for a wake without room; the
process stays asleep with every backup intact); a socket nobody serves is
``VMMW_IO``.
"""

from __future__ import annotations

import ctypes
import json
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from . import _structs as S
from ._native import call, call_text
from ._owned import OwnedHandle

# The C policy numbers (vmmw_policy_t); the process refuses reload.
_POLICIES = {"offload": 0, "discard": 1, "reload": 2, "offload_compressed": 3}


@dataclass(frozen=True)
class ControlResult:
    """What a sleep or wake did (``vmmw_control_result_t``)."""

    seconds: float
    """Wall time of the call in the process."""
    sync_seconds: float
    """Of it, the synchronization of every device before a sleep."""
    wait_seconds: float
    """Of it, a wake's wait for memory."""
    bytes: int
    """Physical device memory released (sleep) or mapped again (wake)."""
    backup_bytes: int
    """What the host backups hold after a sleep, or gave back at a wake."""


def _result(r: S.ControlResult) -> ControlResult:
    return ControlResult(r.seconds, r.sync_seconds, r.wait_seconds, r.bytes, r.backup_bytes)


def _names(tags: Optional[Sequence[str]]) -> Tuple[Any, int]:
    if not tags:
        return None, 0
    if isinstance(tags, str):
        raise TypeError("tags: a sequence of tag names, not one string")
    arr = (ctypes.c_char_p * len(tags))(*[t.encode() for t in tags])
    return arr, len(tags)


def status(socket: str) -> Dict[str, Any]:
    """The status of the process serving ``socket``, decoded from its JSON:
    ``pid``, ``state``, ``tags`` (each tag of each device: ``device``,
    ``tag``, ``asleep``, ``live_bytes``, ``tracked_bytes``,
    ``backup_bytes``), ``devices`` (``free``, ``total``, ``ours``,
    ``cached``), ``host_backup_bytes``, ``last`` (the last sleep or wake
    answer, or ``None``) and what the process adds (``interposer``)."""
    doc: Dict[str, Any] = json.loads(call_text("vmmw_control_status", socket.encode()))
    return doc


def sleep(socket: str, policy: str = "offload", tags: Optional[Sequence[str]] = None) -> ControlResult:
    """Synchronize every device of the process serving ``socket`` and sleep
    its tags (``tags``, or every tag) with ``policy``: ``"offload"``,
    ``"offload_compressed"`` or ``"discard"``."""
    try:
        p = _POLICIES[policy]
    except KeyError:
        raise ValueError(f"unknown policy {policy!r}: expected offload, offload_compressed or discard") from None
    names, n = _names(tags)
    r = S.ControlResult()
    call("vmmw_control_sleep", socket.encode(), p, names, n, ctypes.byref(r))
    return _result(r)


def wake(socket: str, wait_memory_ms: int = 0, tags: Optional[Sequence[str]] = None) -> ControlResult:
    """Wake the tags asleep (``tags``, or every asleep tag) of the process
    serving ``socket``, waiting up to ``wait_memory_ms`` for device memory
    being released elsewhere (0: refuse at once when it is short). A failed
    wake leaves every backup intact."""
    if wait_memory_ms < 0:
        raise ValueError(f"wait_memory_ms {wait_memory_ms}: expected 0 or more")
    names, n = _names(tags)
    r = S.ControlResult()
    call("vmmw_control_wake", socket.encode(), wait_memory_ms, names, n, ctypes.byref(r))
    return _result(r)


class Server(OwnedHandle):
    """This process's default pools (``Pool.default()``, every device) served
    on a control socket (``vmmw_control_serve``) until :meth:`close`."""

    _free = "vmmw_control_server_free"

    def __init__(self, socket: str):
        h = ctypes.c_void_p()
        call("vmmw_control_serve", socket.encode(), ctypes.byref(h))
        self._handle = h
        self.socket = socket


def serve(socket: str) -> Server:
    """Serve this process's default pools on a new control socket at ``socket``."""
    return Server(socket)
