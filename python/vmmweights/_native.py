"""Finding, loading and calling libvmmweights.so (the C ABI is the one interface).

Every C function returns a status and takes a trailing ``vmmw_error_t**``;
:func:`call` turns a failure into :class:`VmmwError` carrying the stable status
and the library's message.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Callable, Optional, cast

from . import _structs as S

OK = 0
BUFFER_TOO_SMALL = 16

_lock = threading.Lock()
_lib: Optional[ctypes.CDLL] = None
_lib_path: Optional[str] = None

_HERE = Path(__file__).resolve().parent
_SONAME = "libvmmweights.so"


class VmmwError(RuntimeError):
    """A ``vmmw_*`` C function failed.

    ``status`` is the stable ``VMMW_*`` number, ``status_name`` its name
    ("VMMW_UNKNOWN_TAG"), ``function`` the C function and ``message`` the
    library's explanation. ``driver_code`` is the driver's own code of a
    ``VMMW_DRIVER_ERROR`` (a ``CUresult`` on the cuda backend, an ``errno``
    on the host backend), 0 for any other error.
    """

    def __init__(
        self, function: str, status: int, status_name: str, message: str, driver_code: int = 0
    ):
        super().__init__(f"{function}: {status_name} ({status}): {message}")
        self.function = function
        self.status = status
        self.status_name = status_name
        self.message = message
        self.driver_code = driver_code


def library_path() -> str:
    """The path of ``libvmmweights.so`` this package uses.

    In order: ``$VMMW_LIB`` (a file), the library inside the installed package;
    in a source checkout (``python/`` on ``PYTHONPATH``, or an editable
    install), the newest of the package's copy and the repository's
    ``target/release`` and ``target/debug`` builds. Pass it to
    ``torch.cuda.memory.CUDAPluggableAllocator``.
    """
    env = os.environ.get("VMMW_LIB")
    if env:
        p = Path(env)
        if not p.is_file():
            raise FileNotFoundError(f"VMMW_LIB={env} does not name a file")
        return str(p.resolve())
    packaged = _HERE / "vmmweights" / _SONAME
    repo = _HERE.parents[1]
    if not (repo / "Cargo.toml").is_file():  # an installed package: its own library
        if packaged.is_file():
            return str(packaged)
    # A source checkout: the library built last, so neither a stale release
    # build nor the copy an editable install (pip install -e) left in the
    # package shadows a fresh build.
    built = [p for p in (packaged, repo / "target/release" / _SONAME, repo / "target/debug" / _SONAME)
             if p.is_file()]
    if built:
        return str(max(built, key=lambda p: p.stat().st_mtime))
    raise FileNotFoundError(
        f"{_SONAME} not found: not in the package ({packaged}), VMMW_LIB is unset, "
        f"and no {repo}/target/{{release,debug}}/{_SONAME}; install the wheel "
        "(pip install ./python) or build the library (bash scripts/build-clib.sh --release)"
    )


_P = ctypes.c_void_p
_ERR = ctypes.POINTER(ctypes.c_void_p)
_U64P = ctypes.POINTER(ctypes.c_uint64)
_SZP = ctypes.POINTER(ctypes.c_size_t)
_BUF = [ctypes.c_char_p, ctypes.c_size_t, _SZP]  # buf, cap, needed
_I32 = ctypes.c_int32
# void (*vmmw_remap_fn)(void* user, uint32_t tag, uint64_t epoch)
REMAP_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint64)

# name -> (restype, argtypes without the trailing error argument, has error argument)
_SIGNATURES: dict[str, tuple[Any, list[Any], bool]] = {
    "vmmw_status_name": (ctypes.c_char_p, [_I32], False),
    "vmmw_error_message": (ctypes.c_char_p, [_P], False),
    "vmmw_error_status": (_I32, [_P], False),
    "vmmw_error_driver_code": (_I32, [_P], False),
    "vmmw_error_free": (None, [_P], False),
    "vmmw_version_string": (ctypes.c_char_p, [], False),
    "vmmw_device_open": (_I32, [_I32, _I32, ctypes.POINTER(_P)], True),
    "vmmw_device_free": (None, [_P], False),
    "vmmw_device_backend": (_I32, [_P, ctypes.POINTER(_I32)], True),
    "vmmw_device_granularity": (_I32, [_P, _U64P], True),
    "vmmw_device_mem_info": (_I32, [_P, _U64P, _U64P], True),
    "vmmw_device_describe": (_I32, [_P, *_BUF], True),
    "vmmw_device_synchronize": (_I32, [_P], True),
    "vmmw_tag_id": (_I32, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_tag_name": (_I32, [ctypes.c_uint32, *_BUF], True),
    "vmmw_tag_push": (_I32, [ctypes.c_uint32], True),
    "vmmw_tag_pop": (_I32, [], True),
    "vmmw_tag_current": (_I32, [ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_tag_set_process_default": (_I32, [ctypes.c_uint32], True),
    "vmmw_tag_remap_epoch": (_I32, [ctypes.c_uint32, _U64P], True),
    "vmmw_remap_callback_add": (_I32, [REMAP_FN, _P, _U64P], True),
    "vmmw_remap_callback_remove": (_I32, [ctypes.c_uint64], True),
    "vmmw_pool_new": (_I32, [ctypes.POINTER(S.PoolOptions), ctypes.POINTER(_P)], True),
    "vmmw_pool_default": (_I32, [_I32, ctypes.POINTER(_P)], True),
    "vmmw_pool_free": (None, [_P], False),
    "vmmw_pool_alloc_tagged": (_I32, [_P, ctypes.c_uint64, ctypes.c_uint32, _U64P], True),
    "vmmw_pool_dealloc": (_I32, [_P, ctypes.c_uint64], True),
    "vmmw_pool_mark_written": (_I32, [_P, ctypes.c_uint64, ctypes.c_uint64], True),
    "vmmw_pool_trim": (_I32, [_P, _U64P], True),
    "vmmw_pool_set_tag_arena": (_I32, [_P, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64], True),
    "vmmw_pool_set_tag_segments": (_I32, [_P, ctypes.c_uint32], True),
    "vmmw_pool_set_tag_rdma": (_I32, [_P, ctypes.c_uint32, _I32], True),
    "vmmw_pool_report_json": (_I32, [_P, *_BUF], True),
    "vmmw_pool_snapshot": (_I32, [_P, ctypes.c_char_p], True),
    "vmmw_pool_timeline_json": (_I32, [_P, *_BUF], True),
    "vmmw_pool_write": (_I32, [_P, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t], True),
    "vmmw_pool_read": (_I32, [_P, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t], True),
    "vmmw_pool_read_backup": (_I32, [_P, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t,
                                      ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_pool_backup_view": (_I32, [_P, ctypes.c_uint64, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p),
                                      ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_pool_sleep": (_I32, [_P, ctypes.POINTER(S.TagPolicy), ctypes.c_size_t], True),
    "vmmw_pool_wake": (_I32, [_P, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t], True),
    "vmmw_pool_wake_with": (_I32, [_P, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                                   ctypes.POINTER(S.WakeOptions)], True),
    "vmmw_pool_swap": (_I32, [_P, ctypes.POINTER(S.TagPolicy), ctypes.c_size_t,
                              ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t,
                              ctypes.POINTER(S.SwapOptions), ctypes.POINTER(S.SwapResult)], True),
    "vmmw_pool_reserve_backup": (_I32, [_P, ctypes.c_uint64], True),
    "vmmw_pool_release_backup": (_I32, [_P, _U64P], True),
    "vmmw_pool_set_sleep_options": (_I32, [_P, ctypes.POINTER(S.SleepOptions)], True),
    "vmmw_pool_last_cycle_json": (_I32, [_P, *_BUF], True),
    "vmmw_pool_staging_bytes": (_I32, [_P, _U64P], True),
    "vmmw_pool_release_staging": (_I32, [_P, _U64P], True),
    "vmmw_loader_open": (_I32, [ctypes.c_char_p, ctypes.POINTER(_P)], True),
    "vmmw_loader_free": (None, [_P], False),
    "vmmw_loader_set_rules_json": (_I32, [_P, ctypes.c_char_p], True),
    "vmmw_loader_set_rules_preset": (
        _I32,
        [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32],
        True,
    ),
    "vmmw_loader_set_options": (_I32, [_P, ctypes.POINTER(S.LoadOptions)], True),
    "vmmw_loader_set_reload_check": (_I32, [_P, ctypes.c_uint32], True),
    "vmmw_pool_forget_reload": (_I32, [_P, ctypes.c_uint32], True),
    "vmmw_loader_declare_foreign": (_I32, [_P, ctypes.c_uint64, ctypes.c_uint64], True),
    "vmmw_loader_register": (
        _I32,
        [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_char_p, _U64P, ctypes.c_size_t],
        True,
    ),
    "vmmw_loader_allocate": (_I32, [_P, _P, ctypes.c_uint32], True),
    "vmmw_loader_destination_count": (_I32, [_P, _SZP], True),
    "vmmw_loader_destination_name": (_I32, [_P, ctypes.c_size_t, *_BUF], True),
    "vmmw_loader_destination": (_I32, [_P, ctypes.c_char_p, ctypes.POINTER(S.Destination)], True),
    "vmmw_loader_plan": (_I32, [_P, ctypes.POINTER(S.PlanSummary)], True),
    "vmmw_loader_load": (_I32, [_P, _P, S.PROGRESS_FN, ctypes.c_void_p], True),
    "vmmw_loader_cancel": (_I32, [_P], True),
    "vmmw_pack": (
        _I32,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(S.PackOptions), S.PROGRESS_FN, ctypes.c_void_p,
         ctypes.POINTER(S.PackReport)],
        True,
    ),
    "vmmw_unpack": (
        _I32,
        [ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(S.PackOptions), S.PROGRESS_FN, ctypes.c_void_p,
         ctypes.POINTER(S.PackReport)],
        True,
    ),
    "vmmw_loader_result": (_I32, [_P, ctypes.POINTER(S.LoadResult)], True),
    "vmmw_loader_result_json": (_I32, [_P, *_BUF], True),
    "vmmw_loader_load_devices": (
        _I32,
        [ctypes.POINTER(_P), ctypes.POINTER(_P), ctypes.c_size_t, _I32, ctypes.POINTER(S.MultiResult)],
        True,
    ),
    "vmmw_replicas_wake_by_reload": (
        _I32,
        [ctypes.POINTER(_P), ctypes.POINTER(_P), ctypes.c_size_t, ctypes.POINTER(S.MultiResult)],
        True,
    ),
    "vmmw_replicas_sleep": (
        _I32,
        [ctypes.POINTER(_P), ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.POINTER(S.ReplicaSleepResult)],
        True,
    ),
    "vmmw_replicas_sleep_with": (
        _I32,
        [
            ctypes.POINTER(_P),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_size_t,
            ctypes.POINTER(S.ReplicaSleepOptions),
            ctypes.POINTER(S.ReplicaSleepResult),
        ],
        True,
    ),
    "vmmw_replicas_wake_from_backup": (
        _I32,
        [
            ctypes.POINTER(_P),
            ctypes.POINTER(ctypes.c_uint32),
            ctypes.c_size_t,
            ctypes.POINTER(S.ReplicaWakeOptions),
            ctypes.POINTER(S.ReplicaWakeResult),
        ],
        True,
    ),
    "vmmw_share_serve": (
        _I32,
        [_P, ctypes.c_uint32, _P, ctypes.c_char_p, ctypes.POINTER(S.ShareOptions), ctypes.POINTER(_P)],
        True,
    ),
    "vmmw_share_server_free": (None, [_P], False),
    "vmmw_share_server_attached": (_I32, [_P, _U64P], True),
    "vmmw_share_server_publish": (_I32, [_P, _U64P], True),
    "vmmw_share_attach": (_I32, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.POINTER(_P)], True),
    "vmmw_share_count": (_I32, [_P, _SZP], True),
    "vmmw_share_tensor_name": (_I32, [_P, ctypes.c_size_t, *_BUF], True),
    "vmmw_share_tensor": (_I32, [_P, ctypes.c_char_p, ctypes.POINTER(S.Destination)], True),
    "vmmw_share_version": (_I32, [_P, _U64P], True),
    "vmmw_share_owner_connected": (_I32, [_P, ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_share_read": (_I32, [_P, ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t], True),
    "vmmw_share_detach": (_I32, [_P], True),
    "vmmw_share_free": (None, [_P], False),
    "vmmw_update_source_new": (_I32, [ctypes.POINTER(_P)], True),
    "vmmw_update_source_free": (None, [_P], False),
    "vmmw_update_source_add": (
        _I32,
        [_P, ctypes.c_char_p, ctypes.c_char_p, _U64P, ctypes.c_size_t, ctypes.c_uint64, _I32],
        True,
    ),
    "vmmw_update": (
        _I32,
        [_P, _P, _P, ctypes.POINTER(S.UpdateOptions), ctypes.POINTER(S.UpdateResult)],
        True,
    ),
    "vmmw_update_sender_new": (
        _I32, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(_P)], True),
    "vmmw_update_sender_free": (None, [_P], False),
    "vmmw_update_sender_send": (_I32, [_P, _P, ctypes.c_uint32, ctypes.POINTER(S.SendReport)], True),
    "vmmw_update_sender_send_direct": (_I32, [_P, _P, ctypes.c_uint32, ctypes.POINTER(S.SendReport)], True),
    "vmmw_update_receive_ipc": (
        _I32,
        [_P, _P, ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(S.UpdateOptions), ctypes.POINTER(S.UpdateResult)],
        True,
    ),
    "vmmw_update_receiver_new": (
        _I32, [_P, ctypes.c_char_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(_P)], True),
    "vmmw_update_receiver_free": (None, [_P], False),
    "vmmw_update_receiver_receive": (
        _I32, [_P, _P, _P, ctypes.POINTER(S.UpdateOptions), ctypes.POINTER(S.UpdateResult)], True),
    "vmmw_update_receiver_stats": (_I32, [_P, ctypes.POINTER(S.ReceiveStats)], True),
    "vmmw_update_receiver_drop_imports": (_I32, [_P], True),
    "vmmw_nccl_unique_id": (_I32, [ctypes.c_char_p], True),
    "vmmw_nccl_comm_new": (_I32, [_P, ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(_P)], True),
    "vmmw_nccl_comm_from_raw": (_I32, [_P, ctypes.POINTER(_P)], True),
    "vmmw_nccl_comm_free": (None, [_P], False),
    "vmmw_update_broadcast_send": (_I32, [_P, _P, _P, ctypes.c_uint64, ctypes.c_uint64], True),
    "vmmw_update_broadcast_receive": (
        _I32,
        [_P, _P, _P, ctypes.c_uint32, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(S.UpdateOptions),
         ctypes.POINTER(S.UpdateResult)],
        True,
    ),
    "vmmw_update_broadcast_root": (
        _I32,
        [_P, _P, _P, _P, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(S.UpdateOptions),
         ctypes.POINTER(S.UpdateResult)],
        True,
    ),
    "vmmw_load_broadcast": (
        _I32,
        [_P, _P, _P, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_uint64, ctypes.c_uint64,
         ctypes.c_uint32, ctypes.POINTER(S.BroadcastLoadResult)],
        True,
    ),
    "vmmw_nccl_register": (_I32, [_P, ctypes.c_uint64, ctypes.c_uint64, ctypes.POINTER(_P)], True),
    "vmmw_nccl_deregister": (_I32, [_P, _P], True),
    "vmmw_pool_tag_version": (_I32, [_P, ctypes.c_uint32, _U64P], True),
    "vmmw_pool_tag_torn": (_I32, [_P, ctypes.c_uint32, ctypes.POINTER(_I32)], True),
    "vmmw_pool_tag_of": (_I32, [_P, ctypes.c_uint64, ctypes.POINTER(ctypes.c_uint32)], True),
    "vmmw_pool_publish": (_I32, [_P, ctypes.c_uint32, _U64P], True),
    "vmmw_metadata_open": (_I32, [ctypes.c_char_p, ctypes.POINTER(_P)], True),
    "vmmw_metadata_free": (None, [_P], False),
    "vmmw_metadata_count": (_I32, [_P, _SZP], True),
    "vmmw_metadata_key": (_I32, [_P, ctypes.c_size_t, *_BUF], True),
    "vmmw_metadata_find": (_I32, [_P, ctypes.c_char_p, _SZP], True),
    "vmmw_metadata_type": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint32),
                                  ctypes.POINTER(ctypes.c_uint32), _SZP], True),
    "vmmw_metadata_u64": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, _U64P], True),
    "vmmw_metadata_i64": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int64)], True),
    "vmmw_metadata_f64": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_double)], True),
    "vmmw_metadata_bool": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, ctypes.POINTER(ctypes.c_uint8)], True),
    "vmmw_metadata_string": (_I32, [_P, ctypes.c_size_t, _SZP, ctypes.c_size_t, *_BUF], True),
    "vmmw_ggml_type": (_I32, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint32), _SZP, _SZP], True),
    # An IPC sender's tensors offered ahead of the first update, and the receiver taking them.
    "vmmw_update_sender_offer_direct": (_I32, [_P, _P, ctypes.c_uint32, ctypes.POINTER(S.SendReport)], True),
    "vmmw_update_receiver_prepare": (_I32, [_P, _P, _P, ctypes.POINTER(S.UpdateOptions)], True),
    # Backups a wake kept, dropped per tag (the memory savers' resume).
    "vmmw_pool_drop_backups": (
        _I32, [_P, ctypes.POINTER(ctypes.c_uint32), ctypes.c_size_t, ctypes.c_uint32, _U64P], True),
}


# The control channel (docs/PRELOAD.md): a process serving a control socket.
_SIGNATURES.update({
    "vmmw_control_status": (_I32, [ctypes.c_char_p, *_BUF], True),
    "vmmw_control_sleep": (
        _I32,
        [ctypes.c_char_p, _I32, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
         ctypes.POINTER(S.ControlResult)],
        True,
    ),
    "vmmw_control_wake": (
        _I32,
        [ctypes.c_char_p, ctypes.c_uint64, ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
         ctypes.POINTER(S.ControlResult)],
        True,
    ),
    "vmmw_control_serve": (_I32, [ctypes.c_char_p, ctypes.POINTER(_P)], True),
    "vmmw_control_server_free": (None, [_P], False),
})

def lib() -> ctypes.CDLL:
    """The loaded library (opened once, by its full path)."""
    global _lib, _lib_path
    with _lock:
        if _lib is None:
            path = library_path()
            handle = ctypes.CDLL(path)
            for name, (res, args, has_err) in _SIGNATURES.items():
                fn = getattr(handle, name, None)
                if fn is None:
                    continue  # reported by `function` when first used
                fn.restype = res
                fn.argtypes = [*args, _ERR] if has_err else args
            _lib, _lib_path = handle, path
        return _lib


def function(name: str) -> Callable[..., Any]:
    """The C function `name`; a clear error when this build lacks it."""
    fn = getattr(lib(), name, None)
    if fn is None or name not in _SIGNATURES:
        raise VmmwError(name, -1, "VMMW_UNSUPPORTED", f"{_lib_path} does not export {name}; rebuild the library")
    return cast(Callable[..., Any], fn)


def status_name(status: int) -> str:
    """The stable name of a status number ("VMMW_OUT_OF_MEMORY")."""
    raw = function("vmmw_status_name")(status)
    return raw.decode() if raw else f"VMMW_STATUS_{status}"


def _raise(name: str, status: int, err: ctypes.c_void_p) -> None:
    message = "(no details)"
    driver_code = 0
    if err.value:
        raw = function("vmmw_error_message")(err)
        message = raw.decode("utf-8", "replace") if raw else message
        driver_code = function("vmmw_error_driver_code")(err)
        function("vmmw_error_free")(err)
    raise VmmwError(name, status, status_name(status), message, driver_code)


def call(name: str, *args: Any) -> None:
    """Call ``name(*args, &error)``; raise :class:`VmmwError` on failure."""
    err = ctypes.c_void_p()
    status = function(name)(*args, ctypes.byref(err))
    if status != OK:
        _raise(name, status, err)


def call_text(name: str, *args: Any) -> str:
    """Call a function with the buffer contract (``buf, cap, needed``) and
    return its text, growing the buffer as the library asks."""
    cap = 4096
    while True:
        buf = ctypes.create_string_buffer(cap)
        needed = ctypes.c_size_t()
        err = ctypes.c_void_p()
        status = function(name)(*args, buf, cap, ctypes.byref(needed), ctypes.byref(err))
        if status == BUFFER_TOO_SMALL and needed.value > cap:
            if err.value:
                function("vmmw_error_free")(err)
            cap = needed.value
            continue
        if status != OK:
            _raise(name, status, err)
        return buf.value.decode("utf-8")


def version() -> str:
    """The library's version ("MAJOR.MINOR.PATCH")."""
    return cast(bytes, function("vmmw_version_string")()).decode()
