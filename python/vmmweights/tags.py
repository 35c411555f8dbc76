"""Tags: named groups of allocations ("weights", "kv_cache", ...).

Sleep and wake act per tag. Allocations made by a thread get the tag of its
innermost open scope (:func:`scope`), else the process default ("default").
Scopes are per OS thread, like the C API's ``vmmw_tag_push``/``vmmw_tag_pop``.
"""

from __future__ import annotations

import contextlib
import ctypes
from typing import Iterator

from ._native import call, call_text

DEFAULT = "default"


def tag_id(name: str) -> int:
    """The id of tag `name`, registering the name on first use (ids are stable
    for the life of the process). Registering is harmless: sleep and wake
    refuse a tag that never held memory in the pool."""
    out = ctypes.c_uint32()
    call("vmmw_tag_id", name.encode("utf-8"), ctypes.byref(out))
    return out.value


def tag_name(tag: int) -> str:
    """The name of a registered tag id."""
    return call_text("vmmw_tag_name", ctypes.c_uint32(tag))


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
