//! Pinned host staging memory for the copy engine.
//!
//! Allocated as anonymous memory advised to use huge pages, touched by the
//! worker that will use it, then registered with the driver. DESIGN.md: this
//! pins at ~20 GB/s end to end where `cudaHostAlloc` manages ~1.9 GB/s.

use std::sync::{Arc, Mutex, Weak};

use crate::driver::Driver;
use crate::error::Result;

/// One registered, page-locked host buffer. Unregistered and unmapped on drop.
#[derive(Debug)]
pub struct Pinned<'d> {
    driver: &'d dyn Driver,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access to its bytes is
// coordinated by the copy engine (one worker fills a slot, the device reads it
// only after the fill, events guard reuse).
unsafe impl Send for Pinned<'_> {}
// SAFETY: as above; shared references only expose the raw pointer.
unsafe impl Sync for Pinned<'_> {}

impl<'d> Pinned<'d> {
    /// Map `len` bytes, advise huge pages, touch every page, register them.
    pub fn new(driver: &'d dyn Driver, len: usize) -> Result<Pinned<'d>> {
        let (ptr, len) = map_registered(driver, len, "pinned staging buffer")?;
        Ok(Pinned { driver, ptr, len })
    }

    /// Start of the buffer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a buffer has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Map `len` bytes (huge pages, populated from several threads) and register
/// them with `driver`; the mapping is undone when registration fails. The
/// caller unregisters and unmaps (`what` names the buffer in errors).
fn map_registered(driver: &dyn Driver, len: usize, what: &str) -> Result<(*mut u8, usize)> {
    let (p, len) = crate::hostmem::map_populated(len, what)?;
    // SAFETY: the mapping is valid for `len` bytes; the caller unregisters it
    // before unmapping.
    if let Err(e) = unsafe { driver.host_register(p, len, false) } {
        // SAFETY: our own mapping, not registered, not shared.
        unsafe { crate::hostmem::unmap(p, len) };
        return Err(e);
    }
    Ok((p, len))
}

impl Drop for Pinned<'_> {
    fn drop(&mut self) {
        // SAFETY: registered in `new`; the engine synchronizes every copy from
        // this buffer before dropping it.
        let _ = unsafe { self.driver.host_unregister(self.ptr) };
        // SAFETY: mapped by `map_populated`, unregistered above, no copy uses it.
        unsafe { crate::hostmem::unmap(self.ptr, self.len) };
    }
}

/// A pinned staging ring kept across loads: anonymous memory advised to use
/// huge pages, populated from several threads, registered once. Pinning costs
/// far more than a load's copies into it, so it is cached process-wide (one per
/// driver) and handed to each load and to every Reload replay; see
/// [`acquire_ring`], [`release_staging`].
///
/// Holds its driver weakly, so a cached ring never keeps a driver alive; a ring
/// outliving its driver is only unmapped.
#[derive(Debug)]
pub struct Ring {
    driver: Weak<dyn Driver>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the ring is plain memory owned by this value; the copy engine gives
// each worker disjoint slots and guards reuse with events.
unsafe impl Send for Ring {}
// SAFETY: as above; shared references only expose the raw pointer.
unsafe impl Sync for Ring {}

impl Ring {
    fn new(driver: &Arc<dyn Driver>, len: usize) -> Result<Ring> {
        let (p, len) = map_registered(driver.as_ref(), len, "pinned staging ring")?;
        Ok(Ring {
            driver: Arc::downgrade(driver),
            ptr: p,
            len,
        })
    }

    /// Start of the ring.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (a ring has at least one page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn belongs_to(&self, driver: &Arc<dyn Driver>) -> bool {
        std::ptr::addr_eq(Weak::as_ptr(&self.driver), Arc::as_ptr(driver))
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        if let Some(d) = self.driver.upgrade() {
            // SAFETY: registered in `new`; every copy from the ring completed
            // before it was handed back.
            let _ = unsafe { d.host_unregister(self.ptr) };
        }
        // SAFETY: mapped by `map_populated`, unregistered above, no copy uses it.
        unsafe { crate::hostmem::unmap(self.ptr, self.len) };
    }
}

/// The cached rings, at most one per driver.
static RINGS: Mutex<Vec<Ring>> = Mutex::new(Vec::new());

fn rings() -> std::sync::MutexGuard<'static, Vec<Ring>> {
    RINGS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Take the cached ring of `driver` if it has at least `len` bytes, else pin a
/// new one. Returns the ring and whether it was reused. Give it back with
/// [`return_ring`] once every copy from it has completed.
pub fn acquire_ring(driver: &Arc<dyn Driver>, len: usize) -> Result<(Ring, bool)> {
    let stale = {
        let mut g = rings();
        // Rings of dropped drivers, and a too-small ring of this one, go.
        let mut stale = Vec::new();
        let mut i = 0;
        let mut found = None;
        while i < g.len() {
            if g[i].driver.strong_count() == 0 {
                stale.push(g.swap_remove(i));
            } else if g[i].belongs_to(driver) {
                let r = g.swap_remove(i);
                if r.len >= len {
                    found = Some(r);
                } else {
                    stale.push(r);
                }
            } else {
                i += 1;
            }
        }
        if let Some(r) = found {
            return Ok((r, true));
        }
        stale
    };
    drop(stale);
    Ok((Ring::new(driver, len)?, false))
}

/// Hand a ring back to the cache (keeping the larger one if a concurrent load
/// returned one for the same driver first).
pub fn return_ring(ring: Ring) {
    let mut g = rings();
    let drop_old = match g.iter().position(|r| r.driver.ptr_eq(&ring.driver)) {
        Some(i) if g[i].len >= ring.len => return drop_outside(g, ring),
        Some(i) => Some(g.swap_remove(i)),
        None => None,
    };
    g.push(ring);
    drop(g);
    drop(drop_old);
}

fn drop_outside(g: std::sync::MutexGuard<'static, Vec<Ring>>, ring: Ring) {
    drop(g);
    drop(ring);
}

/// Unpin and free every cached staging ring (they are otherwise kept for the
/// life of the process, so later loads and Reload wakes skip pinning).
pub fn release_staging() {
    let all = std::mem::take(&mut *rings());
    drop(all);
}

/// Unpin and free the cached staging ring of `driver`; returns its bytes (0
/// when none is cached). A load or Reload replay running now holds its ring
/// outside the cache and caches it again when it finishes.
pub fn release_staging_for(driver: &Arc<dyn Driver>) -> usize {
    let mine: Vec<Ring> = {
        let mut g = rings();
        let (mine, rest): (Vec<Ring>, Vec<Ring>) = std::mem::take(&mut *g)
            .into_iter()
            .partition(|r| r.belongs_to(driver));
        *g = rest;
        mine
    };
    // Unregistered outside the lock: unpinning takes a while.
    mine.iter().map(|r| r.len).sum()
}

/// Bytes of pinned staging currently cached for `driver` (0 when none).
pub fn cached_staging_bytes(driver: &Arc<dyn Driver>) -> usize {
    rings()
        .iter()
        .filter(|r| r.belongs_to(driver))
        .map(|r| r.len)
        .sum()
}

/// Estimated share of the source bytes of `extents` that are in the page cache:
/// `mincore` on 64 probes of up to 1 MiB at evenly spaced source bytes (a few
/// hundred microseconds, where checking all of a 16 GB checkpoint would take
/// tens of milliseconds).
pub fn resident_share(shards: &[crate::loader::Shard], extents: &[crate::loader::Extent]) -> f64 {
    const PROBES: u64 = 64;
    const PROBE_BYTES: u64 = 1 << 20;
    let total: u64 = extents.iter().map(crate::loader::Extent::src_bytes).sum();
    if total == 0 {
        return 1.0;
    }
    let (mut weighted, mut weight) = (0.0, 0.0);
    let (mut k, mut before) = (0u64, 0u64);
    for e in extents {
        let n = e.src_bytes();
        // Probes whose evenly spaced source byte falls inside this extent.
        while k < PROBES && (k * total / PROBES) < before + n {
            let within = k * total / PROBES - before;
            k += 1;
            let Some(shard) = shards.get(e.shard as usize).filter(|s| s.map.is_some()) else {
                continue;
            };
            let (row, col) = (within / e.width, within % e.width);
            let at = e.src + row * e.src_pitch + col;
            // Contiguous rows read on; a strided extent's probe stays in its row.
            let run = if e.src_pitch == e.width {
                n - within
            } else {
                e.width - col
            };
            let len = run.min(PROBE_BYTES).min(shard.len.saturating_sub(at));
            if len == 0 {
                continue;
            }
            weighted += resident_fraction(shard.ptr(at), len as usize) * len as f64;
            weight += len as f64;
        }
        before += n;
    }
    if weight == 0.0 {
        1.0
    } else {
        weighted / weight
    }
}

/// Fraction of the pages of `[ptr, ptr+len)` resident in memory (page cache), via `mincore`.
pub fn resident_fraction(ptr: *const u8, len: usize) -> f64 {
    if len == 0 || ptr.is_null() {
        return 1.0;
    }
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = (ptr as usize + len).div_ceil(page) * page;
    let pages = (end - start) / page;
    let mut vec = vec![0u8; pages];
    // SAFETY: `start..end` lies within a mapping the caller holds (a shard's mmap);
    // `vec` has one byte per page as mincore requires.
    let rc = unsafe {
        libc::mincore(
            start as *mut libc::c_void,
            end - start,
            vec.as_mut_ptr() as *mut libc::c_uchar,
        )
    };
    if rc != 0 {
        return 0.0;
    }
    vec.iter().filter(|&&b| b & 1 != 0).count() as f64 / pages as f64
}
