"""ctypes mirrors of the C structs in include/vmmweights.h.

The header is generated from the Rust sources; python/tests/test_structs.py
parses it and fails when a field here differs in name, type or order.
"""

from __future__ import annotations

import ctypes

MAX_DIMS = 8

u32, i32, u64, u8, f64 = ctypes.c_uint32, ctypes.c_int32, ctypes.c_uint64, ctypes.c_uint8, ctypes.c_double


class _Sized(ctypes.Structure):
    """An options struct whose first field `size` is its own size, so the
    library knows which version of the struct it was given."""

    def __init__(self, **fields: object) -> None:
        super().__init__(size=ctypes.sizeof(self), **fields)


class LoadOptions(_Sized):
    """vmmw_load_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("allow_missing", u32),
        ("allow_unexpected", u32),
        ("strategy", i32),
        ("threads", u32),
        ("window_bytes", u64),
        ("slot_bytes", u64),
    ]


class Destination(ctypes.Structure):
    """vmmw_destination_t"""

    _fields_ = [
        ("ptr", u64),
        ("bytes", u64),
        ("dtype", ctypes.c_char * 16),
        ("ndim", u32),
        ("shape", u64 * MAX_DIMS),
    ]


class PlanSummary(ctypes.Structure):
    """vmmw_plan_summary_t"""

    _fields_ = [
        ("extents", u64),
        ("fills", u64),
        ("src_bytes", u64),
        ("dst_bytes", u64),
        ("sources", u64),
        ("skipped", u64),
        ("missing", u64),
        ("unexpected", u64),
        ("destinations", u64),
    ]


class LoadResult(ctypes.Structure):
    """vmmw_load_result_t"""

    _fields_ = [
        ("bytes", u64),
        ("seconds", f64),
        ("gbps", f64),
        ("direct_bytes", u64),
        ("staged_bytes", u64),
        ("read_bytes", u64),
        ("filled_bytes", u64),
        ("threads", u32),
    ]


class PackOptions(_Sized):
    """vmmw_pack_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("frame_bytes", u64),
        ("threads", u32),
        ("cpu", u32),
        ("force", u32),
        ("device", i32),
    ]


class PackReport(ctypes.Structure):
    """vmmw_pack_report_t"""

    _fields_ = [
        ("original_bytes", u64),
        ("packed_bytes", u64),
        ("files", u64),
        ("tensors", u64),
        ("seconds", f64),
        ("sync_seconds", f64),
    ]


class PoolOptions(_Sized):
    """vmmw_pool_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("device_handle", ctypes.c_void_p),
        ("backend", i32),
        ("device", i32),
        ("align", u64),
        ("small_request_max", u64),
        ("small_segment_bytes", u64),
        ("large_segment_bytes", u64),
        ("chunk_bytes", u64),
    ]


class TagPolicy(ctypes.Structure):
    """vmmw_tag_policy_t"""

    _fields_ = [("tag", u32), ("policy", i32)]


class SleepOptions(_Sized):
    """vmmw_sleep_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("copy_piece_bytes", u64),
        ("streams", u32),
        ("debug_fill", u32),
        ("wake_coalesce_bytes", u64),
        ("backup_slab_bytes", u64),
        ("host_memory_limit", u64),
        ("free_backup_after_wake", u32),
        ("release_pinned_after_wake", u32),
        ("debug_fill_byte", u8),
        ("codec_element_bytes", u32),
    ]


class MultiResult(ctypes.Structure):
    """vmmw_multi_result_t"""

    _fields_ = [
        ("host_bytes", u64),
        ("peer_bytes", u64),
        ("delivered_bytes", u64),
        ("seconds", f64),
        ("host_seconds", f64),
        ("peer_seconds", f64),
        ("gbps", f64),
        ("recovered_devices", u32),
    ]


class ReplicaWakeOptions(_Sized):
    """vmmw_replica_wake_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("copy_piece_bytes", u64),
        ("no_peer_copies", i32),
    ]


class ReplicaSleepOptions(_Sized):
    """vmmw_replica_sleep_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("holder_policy", i32),
    ]


class ReplicaSleepResult(ctypes.Structure):
    """vmmw_replica_sleep_result_t"""

    _fields_ = [("backup_bytes", u64), ("released_bytes", u64), ("seconds", f64)]


class ReplicaWakeResult(ctypes.Structure):
    """vmmw_replica_wake_result_t"""

    _fields_ = [
        ("host_bytes", u64),
        ("peer_bytes", u64),
        ("delivered_bytes", u64),
        ("seconds", f64),
        ("map_seconds", f64),
        ("host_seconds", f64),
        ("peer_seconds", f64),
        ("gbps", f64),
        ("direct_pairs", u32),
    ]


class ShareOptions(_Sized):
    """vmmw_share_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("sleep_policy", i32),
        ("allow_write", u32),
        ("use_allowed_uid", u32),
        ("allowed_uid", u32),
        ("use_allowed_gid", u32),
        ("allowed_gid", u32),
        ("max_connections", u32),
        ("handshake_timeout_ms", u32),
    ]


#: C struct name -> its ctypes mirror (for the drift test).
class UpdateOptions(_Sized):
    """vmmw_update_options_t"""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("expected_version", u64),
        ("tag_set", u32),
        ("tag", u32),
        ("allow_missing", u32),
        ("allow_unexpected", u32),
        ("staging", i32),
    ]


class UpdateResult(ctypes.Structure):
    """vmmw_update_result_t"""

    _fields_ = [
        ("tag", u32),
        ("staged", u32),
        ("retried", u32),
        ("version", u64),
        ("bytes", u64),
        ("destinations", u64),
        ("copies", u64),
        ("seconds", f64),
        ("gbps", f64),
        ("plan_seconds", f64),
        ("issue_seconds", f64),
        ("wait_seconds", f64),
        ("bookkeeping_seconds", f64),
    ]


class BroadcastLoadResult(ctypes.Structure):
    """vmmw_broadcast_load_result_t"""

    _fields_ = [
        ("update", UpdateResult),
        ("buckets", u64),
        ("bytes", u64),
        ("files_read", u64),
        ("bytes_read", u64),
    ]


class SendReport(ctypes.Structure):
    """vmmw_send_report_t"""

    _fields_ = [
        ("version", u64),
        ("buckets", u64),
        ("bytes", u64),
        ("setup_seconds", f64),
        ("seconds", f64),
    ]


class ReceiveStats(ctypes.Structure):
    """vmmw_receive_stats_t"""

    _fields_ = [
        ("direct", u32),
        ("attached", u32),
        ("reused", u32),
        ("chunks", u64),
        ("setup_seconds", f64),
        ("seconds", f64),
        ("kept_imports", u64),
        ("kept_bytes", u64),
    ]


class ControlResult(ctypes.Structure):
    """vmmw_control_result_t"""

    _fields_ = [
        ("seconds", f64),
        ("sync_seconds", f64),
        ("wait_seconds", f64),
        ("bytes", u64),
        ("backup_bytes", u64),
    ]


class WakeOptions(_Sized):
    """vmmw_wake_options_t"""

    _fields_ = [("size", ctypes.c_size_t), ("wait_memory_ms", u64)]


class SwapOptions(_Sized):
    """vmmw_swap_options_t"""

    _fields_ = [("size", ctypes.c_size_t), ("wait_memory_ms", u64)]


class SwapResult(ctypes.Structure):
    """vmmw_swap_result_t"""

    _fields_ = [
        ("sleep_status", i32),
        ("wake_status", i32),
        ("slept_tags", u64),
        ("woken_tags", u64),
        ("released_bytes", u64),
        ("mapped_bytes", u64),
        ("copied_out_bytes", u64),
        ("copied_in_bytes", u64),
        ("sleep_seconds", ctypes.c_double),
        ("wake_seconds", ctypes.c_double),
        ("seconds", ctypes.c_double),
    ]


ALL = {
    "vmmw_load_options_t": LoadOptions,
    "vmmw_destination_t": Destination,
    "vmmw_plan_summary_t": PlanSummary,
    "vmmw_load_result_t": LoadResult,
    "vmmw_pool_options_t": PoolOptions,
    "vmmw_tag_policy_t": TagPolicy,
    "vmmw_sleep_options_t": SleepOptions,
    "vmmw_multi_result_t": MultiResult,
    "vmmw_replica_wake_options_t": ReplicaWakeOptions,
    "vmmw_replica_sleep_options_t": ReplicaSleepOptions,
    "vmmw_replica_sleep_result_t": ReplicaSleepResult,
    "vmmw_replica_wake_result_t": ReplicaWakeResult,
    "vmmw_share_options_t": ShareOptions,
    "vmmw_update_options_t": UpdateOptions,
    "vmmw_update_result_t": UpdateResult,
    "vmmw_broadcast_load_result_t": BroadcastLoadResult,
    "vmmw_send_report_t": SendReport,
    "vmmw_receive_stats_t": ReceiveStats,
    "vmmw_control_result_t": ControlResult,
    "vmmw_wake_options_t": WakeOptions,
    "vmmw_swap_options_t": SwapOptions,
    "vmmw_swap_result_t": SwapResult,
}

PROGRESS_FN = ctypes.CFUNCTYPE(i32, u64, u64, ctypes.c_void_p)
