//! Pinned host staging memory for the copy engine: the staging ring each load
//! and Reload replay uses, pinned once and cached process-wide per driver
//! (pinning costs far more than a load's copies into it), and the page-cache
//! residency probes that pick between memcpy and pread.

use std::sync::{Arc, Mutex};

use crate::driver::Driver;
use crate::error::Result;
use crate::hostmem::PinnedHost;

/// A pinned staging ring kept across loads ([`PinnedHost`] holding its driver
/// weakly, so a cached ring never keeps a driver alive; a ring outliving its
/// driver is only unmapped). Handed to each load and to every Reload replay;
/// see [`acquire_ring`], [`release_staging`].
pub type Ring = PinnedHost;

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
            if !g[i].driver_alive() {
                stale.push(g.swap_remove(i));
            } else if g[i].registered_with(driver) {
                let r = g.swap_remove(i);
                if r.len() >= len {
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
    Ok((Ring::new_weak(driver, len, "pinned staging ring")?, false))
}

/// Hand a ring back to the cache (keeping the larger one if a concurrent load
/// returned one for the same driver first).
pub fn return_ring(ring: Ring) {
    let mut g = rings();
    let drop_old = match g.iter().position(|r| r.same_driver(&ring)) {
        Some(i) if g[i].len() >= ring.len() => return drop_outside(g, ring),
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
            .partition(|r| r.registered_with(driver));
        *g = rest;
        mine
    };
    // Unregistered outside the lock: unpinning takes a while.
    mine.iter().map(|r| r.len()).sum()
}

/// Bytes of pinned staging currently cached for `driver` (0 when none).
pub fn cached_staging_bytes(driver: &Arc<dyn Driver>) -> usize {
    rings()
        .iter()
        .filter(|r| r.registered_with(driver))
        .map(|r| r.len())
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
