//! A segment: one VA reservation and the physical chunks mapped into it.
//!
//! The reservation lives as long as the segment; chunks come and go. A chunk
//! is a granularity-multiple run of the segment backed by one physical handle
//! (or by none while unmapped: asleep, or not yet committed). Splitting a
//! segment into several chunks lets part of it be unmapped and remapped (sleep,
//! arena growth and trim) and keeps per-call driver costs bounded.
//!
//! Every operation that creates or maps undoes its own steps on failure: no
//! leaked handle, no leaked VA, and the segment is as it was before the call.

use std::sync::Arc;

use crate::driver::{round_up, AccessMode, CreateFlags, DevicePtr, Driver, PeerAccess, PhysHandle};
use crate::error::{Error, Result};

/// One run of a segment that is mapped to a single physical handle, or unmapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Offset from the segment's base, a granularity multiple.
    pub offset: usize,
    /// Length, a granularity multiple.
    pub size: usize,
    /// The physical memory behind it, `None` while unmapped.
    pub handle: Option<PhysHandle>,
}

/// What a segment's memory is doing with respect to sleep/wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SleepState {
    /// Physically backed and accessible.
    #[default]
    Awake,
    /// Released; contents kept in a host backup, restored at wake.
    Offloaded,
    /// Released; contents lost, memory comes back mapped but undefined at wake.
    Discarded,
    /// Released; contents restored at wake from the checkpoint they were loaded from.
    Reloadable,
}

/// One VA reservation and its chunks. Dropping it synchronizes the device,
/// unmaps, releases and frees the VA, in that order; when that synchronize
/// fails, nothing is unmapped (queued work may still use the memory): the
/// memory and the VA are leaked, never unmapped under running work. A range
/// whose unmap fails keeps its reservation (never freed, so never handed out
/// again). Callers that can report failures use [`Segment::close`] instead
/// (see `Pool::free`).
#[derive(Debug)]
pub struct Segment {
    driver: Arc<dyn Driver>,
    /// Never reused in the process, also when the VA is reserved again.
    id: u64,
    va: DevicePtr,
    reserved: usize,
    /// Bytes from the base that have chunks (mapped or not); `<= reserved`.
    committed: usize,
    /// Chunk size used when committing; a granularity multiple.
    chunk_size: usize,
    chunks: Vec<Chunk>,
    /// Chunks given physical memory over the segment's life: what is behind
    /// it changed whenever this did (handle values may be reused).
    mappings: u64,
    sleep_state: SleepState,
    /// Unmapped handles whose release failed, with their sizes (see
    /// [`Segment::unmap_chunk`]); retried by later unmaps, trims and drop.
    orphans: Vec<(PhysHandle, usize)>,
    /// The reservation was given back by [`Segment::close`]: drop has nothing to do.
    closed: bool,
    /// Peer devices granted access; applied to every chunk mapped later too,
    /// so the grant outlives sleep/wake and arena growth.
    peers: Vec<PeerAccess>,
    /// How every chunk is created, now and at each wake.
    flags: CreateFlags,
}

impl Segment {
    /// Reserve `reserved` bytes of VA (rounded up to the granularity), with no memory behind it.
    ///
    /// `chunk_size` (rounded up to the granularity; 0 = one chunk per commit) bounds
    /// the size of each physical handle created later.
    pub fn reserve(driver: Arc<dyn Driver>, reserved: usize, chunk_size: usize) -> Result<Segment> {
        let g = driver.granularity();
        if reserved == 0 {
            return Err(Error::InvalidArgument(
                "segment size must be greater than zero".into(),
            ));
        }
        for (what, n) in [("segment size", reserved), ("chunk size", chunk_size)] {
            if n > crate::units::MAX_BYTES {
                return Err(Error::InvalidArgument(format!(
                    "{what} of {n} bytes is over the limit of {} bytes (2^56)",
                    crate::units::MAX_BYTES
                )));
            }
        }
        let reserved = round_up(reserved, g);
        let chunk_size = if chunk_size == 0 {
            0
        } else {
            round_up(chunk_size, g)
        };
        let va = driver.reserve(reserved, 0)?;
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Ok(Segment {
            driver,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            va,
            reserved,
            committed: 0,
            chunk_size,
            chunks: Vec::new(),
            mappings: 0,
            sleep_state: SleepState::Awake,
            orphans: Vec::new(),
            closed: false,
            peers: Vec::new(),
            flags: CreateFlags::default(),
        })
    }

    /// Reserve and back `size` bytes (rounded up to the granularity) with
    /// physical memory in chunks of at most `chunk_size` bytes (0 = one chunk).
    pub fn allocate(driver: Arc<dyn Driver>, size: usize, chunk_size: usize) -> Result<Segment> {
        Segment::allocate_with(driver, size, chunk_size, CreateFlags::default())
    }

    /// [`Segment::allocate`] with every chunk created with `flags`, now and
    /// at each wake.
    pub fn allocate_with(
        driver: Arc<dyn Driver>,
        size: usize,
        chunk_size: usize,
        flags: CreateFlags,
    ) -> Result<Segment> {
        let mut seg = Segment::reserve(driver, size, chunk_size)?;
        seg.flags = flags;
        let reserved = seg.reserved;
        // On failure `seg` drops here and frees its VA.
        seg.commit(reserved)?;
        Ok(seg)
    }

    /// This segment's identity: unique in the process and never reused, so
    /// a segment reserved again at the same address is told apart.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The base address. Stable for the segment's whole life.
    pub fn ptr(&self) -> DevicePtr {
        self.va
    }

    /// Bytes of VA reserved.
    pub fn reserved(&self) -> usize {
        self.reserved
    }

    /// Bytes from the base that have chunks (mapped or asleep).
    pub fn committed(&self) -> usize {
        self.committed
    }

    /// Bytes currently backed by physical memory ("tracked").
    pub fn mapped_bytes(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.handle.is_some())
            .map(|c| c.size)
            .sum()
    }

    /// True when every committed chunk is mapped.
    pub fn is_fully_mapped(&self) -> bool {
        self.chunks.iter().all(|c| c.handle.is_some())
    }

    /// The chunks, in address order.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    /// How many times a chunk of this segment was given physical memory
    /// (commit, wake): equal at two moments, with the same chunks mapped
    /// and the same [`Segment::id`], means the same memory is behind it. A
    /// handle's value says nothing of the kind: a driver may hand a
    /// released handle's value to the next allocation.
    pub fn mappings(&self) -> u64 {
        self.mappings
    }

    /// Whether the segment is awake or asleep, and how it sleeps.
    pub fn sleep_state(&self) -> SleepState {
        self.sleep_state
    }

    /// Record the sleep state (set by the sleep engine once the chunks are unmapped or mapped).
    pub fn set_sleep_state(&mut self, state: SleepState) {
        self.sleep_state = state;
    }

    /// How this segment's chunks are created.
    pub fn create_flags(&self) -> CreateFlags {
        self.flags
    }

    /// Create every chunk committed or mapped from now on with `flags` (a
    /// wake too). Chunks that exist keep how they were made: set it before
    /// the first commit.
    pub fn set_create_flags(&mut self, flags: CreateFlags) {
        self.flags = flags;
    }

    /// The peers granted access to this segment's memory.
    pub fn peers(&self) -> &[PeerAccess] {
        &self.peers
    }

    /// Grant `peers` access to every mapped chunk now and to every chunk
    /// mapped later (wake, growth). Peers of the earlier grant missing from
    /// `peers` lose their access. On failure the earlier grant is put back on
    /// the chunks already changed and the error is returned.
    pub fn set_peers(&mut self, peers: &[PeerAccess]) -> Result<()> {
        let mut list: Vec<PeerAccess> = peers
            .iter()
            .copied()
            .filter(|p| p.mode != AccessMode::None)
            .collect();
        list.sort();
        // Revoke peers that had access and are no longer listed.
        let mut apply = list.clone();
        for old in &self.peers {
            if !apply.iter().any(|p| p.device == old.device) {
                apply.push(PeerAccess {
                    device: old.device,
                    mode: AccessMode::None,
                });
            }
        }
        let mapped: Vec<(usize, usize)> = self
            .chunks
            .iter()
            .filter(|c| c.handle.is_some())
            .map(|c| (c.offset, c.size))
            .collect();
        for (n, &(off, size)) in mapped.iter().enumerate() {
            let va = self.va + off as u64;
            if let Err(e) = self.driver.set_access_peers(va, size, &apply) {
                let restore = self.restore_list(&list);
                for &(o, sz) in &mapped[..n] {
                    let _ = self
                        .driver
                        .set_access_peers(self.va + o as u64, sz, &restore);
                }
                return Err(e);
            }
        }
        self.peers = list;
        Ok(())
    }

    /// The descriptor list that puts `self.peers` back over a grant of `newer`.
    fn restore_list(&self, newer: &[PeerAccess]) -> Vec<PeerAccess> {
        let mut r = self.peers.clone();
        for p in newer {
            if !r.iter().any(|q| q.device == p.device) {
                r.push(PeerAccess {
                    device: p.device,
                    mode: AccessMode::None,
                });
            }
        }
        r
    }

    /// The driver this segment lives on.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// True when `[ptr, ptr+len)` lies inside this segment's reservation.
    pub fn contains(&self, ptr: DevicePtr, len: usize) -> bool {
        ptr >= self.va && ptr + len as u64 <= self.va + self.reserved as u64
    }

    /// Grow the committed, mapped part to at least `new_committed` bytes
    /// (rounded up to the granularity). On failure, chunks added by this call
    /// are undone and the segment is unchanged.
    pub fn commit(&mut self, new_committed: usize) -> Result<()> {
        let g = self.driver.granularity();
        if new_committed > self.reserved {
            return Err(Error::InvalidArgument(format!(
                "commit of {new_committed} bytes exceeds the segment's reservation of {} bytes",
                self.reserved
            )));
        }
        let target = round_up(new_committed, g);
        if target > self.reserved {
            return Err(Error::InvalidArgument(format!(
                "commit of {target} bytes exceeds the segment's reservation of {} bytes",
                self.reserved
            )));
        }
        let mut offset = self.committed;
        while offset < target {
            let remaining = target - offset;
            let size = if self.chunk_size == 0 {
                remaining
            } else {
                remaining.min(self.chunk_size)
            };
            match self.map_new(offset, size) {
                Ok(handle) => {
                    self.chunks.push(Chunk {
                        offset,
                        size,
                        handle: Some(handle),
                    });
                    self.mappings += 1;
                }
                Err(e) => {
                    // A chunk whose unmap fails in the undo stays (mapped,
                    // counted): its range must not be mapped again.
                    let _ = self.pop_chunks(self.committed);
                    return Err(e);
                }
            }
            offset += size;
        }
        self.committed = self.committed.max(target);
        Ok(())
    }

    /// Shrink the committed part to `new_committed` bytes (rounded up to the
    /// granularity, and up to a chunk boundary). Frees the chunks beyond it.
    /// The caller must make sure no queued work touches that memory.
    /// A chunk whose unmap fails stays committed and mapped (with the chunks
    /// before it), so its range is never mapped twice; a handle whose release
    /// fails is kept and retried. The first error is returned.
    pub fn decommit(&mut self, new_committed: usize) -> Result<()> {
        let g = self.driver.granularity();
        let target = round_up(new_committed.min(self.reserved), g);
        let orphans = self.retry_orphans();
        self.pop_chunks(target).and(orphans)
    }

    /// Unmap and release chunk `i`, keeping its place (sleep). A no-op when it is
    /// already unmapped. The caller must make sure no queued work touches it.
    pub fn unmap_chunk(&mut self, i: usize) -> Result<()> {
        let c = self.chunks[i];
        if let Some(h) = c.handle {
            let va = self.va + c.offset as u64;
            self.driver.unmap(va, c.size)?;
            // Unmapped: the chunk has no memory behind it any more, whatever
            // the release says, so a later map_chunk must map it again. A
            // handle whose release fails is kept and released later.
            self.chunks[i].handle = None;
            if let Err(e) = self.driver.release(h) {
                self.orphans.push((h, c.size));
                return Err(e);
            }
        }
        Ok(())
    }

    /// Create, map and grant access for chunk `i` (wake). A no-op when mapped.
    /// On failure nothing is left behind and the chunk stays unmapped.
    pub fn map_chunk(&mut self, i: usize) -> Result<()> {
        let c = self.chunks[i];
        if c.handle.is_none() {
            let h = self.map_new(c.offset, c.size)?;
            self.chunks[i].handle = Some(h);
            self.mappings += 1;
        }
        Ok(())
    }

    /// Re-cut every run of adjacent unmapped chunks into chunks of `max` bytes
    /// (the last of a run smaller; granularity multiples), so that waking maps
    /// few chunks and the first copy can start after a small create. Mapped
    /// chunks are left as they are.
    pub fn rechunk_unmapped(&mut self, max: usize) {
        let g = self.driver.granularity();
        // No chunk can be larger than the reservation; clamping first also keeps
        // the rounding from overflowing for "no limit" (usize::MAX).
        let max = round_up(max.clamp(g, self.reserved), g);
        let mut out: Vec<Chunk> = Vec::with_capacity(self.chunks.len());
        let mut run: Option<(usize, usize)> = None; // (offset, len) of the pending unmapped run
        let flush = |run: &mut Option<(usize, usize)>, out: &mut Vec<Chunk>| {
            if let Some((mut off, mut len)) = run.take() {
                while len > 0 {
                    let n = len.min(max);
                    out.push(Chunk {
                        offset: off,
                        size: n,
                        handle: None,
                    });
                    off += n;
                    len -= n;
                }
            }
        };
        for c in self.chunks.drain(..) {
            if c.handle.is_none() {
                run = Some(match run {
                    Some((o, l)) => (o, l + c.size),
                    None => (c.offset, c.size),
                });
            } else {
                flush(&mut run, &mut out);
                out.push(c);
            }
        }
        flush(&mut run, &mut out);
        self.chunks = out;
    }

    /// Unmap and release every mapped chunk, keeping the VA (for sleep). On a
    /// failure the remaining chunks are still tried; the first error is returned.
    pub fn unmap_all(&mut self) -> Result<()> {
        let mut first_error = self.retry_orphans().err();
        for i in 0..self.chunks.len() {
            if let Err(e) = self.unmap_chunk(i) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Map every unmapped chunk. Transactional: on failure, chunks mapped by
    /// this call are unmapped again and the error is returned.
    pub fn map_all(&mut self) -> Result<()> {
        let was_unmapped: Vec<usize> = (0..self.chunks.len())
            .filter(|&i| self.chunks[i].handle.is_none())
            .collect();
        for (n, &i) in was_unmapped.iter().enumerate() {
            if let Err(e) = self.map_chunk(i) {
                for &j in &was_unmapped[..n] {
                    let _ = self.unmap_chunk(j);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Put `h`, made by [`map_new_at`] for chunk `i`'s range, in chunk `i`
    /// (wake maps outside the pool lock, then installs). Refused when the
    /// chunk already has memory.
    pub fn install_handle(&mut self, i: usize, h: PhysHandle) -> Result<()> {
        match self.chunks.get_mut(i) {
            Some(c) if c.handle.is_none() => {
                c.handle = Some(h);
                self.mappings += 1;
                Ok(())
            }
            _ => Err(Error::InvalidState(format!(
                "chunk {i} of segment {:#x} is mapped already or does not exist",
                self.va
            ))),
        }
    }

    /// Physical handles unmapped whose release failed; retried by every later
    /// unmap, decommit, [`Segment::release_orphans`], close and drop.
    pub fn unreleased_handles(&self) -> usize {
        self.orphans.len()
    }

    /// Bytes of those handles: physical memory no chunk uses that the driver
    /// has not taken back.
    pub fn unreleased_bytes(&self) -> usize {
        self.orphans.iter().map(|&(_, size)| size).sum()
    }

    /// Retry the release of handles whose release failed. The first error is
    /// returned; the handles still refused stay kept.
    pub fn release_orphans(&mut self) -> Result<()> {
        self.retry_orphans()
    }

    /// Give everything back: unmap and release every mapped chunk, release
    /// kept handles, free the reservation. The caller must make sure no
    /// queued work uses the memory (synchronize first).
    ///
    /// On a failure the segment comes back with the first error, holding what
    /// the driver refused: a chunk whose unmap failed stays mapped, a handle
    /// whose release failed stays kept, and the reservation stays (never
    /// freed while anything in it may be mapped, so the range is never handed
    /// out again). Closing it again retries.
    pub fn close(mut self) -> std::result::Result<(), Box<(Segment, Error)>> {
        let orphans = self.retry_orphans();
        let chunks = self.pop_chunks(0);
        if let Err(e) = chunks.and(orphans) {
            return Err(Box::new((self, e)));
        }
        if let Err(e) = self.driver.free_va(self.va, self.reserved) {
            return Err(Box::new((self, e)));
        }
        self.closed = true;
        Ok(())
    }

    fn map_new(&self, offset: usize, size: usize) -> Result<PhysHandle> {
        map_new_at(
            self.driver.as_ref(),
            self.va + offset as u64,
            size,
            &self.peers,
            self.flags,
        )
    }

    fn retry_orphans(&mut self) -> Result<()> {
        let mut first_error = None;
        let driver = self.driver.clone();
        self.orphans.retain(|&(h, _)| match driver.release(h) {
            Ok(()) => false,
            Err(e) => {
                first_error.get_or_insert(e);
                true
            }
        });
        first_error.map_or(Ok(()), Err)
    }

    /// Unmap, release and drop the chunks at offsets `>= from`, last first.
    /// Stops at a chunk whose unmap fails: it and the chunks before it stay,
    /// still mapped, so that range is never mapped again while the old
    /// mapping may be there. A handle whose release fails is kept
    /// ([`Segment::unreleased_handles`]). The first error is returned.
    fn pop_chunks(&mut self, from: usize) -> Result<()> {
        let mut first_error = None;
        while let Some(c) = self.chunks.last().copied() {
            if c.offset < from {
                break;
            }
            if let Some(h) = c.handle {
                if let Err(e) = self.driver.unmap(self.va + c.offset as u64, c.size) {
                    first_error = Some(e);
                    break;
                }
                if let Err(e) = self.driver.release(h) {
                    self.orphans.push((h, c.size));
                    first_error.get_or_insert(e);
                }
            }
            self.chunks.pop();
        }
        self.committed = self.chunks.last().map_or(0, |c| c.offset + c.size);
        first_error.map_or(Ok(()), Err)
    }
}

/// Create `size` bytes of physical memory, map them at `va` and grant access
/// to this device and to `peers` (a segment's peer grant, [`Segment::peers`]),
/// created with `flags` ([`Segment::create_flags`]).
/// On failure nothing is left behind.
pub fn map_new_at(
    driver: &dyn Driver,
    va: DevicePtr,
    size: usize,
    peers: &[PeerAccess],
    flags: CreateFlags,
) -> Result<PhysHandle> {
    let h = driver.create_with(size, flags)?;
    if let Err(e) = driver.map(va, size, h) {
        let _ = driver.release(h);
        return Err(e);
    }
    let access = if peers.is_empty() {
        driver.set_access(va, size)
    } else {
        driver.set_access_peers(va, size, peers)
    };
    if let Err(e) = access {
        let _ = driver.unmap(va, size);
        let _ = driver.release(h);
        return Err(e);
    }
    Ok(h)
}

/// Unmap `[va, va+size)` and release `h` (both tried; the first error returned).
pub fn unmap_release_at(
    driver: &dyn Driver,
    va: DevicePtr,
    size: usize,
    h: PhysHandle,
) -> Result<()> {
    let unmapped = driver.unmap(va, size);
    let released = driver.release(h);
    unmapped.and(released)
}

impl Drop for Segment {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        let _ = self.retry_orphans();
        if self.chunks.iter().any(|c| c.handle.is_some()) && self.driver.synchronize().is_err() {
            // Queued work may still use this memory: leak it rather than
            // unmap under running kernels.
            return;
        }
        let _ = self.pop_chunks(0);
        if self.chunks.is_empty() {
            let _ = self.driver.free_va(self.va, self.reserved);
        }
    }
}
