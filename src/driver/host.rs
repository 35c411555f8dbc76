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

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::{hash, PeerAccess, PhysHandle, StreamId};
use super::{AccessMode, BackendKind, ConvertType, DevicePtr, Driver, EventId, MemInfo};
use crate::error::{Error, Result};
use crate::units::{page_size, parse_bytes};

/// Default simulated granularity: 2 MiB, as on an H200.
pub const DEFAULT_GRANULARITY: usize = 2 << 20;
/// Default simulated device memory: 64 GiB (memfd pages cost nothing until touched).
pub const DEFAULT_MEMORY_LIMIT: u64 = 64 << 30;

/// Default number of simulated devices.
pub const DEFAULT_DEVICE_COUNT: i32 = 8;

/// How many devices the host backend simulates: `VMMW_HOST_DEVICES`, else 8.
pub fn host_device_count() -> Result<i32> {
    match std::env::var("VMMW_HOST_DEVICES") {
        Ok(v) => match v.trim().parse::<i32>() {
            Ok(n) if (1..=1024).contains(&n) => Ok(n),
            _ => Err(Error::InvalidArgument(format!(
                "VMMW_HOST_DEVICES=`{v}`: expected a device count from 1 to 1024"
            ))),
        },
        Err(_) => Ok(DEFAULT_DEVICE_COUNT),
    }
}

/// One mapped range in the simulated interconnect: its owner and its peers.
#[derive(Debug)]
struct Mapped {
    end: u64,
    driver: u64,
    device: i32,
    peers: Vec<PeerAccess>,
}

/// The process-wide table of mapped ranges with access granted, by start address.
fn interconnect() -> std::sync::MutexGuard<'static, BTreeMap<u64, Mapped>> {
    static TABLE: OnceLock<Mutex<BTreeMap<u64, Mapped>>> = OnceLock::new();
    TABLE
        .get_or_init(|| Mutex::new(BTreeMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// True when every byte of `[va, va+len)` is mapped on `owner` and `who`
/// (the owner itself, or a peer with at least `need`) may touch it.
fn range_allows(va: u64, len: usize, owner: i32, who: i32, need: AccessMode) -> bool {
    let table = interconnect();
    let end = va + len as u64;
    let mut cursor = va;
    for (&start, m) in table.range(..end) {
        if m.end <= cursor {
            continue;
        }
        if start > cursor || m.device != owner {
            return false;
        }
        let ok = who == owner
            || m.peers
                .iter()
                .any(|p| p.device == who && p.mode.allows(need));
        if !ok {
            return false;
        }
        cursor = m.end;
    }
    cursor >= end
}

static NEXT_DRIVER_ID: AtomicU64 = AtomicU64::new(1);

/// Configuration of the host backend.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// Mapping granularity; a multiple of the OS page size.
    pub granularity: usize,
    /// Simulated device memory: `create` fails with out-of-memory beyond it.
    pub memory_limit: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            granularity: DEFAULT_GRANULARITY,
            memory_limit: DEFAULT_MEMORY_LIMIT,
        }
    }
}

impl HostConfig {
    /// Defaults, overridden by `VMMW_HOST_GRANULARITY` and `VMMW_HOST_MEMORY`
    /// (byte counts as [`crate::units::parse_bytes`] reads them: 64M, 1GiB).
    pub fn from_env() -> Result<HostConfig> {
        let mut c = HostConfig::default();
        if let Ok(v) = std::env::var("VMMW_HOST_GRANULARITY") {
            c.granularity = parse_bytes(&v)
                .map_err(|e| Error::InvalidArgument(format!("VMMW_HOST_GRANULARITY=`{v}`: {e}")))?
                as usize;
        }
        if let Ok(v) = std::env::var("VMMW_HOST_MEMORY") {
            c.memory_limit = parse_bytes(&v)
                .map_err(|e| Error::InvalidArgument(format!("VMMW_HOST_MEMORY=`{v}`: {e}")))?;
        }
        c.validate()?;
        Ok(c)
    }

    fn validate(&self) -> Result<()> {
        let page = page_size();
        if self.granularity == 0 || !self.granularity.is_multiple_of(page) {
            return Err(Error::InvalidArgument(format!(
                "host granularity {} must be a positive multiple of the page size {page}",
                self.granularity
            )));
        }
        Ok(())
    }
}

pub use super::fault::FaultOp;
use super::fault::Faults;

/// Live objects of the host backend, for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounts {
    /// VA reservations not yet freed.
    pub reservations: usize,
    /// Physical handles not yet released.
    pub handles: usize,
    /// Mapped ranges.
    pub mappings: usize,
    /// Bytes of physical memory counted against the limit (created, and released-but-mapped).
    pub physical_bytes: u64,
    /// Streams not yet destroyed.
    pub streams: usize,
    /// Events not yet destroyed.
    pub events: usize,
}

#[derive(Debug)]
struct Phys {
    fd: libc::c_int,
    size: usize,
    released: bool,
    maps: usize,
    /// Counted against the memory limit: created here, not imported.
    counted: bool,
}

#[derive(Debug, Default)]
struct State {
    reservations: BTreeMap<u64, usize>,
    handles: HashMap<u64, Phys>,
    /// va -> (size, handle id)
    mappings: BTreeMap<u64, (usize, u64)>,
    physical_bytes: u64,
    memory_limit: u64,
    next_handle: u64,
    next_stream: u64,
    next_event: u64,
    streams: usize,
    events: usize,
}

/// CUDA VMM semantics on host memory. See the module docs.
#[derive(Debug)]
pub struct HostDriver {
    granularity: usize,
    device: i32,
    /// Unique per driver, so the interconnect table forgets our ranges on drop.
    id: u64,
    state: Mutex<State>,
    faults: Faults,
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
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a
        // way that matters more than losing the whole backend, so recover.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live objects, for leak checks in tests.
    pub fn counts(&self) -> HostCounts {
        let s = self.state();
        HostCounts {
            reservations: s.reservations.len(),
            handles: s.handles.values().filter(|p| !p.released).count(),
            mappings: s.mappings.len(),
            physical_bytes: s.physical_bytes,
            streams: s.streams,
            events: s.events,
        }
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

    /// Clear every injected failure.
    pub fn clear_faults(&self) {
        self.faults.clear();
    }

    /// The peers granted access to the mapped range starting at `va` (empty
    /// when none, or when nothing of ours is mapped there with access set).
    pub fn peer_access_at(&self, va: DevicePtr) -> Vec<PeerAccess> {
        interconnect()
            .get(&va)
            .filter(|m| m.driver == self.id)
            .map(|m| m.peers.clone())
            .unwrap_or_default()
    }

    fn copy_fault(&self, op: FaultOp, call: &'static str) -> Result<()> {
        if self.faults.take(op) {
            return Err(injected(call));
        }
        Ok(())
    }

    fn check_aligned(&self, what: &str, va: u64, size: usize) -> Result<()> {
        if size == 0
            || !size.is_multiple_of(self.granularity)
            || !va.is_multiple_of(self.granularity as u64)
        {
            return Err(Error::InvalidArgument(format!(
                "{what}: address {va:#x} and size {size} must be non-zero multiples of the granularity {}",
                self.granularity
            )));
        }
        Ok(())
    }

    fn inside_reservation(s: &State, va: u64, size: usize) -> bool {
        s.reservations
            .range(..=va)
            .next_back()
            .is_some_and(|(&base, &len)| va + size as u64 <= base + len as u64)
    }

    fn overlaps_mapping(s: &State, va: u64, size: usize) -> bool {
        let end = va + size as u64;
        s.mappings
            .range(..end)
            .next_back()
            .is_some_and(|(&m, &(len, _))| m + len as u64 > va)
    }

    fn drop_phys_if_done(s: &mut State, id: u64) {
        let done = s
            .handles
            .get(&id)
            .is_some_and(|p| p.released && p.maps == 0);
        if done {
            if let Some(p) = s.handles.remove(&id) {
                if p.counted {
                    s.physical_bytes -= p.size as u64;
                }
            }
        }
    }

    /// `mprotect` a fully mapped range (set_access and its read-only twin).
    /// `mprotect` a fully mapped range and record it, with the peers granted,
    /// in the interconnect table (per mapping).
    fn protect(
        &self,
        va: DevicePtr,
        size: usize,
        prot: libc::c_int,
        peers: &[PeerAccess],
    ) -> Result<()> {
        self.check_aligned("set_access", va, size)?;
        let s = self.state();
        if self.faults.take(FaultOp::SetAccess) {
            return Err(injected("set_access"));
        }
        // Every byte must be mapped, as cuMemSetAccess requires.
        let end = va + size as u64;
        let mut cursor = va;
        let mut covered = Vec::new();
        for (&m, &(len, _)) in s.mappings.range(..end) {
            let m_end = m + len as u64;
            if m_end <= cursor {
                continue;
            }
            if m > cursor {
                break;
            }
            covered.push((m, m_end));
            cursor = m_end;
        }
        if cursor < end {
            return Err(Error::InvalidState(format!(
                "set_access: [{va:#x}, +{size}) is not fully mapped"
            )));
        }
        // SAFETY: the range is fully mapped by us (checked above).
        let rc = unsafe { libc::mprotect(va as *mut libc::c_void, size, prot) };
        if rc != 0 {
            return Err(errno_error("mprotect", format!("[{va:#x}, +{size})")));
        }
        let granted: Vec<PeerAccess> = peers
            .iter()
            .copied()
            .filter(|p| p.mode != AccessMode::None)
            .collect();
        let mut table = interconnect();
        for (m, m_end) in covered {
            table.insert(
                m,
                Mapped {
                    end: m_end,
                    driver: self.id,
                    device: self.device,
                    peers: granted.clone(),
                },
            );
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
        let align = if alignment == 0 {
            self.granularity
        } else {
            alignment.max(self.granularity)
        };
        if size == 0 || !size.is_multiple_of(self.granularity) || !align.is_power_of_two() {
            return Err(Error::InvalidArgument(format!(
                "reserve: size {size} must be a non-zero multiple of the granularity {} and alignment {align} a power of two",
                self.granularity
            )));
        }
        let mut s = self.state();
        if self.faults.take(FaultOp::Reserve) {
            return Err(injected("reserve"));
        }
        let total = size
            .checked_add(align)
            .ok_or_else(|| Error::InvalidArgument(format!("reserve: size {size} too large")))?;
        // SAFETY: a fresh anonymous PROT_NONE mapping; no existing memory is touched.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(errno_error("mmap", format!("reserving {size} bytes of VA")));
        }
        let start = raw as usize;
        let aligned = start.div_ceil(align) * align;
        let head = aligned - start;
        let tail = total - head - size;
        // SAFETY: both ranges lie inside the mapping just created and are not
        // part of the aligned range we keep.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + size) as *mut libc::c_void, tail);
            }
        }
        s.reservations.insert(aligned as u64, size);
        Ok(aligned as u64)
    }

    fn free_va(&self, va: DevicePtr, size: usize) -> Result<()> {
        let mut s = self.state();
        match s.reservations.get(&va) {
            Some(&len) if len == size => {}
            Some(&len) => {
                return Err(Error::InvalidArgument(format!(
                    "free_va: reservation at {va:#x} has {len} bytes, not {size}"
                )))
            }
            None => {
                return Err(Error::InvalidArgument(format!(
                    "free_va: {va:#x} is not a reservation"
                )))
            }
        }
        if Self::overlaps_mapping(&s, va, size) {
            return Err(Error::InvalidState(format!(
                "free_va: reservation at {va:#x} still has mapped ranges; unmap them first"
            )));
        }
        // SAFETY: the range is a reservation we made and nothing is mapped in it.
        let rc = unsafe { libc::munmap(va as *mut libc::c_void, size) };
        if rc != 0 {
            return Err(errno_error("munmap", format!("freeing VA {va:#x}")));
        }
        s.reservations.remove(&va);
        Ok(())
    }

    fn create(&self, size: usize) -> Result<PhysHandle> {
        if size == 0 || !size.is_multiple_of(self.granularity) {
            return Err(Error::InvalidArgument(format!(
                "create: size {size} must be a non-zero multiple of the granularity {}",
                self.granularity
            )));
        }
        let mut s = self.state();
        let free = s.memory_limit.saturating_sub(s.physical_bytes);
        if self.faults.take(FaultOp::Create) || size as u64 > free {
            return Err(Error::OutOfMemory {
                what: format!("physical allocation of {size} bytes"),
                requested: size as u64,
                free,
            });
        }
        // SAFETY: the name is a valid NUL-terminated string.
        let fd = unsafe {
            libc::memfd_create(
                c"vmmw-phys".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(errno_error("memfd_create", format!("{size} bytes")));
        }
        // Sealed at its size, as device memory is: no process it is shared
        // with can truncate it under another's mapping (SIGBUS) or grow it.
        // SAFETY: fd is the memfd just created.
        let sized = unsafe { libc::ftruncate(fd, size as libc::off_t) } == 0;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        // SAFETY: fd is the memfd just created, with sealing allowed.
        if !sized || unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } != 0 {
            let e = errno_error(
                "memfd",
                format!("sizing and sealing a memfd of {size} bytes"),
            );
            // SAFETY: fd is ours and closed once.
            unsafe { libc::close(fd) };
            return Err(e);
        }
        let id = s.next_handle;
        s.next_handle += 1;
        s.handles.insert(
            id,
            Phys {
                fd,
                size,
                released: false,
                maps: 0,
                counted: true,
            },
        );
        s.physical_bytes += size as u64;
        Ok(PhysHandle(id))
    }

    fn release(&self, handle: PhysHandle) -> Result<()> {
        let mut s = self.state();
        if self.faults.take(FaultOp::Release) {
            return Err(injected("release"));
        }
        let p = match s.handles.get_mut(&handle.0) {
            Some(p) if !p.released => p,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "release: unknown or already released handle {}",
                    handle.0
                )))
            }
        };
        p.released = true;
        // SAFETY: the fd belongs to this handle and is closed exactly once; existing
        // MAP_SHARED mappings keep the memory alive until they are unmapped.
        unsafe { libc::close(p.fd) };
        p.fd = -1;
        Self::drop_phys_if_done(&mut s, handle.0);
        Ok(())
    }

    fn map(&self, va: DevicePtr, size: usize, handle: PhysHandle) -> Result<()> {
        self.check_aligned("map", va, size)?;
        let mut s = self.state();
        if self.faults.take(FaultOp::Map) {
            return Err(injected("map"));
        }
        if !Self::inside_reservation(&s, va, size) {
            return Err(Error::InvalidArgument(format!(
                "map: [{va:#x}, +{size}) is not inside one reservation"
            )));
        }
        if Self::overlaps_mapping(&s, va, size) {
            return Err(Error::InvalidState(format!(
                "map: [{va:#x}, +{size}) overlaps a mapped range"
            )));
        }
        let fd = match s.handles.get(&handle.0) {
            Some(p) if !p.released && p.size >= size => p.fd,
            Some(p) if !p.released => {
                return Err(Error::InvalidArgument(format!(
                    "map: handle {} has {} bytes, cannot map {size}",
                    handle.0, p.size
                )))
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "map: unknown or released handle {}",
                    handle.0
                )))
            }
        };
        // SAFETY: the range lies inside a reservation of ours (checked above) and
        // holds no other mapping, so MAP_FIXED replaces only our PROT_NONE placeholder.
        let rc = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd,
                0,
            )
        };
        if rc == libc::MAP_FAILED {
            return Err(errno_error("mmap", format!("mapping handle at {va:#x}")));
        }
        s.mappings.insert(va, (size, handle.0));
        if let Some(p) = s.handles.get_mut(&handle.0) {
            p.maps += 1;
        }
        Ok(())
    }

    fn set_access(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.set_access_peers(va, size, &[])
    }

    fn set_access_peers(&self, va: DevicePtr, size: usize, peers: &[PeerAccess]) -> Result<()> {
        super::check_peer_list(self.device, peers, |p| self.can_access_peer(p))?;
        self.protect(va, size, libc::PROT_READ | libc::PROT_WRITE, peers)
    }

    fn shareable(&self) -> bool {
        true
    }

    fn export_fd(&self, handle: PhysHandle) -> Result<OwnedFd> {
        let s = self.state();
        let fd = match s.handles.get(&handle.0) {
            Some(p) if !p.released => p.fd,
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "export_fd: unknown or released handle {}",
                    handle.0
                )))
            }
        };
        // SAFETY: fd is an open memfd owned by a live handle (checked under the lock).
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(errno_error(
                "fcntl",
                format!("duplicating handle {}", handle.0),
            ));
        }
        // SAFETY: `dup` is a fresh descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(dup) })
    }

    fn import_fd(&self, fd: OwnedFd, size: usize) -> Result<PhysHandle> {
        if size == 0 || !size.is_multiple_of(self.granularity) {
            return Err(Error::InvalidArgument(format!(
                "import_fd: size {size} must be a non-zero multiple of the granularity {}",
                self.granularity
            )));
        }
        // SAFETY: an all-zero `stat` is a valid value for fstat to overwrite.
        #[allow(clippy::disallowed_methods)] // a plain libc struct: all-zero is valid
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open (owned) and `st` is writable.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(errno_error("fstat", "an imported descriptor".into()));
        }
        if st.st_mode & libc::S_IFMT != libc::S_IFREG || (st.st_size as u64) < size as u64 {
            return Err(Error::InvalidArgument(format!(
                "import_fd: the descriptor is not physical memory of {size} bytes (a file of {} bytes, mode {:o})",
                st.st_size, st.st_mode
            )));
        }
        let mut s = self.state();
        let id = s.next_handle;
        s.next_handle += 1;
        s.handles.insert(
            id,
            Phys {
                fd: fd.into_raw_fd(),
                size,
                released: false,
                maps: 0,
                counted: false,
            },
        );
        Ok(PhysHandle(id))
    }

    fn set_access_read_only(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.protect(va, size, libc::PROT_READ, &[])
    }

    fn peer_readable(&self, va: DevicePtr, len: usize, reader: i32) -> Result<bool> {
        Ok(range_allows(va, len, self.device, reader, AccessMode::Read))
    }

    fn can_access_peer(&self, peer: i32) -> Result<bool> {
        let count = host_device_count()?;
        if !(0..count).contains(&peer) {
            return Err(Error::InvalidArgument(format!(
                "peer device {peer} does not exist: the host backend simulates {count} devices"
            )));
        }
        Ok(peer != self.device)
    }

    fn unmap(&self, va: DevicePtr, size: usize) -> Result<()> {
        self.check_aligned("unmap", va, size)?;
        let mut s = self.state();
        if self.faults.take(FaultOp::Unmap) {
            return Err(injected("unmap"));
        }
        // cuMemUnmap requires the range to cover whole mappings.
        let end = va + size as u64;
        let covered: Vec<(u64, usize, u64)> = s
            .mappings
            .range(va..end)
            .map(|(&m, &(len, h))| (m, len, h))
            .collect();
        if covered.is_empty() || covered.iter().any(|&(m, len, _)| m + len as u64 > end) {
            return Err(Error::InvalidArgument(format!(
                "unmap: [{va:#x}, +{size}) does not cover whole mapped ranges"
            )));
        }
        if Self::overlaps_mapping(&s, va, 0) && !s.mappings.contains_key(&va) {
            return Err(Error::InvalidArgument(format!(
                "unmap: {va:#x} is inside a mapping, not at its start"
            )));
        }
        // SAFETY: the range is inside our reservation; replacing it with a
        // PROT_NONE anonymous mapping keeps the VA reserved and drops the memfd pages.
        let rc = unsafe {
            libc::mmap(
                va as *mut libc::c_void,
                size,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if rc == libc::MAP_FAILED {
            return Err(errno_error("mmap", format!("unmapping [{va:#x}, +{size})")));
        }
        {
            let mut table = interconnect();
            for &(m, _, _) in &covered {
                table.remove(&m);
            }
        }
        for (m, _, h) in covered {
            s.mappings.remove(&m);
            if let Some(p) = s.handles.get_mut(&h) {
                p.maps -= 1;
            }
            Self::drop_phys_if_done(&mut s, h);
        }
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo> {
        let s = self.state();
        Ok(MemInfo {
            free: s.memory_limit.saturating_sub(s.physical_bytes),
            total: s.memory_limit,
        })
    }

    fn synchronize(&self) -> Result<()> {
        if self.faults.take(FaultOp::Synchronize) {
            return Err(injected("synchronize"));
        }
        Ok(())
    }

    fn stream_create(&self) -> Result<StreamId> {
        let mut s = self.state();
        let id = s.next_stream;
        s.next_stream += 1;
        s.streams += 1;
        Ok(StreamId(id))
    }

    fn stream_destroy(&self, stream: StreamId) -> Result<()> {
        if stream == StreamId::DEFAULT {
            return Err(Error::InvalidArgument(
                "cannot destroy the default stream".into(),
            ));
        }
        let mut s = self.state();
        s.streams = s.streams.saturating_sub(1);
        Ok(())
    }

    fn stream_synchronize(&self, _stream: StreamId) -> Result<()> {
        Ok(())
    }

    fn event_create(&self) -> Result<EventId> {
        let mut s = self.state();
        let id = s.next_event;
        s.next_event += 1;
        s.events += 1;
        Ok(EventId(id))
    }

    fn event_destroy(&self, _event: EventId) -> Result<()> {
        let mut s = self.state();
        s.events = s.events.saturating_sub(1);
        Ok(())
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

    unsafe fn copy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const u8,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        self.copy_fault(FaultOp::CopyHtod, "copy_htod")?;
        // SAFETY: the caller guarantees both ranges are valid for `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) };
        Ok(())
    }

    unsafe fn copy_peer_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        src_device: i32,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        self.copy_fault(FaultOp::CopyPeer, "copy_peer")?;
        if !range_allows(dst, len, self.device, self.device, AccessMode::ReadWrite) {
            return Err(Error::InvalidArgument(format!(
                "copy_peer: destination [{dst:#x}, +{len}) is not mapped memory of device {}",
                self.device
            )));
        }
        if !range_allows(src, len, src_device, self.device, AccessMode::Read) {
            return Err(Error::InvalidState(format!(
                "copy_peer: device {} may not read [{src:#x}, +{len}) of device {src_device}: \
                 grant it access first (set_access_peers / Pool::set_peer_access)",
                self.device
            )));
        }
        // SAFETY: both ranges are mapped and accessible (checked above), and
        // distinct devices' memory never overlaps.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) };
        Ok(())
    }

    unsafe fn copy_dtoh_async(
        &self,
        dst: *mut u8,
        src: DevicePtr,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        self.copy_fault(FaultOp::CopyDtoh, "copy_dtoh")?;
        // SAFETY: the caller guarantees both ranges are valid for `len` bytes.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
        Ok(())
    }

    unsafe fn hash_ranges(&self, ranges: &[(DevicePtr, usize)]) -> Result<Vec<u64>> {
        self.copy_fault(FaultOp::Hash, "hash_ranges")?;
        // Tile by tile, as the kernel sums them.
        let mut sums = vec![0u64; ranges.len()];
        for t in hash::tiles(ranges) {
            // SAFETY: the caller guarantees every range is mapped and readable.
            let bytes = unsafe { std::slice::from_raw_parts(t.ptr as *const u8, t.len as usize) };
            let s = &mut sums[t.out as usize];
            *s = s.wrapping_add(hash::sum(bytes, t.word0));
        }
        Ok(sums
            .iter()
            .zip(ranges)
            .map(|(&s, &(_, len))| hash::finish(s, len))
            .collect())
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
        self.copy_fault(FaultOp::CopyHtod, "copy_2d_htod")?;
        if width > dst_pitch || width > src_pitch {
            return Err(Error::InvalidArgument(format!(
                "copy_2d: width {width} exceeds a pitch (dst {dst_pitch}, src {src_pitch})"
            )));
        }
        for row in 0..height {
            // SAFETY: the caller guarantees every row is valid in both ranges.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    src.add(row * src_pitch),
                    (dst as *mut u8).add(row * dst_pitch),
                    width,
                )
            };
        }
        Ok(())
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        len: usize,
        _stream: StreamId,
    ) -> Result<()> {
        self.copy_fault(FaultOp::Memset, "memset")?;
        // SAFETY: the caller guarantees the range is mapped and writable.
        unsafe { std::ptr::write_bytes(dst as *mut u8, value, len) };
        Ok(())
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
        self.copy_fault(FaultOp::Convert, "convert")?;
        // SAFETY: the caller guarantees both ranges are valid, sized for `count`
        // elements of their types, and do not overlap.
        unsafe {
            crate::driver::convert::convert_on_cpu(
                dst as *mut u8,
                to,
                src as *const u8,
                from,
                count,
            )
        };
        Ok(())
    }

    unsafe fn host_register(&self, _ptr: *mut u8, _len: usize, _read_only: bool) -> Result<()> {
        self.copy_fault(FaultOp::HostRegister, "host_register")
    }

    unsafe fn host_unregister(&self, _ptr: *mut u8) -> Result<()> {
        Ok(())
    }

    fn host_alloc(&self, len: usize) -> Result<*mut u8> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(Error::HostOutOfMemory {
                what: format!("host_alloc: {}", std::io::Error::last_os_error()),
                requested: len as u64,
                limit: u64::MAX,
                in_use: 0,
            });
        }
        Ok(p as *mut u8)
    }

    unsafe fn host_free(&self, ptr: *mut u8, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller's contract (our own mapping of `len`).
        unsafe { libc::munmap(ptr as *mut libc::c_void, len.max(1)) };
        Ok(())
    }

    fn as_host(&self) -> Option<&HostDriver> {
        Some(self)
    }

    fn faults(&self) -> Option<&Faults> {
        Some(&self.faults)
    }
}

impl Drop for HostDriver {
    fn drop(&mut self) {
        interconnect().retain(|_, m| m.driver != self.id);
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for p in s.handles.values() {
            if p.fd >= 0 {
                // SAFETY: fds still open belong to unreleased handles of ours.
                unsafe { libc::close(p.fd) };
            }
        }
    }
}
