//! Pinned host memory: [`PinnedHost`], the one owning type for page-locked host
//! buffers (sleep's backup slabs, the loader's staging ring and buffers).
//!
//! The memory is anonymous, advised to use huge pages and populated from many
//! threads before it is registered with the driver, so registration does not
//! fault it in page by page on one thread: on the H200 test machine this pins
//! about ten times faster (~20 GB/s end to end) than `cudaHostAlloc`
//! (~1.9 GB/s).

use std::sync::{Arc, Weak};

use crate::driver::Driver;
use crate::error::{Error, Result};

/// Host memory the kernel reports available for new allocations without
/// swapping (`MemAvailable` of `/proc/meminfo`), or None where it is unknown.
pub fn available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kb.checked_mul(1024)
}

/// Host memory left available after any pinning: the out-of-memory killer
/// acts before available memory reaches zero.
const HEADROOM: u64 = 256 << 20;

/// Refuse to populate `len` bytes for `what` when the host does not have them
/// available (with `HEADROOM` to spare): touching them would wake the
/// kernel's out-of-memory killer instead of returning an error.
pub fn check_available(len: u64, what: &str) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    match available() {
        Some(avail) if len.saturating_add(HEADROOM) > avail => Err(Error::HostOutOfMemory {
            what: format!("{what}: the host has {avail} bytes available and keeps {HEADROOM} free"),
            requested: len,
            limit: avail,
            in_use: 0,
        }),
        _ => Ok(()),
    }
}

/// Pinned buffers made here are whole multiples of this (a huge page).
pub const PINNED_UNIT_BYTES: usize = 2 << 20;

/// The bytes a pinned buffer of `len` bytes holds: whole huge pages. Limits
/// on pinned memory count these, not the bytes asked for. Saturates: a
/// length near `u64::MAX` counts as more than any limit.
pub fn pinned_len(len: u64) -> u64 {
    len.max(1)
        .checked_next_multiple_of(PINNED_UNIT_BYTES as u64)
        .unwrap_or(u64::MAX)
}

/// Map `len` bytes (rounded up to 2 MiB) of private anonymous memory, advise
/// huge pages and touch every page from several threads. Returns the address
/// and the rounded length; free it with [`unmap`]. Refused with
/// `HostOutOfMemory` when the host does not have the bytes available.
fn map_populated(len: usize, what: &str) -> Result<(*mut u8, usize)> {
    if len > crate::units::MAX_BYTES {
        return Err(Error::HostOutOfMemory {
            what: what.to_owned(),
            requested: len as u64,
            limit: crate::units::MAX_BYTES as u64,
            in_use: 0,
        });
    }
    let len = pinned_len(len as u64) as usize;
    check_available(len as u64, what)?;
    // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::HostOutOfMemory {
            what: format!("{what}: {}", std::io::Error::last_os_error()),
            requested: len as u64,
            limit: u64::MAX,
            in_use: 0,
        });
    }
    // SAFETY: advice on our own fresh mapping; failure only loses huge pages.
    unsafe { libc::madvise(p, len, libc::MADV_HUGEPAGE) };
    populate(p as usize, len);
    Ok((p as *mut u8, len))
}

/// Unmap memory from [`map_populated`].
///
/// # Safety
/// `ptr`/`len` must be exactly what `map_populated` returned, not yet unmapped,
/// not registered with a driver any more, and no longer used.
unsafe fn unmap(ptr: *mut u8, len: usize) {
    // SAFETY: forwarded from the caller's contract.
    unsafe { libc::munmap(ptr as *mut libc::c_void, len) };
}

/// The driver a [`PinnedHost`] is registered with.
#[derive(Debug)]
enum Registration {
    /// Not registered yet (populated only).
    None,
    /// Registered; the buffer keeps its driver alive.
    Strong(Arc<dyn Driver>),
    /// Registered; the buffer never keeps its driver alive (a process-wide
    /// cache), and is only unmapped when it outlives it.
    Weak(Weak<dyn Driver>),
    /// Allocated by the driver itself ([`Driver::host_alloc`]), freed by it.
    DriverAllocated(Arc<dyn Driver>),
}

/// One anonymous host mapping, populated from several threads and (once
/// registered) page-locked with a driver. Unregistered and unmapped on drop.
#[derive(Debug)]
pub struct PinnedHost {
    ptr: *mut u8,
    len: usize,
    registration: Registration,
}

// SAFETY: the buffer owns its mapping exclusively; the raw pointer is only an
// address handed to copies that the owner coordinates and synchronizes.
unsafe impl Send for PinnedHost {}
// SAFETY: shared references expose only the address and length.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    /// Map `len` bytes (rounded up to 2 MiB), advise huge pages and touch every
    /// page from several threads; not registered yet (`what` names the buffer
    /// in errors).
    pub fn populated(len: usize, what: &str) -> Result<PinnedHost> {
        let (ptr, len) = map_populated(len, what)?;
        Ok(PinnedHost {
            ptr,
            len,
            registration: Registration::None,
        })
    }

    /// [`PinnedHost::populated`], then registered with `driver`, which the
    /// buffer keeps alive.
    pub fn new(driver: &Arc<dyn Driver>, len: usize, what: &str) -> Result<PinnedHost> {
        let mut m = PinnedHost::populated(len, what)?;
        m.register(driver)?;
        Ok(m)
    }

    /// [`PinnedHost::populated`], then registered with `driver`, which the
    /// buffer holds weakly: a buffer kept in a process-wide cache must not keep
    /// its driver alive.
    pub fn new_weak(driver: &Arc<dyn Driver>, len: usize, what: &str) -> Result<PinnedHost> {
        let mut m = PinnedHost::populated(len, what)?;
        m.register(driver)?;
        m.registration = Registration::Weak(Arc::downgrade(driver));
        Ok(m)
    }

    /// `len` bytes from the driver's own pinned allocator
    /// ([`Driver::host_alloc`], `cuMemHostAlloc`): the slow reference path
    /// benchmarks compare against. Freed by the driver on drop.
    pub fn driver_allocated(driver: &Arc<dyn Driver>, len: usize) -> Result<PinnedHost> {
        let ptr = driver.host_alloc(len)?;
        Ok(PinnedHost {
            ptr,
            len,
            registration: Registration::DriverAllocated(driver.clone()),
        })
    }

    /// Page-lock the buffer with `driver` (a no-op when already registered).
    pub fn register(&mut self, driver: &Arc<dyn Driver>) -> Result<()> {
        if matches!(self.registration, Registration::None) {
            // SAFETY: the mapping is valid for `len` bytes and lives until Drop,
            // which unregisters before unmapping.
            unsafe { driver.host_register(self.ptr, self.len, false)? };
            self.registration = Registration::Strong(driver.clone());
        }
        Ok(())
    }

    /// Start of the buffer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes (a multiple of 2 MiB, except from `driver_allocated`).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a buffer has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True when registered with `driver`.
    pub fn registered_with(&self, driver: &Arc<dyn Driver>) -> bool {
        match &self.registration {
            Registration::None => false,
            Registration::Strong(d) | Registration::DriverAllocated(d) => Arc::ptr_eq(d, driver),
            Registration::Weak(d) => std::ptr::addr_eq(Weak::as_ptr(d), Arc::as_ptr(driver)),
        }
    }

    /// True when both are registered with the same driver.
    pub fn same_driver(&self, other: &PinnedHost) -> bool {
        let addr = |m: &PinnedHost| match &m.registration {
            Registration::None => None,
            Registration::Strong(d) | Registration::DriverAllocated(d) => {
                Some(Arc::as_ptr(d) as *const ())
            }
            Registration::Weak(d) => Some(Weak::as_ptr(d) as *const ()),
        };
        addr(self).is_some() && addr(self) == addr(other)
    }

    /// False when the buffer was registered with a driver that is gone.
    pub fn driver_alive(&self) -> bool {
        match &self.registration {
            Registration::Weak(d) => d.strong_count() > 0,
            _ => true,
        }
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        if let Registration::DriverAllocated(d) = &self.registration {
            // SAFETY: allocated by `host_alloc` with this length; the owner has
            // synchronized every copy that used it.
            let _ = unsafe { d.host_free(self.ptr, self.len) };
            return;
        }
        let driver = match &self.registration {
            Registration::None | Registration::DriverAllocated(_) => None,
            Registration::Strong(d) => Some(d.clone()),
            Registration::Weak(d) => d.upgrade(),
        };
        if let Some(d) = driver {
            // SAFETY: registered by `register`; the owner has synchronized every
            // copy from or into this buffer before dropping it.
            let _ = unsafe { d.host_unregister(self.ptr) };
        }
        // SAFETY: mapped by `map_populated`, unregistered above, no copy uses it.
        unsafe { unmap(self.ptr, self.len) };
    }
}

/// Touch every page of `[base, base+len)` from several threads.
fn populate(base: usize, len: usize) {
    let page = crate::units::page_size();
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);
    let per = len.div_ceil(threads).div_ceil(page) * page;
    std::thread::scope(|s| {
        for t in 0..threads {
            let start = t * per;
            if start >= len {
                break;
            }
            let end = (start + per).min(len);
            s.spawn(move || {
                let mut off = start;
                while off < end {
                    // SAFETY: inside the caller's writable mapping; threads write
                    // disjoint ranges.
                    unsafe { std::ptr::write_volatile((base + off) as *mut u8, 0) };
                    off += page;
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::PinnedHost;
    use crate::driver::host::{HostConfig, HostDriver};
    use crate::driver::Driver;

    #[test]
    fn registration_follows_the_driver_it_was_made_with() {
        let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig::default()));
        let other: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig::default()));
        let strong = PinnedHost::new(&d, 1, "test").unwrap();
        assert_eq!(strong.len(), 2 << 20);
        assert!(strong.registered_with(&d) && !strong.registered_with(&other));
        let weak = PinnedHost::new_weak(&other, 1, "test").unwrap();
        assert!(weak.registered_with(&other) && !weak.same_driver(&strong));
        let populated = PinnedHost::populated(1, "test").unwrap();
        assert!(!populated.registered_with(&d) && !populated.same_driver(&strong));
        drop(other);
        assert!(
            !weak.driver_alive(),
            "a weak registration does not keep its driver"
        );
        assert!(strong.driver_alive());
        let own = PinnedHost::driver_allocated(&d, 4096).unwrap();
        assert_eq!(own.len(), 4096);
        // SAFETY: 4096 bytes of our own allocation.
        unsafe { own.ptr().add(4095).write(1) };
    }

    #[test]
    fn mapping_is_rounded_writable_and_zeroed() {
        let (p, len) = super::map_populated(3 << 20, "test").unwrap();
        assert_eq!(len, 4 << 20);
        // SAFETY: `len` bytes of our own mapping.
        unsafe {
            assert_eq!(*p.add(len - 1), 0);
            p.add(len - 1).write(7);
            super::unmap(p, len);
        }
    }
}
