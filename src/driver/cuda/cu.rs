//! One safe function per CUDA driver call the backend makes, after cudarc's
//! result layer: each takes typed arguments, builds its struct with
//! [`super::structs`], states why the raw call is sound, and returns the
//! call's outcome as a [`CuResult`] naming the call.
//!
//! Calls whose soundness rests on host pointers or on what a kernel touches
//! are `unsafe fn` and say what the caller guarantees; the rest are safe,
//! because the driver reports a bad handle or range as an error code.

use std::ffi::{c_char, c_int, c_ulonglong, c_void, CStr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use cudarc::driver::sys;

use super::structs;
use crate::driver::{AccessMode, DevicePtr};
use crate::error::Error;

/// A driver call that did not return `CUDA_SUCCESS`: which call, and its code.
#[derive(Debug, Clone, Copy)]
pub(super) struct CuError {
    call: &'static str,
    rc: sys::CUresult,
}

/// The outcome of one driver call.
pub(super) type CuResult<T> = std::result::Result<T, CuError>;

impl CuError {
    /// The driver's result code.
    pub(super) fn rc(&self) -> sys::CUresult {
        self.rc
    }

    /// The typed error, with `detail` (the arguments that failed) after the
    /// call's name; an empty detail adds nothing.
    pub(super) fn detail(self, detail: impl FnOnce() -> String) -> Error {
        let d = detail();
        Error::Driver {
            call: self.call,
            code: self.rc as i32,
            name: error_name(self.rc),
            detail: if d.is_empty() { d } else { format!(": {d}") },
        }
    }
}

impl From<CuError> for Error {
    fn from(e: CuError) -> Error {
        e.detail(String::new)
    }
}

/// `Ok(value)` when `rc` is `CUDA_SUCCESS`, else the error naming `call`.
fn check<T>(call: &'static str, rc: sys::CUresult, value: T) -> CuResult<T> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(value)
    } else {
        Err(CuError { call, rc })
    }
}

/// The driver's name for `code` (`CUDA_ERROR_OUT_OF_MEMORY`), or its debug form.
fn error_name(code: sys::CUresult) -> String {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or leaves it NULL.
    let rc = unsafe { sys::cuGetErrorName(code, &mut p) };
    if rc == sys::CUresult::CUDA_SUCCESS && !p.is_null() {
        // SAFETY: the driver returned a valid NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("{code:?}")
    }
}

/// The retained primary context of a device.
#[derive(Debug, Clone, Copy)]
pub(super) struct Context(sys::CUcontext);
// SAFETY: a CUcontext handle may be used from any thread (the driver API is
// thread-safe); we only pass it to cuCtxSetCurrent and never dereference it.
unsafe impl Send for Context {}
// SAFETY: as above; the handle is immutable once retained.
unsafe impl Sync for Context {}

/// A loaded module.
#[derive(Debug)]
pub(super) struct Module(sys::CUmodule);
// SAFETY: module handles are context-bound driver objects usable from any
// thread once the context is current; we never dereference them.
unsafe impl Send for Module {}
// SAFETY: as above; immutable after loading.
unsafe impl Sync for Module {}

/// A kernel of a loaded module.
#[derive(Debug, Clone, Copy)]
pub(super) struct Function(sys::CUfunction);
// SAFETY: as for `Module`.
unsafe impl Send for Function {}
// SAFETY: as for `Module`.
unsafe impl Sync for Function {}

// ---- Loading and devices ----

/// True when libcuda can be loaded (`dlopen`); nothing else is called.
pub(super) fn is_culib_present() -> bool {
    // SAFETY: only tries to dlopen the library; no other preconditions.
    unsafe { sys::is_culib_present() }
}

/// `cuInit(0)`.
pub(super) fn init() -> CuResult<()> {
    // SAFETY: cuInit(0) is always valid to call once the library is loaded.
    check("cuInit", unsafe { sys::cuInit(0) }, ())
}

/// `cuDriverGetVersion`: the driver API version (13000 for CUDA 13.0).
pub(super) fn driver_get_version() -> CuResult<i32> {
    let mut version = 0;
    // SAFETY: writes one int.
    let rc = unsafe { sys::cuDriverGetVersion(&mut version) };
    check("cuDriverGetVersion", rc, version)
}

/// `cuDeviceGetCount`.
pub(super) fn device_get_count() -> CuResult<i32> {
    let mut count = 0;
    // SAFETY: writes one int.
    let rc = unsafe { sys::cuDeviceGetCount(&mut count) };
    check("cuDeviceGetCount", rc, count)
}

/// `cuDeviceGet`: the device of ordinal `ordinal`.
pub(super) fn device_get(ordinal: i32) -> CuResult<sys::CUdevice> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one CUdevice; an ordinal out of range is an error code.
    let rc = unsafe { sys::cuDeviceGet(&mut dev, ordinal) };
    check("cuDeviceGet", rc, dev)
}

/// `cuDeviceGetAttribute`: one integer attribute of `dev`.
pub(super) fn device_get_attribute(
    dev: sys::CUdevice,
    attribute: sys::CUdevice_attribute,
) -> CuResult<i32> {
    let mut value = 0;
    // SAFETY: writes one int; an invalid device is an error code.
    let rc = unsafe { sys::cuDeviceGetAttribute(&mut value, attribute, dev) };
    check("cuDeviceGetAttribute", rc, value)
}

/// `cuDeviceGetName`: the device's marketing name.
pub(super) fn device_get_name(dev: sys::CUdevice) -> CuResult<String> {
    let mut name_buf = [0 as c_char; 256];
    // SAFETY: the buffer holds 256 bytes and the driver NUL-terminates within it.
    let rc = unsafe { sys::cuDeviceGetName(name_buf.as_mut_ptr(), 256, dev) };
    check("cuDeviceGetName", rc, ())?;
    // SAFETY: NUL-terminated by the driver (checked call above).
    let name = unsafe { CStr::from_ptr(name_buf.as_ptr()) };
    Ok(name.to_string_lossy().into_owned())
}

/// `cuDeviceCanAccessPeer`: whether `dev` can access memory of `peer`.
pub(super) fn device_can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> CuResult<bool> {
    let mut can = 0;
    // SAFETY: writes one int; invalid devices are an error code.
    let rc = unsafe { sys::cuDeviceCanAccessPeer(&mut can, dev, peer) };
    check("cuDeviceCanAccessPeer", rc, can != 0)
}

// ---- Context ----

/// `cuDevicePrimaryCtxRetain`; balanced by [`device_primary_ctx_release`].
pub(super) fn device_primary_ctx_retain(dev: sys::CUdevice) -> CuResult<Context> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: writes one context handle; an invalid device is an error code.
    let rc = unsafe { sys::cuDevicePrimaryCtxRetain(&mut ctx, dev) };
    check("cuDevicePrimaryCtxRetain", rc, Context(ctx))
}

/// `cuDevicePrimaryCtxRelease`: balances one [`device_primary_ctx_retain`].
pub(super) fn device_primary_ctx_release(dev: sys::CUdevice) -> CuResult<()> {
    // SAFETY: releases one retain of `dev`'s primary context; without a
    // retain the driver returns an error code.
    let rc = unsafe { sys::cuDevicePrimaryCtxRelease_v2(dev) };
    check("cuDevicePrimaryCtxRelease", rc, ())
}

/// `cuCtxSetCurrent`: make `ctx` current on the calling thread.
pub(super) fn ctx_set_current(ctx: Context) -> CuResult<()> {
    // SAFETY: the context was retained and its owner keeps it alive.
    check(
        "cuCtxSetCurrent",
        unsafe { sys::cuCtxSetCurrent(ctx.0) },
        (),
    )
}

/// `cuCtxSynchronize`.
pub(super) fn ctx_synchronize() -> CuResult<()> {
    // SAFETY: no arguments; without a current context it is an error code.
    check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() }, ())
}

// ---- Virtual memory ----

/// `cuMemGetAllocationGranularity` (minimum) for memory of `device`.
pub(super) fn mem_get_allocation_granularity(
    device: sys::CUdevice,
    shareable: bool,
) -> CuResult<usize> {
    let prop = structs::alloc_prop(device, shareable, false);
    let mut g = 0usize;
    // SAFETY: prop is a fully initialised allocation property; writes one usize.
    let rc = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut g,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    check("cuMemGetAllocationGranularity", rc, g)
}

/// `cuMemAddressReserve`: `size` bytes of VA aligned to `alignment`.
pub(super) fn mem_address_reserve(size: usize, alignment: usize) -> CuResult<DevicePtr> {
    let mut va: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer; no address hint, no flags.
    let rc = unsafe { sys::cuMemAddressReserve(&mut va, size, alignment, 0, 0) };
    check("cuMemAddressReserve", rc, va)
}

/// `cuMemAddressFree`.
pub(super) fn mem_address_free(va: DevicePtr, size: usize) -> CuResult<()> {
    // SAFETY: returns a device VA range; one that is not a reservation is an
    // error code, and no host memory is touched.
    let rc = unsafe { sys::cuMemAddressFree(va, size) };
    check("cuMemAddressFree", rc, ())
}

/// `cuMemCreate`: `size` bytes of pinned memory on `device`, exportable as a
/// POSIX file descriptor when `shareable`.
pub(super) fn mem_create(
    size: usize,
    device: sys::CUdevice,
    shareable: bool,
    rdma: bool,
) -> CuResult<sys::CUmemGenericAllocationHandle> {
    let prop = structs::alloc_prop(device, shareable, rdma);
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: prop is fully initialised; writes one handle.
    let rc = unsafe { sys::cuMemCreate(&mut h, size, &prop, 0) };
    check("cuMemCreate", rc, h)
}

/// `cuMemRelease`.
pub(super) fn mem_release(handle: sys::CUmemGenericAllocationHandle) -> CuResult<()> {
    // SAFETY: drops a handle; a stale one is an error code. Device memory
    // stays while it is mapped, so no mapping loses its backing.
    check("cuMemRelease", unsafe { sys::cuMemRelease(handle) }, ())
}

/// `cuMemMap`: `size` bytes of `handle`, from its offset 0, at `va`.
pub(super) fn mem_map(
    va: DevicePtr,
    size: usize,
    handle: sys::CUmemGenericAllocationHandle,
) -> CuResult<()> {
    // SAFETY: binds device memory to device VA; a range outside a
    // reservation or a dead handle is an error code.
    let rc = unsafe { sys::cuMemMap(va, size, 0, handle, 0) };
    check("cuMemMap", rc, ())
}

/// `cuMemUnmap`.
pub(super) fn mem_unmap(va: DevicePtr, size: usize) -> CuResult<()> {
    // SAFETY: unbinds device VA; a range not covering whole mappings is an
    // error code, and no host memory is touched.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(va, size) }, ())
}

/// `cuMemSetAccess` with one descriptor per `(device, mode)`.
pub(super) fn mem_set_access(
    va: DevicePtr,
    size: usize,
    access: &[(sys::CUdevice, AccessMode)],
) -> CuResult<()> {
    let descs: Vec<sys::CUmemAccessDesc> = access
        .iter()
        .map(|&(dev, mode)| structs::access_desc(dev, mode))
        .collect();
    // SAFETY: `descs` holds descs.len() valid descriptors; an unmapped range
    // is an error code.
    let rc = unsafe { sys::cuMemSetAccess(va, size, descs.as_ptr(), descs.len()) };
    check("cuMemSetAccess", rc, ())
}

/// `cuMemGetAccess`: the access flags `device` has at `va`.
pub(super) fn mem_get_access(va: DevicePtr, device: sys::CUdevice) -> CuResult<c_ulonglong> {
    let loc = structs::device_location(device);
    let mut flags: c_ulonglong = 0;
    // SAFETY: writes one integer; `loc` is valid; an unmapped `va` is an error code.
    let rc = unsafe { sys::cuMemGetAccess(&mut flags, &loc, va) };
    check("cuMemGetAccess", rc, flags)
}

/// `cuMemExportToShareableHandle` as a POSIX file descriptor, close-on-exec.
pub(super) fn mem_export_to_fd(handle: sys::CUmemGenericAllocationHandle) -> CuResult<OwnedFd> {
    let mut fd: c_int = -1;
    // SAFETY: for the POSIX handle type the driver writes one int; a dead
    // handle is an error code.
    let rc = unsafe {
        sys::cuMemExportToShareableHandle(
            &mut fd as *mut c_int as *mut c_void,
            handle,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    };
    check("cuMemExportToShareableHandle", rc, ())?;
    // SAFETY: a fresh descriptor the driver made for us; nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: fd is open; sets close-on-exec so children do not inherit VRAM.
    unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    Ok(fd)
}

/// `cuMemImportFromShareableHandle` of a POSIX file descriptor; `fd` stays
/// the caller's.
pub(super) fn mem_import_from_fd(fd: &OwnedFd) -> CuResult<sys::CUmemGenericAllocationHandle> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the POSIX handle type takes the descriptor's number cast to a
    // pointer; the driver does not take ownership (the caller closes `fd`).
    let rc = unsafe {
        sys::cuMemImportFromShareableHandle(
            &mut h,
            fd.as_raw_fd() as usize as *mut c_void,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    };
    check("cuMemImportFromShareableHandle", rc, h)
}

/// `cuMemGetInfo`: free and total bytes.
pub(super) fn mem_get_info() -> CuResult<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: writes two usizes.
    let rc = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
    check("cuMemGetInfo", rc, (free, total))
}

// ---- Classic allocations ----

/// `cuMemAlloc`.
pub(super) fn mem_alloc(size: usize) -> CuResult<sys::CUdeviceptr> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer.
    let rc = unsafe { sys::cuMemAlloc_v2(&mut p, size) };
    check("cuMemAlloc", rc, p)
}

/// `cuMemFree` of a pointer from [`mem_alloc`].
pub(super) fn mem_free(ptr: sys::CUdeviceptr) -> CuResult<()> {
    // SAFETY: frees device memory; a wrong pointer is reported by the driver
    // as an error, not undefined behaviour.
    check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) }, ())
}

/// `cuMemHostAlloc` (flags 0: plain page-locked memory).
pub(super) fn mem_host_alloc(len: usize) -> CuResult<*mut u8> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: writes one pointer; flags 0 = plain page-locked memory.
    let rc = unsafe { sys::cuMemHostAlloc(&mut p, len, 0) };
    check("cuMemHostAlloc", rc, p as *mut u8)
}

/// `cuMemFreeHost`.
///
/// # Safety
/// `ptr` came from [`mem_host_alloc`], is not yet freed, and no copy still uses it.
pub(super) unsafe fn mem_free_host(ptr: *mut u8) -> CuResult<()> {
    // SAFETY: the caller's contract.
    let rc = unsafe { sys::cuMemFreeHost(ptr as *mut c_void) };
    check("cuMemFreeHost", rc, ())
}

/// `cuMemHostRegister` (portable; read-only when asked).
///
/// # Safety
/// `ptr..ptr+len` is a valid host mapping that outlives the registration.
pub(super) unsafe fn mem_host_register(ptr: *mut u8, len: usize, read_only: bool) -> CuResult<()> {
    let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
    if read_only {
        flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
    }
    // SAFETY: the caller's contract on the host range.
    let rc = unsafe { sys::cuMemHostRegister_v2(ptr as *mut c_void, len, flags) };
    check("cuMemHostRegister", rc, ())
}

/// `cuMemHostUnregister`.
///
/// # Safety
/// `ptr` was registered and no copy still uses it.
pub(super) unsafe fn mem_host_unregister(ptr: *mut u8) -> CuResult<()> {
    // SAFETY: the caller's contract.
    let rc = unsafe { sys::cuMemHostUnregister(ptr as *mut c_void) };
    check("cuMemHostUnregister", rc, ())
}

// ---- Copies and fills ----

/// `cuMemcpyHtoDAsync`.
///
/// # Safety
/// `src` is valid for `len` bytes until the copy completes; `dst..dst+len`
/// is mapped and accessible device memory.
pub(super) unsafe fn memcpy_htod_async(
    dst: DevicePtr,
    src: *const u8,
    len: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    // SAFETY: the caller's contract on both ranges.
    let rc = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, len, stream) };
    check("cuMemcpyHtoDAsync", rc, ())
}

/// `cuMemcpyDtoHAsync`.
///
/// # Safety
/// `dst` is valid for `len` writable bytes until the copy completes;
/// `src..src+len` is mapped and accessible device memory.
pub(super) unsafe fn memcpy_dtoh_async(
    dst: *mut u8,
    src: DevicePtr,
    len: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    // SAFETY: the caller's contract on both ranges.
    let rc = unsafe { sys::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, len, stream) };
    check("cuMemcpyDtoHAsync", rc, ())
}

/// `cuMemcpyDtoDAsync` (also a pull from a peer under unified addressing).
///
/// # Safety
/// Both ranges are mapped and readable (source) or writable (destination)
/// by this device and stay so until the copy completes.
pub(super) unsafe fn memcpy_dtod_async(
    dst: DevicePtr,
    src: DevicePtr,
    len: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    // SAFETY: the caller's contract on both ranges.
    let rc = unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, len, stream) };
    check("cuMemcpyDtoDAsync", rc, ())
}

/// `cuMemcpy2DAsync` from host to device: `height` rows of `width` bytes.
///
/// # Safety
/// As [`memcpy_htod_async`] for every row touched.
pub(super) unsafe fn memcpy_2d_htod_async(
    dst: DevicePtr,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    width: usize,
    height: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    let p = structs::memcpy_2d_htod(dst, dst_pitch, src, src_pitch, width, height);
    // SAFETY: the caller's contract on every row; `p` is fully initialised.
    let rc = unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) };
    check("cuMemcpy2DAsync", rc, ())
}

/// `cuMemcpy2DAsync` within device memory: `height` rows of `width` bytes.
///
/// # Safety
/// As [`memcpy_dtod_async`] for every row touched.
pub(super) unsafe fn memcpy_2d_dtod_async(
    dst: DevicePtr,
    dst_pitch: usize,
    src: DevicePtr,
    src_pitch: usize,
    width: usize,
    height: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    let p = structs::memcpy_2d_dtod(dst, dst_pitch, src, src_pitch, width, height);
    // SAFETY: the caller's contract on every row; `p` is fully initialised.
    let rc = unsafe { sys::cuMemcpy2DAsync_v2(&p, stream) };
    check("cuMemcpy2DAsync", rc, ())
}

/// `cuMemsetD8Async`.
///
/// # Safety
/// `dst..dst+len` is mapped and accessible device memory.
pub(super) unsafe fn memset_d8_async(
    dst: DevicePtr,
    value: u8,
    len: usize,
    stream: sys::CUstream,
) -> CuResult<()> {
    // SAFETY: the caller's contract on the range.
    let rc = unsafe { sys::cuMemsetD8Async(dst, value, len, stream) };
    check("cuMemsetD8Async", rc, ())
}

/// `cuMemcpyHtoD` (synchronous) of `src` into device memory of ours.
///
/// # Safety
/// `dst` has room for `src`'s bytes in device memory this backend allocated
/// and no work uses.
pub(super) unsafe fn memcpy_htod<T: Copy>(dst: DevicePtr, src: &[T]) -> CuResult<()> {
    let len = std::mem::size_of_val(src);
    // SAFETY: `src` is a live slice of `len` bytes; the destination is the
    // caller's contract.
    let rc = unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr() as *const c_void, len) };
    check("cuMemcpyHtoD", rc, ())
}

/// `cuMemcpyDtoH` (synchronous) of device memory into `dst`.
///
/// # Safety
/// `T` is plain data valid for any bit pattern; `src` holds `dst`'s size in
/// bytes, mapped, readable, and written by no queued work.
pub(super) unsafe fn memcpy_dtoh<T: Copy>(dst: &mut [T], src: DevicePtr) -> CuResult<()> {
    let len = std::mem::size_of_val(dst);
    // SAFETY: `dst` is a live, writable slice of `len` bytes that takes any
    // bit pattern; the source is the caller's contract.
    let rc = unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src, len) };
    check("cuMemcpyDtoH", rc, ())
}

/// `cuMemsetD8` (synchronous).
///
/// # Safety
/// `dst..dst+len` is device memory this backend allocated and no work uses.
pub(super) unsafe fn memset_d8(dst: DevicePtr, value: u8, len: usize) -> CuResult<()> {
    // SAFETY: the caller's contract on the range.
    check(
        "cuMemsetD8",
        unsafe { sys::cuMemsetD8_v2(dst, value, len) },
        (),
    )
}

// ---- Streams and events ----

/// `cuStreamCreate` (non-blocking).
pub(super) fn stream_create() -> CuResult<sys::CUstream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: writes one stream handle.
    let rc =
        unsafe { sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32) };
    check("cuStreamCreate", rc, s)
}

/// `cuStreamDestroy`.
pub(super) fn stream_destroy(stream: sys::CUstream) -> CuResult<()> {
    // SAFETY: a stream from `stream_create` (the backend's contract); the
    // handle is never dereferenced here.
    let rc = unsafe { sys::cuStreamDestroy_v2(stream) };
    check("cuStreamDestroy", rc, ())
}

/// `cuStreamSynchronize`.
pub(super) fn stream_synchronize(stream: sys::CUstream) -> CuResult<()> {
    // SAFETY: a stream of ours or the default stream (the backend's contract).
    let rc = unsafe { sys::cuStreamSynchronize(stream) };
    check("cuStreamSynchronize", rc, ())
}

/// `cuEventCreate` (timing disabled).
pub(super) fn event_create() -> CuResult<sys::CUevent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: writes one event handle.
    let rc =
        unsafe { sys::cuEventCreate(&mut e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32) };
    check("cuEventCreate", rc, e)
}

/// `cuEventDestroy`.
pub(super) fn event_destroy(event: sys::CUevent) -> CuResult<()> {
    // SAFETY: an event from `event_create` (the backend's contract).
    let rc = unsafe { sys::cuEventDestroy_v2(event) };
    check("cuEventDestroy", rc, ())
}

/// `cuEventRecord`.
pub(super) fn event_record(event: sys::CUevent, stream: sys::CUstream) -> CuResult<()> {
    // SAFETY: an event and a stream of ours (the backend's contract).
    let rc = unsafe { sys::cuEventRecord(event, stream) };
    check("cuEventRecord", rc, ())
}

/// `cuEventSynchronize`.
pub(super) fn event_synchronize(event: sys::CUevent) -> CuResult<()> {
    // SAFETY: an event of ours (the backend's contract).
    let rc = unsafe { sys::cuEventSynchronize(event) };
    check("cuEventSynchronize", rc, ())
}

/// `cuStreamWaitEvent`: later work on `stream` waits for `event`.
pub(super) fn stream_wait_event(stream: sys::CUstream, event: sys::CUevent) -> CuResult<()> {
    // SAFETY: a stream and an event of ours (the backend's contract); flags 0
    // is the only value the driver defines.
    let rc = unsafe { sys::cuStreamWaitEvent(stream, event, 0) };
    check("cuStreamWaitEvent", rc, ())
}

/// `cuEventQuery`: true when the event has completed, false while it is
/// not ready.
pub(super) fn event_query(event: sys::CUevent) -> CuResult<bool> {
    // SAFETY: an event of ours (the backend's contract).
    let rc = unsafe { sys::cuEventQuery(event) };
    if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check("cuEventQuery", rc, true)
}

// ---- Modules and launches ----

/// `cuModuleLoadData` of a NUL-terminated PTX image.
pub(super) fn module_load_data(image: &CStr) -> CuResult<Module> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: the image is NUL-terminated PTX that outlives the call; without
    // a current context the call is an error code.
    let rc = unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr() as *const c_void) };
    check("cuModuleLoadData", rc, Module(module))
}

/// `cuModuleGetFunction`.
pub(super) fn module_get_function(module: &Module, name: &CStr) -> CuResult<Function> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: the module is loaded (it is only built by `module_load_data`);
    // the name is NUL-terminated.
    let rc = unsafe { sys::cuModuleGetFunction(&mut f, module.0, name.as_ptr()) };
    check("cuModuleGetFunction", rc, Function(f))
}

/// `cuModuleUnload`.
pub(super) fn module_unload(module: &Module) -> CuResult<()> {
    // SAFETY: the module was loaded by `module_load_data`; its owner unloads
    // it once, when no function of it is used again.
    check(
        "cuModuleUnload",
        unsafe { sys::cuModuleUnload(module.0) },
        (),
    )
}

/// `cuLaunchKernel` of `function` over `grid` blocks of `block` threads
/// (one-dimensional, no shared memory) with `params`.
///
/// # Safety
/// `params` points at one value per kernel parameter, of the kernel's types;
/// every memory the kernel touches through them is mapped and accessible
/// until the launch completes.
pub(super) unsafe fn launch_kernel(
    function: Function,
    grid: u32,
    block: u32,
    stream: sys::CUstream,
    params: &mut [*mut c_void],
) -> CuResult<()> {
    // SAFETY: the caller's contract; the driver copies the parameter values
    // before returning.
    let rc = unsafe {
        sys::cuLaunchKernel(
            function.0,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check("cuLaunchKernel", rc, ())
}
