"""Update transports for PyTorch: a trainer sends its state dict from its own
process (:class:`Sender`) or over NCCL (:func:`broadcast_`), and an engine
receives into the tensors a :func:`vmmweights.torch.load_` filled, through
that load's rules (:func:`receive_`, :func:`broadcast_`), each
tensor-parallel rank keeping its slices.

    # trainer process
    with vt.transport.Sender("/tmp/engine.sock") as tx:
        tx.send(model.state_dict())
    # engine process
    vt.transport.receive_(engine_model, "/tmp/engine.sock")
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Union

import torch

from .. import transport as _transport
from ..update import UpdateResult, UpdateSource
from . import _device, _loads, _lock, _signature, _state_dict, pool
from .dtypes import DTYPES


def _source(state: Mapping[str, torch.Tensor], dev: int) -> UpdateSource:
    src = UpdateSource()
    try:
        for name, t in state.items():
            if t.numel() == 0:
                continue
            if not t.is_contiguous() or t.dtype not in DTYPES:
                raise ValueError(f"`{name}`: contiguous tensors of {sorted(map(str, DTYPES))} only")
            if t.is_cuda and _device(t.device) != dev:
                raise ValueError(f"`{name}` is on {t.device}, the sender's pool on cuda:{dev}")
            if not t.is_cuda and t.device.type != "cpu":
                raise ValueError(f"`{name}` is on {t.device}: CUDA or CPU tensors only")
            src.add(name, DTYPES[t.dtype], list(t.shape), t.data_ptr(), "device" if t.is_cuda else "host", keep=t)
    except BaseException:
        src.close()
        raise
    return src


class Sender:
    """A trainer's IPC sender on `device`: a ring of `slots` buffers of
    `slot_bytes` (0: 2 of 256 MiB) exported once, receivers connecting at
    `path`."""

    def __init__(self, path: str, device: Union[int, torch.device, None] = None, slots: int = 0,
                 slot_bytes: int = 0, timeout_ms: int = 0) -> None:
        self._dev = _device(device)
        self._tx = _transport.Sender(pool(self._dev), path, slots, slot_bytes, timeout_ms)

    def send(self, state: Union[torch.nn.Module, Mapping[str, torch.Tensor]], receivers: int = 1) -> _transport.SendReport:
        """Wait for `receivers` engine ranks and send them `state` (a model or
        state dict, by checkpoint name); returns once every one committed."""
        src = _source(_state_dict(state), self._dev)
        try:
            torch.cuda.synchronize(self._dev)  # the trainer's kernels wrote the tensors
            return self._tx.send(src, receivers)
        finally:
            src.close()

    def close(self) -> None:
        self._tx.close()

    def __enter__(self) -> "Sender":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _loader_of(target: Union[torch.nn.Module, Mapping[str, torch.Tensor]]) -> Any:
    tensors = _state_dict(target)
    with _lock:
        ld = _loads.get(_signature(tensors))
    if ld is None:
        raise ValueError("updates write through the rules of the load_ that filled these tensors: "
                         "call vmmweights.torch.load_ on this model or state dict first")
    first = next(t for _, t in sorted(tensors.items()) if t.numel() > 0)
    return ld, _device(first.device), first


def _tag_of(first: torch.Tensor, dev: int, tag: Optional[str]) -> str:
    return tag if tag is not None else pool(dev).tag_of(first.data_ptr())


def receive_(target: Union[torch.nn.Module, Mapping[str, torch.Tensor]], path: str, *,
             expected_version: Optional[int] = None, tag: Optional[str] = None,
             timeout_ms: int = 0) -> UpdateResult:
    """Receive one update from the :class:`Sender` at `path` into `target`
    (filled by :func:`vmmweights.torch.load_`), through that load's rules."""
    ld, dev, first = _loader_of(target)
    p = pool(dev)
    tag = _tag_of(first, dev, tag)
    version = p.tag_version(tag) if expected_version is None else expected_version
    torch.cuda.synchronize(dev)  # nothing queued may still read the targets
    return _transport.receive_ipc(ld, p, path, version, timeout_ms=timeout_ms, tag=tag)


def broadcast_(target: Optional[Union[torch.nn.Module, Mapping[str, torch.Tensor]]], comm: _transport.NcclComm,
               root: int, *, source: Optional[Union[torch.nn.Module, Mapping[str, torch.Tensor]]] = None,
               device: Union[int, torch.device, None] = None, slot_bytes: int = 0, timeout_ms: int = 0,
               expected_version: Optional[int] = None, tag: Optional[str] = None) -> Optional[UpdateResult]:
    """One NCCL broadcast update. The root passes `source` (its state dict);
    a root that only sends passes no `target`. Every other rank passes its
    `target` (filled by :func:`vmmweights.torch.load_`), which keeps its
    slices. Every rank passes the same `slot_bytes`."""
    if target is None:
        if source is None:
            raise ValueError("broadcast_: a rank without a target is the root and needs a source")
        dev = _device(device)
        src = _source(_state_dict(source), dev)
        try:
            torch.cuda.synchronize(dev)
            comm.broadcast_send(pool(dev), src, slot_bytes, timeout_ms)
        finally:
            src.close()
        return None
    ld, dev, first = _loader_of(target)
    p = pool(dev)
    tag = _tag_of(first, dev, tag)
    version = p.tag_version(tag) if expected_version is None else expected_version
    torch.cuda.synchronize(dev)
    if source is None:
        return comm.broadcast_receive(ld, p, root, version, slot_bytes=slot_bytes, timeout_ms=timeout_ms, tag=tag)
    src = _source(_state_dict(source), dev)
    try:
        return comm.broadcast_root(ld, p, src, version, slot_bytes=slot_bytes, timeout_ms=timeout_ms, tag=tag)
    finally:
        src.close()
