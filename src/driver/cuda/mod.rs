//! The CUDA backend: the real driver API through cudarc's `sys` layer, loaded
//! at run time, so the crate builds and runs on machines without CUDA.
//!
//! Feature level: the bindings are those of CUDA 11.4 (cudarc's oldest), and
//! the calls used exist since CUDA 10.2 (the VMM API); `open` checks the
//! driver version and the device's VMM attribute and reports a typed error
//! when either is missing. The device's primary context is retained once and
//! made current in every entry point, since callers arrive on any thread.

use std::ffi::{c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use cudarc::driver::sys;

mod range_hash;
mod structs;

use super::fault::{FaultOp, Faults};
use super::{
    kernels, AccessMode, BackendKind, ConvertType, DevicePtr, Driver, EventId, MemInfo, PeerAccess,
    PhysHandle, StreamId,
};
use crate::error::{Error, Result};

/// The oldest driver API version with the VMM calls (CUDA 10.2).
pub const MIN_DRIVER_VERSION: i32 = 10020;

/// The real CUDA driver for one device.
#[derive(Debug)]
pub struct CudaDriver {
    ordinal: i32,
    cu_device: sys::CUdevice,
    ctx: Ctx,
    name: String,
    driver_version: i32,
    granularity: usize,
    /// Physical memory is created exportable as a POSIX file descriptor; see `shareable_wanted`.
    shareable: AtomicBool,
    kernels: OnceLock<std::result::Result<Kernels, String>>,
    hash_kernel: OnceLock<std::result::Result<range_hash::HashKernel, String>>,
    /// Host ranges this driver page-locked and has not unlocked (by start
    /// address). Drop unlocks them: registrations belong to the primary
    /// context, which outlives this driver when another retains it, and a
    /// buffer cached past its driver (the staging ring) cannot unlock itself;
    /// a range left locked makes the next registration of its addresses fail.
    registered: std::sync::Mutex<std::collections::HashSet<usize>>,
    /// Failures armed by tests (never outside them); see [`super::fault`].
    faults: Faults,
}

/// Whether to create exportable memory: the device supports POSIX file-descriptor
/// handles and `VMMW_CUDA_SHAREABLE` is not `0` (an escape hatch for drivers or
/// containers that refuse the handle type).
fn shareable_wanted(dev: sys::CUdevice) -> bool {
    if std::env::var("VMMW_CUDA_SHAREABLE").is_ok_and(|v| v.trim() == "0") {
        return false;
    }
    let mut supported = 0;
    // SAFETY: writes one int for a valid device.
    let rc = unsafe {
        sys::cuDeviceGetAttribute(
            &mut supported,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            dev,
        )
    };
    rc == sys::CUresult::CUDA_SUCCESS && supported != 0
}

/// The retained primary context.
#[derive(Debug, Clone, Copy)]
struct Ctx(sys::CUcontext);
// SAFETY: a CUcontext handle may be used from any thread (the driver API is
// thread-safe); we only pass it to cuCtxSetCurrent and never dereference it.
unsafe impl Send for Ctx {}
// SAFETY: as above; the handle is immutable after `open`.
unsafe impl Sync for Ctx {}

/// The loaded conversion module and its functions, in `kernels::PAIRS` order.
#[derive(Debug)]
struct Kernels {
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
}
// SAFETY: module and function handles are context-bound driver objects usable
// from any thread once the context is current; we never dereference them.
unsafe impl Send for Kernels {}
// SAFETY: as above; immutable after loading.
unsafe impl Sync for Kernels {}

fn error_name(code: sys::CUresult) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it NULL.
    let rc = unsafe { sys::cuGetErrorName(code, &mut p) };
    if rc == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
        // SAFETY: the driver returned a valid NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    }
}

fn check(call: &'static str, rc: sys::CUresult) -> Result<()> {
    check_with(call, rc, String::new)
}

fn check_with(
    call: &'static str,
    rc: sys::CUresult,
    detail: impl FnOnce() -> String,
) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let d = detail();
    Err(Error::Driver {
        call,
        code: rc as i32,
        name: error_name(rc),
        detail: if d.is_empty() { d } else { format!(": {d}") },
    })
}

fn unavailable(what: impl Into<String>) -> Error {
    Error::DriverUnavailable(what.into())
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
        // SAFETY: only tries to dlopen the library; no other preconditions.
        if !unsafe { sys::is_culib_present() } {
            return Err(unavailable(
                "libcuda.so was not found (no NVIDIA driver installed)",
            ));
        }
        // SAFETY: cuInit(0) is always valid to call once the library is loaded.
        let rc = unsafe { sys::cuInit(0) };
        if rc == sys::CUresult::CUDA_ERROR_NO_DEVICE {
            return Err(unavailable("the NVIDIA driver reports no CUDA device"));
        }
        check("cuInit", rc).map_err(|e| unavailable(e.to_string()))?;
        let mut version = 0;
        // SAFETY: writes one int.
        check("cuDriverGetVersion", unsafe {
            sys::cuDriverGetVersion(&mut version)
        })?;
        if version < MIN_DRIVER_VERSION {
            return Err(unavailable(format!(
                "driver supports CUDA {}.{}, the VMM API needs {}.{} or newer",
                version / 1000,
                (version % 1000) / 10,
                MIN_DRIVER_VERSION / 1000,
                (MIN_DRIVER_VERSION % 1000) / 10
            )));
        }
        let mut count = 0;
        // SAFETY: writes one int.
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        if ordinal < 0 || ordinal >= count {
            return Err(unavailable(format!(
                "device {ordinal} requested, the driver sees {count} device(s)"
            )));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice for a valid ordinal.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        let mut vmm = 0;
        // SAFETY: writes one int for a valid device.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(
                &mut vmm,
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
                dev,
            )
        })?;
        if vmm == 0 {
            return Err(unavailable(format!(
                "device {ordinal} does not support virtual memory management"
            )));
        }
        let mut name_buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer holds 256 bytes and the driver NUL-terminates within it.
        check("cuDeviceGetName", unsafe {
            sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev)
        })?;
        // SAFETY: NUL-terminated by the driver (checked call above).
        let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: retains the primary context of a valid device; released in Drop.
        check("cuDevicePrimaryCtxRetain", unsafe {
            sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
        })?;
        let mut d = CudaDriver {
            ordinal,
            cu_device: dev,
            ctx: Ctx(ctx),
            name,
            driver_version: version,
            granularity: 0,
            shareable: AtomicBool::new(shareable_wanted(dev)),
            kernels: OnceLock::new(),
            hash_kernel: OnceLock::new(),
            registered: Default::default(),
            faults: Faults::default(),
        };
        d.bind()?;
        let prop = d.alloc_prop();
        let mut g = 0usize;
        // SAFETY: prop is a fully initialised allocation property; writes one usize.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        d.granularity = g.max(1);
        Ok(d)
    }

    /// The CUDA driver version as an integer (13000 for CUDA 13.0).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// Make the primary context current on the calling thread.
    fn bind(&self) -> Result<()> {
        // SAFETY: the context was retained in `open` and stays alive until Drop.
        check("cuCtxSetCurrent", unsafe {
            sys::cuCtxSetCurrent(self.ctx.0)
        })
    }

    /// The `CUdevice` of ordinal `ordinal`; an error naming the device count
    /// when there is no such device.
    fn cu_device_of(ordinal: i32) -> Result<sys::CUdevice> {
        let mut count = 0;
        // SAFETY: writes one int; the library is initialised (we hold a context).
        check("cuDeviceGetCount", unsafe {
            sys::cuDeviceGetCount(&mut count)
        })?;
        if !(0..count).contains(&ordinal) {
            return Err(Error::InvalidArgument(format!(
                "device {ordinal} does not exist: the driver reports {count} devices"
            )));
        }
        let mut dev: sys::CUdevice = 0;
        // SAFETY: writes one CUdevice for a valid ordinal.
        check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        Ok(dev)
    }

    fn alloc_prop(&self) -> sys::CUmemAllocationProp {
        structs::alloc_prop(self.cu_device, self.shareable.load(Ordering::Relaxed))
    }

    fn kernels(&self) -> Result<&Kernels> {
        let loaded = self.kernels.get_or_init(|| {
            let ptx = kernels::ptx();
            let mut module: sys::CUmodule = std::ptr::null_mut();
            // SAFETY: the context is current (callers bind first); the image is a
            // NUL-terminated PTX string that outlives the call.
            let rc = unsafe { sys::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void) };
            check("cuModuleLoadData", rc).map_err(|e| e.to_string())?;
            let mut functions = Vec::new();
            for (from, to) in kernels::PAIRS {
                let name = std::ffi::CString::new(kernels::kernel_name(from, to))
                    .map_err(|e| e.to_string())?;
                let mut f: sys::CUfunction = std::ptr::null_mut();
                // SAFETY: module was loaded above; name is NUL-terminated.
                let rc = unsafe { sys::cuModuleGetFunction(&mut f, module, name.as_ptr()) };
                check("cuModuleGetFunction", rc).map_err(|e| e.to_string())?;
                functions.push(f);
            }
            Ok(Kernels { module, functions })
        });
        loaded.as_ref().map_err(|e| Error::Driver {
            call: "cuModuleLoadData",
            code: -1,
            name: "conversion kernels failed to load".into(),
            detail: format!(": {e}"),
        })
    }

    /// `cuMemAlloc`: the classic allocator (what `cudaMalloc` calls), kept as
    /// the baseline the VMM path is benchmarked against. Not part of the
    /// [`Driver`] trait: nothing in the library allocates this way.
    pub fn legacy_alloc(&self, size: usize) -> Result<DevicePtr> {
        self.bind()?;
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        let rc = unsafe { sys::cuMemAlloc_v2(&mut p, size) };
        if rc == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let free = self.mem_info().map(|m| m.free).unwrap_or(0);
            return Err(Error::OutOfMemory {
                what: format!("cuMemAlloc of {size} bytes"),
                requested: size as u64,
                free,
            });
        }
        check_with("cuMemAlloc", rc, || format!("{size} bytes"))?;
        Ok(p)
    }

    /// `cuMemFree` of a pointer from [`CudaDriver::legacy_alloc`].
    pub fn legacy_free(&self, ptr: DevicePtr) -> Result<()> {
        self.bind()?;
        // SAFETY: the pointer came from legacy_alloc and is freed once (caller's contract);
        // a wrong pointer is reported by the driver as an error, not undefined behaviour.
        check_with("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) }, || {
            format!("{ptr:#x}")
        })
    }

    /// `cuMemSetAccess` for this device alone with `mode` (read-write or read-only).
    fn set_access_mode(&self, va: DevicePtr, size: usize, mode: AccessMode) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::SetAccess, "cuMemSetAccess")?;
        let desc = structs::access_desc(self.cu_device, mode);
        // SAFETY: one valid descriptor; the range is mapped (caller's contract).
        check_with(
            "cuMemSetAccess",
            unsafe { sys::cuMemSetAccess(va, size, &desc, 1) },
            || format!("{size} bytes at {va:#x}"),
        )
    }

    fn registered_ranges(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<usize>> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream(s: StreamId) -> sys::CUstream {
        s.0 as usize as sys::CUstream
    }
}

impl Driver for CudaDriver {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn device(&self) -> i32 {
        self.ordinal
    }

    fn describe(&self) -> String {
        format!(
            "{} (cuda, device {}, driver API {}.{}, {} MiB granularity)",
            self.name,
            self.ordinal,
            self.driver_version / 1000,
            (self.driver_version % 1000) / 10,
            self.granularity >> 20
        )
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&self, size: usize, alignment: usize) -> Result<DevicePtr> {
        self.bind()?;
        self.faults.check(FaultOp::Reserve, "cuMemAddressReserve")?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: writes one device pointer; no address hint, no flags.
        let rc = unsafe { sys::cuMemAddressReserve(&mut va, size, alignment, 0, 0) };
        check_with("cuMemAddressReserve", rc, || format!("{size} bytes"))?;
        Ok(va)
    }

    fn free_va(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: va/size name a reservation made by `reserve` (the caller's contract).
        check_with(
            "cuMemAddressFree",
            unsafe { sys::cuMemAddressFree(va, size) },
            || format!("{va:#x} (+{size})"),
        )
    }

    fn create(&self, size: usize) -> Result<PhysHandle> {
        self.bind()?;
        if self.faults.take(FaultOp::Create) {
            // As the host backend: an injected create fails as out of memory.
            return Err(Error::OutOfMemory {
                what: format!("physical allocation of {size} bytes (cuMemCreate, injected)"),
                requested: size as u64,
                free: self.mem_info().map(|m| m.free).unwrap_or(0),
            });
        }
        let prop = self.alloc_prop();
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: prop is fully initialised; writes one handle.
        let mut rc = unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) };
        let refused = [
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        ];
        if refused.contains(&rc) && self.shareable.swap(false, Ordering::Relaxed) {
            // The driver refuses exportable memory here: keep working, unshareable.
            let prop = self.alloc_prop();
            // SAFETY: as above.
            rc = unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) };
        }
        if rc == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            let free = self.mem_info().map(|m| m.free).unwrap_or(0);
            return Err(Error::OutOfMemory {
                what: format!("physical allocation of {size} bytes (cuMemCreate)"),
                requested: size as u64,
                free,
            });
        }
        check_with("cuMemCreate", rc, || format!("{size} bytes"))?;
        Ok(PhysHandle(h))
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Release, "cuMemRelease")?;
        // SAFETY: the handle came from `create` and is released once (caller's contract).
        check("cuMemRelease", unsafe { sys::cuMemRelease(handle.0) })
    }

    fn map(&self, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Map, "cuMemMap")?;
        // SAFETY: va lies in a reservation of ours and handle is live (caller's contract).
        check_with(
            "cuMemMap",
            unsafe { sys::cuMemMap(va, size, 0, handle.0, 0) },
            || format!("{size} bytes at {va:#x}"),
        )
    }

    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_mode(va, size, AccessMode::ReadWrite)
    }

    fn shareable(&self) -> bool {
        self.shareable.load(Ordering::Relaxed)
    }

    fn export_fd(&self, handle: PhysHandle) -> Result<OwnedFd> {
        if !self.shareable() {
            return Err(Error::Unsupported(
                "exporting physical memory: this device's memory is not created shareable \
                 (no POSIX file-descriptor handle support, or VMMW_CUDA_SHAREABLE=0)"
                    .into(),
            ));
        }
        self.bind()?;
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: for the POSIX handle type the driver writes one int; the handle
        // is live (caller's contract).
        let rc = unsafe {
            sys::cuMemExportToShareableHandle(
                &mut fd as *mut std::ffi::c_int as *mut c_void,
                handle.0,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        };
        check("cuMemExportToShareableHandle", rc)?;
        // SAFETY: a fresh descriptor the driver made for us; nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: fd is open; sets close-on-exec so children do not inherit VRAM.
        unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
        Ok(fd)
    }

    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<PhysHandle> {
        self.bind()?;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: the POSIX handle type takes the descriptor's number cast to a
        // pointer; the driver does not take ownership (`fd` closes on return).
        let rc = unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut h,
                fd.as_raw_fd() as usize as *mut c_void,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            )
        };
        check_with("cuMemImportFromShareableHandle", rc, || {
            format!("{size} bytes")
        })?;
        Ok(PhysHandle(h))
    }

    fn set_access_read_only(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_mode(va, size, AccessMode::Read)
    }

    fn set_access_peers(&self, va: DevicePtr, size: usize, peers: &[PeerAccess]) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::SetAccess, "cuMemSetAccess")?;
        super::check_peer_list(self.ordinal, peers, |p| self.can_access_peer(p))?;
        let mut descs = Vec::with_capacity(peers.len() + 1);
        descs.push(structs::access_desc(self.cu_device, AccessMode::ReadWrite));
        for p in peers {
            descs.push(structs::access_desc(Self::cu_device_of(p.device)?, p.mode));
        }
        // SAFETY: `descs` holds descs.len() valid descriptors; the range is
        // mapped (caller's contract).
        check_with(
            "cuMemSetAccess",
            unsafe { sys::cuMemSetAccess(va, size, descs.as_ptr(), descs.len()) },
            || {
                let list: Vec<String> = peers
                    .iter()
                    .map(|p| format!("{}:{:?}", p.device, p.mode))
                    .collect();
                format!(
                    "{size} bytes at {va:#x} on device {} for peers [{}]",
                    self.ordinal,
                    list.join(", ")
                )
            },
        )
    }

    fn peer_readable(&self, va: DevicePtr, len: usize, reader: i32) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        self.bind()?;
        let loc = structs::device_location(Self::cu_device_of(reader)?);
        let g = self.granularity as u64;
        let end = va + len as u64;
        // One query per granule: a range may span several mappings.
        let mut p = va;
        while p < end {
            let mut flags: std::ffi::c_ulonglong = 0;
            // SAFETY: writes one integer; `loc` is valid; an unmapped `p` is an error code.
            let rc = unsafe { sys::cuMemGetAccess(&mut flags, &loc, p) };
            if rc != sys::CUresult::CUDA_SUCCESS || flags == 0 {
                return Ok(false);
            }
            p = (p / g + 1) * g;
        }
        Ok(true)
    }

    fn can_access_peer(&self, peer: i32) -> Result<bool> {
        let dev = Self::cu_device_of(peer)?;
        if peer == self.ordinal {
            return Ok(false);
        }
        let mut can = 0;
        // SAFETY: writes one int for two valid devices.
        check("cuDeviceCanAccessPeer", unsafe {
            sys::cuDeviceCanAccessPeer(&mut can, self.cu_device, dev)
        })?;
        Ok(can != 0)
    }

    fn granularity_for(&self, device: i32) -> Result<usize> {
        let mut prop = self.alloc_prop();
        prop.location.id = Self::cu_device_of(device)?;
        let mut g = 0usize;
        // SAFETY: prop is a fully initialised allocation property; writes one usize.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(g.max(self.granularity))
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Unmap, "cuMemUnmap")?;
        // SAFETY: the range covers whole mappings of ours (caller's contract).
        check_with("cuMemUnmap", unsafe { sys::cuMemUnmap(va, size) }, || {
            format!("{size} bytes at {va:#x}")
        })
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two usizes.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.faults
            .check(FaultOp::Synchronize, "cuCtxSynchronize")?;
        // SAFETY: no arguments; the context is current.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn stream_create(&self) -> Result<StreamId> {
        self.bind()?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: writes one stream handle.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(StreamId(s as usize as u64))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        if stream == StreamId::DEFAULT {
            return Err(Error::InvalidArgument(
                "cannot destroy the default stream".into(),
            ));
        }
        self.bind()?;
        // SAFETY: the stream was created by `stream_create`.
        check("cuStreamDestroy", unsafe {
            sys::cuStreamDestroy_v2(Self::stream(stream))
        })
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        self.bind()?;
        // SAFETY: a stream of ours or the default stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(Self::stream(stream))
        })
    }

    fn event_create(&self) -> Result<EventId> {
        self.bind()?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        // SAFETY: writes one event handle.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
        })?;
        Ok(EventId(e as usize as u64))
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        self.bind()?;
        // SAFETY: an event of ours.
        check("cuEventDestroy", unsafe {
            sys::cuEventDestroy_v2(event.0 as usize as sys::CUevent)
        })
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        self.bind()?;
        // SAFETY: an event and a stream of ours.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.0 as usize as sys::CUevent, Self::stream(stream))
        })
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        self.bind()?;
        // SAFETY: an event of ours.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event.0 as usize as sys::CUevent)
        })
    }

    fn event_query(&self, event: EventId) -> Result<bool> {
        self.bind()?;
        // SAFETY: an event of ours.
        let rc = unsafe { sys::cuEventQuery(event.0 as usize as sys::CUevent) };
        if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", rc).map(|_| true)
    }

    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::CopyHtod, "cuMemcpyHtoDAsync")?;
        // SAFETY: forwarded from the caller's contract on both ranges.
        let rc = unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, Self::stream(stream))
        };
        check_with("cuMemcpyHtoDAsync", rc, || {
            format!("{len} bytes to {dst:#x}")
        })
    }

    unsafe fn copy_peer_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        src_device: i32,
        len: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::CopyPeer, "cuMemcpyDtoDAsync")?;
        // Unified addressing: once this device may read `src` (cuMemSetAccess
        // on the owner), a plain device-to-device copy on our stream pulls it
        // over the peer link.
        // SAFETY: forwarded from the caller's contract on both ranges.
        let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, Self::stream(stream)) };
        check_with("cuMemcpyDtoDAsync", rc, || {
            format!(
                "{len} bytes from {src:#x} (device {src_device}) to {dst:#x} (device {})",
                self.ordinal
            )
        })
    }

    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::CopyDtoh, "cuMemcpyDtoHAsync")?;
        // SAFETY: forwarded from the caller's contract on both ranges.
        let rc = unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, Self::stream(stream))
        };
        check_with("cuMemcpyDtoHAsync", rc, || {
            format!("{len} bytes from {src:#x}")
        })
    }

    unsafe fn copy_2d_htod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: *const u8,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::CopyHtod, "cuMemcpy2DAsync")?;
        let p = structs::memcpy_2d_htod(dst, dst_pitch, src, src_pitch, width, height);
        // SAFETY: forwarded from the caller's contract on every row.
        let rc = unsafe { sys::cuMemcpy2DAsync_v2(&p, Self::stream(stream)) };
        check_with("cuMemcpy2DAsync", rc, || {
            format!("{height} rows of {width} bytes to {dst:#x}")
        })
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Memset, "cuMemsetD8Async")?;
        // SAFETY: forwarded from the caller's contract on the range.
        let rc = unsafe { sys::cuMemsetD8Async(dst, value, len, Self::stream(stream)) };
        check_with("cuMemsetD8Async", rc, || format!("{len} bytes at {dst:#x}"))
    }

    unsafe fn convert_async(
        &self,
        dst: DevicePtr,
        to: ConvertType,
        src: DevicePtr,
        from: ConvertType,
        count: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Convert, "cuLaunchKernel")?;
        if count == 0 {
            return Ok(());
        }
        if to == from {
            // SAFETY: forwarded from the caller's contract.
            let rc = unsafe {
                sys::cuMemcpyDtoDAsync_v2(dst, src, count * to.size(), Self::stream(stream))
            };
            return check("cuMemcpyDtoDAsync", rc);
        }
        let k = self.kernels()?;
        let idx = kernels::PAIRS
            .iter()
            .position(|&p| p == (from, to))
            .ok_or_else(|| Error::Unsupported(format!("conversion {from:?} -> {to:?}")))?;
        let (mut d, mut s, mut n) = (dst, src, count as u64);
        let mut params = [
            &mut d as *mut u64 as *mut c_void,
            &mut s as *mut u64 as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
        ];
        let block = 256u32;
        let grid = (count as u64).div_ceil(block as u64).clamp(1, 8192) as u32;
        // SAFETY: the function takes three u64 parameters, which `params` points
        // to and which live until the call returns (the driver copies them).
        let rc = unsafe {
            sys::cuLaunchKernel(
                k.functions[idx],
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                Self::stream(stream),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        check_with("cuLaunchKernel", rc, || {
            format!("{} over {count} elements", kernels::kernel_name(from, to))
        })
    }

    unsafe fn hash_ranges(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        self.bind()?;
        self.faults.check(FaultOp::Hash, "vmmw_hash_tiles")?;
        self.hash_on_device(ranges)
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize, read_only: bool) -> Result<()> {
        self.bind()?;
        self.faults
            .check(FaultOp::HostRegister, "cuMemHostRegister")?;
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if read_only {
            flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        // SAFETY: forwarded from the caller's contract on the host range.
        let rc = unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) };
        check_with("cuMemHostRegister", rc, || {
            format!("{len} bytes at {ptr:p}")
        })?;
        self.registered_ranges().insert(ptr as usize);
        Ok(())
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        self.bind()?;
        self.registered_ranges().remove(&(ptr as usize));
        // SAFETY: forwarded from the caller's contract.
        check("cuMemHostUnregister", unsafe {
            sys::cuMemHostUnregister(ptr as *mut c_void)
        })
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        self.bind()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; flags 0 = plain page-locked memory.
        let rc = unsafe { sys::cuMemHostAlloc(&mut p, len, 0) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(Error::HostOutOfMemory {
                what: format!("cuMemHostAlloc of {len} bytes: {rc:?}"),
                requested: len as u64,
                limit: u64::MAX,
                in_use: 0,
            });
        }
        Ok(p as *mut u8)
    }

    unsafe fn host_free(&self, ptr: *mut u8, _len: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded from the caller's contract.
        check("cuMemFreeHost", unsafe {
            sys::cuMemFreeHost(ptr as *mut c_void)
        })
    }

    fn faults(&self) -> Option<&Faults> {
        Some(&self.faults)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        if self.bind().is_ok() {
            if let Some(Ok(k)) = self.kernels.get() {
                // SAFETY: the module was loaded by us in this context.
                unsafe { sys::cuModuleUnload(k.module) };
            }
            if let Some(Ok(k)) = self.hash_kernel.get() {
                // SAFETY: the module was loaded by us in this context.
                unsafe { sys::cuModuleUnload(k.module) };
            }
            for ptr in self.registered_ranges().drain() {
                // SAFETY: registered by this driver and not unregistered since;
                // its owner outlives the driver only as a mapping no copy uses.
                unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
            }
        }
        // SAFETY: balances the retain in `open`.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.cu_device) };
    }
}
