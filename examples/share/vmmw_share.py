"""Attach to a vmmweights share from Python, through ctypes (no compiled extension).

    import vmmw_share
    with vmmw_share.attach("/run/weights.sock") as share:
        print(share.version(), share.names())
        raw = share.read("model.norm.weight")          # bytes, any backend
        t = share.torch("model.norm.weight")           # a torch tensor over the imported memory

The tensors are the owner's memory mapped at this process's addresses,
read-only: `torch()` builds a tensor over them without a copy (CUDA: through
`__cuda_array_interface__`; host backend: a CPU tensor). Writing through such a
tensor faults, and it is invalid after `detach()`. A revoked share raises
`ShareError` with status VMMW_SHARE_REVOKED (19) on the next call.

The library is found through VMMW_LIB (a path to libvmmweights.so), else in
target/release or target/debug of this repository. The python package
(python/) may wrap the same C functions; this file is the reference for their
signatures.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

VMMW_BUFFER_TOO_SMALL = 16
VMMW_SHARE_REFUSED = 18
VMMW_SHARE_REVOKED = 19
VMMW_BACKEND_AUTO = 0
MAX_DIMS = 8


class ShareError(RuntimeError):
    """A vmmw_share_* call failed; `status` is the stable VMMW_* code."""

    def __init__(self, function: str, status: int, message: str):
        super().__init__(f"{function}: status {status}: {message}")
        self.function, self.status, self.message = function, status, message


class Destination(ctypes.Structure):
    """vmmw_destination_t."""

    _fields_ = [
        ("ptr", ctypes.c_uint64),
        ("bytes", ctypes.c_uint64),
        ("dtype", ctypes.c_char * 16),
        ("ndim", ctypes.c_uint32),
        ("shape", ctypes.c_uint64 * MAX_DIMS),
    ]


def _library() -> ctypes.CDLL:
    env = os.environ.get("VMMW_LIB")
    candidates = [Path(env)] if env else [
        Path(__file__).resolve().parents[2] / sub / "libvmmweights.so"
        for sub in ("target/release", "target/debug")
    ]
    for p in candidates:
        if p.is_file():
            lib = ctypes.CDLL(str(p))
            break
    else:
        raise FileNotFoundError(f"libvmmweights.so not found (tried {', '.join(map(str, candidates))}); set VMMW_LIB")
    P, E = ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)
    sig = {
        "vmmw_device_open": ([ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(P), E], ctypes.c_int32),
        "vmmw_device_free": ([P], None),
        "vmmw_share_attach": ([P, ctypes.c_char_p, ctypes.c_uint32, ctypes.POINTER(P), E], ctypes.c_int32),
        "vmmw_share_count": ([P, ctypes.POINTER(ctypes.c_size_t), E], ctypes.c_int32),
        "vmmw_share_tensor_name": ([P, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
                                    ctypes.POINTER(ctypes.c_size_t), E], ctypes.c_int32),
        "vmmw_share_tensor": ([P, ctypes.c_char_p, ctypes.POINTER(Destination), E], ctypes.c_int32),
        "vmmw_share_version": ([P, ctypes.POINTER(ctypes.c_uint64), E], ctypes.c_int32),
        "vmmw_share_owner_connected": ([P, ctypes.POINTER(ctypes.c_uint32), E], ctypes.c_int32),
        "vmmw_share_read": ([P, ctypes.c_uint64, P, ctypes.c_size_t, E], ctypes.c_int32),
        "vmmw_share_detach": ([P, E], ctypes.c_int32),
        "vmmw_device_backend": ([P, ctypes.POINTER(ctypes.c_int32), E], ctypes.c_int32),
        "vmmw_error_message": ([P], ctypes.c_char_p),
        "vmmw_error_free": ([P], None),
    }
    for name, (args, res) in sig.items():
        f = getattr(lib, name)
        f.argtypes, f.restype = args, res
    return lib


_lib = None


def _call(name: str, *args) -> None:
    global _lib
    if _lib is None:
        _lib = _library()
    err = ctypes.c_void_p()
    rc = getattr(_lib, name)(*args, ctypes.byref(err))
    if rc != 0:
        msg = _lib.vmmw_error_message(err).decode("utf-8", "replace") if err else ""
        _lib.vmmw_error_free(err)
        raise ShareError(name, rc, msg)


class Share:
    """An attached share; use as a context manager or call detach()."""

    def __init__(self, path: str, read_write: bool = False, device: int = 0):
        self._dev = ctypes.c_void_p()
        _call("vmmw_device_open", VMMW_BACKEND_AUTO, device, ctypes.byref(self._dev))
        self._h = ctypes.c_void_p()
        try:
            _call("vmmw_share_attach", self._dev, os.fsencode(path), int(read_write), ctypes.byref(self._h))
        except BaseException:
            _lib.vmmw_device_free(self._dev)
            raise

    def __enter__(self) -> "Share":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    def _live(self) -> ctypes.c_void_p:
        if not self._h:
            raise ShareError("vmmw_share", 2, "use of a detached share")
        return self._h

    def names(self) -> list[str]:
        n = ctypes.c_size_t()
        _call("vmmw_share_count", self._live(), ctypes.byref(n))
        out = []
        for i in range(n.value):
            needed = ctypes.c_size_t()
            buf = ctypes.create_string_buffer(256)
            try:
                _call("vmmw_share_tensor_name", self._h, i, buf, len(buf), ctypes.byref(needed))
            except ShareError as e:
                if e.status != VMMW_BUFFER_TOO_SMALL:
                    raise
                buf = ctypes.create_string_buffer(needed.value)
                _call("vmmw_share_tensor_name", self._h, i, buf, len(buf), ctypes.byref(needed))
            out.append(buf.value.decode())
        return out

    def info(self, name: str) -> dict:
        d = Destination()
        _call("vmmw_share_tensor", self._live(), name.encode(), ctypes.byref(d))
        return {"ptr": d.ptr, "bytes": d.bytes, "dtype": d.dtype.decode(), "shape": list(d.shape[: d.ndim])}

    def version(self) -> int:
        v = ctypes.c_uint64()
        _call("vmmw_share_version", self._live(), ctypes.byref(v))
        return v.value

    def owner_connected(self) -> bool:
        c = ctypes.c_uint32()
        _call("vmmw_share_owner_connected", self._live(), ctypes.byref(c))
        return bool(c.value)

    def read(self, name: str) -> bytes:
        i = self.info(name)
        buf = ctypes.create_string_buffer(max(i["bytes"], 1))
        _call("vmmw_share_read", self._h, i["ptr"], buf, i["bytes"])
        return buf.raw[: i["bytes"]]

    def torch(self, name: str):
        """A torch tensor over the imported memory (no copy), valid until detach()."""
        import torch

        i = self.info(name)
        same_size = {"BF16": (torch.int16, torch.bfloat16, "<i2"), "F16": (torch.float16, None, "<f2"),
                     "F32": (torch.float32, None, "<f4"), "F64": (torch.float64, None, "<f8"),
                     "I64": (torch.int64, None, "<i8"), "I32": (torch.int32, None, "<i4"),
                     "I16": (torch.int16, None, "<i2"), "I8": (torch.int8, None, "|i1"),
                     "U8": (torch.uint8, None, "|u1"), "BOOL": (torch.bool, None, "|b1")}
        if i["dtype"] not in same_size:
            raise ShareError("torch", 15, f"dtype {i['dtype']} has no torch view here")
        base, view, typestr = same_size[i["dtype"]]
        b = ctypes.c_int32()
        _call("vmmw_device_backend", self._dev, ctypes.byref(b))
        if b.value == 2:  # VMMW_BACKEND_CUDA

            class _Cai:
                __cuda_array_interface__ = {"shape": tuple(i["shape"]), "typestr": typestr,
                                            "data": (i["ptr"], True), "version": 3, "strides": None}

            t = torch.as_tensor(_Cai(), device="cuda")
        else:
            n = i["bytes"]
            t = torch.frombuffer((ctypes.c_byte * n).from_address(i["ptr"]), dtype=base).reshape(i["shape"])
        return t.view(view) if view is not None else t

    def detach(self) -> None:
        if self._h:
            h, self._h = self._h, ctypes.c_void_p()
            try:
                _call("vmmw_share_detach", h)
            finally:
                _lib.vmmw_device_free(self._dev)


def attach(path: str, read_write: bool = False, device: int = 0) -> Share:
    """Attach to the share at `path` (see the module docs)."""
    return Share(path, read_write, device)
