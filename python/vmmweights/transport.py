"""Update transports: new weights from another process on this host (IPC)
or broadcast from one rank over NCCL, applied through the load's rules
(docs/UPDATES.md).

Another process (a trainer) sends::

    with UpdateSource() as src, Sender(pool, "/tmp/engine.sock") as tx:
        src.add("model.embed_tokens.weight", "BF16", [151936, 4096], ptr)
        report = tx.send(src)            # waits for the engine, returns once committed

and the engine receives::

    r = receive_ipc(loader, pool, "/tmp/engine.sock", pool.tag_version("weights"))

or, receiving every training step from the same sender, keeps a
:class:`Receiver` so a direct update's shares are attached once, not at
every step, and takes the sender's offer before the first update, so even
that one only copies::

    tx.offer_direct(src)                 # trainer, once, before its first send
    rx = Receiver(pool, "/tmp/engine.sock")
    rx.prepare(loader, pool, pool.tag_version("weights"))   # engine, once
    r = rx.receive(loader, pool, pool.tag_version("weights"))

The sender exports its ring of bucket buffers once; each update is one
handshake, then one message per bucket. Over NCCL, rank 0 makes an id
(:func:`nccl_unique_id`), shares it as torch.distributed and vLLM do, and
every rank opens :class:`NcclComm` with it.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from typing import Any, Optional

from . import _structs as S
from ._native import call, function
from ._owned import OwnedHandle
from .loader import Loader
from .pool import Pool
from .tags import tag_id
from .update import UpdateResult, UpdateSource


@dataclass(frozen=True)
class SendReport:
    """What one send did."""

    version: int
    """The receivers' version after the update."""
    buckets: int
    bytes: int
    setup_seconds: float
    """From the receivers' connections to their rings attached (one handshake)."""
    seconds: float
    """The whole send, the receivers' commit included."""


def _options(expected_version: int, tag: Optional[str], allow_missing: bool,
             allow_unexpected: bool) -> S.UpdateOptions:
    return S.UpdateOptions(expected_version=expected_version, tag_set=int(tag is not None),
                           tag=tag_id(tag) if tag is not None else 0, allow_missing=int(allow_missing),
                           allow_unexpected=int(allow_unexpected), staging=0)


def _result(out: S.UpdateResult) -> UpdateResult:
    return UpdateResult.of(out)


@dataclass(frozen=True)
class BroadcastLoadResult:
    """What one broadcast load did on this rank."""

    update: UpdateResult
    """The destinations' side: the tag, its new version, bytes written."""
    buckets: int
    """Buckets broadcast, by every reader."""
    bytes: int
    """Bytes of checkpoint data broadcast, by every reader."""
    files_read: int
    """Files this rank read."""
    bytes_read: int
    """Bytes this rank read from them."""


class Sender(OwnedHandle):
    """An IPC sender: a control socket at `path` receivers connect to, and a
    ring of `slots` buffers of `slot_bytes` (0: 2 of the default bucket size)
    in `pool`, allocated at the first :meth:`send` and exported once
    (:meth:`send_direct` needs no ring). Use as a context manager, or call
    :meth:`close`, which stops serving the ring, removes the socket and frees
    the ring."""

    _free = "vmmw_update_sender_free"

    def __init__(self, pool: Pool, path: str, slots: int = 0, slot_bytes: int = 0, timeout_ms: int = 0) -> None:
        handle = ctypes.c_void_p()
        call("vmmw_update_sender_new", pool.handle, path.encode("utf-8"), ctypes.c_uint32(slots),
             ctypes.c_uint64(slot_bytes), ctypes.c_uint64(timeout_ms), ctypes.byref(handle))
        self._handle: Optional[ctypes.c_void_p] = handle
        self._pool = pool

    def send(self, source: UpdateSource, receivers: int = 1) -> SendReport:
        """Wait for `receivers` receivers and send them `source`'s tensors in
        buckets; returns once every receiver committed the update."""
        if self._handle is None:
            raise ValueError("the sender is closed")
        return self._send("vmmw_update_sender_send", source, receivers)

    def send_direct(self, source: UpdateSource, receivers: int = 1) -> SendReport:
        """Wait for `receivers` receivers and send them `source`'s tensors
        directly, without the ring: every tensor lies in device memory of the
        sender's pool; each receiver maps it and copies straight out of it.
        Returns once every receiver committed; the tensors must not be
        written before then."""
        return self._send("vmmw_update_sender_send_direct", source, receivers)

    def offer_direct(self, source: UpdateSource, receivers: int = 1) -> SendReport:
        """Wait for `receivers` receivers that :meth:`Receiver.prepare` and
        offer them `source`'s tensors (in device memory of the sender's
        pool) ahead of any update: each attaches them, checks them against
        its destinations and keeps both, writing nothing. A later
        :meth:`send_direct` of the same tensors in the same memory is then,
        for them, one manifest and the copies: the first update runs as
        fast as later ones. Returns once every receiver attached
        (``version`` 0)."""
        return self._send("vmmw_update_sender_offer_direct", source, receivers)

    def _send(self, fn: str, source: UpdateSource, receivers: int) -> SendReport:
        if self._handle is None:
            raise ValueError("the sender is closed")
        out = S.SendReport()
        call(fn, self._handle, source.handle, ctypes.c_uint32(receivers), ctypes.byref(out))
        return SendReport(version=out.version, buckets=out.buckets, bytes=out.bytes,
                          setup_seconds=out.setup_seconds, seconds=out.seconds)


def receive_ipc(loader: Loader, pool: Pool, path: str, expected_version: int, *, timeout_ms: int = 0,
                tag: Optional[str] = None, allow_missing: bool = False,
                allow_unexpected: bool = False) -> UpdateResult:
    """Receive one update from the sender at `path` into the destinations of
    `loader` in `pool`, through its rules (a tensor-parallel rank keeps its
    slices), replacing version `expected_version`. Raises ``VmmwError``
    (``VMMW_UPDATE_SOURCE`` when the sender died, aborted or broke the
    protocol) with every destination at its last version."""
    opts = _options(expected_version, tag, allow_missing, allow_unexpected)
    out = S.UpdateResult()
    call("vmmw_update_receive_ipc", loader.handle, pool.handle, path.encode("utf-8"),
         ctypes.c_uint64(timeout_ms), ctypes.byref(opts), ctypes.byref(out))
    return _result(out)


@dataclass(frozen=True)
class ReceiveStats:
    """What a :class:`Receiver`'s last receive did, and what it keeps now."""

    direct: bool
    """True for a direct update, False for one through the sender's ring."""
    attached: int
    """Shares attached by the last receive."""
    reused: int
    """Kept imports the last receive reused (no attach)."""
    chunks: int
    """Physical chunks the last receive imported."""
    setup_seconds: float
    """From connecting to every share imported and the manifest checked."""
    seconds: float
    """The whole last receive."""
    kept_imports: int
    """Shares kept imported now."""
    kept_bytes: int
    """Bytes of the sender's memory kept mapped now: they stay allocated on
    the device, also after the sender frees them or sleeps, until the
    imports are dropped."""


class Receiver(OwnedHandle):
    """Receives updates from the IPC sender at `path` and keeps the shares of
    its direct updates imported between updates, so a later direct update
    from the same sender over the same memory attaches nothing: one manifest,
    then the copies. The kept imports keep the sender's memory allocated
    (also memory it freed or put to sleep since) until they are dropped:
    :meth:`drop_imports`, a failed receive, or :meth:`close`. At most
    `max_kept_imports` shares (0: 64) and `max_kept_bytes` bytes (0: no
    byte bound) stay imported. Imports on `pool`'s device; connects at each
    :meth:`receive`. :meth:`close` frees it and drops its kept imports.

    Thread-safe: calls run one at a time, and :meth:`close` from another
    thread waits for a running :meth:`receive` to end (at most its
    `timeout_ms` per message) rather than free what it uses."""

    _free = "vmmw_update_receiver_free"

    def __init__(self, pool: Pool, path: str, *, timeout_ms: int = 0, max_kept_imports: int = 0,
                 max_kept_bytes: int = 0) -> None:
        # Held by every call on the handle and by close: the native call runs
        # without the GIL, so a close on another thread would free the
        # receiver under it.
        self._busy = threading.Lock()
        handle = ctypes.c_void_p()
        call("vmmw_update_receiver_new", pool.handle, path.encode("utf-8"), ctypes.c_uint64(timeout_ms),
             ctypes.c_uint64(max_kept_imports), ctypes.c_uint64(max_kept_bytes), ctypes.byref(handle))
        self._handle: Optional[ctypes.c_void_p] = handle

    def close(self) -> None:
        """Free the receiver and drop its kept imports, once no call runs."""
        with self._busy:
            super().close()

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("the receiver is closed")
        return self._handle

    def receive(self, loader: Loader, pool: Pool, expected_version: int, *, tag: Optional[str] = None,
                allow_missing: bool = False, allow_unexpected: bool = False) -> UpdateResult:
        """Receive one update into `loader`'s destinations in `pool`, as
        :func:`receive_ipc`, reusing the imports kept from earlier direct
        updates where the sender says the memory is the same. Raises
        ``VmmwError`` with every destination at its last version (and the
        kept imports dropped)."""
        opts = _options(expected_version, tag, allow_missing, allow_unexpected)
        out = S.UpdateResult()
        with self._busy:
            call("vmmw_update_receiver_receive", self.handle, loader.handle, pool.handle, ctypes.byref(opts),
                 ctypes.byref(out))
        return _result(out)

    def prepare(self, loader: Loader, pool: Pool, expected_version: int, *, tag: Optional[str] = None,
                allow_missing: bool = False, allow_unexpected: bool = False) -> ReceiveStats:
        """Take the sender's offer (:meth:`Sender.offer_direct`) ahead of any
        update: attach its shares, check its tensors against `loader`'s
        destinations in `pool` as an update replacing `expected_version`
        would (nothing is written) and keep both, so the first update
        attaches and checks nothing. Raises ``VmmwError`` (the kept imports
        dropped) when the sender sends no offer or the destinations refuse
        it. Returns what was attached (:meth:`stats`)."""
        opts = _options(expected_version, tag, allow_missing, allow_unexpected)
        with self._busy:
            call("vmmw_update_receiver_prepare", self.handle, loader.handle, pool.handle, ctypes.byref(opts))
        return self.stats()

    def stats(self) -> ReceiveStats:
        """What the last successful receive or :meth:`prepare` did (zeros
        before the first) and what is kept imported now."""
        out = S.ReceiveStats()
        with self._busy:
            call("vmmw_update_receiver_stats", self.handle, ctypes.byref(out))
        return ReceiveStats(direct=bool(out.direct), attached=out.attached, reused=out.reused, chunks=out.chunks,
                            setup_seconds=out.setup_seconds, seconds=out.seconds, kept_imports=out.kept_imports,
                            kept_bytes=out.kept_bytes)

    def drop_imports(self) -> None:
        """Drop every kept import: the sender's memory they kept allocated
        goes, and the next receive attaches again."""
        with self._busy:
            call("vmmw_update_receiver_drop_imports", self.handle)


def nccl_unique_id() -> bytes:
    """A new NCCL unique id (128 bytes) for :class:`NcclComm`; raises
    ``VmmwError`` (``VMMW_UNSUPPORTED``) naming the libraries tried when
    NCCL cannot be opened."""
    buf = ctypes.create_string_buffer(128)
    call("vmmw_nccl_unique_id", buf)
    return buf.raw


class NcclComm:
    """An NCCL communicator for broadcast updates: joined from a unique id
    (every rank, blocking until all joined), or :meth:`from_raw` over an
    ``ncclComm_t`` the caller has."""

    def __init__(self, pool: Optional[Pool] = None, unique_id: bytes = b"", world: int = 0, rank: int = 0,
                 *, _handle: Optional[ctypes.c_void_p] = None) -> None:
        if _handle is not None:
            self._handle: Optional[ctypes.c_void_p] = _handle
            return
        if pool is None or len(unique_id) != 128:
            raise ValueError("NcclComm(pool, unique_id (128 bytes), world, rank)")
        handle = ctypes.c_void_p()
        call("vmmw_nccl_comm_new", pool.handle, unique_id, ctypes.c_uint32(world), ctypes.c_uint32(rank),
             ctypes.byref(handle))
        self._handle = handle

    @classmethod
    def from_raw(cls, comm_ptr: int) -> "NcclComm":
        """Use an ``ncclComm_t`` of this process (left alone on close)."""
        handle = ctypes.c_void_p()
        call("vmmw_nccl_comm_from_raw", ctypes.c_void_p(comm_ptr), ctypes.byref(handle))
        return cls(_handle=handle)

    @property
    def handle(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise ValueError("the communicator is closed")
        return self._handle

    def broadcast_send(self, pool: Pool, source: UpdateSource, slot_bytes: int = 0, timeout_ms: int = 0) -> None:
        """Broadcast `source` from this rank (the root) to every rank, in
        buckets of `slot_bytes` (every rank passes the same) through a ring
        in `pool`; applies nothing here."""
        call("vmmw_update_broadcast_send", self.handle, pool.handle, source.handle, ctypes.c_uint64(slot_bytes),
             ctypes.c_uint64(timeout_ms))

    def broadcast_receive(self, loader: Loader, pool: Pool, root: int, expected_version: int, *,
                          slot_bytes: int = 0, timeout_ms: int = 0, tag: Optional[str] = None,
                          allow_missing: bool = False, allow_unexpected: bool = False) -> UpdateResult:
        """Receive one update broadcast from `root` into `loader`'s
        destinations in `pool`, through its rules (each rank its slices)."""
        opts = _options(expected_version, tag, allow_missing, allow_unexpected)
        out = S.UpdateResult()
        call("vmmw_update_broadcast_receive", self.handle, loader.handle, pool.handle, ctypes.c_uint32(root),
             ctypes.c_uint64(slot_bytes), ctypes.c_uint64(timeout_ms), ctypes.byref(opts), ctypes.byref(out))
        return _result(out)

    def broadcast_root(self, loader: Loader, pool: Pool, source: UpdateSource, expected_version: int, *,
                       slot_bytes: int = 0, timeout_ms: int = 0, tag: Optional[str] = None,
                       allow_missing: bool = False, allow_unexpected: bool = False) -> UpdateResult:
        """Broadcast `source` from this rank (the root) and apply it here too,
        into `loader`'s destinations in `pool` (a root that is an engine rank)."""
        opts = _options(expected_version, tag, allow_missing, allow_unexpected)
        out = S.UpdateResult()
        call("vmmw_update_broadcast_root", self.handle, loader.handle, pool.handle, source.handle,
             ctypes.c_uint64(slot_bytes), ctypes.c_uint64(timeout_ms), ctypes.byref(opts), ctypes.byref(out))
        return _result(out)

    def broadcast_load(self, loader: Loader, pool: Pool, readers: list[int], *, slot_bytes: int = 0,
                       timeout_ms: int = 0, stage: bool = False) -> "BroadcastLoadResult":
        """Load the checkpoint `loader` opened into its destinations in `pool`
        (allocated first, as for a load): the `readers` ranks stream its files
        into the broadcast ring, every rank applies each bucket through its
        rules (each rank its slices). Every rank passes the same readers and
        `slot_bytes`. `stage`: buckets land in scratch first, so a failed load
        leaves the destinations untouched (otherwise the tag is left torn)."""
        ranks = (ctypes.c_uint32 * len(readers))(*readers)
        out = S.BroadcastLoadResult()
        call("vmmw_load_broadcast", self.handle, loader.handle, pool.handle, ranks, ctypes.c_size_t(len(readers)),
             ctypes.c_uint64(slot_bytes), ctypes.c_uint64(timeout_ms), ctypes.c_uint32(1 if stage else 0),
             ctypes.byref(out))
        return BroadcastLoadResult(update=_result(out.update), buckets=out.buckets, bytes=out.bytes,
                                   files_read=out.files_read, bytes_read=out.bytes_read)

    def register(self, ptr: int, nbytes: int) -> int:
        """Register device memory with the communicator (``ncclCommRegister``);
        returns the handle for :meth:`deregister`. Register again after a wake
        changed the tag's :func:`vmmweights.remap_epoch`."""
        h = ctypes.c_void_p()
        call("vmmw_nccl_register", self.handle, ctypes.c_uint64(ptr), ctypes.c_uint64(nbytes), ctypes.byref(h))
        return int(h.value or 0)

    def deregister(self, handle: int) -> None:
        """Drop a registration made by :meth:`register`."""
        call("vmmw_nccl_deregister", self.handle, ctypes.c_void_p(handle))

    def close(self) -> None:
        """Free the handle (destroying a communicator it created)."""
        if self._handle is not None:
            function("vmmw_nccl_comm_free")(self._handle)
            self._handle = None

    def __enter__(self) -> "NcclComm":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
