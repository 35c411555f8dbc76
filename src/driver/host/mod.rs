//! The host backend: CUDA VMM semantics on host memory.
//!
//! - reserve  = `mmap(PROT_NONE, MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE)`, aligned;
//! - create   = a `memfd` of the requested size, sealed against shrinking and growing
//!   (counted against a memory limit);
//! - map      = `mmap(MAP_FIXED|MAP_SHARED)` of the memfd into the reservation, still `PROT_NONE`;
//! - set_access = `mprotect(PROT_READ|PROT_WRITE)`;
//! - unmap    = an anonymous `PROT_NONE` mapping `MAP_FIXED` over the range, so the VA
//!   stays reserved and touching it faults, as on a GPU;
//! - release  = close the memfd; the memory is returned once it is also unmapped;
//! - export_fd / import_fd = `dup` of the memfd, and mapping a received one: the
//!   same file in every process, so writes are seen everywhere, as with CUDA IPC.
//!
//! Several devices: [`HostDriver::for_device`] gives device `n` of
//! [`host_device_count`] simulated devices, each with memory of its own. All
//! of them share the process's address space, so one process-wide table (the
//! simulated interconnect) records which device owns each mapped range and
//! which peers may read or write it; a peer copy checks that table the way a
//! GPU's page tables would refuse a peer without access.
//!
//! Copies are `memcpy`s done at once (so every "async" call has completed when
//! it returns); streams and events are counters that tests can check for leaks.
//! A memory limit and fault injection make out-of-memory and mid-operation
//! failures testable.

mod config;
mod copy;
mod interconnect;
mod mapping;
mod memory;
mod pinned;
mod state;
mod sync;

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub use super::fault::FaultOp;
use super::fault::Faults;
use super::{BackendKind, ConvertType, CreateFlags, DevicePtr, Driver, EventId, MemInfo};
use super::{PeerAccess, PhysHandle, StreamId};
use crate::error::{Error, Result};
pub use config::{
    host_device_count, HostConfig, DEFAULT_DEVICE_COUNT, DEFAULT_GRANULARITY, DEFAULT_MEMORY_LIMIT,
};
pub use state::HostCounts;
use state::State;

static NEXT_DRIVER_ID: AtomicU64 = AtomicU64::new(1);

/// CUDA VMM semantics on host memory. See the module docs.
#[derive(Debug)]
pub struct HostDriver {
    granularity: usize,
    device: i32,
    /// Unique per driver, so the interconnect table forgets our ranges on drop.
    id: u64,
    state: Mutex<State>,
    faults: Faults,
    /// Whether RDMA-capable memory may be created (the host has no NIC: the
    /// flag only records the request, so the path above runs in CI).
    rdma: AtomicBool,
    /// Physical handles created RDMA-capable.
    rdma_created: AtomicU64,
}

impl HostDriver {
    /// A host backend with `config`, as device 0.
    pub fn new(config: HostConfig) -> HostDriver {
        HostDriver::with_ordinal(config, 0)
    }

    /// Simulated device `device` of [`host_device_count`]; an error naming the
    /// count when there is no such device.
    pub fn for_device(config: HostConfig, device: i32) -> Result<HostDriver> {
        let count = host_device_count()?;
        if !(0..count).contains(&device) {
            return Err(Error::InvalidArgument(format!(
                "device {device} does not exist: the host backend simulates {count} devices \
                 (0..{count}; set VMMW_HOST_DEVICES for more)"
            )));
        }
        Ok(HostDriver::with_ordinal(config, device))
    }

    fn with_ordinal(config: HostConfig, device: i32) -> HostDriver {
        HostDriver {
            granularity: config.granularity,
            device,
            id: NEXT_DRIVER_ID.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State {
                memory_limit: config.memory_limit,
                next_handle: 1,
                next_stream: 1,
                next_event: 1,
                ..State::default()
            }),
            faults: Faults::default(),
            rdma: AtomicBool::new(true),
            rdma_created: AtomicU64::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a
        // way that matters more than losing the whole backend, so recover.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This driver's fault-injection table (armed by tests only).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    /// Change the simulated device memory.
    pub fn set_memory_limit(&self, bytes: u64) {
        self.state().memory_limit = bytes;
    }

    /// Make the `n`-th next call of `op` fail (1 = the very next one). 0 clears it.
    pub fn fail_nth(&self, op: FaultOp, n: u64) {
        self.faults.fail_nth(op, n);
    }

    /// True while an injected failure of `op` is armed and has not fired yet.
    pub fn fault_pending(&self, op: FaultOp) -> bool {
        self.faults.pending(op)
    }

    /// Make every call of `op` fail until [`HostDriver::clear_faults`] (a
    /// device whose link went bad).
    pub fn fail_always(&self, op: FaultOp) {
        self.faults.fail_always(op);
    }

    /// Say whether this device supports RDMA-capable memory (default: yes).
    pub fn set_rdma_supported(&self, supported: bool) {
        self.rdma.store(supported, Ordering::Relaxed);
    }

    /// Give each new physical allocation the lowest handle id no live
    /// allocation holds (default: never reuse an id). A CUDA driver may
    /// hand a released handle's value to the next allocation; tests set this
    /// to show that nothing takes a handle's value for the memory's identity.
    pub fn set_reuse_handle_ids(&self, reuse: bool) {
        self.state().reuse_handle_ids = reuse;
    }

    /// Physical handles created RDMA-capable so far.
    pub fn rdma_handles_created(&self) -> u64 {
        self.rdma_created.load(Ordering::Relaxed)
    }

    /// Clear every injected failure.
    pub fn clear_faults(&self) {
        self.faults.clear();
    }

    fn copy_fault(&self, op: FaultOp, call: &'static str) -> Result<()> {
        if self.faults.take(op) {
            return Err(injected(call));
        }
        Ok(())
    }
}

fn errno_error(call: &'static str, detail: String) -> Error {
    let e = std::io::Error::last_os_error();
    Error::Driver {
        call,
        code: e.raw_os_error().unwrap_or(-1),
        name: e.to_string(),
        detail: format!(": {detail}"),
    }
}

fn injected(call: &'static str) -> Error {
    Error::Driver {
        call,
        code: -1,
        name: "injected failure".to_owned(),
        detail: ": fault injection on the host backend".to_owned(),
    }
}

impl Driver for HostDriver {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }

    fn device(&self) -> i32 {
        self.device
    }

    fn describe(&self) -> String {
        let limit = self.state().memory_limit;
        format!(
            "host (simulated device {} on host memory, {} MiB granularity, {} MiB limit)",
            self.device,
            self.granularity >> 20,
            limit >> 20
        )
    }

    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&self, size: usize, alignment: usize) -> Result<DevicePtr> {
        mapping::reserve(self, size, alignment)
    }

    fn free_va(&self, va: DevicePtr, size: usize) -> Result<()> {
        mapping::free_va(self, va, size)
    }

    fn create_with(&self, size: usize, flags: CreateFlags) -> Result<PhysHandle> {
        if flags.rdma && !self.rdma.load(Ordering::Relaxed) {
            return Err(Error::Unsupported(format!(
                "{}: RDMA-capable memory is switched off on this host backend (HostDriver::set_rdma_supported)",
                self.describe()
            )));
        }
        let h = memory::create(self, size)?;
        if flags.rdma {
            self.rdma_created.fetch_add(1, Ordering::Relaxed);
        }
        Ok(h)
    }

    fn rdma_supported(&self) -> Result<bool> {
        Ok(self.rdma.load(Ordering::Relaxed))
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        memory::release(self, handle)
    }

    fn map(&self, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        mapping::map(self, va, size, handle)
    }

    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        mapping::set_access(self, va, size)
    }

    fn set_access_peers(&self, va: DevicePtr, size: usize, peers: &[PeerAccess]) -> Result<()> {
        mapping::set_access_peers(self, va, size, peers)
    }

    fn shareable(&self) -> bool {
        true
    }

    fn export_fd(&self, handle: PhysHandle) -> Result<OwnedFd> {
        memory::export_fd(self, handle)
    }

    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<PhysHandle> {
        memory::import_fd(self, fd, size)
    }

    fn set_access_read_only(&self, va: DevicePtr, size: usize) -> Result<()> {
        mapping::set_access_read_only(self, va, size)
    }

    fn peer_readable(&self, va: DevicePtr, len: usize, reader: i32) -> Result<bool> {
        mapping::peer_readable(self, va, len, reader)
    }

    fn can_access_peer(&self, peer: i32) -> Result<bool> {
        mapping::can_access_peer(self, peer)
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        mapping::unmap(self, va, size)
    }

    fn mem_info(&self) -> Result<MemInfo> {
        memory::mem_info(self)
    }

    fn synchronize(&self) -> Result<()> {
        sync::synchronize(self)
    }

    fn stream_create(&self) -> Result<StreamId> {
        sync::stream_create(self)
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        sync::stream_destroy(self, stream)
    }

    fn stream_synchronize(&self, _stream: StreamId) -> Result<()> {
        Ok(())
    }

    fn event_create(&self) -> Result<EventId> {
        sync::event_create(self)
    }

    fn event_destroy(&self, _event: EventId) -> Result<()> {
        sync::event_destroy(self)
    }

    fn event_record(&self, _event: EventId, _stream: StreamId) -> Result<()> {
        Ok(())
    }

    fn event_synchronize(&self, _event: EventId) -> Result<()> {
        Ok(())
    }

    fn event_query(&self, _event: EventId) -> Result<bool> {
        Ok(true)
    }

    fn stream_wait_event(&self, _stream: StreamId, _event: EventId) -> Result<()> {
        // Work runs when it is queued here: what an event marks is done.
        Ok(())
    }

    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::copy_htod_async(self, dst, src, len) }
    }

    unsafe fn copy_peer_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        src_device: i32,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::copy_peer_async(self, dst, src, src_device, len) }
    }

    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::copy_dtoh_async(self, dst, src, len) }
    }

    unsafe fn copy_2d_dtod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: DevicePtr,
        src_pitch: usize,
        width: usize,
        height: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::copy_2d_dtod_async(self, dst, dst_pitch, src, src_pitch, width, height) }
    }

    unsafe fn codec_encode(
        &self,
        src: DevicePtr,
        len: usize,
        layout: crate::codec::Layout,
        dst: DevicePtr,
        _scratch: DevicePtr,
        _stream: StreamId,
    ) -> Result<usize> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::codec_encode(self, src, len, layout, dst) }
    }

    unsafe fn codec_encode_async(
        &self,
        src: DevicePtr,
        len: usize,
        layout: crate::codec::Layout,
        dst: DevicePtr,
        _scratch: DevicePtr,
        len_at: DevicePtr,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        let n = unsafe { copy::codec_encode(self, src, len, layout, dst) }?;
        // SAFETY: the caller guarantees eight writable bytes at `len_at`.
        unsafe { std::ptr::write_unaligned(len_at as *mut u64, n as u64) };
        Ok(())
    }

    unsafe fn codec_decode_async(
        &self,
        frame: DevicePtr,
        frame_len: usize,
        dst: DevicePtr,
        raw_len: usize,
        status: DevicePtr,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::codec_decode(self, frame, frame_len, dst, raw_len, status) }
    }

    unsafe fn hash_ranges(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::hash_ranges(self, ranges) }
    }

    unsafe fn copy_2d_htod_async(
        &self,
        dst: DevicePtr,
        dst_pitch: usize,
        src: *const u8,
        src_pitch: usize,
        width: usize,
        height: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::copy_2d_htod_async(self, dst, dst_pitch, src, src_pitch, width, height) }
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::memset_async(self, dst, value, len) }
    }

    unsafe fn convert_async(
        &self,
        dst: DevicePtr,
        to: ConvertType,
        src: DevicePtr,
        from: ConvertType,
        count: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy::convert_async(self, dst, to, src, from, count) }
    }

    unsafe fn host_register(&self, _ptr: *mut u8, _len: usize, _read_only: bool) -> Result<()> {
        self.copy_fault(FaultOp::HostRegister, "host_register")
    }

    unsafe fn host_unregister(&self, _ptr: *mut u8) -> Result<()> {
        Ok(())
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        pinned::host_alloc(len)
    }

    unsafe fn host_free(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { pinned::host_free(ptr, len) }
    }
}

impl Drop for HostDriver {
    fn drop(&mut self) {
        interconnect::interconnect().retain(|_, m| m.driver != self.id);
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in s.handles.values() {
            if p.fd >= 0 {
                // SAFETY: fds still open belong to unreleased handles of ours.
                unsafe { libc::close(p.fd) };
            }
        }
    }
}
