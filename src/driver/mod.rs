//! The driver seam: the virtual-memory primitives, copies, streams, events and
//! host-memory pinning that every higher layer (segment, pool, sleep, loader)
//! is written against.
//!
//! Two implementations:
//! - [`cuda::CudaDriver`]: the real CUDA driver API through cudarc's `sys` layer,
//!   loaded at run time (the crate builds and runs without CUDA installed);
//! - [`host::HostDriver`]: the same semantics on host memory (`mmap` reservations,
//!   `memfd` physical handles), with a memory limit and fault injection, so every
//!   layer is tested in CI without a GPU.
//!
//! Semantics both backends honour (they are the CUDA VMM rules):
//! - `reserve` returns a VA range with no access; touching it faults.
//! - `create` returns a physical handle of a granularity-multiple size.
//! - `map` binds a handle to a VA range; the range is still inaccessible until
//!   `set_access`.
//! - `unmap` returns the range to the reserved, inaccessible state; the VA stays reserved.
//! - `release` drops the handle; memory is returned once it is also unmapped.
//! - `free_va` returns the reservation; everything in it must be unmapped first.

pub mod convert;
pub mod cuda;
pub mod fault;
pub mod hash;
pub mod host;
pub mod kernels;
pub mod nccl;
pub mod sync_copy;
pub mod testing;

use std::fmt;
use std::os::fd::OwnedFd;
use std::sync::Arc;

use crate::codec::Layout;
use crate::error::{Error, Result};

/// A device virtual address (on the host backend, a process address).
pub type DevicePtr = u64;

/// An opaque physical-memory handle (`CUmemGenericAllocationHandle`, or a memfd id).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PhysHandle(pub u64);

/// An opaque stream id. `StreamId::DEFAULT` is the legacy default stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default (NULL) stream.
    pub const DEFAULT: StreamId = StreamId(0);
}

/// An opaque event id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventId(pub u64);

/// Which implementation is behind a [`Driver`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// Simulated on host memory.
    Host,
    /// The real CUDA driver.
    Cuda,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Host => "host",
            BackendKind::Cuda => "cuda",
        })
    }
}

/// Which backend the caller asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum BackendChoice {
    /// CUDA when a driver and a device are present, else host.
    #[default]
    Auto,
    /// Always the host simulation.
    Host,
    /// Always CUDA; an error when it is not usable.
    Cuda,
}

impl BackendChoice {
    /// Parse "host", "cuda" or "auto" (case-insensitive).
    pub fn parse(s: &str) -> Result<BackendChoice> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(BackendChoice::Auto),
            "host" => Ok(BackendChoice::Host),
            "cuda" => Ok(BackendChoice::Cuda),
            other => Err(Error::InvalidArgument(format!(
                "unknown backend `{other}`: expected host, cuda or auto"
            ))),
        }
    }

    /// The choice named by `VMMW_BACKEND`, or `Auto` when unset.
    pub fn from_env() -> Result<BackendChoice> {
        match std::env::var("VMMW_BACKEND") {
            Ok(v) => BackendChoice::parse(&v)
                .map_err(|e| Error::InvalidArgument(format!("VMMW_BACKEND: {e}"))),
            Err(_) => Ok(BackendChoice::Auto),
        }
    }
}

/// Free and total device memory, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MemInfo {
    /// Bytes the device reports free.
    pub free: u64,
    /// Bytes of device memory in total.
    pub total: u64,
}

/// Element types the copy engine can convert between.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ConvertType {
    /// IEEE half.
    F16,
    /// bfloat16.
    Bf16,
    /// IEEE single.
    F32,
}

/// How a device may touch memory that lives on another device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessMode {
    /// No access (`CU_MEM_ACCESS_FLAGS_PROT_NONE`): revokes an earlier grant.
    None,
    /// Read only (`CU_MEM_ACCESS_FLAGS_PROT_READ`).
    Read,
    /// Read and write (`CU_MEM_ACCESS_FLAGS_PROT_READWRITE`).
    ReadWrite,
}

impl AccessMode {
    /// True when this mode allows at least what `need` asks.
    pub fn allows(self, need: AccessMode) -> bool {
        self >= need
    }
}

/// One peer device's access to a range, as given to [`Driver::set_access_peers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct PeerAccess {
    /// The peer's device ordinal (never the owning device).
    pub device: i32,
    /// What the peer may do.
    pub mode: AccessMode,
}

/// How physical memory is created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CreateFlags {
    /// Registrable by NICs and collectives for RDMA (NCCL's
    /// `ncclCommRegister`, NIXL, UCX): `gpuDirectRDMACapable` in the
    /// allocation's flags.
    pub rdma: bool,
}

/// The VMM primitives and the transfer machinery above them.
///
/// Every method may be called from any thread; the CUDA backend makes the
/// device's primary context current in each call.
pub trait Driver: std::any::Any + Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// The device ordinal.
    fn device(&self) -> i32;
    /// A human-readable description ("NVIDIA H200 (cuda, device 0)").
    fn describe(&self) -> String;
    /// Minimum mapping granularity in bytes (2 MiB on an H200 and by default on host).
    fn granularity(&self) -> usize;

    /// Reserve `size` bytes of VA aligned to `alignment` (0 = granularity). No access.
    fn reserve(&self, size: usize, alignment: usize) -> Result<DevicePtr>;
    /// Return a reservation made by `reserve`. Everything in it must be unmapped.
    fn free_va(&self, va: DevicePtr, size: usize) -> Result<()>;
    /// Create `size` bytes of physical memory (a granularity multiple).
    fn create(&self, size: usize) -> Result<PhysHandle> {
        self.create_with(size, CreateFlags::default())
    }
    /// Create as [`Driver::create`], with `flags`. `flags.rdma` where
    /// [`Driver::rdma_supported`] is false fails with `Unsupported`, naming
    /// the device.
    fn create_with(&self, size: usize, flags: CreateFlags) -> Result<PhysHandle>;
    /// Whether memory can be created registrable for RDMA (the driver's
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED`).
    fn rdma_supported(&self) -> Result<bool>;
    /// Release a physical handle.
    fn release(&self, handle: PhysHandle) -> Result<()>;
    /// Map `size` bytes of `handle` (from its offset 0) at `va`, inside a reservation.
    fn map(&self, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()>;
    /// Grant read/write access to `[va, va+size)` for this device.
    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()>;
    /// Grant read/write access to `[va, va+size)` for this device and the
    /// listed access for each peer device (`cuMemSetAccess` with one descriptor
    /// per device). A peer listed with [`AccessMode::None`] loses its access.
    /// Every peer must pass [`Driver::can_access_peer`]; `peers` must not name
    /// this device or one device twice.
    fn set_access_peers(&self, va: DevicePtr, size: usize, peers: &[PeerAccess]) -> Result<()>;
    /// True when this device can map memory of `peer` and copy from it
    /// (`cuDeviceCanAccessPeer`). An error when `peer` does not exist.
    fn can_access_peer(&self, peer: i32) -> Result<bool>;
    /// True when device `reader` may read every byte of `[va, va+len)`, memory
    /// of this device (`cuMemGetAccess`, checked at every granule). Lets a
    /// multi-device load refuse before any copy instead of faulting midway.
    fn peer_readable(&self, va: DevicePtr, len: usize, reader: i32) -> Result<bool>;
    /// The mapping granularity of this device's memory when `device` (this
    /// one or a peer) is to access it; a segment shared with peers uses the
    /// largest over every device listed.
    fn granularity_for(&self, device: i32) -> Result<usize> {
        let _ = device;
        Ok(self.granularity())
    }
    /// Unmap `[va, va+size)`; the VA stays reserved and inaccessible.
    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()>;

    /// Free and total device memory.
    fn mem_info(&self) -> Result<MemInfo>;
    /// Wait until all work queued on the device has finished.
    fn synchronize(&self) -> Result<()>;

    /// Create a non-blocking stream.
    fn stream_create(&self) -> Result<StreamId>;
    /// Destroy a stream created by `stream_create`.
    fn stream_destroy(&self, stream: StreamId) -> Result<()>;
    /// Wait for all work on `stream`.
    fn stream_synchronize(&self, stream: StreamId) -> Result<()>;
    /// Create an event (timing disabled).
    fn event_create(&self) -> Result<EventId>;
    /// Destroy an event.
    fn event_destroy(&self, event: EventId) -> Result<()>;
    /// Record `event` on `stream`.
    fn event_record(&self, event: EventId, stream: StreamId) -> Result<()>;
    /// Block until `event` has completed.
    fn event_synchronize(&self, event: EventId) -> Result<()>;
    /// True when `event` has completed (non-blocking).
    fn event_query(&self, event: EventId) -> Result<bool>;
    /// Make the work queued on `stream` after this call wait on the device
    /// for `event`, as last recorded before this call; the host does not
    /// wait. An event never recorded lets the stream run on.
    fn stream_wait_event(&self, stream: StreamId, event: EventId) -> Result<()>;

    /// Queue a host-to-device copy.
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes until the copy completes (stream or
    /// event synchronized); `dst..dst+len` must be mapped and accessible device memory.
    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue a device-to-host copy.
    ///
    /// # Safety
    /// `dst` must be valid for `len` writable bytes until the copy completes;
    /// `src..src+len` must be mapped and accessible device memory.
    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue a 2D host-to-device copy: `height` rows of `width` bytes, rows
    /// `src_pitch` apart in host memory and `dst_pitch` apart on the device.
    ///
    /// # Safety
    /// As [`Driver::copy_htod_async`] for every row touched.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_2d_htod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: *const u8,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue a copy of `len` bytes from `src`, memory of device `src_device`,
    /// to `dst`, memory of this device, on this device's `stream` (a pull
    /// over the peer link).
    ///
    /// # Safety
    /// `dst..dst+len` must be mapped and accessible here; `src..src+len` must
    /// be mapped on `src_device` and readable by this device
    /// ([`Driver::set_access_peers`]); neither may be freed before the copy completes.
    unsafe fn copy_peer_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        src_device: i32,
        len: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue a 2D copy within this device's memory: `height` rows of `width`
    /// bytes, rows `src_pitch` apart at `src` and `dst_pitch` apart at `dst`
    /// (CUDA: `cuMemcpyDtoDAsync` for one row, else `cuMemcpy2DAsync`). Both
    /// ranges may be memory of any allocator of this device (a VMM segment,
    /// a framework's own allocation).
    ///
    /// # Safety
    /// Every row touched is mapped and readable at `src`, mapped and
    /// writable at `dst`, the two do not overlap, and neither is freed before
    /// the copy completes.
    #[allow(clippy::too_many_arguments)]
    unsafe fn copy_2d_dtod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: DevicePtr,
        src_pitch: usize,
        width: usize,
        height: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue a byte fill of device memory.
    ///
    /// # Safety
    /// `dst..dst+len` must be mapped and accessible device memory.
    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue an element-wise conversion of `count` elements from `src` (of
    /// `from`) to `dst` (of `to`), both in device memory.
    ///
    /// # Safety
    /// Both ranges must be mapped, accessible and not overlapping.
    unsafe fn convert_async(
        &self,
        dst: DevicePtr,
        to: ConvertType,
        src: DevicePtr,
        from: ConvertType,
        count: usize,
        stream: StreamId,
    ) -> Result<()>;

    /// The [`hash::hash`] of each of `ranges` (device memory), computed on
    /// the device (CUDA: one kernel launch over every range's tiles; host:
    /// the reference itself). Returns when the hashes are known.
    ///
    /// # Safety
    /// Every range must be mapped and readable by this device, and no queued
    /// work may still write it (callers synchronize first).
    unsafe fn hash_ranges(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>>;

    /// Encode the `len` bytes at `src` as one backup-codec frame
    /// ([`crate::codec`]) at `dst`, using `scratch`; returns the frame's
    /// length once it is written (the call waits for `stream`). The frame is
    /// byte for byte what [`crate::codec::encode`] makes (CUDA: the kernels
    /// of `kernels/codec.cu`; host: the reference itself).
    ///
    /// # Safety
    /// `src..+len` is mapped and readable; `dst` has room for
    /// [`crate::codec::format::max_frame_bytes`]`(len)` bytes and `scratch`
    /// for [`crate::codec::format::encode_scratch_bytes`]`(len)`, both mapped,
    /// writable and overlapping nothing else of the call; no queued work still
    /// writes `src`.
    unsafe fn codec_encode(
        &self,
        src: DevicePtr,
        len: usize,
        layout: Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        stream: StreamId,
    ) -> Result<usize>;

    /// Queue what [`Driver::codec_encode`] does on `stream` without waiting:
    /// the frame's length lands at `len_at` (a little-endian `u64`) once
    /// `stream` has passed the encode, so a caller keeps encodes queued
    /// while it waits for an earlier one. `len_at` may be device memory or
    /// host memory from [`Driver::host_alloc`] (CUDA: unified addressing
    /// makes it visible to kernels at the same address), which the host
    /// reads with no copy once an event after the encode has completed.
    ///
    /// # Safety
    /// As [`Driver::codec_encode`], and the eight bytes at `len_at`
    /// (8-aligned) are mapped (or from `host_alloc`), writable and overlap
    /// nothing else of the call; every range stays so until `stream` has
    /// passed the encode.
    #[allow(clippy::too_many_arguments)]
    unsafe fn codec_encode_async(
        &self,
        src: DevicePtr,
        len: usize,
        layout: Layout,
        dst: DevicePtr,
        scratch: DevicePtr,
        len_at: DevicePtr,
        stream: StreamId,
    ) -> Result<()>;

    /// Queue the decode of the frame of `frame_len` bytes at `frame` into
    /// the `raw_len` bytes at `dst`. Each block's checksum is checked: a
    /// corrupt frame lowers the `u32` at `status` (which the caller sets to
    /// `u32::MAX` first) to the index of a corrupt block (0 for a bad header
    /// or index), and leaves it alone when every block checks. Nothing
    /// outside `dst..+raw_len` is written, whatever the frame holds.
    ///
    /// # Safety
    /// `frame..+frame_len` is mapped and readable, `dst..+raw_len` and the
    /// four bytes at `status` (4-aligned) mapped and writable, none
    /// overlapping; all stay so until `stream` has passed the decode.
    unsafe fn codec_decode_async(
        &self,
        frame: DevicePtr,
        frame_len: usize,
        dst: DevicePtr,
        raw_len: usize,
        status: DevicePtr,
        stream: StreamId,
    ) -> Result<()>;

    /// Page-lock host memory so the device can DMA from it (`cuMemHostRegister`).
    ///
    /// # Safety
    /// `ptr..ptr+len` must be a valid host mapping that outlives the registration.
    unsafe fn host_register(&self, ptr: *mut u8, len: usize, read_only: bool) -> Result<()>;
    /// Undo `host_register`.
    ///
    /// # Safety
    /// `ptr` must have been registered and no copy may still use it.
    unsafe fn host_unregister(&self, ptr: *mut u8) -> Result<()>;

    /// Allocate `len` bytes of page-locked host memory with the driver's own
    /// allocator (`cuMemHostAlloc`, what PyTorch's `pin_memory` uses). Pins about
    /// ten times slower than [`crate::hostmem::PinnedHost`]; benchmarks use it
    /// as the reference path. Free it with [`Driver::host_free`].
    fn host_alloc(&self, len: usize) -> Result<*mut u8>;
    /// Free memory from [`Driver::host_alloc`].
    ///
    /// # Safety
    /// `ptr`/`len` are exactly what `host_alloc` returned and asked for, not yet
    /// freed, and no copy still uses the memory.
    unsafe fn host_free(&self, ptr: *mut u8, len: usize) -> Result<()>;

    /// True when the physical memory `create` makes can be exported with
    /// [`Driver::export_fd`] (CUDA: created with the POSIX file-descriptor
    /// handle type; host: always, a memfd).
    fn shareable(&self) -> bool;

    /// Export `handle` as a file descriptor another process can import with
    /// [`Driver::import_fd`]. The descriptor is the caller's (close-on-exec);
    /// the handle stays valid and must still be released.
    fn export_fd(&self, handle: PhysHandle) -> Result<OwnedFd>;

    /// Import `size` bytes of physical memory from a descriptor made by
    /// [`Driver::export_fd`] in any process of this host. The descriptor is
    /// consumed (closed once imported, or on failure); the returned handle is
    /// released with [`Driver::release`] like one from `create`, and its memory
    /// is not counted as this process's allocation.
    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<PhysHandle>;

    /// Grant read-only access to `[va, va+size)` for this device: writes fault
    /// (CUDA: `CU_MEM_ACCESS_FLAGS_PROT_READ`; host: `PROT_READ`).
    fn set_access_read_only(&self, va: DevicePtr, size: usize) -> Result<()>;
}

/// Open a driver for `device` with the requested backend.
///
/// `Auto` picks CUDA when the driver library loads and the device exists, and
/// falls back to the host simulation otherwise; the returned [`Opened::reason`]
/// says which was chosen and why.
///
/// The host backend simulates `VMMW_HOST_DEVICES` devices (8 by default):
/// each call gives a driver with memory of its own, peers of every other.
pub fn open(choice: BackendChoice, device: i32) -> Result<Opened> {
    match choice {
        BackendChoice::Host => Ok(Opened {
            driver: Arc::new(host::HostDriver::for_device(
                host::HostConfig::from_env()?,
                device,
            )?),
            reason: "host backend requested".to_owned(),
        }),
        BackendChoice::Cuda => Ok(Opened {
            driver: Arc::new(cuda::CudaDriver::open(device)?),
            reason: "cuda backend requested".to_owned(),
        }),
        BackendChoice::Auto => match cuda::CudaDriver::open(device) {
            Ok(d) => Ok(Opened {
                driver: Arc::new(d),
                reason: "auto: CUDA driver and device found".to_owned(),
            }),
            Err(e @ Error::DriverUnavailable(_)) => Ok(Opened {
                driver: Arc::new(host::HostDriver::for_device(
                    host::HostConfig::from_env()?,
                    device,
                )?),
                reason: format!("auto: no usable CUDA ({e}); using the host backend"),
            }),
            Err(e) => Err(e),
        },
    }
}

/// A driver and the reason it was chosen.
#[derive(Debug, Clone)]
pub struct Opened {
    /// The driver.
    pub driver: Arc<dyn Driver>,
    /// Why this backend was chosen, for logs and the demo.
    pub reason: String,
}

/// Check a peer list for [`Driver::set_access_peers`]: no entry for the
/// owning device, no device twice, every peer reachable.
pub fn check_peer_list(
    owner: i32,
    peers: &[PeerAccess],
    can_access: impl Fn(i32) -> Result<bool>,
) -> Result<()> {
    for (i, p) in peers.iter().enumerate() {
        if p.device == owner {
            return Err(Error::InvalidArgument(format!(
                "peer access list names device {owner}, which owns the memory; list only peers"
            )));
        }
        if peers[..i].iter().any(|q| q.device == p.device) {
            return Err(Error::InvalidArgument(format!(
                "peer access list names device {} twice",
                p.device
            )));
        }
        if p.mode != AccessMode::None && !can_access(p.device)? {
            return Err(Error::InvalidArgument(format!(
                "device {} cannot access memory of device {owner} (no peer path: \
                 cuDeviceCanAccessPeer is 0; check `nvidia-smi topo -m`)",
                p.device
            )));
        }
    }
    Ok(())
}

/// Round `n` up to a multiple of `g` (a power of two or any positive number).
pub fn round_up(n: usize, g: usize) -> usize {
    debug_assert!(g > 0);
    n.div_ceil(g) * g
}
