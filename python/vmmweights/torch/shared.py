"""Torch tensors over weights another process shares (:mod:`vmmweights.share`).

    from vmmweights import share
    import vmmweights.torch as vt
    att = share.attach("/run/qwen.sock", device=0)
    weights = vt.shared.tensors(att)               # name -> torch.Tensor, no copy
    missing = vt.shared.bind_(model, att)          # a module's parameters over them

Each tensor views the imported memory at this process's address with the
share's dtype and shape, on ``cuda:<att.device>`` (host backend: a CPU tensor
over the memfd mapping). It holds a reference to the attachment, so the
mapping lives while any tensor does; :meth:`Attachment.detach` unmaps at once
and every tensor from it becomes invalid. The mapping is read-only unless the
share was attached with ``write=True``: writing through a read-only tensor
faults (the process dies), so only read them (``torch.no_grad()``,
``requires_grad=False``).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from ..share import Attachment, SharedTensor
from .dtypes import _TYPESTR, DTYPES

__all__ = ["bind_", "tensor", "tensors"]

# dtype name -> (torch dtype it travels as, the one it is viewed as or None).
# BOOL travels as uint8: older DLPack readers lack kDLBool.
_TORCH = {name: (torch.int16 if view is torch.bfloat16 else {v: k for k, v in DTYPES.items()}[name], view)
          for name, (_, view) in _TYPESTR.items()}
_TORCH["BOOL"] = (torch.uint8, torch.bool)


class _Imported:
    """__cuda_array_interface__ (v3) of one imported tensor; holds the
    attachment, which torch keeps alive with the tensor. The read-only flag
    stays False: torch refuses arrays that set it (the mapping itself is
    what enforces read-only)."""

    def __init__(self, att: Attachment, t: SharedTensor, typestr: str) -> None:
        self.attachment = att
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "typestr": typestr, "data": (t.ptr, False),
            "strides": None, "version": 3,
        }


# --- DLPack, for memory whose owning device differs from the reading device -------------
# torch infers a __cuda_array_interface__ tensor's device from the pointer
# (cudaPointerGetAttributes), which names the device holding the physical
# memory: the owner's GPU. An importer on another GPU of the host (peer access
# over NVLink) needs its tensors on its own device; DLPack names the device
# explicitly and torch takes it as given.

_KDL_CPU, _KDL_CUDA = 1, 2
_DL_CODES = {torch.int8: (0, 8), torch.int16: (0, 16), torch.int32: (0, 32), torch.int64: (0, 64),
             torch.uint8: (1, 8), torch.float16: (2, 16), torch.float32: (2, 32), torch.float64: (2, 64)}


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    pass


_DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(_DLManagedTensor))
_DLManagedTensor._fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]

# address of a managed tensor -> what must live until torch calls its deleter
_alive: Dict[int, Tuple[Any, ...]] = {}
_alive_lock = threading.Lock()


def _release(managed: Any) -> None:
    with _alive_lock:
        _alive.pop(ctypes.addressof(managed.contents), None)


_deleter = _DELETER(_release)
_DLTENSOR_NAME = b"dltensor"
_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _from_dlpack(att: Attachment, t: SharedTensor, travel: torch.dtype, device: int) -> torch.Tensor:
    code, bits = _DL_CODES[travel]
    shape = (ctypes.c_int64 * max(len(t.shape), 1))(*t.shape)
    m = _DLManagedTensor()
    m.dl_tensor = _DLTensor(t.ptr, _DLDevice(_KDL_CUDA, device), len(t.shape), _DLDataType(code, bits, 1),
                            ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)), None, 0)
    m.manager_ctx = None
    m.deleter = _deleter
    key = ctypes.addressof(m)
    with _alive_lock:
        _alive[key] = (m, shape, att)
    try:
        return torch.utils.dlpack.from_dlpack(_capsule_new(key, _DLTENSOR_NAME, None))
    except BaseException:
        with _alive_lock:
            _alive.pop(key, None)
        raise


def tensor(att: Attachment, name: str, device: Optional[int] = None) -> torch.Tensor:
    """Tensor `name` of `att` as a ``torch.Tensor`` over the imported memory
    (no copy), with the share's dtype and shape, on ``cuda:<device>``
    (`device` defaults to the device the share was attached on; it must be
    that one). Host backend: a CPU tensor. Raises :class:`VmmwError` for an
    unknown name, a detached or revoked share; ``ValueError`` for a dtype
    torch cannot view."""
    t = att.tensor(name)
    if t.dtype not in _TORCH:
        raise ValueError(f"shared tensor {name!r}: dtype {t.dtype} has no torch view; expected one of {sorted(_TORCH)}")
    travel, view = _TORCH[t.dtype]
    if att.backend == "host":
        # The host backend maps the owner's memfd into this process: a CPU
        # tensor over it. torch keeps the buffer object, which holds the attachment.
        if not t.bytes:
            host = torch.empty(t.shape, dtype=travel)
        else:
            buffer_type: Any = type("_SharedBytes", (ctypes.c_byte * t.bytes,), {})
            raw = buffer_type.from_address(t.ptr)
            raw.attachment = att
            host = torch.frombuffer(raw, dtype=travel).reshape(t.shape)
        return host.view(view) if view is not None else host
    dev = att.device if device is None else int(device)
    if dev != att.device:
        raise ValueError(f"shared tensor {name!r}: the share is attached on cuda:{att.device}, not cuda:{dev}; "
                         "attach on the device that reads it")
    typestr = _TYPESTR[t.dtype][0] if t.dtype != "BOOL" else "|u1"
    out: Optional[torch.Tensor] = None
    if t.bytes:
        try:
            # As vmmweights.torch.as_tensor views pool memory; no device given,
            # so torch never copies: it uses the device the pointer belongs to.
            out = torch.as_tensor(_Imported(att, t, typestr))
        except RuntimeError:
            out = None  # the pointer query failed: name the device through DLPack
        if out is not None and (out.device != torch.device("cuda", dev) or out.data_ptr() != t.ptr):
            out = None  # physical memory on another GPU (peer access): DLPack
        if out is None:
            out = _from_dlpack(att, t, travel, dev)
    else:
        out = torch.empty(t.shape, dtype=travel, device=f"cuda:{dev}")
    if out.data_ptr() != t.ptr and t.bytes:
        raise RuntimeError(f"shared tensor {name!r}: torch copied it (data_ptr {out.data_ptr():#x}, "
                           f"imported at {t.ptr:#x})")
    return out.view(view) if view is not None else out


def tensors(att: Attachment, device: Optional[int] = None) -> Dict[str, torch.Tensor]:
    """:func:`tensor` of every tensor of `att`, by name."""
    return {n: tensor(att, n, device) for n in att.names()}


def bind_(module: torch.nn.Module, att: Union[Attachment, Mapping[str, torch.Tensor]], *, strict: bool = True,
          device: Optional[int] = None) -> List[str]:
    """Replace `module`'s parameters and persistent buffers, by
    ``state_dict`` name, with tensors over `att`'s imported memory (no copy;
    parameters with ``requires_grad=False``), or with the tensors of a
    mapping (the owner's own views, ``vmmweights.torch.tensors(dests)``).
    Shapes and dtypes must match.
    Names of `module` the share lacks are returned (tied weights: bind the
    other name yourself, e.g. ``lm_head.weight = embed_tokens.weight``);
    with `strict`, a shared name the module lacks is a ``KeyError``.
    Non-persistent buffers (rotary ``inv_freq``) are left to the module:
    move them to the device yourself."""
    shared = dict(att) if isinstance(att, Mapping) else tensors(att, device)
    where = "the tensors given" if isinstance(att, Mapping) else f"the share at {att.path}"
    own = module.state_dict(keep_vars=True)
    if strict:
        extra = sorted(set(shared) - set(own))
        if extra:
            raise KeyError(f"{where} has tensors the module lacks: {', '.join(extra[:5])}")
    bad = [f"{n}: module {tuple(own[n].shape)} {own[n].dtype}, share {tuple(x.shape)} {x.dtype}"
           for n, x in shared.items() if n in own and (own[n].shape != x.shape or own[n].dtype != x.dtype)]
    if bad:
        raise ValueError(f"{where}: shapes or dtypes do not fit the module: {'; '.join(bad[:5])}")
    for name, x in shared.items():
        if name not in own:
            continue
        owner_name, _, leaf = name.rpartition(".")
        sub = module.get_submodule(owner_name) if owner_name else module
        if leaf in sub._parameters:
            sub._parameters[leaf] = torch.nn.Parameter(x, requires_grad=False)
        else:
            sub._buffers[leaf] = x
    return [n for n in own if n not in shared]
