//! Pinned host memory for sleep's offload backups: an arena of page-locked
//! slabs that persists across sleep/wake cycles, so only the first sleep (or
//! an explicit reserve-ahead) pays for pinning.
//!
//! Pinning is the cost to beat: `cudaHostAlloc` pins about 1.9 GB/s on the
//! H200 machine, while mapping anonymous memory, advising huge pages, touching
//! it from many threads and then registering it with the driver runs about
//! ten times faster. Slabs are [`PinnedHost`] buffers, made that way.

use std::sync::Arc;

use crate::driver::Driver;
use crate::error::{Error, Result};
use crate::hostmem::{pinned_len, PinnedHost};

/// Default slab size: big enough that slab count stays small, small enough that
/// creating the next slab overlaps the copies into the previous one.
pub const DEFAULT_SLAB_BYTES: usize = 1 << 30;

/// Slab size of the pinning pipeline: small enough that the first copies start
/// early, large enough that the driver's per-registration cost stays small.
pub const PIPELINE_SLAB_BYTES: usize = 256 << 20;

/// Map and populate a backup slab of `len` bytes, not yet registered (the
/// first stage of the pinning pipeline; registering is the second).
fn populated_slab(len: usize) -> Result<PinnedHost> {
    if len == 0 {
        return Err(Error::InvalidArgument("pinned slab of 0 bytes".into()));
    }
    PinnedHost::populated(len, "mapping a backup slab")
}

/// A backup slab: mapped, populated and registered with `driver`.
fn pinned_slab(driver: &Arc<dyn Driver>, len: usize) -> Result<PinnedHost> {
    let mut slab = populated_slab(len)?;
    slab.register(driver)?;
    Ok(slab)
}

impl Drop for BackupArena {
    fn drop(&mut self) {
        self.finish_prefetch();
    }
}

/// A range of the backup arena: `len` bytes at `offset` of slab `slab`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackupRange {
    /// Slab index.
    pub slab: usize,
    /// Offset in the slab.
    pub offset: usize,
    /// Length.
    pub len: usize,
}

#[derive(Debug)]
struct Slab {
    mem: PinnedHost,
    /// Free ranges (offset, len), sorted by offset, merged.
    free: Vec<(usize, usize)>,
}

/// Pinned slabs with first-fit allocation. Held memory stays pinned across
/// cycles until `release_unused` (or the drop of the arena).
#[derive(Debug)]
pub struct BackupArena {
    driver: Arc<dyn Driver>,
    slabs: Vec<Option<Slab>>,
    slab_bytes: usize,
    limit: u64,
    /// Bytes the current sleep still expects to need: new slabs are no larger
    /// than that, so a small first sleep pins little.
    growth_hint: Option<u64>,
    /// Slabs being pinned in the background, in order.
    prefetch: Option<Prefetch>,
}

/// The pinning pipeline: one thread maps and populates slabs (with many
/// threads of its own), a second registers them with the driver, so the two
/// stages overlap each other and the copies into slabs already pinned.
#[derive(Debug)]
struct Prefetch {
    ready: std::sync::mpsc::Receiver<Result<PinnedHost>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Prefetch {
    fn start(driver: Arc<dyn Driver>, sizes: Vec<usize>) -> Prefetch {
        use std::sync::mpsc::sync_channel;
        let (pop_tx, pop_rx) = sync_channel::<Result<PinnedHost>>(1);
        let (ready_tx, ready_rx) = sync_channel::<Result<PinnedHost>>(2);
        let populate = std::thread::spawn(move || {
            for len in sizes {
                let slab = populated_slab(len);
                let failed = slab.is_err();
                if pop_tx.send(slab).is_err() || failed {
                    return;
                }
            }
        });
        let register = std::thread::spawn(move || {
            for slab in pop_rx {
                let slab = slab.and_then(|mut s| s.register(&driver).map(|_| s));
                let failed = slab.is_err();
                if ready_tx.send(slab).is_err() || failed {
                    return;
                }
            }
        });
        Prefetch {
            ready: ready_rx,
            threads: vec![populate, register],
        }
    }
}

impl BackupArena {
    /// An empty arena. `limit` caps the pinned bytes it may hold.
    pub fn new(driver: Arc<dyn Driver>, slab_bytes: usize, limit: u64) -> BackupArena {
        BackupArena {
            driver,
            slabs: Vec::new(),
            slab_bytes: slab_bytes.max(crate::units::page_size()),
            limit,
            growth_hint: None,
            prefetch: None,
        }
    }

    /// Pinned bytes held (in use or free).
    pub fn held(&self) -> u64 {
        self.slabs
            .iter()
            .flatten()
            .map(|s| s.mem.len() as u64)
            .sum()
    }

    /// Pinned bytes free for new backups.
    pub fn free_bytes(&self) -> u64 {
        self.slabs
            .iter()
            .flatten()
            .flat_map(|s| s.free.iter().map(|&(_, l)| l as u64))
            .sum()
    }

    /// The configured limit on held bytes.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Change the size of slabs made on demand from now on.
    pub fn set_slab_bytes(&mut self, bytes: usize) {
        self.slab_bytes = bytes.max(crate::units::page_size());
    }

    /// Change the limit (does not release memory already held).
    pub fn set_limit(&mut self, limit: u64) {
        self.limit = limit;
    }

    /// Start pinning `bytes` in the background, in slabs of at most
    /// `piece` bytes, to be taken in order by later allocations. The caller
    /// has checked `bytes` against the limit. Call `finish_prefetch` after.
    pub fn start_prefetch(&mut self, bytes: u64, piece: usize) {
        self.finish_prefetch();
        // Whole pinned pages, so the slabs pin `pinned_len(bytes)` in all:
        // what the callers counted against the limit.
        let piece = pinned_len(piece as u64) as usize;
        let mut sizes = Vec::new();
        let mut left = bytes as usize;
        while left > 0 {
            let n = left.min(piece);
            sizes.push(n);
            left -= n;
        }
        if !sizes.is_empty() {
            self.prefetch = Some(Prefetch::start(self.driver.clone(), sizes));
        }
    }

    /// Wait for the background pinning to stop; slabs it made that no
    /// allocation took stay in the arena as free memory.
    pub fn finish_prefetch(&mut self) {
        if let Some(p) = self.prefetch.take() {
            let Prefetch { ready, threads } = p;
            for slab in ready.iter().flatten() {
                self.push_slab(slab);
            }
            for t in threads {
                let _ = t.join();
            }
        }
    }

    /// Stop the background pinning where it is: slabs it pinned that no
    /// allocation took are given back, and nothing more is pinned.
    pub fn stop_prefetch(&mut self) {
        if let Some(Prefetch { ready, threads }) = self.prefetch.take() {
            // A closed channel ends both stages at their next send; what is
            // in flight is unpinned as it drops.
            drop(ready);
            for t in threads {
                let _ = t.join();
            }
        }
    }

    /// The next slab of the background pinning, if one is coming.
    fn take_prefetched(&mut self) -> Option<Result<usize>> {
        let p = self.prefetch.as_ref()?;
        match p.ready.recv() {
            Ok(Ok(slab)) => {
                // Pinned for the current operation's need, as a slab that
                // `add_slab` makes is.
                if let Some(h) = self.growth_hint.as_mut() {
                    *h = h.saturating_sub(slab.len() as u64);
                }
                Some(Ok(self.push_slab(slab)))
            }
            Ok(Err(e)) => {
                self.finish_prefetch();
                Some(Err(e))
            }
            Err(_) => {
                self.finish_prefetch();
                None
            }
        }
    }

    fn push_slab(&mut self, mem: PinnedHost) -> usize {
        let slab = Slab {
            free: vec![(0, mem.len())],
            mem,
        };
        if let Some(i) = self.slabs.iter().position(Option::is_none) {
            self.slabs[i] = Some(slab);
            i
        } else {
            self.slabs.push(Some(slab));
            self.slabs.len() - 1
        }
    }

    /// Expect `bytes` more backup in the current operation (None: no expectation).
    pub fn set_growth_hint(&mut self, bytes: Option<u64>) {
        self.growth_hint = bytes;
    }

    fn new_slab_len(&self, missing: usize) -> usize {
        let cap = self
            .growth_hint
            .map_or(self.slab_bytes, |h| self.slab_bytes.min(h as usize));
        missing.max(cap)
    }

    /// The host address of a range.
    pub fn host_ptr(&self, r: BackupRange) -> *mut u8 {
        let slab = self.slabs[r.slab]
            .as_ref()
            .expect("backup range refers to a released slab");
        // SAFETY: ranges handed out lie inside their slab.
        unsafe { slab.mem.ptr().add(r.offset) }
    }

    /// Allocate `len` bytes, adding a slab of at least `len` bytes when no free
    /// range fits.
    pub fn alloc(&mut self, len: usize) -> Result<BackupRange> {
        if len == 0 {
            return Err(Error::InvalidArgument("backup of 0 bytes".into()));
        }
        if let Some(r) = self.alloc_existing(len) {
            return Ok(r);
        }
        let idx = self.add_slab(self.new_slab_len(len))?;
        self.alloc_existing_in(idx, len)
            .ok_or_else(|| Error::InvalidState("new backup slab too small".into()))
    }

    /// Allocate `len` bytes as one or more ranges, using free space first and
    /// adding one slab for what is missing. A backup need not be contiguous,
    /// so memory pinned ahead of time in any slab size is always usable.
    pub fn alloc_pieces(&mut self, len: usize) -> Result<Vec<BackupRange>> {
        if len == 0 {
            return Err(Error::InvalidArgument("backup of 0 bytes".into()));
        }
        let mut pieces = Vec::new();
        let mut missing = len;
        while missing > 0 {
            let largest = self
                .slabs
                .iter()
                .enumerate()
                .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
                .flat_map(|(i, s)| s.free.iter().map(move |&(_, l)| (i, l)))
                .max_by_key(|&(_, l)| l);
            let got = match largest {
                Some((i, l)) if l > 0 => self.alloc_existing_in(i, l.min(missing)),
                _ => None,
            };
            if got.is_none() {
                match self.take_prefetched() {
                    Some(Ok(_)) => continue,
                    Some(Err(e)) => {
                        for p in pieces {
                            self.free(p);
                        }
                        return Err(e);
                    }
                    None => {}
                }
            }
            let r = match got {
                Some(r) => r,
                None => match self.add_slab(self.new_slab_len(missing)) {
                    Ok(i) => self
                        .alloc_existing_in(i, missing)
                        .ok_or_else(|| Error::InvalidState("new backup slab too small".into()))?,
                    Err(e) => {
                        for p in pieces {
                            self.free(p);
                        }
                        return Err(e);
                    }
                },
            };
            missing -= r.len;
            pieces.push(r);
        }
        Ok(pieces)
    }

    /// Make sure at least `bytes` are free, adding slabs as needed (reserve-ahead).
    /// Checked before anything is pinned: the limit and the host's available
    /// memory (`HostOutOfMemory`). On a failure midway, the slabs this call
    /// pinned are unpinned again: the arena is as before.
    pub fn reserve(&mut self, bytes: u64) -> Result<()> {
        let missing = bytes.saturating_sub(self.free_bytes());
        if missing == 0 {
            return Ok(());
        }
        let held = self.held();
        if held.saturating_add(pinned_len(missing)) > self.limit {
            return Err(Error::HostOutOfMemory {
                what: format!("reserving {bytes} bytes of pinned backup"),
                requested: missing,
                limit: self.limit,
                in_use: held,
            });
        }
        crate::hostmem::check_available(missing, "reserving pinned backup")?;
        let was_free: Vec<bool> = self.slabs.iter().map(Option::is_none).collect();
        let r = self.reserve_missing(bytes, missing);
        if r.is_err() {
            // Undo: slabs that are new (a fresh index or a refilled hole) go.
            for (i, slab) in self.slabs.iter_mut().enumerate() {
                if !matches!(was_free.get(i), Some(false)) {
                    *slab = None;
                }
            }
            while matches!(self.slabs.last(), Some(None)) {
                self.slabs.pop();
            }
        }
        r
    }

    fn reserve_missing(&mut self, bytes: u64, missing: u64) -> Result<()> {
        self.start_prefetch(missing, PIPELINE_SLAB_BYTES);
        let mut first_error = None;
        while let Some(r) = self.take_prefetched() {
            if let Err(e) = r {
                first_error.get_or_insert(e);
            }
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        while self.free_bytes() < bytes {
            let missing = (bytes - self.free_bytes()) as usize;
            self.add_slab(missing.min(self.slab_bytes).max(1))?;
        }
        Ok(())
    }

    /// Return a range to the arena (the memory stays pinned).
    pub fn free(&mut self, r: BackupRange) {
        let Some(slab) = self.slabs.get_mut(r.slab).and_then(Option::as_mut) else {
            return;
        };
        let pos = slab.free.partition_point(|&(o, _)| o < r.offset);
        slab.free.insert(pos, (r.offset, r.len));
        // Merge with neighbours.
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(slab.free.len());
        for &(o, l) in &slab.free {
            match merged.last_mut() {
                Some((mo, ml)) if *mo + *ml == o => *ml += l,
                _ => merged.push((o, l)),
            }
        }
        slab.free = merged;
    }

    /// Unpin and unmap every slab that holds no backup. Returns the bytes released.
    pub fn release_unused(&mut self) -> u64 {
        let mut released = 0;
        for s in self.slabs.iter_mut() {
            let unused = s
                .as_ref()
                .is_some_and(|s| s.free.len() == 1 && s.free[0] == (0, s.mem.len()));
            if unused {
                released += s.as_ref().map_or(0, |s| s.mem.len() as u64);
                *s = None;
            }
        }
        while matches!(self.slabs.last(), Some(None)) {
            self.slabs.pop();
        }
        released
    }

    /// Unpin and unmap those of `slabs` that hold no backup now (a freed
    /// segment's backup lay in them). Returns the bytes released.
    pub fn release_if_unused(&mut self, slabs: &[usize]) -> u64 {
        let mut released = 0;
        for &i in slabs {
            let Some(s) = self.slabs.get_mut(i) else {
                continue;
            };
            let unused = s
                .as_ref()
                .is_some_and(|s| s.free.len() == 1 && s.free[0] == (0, s.mem.len()));
            if unused {
                released += s.as_ref().map_or(0, |s| s.mem.len() as u64);
                *s = None;
            }
        }
        while matches!(self.slabs.last(), Some(None)) {
            self.slabs.pop();
        }
        released
    }

    fn add_slab(&mut self, len: usize) -> Result<usize> {
        let held = self.held();
        if held.saturating_add(pinned_len(len as u64)) > self.limit {
            return Err(Error::HostOutOfMemory {
                what: format!("pinned backup slab of {len} bytes"),
                requested: len as u64,
                limit: self.limit,
                in_use: held,
            });
        }
        let mem = pinned_slab(&self.driver, len)?;
        if let Some(h) = self.growth_hint.as_mut() {
            *h = h.saturating_sub(mem.len() as u64);
        }
        Ok(self.push_slab(mem))
    }

    fn alloc_existing(&mut self, len: usize) -> Option<BackupRange> {
        (0..self.slabs.len()).find_map(|i| self.alloc_existing_in(i, len))
    }

    fn alloc_existing_in(&mut self, i: usize, len: usize) -> Option<BackupRange> {
        let slab = self.slabs.get_mut(i)?.as_mut()?;
        let pos = slab.free.iter().position(|&(_, l)| l >= len)?;
        let (o, l) = slab.free[pos];
        if l == len {
            slab.free.remove(pos);
        } else {
            slab.free[pos] = (o + len, l - len);
        }
        Some(BackupRange {
            slab: i,
            offset: o,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::host::{HostConfig, HostDriver};

    fn arena(limit: u64) -> BackupArena {
        BackupArena::new(
            Arc::new(HostDriver::new(HostConfig::default())),
            2 << 20,
            limit,
        )
    }

    #[test]
    fn first_fit_reuses_and_merges() {
        let mut a = arena(u64::MAX);
        let r1 = a.alloc(4096).unwrap();
        let r2 = a.alloc(8192).unwrap();
        assert_eq!(a.held(), 2 << 20, "slabs are whole 2 MiB pages");
        a.free(r1);
        a.free(r2);
        assert_eq!(a.free_bytes(), 2 << 20);
        let big = a.alloc((2 << 20) - 4096).unwrap();
        assert_eq!(big.offset, 0, "freed neighbours merged into one range");
        a.free(big);
        assert_eq!(a.release_unused(), 2 << 20);
        assert_eq!(a.held(), 0);
    }

    #[test]
    fn limit_is_enforced_and_reported() {
        let mut a = arena(2 << 20);
        a.alloc(2 << 20).unwrap();
        let e = a.alloc(4096).unwrap_err();
        assert!(
            matches!(e, Error::HostOutOfMemory { limit, .. } if limit == 2 << 20),
            "{e}"
        );
    }

    #[test]
    fn reserve_checks_the_limit_before_pinning() {
        let mut a = arena(8 << 20);
        a.reserve(2 << 20).unwrap();
        let held = a.held();
        // Over the limit: refused before anything is pinned (1 << 63 would be
        // 2^35 slabs).
        for bytes in [1u64 << 63, u64::MAX, 16 << 20] {
            let e = a.reserve(bytes).unwrap_err();
            assert!(matches!(e, Error::HostOutOfMemory { .. }), "{e}");
            assert_eq!(a.held(), held, "nothing pinned by a refused reserve");
        }
        assert!(a.free_bytes() >= 2 << 20, "earlier reserve kept");
        a.reserve(6 << 20).unwrap();
    }

    #[test]
    fn reserve_ahead_grows_free_space() {
        let mut a = arena(u64::MAX);
        a.reserve(3 << 20).unwrap();
        assert!(a.free_bytes() >= 3 << 20);
        let held = a.held();
        a.alloc(1 << 20).unwrap();
        assert_eq!(
            a.held(),
            held,
            "reserved memory is used, nothing new pinned"
        );
    }

    #[test]
    fn prefetched_slabs_serve_allocations_in_order_and_leftovers_stay_free() {
        let mut a = arena(u64::MAX);
        a.start_prefetch(6 << 20, 2 << 20); // three slabs of 2 MiB
        let pieces = a.alloc_pieces(3 << 20).unwrap();
        assert_eq!(pieces.iter().map(|p| p.len).sum::<usize>(), 3 << 20);
        assert!(
            pieces.len() >= 2,
            "a backup spans prefetched slabs: {pieces:?}"
        );
        a.finish_prefetch();
        assert_eq!(a.held(), 6 << 20, "nothing pinned beyond the prefetch");
        assert_eq!(a.free_bytes(), 3 << 20);
    }

    #[test]
    fn slab_memory_is_writable() {
        let mut a = arena(u64::MAX);
        let r = a.alloc(1 << 16).unwrap();
        let p = a.host_ptr(r);
        // SAFETY: the range is 64 KiB inside a live slab.
        unsafe {
            std::ptr::write_bytes(p, 0x5a, 1 << 16);
            assert_eq!(*p.add((1 << 16) - 1), 0x5a);
        }
    }
}
