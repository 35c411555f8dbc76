"""A Python object that owns one native handle of the C library."""

from __future__ import annotations

import ctypes
from typing import ClassVar, Optional, TypeVar

from ._native import function

_T = TypeVar("_T", bound="OwnedHandle")


class OwnedHandle:
    """Owns one ``vmmw_*_t*``: the C function named by ``_free`` frees it on
    :meth:`close`, at the end of a ``with`` block, or when the object is
    collected, whichever comes first; later closes do nothing."""

    _free: ClassVar[str]
    _handle: Optional[ctypes.c_void_p] = None

    def close(self) -> None:
        """Free the handle now (what that releases: the class says)."""
        handle, self._handle = self._handle, None
        if handle is not None:
            function(self._free)(handle)

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
