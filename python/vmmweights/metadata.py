"""A checkpoint's metadata (GGUF's typed key/value pairs), read through the
C API: :func:`gguf_metadata` gives every pair as Python values, in file
order; :func:`gguf_metadata_types` the GGUF type name of each value;
:func:`ggml_type` the ggml type table's entry for a type name."""

from __future__ import annotations

import ctypes
import os
from typing import Any, Dict, List, Tuple, Union

from ._native import call, call_text, function

# GGUF's value type numbers (VMMW_METADATA_*).
TYPE_NAMES = ("uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool",
              "string", "array", "uint64", "int64", "float64")
_SIGNED = {1, 3, 5, 11}
_UNSIGNED = {0, 2, 4, 10}


class _Meta:
    def __init__(self, path: Union[str, "os.PathLike[str]"]) -> None:
        self.handle = ctypes.c_void_p()
        call("vmmw_metadata_open", os.fsencode(path), ctypes.byref(self.handle))

    def close(self) -> None:
        if self.handle:
            function("vmmw_metadata_free")(self.handle)
            self.handle = ctypes.c_void_p()

    def count(self) -> int:
        n = ctypes.c_size_t()
        call("vmmw_metadata_count", self.handle, ctypes.byref(n))
        return n.value

    def key(self, i: int) -> str:
        return call_text("vmmw_metadata_key", self.handle, i)

    def kind(self, i: int, path: List[int]) -> Tuple[int, int, int]:
        p = (ctypes.c_size_t * max(1, len(path)))(*path)
        t, et, n = ctypes.c_uint32(), ctypes.c_uint32(), ctypes.c_size_t()
        call("vmmw_metadata_type", self.handle, i, p, len(path), ctypes.byref(t), ctypes.byref(et), ctypes.byref(n))
        return t.value, et.value, n.value

    def value(self, i: int, path: List[int]) -> Any:
        t, _, n = self.kind(i, path)
        p = (ctypes.c_size_t * max(1, len(path)))(*path)
        if t == 9:
            return [self.value(i, path + [j]) for j in range(n)]
        if t == 8:
            return call_text("vmmw_metadata_string", self.handle, i, p, len(path))
        out: Any
        if t in _UNSIGNED:
            out, fn = ctypes.c_uint64(), "vmmw_metadata_u64"
        elif t in _SIGNED:
            out, fn = ctypes.c_int64(), "vmmw_metadata_i64"
        elif t == 7:
            out, fn = ctypes.c_uint8(), "vmmw_metadata_bool"
        else:
            out, fn = ctypes.c_double(), "vmmw_metadata_f64"
        call(fn, self.handle, i, p, len(path), ctypes.byref(out))
        return bool(out.value) if t == 7 else out.value


def _each(path: Union[str, "os.PathLike[str]"], f: Any) -> Dict[str, Any]:
    m = _Meta(path)
    try:
        return {m.key(i): f(m, i) for i in range(m.count())}
    finally:
        m.close()


def gguf_metadata(path: Union[str, "os.PathLike[str]"]) -> Dict[str, Any]:
    """Every metadata pair of the checkpoint at `path`, in file order (empty
    for safetensors): integers as int, floats as float, arrays as lists
    (nested arrays as nested lists)."""
    return _each(path, lambda m, i: m.value(i, []))


def gguf_metadata_types(path: Union[str, "os.PathLike[str]"]) -> Dict[str, str]:
    """The GGUF type name of each pair's value ("uint32", "array", ...)."""
    return _each(path, lambda m, i: TYPE_NAMES[m.kind(i, [])[0]])


def ggml_type(name: str) -> Tuple[int, int, int]:
    """The ggml type `name` ("Q8_0"): (number in GGUF files, elements per
    block, bytes per block)."""
    t, block, size = ctypes.c_uint32(), ctypes.c_size_t(), ctypes.c_size_t()
    call("vmmw_ggml_type", name.encode(), ctypes.byref(t), ctypes.byref(block), ctypes.byref(size))
    return t.value, block.value, size.value
