"""PyTorch tensors in vmmweights memory, through ctypes (no compiled extension).

    import vmmweights_torch as vt
    with vt.use_pool("weights"):
        model = build_model().to("cuda")      # every segment tagged "weights"
    print(vt.report_text())                   # live / reserved / tracked bytes per tag
    del model; vt.release_pools(); vt.trim()  # memory goes back to the device

How it fits together: `use_pool` routes allocations made on this thread inside
the block to a `torch.cuda.MemPool` built on our two exported C functions
(`vmmw_torch_malloc` / `vmmw_torch_free`, loaded by
`torch.cuda.memory.CUDAPluggableAllocator`), and pushes the tag on this
thread's tag stack so each segment PyTorch asks for is tagged. PyTorch's
caching allocator still splits and caches inside the MemPool; our side sees
segment-sized requests. No Python runs in the allocation path.

The library is found through VMMW_LIB (a path to libvmmweights.so), else next
to this file's repository in target/release or target/debug.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import json
import os
import threading
from pathlib import Path

VMMW_BUFFER_TOO_SMALL = 16

_lock = threading.Lock()
_lib = None
_lib_path = None
_allocator = None
_pools: dict[tuple[int, str], object] = {}


class VmmwError(RuntimeError):
    """A vmmw_* C function failed; `status` is the stable VMMW_* code."""

    def __init__(self, function: str, status: int, message: str):
        super().__init__(f"{function} failed with status {status}: {message}")
        self.function = function
        self.status = status
        self.message = message


def library_path() -> str:
    """Where libvmmweights.so is loaded from."""
    env = os.environ.get("VMMW_LIB")
    if env:
        if not Path(env).is_file():
            raise FileNotFoundError(f"VMMW_LIB={env} does not name a file")
        return str(Path(env).resolve())
    root = Path(__file__).resolve().parents[2]
    for sub in ("target/release", "target/debug"):
        p = root / sub / "libvmmweights.so"
        if p.is_file():
            return str(p)
    raise FileNotFoundError(
        "libvmmweights.so not found: set VMMW_LIB, or run `cargo build --release` "
        f"in {root}"
    )


def lib() -> ctypes.CDLL:
    """The loaded library (loaded once)."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            _lib_path = library_path()
            _lib = ctypes.CDLL(_lib_path)
            _declare(_lib)
        return _lib


def _declare(l: ctypes.CDLL) -> None:
    err_pp = ctypes.POINTER(ctypes.c_void_p)
    sigs = {
        "vmmw_error_message": (ctypes.c_char_p, [ctypes.c_void_p]),
        "vmmw_error_free": (None, [ctypes.c_void_p]),
        "vmmw_tag_id": (ctypes.c_int, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32), err_pp]),
        "vmmw_tag_push": (ctypes.c_int, [ctypes.c_uint32, err_pp]),
        "vmmw_tag_pop": (ctypes.c_int, [err_pp]),
        "vmmw_pool_default": (ctypes.c_int, [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), err_pp]),
        "vmmw_pool_report_json": (
            ctypes.c_int,
            [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_size_t), err_pp],
        ),
        "vmmw_pool_trim": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), err_pp]),
        "vmmw_pool_staging_bytes": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), err_pp]),
        "vmmw_pool_release_staging": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_uint64), err_pp]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(l, name, None)  # absent in builds without that C function
        if fn is not None:
            fn.restype = res
            fn.argtypes = args


def _fn(name: str):
    fn = getattr(lib(), name, None)
    if fn is None:
        raise VmmwError(name, -1, f"{_lib_path} does not export {name}; rebuild the library")
    return fn


def _call(name: str, *args) -> None:
    """Call `name(*args, &error)`; raise VmmwError with the library's message on failure."""
    err = ctypes.c_void_p()
    status = _fn(name)(*args, ctypes.byref(err))
    if status != 0:
        message = "(no error details)"
        if err.value:
            raw = _fn("vmmw_error_message")(err)
            message = raw.decode("utf-8", "replace") if raw else message
            _fn("vmmw_error_free")(err)
        raise VmmwError(name, status, message)


# --- tags -----------------------------------------------------------------------


def tag_id(name: str) -> int:
    """The id of tag `name`, registering it on first use."""
    out = ctypes.c_uint32()
    _call("vmmw_tag_id", name.encode(), ctypes.byref(out))
    return out.value


def push_tag(name: str) -> None:
    """Open a tag scope on the calling thread (close it with pop_tag)."""
    _call("vmmw_tag_push", ctypes.c_uint32(tag_id(name)))


def pop_tag() -> None:
    """Close the innermost tag scope on the calling thread."""
    _call("vmmw_tag_pop")


@contextlib.contextmanager
def tag_scope(name: str):
    """Allocations made by this thread inside the block get tag `name`."""
    push_tag(name)
    try:
        yield
    finally:
        pop_tag()


# --- the PyTorch allocator --------------------------------------------------------


def allocator():
    """The CUDAPluggableAllocator over our two entry points (created once)."""
    global _allocator
    import torch

    lib()  # resolves and validates the path first
    with _lock:
        if _allocator is None:
            _allocator = torch.cuda.memory.CUDAPluggableAllocator(
                _lib_path, "vmmw_torch_malloc", "vmmw_torch_free"
            )
        return _allocator


def mem_pool(tag: str = "weights", device: int = 0):
    """The torch.cuda.MemPool for `tag` on `device`, backed by our allocator
    (created once). One MemPool per tag: PyTorch reuses cached blocks within a
    MemPool, so sharing one between tags would mix tags inside a segment."""
    import torch

    alloc = allocator()
    with _lock:
        key = (device, tag)
        if key not in _pools:
            _pools[key] = torch.cuda.MemPool(alloc.allocator())
        return _pools[key]


@contextlib.contextmanager
def use_pool(tag: str = "weights", device: int = 0):
    """Route this thread's CUDA allocations on `device` inside the block to the
    MemPool of `tag`, with every new segment tagged `tag`. Yields the MemPool
    (do not keep references to it past `release_pools`)."""
    import torch

    pool = mem_pool(tag, device)
    push_tag(tag)
    try:
        with torch.cuda.device(device), torch.cuda.memory.use_mem_pool(pool, device=device):
            yield pool
    finally:
        pop_tag()


def release_pools(tag: str | None = None) -> None:
    """Drop our MemPools (of `tag`, or all) and let PyTorch return their
    cached segments (our vmmw_torch_free runs for each). Delete the tensors
    allocated in them first; a later use_pool builds a fresh MemPool."""
    import torch

    with _lock:
        for key in [k for k in _pools if tag is None or k[1] == tag]:
            del _pools[key]
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


# --- report and trim --------------------------------------------------------------


def _pool_handle(device: int) -> ctypes.c_void_p:
    out = ctypes.c_void_p()
    _call("vmmw_pool_default", ctypes.c_int(device), ctypes.byref(out))
    return out


def report(device: int = 0) -> dict:
    """The memory report of the process-global pool of `device` (the one the
    PyTorch entry points use), as a dict: `tags` (a list, one entry per tag)
    and `total`, each with live_bytes, reserved_bytes, tracked_bytes,
    segments, ...; plus device_used_bytes."""
    pool = _pool_handle(device)
    cap = 16 << 10
    while True:
        buf = ctypes.create_string_buffer(cap)
        needed = ctypes.c_size_t()
        err = ctypes.c_void_p()
        status = _fn("vmmw_pool_report_json")(pool, buf, cap, ctypes.byref(needed), ctypes.byref(err))
        if status == VMMW_BUFFER_TOO_SMALL and needed.value > cap:
            if err.value:
                _fn("vmmw_error_free")(err)
            cap = needed.value
            continue
        if status != 0:
            message = "(no error details)"
            if err.value:
                raw = _fn("vmmw_error_message")(err)
                message = raw.decode("utf-8", "replace") if raw else message
                _fn("vmmw_error_free")(err)
            raise VmmwError("vmmw_pool_report_json", status, message)
        return json.loads(buf.value.decode())


def tag_usage(rep: dict, tag: str) -> dict:
    """The entry of `tag` in a report, or zeroes when the tag holds nothing."""
    for t in rep.get("tags", []):
        if t["tag"] == tag:
            return t
    return {"tag": tag, "live_bytes": 0, "reserved_bytes": 0, "tracked_bytes": 0, "segments": 0}


def report_text(device: int = 0) -> str:
    """The report as a short table (live / reserved / tracked per tag)."""
    rep = report(device)
    mib = lambda b: f"{b / 2**20:10.2f} MiB"  # noqa: E731
    lines = [f"{'tag':<16}{'live':>16}{'reserved':>16}{'tracked':>16}{'segments':>10}"]
    for t in rep["tags"] + [rep["total"]]:
        lines.append(
            f"{t['tag']:<16}{mib(t['live_bytes']):>16}{mib(t['reserved_bytes']):>16}"
            f"{mib(t['tracked_bytes']):>16}{t['segments']:>10}"
        )
    used = rep.get("device_used_bytes")
    lines.append("device used: " + ("unknown" if used is None else mib(used).strip()))
    return "\n".join(lines)


def trim(device: int = 0) -> int:
    """Return the pool's cached memory to the device; the tracked bytes released."""
    released = ctypes.c_uint64()
    _call("vmmw_pool_trim", _pool_handle(device), ctypes.byref(released))
    return released.value


# --- sleep and wake ----------------------------------------------------------------

POLICIES = {"offload": 0, "discard": 1, "reload": 2}


class _TagPolicy(ctypes.Structure):
    # vmmw_tag_policy_t: { uint32_t tag; int32_t policy; }
    _fields_ = [("tag", ctypes.c_uint32), ("policy", ctypes.c_int32)]


def sleep(device: int = 0, **policies: str) -> None:
    """Release the device memory behind the listed tags, keeping every pointer:
    `sleep(weights="offload", kv_cache="discard")`. Offload keeps a pinned host
    backup; discard drops the contents; reload restores them from the
    checkpoint they were loaded from. Touching sleeping memory faults.
    Synchronizes the device first, so queued kernels finish."""
    import torch

    torch.cuda.synchronize(device)
    items = (_TagPolicy * len(policies))()
    for i, (tag, policy) in enumerate(policies.items()):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} for tag {tag!r}: expected one of {sorted(POLICIES)}")
        items[i].tag = tag_id(tag)
        items[i].policy = POLICIES[policy]
    _call("vmmw_pool_sleep", _pool_handle(device), items, ctypes.c_size_t(len(policies)))


def wake(*tags: str, device: int = 0) -> None:
    """Bring the listed tags back (all sleeping tags when none is named), at the
    same addresses; offloaded contents are restored byte for byte."""
    ids = (ctypes.c_uint32 * max(len(tags), 1))(*[tag_id(t) for t in tags])
    _call("vmmw_pool_wake", _pool_handle(device), ids, ctypes.c_size_t(len(tags)))


def staging_bytes(device: int = 0) -> int:
    """Pinned host staging the loader keeps cached for this device (reused by later loads and Reload wakes)."""
    out = ctypes.c_uint64()
    _call("vmmw_pool_staging_bytes", _pool_handle(device), ctypes.byref(out))
    return out.value


def release_staging(device: int = 0) -> int:
    """Unpin the loader's cached staging ring for this device; the bytes unpinned."""
    out = ctypes.c_uint64()
    _call("vmmw_pool_release_staging", _pool_handle(device), ctypes.byref(out))
    return out.value


def reserve_backup(nbytes: int, device: int = 0) -> None:
    """Pin `nbytes` of host backup ahead of time, so the first sleep runs at the link's rate."""
    _call("vmmw_pool_reserve_backup", _pool_handle(device), ctypes.c_uint64(nbytes))
