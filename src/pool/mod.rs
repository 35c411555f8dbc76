//! The caching pool: one per device, shared by every thread.
//!
//! Callers allocate blocks and free them back; freed blocks are cached and
//! reused; blocks are split from segments and merged when freed
//! (`block.rs`); `trim` returns wholly free segments (and the free tail of
//! an arena) to the driver. Every segment belongs to one tag, so blocks of
//! different tags never share a segment and sleep can act per tag.
//!
//! Where a block comes from depends on its tag's [`Mode`] and its size:
//!
//! | mode | request | segment |
//! |---|---|---|
//! | `Segments` | up to `small_request_max` | shared segments of `small_segment_bytes` |
//! | `Segments` | up to `large_segment_bytes / 2` | shared segments of `large_segment_bytes` |
//! | `Segments` | larger | a segment of its own size (rounded to the granularity), cached after free |
//! | `Arena` | any that fits | the tag's one big reservation, committed on demand (`arena.rs`) |
//! | [`Pool::alloc_segment`] | any | exactly one new segment, released on free (the PyTorch path) |
//!
//! Every block handed out has an identity that is never reused, also when
//! its address is handed out again ([`identity`]): writers into memory they
//! recorded earlier (the loader) check it with [`check_owner`].
//!
//! Four quantities are kept apart: *live* bytes (blocks callers hold),
//! *reserved* bytes (VA of the pool's segments), *tracked* bytes (physically
//! backed) and the device's used memory; see [`crate::report`].

mod access;
mod arena;
mod backup_read;
pub(crate) mod block;
mod cached;
mod config;
pub mod identity;
mod invariants;
mod lease;
mod peers;
mod range;
mod rdma;
pub mod registry;
mod release;
pub mod remap;
mod reporting;
pub mod shares;
mod sleep;
mod swap;
#[cfg(test)]
mod tests;
pub mod torch;
pub mod versions;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use crate::driver::{round_up, DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::report::Boundary;
use crate::segment::{Segment, SleepState};
use crate::tag::{self, TagId};
use block::{BlockMap, Change, ReleaseError};
use config::check_mode;
pub use config::{Mode, PoolConfig};
pub use identity::{check_owner, check_owners, owner_of, BlockId, Owner};
pub(crate) use lease::TagLease;
use release::Released;
pub use release::Unreleased;
pub use sleep::{LoadPin, TagCycle};
pub use swap::{SwapOptions, SwapOutcome};

/// A block handed out by the pool. Plain data: free it with [`Pool::free`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Its address; stable for the block's life, also across sleep and wake.
    pub ptr: DevicePtr,
    /// Its size: the request rounded up to the pool's alignment (or the segment size).
    pub size: usize,
    /// The tag it was allocated under.
    pub tag: TagId,
    /// This allocation's identity: never reused, also when the address is
    /// handed out again after a free (see [`identity`]).
    pub id: BlockId,
}

/// Which placement a segment serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SegmentClass {
    /// Shared segment for small requests.
    Small,
    /// Shared or own segment for large requests.
    Large,
    /// A tag's expandable arena.
    Arena,
    /// One segment per request ([`Pool::alloc_segment`]); never split or cached.
    Dedicated,
}

/// What [`Pool::segment_of`] tells about a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentInfo {
    /// Base address.
    pub base: DevicePtr,
    /// Bytes of VA reserved.
    pub reserved_bytes: usize,
    /// Bytes physically backed now.
    pub tracked_bytes: usize,
    /// Owning tag.
    pub tag: TagId,
    /// Placement class.
    pub class: SegmentClass,
    /// Sleep state.
    pub sleep_state: SleepState,
}

#[derive(Debug)]
struct SegEntry {
    seg: Segment,
    tag: TagId,
    class: SegmentClass,
    blocks: BlockMap,
    live_bytes: usize,
    live_blocks: usize,
    /// Creation order in the pool: the layer above pairs segments of several pools by it.
    seq: u64,
}

#[derive(Debug, Default)]
struct TagState {
    mode: Option<Mode>,
    asleep: bool,
    /// A sleep or wake of the tag is running (without the pool lock):
    /// allocation in it is refused, its segments are neither trimmed nor
    /// released until it ends, a second sleep or wake of it waits.
    transition: bool,
    /// Loads writing into the tag now ([`Pool::pin_for_load`]): sleep is refused.
    loads: usize,
    /// Base of the tag's arena, while one exists.
    arena: Option<DevicePtr>,
    /// Peer devices granted access to every segment of the tag.
    peers: Vec<crate::driver::PeerAccess>,
    /// A mark the layer above pinned on the tag ([`lease::TagLease::set_mark`]).
    mark: Option<lease::TagMark>,
    /// How the tag's physical memory is created ([`Pool::set_tag_rdma`]).
    create: crate::driver::CreateFlags,
}

/// Free blocks indexed for best fit: per (tag, class), ordered by (size, segment base, offset).
type FreeIndex = HashMap<(TagId, SegmentClass), BTreeSet<(usize, DevicePtr, usize)>>;

#[derive(Debug, Default)]
struct State {
    segs: BTreeMap<DevicePtr, SegEntry>,
    free: FreeIndex,
    tags: HashMap<TagId, TagState>,
    timeline: std::collections::VecDeque<Boundary>,
    /// Boundaries dropped from the front of the full timeline.
    timeline_dropped: u64,
    /// Dedicated segments freed while their tag was in transition: released
    /// when the transition ends.
    deferred: Vec<DevicePtr>,
    /// Segments freed that the driver did not take back (it refused to
    /// synchronize, unmap or release): kept, with their reservations, until a
    /// later free or trim gives them back (see `release.rs`).
    zombies: Vec<Released>,
    /// The next segment's creation number.
    next_seq: u64,
}

impl State {
    fn in_transition(&self, tag: TagId) -> bool {
        self.tags.get(&tag).is_some_and(|t| t.transition)
    }

    /// Every segment of `tag`, for sleep and wake to act on.
    fn tag_segments(&mut self, tag: TagId) -> Vec<&mut Segment> {
        self.segs
            .values_mut()
            .filter(|e| e.tag == tag)
            .map(|e| &mut e.seg)
            .collect()
    }
}

/// A caching pool of VMM segments on one device. `Send + Sync`; every method
/// takes `&self` and locks internally.
#[derive(Debug)]
pub struct Pool {
    driver: Arc<dyn Driver>,
    config: PoolConfig,
    granularity: usize,
    created: Instant,
    /// Shared with the process-wide list [`identity::owner_of`] searches.
    state: Arc<Mutex<State>>,
    /// Signalled when a tag's transition or a load pin ends.
    settled: std::sync::Condvar,
    sleep: crate::sleep::SleepEngine,
    shares: shares::ShareGate,
    versions: versions::Versions,
}

impl Pool {
    /// A pool on `driver`'s device.
    pub fn new(driver: Arc<dyn Driver>, config: PoolConfig) -> Result<Pool> {
        config.validate()?;
        let granularity = driver.granularity();
        let mut state = State::default();
        for (&t, &m) in &config.tag_modes {
            tag::check(t)?;
            state.tags.entry(t).or_default().mode = Some(m);
        }
        let state = Arc::new(Mutex::new(state));
        identity::enlist(&state);
        Ok(Pool {
            sleep: crate::sleep::SleepEngine::new(driver.clone(), config.sleep.clone()),
            driver,
            config,
            granularity,
            created: Instant::now(),
            state,
            settled: std::sync::Condvar::new(),
            shares: shares::ShareGate::default(),
            versions: versions::Versions::default(),
        })
    }

    /// The driver underneath.
    pub fn driver(&self) -> &Arc<dyn Driver> {
        &self.driver
    }

    /// The device ordinal.
    pub fn device(&self) -> i32 {
        self.driver.device()
    }

    /// The configuration the pool was created with (per-tag modes may have changed since).
    pub fn config(&self) -> &PoolConfig {
        &self.config
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The pool's own code does not panic while holding the lock except on a
        // bug; callers behind the C ABI are better served by carrying on.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Choose how `tag`'s future blocks are placed. Refused (nothing changes)
    /// while the tag has an arena and the mode would change.
    pub fn set_tag_mode(&self, tag: TagId, mode: Mode) -> Result<()> {
        tag::check(tag)?;
        check_mode(mode)?;
        let mut st = self.lock();
        let current = self.mode_of(&st, tag);
        let ts = st.tags.entry(tag).or_default();
        if ts.arena.is_some() && current != mode {
            return Err(Error::InvalidState(format!(
                "tag {tag} still has an arena; free its blocks and trim before changing its mode"
            )));
        }
        ts.mode = Some(mode);
        Ok(())
    }

    /// The mode of `tag`.
    pub fn tag_mode(&self, tag: TagId) -> Mode {
        self.mode_of(&self.lock(), tag)
    }

    fn mode_of(&self, st: &State, tag: TagId) -> Mode {
        st.tags
            .get(&tag)
            .and_then(|t| t.mode)
            .unwrap_or(self.config.default_mode)
    }

    /// Allocate `size` bytes under the calling thread's current tag.
    pub fn alloc(&self, size: usize) -> Result<Block> {
        self.alloc_tagged(size, tag::current())
    }

    /// Allocate `size` bytes under `tag`.
    pub fn alloc_tagged(&self, size: usize, tag: TagId) -> Result<Block> {
        let size = self.check_request(size, tag)?;
        let mut st = self.lock();
        Self::check_awake(&st, tag)?;
        match self.alloc_locked(&mut st, size, tag) {
            Err(e) if e.is_out_of_memory() => {
                // Return cached memory to the driver, then try once more.
                // The released segments drop at the end of this statement,
                // before the retry, so their memory is back with the driver.
                let (released, dropped, _) = self.release_cached(&mut st);
                // Released under the lock here: the retry needs the memory back.
                let given_back = self.release_segments_locked(&mut st, dropped);
                if released == 0 && given_back == 0 {
                    return Err(e);
                }
                self.alloc_locked(&mut st, size, tag)
            }
            r => r,
        }
    }

    fn check_request(&self, size: usize, tag: TagId) -> Result<usize> {
        tag::check(tag)?;
        if size == 0 {
            return Err(Error::InvalidArgument(format!(
                "allocation of 0 bytes under tag {tag}"
            )));
        }
        // Larger than the device: out of memory, without asking the driver
        // (whose reservation of such a size fails with a generic error).
        // Requests under 1 GiB skip the query: no device is that small.
        let total = if size >= 1 << 30 {
            self.driver.mem_info().map_or(u64::MAX, |m| m.total)
        } else {
            u64::MAX
        };
        if size > crate::units::MAX_BYTES || size as u64 > total {
            return Err(Error::OutOfMemory {
                what: format!(
                    "allocation under tag {tag} (larger than the device's {total} bytes)"
                ),
                requested: size as u64,
                free: self.driver.mem_info().map_or(0, |m| m.free),
            });
        }
        Ok(round_up(size, self.config.align))
    }

    fn check_awake(st: &State, tag: TagId) -> Result<()> {
        if st.in_transition(tag) {
            return Err(Error::InvalidState(format!(
                "tag {tag} is being put to sleep or woken: allocate under it once that call returns"
            )));
        }
        if st.tags.get(&tag).is_some_and(|t| t.asleep) {
            return Err(Error::InvalidState(format!(
                "tag {tag} is asleep: wake it before allocating under it"
            )));
        }
        Ok(())
    }

    fn alloc_locked(&self, st: &mut State, size: usize, tag: TagId) -> Result<Block> {
        if let Mode::Arena {
            reserve_bytes,
            grow_step,
        } = self.mode_of(st, tag)
        {
            if let Some(b) = self.arena_alloc(st, size, tag, reserve_bytes, grow_step)? {
                return Ok(b);
            }
            // The arena is full: fall back to ordinary segments of the tag.
        }
        let class = if size <= self.config.small_request_max {
            SegmentClass::Small
        } else {
            SegmentClass::Large
        };
        if let Some((base, off)) = best_fit(&st.free, tag, class, size) {
            return Ok(take(st, base, off, size));
        }
        let seg_size = match class {
            SegmentClass::Small => self.config.small_segment_bytes,
            _ if size <= self.config.large_segment_bytes / 2 => self.config.large_segment_bytes,
            _ => size,
        };
        let flags = tag_create_flags(st, tag);
        let mut seg = Segment::allocate_with(
            self.driver.clone(),
            seg_size,
            self.config.chunk_bytes,
            flags,
        )?;
        grant_tag_peers(st, tag, &mut seg)?;
        let base = insert_segment(st, seg, tag, class);
        Ok(take(st, base, 0, size))
    }

    /// Create exactly one segment of `size` bytes (rounded up to the
    /// granularity) for `tag` and hand it out whole. Freeing it releases the
    /// segment. This is the PyTorch path: PyTorch
    /// caches and splits on its side.
    pub fn alloc_segment(&self, size: usize, tag: TagId) -> Result<Block> {
        self.check_request(size, tag)?;
        let size = round_up(size, self.granularity);
        let flags = {
            let st = self.lock();
            Self::check_awake(&st, tag)?;
            tag_create_flags(&st, tag)
        };
        let chunk = self.config.chunk_bytes;
        // Create outside the lock: driver calls for big segments take a while.
        let mut seg = match Segment::allocate_with(self.driver.clone(), size, chunk, flags) {
            Err(e) if e.is_out_of_memory() => {
                let released = self.trim()?;
                if released == 0 {
                    return Err(e);
                }
                Segment::allocate_with(self.driver.clone(), size, chunk, flags)?
            }
            r => r?,
        };
        let mut st = self.lock();
        // The tag may have gone to sleep meanwhile; dropping `seg` undoes it.
        Self::check_awake(&st, tag)?;
        grant_tag_peers(&st, tag, &mut seg)?;
        let base = insert_segment(&mut st, seg, tag, SegmentClass::Dedicated);
        Ok(take(&mut st, base, 0, size))
    }

    /// Free a block. An unknown pointer or a double free is an
    /// `Error::UnknownPointer` and changes nothing.
    ///
    /// When freeing gives a segment back to the driver and the driver refuses
    /// (synchronize, unmap or release fails), the block is still freed and the
    /// error names the segment: it keeps its reservation (never reused) and the
    /// memory the driver still holds, counted in [`Report::leaked_bytes`](crate::report::Report::leaked_bytes),
    /// until a later free or trim gives it back.
    pub fn free(&self, ptr: DevicePtr) -> Result<()> {
        let (dropped, retired) = {
            let mut st = self.lock();
            self.free_locked(&mut st, ptr, false)?
        };
        // Outside the lock: retiring a reload source waits for a replay using
        // it, and releasing synchronizes the device. The block is free either
        // way; an error names a freed segment the driver did not take back
        // (kept, counted in the report, retried by a later free or trim).
        drop(retired);
        self.release_segments(dropped.into_iter().collect())
    }

    /// Free a block made by [`Pool::alloc_segment`]; anything else is refused
    /// with `Error::UnknownPointer` and nothing changes.
    pub fn free_segment(&self, ptr: DevicePtr) -> Result<()> {
        let (dropped, retired) = {
            let mut st = self.lock();
            self.free_locked(&mut st, ptr, true)?
        };
        drop(retired);
        self.release_segments(dropped.into_iter().collect())
    }

    fn free_locked(
        &self,
        st: &mut State,
        ptr: DevicePtr,
        dedicated_only: bool,
    ) -> Result<(Option<Released>, crate::sleep::Retired)> {
        let base = segment_base(st, ptr).ok_or(Error::UnknownPointer {
            ptr,
            why: "not inside any segment of this pool (never allocated here, or already freed and released)",
        })?;
        let e = &st.segs[&base];
        if dedicated_only && e.class != SegmentClass::Dedicated {
            return Err(Error::UnknownPointer {
                ptr,
                why: "belongs to a pool block, not to a segment made by alloc_segment",
            });
        }
        let (tag, class) = (e.tag, e.class);
        let e = st.segs.get_mut(&base).expect("segment found above");
        let (size, change) =
            e.blocks
                .release((ptr - base) as usize)
                .map_err(|r| Error::UnknownPointer {
                    ptr,
                    why: match r {
                        ReleaseError::NotABlockStart => {
                            "inside a segment but not the start of a block"
                        }
                        ReleaseError::AlreadyFree => "already freed",
                    },
                })?;
        e.live_bytes -= size;
        e.live_blocks -= 1;
        // What a load wrote there is gone: never replay it into a later block.
        let retired = self.sleep.retire_range(tag, ptr, size);
        if class == SegmentClass::Dedicated {
            if st.in_transition(tag) {
                // The running sleep or wake still uses the segment.
                st.deferred.push(base);
                return Ok((None, retired));
            }
            // Never cached: released at once (in an asleep tag it holds little
            // or no physical memory; its VA and its backup go too).
            return Ok((self.remove_segment(st, base), retired));
        }
        apply(&mut st.free, tag, class, base, change);
        Ok((None, retired))
    }

    /// Return cached memory to the driver: wholly free segments are released
    /// (also those of asleep tags), and the free tail of each awake arena is
    /// decommitted. Returns the tracked (physically backed) bytes released.
    ///
    /// Also retries everything the driver refused before (segments freed but
    /// not given back, handles whose release failed); an error names the first
    /// thing still refused, and [`Pool::unreleased`] counts what is left.
    pub fn trim(&self) -> Result<u64> {
        let (released, dropped, error) = {
            let mut st = self.lock();
            let orphans = Self::release_orphans_locked(&mut st).err();
            let (released, dropped, error) = self.release_cached(&mut st);
            (released, dropped, error.or(orphans))
        };
        self.release_segments(dropped)?;
        error.map_or(Ok(released), Err)
    }

    /// The trim work under the lock; segments to release are handed back to be
    /// dropped by the caller (outside the lock where it can).
    fn release_cached(&self, st: &mut State) -> (u64, Vec<Released>, Option<Error>) {
        let mut released = 0u64;
        let wholly_free: Vec<DevicePtr> = st
            .segs
            .iter()
            .filter(|(_, e)| e.blocks.is_wholly_free() && !st.in_transition(e.tag))
            .map(|(&b, _)| b)
            .collect();
        let mut dropped = Vec::with_capacity(wholly_free.len());
        for base in wholly_free {
            if let Some(r) = self.remove_segment(st, base) {
                released += r.seg.mapped_bytes() as u64;
                dropped.push(r);
            }
        }
        let (from_tails, error) = self.arena_trim_tails(st);
        (released + from_tails, dropped, error)
    }

    /// The segment holding `ptr`, if any.
    pub fn segment_of(&self, ptr: DevicePtr) -> Option<SegmentInfo> {
        let st = self.lock();
        let base = segment_base(&st, ptr)?;
        let e = &st.segs[&base];
        Some(SegmentInfo {
            base,
            reserved_bytes: e.seg.reserved(),
            tracked_bytes: e.seg.mapped_bytes(),
            tag: e.tag,
            class: e.class,
            sleep_state: e.seg.sleep_state(),
        })
    }

    /// Every live block, in address order (for tests and debugging).
    pub fn live_blocks(&self) -> Vec<Block> {
        let st = self.lock();
        let mut out = Vec::new();
        for (&base, e) in &st.segs {
            for (off, b) in e.blocks.iter().filter(|(_, b)| b.live) {
                out.push(Block {
                    ptr: base + off as u64,
                    size: b.size,
                    tag: e.tag,
                    id: b.id,
                });
            }
        }
        out
    }

    /// True when `tag` is marked asleep.
    pub fn is_tag_asleep(&self, tag: TagId) -> bool {
        self.lock().tags.get(&tag).is_some_and(|t| t.asleep)
    }

    /// Tags offered to other processes (see [`shares`]).
    pub fn shares(&self) -> &shares::ShareGate {
        &self.shares
    }

    /// Run `f` on every segment of `tag` (ordinary, dedicated and arena), under
    /// the pool lock. For tests; the sleep layer works on the state directly.
    #[cfg(test)]
    pub(crate) fn with_tag_segments<R>(
        &self,
        tag: TagId,
        f: impl FnOnce(&mut [&mut Segment]) -> R,
    ) -> R {
        f(&mut self.lock().tag_segments(tag))
    }

    /// Run `f` on every segment of `tag` under the pool lock, when the tag is
    /// wholly awake: neither asleep nor sleeping or waking now (the share
    /// layer's export must not see memory whose contents are on their way).
    pub(crate) fn with_awake_tag_segments<R>(
        &self,
        tag: TagId,
        f: impl FnOnce(&[&mut Segment]) -> Result<R>,
    ) -> Result<R> {
        let mut st = self.lock();
        if st.tags.get(&tag).is_some_and(|t| t.asleep || t.transition) {
            return Err(Error::InvalidState(format!(
                "tag `{}` is asleep, or sleeping or waking now; wake it before sharing",
                tag::name_of(tag)
            )));
        }
        f(&st.tag_segments(tag))
    }

    /// Mark `tag` asleep (allocation refused, frees only update bookkeeping) or awake.
    #[cfg(test)]
    pub(crate) fn set_tag_asleep(&self, tag: TagId, asleep: bool) {
        self.lock().tags.entry(tag).or_default().asleep = asleep;
    }

    /// Remove a wholly free segment (see [`remove_segment`]) and return its
    /// host backup, if it had one, to the sleep engine's arena.
    fn remove_segment(&self, st: &mut State, base: DevicePtr) -> Option<Released> {
        let tag = st.segs.get(&base)?.tag;
        let seg = remove_segment(st, base)?;
        self.sleep.forget_segment(base);
        Some(Released { seg, tag })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Out of the owner lookup before the segments go.
        identity::dismiss(&self.state);
    }
}

fn segment_base(st: &State, ptr: DevicePtr) -> Option<DevicePtr> {
    let (&base, e) = st.segs.range(..=ptr).next_back()?;
    e.seg.contains(ptr, 0).then_some(base).filter(|_| {
        // `contains(ptr, 0)` accepts the end address; a block never starts there.
        ptr < base + e.seg.reserved() as u64
    })
}

fn best_fit(
    free: &FreeIndex,
    tag: TagId,
    class: SegmentClass,
    size: usize,
) -> Option<(DevicePtr, usize)> {
    free.get(&(tag, class))?
        .range((size, 0, 0)..)
        .next()
        .map(|&(_, b, o)| (b, o))
}

fn apply(free: &mut FreeIndex, tag: TagId, class: SegmentClass, base: DevicePtr, ch: Change) {
    let set = free.entry((tag, class)).or_default();
    for (o, s) in ch.removed_free {
        set.remove(&(s, base, o));
    }
    for (o, s) in ch.added_free {
        set.insert((s, base, o));
    }
}

/// Hand out `size` bytes of the free block at `base + off`.
fn take(st: &mut State, base: DevicePtr, off: usize, size: usize) -> Block {
    let e = st
        .segs
        .get_mut(&base)
        .expect("free index names a live segment");
    let id = identity::next_block_id();
    let ch = e.blocks.take(off, size, id);
    e.live_bytes += size;
    e.live_blocks += 1;
    let (tag, class) = (e.tag, e.class);
    if class != SegmentClass::Dedicated {
        apply(&mut st.free, tag, class, base, ch);
    }
    Block {
        ptr: base + off as u64,
        size,
        tag,
        id,
    }
}

/// Give a new segment of `tag` the tag's peer access (a no-op without peers).
fn tag_create_flags(st: &State, tag: TagId) -> crate::driver::CreateFlags {
    st.tags.get(&tag).map(|t| t.create).unwrap_or_default()
}

fn grant_tag_peers(st: &State, tag: TagId, seg: &mut Segment) -> Result<()> {
    match st.tags.get(&tag) {
        Some(t) if !t.peers.is_empty() => seg.set_peers(&t.peers),
        _ => Ok(()),
    }
}

fn insert_segment(st: &mut State, seg: Segment, tag: TagId, class: SegmentClass) -> DevicePtr {
    // A tag that ever held memory here is known to the pool: sleep and wake
    // refuse the others (a misspelled tag would otherwise sleep nothing).
    st.tags.entry(tag).or_default();
    let base = seg.ptr();
    let blocks = BlockMap::new(seg.reserved());
    if class != SegmentClass::Dedicated {
        st.free
            .entry((tag, class))
            .or_default()
            .insert((seg.reserved(), base, 0));
    }
    st.next_seq += 1;
    let seq = st.next_seq;
    st.segs.insert(
        base,
        SegEntry {
            seg,
            tag,
            class,
            blocks,
            live_bytes: 0,
            live_blocks: 0,
            seq,
        },
    );
    base
}

/// Remove a wholly free segment from the bookkeeping and return it (to be
/// dropped). Called only through [`Pool::remove_segment`], which also returns
/// the segment's backup to the sleep engine: no other path removes segments.
fn remove_segment(st: &mut State, base: DevicePtr) -> Option<Segment> {
    let e = st.segs.remove(&base)?;
    debug_assert!(e.blocks.is_wholly_free());
    if let Some(set) = st.free.get_mut(&(e.tag, e.class)) {
        set.remove(&(e.seg.reserved(), base, 0));
    }
    if e.class == SegmentClass::Arena {
        if let Some(ts) = st.tags.get_mut(&e.tag) {
            if ts.arena == Some(base) {
                ts.arena = None;
            }
        }
    }
    Some(e.seg)
}
