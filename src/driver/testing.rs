//! Test hooks reachable from a `&dyn Driver`, kept out of the [`Driver`]
//! trait so that the trait holds only what production code uses: the host
//! backend behind a driver (limits, counts, peers) and the fault-injection
//! table both backends carry, which tests arm and the loader's file reads
//! check.
//!
//! Bring [`Testing`] into scope to call them on a `dyn Driver`.

use std::any::Any;

use super::cuda::CudaDriver;
use super::fault::{injected_read, FaultOp, Faults};
use super::host::HostDriver;
use super::Driver;

/// Test hooks on any driver.
pub trait Testing {
    /// The host backend, when this is one (for limits, counts and peers in tests).
    fn as_host(&self) -> Option<&HostDriver>;

    /// This driver's fault-injection table, when it has one (both backends
    /// do). Tests arm it; the driver and the loader's file reads check it
    /// before each step. Unarmed, each check is one atomic load.
    fn faults(&self) -> Option<&Faults>;
}

// A `dyn Driver` upcasts to `dyn Any` (`Driver: Any`), so the concrete
// backend behind it is one downcast away.
impl Testing for dyn Driver {
    fn as_host(&self) -> Option<&HostDriver> {
        (self as &dyn Any).downcast_ref()
    }

    fn faults(&self) -> Option<&Faults> {
        let any: &dyn Any = self;
        if let Some(h) = any.downcast_ref::<HostDriver>() {
            return Some(h.faults());
        }
        any.downcast_ref::<CudaDriver>().map(CudaDriver::faults)
    }
}

/// Count one file read against `driver`'s fault table; an error when it must fail.
#[inline]
pub fn file_read(driver: &dyn Driver) -> std::io::Result<()> {
    match driver.faults() {
        Some(f) if f.take(FaultOp::FileRead) => Err(injected_read()),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::driver::host::HostConfig;

    #[test]
    fn a_host_driver_behind_dyn_is_found() {
        let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig::default()));
        let host = d
            .as_host()
            .expect("the host backend is found behind dyn Driver");
        assert!(std::ptr::eq(
            host as *const HostDriver as *const u8,
            Arc::as_ptr(&d) as *const u8
        ));
        let f = d.faults().expect("the host backend has a fault table");
        assert!(std::ptr::eq(f, host.faults()));
    }
}
