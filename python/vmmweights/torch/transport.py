"""Update transports for PyTorch: a trainer sends its state dict from its own
process (:class:`Sender`) or over NCCL (:func:`broadcast_`), and an engine
receives into the tensors a :func:`vmmweights.torch.load_` filled, through
that load's rules (:func:`receive_`, :func:`broadcast_`), each
tensor-parallel rank keeping its slices.

    # trainer process (weights in our pool: sent directly, no extra copy)
    with vt.use_pool("trainer"):
        model = build_model()
    with vt.transport.Sender("/tmp/engine.sock") as tx:
        tx.offer(model)                      # once: the engine attaches now
        for step in steps:
            train(model)
            tx.send(model)
    # engine process: every step, the trainer's memory attached once, before
    # the first update, so even the first one only copies
    with vt.transport.Receiver("/tmp/engine.sock") as rx:
        rx.attach(engine_model)
        for step in steps:
            rx.receive_(engine_model)
    # or one update, attaching for it alone
    vt.transport.receive_(engine_model, "/tmp/engine.sock")
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from .. import transport as _transport
from .._native import VmmwError
from ..update import UpdateResult, UpdateSource
from . import _device, _loads, _lock, _signature, _state_dict, pool
from .dtypes import DTYPES

#: The tag a gathered copy is allocated under (mode "gather").
GATHER_TAG = "vmmw.update.gather"


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


MODES = ("auto", "direct", "gather", "ring")


def _in_pool(p: Any, state: Mapping[str, torch.Tensor], dev: int) -> bool:
    """True when every non-empty tensor lies in CUDA memory of pool `p`."""
    for t in state.values():
        if t.numel() == 0:
            continue
        if not t.is_cuda or _device(t.device) != dev:
            return False
        try:
            p.tag_of(t.data_ptr())
        except VmmwError:
            return False
    return True


class Sender:
    """A trainer's IPC sender on `device`, receivers connecting at `path`.

    How each :meth:`send` moves the bytes (`mode`):

    - ``"direct"``: the tensors lie in our pool (allocated under
      :func:`vmmweights.torch.use_pool`, or a gathered copy made there); the
      sender serves the pool segments holding them and each receiver copies
      straight out of them. No extra memory, one copy in all.
    - ``"gather"``: tensors outside the pool are first copied once into a
      pool buffer (extra device memory the size of those tensors, on the
      sender's GPU, while the send runs), then sent directly.
    - ``"ring"``: through a ring of `slots` buffers of `slot_bytes` (0: 2 of
      256 MiB), allocated at the first ring send and kept: bounded memory,
      any tensors, host ones included, but three copies and a round trip per
      bucket.
    - ``"auto"`` (the default): direct when every tensor lies in the pool,
      else the ring (no memory beyond the ring's).

    The tensors must not be written until :meth:`send` returns."""

    def __init__(self, path: str, device: Union[int, torch.device, None] = None, slots: int = 0,
                 slot_bytes: int = 0, timeout_ms: int = 0, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {MODES}")
        self._dev = _device(device)
        self._mode = mode
        self._tx = _transport.Sender(pool(self._dev), path, slots, slot_bytes, timeout_ms)

    def send(self, state: Union[torch.nn.Module, Mapping[str, torch.Tensor]], receivers: int = 1,
             mode: Optional[str] = None) -> _transport.SendReport:
        """Wait for `receivers` engine ranks and send them `state` (a model or
        state dict, by checkpoint name); returns once every one committed.
        `mode` overrides the sender's for this send."""
        mode = self._mode if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {MODES}")
        tensors = _state_dict(state)
        p = pool(self._dev)
        if mode == "auto":
            mode = "direct" if _in_pool(p, tensors, self._dev) else "ring"
        gathered: Dict[str, torch.Tensor] = {}
        if mode == "gather":
            from . import use_pool
            with use_pool(GATHER_TAG, self._dev):
                for n, t in tensors.items():
                    if t.numel() > 0 and not _in_pool(p, {n: t}, self._dev):
                        gathered[n] = torch.empty(t.shape, dtype=t.dtype, device=f"cuda:{self._dev}")
            for n, g in gathered.items():
                g.copy_(tensors[n])
            tensors = {n: gathered.get(n, t) for n, t in tensors.items()}
            mode = "direct"
        src = _source(tensors, self._dev)
        try:
            torch.cuda.synchronize(self._dev)  # the trainer's kernels (or the gather) wrote the tensors
            if mode == "direct":
                return self._tx.send_direct(src, receivers)
            return self._tx.send(src, receivers)
        finally:
            src.close()
            gathered.clear()

    def offer(self, state: Union[torch.nn.Module, Mapping[str, torch.Tensor]], receivers: int = 1) -> _transport.SendReport:
        """Offer `state` (a model or state dict whose tensors lie in our pool
        on the sender's device, as direct sends need) to `receivers` engine
        ranks ahead of the first update: each :meth:`Receiver.attach` attaches
        the memory and checks it against its targets now, so the first
        :meth:`send` of the same tensors is, for them, one manifest and the
        copies. Waits until every receiver attached. Offer again after the
        tensors move (freed and allocated again, or a sleep and wake of
        their tag): the next send attaches anew otherwise."""
        tensors = _state_dict(state)
        p = pool(self._dev)
        if not _in_pool(p, tensors, self._dev):
            raise ValueError("offer: every tensor must lie in our pool on the sender's device "
                             "(allocate the model under vmmweights.torch.use_pool)")
        src = _source(tensors, self._dev)
        try:
            return self._tx.offer_direct(src, receivers)
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


class Receiver:
    """Receives every update from the :class:`Sender` at `path` into targets
    filled by :func:`vmmweights.torch.load_`, as :func:`receive_`, keeping
    the shares of direct updates imported between updates: an engine that
    takes the trainer's weights every step attaches them once, then each
    update is one manifest and the copies.

    :meth:`attach` takes the trainer's offer (:meth:`Sender.offer`) before
    the first update, so that one attaches nothing either: the documented
    path for an engine that times its updates.

    The kept imports keep the trainer's memory allocated on the GPU (also
    memory it freed or put to sleep since) until they are dropped:
    :meth:`drop_imports`, a failed update, or :meth:`close`; :meth:`stats`
    says how many bytes. At most `max_kept_imports` shares (0: 64) and
    `max_kept_bytes` bytes (0: no byte bound) are kept. A receive into the
    same target as the last one, holding the same tensor objects at the
    same addresses, reuses the load found for it then.

        with vt.transport.Receiver("/tmp/engine.sock") as rx:
            rx.attach(engine_model)
            for step in steps:
                rx.receive_(engine_model)
    """

    def __init__(self, path: str, *, timeout_ms: int = 0, max_kept_imports: int = 0,
                 max_kept_bytes: int = 0) -> None:
        self._path = path
        self._options = dict(timeout_ms=timeout_ms, max_kept_imports=max_kept_imports,
                             max_kept_bytes=max_kept_bytes)
        self._rx: Optional[_transport.Receiver] = None
        self._dev: Optional[int] = None
        # The target of the last receive, its tensors as they were, and the
        # load found for them: a step that passes the same tensors again
        # skips the lookup (its signature costs most of a millisecond on a
        # model of a few hundred tensors, a twentieth of a whole update).
        self._last: Optional[Tuple[Any, List[Tuple[str, torch.Tensor, int]], Any, int, torch.Tensor]] = None

    def _load_of(self, target: Union[torch.nn.Module, Mapping[str, torch.Tensor]]) -> Tuple[Any, int, torch.Tensor]:
        tensors = _state_dict(target)
        last = self._last
        if (last is not None and last[0] is target and last[2]._handle is not None
                and len(tensors) == len(last[1])
                and all(n == n0 and t is t0 and t.data_ptr() == p0
                        for (n, t), (n0, t0, p0) in zip(tensors.items(), last[1]))):
            return last[2], last[3], last[4]
        ld, dev, first = _loader_of(target)
        self._last = (target, [(n, t, t.data_ptr()) for n, t in tensors.items()], ld, dev, first)
        return ld, dev, first

    def _native(self, dev: int) -> _transport.Receiver:
        p = pool(dev)
        if self._rx is None:
            self._rx = _transport.Receiver(p, self._path, **self._options)
            self._dev = dev
        elif dev != self._dev:
            raise ValueError(f"this receiver imports on cuda:{self._dev}; the target lies on cuda:{dev}")
        return self._rx

    def attach(self, target: Union[torch.nn.Module, Mapping[str, torch.Tensor]], *,
               expected_version: Optional[int] = None, tag: Optional[str] = None) -> _transport.ReceiveStats:
        """Take the trainer's offer (:meth:`Sender.offer`, which this waits
        for) before the first update: attach its memory, check its tensors
        against `target` (filled by :func:`vmmweights.torch.load_`) as an
        update would, writing nothing, and keep both. Every update of the
        same tensors after it, the first included, attaches and checks
        nothing: one manifest and the copies. Returns what was attached."""
        ld, dev, first = self._load_of(target)
        rx = self._native(dev)
        p = pool(dev)
        tag = _tag_of(first, dev, tag)
        version = p.tag_version(tag) if expected_version is None else expected_version
        return rx.prepare(ld, p, version, tag=tag)

    def receive_(self, target: Union[torch.nn.Module, Mapping[str, torch.Tensor]], *,
                 expected_version: Optional[int] = None, tag: Optional[str] = None) -> UpdateResult:
        """Receive one update into `target`; every target of one receiver
        lies on the same GPU (the imports are mapped there)."""
        ld, dev, first = self._load_of(target)
        rx = self._native(dev)
        p = pool(dev)
        tag = _tag_of(first, dev, tag)
        version = p.tag_version(tag) if expected_version is None else expected_version
        torch.cuda.synchronize(dev)  # nothing queued may still read the targets
        return rx.receive(ld, p, version, tag=tag)

    def stats(self) -> _transport.ReceiveStats:
        """What the last receive did and what is kept imported now."""
        if self._rx is None:
            return _transport.ReceiveStats(direct=False, attached=0, reused=0, chunks=0, setup_seconds=0.0,
                                           seconds=0.0, kept_imports=0, kept_bytes=0)
        return self._rx.stats()

    def drop_imports(self) -> None:
        """Drop every kept import; the next update attaches again."""
        if self._rx is not None:
            self._rx.drop_imports()

    def close(self) -> None:
        self._last = None
        if self._rx is not None:
            self._rx.close()
            self._rx = None

    def __enter__(self) -> "Receiver":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


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
