//! A pool's memory report and timeline of snapshots, from C: `vmmw_report_t`
//! sums, and the JSON forms of the report and the timeline.

use std::ffi::c_char;

use super::boundary::{arg, call, call_out, str_arg};
use super::buffer::write_str;
use super::error::vmmw_error_t;
use super::pool::vmmw_pool_t;
use super::status::vmmw_status_t;
use crate::report::TagUsage;
use crate::tag::TagId;

/// A pool's memory, for all tags or one. The four quantities are kept apart:
/// live (blocks held), reserved (VA), tracked (physically backed) and the
/// device's used memory (every process).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vmmw_report_t {
    /// Bytes of blocks held by callers.
    pub live_bytes: u64,
    /// Number of blocks held by callers.
    pub live_blocks: u64,
    /// Bytes of VA reserved by the pool's segments.
    pub reserved_bytes: u64,
    /// Bytes physically backed now.
    pub tracked_bytes: u64,
    /// Number of segments.
    pub segments: u64,
    /// Committed bytes of awake segments.
    pub awake_bytes: u64,
    /// Committed bytes asleep with a host backup.
    pub offloaded_bytes: u64,
    /// Committed bytes asleep with contents dropped.
    pub discarded_bytes: u64,
    /// Committed bytes asleep, to be reloaded from their checkpoint.
    pub reloadable_bytes: u64,
    /// Host memory holding backups.
    pub host_backup_bytes: u64,
    /// The device's used memory (total - free, every process); 0 when unknown.
    pub device_used_bytes: u64,
    /// The device's total memory; 0 when unknown.
    pub device_total_bytes: u64,
    /// 1 when the tag (for the total: any tag) is asleep, else 0.
    pub asleep: u32,
    /// Number of tags with an entry in the report.
    pub tags: u32,
}

fn to_c_report(u: &TagUsage, used: Option<u64>, total: Option<u64>, tags: usize) -> vmmw_report_t {
    vmmw_report_t {
        live_bytes: u.live_bytes,
        live_blocks: u.live_blocks,
        reserved_bytes: u.reserved_bytes,
        tracked_bytes: u.tracked_bytes,
        segments: u.segments,
        awake_bytes: u.awake_bytes,
        offloaded_bytes: u.offloaded_bytes,
        discarded_bytes: u.discarded_bytes,
        reloadable_bytes: u.reloadable_bytes,
        host_backup_bytes: u.host_backup_bytes,
        device_used_bytes: used.unwrap_or(0),
        device_total_bytes: total.unwrap_or(0),
        asleep: u32::from(u.asleep),
        tags: u32::try_from(tags).unwrap_or(u32::MAX),
    }
}

/// The pool's memory summed over all tags.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_report(
    pool: *const vmmw_pool_t,
    out: *mut vmmw_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let r = unsafe { arg(pool, "pool") }?.pool.report();
        Ok(to_c_report(
            &r.total,
            r.device_used_bytes,
            r.device_total_bytes,
            r.tags.len(),
        ))
    })
}

/// The pool's memory of one tag (all zero when the tag has nothing in this
/// pool; `tags` is then 0, else 1).
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `out` is NULL.
/// - `VMMW_UNKNOWN_TAG`: `tag` is an unregistered id.
///
/// # Safety
/// `pool` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_report_tag(
    pool: *const vmmw_pool_t,
    tag: u32,
    out: *mut vmmw_report_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        crate::tag::check(TagId(tag))?;
        let r = p.pool.report();
        let name = crate::tag::name_of(TagId(tag));
        Ok(match r.tag(&name) {
            Some(u) => to_c_report(u, r.device_used_bytes, r.device_total_bytes, 1),
            None => to_c_report(
                &TagUsage::new(&name),
                r.device_used_bytes,
                r.device_total_bytes,
                0,
            ),
        })
    })
}

/// The full memory report (per tag and total) as JSON, into `buf` (the buffer
/// contract of `vmmw_device_describe`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// `pool` is a live handle; `buf` is NULL or writable for `cap` bytes;
/// `needed` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_report_json(
    pool: *const vmmw_pool_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let json = unsafe { arg(pool, "pool") }?.pool.report().to_json();
        // SAFETY: forwarded contract.
        unsafe { write_str(&json, buf, cap, needed) }
    })
}

/// Record the current report in the pool's timeline as boundary `name`
/// ("after load", "asleep", ...). The timeline keeps the last 1024
/// boundaries (older ones are dropped and counted in its JSON as `dropped`);
/// `vmmw_pool_clear_timeline` empties it.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` or `name` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: `name` is not UTF-8 or is over 256 bytes.
///
/// # Safety
/// `pool` is a live handle; `name` is a NUL-terminated string; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_snapshot(
    pool: *mut vmmw_pool_t,
    name: *const c_char,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let p = unsafe { arg(pool, "pool") }?;
        // SAFETY: forwarded contract.
        let name = unsafe { str_arg(name, "name") }?;
        crate::report::check_snapshot_name(name)?;
        p.pool.snapshot(name);
        Ok(())
    })
}

/// Every snapshot so far as JSON, into `buf` (buffer contract as `vmmw_pool_report_json`).
///
/// Errors (the last two are the buffer contract):
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
/// - `VMMW_BUFFER_TOO_SMALL`: `cap` is short; `*needed` is set, nothing is
///   written to `buf`.
/// - `VMMW_NULL_ARGUMENT`: `buf` is NULL and `cap` > 0; nothing is written.
///
/// # Safety
/// As `vmmw_pool_report_json`.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_timeline_json(
    pool: *const vmmw_pool_t,
    buf: *mut c_char,
    cap: usize,
    needed: *mut usize,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let json = unsafe { arg(pool, "pool") }?.pool.timeline().to_json();
        // SAFETY: forwarded contract.
        unsafe { write_str(&json, buf, cap, needed) }
    })
}

/// Forget every snapshot of the pool's timeline; `*cleared` (NULL: not
/// written) receives how many were kept. Thread-safe.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `pool` is NULL.
///
/// # Safety
/// `pool` is a live handle; `cleared` and `error` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_pool_clear_timeline(
    pool: *mut vmmw_pool_t,
    cleared: *mut u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let n = unsafe { arg(pool, "pool") }?.pool.clear_timeline() as u64;
        // SAFETY: forwarded contract (`cleared` NULL or writable).
        if let Some(c) = unsafe { cleared.as_mut() } {
            *c = n;
        }
        Ok(())
    })
}
