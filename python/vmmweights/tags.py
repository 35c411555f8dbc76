"""Tags: named groups of allocations ("weights", "kv_cache", ...).

Sleep and wake act per tag. Allocations made by a thread get the tag of its
innermost open scope (:func:`scope`), else the process default ("default").
Scopes are per OS thread, like the C API's ``vmmw_tag_push``/``vmmw_tag_pop``.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Callable, Dict, Iterator

from ._native import REMAP_FN, call, call_text

DEFAULT = "default"

# Ids and names seen, both ways: they never change once registered, and
# every update asks for them.
_ids: Dict[str, int] = {}
_names: Dict[int, str] = {}


def tag_id(name: str) -> int:
    """The id of tag `name`, registering the name on first use (ids are stable
    for the life of the process). Registering is harmless: sleep and wake
    refuse a tag that never held memory in the pool."""
    known = _ids.get(name)
    if known is not None:
        return known
    out = ctypes.c_uint32()
    call("vmmw_tag_id", name.encode("utf-8"), ctypes.byref(out))
    _ids[name] = out.value
    _names[out.value] = name
    return out.value


def tag_name(tag: int) -> str:
    """The name of a registered tag id."""
    known = _names.get(tag)
    if known is not None:
        return known
    name = call_text("vmmw_tag_name", ctypes.c_uint32(tag))
    _names[tag] = name
    _ids[name] = tag
    return name


def push(name: str) -> None:
    """Open a tag scope on the calling thread (close it with :func:`pop`)."""
    call("vmmw_tag_push", ctypes.c_uint32(tag_id(name)))


def pop() -> None:
    """Close the innermost tag scope of the calling thread."""
    call("vmmw_tag_pop")


def current() -> str:
    """The tag this thread's allocations get now."""
    out = ctypes.c_uint32()
    call("vmmw_tag_current", ctypes.byref(out))
    return tag_name(out.value)


@contextlib.contextmanager
def scope(name: str) -> Iterator[None]:
    """Allocations made by this thread inside the block get tag `name`."""
    push(name)
    try:
        yield
    finally:
        pop()


def remap_epoch(name: str) -> int:
    """How many times tag `name`'s memory was mapped anew in this process (each
    wake). Register RDMA buffers of the tag (NCCL, NIXL, UCX) again when it
    changed."""
    out = ctypes.c_uint64()
    call("vmmw_tag_remap_epoch", ctypes.c_uint32(tag_id(name)), ctypes.byref(out))
    return out.value


class RemapCallback:
    """A registered remap callback (:func:`on_remap`); :meth:`remove` stops it."""

    def __init__(self, fn: Callable[[str, int], None]) -> None:
        def trampoline(_user: object, tag: int, epoch: int) -> None:
            try:
                fn(tag_name(tag), epoch)
            except BaseException:  # noqa: BLE001 - nothing may unwind into C
                import traceback

                traceback.print_exc()

        # Kept on the object: ctypes frees the C thunk with the Python function.
        self._thunk = REMAP_FN(trampoline)
        out = ctypes.c_uint64()
        call("vmmw_remap_callback_add", self._thunk, None, ctypes.byref(out))
        self._id: int | None = out.value

    def remove(self) -> None:
        """Stop the callback: no call starts after this returns, and calls
        running on other threads have finished. Removing twice does nothing."""
        if self._id is not None:
            call("vmmw_remap_callback_remove", ctypes.c_uint64(self._id))
            self._id = None

    def __del__(self) -> None:
        # The C thunk dies with this object: never leave it registered.
        try:
            self.remove()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def __enter__(self) -> "RemapCallback":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def on_remap(fn: Callable[[str, int], None]) -> RemapCallback:
    """Call ``fn(tag_name, epoch)`` after every remap of any tag, on the thread
    that woke the tag, after the wake, with no library lock held (``fn`` may
    call the library). An exception in ``fn`` is printed and dropped. Keep the
    returned object: removing it, leaving its ``with`` block or dropping
    it stops the callback."""
    return RemapCallback(fn)
