"""A caching pool of VMM memory on one device, with per-tag sleep and wake."""

from __future__ import annotations

import ctypes
import json
import threading
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from . import _structs as S
from ._native import VmmwError, call, call_text, function
from .report import table
from .tags import tag_id, tag_name

#: Sleep policies: offload keeps a pinned host backup restored byte for byte;
#: discard drops the contents (undefined after wake); reload keeps no backup and
#: restores from the checkpoint a load wrote (needs a load into this pool);
#: offload_compressed is offload with the backup losslessly compressed on the GPU.
POLICIES = {"offload": 0, "discard": 1, "reload": 2, "offload_compressed": 3}
BACKENDS = {"auto": 0, "host": 1, "cuda": 2}

_defaults: Dict[int, "Pool"] = {}
_defaults_lock = threading.Lock()


def _json_object(text: str) -> Dict[str, Any]:
    """A JSON document the library wrote (always an object)."""
    doc = json.loads(text)
    assert isinstance(doc, dict), text
    return doc


def _policy(tag: str, policy: str) -> int:
    try:
        return POLICIES[policy]
    except (KeyError, TypeError):
        raise ValueError(f"unknown policy {policy!r} for tag {tag!r}: expected one of {sorted(POLICIES)}") from None


class Pool:
    """A pool on one device.

    ``Pool(backend="host")`` creates a pool of its own (freed by :meth:`close`
    or when collected). :meth:`Pool.default` is the process-global pool of a
    device, the one PyTorch's allocator (``vmmweights.torch``) uses.

    Thread-safe: every method may be called from any thread.
    """

    def __init__(
        self,
        backend: str = "auto",
        device: int = 0,
        *,
        chunk_bytes: int = 0,
        small_request_max: int = 0,
        small_segment_bytes: int = 0,
        large_segment_bytes: int = 0,
        align: int = 0,
    ) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"unknown backend {backend!r}: expected one of {sorted(BACKENDS)}")
        opts = S.PoolOptions(
            backend=BACKENDS[backend],
            device=device,
            align=align,
            small_request_max=small_request_max,
            small_segment_bytes=small_segment_bytes,
            large_segment_bytes=large_segment_bytes,
            chunk_bytes=chunk_bytes,
        )
        handle = ctypes.c_void_p()
        call("vmmw_pool_new", ctypes.byref(opts), ctypes.byref(handle))
        self._init(handle, device, owned=True)

    def _init(self, handle: ctypes.c_void_p, device: int, owned: bool) -> None:
        self._handle: Optional[ctypes.c_void_p] = handle
        self._owned = owned
        self.device = device
        self._policies: Dict[str, str] = {}

    @classmethod
    def default(cls, device: int = 0) -> "Pool":
        """The process-global pool of `device` (created on first use with the
        backend ``$VMMW_BACKEND`` names, auto by default). The same object for
        every call; never freed."""
        with _defaults_lock:
            pool = _defaults.get(device)
            if pool is None:
                handle = ctypes.c_void_p()
                call("vmmw_pool_default", ctypes.c_int32(device), ctypes.byref(handle))
                pool = cls.__new__(cls)
                pool._init(handle, device, owned=False)
                _defaults[device] = pool
            return pool

    @property
    def handle(self) -> ctypes.c_void_p:
        """The ``vmmw_pool_t*`` (for calls into the C API)."""
        if self._handle is None:
            raise ValueError("the pool is closed")
        return self._handle

    def close(self) -> None:
        """Free a pool made by the constructor (its blocks become invalid).
        Does nothing for :meth:`default` pools."""
        if self._owned and self._handle is not None:
            function("vmmw_pool_free")(self._handle)
        self._handle = None

    def __enter__(self) -> "Pool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "default"
        if self._handle is None:
            return f"<vmmweights.Pool device={self.device} {kind} closed>"
        try:
            r = self.report()
            return (f"<vmmweights.Pool device={self.device} {kind} backend={r.get('backend')} "
                    f"tags={len(r.get('tags', []))} device_used_bytes={r.get('device_used_bytes')}>")
        except Exception as e:  # a repr never raises
            return f"<vmmweights.Pool device={self.device} {kind} (report failed: {e})>"

    # --- blocks ---------------------------------------------------------------

    def alloc(self, size: int, tag: str = "default") -> int:
        """Allocate `size` bytes in `tag`; the device address (stable across
        sleep and wake)."""
        out = ctypes.c_uint64()
        call("vmmw_pool_alloc_tagged", self.handle, ctypes.c_uint64(size), ctypes.c_uint32(tag_id(tag)), ctypes.byref(out))
        return out.value

    def free(self, ptr: int) -> None:
        """Free a block (it returns to the pool's cache; see :meth:`trim`)."""
        call("vmmw_pool_dealloc", self.handle, ctypes.c_uint64(ptr))

    def mark_written(self, ptr: int, size: int) -> None:
        """Say ``[ptr, ptr+size)`` was written since a load filled it (weights
        updated in place): a Reload sleep keeps it in the host backup instead
        of restoring the checkpoint's bytes. Optional: such a sleep also finds
        changed bytes by hashing what was loaded on the device."""
        call("vmmw_pool_mark_written", self.handle, ctypes.c_uint64(ptr), ctypes.c_uint64(size))

    def tag_version(self, tag: str) -> int:
        """The weights version of `tag` in this pool: 1 until an update
        (:func:`vmmweights.update.update`) or :meth:`publish` moves it."""
        out = ctypes.c_uint64()
        call("vmmw_pool_tag_version", self.handle, ctypes.c_uint32(tag_id(tag)), ctypes.byref(out))
        return out.value

    def tag_torn(self, tag: str) -> bool:
        """True while an update of `tag` failed midway and left its
        destinations holding a mix of versions (cleared by the next update)."""
        out = ctypes.c_int32()
        call("vmmw_pool_tag_torn", self.handle, ctypes.c_uint32(tag_id(tag)), ctypes.byref(out))
        return out.value != 0

    def tag_of(self, ptr: int) -> str:
        """The tag of the live block holding `ptr` (``VMMW_UNKNOWN_POINTER``
        outside every live block of this pool)."""
        out = ctypes.c_uint32()
        call("vmmw_pool_tag_of", self.handle, ctypes.c_uint64(ptr), ctypes.byref(out))
        return tag_name(out.value)

    def publish(self, tag: str) -> int:
        """Announce weights of `tag` rewritten in place by other means than
        an update: the version moves by one (returned) and importers of a
        share of the tag see it."""
        out = ctypes.c_uint64()
        call("vmmw_pool_publish", self.handle, ctypes.c_uint32(tag_id(tag)), ctypes.byref(out))
        return out.value

    def write(self, ptr: int, data: bytes) -> None:
        """Copy `data` to pool memory at `ptr` (one awake segment) and wait."""
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data) if data else None
        call("vmmw_pool_write", self.handle, ctypes.c_uint64(ptr), buf, ctypes.c_size_t(len(data)))

    def read(self, ptr: int, size: int) -> bytes:
        """Copy `size` bytes of pool memory at `ptr` to the host."""
        buf = ctypes.create_string_buffer(size)
        call("vmmw_pool_read", self.handle, ctypes.c_uint64(ptr), buf, ctypes.c_size_t(size))
        return buf.raw

    def read_backup_into(self, ptr: int, dst: int, size: int) -> str:
        """Copy `size` bytes of asleep pool memory at `ptr` out of the host
        backup its sleep kept into host memory at address `dst`, without
        waking it; the name of the tag whose backup was read. `InvalidState`
        naming the tag when it is awake, discarded, or its backup holds only
        part of the range."""
        tag = ctypes.c_uint32()
        call("vmmw_pool_read_backup", self.handle, ctypes.c_uint64(ptr), ctypes.c_void_p(dst or None),
             ctypes.c_size_t(size), ctypes.byref(tag))
        return tag_name(tag.value)

    def read_backup(self, ptr: int, size: int) -> Tuple[str, bytes]:
        """:meth:`read_backup_into` a new buffer: (tag, bytes)."""
        buf = ctypes.create_string_buffer(size)
        tag = self.read_backup_into(ptr, ctypes.addressof(buf) if size else 0, size)
        return tag, buf.raw

    def backup_view(self, ptr: int, size: int) -> Tuple[str, int]:
        """The pinned host address of the backup bytes of `size` bytes of pool
        memory at `ptr`, without copying, and their tag: (tag, address). The
        backup of an asleep tag, or the one an awake tag kept after its wake
        (the bytes of its last sleep). The pool owns the bytes: read them,
        never free them. The address stays valid while the backup stays
        assigned: until the memory is freed, :meth:`release_backup` runs, or
        a sleep of the tag needs a backup of another shape (a sleep of the
        same ranges rewrites the same bytes in place). `InvalidState` naming
        the tag when no backup holds the range, or its bytes are not in one
        piece."""
        host = ctypes.c_void_p()
        tag = ctypes.c_uint32()
        call("vmmw_pool_backup_view", self.handle, ctypes.c_uint64(ptr), ctypes.c_size_t(size),
             ctypes.byref(host), ctypes.byref(tag))
        return tag_name(tag.value), int(host.value or 0)

    def trim(self) -> int:
        """Return cached memory to the driver; the physically backed bytes released."""
        out = ctypes.c_uint64()
        call("vmmw_pool_trim", self.handle, ctypes.byref(out))
        return out.value

    def set_tag_arena(self, tag: str, reserve_bytes: int, grow_step: int = 0) -> None:
        """Place `tag`'s future blocks in one arena of `reserve_bytes` VA."""
        call("vmmw_pool_set_tag_arena", self.handle, ctypes.c_uint32(tag_id(tag)),
             ctypes.c_uint64(reserve_bytes), ctypes.c_uint64(grow_step))

    def set_tag_rdma(self, tag: str, rdma: bool = True) -> None:
        """Create `tag`'s memory RDMA-capable (registrable by NCCL's
        ``ncclCommRegister``, NIXL, UCX) from its first allocation on and at
        every wake. A wake maps new pages: :func:`vmmweights.remap_epoch` and
        :func:`vmmweights.on_remap` say when to register again."""
        call("vmmw_pool_set_tag_rdma", self.handle, ctypes.c_uint32(tag_id(tag)), ctypes.c_int32(1 if rdma else 0))

    # --- sleep and wake ----------------------------------------------------------

    def set_default_policy(self, tag: str, policy: str) -> None:
        """The policy :meth:`sleep` uses for `tag` when called without policies
        (``"offload"`` unless set: it never loses bytes)."""
        _policy(tag, policy)
        self._policies[tag] = policy

    def default_policy(self, tag: str) -> str:
        """The policy a bare :meth:`sleep` uses for `tag`."""
        return self._policies.get(tag, "offload")

    def tags(self) -> List[str]:
        """Tags holding memory in this pool now (awake or asleep)."""
        return [t["tag"] for t in self.report()["tags"]]

    def sleep(self, policies: Optional[Mapping[str, str]] = None, /, **kw: str) -> List[Dict[str, Any]]:
        """Release the device memory behind tags, keeping every pointer:
        ``pool.sleep(weights="offload", kv_cache="discard")``, or a mapping for
        names that are not identifiers. Without policies, every awake tag
        sleeps with its default policy (:meth:`set_default_policy`).

        Every entry is checked before anything moves: an unknown policy is a
        ``ValueError``; a tag this pool never held memory for (a misspelling)
        raises ``VmmwError`` with status ``VMMW_UNKNOWN_TAG``. Touching sleeping
        memory faults until :meth:`wake`. Returns what was done per tag."""
        items = dict(policies or {}, **kw)
        if not items:
            rep = self.report()
            items = {t["tag"]: self.default_policy(t["tag"]) for t in rep["tags"] if not t["asleep"]}
            if not items:
                return []
        codes = [_policy(tag, policy) for tag, policy in items.items()]  # all checked first
        arr = (S.TagPolicy * len(items))()
        for i, (tag, code) in enumerate(zip(items, codes)):
            arr[i].policy = code
            arr[i].tag = tag_id(tag)
        call("vmmw_pool_sleep", self.handle, arr, ctypes.c_size_t(len(items)))
        return self.last_cycle()

    def wake(self, *tags: str, wait_memory_s: float = 0.0) -> List[Dict[str, Any]]:
        """Bring the listed tags back (every sleeping tag when none is named)
        at the same addresses: offloaded and reloaded bytes as they were,
        discarded ones undefined. Checks free device memory first; each tag's
        wake is all or nothing. Returns what was done per tag.

        ``wait_memory_s`` > 0: instead of failing at once when free device
        memory is short, map each chunk as the device has room, waiting up to
        that many seconds for memory another process or pool releases (one
        process puts its model to sleep while another wakes its own); then
        fail with ``VMMW_OUT_OF_MEMORY`` naming the tag, which stays asleep
        with its backup (``vmmw_pool_wake_with``)."""
        ids = (ctypes.c_uint32 * max(len(tags), 1))(*[tag_id(t) for t in tags])
        if wait_memory_s:
            opts = S.WakeOptions(wait_memory_ms=_millis(wait_memory_s))
            call("vmmw_pool_wake_with", self.handle, ids, ctypes.c_size_t(len(tags)), ctypes.byref(opts))
        else:
            call("vmmw_pool_wake", self.handle, ids, ctypes.c_size_t(len(tags)))
        return self.last_cycle()

    def swap(
        self, sleep: Mapping[str, str], wake: Sequence[str], *, wait_memory_s: float = 0.0
    ) -> Dict[str, Any]:
        """Put the tags of ``sleep`` (tag -> policy) to sleep and wake those of
        ``wake``, at once: the sleep's device-to-host copies and the wake's
        host-to-device copies share the link's two directions, and each chunk
        of the waking tags is mapped as soon as the sleeping ones free room,
        so a swap takes about the link time of the larger side
        (``vmmw_pool_swap``). ``wait_memory_s``: how long the wake may still
        wait for memory from elsewhere once the sleep has ended.

        Returns the swap's result (each side's status, tags, bytes, seconds)
        with ``"tags"``, what was done per tag. A refusal (unknown tag, a tag
        twice or in both lists, a sleeping tag a load writes into, too little
        memory without a wait) raises ``VmmwError`` with nothing changed; a
        side that failed raises ``VmmwError`` whose ``swap_result`` tells both
        sides (a waking tag that failed stays asleep with its backup)."""
        codes = [_policy(tag, policy) for tag, policy in sleep.items()]
        items = (S.TagPolicy * max(len(codes), 1))()
        for i, (tag, code) in enumerate(zip(sleep, codes)):
            items[i].policy = code
            items[i].tag = tag_id(tag)
        ids = (ctypes.c_uint32 * max(len(wake), 1))(*[tag_id(t) for t in wake])
        opts = S.SwapOptions(wait_memory_ms=_millis(wait_memory_s))
        res = S.SwapResult(sleep_status=-1)
        try:
            call("vmmw_pool_swap", self.handle, items, ctypes.c_size_t(len(codes)), ids,
                 ctypes.c_size_t(len(wake)), ctypes.byref(opts), ctypes.byref(res))
        except VmmwError as e:
            if res.sleep_status != -1:
                e.swap_result = dict(_fields(res), tags=self.last_cycle())  # type: ignore[attr-defined]
            raise
        return dict(_fields(res), tags=self.last_cycle())

    def forget_reload(self, tag: str) -> None:
        """Drop what loads registered to restore `tag` from: a tag asleep with
        ``"reload"`` then wakes with its other bytes restored and the loaded
        ones undefined. The way out when its checkpoint changed (the wake
        failed with ``VMMW_CHECKPOINT_INVALID``): forget, wake, load again."""
        call("vmmw_pool_forget_reload", self.handle, ctypes.c_uint32(tag_id(tag)))

    def last_cycle(self) -> List[Dict[str, Any]]:
        """What the last sleep or wake through this handle did, per tag."""
        doc = json.loads(call_text("vmmw_pool_last_cycle_json", self.handle))
        assert isinstance(doc, list), doc
        return doc

    def reserve_backup(self, nbytes: int) -> None:
        """Pin `nbytes` of host backup ahead of time, so the first offload runs
        at the link's rate."""
        call("vmmw_pool_reserve_backup", self.handle, ctypes.c_uint64(nbytes))

    def release_backup(self) -> int:
        """Unpin backup memory holding no sleeping tag's bytes; bytes unpinned."""
        out = ctypes.c_uint64()
        call("vmmw_pool_release_backup", self.handle, ctypes.byref(out))
        return out.value

    def drop_backups(self, *tags: str, unpin: bool = False) -> int:
        """Drop the host backups `tags` kept after their last wake: their
        pinned memory stays in the backup arena for the next sleep of any
        tag (no cost to pin again), unless `unpin`, which also unpins every
        slab holding no asleep tag's bytes. Asleep tags keep theirs. Returns
        the bytes unpinned."""
        ids = (ctypes.c_uint32 * len(tags))(*(tag_id(t) for t in tags))
        out = ctypes.c_uint64()
        call("vmmw_pool_drop_backups", self.handle, ids, ctypes.c_size_t(len(tags)),
             ctypes.c_uint32(1 if unpin else 0), ctypes.byref(out))
        return out.value

    def set_sleep_options(self, **options: int) -> None:
        """Set the sleep engine's options by field name (see
        ``vmmw_sleep_options_t``: copy_piece_bytes, streams, debug_fill,
        debug_fill_byte, host_memory_limit, ...); omitted fields take defaults."""
        names = {f[0] for f in S.SleepOptions._fields_}
        unknown = sorted(set(options) - names)
        if unknown:
            raise ValueError(f"unknown sleep options {unknown}: expected some of {sorted(names)}")
        call("vmmw_pool_set_sleep_options", self.handle, ctypes.byref(S.SleepOptions(**options)))

    # --- staging and reports -------------------------------------------------------

    def staging_bytes(self) -> int:
        """Pinned host staging the loader keeps cached for this pool's device."""
        out = ctypes.c_uint64()
        call("vmmw_pool_staging_bytes", self.handle, ctypes.byref(out))
        return out.value

    def release_staging(self) -> int:
        """Unpin the loader's cached staging ring; the bytes unpinned."""
        out = ctypes.c_uint64()
        call("vmmw_pool_release_staging", self.handle, ctypes.byref(out))
        return out.value

    def report(self) -> Dict[str, Any]:
        """The memory report: ``backend`` (the kind, "cuda" or "host"),
        ``device`` (in words), ``ordinal``, ``tags`` (one dict per tag:
        live_bytes, reserved_bytes, tracked_bytes, segments, offloaded_bytes,
        ..., asleep), ``total``, ``device_used_bytes``, ``device_total_bytes``."""
        return _json_object(call_text("vmmw_pool_report_json", self.handle))

    def report_table(self) -> str:
        """The report as a table."""
        return table(self.report())

    def snapshot(self, name: str) -> None:
        """Record the report now in the pool's timeline as boundary `name`."""
        call("vmmw_pool_snapshot", self.handle, name.encode())

    def timeline(self) -> Dict[str, Any]:
        """Every snapshot so far."""
        return _json_object(call_text("vmmw_pool_timeline_json", self.handle))


def _millis(seconds: float) -> int:
    """A wait in seconds as whole milliseconds, rounded up; negative is refused."""
    if seconds < 0:
        raise ValueError(f"a wait for memory of {seconds} s: must be 0 or more")
    return int(-(-seconds * 1000 // 1))


def _fields(res: ctypes.Structure) -> Dict[str, Any]:
    """A result struct's fields as a dict."""
    return {f[0]: getattr(res, f[0]) for f in res._fields_}
