//! Opening the CUDA backend: load libcuda, initialise it, check the driver
//! version and the device's VMM support, retain the primary context, and
//! look devices up by ordinal.

use std::sync::atomic::AtomicBool;
use std::sync::OnceLock;

use cudarc::driver::sys;

use super::{cu, CudaDriver};
use crate::error::{Error, Result};

/// The oldest driver API version with the VMM calls (CUDA 10.2).
pub const MIN_DRIVER_VERSION: i32 = 10020;

fn unavailable(what: impl Into<String>) -> Error {
    Error::DriverUnavailable(what.into())
}

/// Whether to create exportable memory: the device supports POSIX file-descriptor
/// handles and `VMMW_CUDA_SHAREABLE` is not `0` (an escape hatch for drivers or
/// containers that refuse the handle type).
fn shareable_wanted(dev: sys::CUdevice) -> bool {
    if std::env::var("VMMW_CUDA_SHAREABLE").is_ok_and(|v| v.trim() == "0") {
        return false;
    }
    cu::device_get_attribute(
        dev,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    )
    .is_ok_and(|supported| supported != 0)
}

impl CudaDriver {
    /// Open `device`: load libcuda, initialise it, check the driver version and
    /// VMM support, and retain the primary context. Any failure is a typed
    /// error (`DriverUnavailable` when there is no usable driver or device).
    pub fn open(device: i32) -> Result<CudaDriver> {
        // cudarc panics when a symbol is missing; the library itself is checked
        // first, and any remaining panic becomes an error, never an abort.
        match std::panic::catch_unwind(|| CudaDriver::open_inner(device)) {
            Ok(r) => r,
            Err(p) => Err(unavailable(format!(
                "loading the CUDA driver failed: {}",
                crate::error::panic_message(&*p)
            ))),
        }
    }

    fn open_inner(ordinal: i32) -> Result<CudaDriver> {
        if !cu::is_culib_present() {
            return Err(unavailable(
                "libcuda.so was not found (no NVIDIA driver installed)",
            ));
        }
        match cu::init() {
            Err(e) if e.rc() == sys::CUresult::CUDA_ERROR_NO_DEVICE => {
                return Err(unavailable("the NVIDIA driver reports no CUDA device"));
            }
            r => r.map_err(|e| unavailable(Error::from(e).to_string()))?,
        }
        let version = cu::driver_get_version()?;
        if version < MIN_DRIVER_VERSION {
            return Err(unavailable(format!(
                "driver supports CUDA {}.{}, the VMM API needs {}.{} or newer",
                version / 1000,
                (version % 1000) / 10,
                MIN_DRIVER_VERSION / 1000,
                (MIN_DRIVER_VERSION % 1000) / 10
            )));
        }
        let count = cu::device_get_count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(unavailable(format!(
                "device {ordinal} requested, the driver sees {count} device(s)"
            )));
        }
        let dev = cu::device_get(ordinal)?;
        let vmm = cu::device_get_attribute(
            dev,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        )?;
        if vmm == 0 {
            return Err(unavailable(format!(
                "device {ordinal} does not support virtual memory management"
            )));
        }
        let name = cu::device_get_name(dev)?;
        // Released in Drop.
        let ctx = cu::device_primary_ctx_retain(dev)?;
        let mut d = CudaDriver {
            ordinal,
            cu_device: dev,
            ctx,
            name,
            driver_version: version,
            granularity: 0,
            shareable: AtomicBool::new(shareable_wanted(dev)),
            kernels: OnceLock::new(),
            hash_kernel: OnceLock::new(),
            codec_kernels: OnceLock::new(),
            registered: Default::default(),
            faults: Default::default(),
        };
        d.bind()?;
        let g = cu::mem_get_allocation_granularity(dev, d.shareable_now())?;
        d.granularity = g.max(1);
        Ok(d)
    }

    /// The `CUdevice` of ordinal `ordinal`; an error naming the device count
    /// when there is no such device.
    pub(super) fn cu_device_of(ordinal: i32) -> Result<sys::CUdevice> {
        let count = cu::device_get_count()?;
        if !(0..count).contains(&ordinal) {
            return Err(Error::InvalidArgument(format!(
                "device {ordinal} does not exist: the driver reports {count} devices"
            )));
        }
        Ok(cu::device_get(ordinal)?)
    }
}
