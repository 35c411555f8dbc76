//! Testing hooks of the host backend: fault injection, a simulated memory
//! limit and live-object counts for leak checks.
//!
//! These are declared in `include/vmmweights_testing.h`, a separate header
//! generated from this file alone (`scripts/gen-header.sh`) and never
//! installed: release users do not see them, and docs/ABI.md leaves them out
//! of the stable ABI (they may change in any release). The symbols stay in
//! the library so the C, C++ and Go test suites can run against the same
//! build users get.

use super::boundary::{arg, call, call_out};
use super::device::vmmw_device_t;
use super::error::vmmw_error_t;
use super::status::vmmw_status_t;
use crate::driver::host::{FaultOp, HostDriver};
use crate::driver::testing::Testing;
use crate::error::{Error, Result};

/// A host-backend driver step that `vmmw_host_fail_nth` can make fail: one of
/// the `VMMW_FAULT_*` values.
pub type vmmw_fault_point_t = i32;

/// Host backend fault injection: the reserve primitive.
pub const VMMW_FAULT_RESERVE: vmmw_fault_point_t = 0;
/// Host backend fault injection: physical memory creation (fails as out-of-memory).
pub const VMMW_FAULT_CREATE: vmmw_fault_point_t = 1;
/// Host backend fault injection: the map primitive.
pub const VMMW_FAULT_MAP: vmmw_fault_point_t = 2;
/// Host backend fault injection: the set-access primitive.
pub const VMMW_FAULT_SET_ACCESS: vmmw_fault_point_t = 3;

/// Live objects of the host backend, for leak checks in tests.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct vmmw_host_counts_t {
    /// VA reservations not yet freed.
    pub reservations: u64,
    /// Physical handles not yet released.
    pub handles: u64,
    /// Mapped ranges.
    pub mappings: u64,
    /// Bytes of simulated device memory in use.
    pub physical_bytes: u64,
    /// Streams not yet destroyed.
    pub streams: u64,
    /// Events not yet destroyed.
    pub events: u64,
}

fn host(d: &vmmw_device_t) -> Result<&HostDriver> {
    d.driver().as_host().ok_or_else(|| {
        Error::Unsupported(format!(
            "host-backend test hooks need the host backend; this device is {}",
            d.driver().describe()
        ))
    })
}

/// Testing hook: set the host backend's simulated device memory to `bytes`.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` is NULL.
/// - `VMMW_UNSUPPORTED`: the CUDA backend.
///
/// # Safety
/// `device` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_host_set_memory_limit(
    device: *mut vmmw_device_t,
    bytes: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        host(d)?.set_memory_limit(bytes);
        Ok(())
    })
}

/// Testing hook: make the `n`-th next call of primitive `op` (a `VMMW_FAULT_*`
/// value) fail on the host backend; `n` = 0 clears it.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` is NULL.
/// - `VMMW_INVALID_ARGUMENT`: unknown `op`.
/// - `VMMW_UNSUPPORTED`: the CUDA backend.
///
/// # Safety
/// `device` is a live handle; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_host_fail_nth(
    device: *mut vmmw_device_t,
    op: vmmw_fault_point_t,
    n: u64,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call(error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        let op = match op {
            VMMW_FAULT_RESERVE => FaultOp::Reserve,
            VMMW_FAULT_CREATE => FaultOp::Create,
            VMMW_FAULT_MAP => FaultOp::Map,
            VMMW_FAULT_SET_ACCESS => FaultOp::SetAccess,
            other => {
                return Err(Error::InvalidArgument(format!(
                "fault op {other} is not one of VMMW_FAULT_RESERVE..VMMW_FAULT_SET_ACCESS (0..3)"
            )))
            }
        };
        host(d)?.fail_nth(op, n);
        Ok(())
    })
}

/// Testing hook: the host backend's live objects, for leak checks.
///
/// Errors:
/// - `VMMW_NULL_ARGUMENT`: `device` or `out` is NULL.
/// - `VMMW_UNSUPPORTED`: the CUDA backend.
///
/// # Safety
/// `device` is a live handle; `out` is writable; `error` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vmmw_host_counts(
    device: *const vmmw_device_t,
    out: *mut vmmw_host_counts_t,
    error: *mut *mut vmmw_error_t,
) -> vmmw_status_t {
    call_out(out, "out", error, || {
        // SAFETY: forwarded contract.
        let d = unsafe { arg(device, "device") }?;
        let c = host(d)?.counts();
        Ok(vmmw_host_counts_t {
            reservations: c.reservations as u64,
            handles: c.handles as u64,
            mappings: c.mappings as u64,
            physical_bytes: c.physical_bytes,
            streams: c.streams as u64,
            events: c.events as u64,
        })
    })
}
