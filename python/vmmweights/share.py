"""Weights shared across processes: one copy in device memory, mapped by many.

Owner (the process that loaded the weights)::

    import vmmweights as vw
    from vmmweights import share
    pool = vw.Pool.default()
    server = share.serve_checkpoint("/models/qwen", "/run/qwen.sock", pool, "weights")
    ...                               # write new weights in place, then
    server.publish()                  # importers see version + 1
    server.reload()                   # or: load the checkpoint again in place and publish
    server.stop()                     # importers keep what they mapped

Importer (any process of the same user on the same host)::

    with share.attach("/run/qwen.sock") as att:
        print(att.version, list(att.tensors()))
        raw = att.read("model.norm.weight")         # bytes, any backend
        t = vt.shared.tensor(att, "model.norm.weight")  # torch, over the imported memory

(``import vmmweights.torch as vt``: the torch layer sits above this one.)

The importer maps the owner's physical memory at its own addresses (CUDA VMM
IPC: POSIX file descriptors passed over the Unix socket; the host backend's
memfd on a machine without a GPU), read-only unless it asks for ``write=True``
and the owner serves with ``allow_write=True``. Lifetime rules
(docs/SHARING.md): an importer that detaches or dies releases what it held; an
owner that stops or dies leaves importers' mappings valid; the owner's sleep of
a shared tag is refused while importers are attached (``policy="refuse"``) or
revokes them with notice (``policy="revoke"``: their next call raises
:class:`~vmmweights.VmmwError` with ``status_name == "VMMW_SHARE_REVOKED"``).
An importer that leaves its notices unread for about a hundred publishes is
evicted the same way (``VMMW_SHARE_REVOKED``, "evicted" in the message): read
``version`` between the owner's publishes, or detach and attach again.
Every failure is a :class:`~vmmweights.VmmwError`; a refused attach (wrong
peer, too many connections, deadline passed, malformed manifest, asleep tag)
has ``status_name == "VMMW_SHARE_REFUSED"`` and a message naming the reason.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

from . import _structs as S
from ._native import VmmwError, call, call_text, function
from .loader import Destination, Loader, LoadResult
from .pool import BACKENDS, Pool
from .tags import tag_id

#: What the owner's sleep of a shared tag does while importers are attached:
#: ``"refuse"`` fails the sleep (the owner waits for them to detach; ``"wait"``
#: is accepted as another name for it); ``"revoke"`` proceeds and importers'
#: next call raises ``VMMW_SHARE_REVOKED`` (their mapping stays valid until
#: they detach, so nothing faults).
SLEEP_POLICIES = {"refuse": 0, "wait": 0, "revoke": 1}

_BACKEND_NAMES = {v: k for k, v in BACKENDS.items()}


def _sleep_policy(policy: str) -> int:
    try:
        return SLEEP_POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown share policy {policy!r}: expected one of {sorted(SLEEP_POLICIES)}") from None


@dataclass(frozen=True)
class SharedTensor:
    """One tensor of a share, at this process's address."""

    name: str
    ptr: int
    """This process's address of the first byte (valid until detach)."""
    bytes: int
    dtype: str
    """The safetensors dtype name ("BF16", "F32", ...)."""
    shape: Tuple[int, ...]
    """Row-major, contiguous."""


# --- owner side ------------------------------------------------------------------------


class Server:
    """Serve the destinations registered in `loader` (allocated with
    :meth:`Loader.allocate`, or registered over memory of `pool`; they must
    lie in `tag`'s memory) on a new Unix socket at `path` (which must not
    exist). Importers attach by that path; the socket is removed by
    :meth:`stop`. The loader may be closed afterwards (the list is copied);
    `pool` must stay open while serving.

    `allow_write`: importers may map read-write when they ask. `allowed_uid`:
    the user id allowed to attach instead of this process's own;
    `allowed_gid`: a group whose members may attach too. `max_connections`
    (default 256) bounds the connections served at once and
    `handshake_timeout` (seconds, default 10) each handshake. Every attach,
    refusal, eviction and detach writes one audit line on standard error.
    Thread-safe. Use as a context manager, or call :meth:`stop`."""

    def __init__(
        self,
        pool: Pool,
        loader: Loader,
        path: Union[str, os.PathLike[str]],
        *,
        tag: str = "weights",
        policy: str = "refuse",
        allow_write: bool = False,
        allowed_uid: Optional[int] = None,
        allowed_gid: Optional[int] = None,
        max_connections: int = 0,
        handshake_timeout: float = 0.0,
    ) -> None:
        self._handle: Optional[ctypes.c_void_p] = None
        if not 0 <= max_connections < 2**32:
            raise ValueError(f"max_connections {max_connections}: expected 0 (default) to 2**32 - 1")
        timeout_ms = round(handshake_timeout * 1000)
        if not 0 <= timeout_ms < 2**32:
            raise ValueError(f"handshake_timeout {handshake_timeout}: expected 0 (default) to 4294967 s")
        opts = S.ShareOptions(
            sleep_policy=_sleep_policy(policy),
            allow_write=int(bool(allow_write)),
            use_allowed_uid=int(allowed_uid is not None),
            allowed_uid=allowed_uid or 0,
            use_allowed_gid=int(allowed_gid is not None),
            allowed_gid=allowed_gid or 0,
            max_connections=max_connections,
            handshake_timeout_ms=timeout_ms,
        )
        self.path = os.fspath(path)
        self.tag = tag
        self.policy = policy
        self.allow_write = bool(allow_write)
        self._pool = pool  # kept open while the server uses its memory
        handle = ctypes.c_void_p()
        call("vmmw_share_serve", pool.handle, ctypes.c_uint32(tag_id(tag)), loader.handle,
             os.fsencode(self.path), ctypes.byref(opts), ctypes.byref(handle))
        self._handle = handle

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ``vmmw_share_server_t*``."""
        if self._handle is None:
            raise ValueError(f"the share at {self.path} is stopped")
        return self._handle

    @property
    def serving(self) -> bool:
        """True until :meth:`stop`."""
        return self._handle is not None

    def attached(self) -> int:
        """Importers attached now (connections open, handshakes included;
        evicted importers count until they detach)."""
        out = ctypes.c_uint64()
        call("vmmw_share_server_attached", self.handle, ctypes.byref(out))
        return out.value

    def publish(self) -> int:
        """Announce weights written in place: the version goes up by one,
        attached importers see it on their next call and new ones in the
        manifest. Returns the new version. Finish the writes (device work
        included) first."""
        out = ctypes.c_uint64()
        call("vmmw_share_server_publish", self.handle, ctypes.byref(out))
        return out.value

    def stop(self) -> None:
        """Stop serving and remove the socket path. Attached importers keep
        their mappings and stop counting against the sleep policy. Idempotent."""
        if self._handle is not None:
            h, self._handle = self._handle, None
            function("vmmw_share_server_free")(h)

    close = stop

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def __del__(self) -> None:
        try:
            self.stop()
        except Exception:
            pass


class CheckpointServer(Server):
    """A checkpoint loaded into `pool` under `tag` and served (see
    :func:`serve_checkpoint`). Keeps its loader, so :meth:`reload` can load
    the checkpoint again into the same tensors and publish."""

    def __init__(self, loader: Loader, pool: Pool, path: Union[str, os.PathLike[str]], *, tag: str,
                 destinations: Dict[str, Destination], result: LoadResult, **options: Any) -> None:
        self.loader = loader
        self.destinations = destinations
        """The served tensors by name, at this process's addresses."""
        self.result = result
        """What the last load did."""
        super().__init__(pool, loader, path, tag=tag, **options)

    def reload(self) -> int:
        """Load the checkpoint again in place (same tensors, same addresses:
        the files may have new bytes, not new shapes) and publish; the new
        version. Importers reading meanwhile may see a mix of old and new
        bytes: they should read after the version changes."""
        self.result = self.loader.load(self._pool)
        return self.publish()

    def stop(self) -> None:
        """Stop serving (see :meth:`Server.stop`) and close the loader. The
        loaded tensors stay in the pool."""
        super().stop()
        loader = getattr(self, "loader", None)
        if loader is not None:
            loader.close()


def serve(pool: Pool, loader: Loader, path: Union[str, os.PathLike[str]], *, tag: str = "weights",
          policy: str = "refuse", allow_write: bool = False, allowed_uid: Optional[int] = None,
          allowed_gid: Optional[int] = None, max_connections: int = 0,
          handshake_timeout: float = 0.0) -> Server:
    """Serve `loader`'s destinations in `pool`'s `tag` at `path` (see :class:`Server`)."""
    return Server(pool, loader, path, tag=tag, policy=policy, allow_write=allow_write,
                  allowed_uid=allowed_uid, allowed_gid=allowed_gid,
                  max_connections=max_connections, handshake_timeout=handshake_timeout)


def serve_checkpoint(
    checkpoint: Union[str, os.PathLike[str]],
    path: Union[str, os.PathLike[str]],
    pool: Optional[Pool] = None,
    tag: str = "weights",
    *,
    preset: Optional[str] = None,
    tp_rank: int = 0,
    tp_world: int = 0,
    head_dim: int = 0,
    rules: Union[str, Mapping[str, Any], None] = None,
    strategy: str = "auto",
    policy: str = "refuse",
    allow_write: bool = False,
    allowed_uid: Optional[int] = None,
    allowed_gid: Optional[int] = None,
    max_connections: int = 0,
    handshake_timeout: float = 0.0,
) -> CheckpointServer:
    """Allocate `checkpoint`'s destinations in `pool` (the default pool of
    device 0 when None) under `tag`, load them, and serve them at `path`.
    `preset`/`rules` map names as for :func:`vmmweights.load`. On failure
    nothing is left serving and the loader is closed (the allocated tensors
    stay in the pool's tag)."""
    pool = Pool.default() if pool is None else pool
    loader = Loader(checkpoint)
    try:
        if preset is not None:
            loader.preset(preset, tp_rank, tp_world, head_dim)
        if rules is not None:
            loader.rules(rules)
        loader.options(strategy)
        dests = loader.allocate(pool, tag)
        result = loader.load(pool)
        return CheckpointServer(loader, pool, path, tag=tag, destinations=dests, result=result,
                                policy=policy, allow_write=allow_write, allowed_uid=allowed_uid,
                                allowed_gid=allowed_gid, max_connections=max_connections,
                                handshake_timeout=handshake_timeout)
    except BaseException:
        loader.close()
        raise


# --- importer side ------------------------------------------------------------------------


class Attachment:
    """A share attached in this process (see :func:`attach`). Thread-safe,
    except :meth:`detach`, which must not race other calls. Use as a context
    manager, or call :meth:`detach`.

    Torch tensors made from it (:meth:`torch`, ``vmmweights.torch.shared``)
    hold a reference to it, so the mapping outlives every such tensor unless
    :meth:`detach` is called explicitly: that unmaps at once and every
    pointer and tensor from the share becomes invalid (finish device work
    that reads them first)."""

    def __init__(self, path: Union[str, os.PathLike[str]], device: Optional[int] = None, write: bool = False,
                 backend: str = "auto") -> None:
        self._handle: Optional[ctypes.c_void_p] = None
        self._device_handle: Optional[ctypes.c_void_p] = None
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: expected one of {sorted(BACKENDS)}")
        self.path = os.fspath(path)
        self.device = 0 if device is None else int(device)
        self.writable = bool(write)
        dev = ctypes.c_void_p()
        call("vmmw_device_open", ctypes.c_int32(BACKENDS[backend]), ctypes.c_int32(self.device), ctypes.byref(dev))
        try:
            kind = ctypes.c_int32()
            call("vmmw_device_backend", dev, ctypes.byref(kind))
            self.backend: str = _BACKEND_NAMES.get(kind.value, str(kind.value))
            """The backend the share lives on: ``"host"`` or ``"cuda"``."""
            handle = ctypes.c_void_p()
            call("vmmw_share_attach", dev, os.fsencode(self.path), ctypes.c_uint32(int(self.writable)),
                 ctypes.byref(handle))
        except BaseException:
            function("vmmw_device_free")(dev)
            raise
        self._device_handle, self._handle = dev, handle
        self._names: Optional[List[str]] = None

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ``vmmw_share_t*``; a :class:`VmmwError` once detached."""
        if self._handle is None:
            raise VmmwError("vmmw_share", 9, "VMMW_INVALID_STATE",
                            f"the share at {self.path} is detached: attach again")
        return self._handle

    @property
    def attached(self) -> bool:
        """True until :meth:`detach`."""
        return self._handle is not None

    @property
    def version(self) -> int:
        """The weights version: the manifest's, or a newer one the owner
        published since. Raises ``VMMW_SHARE_REVOKED`` once revoked."""
        out = ctypes.c_uint64()
        call("vmmw_share_version", self.handle, ctypes.byref(out))
        return out.value

    @property
    def owner_connected(self) -> bool:
        """False once the owner stopped serving or died (the mapping stays valid)."""
        out = ctypes.c_uint32()
        call("vmmw_share_owner_connected", self.handle, ctypes.byref(out))
        return bool(out.value)

    def names(self) -> List[str]:
        """The tensors' names, in the owner's order."""
        if self._names is None:
            n = ctypes.c_size_t()
            call("vmmw_share_count", self.handle, ctypes.byref(n))
            self._names = [call_text("vmmw_share_tensor_name", self.handle, ctypes.c_size_t(i))
                           for i in range(n.value)]
        return list(self._names)

    def tensor(self, name: str) -> SharedTensor:
        """The tensor called `name` at this process's address. Unknown names
        raise ``VMMW_INVALID_ARGUMENT``; a revoked share ``VMMW_SHARE_REVOKED``."""
        d = S.Destination()
        call("vmmw_share_tensor", self.handle, name.encode(), ctypes.byref(d))
        return SharedTensor(name, d.ptr, d.bytes, d.dtype.decode(), tuple(d.shape[: d.ndim]))

    def tensors(self) -> Dict[str, SharedTensor]:
        """Every tensor by name, in the owner's order."""
        return {n: self.tensor(n) for n in self.names()}

    def read(self, name: str) -> bytes:
        """A copy of tensor `name`'s bytes in host memory (any backend)."""
        t = self.tensor(name)
        buf = ctypes.create_string_buffer(max(t.bytes, 1))
        call("vmmw_share_read", self.handle, ctypes.c_uint64(t.ptr), buf, ctypes.c_size_t(t.bytes))
        return buf.raw[: t.bytes]

    def detach(self) -> None:
        """Unmap and release everything this attachment holds; pointers and
        tensors from it become invalid. Idempotent."""
        if self._handle is None:
            return
        h, self._handle = self._handle, None
        dev, self._device_handle = self._device_handle, None
        try:
            call("vmmw_share_detach", h)
        finally:
            function("vmmw_device_free")(dev)

    close = detach

    def __enter__(self) -> "Attachment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.detach()

    def __del__(self) -> None:
        # Collected without detach: nothing refers to it any more (tensors
        # made from it hold a reference), so nothing reads the mapping.
        handle, dev = getattr(self, "_handle", None), getattr(self, "_device_handle", None)
        try:
            if handle is not None:
                self._handle = None
                function("vmmw_share_free")(handle)
            if dev is not None:
                self._device_handle = None
                function("vmmw_device_free")(dev)
        except Exception:
            pass

    def __repr__(self) -> str:
        state = f"{len(self.names())} tensors" if self.attached else "detached"
        return f"<vmmweights.share.Attachment {self.path} ({self.backend}:{self.device}, {state})>"


def attach(path: Union[str, os.PathLike[str]], device: Optional[int] = None, write: bool = False,
           backend: str = "auto") -> Attachment:
    """Attach to the share at `path` on `device` (0 when None), read-only
    unless `write` (the owner must allow it). `backend` must be the owner's
    (``"auto"``: ``$VMMW_BACKEND``, else cuda when present). Takes at most
    30 s when the owner does not answer. Raises :class:`VmmwError`:
    ``VMMW_IO`` when nothing serves at `path`, ``VMMW_SHARE_REFUSED`` with the
    reason when the owner or what it sent is refused."""
    return Attachment(path, device, write, backend)
