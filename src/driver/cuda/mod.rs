//! The CUDA backend: the real driver API through cudarc's `sys` layer, loaded
//! at run time, so the crate builds and runs on machines without CUDA.
//!
//! Feature level: the bindings are those of CUDA 11.4 (cudarc's oldest), and
//! the calls used exist since CUDA 10.2 (the VMM API); `open` checks the
//! driver version and the device's VMM attribute and reports a typed error
//! when either is missing. The device's primary context is retained once and
//! made current in every entry point, since callers arrive on any thread.
//!
//! Layers, after cudarc: `structs` builds the driver structs, `cu` makes
//! each raw call behind one safe function, `open` brings a device up, and
//! `impl Driver` below composes them without raw calls of its own.

use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use cudarc::driver::sys;

mod codec_kernels;
mod cu;
mod open;
mod range_hash;
mod structs;

pub use open::MIN_DRIVER_VERSION;

use super::fault::{FaultOp, Faults};
use super::{
    kernels, AccessMode, BackendKind, ConvertType, CreateFlags, DevicePtr, Driver, EventId,
    MemInfo, PeerAccess, PhysHandle, StreamId,
};
use crate::error::{Error, Result};

/// The real CUDA driver for one device.
#[derive(Debug)]
pub struct CudaDriver {
    ordinal: i32,
    cu_device: sys::CUdevice,
    ctx: cu::Context,
    name: String,
    driver_version: i32,
    granularity: usize,
    /// Physical memory is created exportable as a POSIX file descriptor; see `open::shareable_wanted`.
    shareable: AtomicBool,
    kernels: OnceLock<std::result::Result<Kernels, String>>,
    hash_kernel: OnceLock<std::result::Result<range_hash::HashKernel, String>>,
    codec_kernels: OnceLock<std::result::Result<codec_kernels::CodecKernels, String>>,
    /// Host ranges this driver page-locked and has not unlocked (by start
    /// address). Drop unlocks them: registrations belong to the primary
    /// context, which outlives this driver when another retains it, and a
    /// buffer cached past its driver (the staging ring) cannot unlock itself;
    /// a range left locked makes the next registration of its addresses fail.
    registered: std::sync::Mutex<std::collections::HashSet<usize>>,
    /// Failures armed by tests (never outside them); see [`super::fault`].
    faults: Faults,
}

/// The loaded conversion module and its functions, in `kernels::PAIRS` order.
#[derive(Debug)]
struct Kernels {
    module: cu::Module,
    functions: Vec<cu::Function>,
}

impl CudaDriver {
    /// The CUDA driver version as an integer (13000 for CUDA 13.0).
    pub fn driver_version(&self) -> i32 {
        self.driver_version
    }

    /// This driver's fault-injection table (armed by tests only).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Make the primary context current on the calling thread.
    fn bind(&self) -> Result<()> {
        Ok(cu::ctx_set_current(self.ctx)?)
    }

    fn shareable_now(&self) -> bool {
        self.shareable.load(Ordering::Relaxed)
    }

    fn kernels(&self) -> Result<&Kernels> {
        let loaded = self.kernels.get_or_init(|| {
            let ptx = kernels::ptx();
            // The context is current: callers bind first.
            let image = CString::from_vec_with_nul(ptx.into_bytes()).map_err(|e| e.to_string())?;
            let module = cu::module_load_data(&image).map_err(|e| Error::from(e).to_string())?;
            let mut functions = Vec::new();
            for (from, to) in kernels::PAIRS {
                let name =
                    CString::new(kernels::kernel_name(from, to)).map_err(|e| e.to_string())?;
                let f = cu::module_get_function(&module, &name)
                    .map_err(|e| Error::from(e).to_string())?;
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
        match cu::mem_alloc(size) {
            Ok(p) => Ok(p),
            Err(e) if e.rc() == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = self.mem_info().map(|m| m.free).unwrap_or(0);
                Err(Error::OutOfMemory {
                    what: format!("cuMemAlloc of {size} bytes"),
                    requested: size as u64,
                    free,
                })
            }
            Err(e) => Err(e.detail(|| format!("{size} bytes"))),
        }
    }

    /// `cuMemFree` of a pointer from [`CudaDriver::legacy_alloc`].
    pub fn legacy_free(&self, ptr: DevicePtr) -> Result<()> {
        self.bind()?;
        cu::mem_free(ptr).map_err(|e| e.detail(|| format!("{ptr:#x}")))
    }

    /// `cuMemSetAccess` for this device alone with `mode` (read-write or read-only).
    fn set_access_mode(&self, va: DevicePtr, size: usize, mode: AccessMode) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::SetAccess, "cuMemSetAccess")?;
        cu::mem_set_access(va, size, &[(self.cu_device, mode)])
            .map_err(|e| e.detail(|| format!("{size} bytes at {va:#x}")))
    }

    fn registered_ranges(&self) -> std::sync::MutexGuard<'_, std::collections::HashSet<usize>> {
        self.registered.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stream(s: StreamId) -> sys::CUstream {
        s.0 as usize as sys::CUstream
    }

    fn event(e: EventId) -> sys::CUevent {
        e.0 as usize as sys::CUevent
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
        cu::mem_address_reserve(size, alignment).map_err(|e| e.detail(|| format!("{size} bytes")))
    }

    fn free_va(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.bind()?;
        cu::mem_address_free(va, size).map_err(|e| e.detail(|| format!("{va:#x} (+{size})")))
    }

    fn rdma_supported(&self) -> Result<bool> {
        self.bind()?;
        Ok(cu::device_get_attribute(
            self.cu_device,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
        )? != 0)
    }

    fn create_with(&self, size: usize, flags: CreateFlags) -> Result<PhysHandle> {
        self.bind()?;
        if flags.rdma && !self.rdma_supported()? {
            return Err(Error::Unsupported(format!(
                "{}: the driver reports no GPUDirect RDMA for VMM memory (CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED = 0), so RDMA-capable memory cannot be created",
                self.describe()
            )));
        }
        if self.faults.take(FaultOp::Create) {
            // As the host backend: an injected create fails as out of memory.
            return Err(Error::OutOfMemory {
                what: format!("physical allocation of {size} bytes (cuMemCreate, injected)"),
                requested: size as u64,
                free: self.mem_info().map(|m| m.free).unwrap_or(0),
            });
        }
        let mut created = cu::mem_create(size, self.cu_device, self.shareable_now(), flags.rdma);
        let refused = [
            sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
            sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        ];
        if let Err(e) = created {
            if refused.contains(&e.rc()) && self.shareable.swap(false, Ordering::Relaxed) {
                // The driver refuses exportable memory here: keep working, unshareable.
                created = cu::mem_create(size, self.cu_device, self.shareable_now(), flags.rdma);
            }
        }
        match created {
            Ok(h) => Ok(PhysHandle(h)),
            Err(e) if e.rc() == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                let free = self.mem_info().map(|m| m.free).unwrap_or(0);
                Err(Error::OutOfMemory {
                    what: format!("physical allocation of {size} bytes (cuMemCreate)"),
                    requested: size as u64,
                    free,
                })
            }
            Err(e) => Err(e.detail(|| format!("{size} bytes"))),
        }
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Release, "cuMemRelease")?;
        Ok(cu::mem_release(handle.0)?)
    }

    fn map(&self, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Map, "cuMemMap")?;
        cu::mem_map(va, size, handle.0).map_err(|e| e.detail(|| format!("{size} bytes at {va:#x}")))
    }

    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_mode(va, size, AccessMode::ReadWrite)
    }

    fn shareable(&self) -> bool {
        self.shareable_now()
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
        Ok(cu::mem_export_to_fd(handle.0)?)
    }

    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<PhysHandle> {
        self.bind()?;
        // `fd` closes on return: the driver does not take it.
        let h = cu::mem_import_from_fd(&fd).map_err(|e| e.detail(|| format!("{size} bytes")))?;
        Ok(PhysHandle(h))
    }

    fn set_access_read_only(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_mode(va, size, AccessMode::Read)
    }

    fn set_access_peers(&self, va: DevicePtr, size: usize, peers: &[PeerAccess]) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::SetAccess, "cuMemSetAccess")?;
        super::check_peer_list(self.ordinal, peers, |p| self.can_access_peer(p))?;
        let mut access = Vec::with_capacity(peers.len() + 1);
        access.push((self.cu_device, AccessMode::ReadWrite));
        for p in peers {
            access.push((Self::cu_device_of(p.device)?, p.mode));
        }
        cu::mem_set_access(va, size, &access).map_err(|e| {
            e.detail(|| {
                let list: Vec<String> = peers
                    .iter()
                    .map(|p| format!("{}:{:?}", p.device, p.mode))
                    .collect();
                format!(
                    "{size} bytes at {va:#x} on device {} for peers [{}]",
                    self.ordinal,
                    list.join(", ")
                )
            })
        })
    }

    fn peer_readable(&self, va: DevicePtr, len: usize, reader: i32) -> Result<bool> {
        if len == 0 {
            return Ok(true);
        }
        self.bind()?;
        let dev = Self::cu_device_of(reader)?;
        let g = self.granularity as u64;
        let end = va + len as u64;
        // One query per granule: a range may span several mappings.
        let mut p = va;
        while p < end {
            // An unmapped granule is an error code: not readable.
            match cu::mem_get_access(p, dev) {
                Ok(flags) if flags != 0 => {}
                _ => return Ok(false),
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
        Ok(cu::device_can_access_peer(self.cu_device, dev)?)
    }

    fn granularity_for(&self, device: i32) -> Result<usize> {
        let dev = Self::cu_device_of(device)?;
        let g = cu::mem_get_allocation_granularity(dev, self.shareable_now())?;
        Ok(g.max(self.granularity))
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Unmap, "cuMemUnmap")?;
        cu::mem_unmap(va, size).map_err(|e| e.detail(|| format!("{size} bytes at {va:#x}")))
    }

    fn mem_info(&self) -> Result<MemInfo> {
        self.bind()?;
        let (free, total) = cu::mem_get_info()?;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn synchronize(&self) -> Result<()> {
        self.bind()?;
        self.faults
            .check(FaultOp::Synchronize, "cuCtxSynchronize")?;
        Ok(cu::ctx_synchronize()?)
    }

    fn stream_create(&self) -> Result<StreamId> {
        self.bind()?;
        let s = cu::stream_create()?;
        Ok(StreamId(s as usize as u64))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        if stream == StreamId::DEFAULT {
            return Err(Error::InvalidArgument(
                "cannot destroy the default stream".into(),
            ));
        }
        self.bind()?;
        Ok(cu::stream_destroy(Self::stream(stream))?)
    }

    fn stream_synchronize(&self, stream: StreamId) -> Result<()> {
        self.bind()?;
        Ok(cu::stream_synchronize(Self::stream(stream))?)
    }

    fn event_create(&self) -> Result<EventId> {
        self.bind()?;
        let e = cu::event_create()?;
        Ok(EventId(e as usize as u64))
    }

    fn event_destroy(&self, event: EventId) -> Result<()> {
        self.bind()?;
        Ok(cu::event_destroy(Self::event(event))?)
    }

    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()> {
        self.bind()?;
        Ok(cu::event_record(Self::event(event), Self::stream(stream))?)
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        self.bind()?;
        Ok(cu::event_synchronize(Self::event(event))?)
    }

    fn event_query(&self, event: EventId) -> Result<bool> {
        self.bind()?;
        Ok(cu::event_query(Self::event(event))?)
    }

    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()> {
        self.bind()?;
        Ok(cu::stream_wait_event(
            Self::stream(stream),
            Self::event(event),
        )?)
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
        unsafe { cu::memcpy_htod_async(dst, src, len, Self::stream(stream)) }
            .map_err(|e| e.detail(|| format!("{len} bytes to {dst:#x}")))
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
        unsafe { cu::memcpy_dtod_async(dst, src, len, Self::stream(stream)) }.map_err(|e| {
            e.detail(|| {
                format!(
                    "{len} bytes from {src:#x} (device {src_device}) to {dst:#x} (device {})",
                    self.ordinal
                )
            })
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
        unsafe { cu::memcpy_dtoh_async(dst, src, len, Self::stream(stream)) }
            .map_err(|e| e.detail(|| format!("{len} bytes from {src:#x}")))
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
        let s = Self::stream(stream);
        // SAFETY: forwarded from the caller's contract on every row.
        unsafe { cu::memcpy_2d_htod_async(dst, dst_pitch, src, src_pitch, width, height, s) }
            .map_err(|e| e.detail(|| format!("{height} rows of {width} bytes to {dst:#x}")))
    }

    unsafe fn copy_2d_dtod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: DevicePtr,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        let s = Self::stream(stream);
        if height <= 1 {
            self.faults.check(FaultOp::CopyDtod, "cuMemcpyDtoDAsync")?;
            let len = width * height;
            // SAFETY: forwarded from the caller's contract on the one row.
            return unsafe { cu::memcpy_dtod_async(dst, src, len, s) }
                .map_err(|e| e.detail(|| format!("{len} bytes from {src:#x} to {dst:#x}")));
        }
        self.faults.check(FaultOp::CopyDtod, "cuMemcpy2DAsync")?;
        // SAFETY: forwarded from the caller's contract on every row.
        unsafe { cu::memcpy_2d_dtod_async(dst, dst_pitch, src, src_pitch, width, height, s) }
            .map_err(|e| {
                e.detail(|| format!("{height} rows of {width} bytes from {src:#x} to {dst:#x}"))
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
        unsafe { cu::memset_d8_async(dst, value, len, Self::stream(stream)) }
            .map_err(|e| e.detail(|| format!("{len} bytes at {dst:#x}")))
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
            let copied =
                unsafe { cu::memcpy_dtod_async(dst, src, count * to.size(), Self::stream(stream)) };
            return Ok(copied?);
        }
        let k = self.kernels()?;
        let idx = kernels::PAIRS
            .iter()
            .position(|&p| p == (from, to))
            .ok_or_else(|| Error::Unsupported(format!("conversion {from:?} -> {to:?}")))?;
        let (mut d, mut s, mut n) = (dst, src, count as u64);
        let mut params = [
            &mut d as *mut u64 as *mut std::ffi::c_void,
            &mut s as *mut u64 as *mut std::ffi::c_void,
            &mut n as *mut u64 as *mut std::ffi::c_void,
        ];
        let block = 256u32;
        let grid = (count as u64).div_ceil(block as u64).clamp(1, 8192) as u32;
        // SAFETY: the function takes three u64 parameters, which `params`
        // points to; both ranges are the caller's contract.
        unsafe {
            cu::launch_kernel(
                k.functions[idx],
                grid,
                block,
                Self::stream(stream),
                &mut params,
            )
        }
        .map_err(|e| {
            e.detail(|| format!("{} over {count} elements", kernels::kernel_name(from, to)))
        })
    }

    unsafe fn hash_ranges(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        self.bind()?;
        self.faults.check(FaultOp::Hash, "vmmw_hash_tiles")?;
        // SAFETY: forwarded from the caller's contract on every range.
        unsafe { self.hash_on_device(ranges) }
    }

    unsafe fn codec_encode(
        &self,
        src: DevicePtr,
        len: usize,
        layout: crate::codec::Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        stream: StreamId,
    ) -> Result<usize> {
        self.bind()?;
        self.faults.check(FaultOp::Codec, "vmmw_codec_encode")?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.codec_encode_on_device(src, len, layout, dst, scratch, stream) }
    }

    unsafe fn codec_encode_async(
        &self,
        src: DevicePtr,
        len: usize,
        layout: crate::codec::Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        len_at: DevicePtr,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Codec, "vmmw_codec_encode")?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.codec_encode_queue(src, len, layout, dst, scratch, len_at, stream) }
    }

    unsafe fn codec_decode_async(
        &self,
        frame: DevicePtr,
        frame_len: usize,
        dst: DevicePtr,
        raw_len: usize,
        status: DevicePtr,
        stream: StreamId,
    ) -> Result<()> {
        self.bind()?;
        self.faults.check(FaultOp::Codec, "vmmw_codec_decode")?;
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.codec_decode_on_device(frame, frame_len, dst, raw_len, status, stream) }
    }

    unsafe fn host_register(&self, ptr: *mut u8, len: usize, read_only: bool) -> Result<()> {
        self.bind()?;
        self.faults
            .check(FaultOp::HostRegister, "cuMemHostRegister")?;
        // SAFETY: forwarded from the caller's contract on the host range.
        unsafe { cu::mem_host_register(ptr, len, read_only) }
            .map_err(|e| e.detail(|| format!("{len} bytes at {ptr:p}")))?;
        self.registered_ranges().insert(ptr as usize);
        Ok(())
    }

    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()> {
        self.bind()?;
        self.registered_ranges().remove(&(ptr as usize));
        // SAFETY: forwarded from the caller's contract.
        Ok(unsafe { cu::mem_host_unregister(ptr) }?)
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        self.bind()?;
        cu::mem_host_alloc(len).map_err(|e| Error::HostOutOfMemory {
            what: format!("cuMemHostAlloc of {len} bytes: {:?}", e.rc()),
            requested: len as u64,
            limit: u64::MAX,
            in_use: 0,
        })
    }

    unsafe fn host_free(&self, ptr: *mut u8, _len: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: forwarded from the caller's contract.
        Ok(unsafe { cu::mem_free_host(ptr) }?)
    }
}

impl Drop for CudaDriver {
    fn drop(&mut self) {
        // Failures are ignored: nothing is left to report them to.
        if self.bind().is_ok() {
            if let Some(Ok(k)) = self.kernels.get() {
                let _ = cu::module_unload(&k.module);
            }
            if let Some(Ok(k)) = self.hash_kernel.get() {
                let _ = cu::module_unload(&k.module);
            }
            if let Some(Ok(k)) = self.codec_kernels.get() {
                let _ = cu::module_unload(&k.module);
            }
            for ptr in self.registered_ranges().drain() {
                // SAFETY: registered by this driver and not unregistered since;
                // its owner outlives the driver only as a mapping no copy uses.
                let _ = unsafe { cu::mem_host_unregister(ptr as *mut u8) };
            }
        }
        let _ = cu::device_primary_ctx_release(self.cu_device);
    }
}
