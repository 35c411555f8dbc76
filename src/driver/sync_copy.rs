//! Synchronous copies between host bytes and device memory on the default
//! stream: the one helper every slow path (C read/write, checks, benchmarks'
//! verification) uses instead of pairing an async copy with a synchronize.

use super::{DevicePtr, Driver, StreamId};
use crate::error::Result;

/// Copy host bytes to device memory and wait for the copy.
///
/// # Safety
/// `[dst, dst + src.len())` must be mapped, accessible device memory that no
/// other thread unmaps during the call.
pub unsafe fn copy_to_device(driver: &dyn Driver, dst: DevicePtr, src: &[u8]) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // SAFETY: `src` is a live slice (pageable host memory; the call below
    // waits for the copy); `dst` is mapped per this function's contract.
    unsafe { driver.copy_htod_async(dst, src.as_ptr(), src.len(), StreamId::DEFAULT) }?;
    driver.stream_synchronize(StreamId::DEFAULT)
}

/// Copy device memory to host bytes and wait for the copy.
///
/// # Safety
/// As [`copy_to_device`] for `[src, src + dst.len())`.
pub unsafe fn copy_to_host(driver: &dyn Driver, dst: &mut [u8], src: DevicePtr) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // SAFETY: `dst` is a live, exclusive slice kept until the synchronize
    // below; `src` is mapped per this function's contract.
    unsafe { driver.copy_dtoh_async(dst.as_mut_ptr(), src, dst.len(), StreamId::DEFAULT) }?;
    driver.stream_synchronize(StreamId::DEFAULT)
}
