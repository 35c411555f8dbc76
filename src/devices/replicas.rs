//! Replicas: N tags on N devices (one pool per device) that hold the same
//! bytes, put to sleep and woken together. Two wakes, for two ways to sleep:
//! from one pinned host backup, taken from the first device
//! ([`sleep`], [`wake_from_backup`]), or, for replicas slept without backups
//! ([`Policy::Discard`]), by one fan-out of the checkpoint ([`wake_by_reload`]).
//!
//! - Sleep ([`sleep`], [`sleep_with`]): the first member (the holder) sleeps
//!   with [`Policy::Offload`] or, when [`ReplicaSleepOptions::holder_policy`]
//!   says so, [`Policy::OffloadCompressed`] (a backup of codec frames, about
//!   70% of raw on bf16); every other member only releases its physical
//!   memory ([`Policy::Discard`]). Each member is granted read access for the
//!   others where the devices can reach each other, so wake can fan out.
//! - Wake from a raw backup ([`wake_from_backup`]): every member maps its
//!   memory again (nothing copied yet), then the backup is cut into N
//!   contiguous parts and device k copies part k from host memory over its
//!   own link, all devices at once; then every device pulls the parts it
//!   lacks from the devices that copied them (peer copies, NVLink on a GPU
//!   host). Host memory is read once, each link carries 1/N of it. A pair of
//!   devices without peer access (or with [`ReplicaWakeOptions::peer_copies`]
//!   off) copies that part from the backup instead.
//! - Wake from a compressed backup (`replica_frames`): the same two phases
//!   over the holder's frames. The frames are shared among the members by
//!   encoded bytes; each device copies its frames into a codec ring of its
//!   own and decodes them into its memory, all devices at once, then every
//!   device pulls the decoded ranges it lacks over peer copies; a device that
//!   cannot read a member's memory decodes that member's frames itself. Only
//!   encoded bytes cross the host links, each carrying about 1/N of them.
//!   Every frame's checksum verdict on every device is read before any
//!   member is marked awake.
//!
//! The caller asserts the members hold identical bytes: the library checks
//! what it can cheaply (distinct devices, one backend, the same segments in
//! the same order with the same committed sizes and the same live blocks),
//! not the bytes themselves. Memory of a member that differs from the
//! holder's is overwritten with the holder's bytes at wake.
//!
//! The group is remembered on every member's tag until it wakes. Waking a
//! member on its own ([`Pool::wake`]) takes it out of the group: the holder
//! gets its backup back, any other member gets undefined bytes (it kept no
//! backup), and a later group wake of the rest is refused naming it. Putting
//! a member to sleep on its own while awake does the same.
//!
//! Nothing is lost on a failure: free memory (for a compressed backup, with
//! the codec's ring of frame buffers) is checked on every device before
//! anything is mapped, and if a map, a host copy, a decode (a corrupt
//! frame included) or a peer copy fails on any device, every chunk mapped on
//! every device is unmapped again (once that device is idle), every member
//! stays asleep in the group, the backup intact; waking again can succeed.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::load::{check_devices, MultiLoaded, MultiMode};
use super::load_pools::{device_loads, load_multi_into_pools, PoolLoad};
use super::peers::grant_reachable;
use super::replica_frames::{self, Members};
use super::stream_copies::{copy_spans, with_streams};
use super::threads::on_threads;
use crate::driver::{round_up, DevicePtr, Driver};
use crate::error::{Error, Result};
use crate::loader::{Checkpoint, Control, LoadOptions};
use crate::pool::{Pool, TagLease};
use crate::segment::Segment;
use crate::sleep::{HostSpan, Policy, SleepEngine, StagedWake};
use crate::tag::{self, TagId};

/// One replica: a tag in the pool of one device.
#[derive(Debug, Clone, Copy)]
pub struct Replica<'a> {
    /// The device's pool.
    pub pool: &'a Pool,
    /// The tag holding the replica's memory.
    pub tag: TagId,
}

impl Replica<'_> {
    /// The replica's tag, lent by its pool.
    fn lease(&self) -> TagLease<'_> {
        self.pool.lease(self.tag)
    }
}

/// What a staged wake hands the segments of a tag to.
type SegVisitor<'v> = &'v mut dyn FnMut(&mut [&mut Segment]);

/// The group a member's tag sleeps in.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ReplicaMark {
    group: u64,
    holder: i32,
    devices: Vec<i32>,
}

/// How a wake of replicas moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWakeOptions {
    /// Exchange the parts over peer copies where the devices can reach each
    /// other (the default); false: every device copies all of the backup from
    /// host memory (host memory read N times).
    pub peer_copies: bool,
    /// Size of one copy on one stream (0 = 64 MiB).
    pub copy_piece_bytes: usize,
}

impl ReplicaWakeOptions {
    /// Refuse a copy piece over [`crate::units::MAX_BYTES`].
    pub fn validate(&self) -> Result<()> {
        let max = crate::units::MAX_BYTES;
        if self.copy_piece_bytes > max {
            return Err(Error::InvalidArgument(format!(
                "replica wake option copy_piece_bytes = {} must be at most {max} (2^56; 0 = 64 MiB)",
                self.copy_piece_bytes
            )));
        }
        Ok(())
    }
}

impl Default for ReplicaWakeOptions {
    fn default() -> Self {
        ReplicaWakeOptions {
            peer_copies: true,
            copy_piece_bytes: 64 << 20,
        }
    }
}

/// How [`sleep_with`] keeps the one host backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSleepOptions {
    /// The holder's policy: [`Policy::Offload`] (the default, raw bytes) or
    /// [`Policy::OffloadCompressed`] (codec frames, with the holder pool's
    /// codec options); any other is refused.
    pub holder_policy: Policy,
}

impl ReplicaSleepOptions {
    /// Refuse a holder policy that keeps no full host backup.
    pub fn validate(&self) -> Result<()> {
        match self.holder_policy {
            Policy::Offload | Policy::OffloadCompressed => Ok(()),
            other => Err(Error::InvalidArgument(format!(
                "sleep of replicas: the holder's policy is {other:?}; replicas wake from the \
                 holder's full host backup, so it must be Offload or OffloadCompressed (to \
                 sleep replicas without a backup, sleep each with Discard and wake them by \
                 reload)"
            ))),
        }
    }
}

impl Default for ReplicaSleepOptions {
    fn default() -> Self {
        ReplicaSleepOptions {
            holder_policy: Policy::Offload,
        }
    }
}

/// What [`sleep`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReplicaSleepStats {
    /// Devices, in the order given; the first holds the backup.
    pub devices: Vec<i32>,
    /// Bytes copied into the host backup (from the first device only;
    /// encoded bytes for a compressed backup).
    pub backup_bytes: u64,
    /// Raw bytes the host backup restores.
    pub backup_raw_bytes: u64,
    /// Physical bytes released over all devices.
    pub released_bytes: u64,
    /// Wall seconds.
    pub seconds: f64,
}

/// What [`wake_from_backup`] did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReplicaWakeStats {
    /// Devices, in the order given; the first held the backup.
    pub devices: Vec<i32>,
    /// Bytes read from the host backup over all devices (the backup's size
    /// when every pair exchanged over peer copies; encoded bytes for a
    /// compressed backup).
    pub host_bytes: u64,
    /// Raw bytes decoded from a compressed backup's frames over all devices
    /// (0 for a raw backup).
    pub decoded_bytes: u64,
    /// Bytes moved between devices by peer copies.
    pub peer_bytes: u64,
    /// Device bytes restored on all devices together.
    pub delivered_bytes: u64,
    /// Physical bytes mapped over all devices.
    pub mapped_bytes: u64,
    /// Ordered device pairs (reader, owner) that copied from the backup
    /// because the reader could not read the owner's part.
    pub direct_pairs: usize,
    /// Seconds spent mapping memory on every device.
    pub map_seconds: f64,
    /// Seconds of the host phase (every device its part, at once).
    pub host_seconds: f64,
    /// Seconds of the exchange between devices.
    pub peer_seconds: f64,
    /// Wall seconds of the whole wake.
    pub seconds: f64,
}

impl ReplicaWakeStats {
    /// Delivered bytes per second over all devices, in GB/s (10^9).
    pub fn aggregate_gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.delivered_bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Held while a group's marks are written or read across its members, so
/// two sleeps of the same replicas at once leave every member in one group
/// (each writes all of its marks before the other starts).
fn lock_marks() -> std::sync::MutexGuard<'static, ()> {
    static MARKS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    MARKS.lock().unwrap_or_else(|p| p.into_inner())
}

fn check_members(members: &[Replica<'_>], what: &str) -> Result<()> {
    let Some(first) = members.first() else {
        return Err(Error::InvalidArgument(format!(
            "{what} needs at least one replica"
        )));
    };
    let kind = first.pool.driver().kind();
    for (i, m) in members.iter().enumerate() {
        m.lease().check_known()?;
        let dev = m.pool.device();
        if m.pool.driver().kind() != kind {
            return Err(Error::InvalidArgument(format!(
                "{what}: device {dev} is on the {} backend, device {} on {kind}: one backend for all",
                m.pool.driver().kind(),
                first.pool.device()
            )));
        }
        if members[..i].iter().any(|o| o.pool.device() == dev) {
            return Err(Error::InvalidArgument(format!(
                "{what}: device {dev} is listed twice (one replica per device)"
            )));
        }
    }
    Ok(())
}

/// Put replicas to sleep on one raw host backup: [`sleep_with`] with the
/// default options (the holder with [`Policy::Offload`]).
pub fn sleep(members: &[Replica<'_>]) -> Result<ReplicaSleepStats> {
    sleep_with(members, &ReplicaSleepOptions::default())
}

/// Put replicas to sleep on one host backup: `members[0]` (the holder) is
/// offloaded to pinned host memory with `opts.holder_policy`, every other
/// member releases its physical memory without a copy. A policy other than
/// Offload or OffloadCompressed is `InvalidArgument` and nothing changes. The caller asserts every member holds the same
/// bytes; the members must have the same layout (segments, committed sizes,
/// live blocks), else `InvalidArgument` and nothing changes.
///
/// A member already asleep is accepted (the holder only when every segment
/// is offloaded or still awake, as a sleep stopped midway leaves it), so a
/// call that failed midway can be repeated. On an error the holder is asleep
/// with its backup once its sleep succeeded, the members after it as far as
/// the error says; the group is formed only when every member is asleep.
pub fn sleep_with(
    members: &[Replica<'_>],
    opts: &ReplicaSleepOptions,
) -> Result<ReplicaSleepStats> {
    let t0 = Instant::now();
    opts.validate()?;
    check_members(members, "sleep of replicas")?;
    let holder = members[0];
    let layout = holder.lease().layout();
    for m in &members[1..] {
        if m.lease().layout() != layout {
            return Err(Error::InvalidArgument(format!(
                "sleep of replicas: tag {} on device {} is laid out differently from tag {} on \
                 device {} (segments, their sizes or live blocks differ): replicas must be \
                 allocated the same way on every device",
                tag::name_of(m.tag),
                m.pool.device(),
                tag::name_of(holder.tag),
                holder.pool.device()
            )));
        }
    }
    if holder.pool.is_tag_asleep(holder.tag) {
        // Awake segments of a holder whose sleep stopped midway are offloaded
        // by the sleep below; only a segment asleep without a backup is lost.
        let offloaded = holder.lease().all_awake_or_offloaded();
        if !offloaded {
            return Err(Error::InvalidState(format!(
                "sleep of replicas: tag {} on device {} (the holder) is asleep without a full \
                 host backup: wake it first",
                tag::name_of(holder.tag),
                holder.pool.device()
            )));
        }
    }
    let each: Vec<(&Pool, TagId)> = members.iter().map(|m| (m.pool, m.tag)).collect();
    grant_reachable(&each);
    let mut stats = ReplicaSleepStats {
        devices: members.iter().map(|m| m.pool.device()).collect(),
        ..Default::default()
    };
    for (i, m) in members.iter().enumerate() {
        let policy = if i == 0 {
            opts.holder_policy
        } else {
            Policy::Discard
        };
        let cycles = m.pool.sleep(&[(m.tag, policy)]).map_err(|e| {
            let what = format!(
                " (sleep of replicas stopped at device {}, tag {}: {i} asleep before it \
                 (device {} holds the backup), the rest awake: sleeping the replicas again \
                 finishes)",
                m.pool.device(),
                tag::name_of(m.tag),
                holder.pool.device()
            );
            e.with_context(&what)
        })?;
        for c in cycles {
            stats.backup_bytes += c.report.copied_bytes;
            if i == 0 {
                stats.backup_raw_bytes += c.report.raw_bytes.max(c.report.copied_bytes);
            }
            stats.released_bytes += c.report.physical_bytes;
        }
    }
    static NEXT_GROUP: AtomicU64 = AtomicU64::new(1);
    let mark = ReplicaMark {
        group: NEXT_GROUP.fetch_add(1, Ordering::Relaxed),
        holder: holder.pool.device(),
        devices: stats.devices.clone(),
    };
    let _marking = lock_marks();
    for m in members {
        m.lease().set_mark(mark.clone());
    }
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// Wake replicas by the same fan-out as [`MultiMode::Replicas`]: every
/// target's tags that own destinations are woken (memory mapped again at the
/// same addresses, peer grants set again), then the checkpoint, one copy in
/// host memory (the page cache), is loaded once and fanned out over peer
/// copies. Meant for replicas put to sleep with
/// [`Policy::Discard`]: no per-device backup is
/// kept, and the wake reads host memory once instead of once per device.
///
/// A device list [`load_multi`](super::load_multi) refuses (none, a device twice, two
/// backends) is refused before anything wakes. On an error after the wake
/// the tags are awake and the destinations hold what the load reached (see
/// [`load_multi`](super::load_multi)); loading again repairs them.
pub fn wake_by_reload(
    ckpt: Checkpoint,
    targets: &[PoolLoad<'_>],
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<MultiLoaded> {
    // A device list the load would refuse wakes nothing.
    check_devices(&device_loads(targets))?;
    for t in targets {
        let mut tags = BTreeSet::new();
        for d in t.registry.iter() {
            if let Some(seg) = t.pool.segment_of(d.ptr) {
                tags.insert(seg.tag);
            }
        }
        let asleep: Vec<TagId> = tags
            .into_iter()
            .filter(|&tag| t.pool.is_tag_asleep(tag))
            .collect();
        if !asleep.is_empty() {
            t.pool.wake(&asleep)?;
        }
    }
    load_multi_into_pools(ckpt, targets, MultiMode::Replicas, opts, ctl)
}

/// One piece of the backup: segment `seg`, bytes `[offset, offset+len)`.
#[derive(Debug, Clone, Copy)]
struct Piece {
    seg: usize,
    offset: usize,
    len: usize,
}

/// Cut the segments (committed sizes `sizes`) into `n` contiguous parts of
/// about equal bytes, boundaries on `align`, each as pieces of at most `max`.
fn cut_parts(sizes: &[usize], n: usize, align: usize, max: usize) -> Vec<Vec<Piece>> {
    let total: usize = sizes.iter().sum();
    let bound = |k: usize| -> usize {
        if k >= n {
            return total;
        }
        let b = (total as u128 * k as u128 / n as u128) as usize;
        (b / align * align).min(total)
    };
    let mut parts = vec![Vec::new(); n];
    let mut base = 0usize;
    for (seg, &size) in sizes.iter().enumerate() {
        for (k, part) in parts.iter_mut().enumerate() {
            let (lo, hi) = (bound(k).max(base), bound(k + 1).min(base + size));
            let mut at = lo;
            while at < hi {
                let len = max.min(hi - at);
                part.push(Piece {
                    seg,
                    offset: at - base,
                    len,
                });
                at += len;
            }
        }
        base += size;
    }
    parts
}

/// Wake replicas put to sleep by [`sleep`] (the same members, in any
/// order; the holder is the device that took the backup). See the module
/// docs for how the bytes move and what a failure leaves: on any error every
/// member is asleep in its group with the backup intact, and the error names
/// the device. On success every member is awake holding the holder's bytes,
/// and the group is dissolved.
pub fn wake_from_backup(
    members: &[Replica<'_>],
    opts: &ReplicaWakeOptions,
) -> Result<ReplicaWakeStats> {
    let t0 = Instant::now();
    opts.validate()?;
    check_members(members, "wake of replicas")?;
    let devices: Vec<i32> = members.iter().map(|m| m.pool.device()).collect();
    let marking = lock_marks();
    let mark = members[0].lease().mark::<ReplicaMark>();
    for m in members {
        let mine = m.lease().mark::<ReplicaMark>();
        let same = matches!((&mine, &mark), (Some(a), Some(b)) if a == b);
        let whole = mark.as_ref().is_some_and(|g| {
            let (mut a, mut b) = (g.devices.clone(), devices.clone());
            a.sort_unstable();
            b.sort_unstable();
            a == b
        });
        if !same || !whole {
            return Err(Error::InvalidState(format!(
                "wake of replicas: tag {} on device {} is not asleep in one replica group with \
                 every other member listed (devices {devices:?}; it was never put to sleep with \
                 the others by sleep, or woke or slept on its own since): to wake these \
                 members together, put them to sleep again with sleep, the member \
                 holding the backup first (nothing is copied), then wake them; Pool::wake wakes \
                 one alone, with its bytes only if it holds a backup",
                tag::name_of(m.tag),
                m.pool.device()
            )));
        }
    }
    drop(marking);
    let holder_dev = mark.expect("checked above").holder;
    // Transitions and engine locks are taken in device order, so two wakes
    // sharing pools cannot each hold what the other waits for.
    let mut sorted = members.to_vec();
    sorted.sort_by_key(|m| m.pool.device());
    let members = &sorted[..];
    let h = members
        .iter()
        .position(|m| m.pool.device() == holder_dev)
        .expect("the group's devices are listed");

    for m in members {
        m.lease().begin_wake()?;
    }
    let mut staged: Vec<StagedWake<'_>> = members
        .iter()
        .map(|m| m.pool.sleep_engine().stage_wake(m.tag, &segs_of(*m)))
        .collect();
    let result = restore(members, &mut staged, h, opts, t0);
    let mut stats = match result {
        Ok(s) => s,
        Err(e) => {
            for (m, s) in members.iter().zip(staged) {
                s.abort(&segs_of(*m));
            }
            for m in members {
                m.lease().end_transition(true);
            }
            return Err(e);
        }
    };
    for (m, s) in members.iter().zip(staged) {
        s.commit(&segs_of(*m));
        m.lease().drop_mark();
        m.lease().end_transition(false);
    }
    stats.devices = devices;
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// The segments of `m`'s tag, for the staged wake (pool lock held per call).
fn segs_of<'a>(m: Replica<'a>) -> impl Fn(SegVisitor<'_>) + 'a {
    move |f| m.lease().with_segments(|segs| f(segs))
}

/// Check, map and fill every member's memory; nothing is committed here.
fn restore(
    members: &[Replica<'_>],
    staged: &mut [StagedWake<'_>],
    h: usize,
    opts: &ReplicaWakeOptions,
    t0: Instant,
) -> Result<ReplicaWakeStats> {
    let n = members.len();
    let mut stats = ReplicaWakeStats::default();
    // Per member, its asleep segments in creation order: `(staged index, base,
    // committed)`; the i-th of every member holds the same bytes.
    let order: Vec<Vec<(usize, DevicePtr, usize)>> = members
        .iter()
        .zip(staged.iter())
        .map(|(m, s)| {
            let segs = s.segments();
            let bases: Vec<DevicePtr> = segs.iter().map(|x| x.0).collect();
            let seq = m.lease().creation_order(&bases);
            let mut v: Vec<(usize, DevicePtr, usize)> = segs
                .iter()
                .enumerate()
                .map(|(i, x)| (i, x.0, x.1))
                .collect();
            v.sort_by_key(|x| seq[x.0]);
            v
        })
        .collect();
    let sizes: Vec<usize> = order[h].iter().map(|s| s.2).collect();
    for (k, o) in order.iter().enumerate() {
        let theirs: Vec<usize> = o.iter().map(|s| s.2).collect();
        if theirs != sizes {
            return Err(Error::InvalidState(format!(
                "wake of replicas: tag {} on device {} has {} asleep segments of {} bytes, the \
                 holder (device {}) {} of {} bytes: a replica's memory changed while asleep",
                tag::name_of(members[k].tag),
                members[k].pool.device(),
                theirs.len(),
                theirs.iter().sum::<usize>(),
                members[h].pool.device(),
                sizes.len(),
                sizes.iter().sum::<usize>()
            )));
        }
    }
    // The codec's scratch on every device, for a compressed backup.
    let holder_segs: Vec<usize> = order[h].iter().map(|x| x.0).collect();
    let engines: Vec<&SleepEngine> = members.iter().map(|m| m.pool.sleep_engine()).collect();
    let scratch = replica_frames::scratch_bytes(&staged[h], &holder_segs, &engines)?;
    for ((m, s), scratch) in members.iter().zip(staged.iter()).zip(scratch) {
        let need = s.unmapped_bytes() + scratch;
        let free = m.pool.driver().mem_info()?.free;
        if need > free {
            return Err(Error::OutOfMemory {
                what: format!(
                    "wake of replicas: tag {} on device {}",
                    tag::name_of(m.tag),
                    m.pool.device()
                ),
                requested: need,
                free,
            });
        }
    }
    let t = Instant::now();
    for (m, s) in members.iter().zip(staged.iter_mut()) {
        s.map().map_err(|e| on_device(m, "mapping its memory", e))?;
        stats.mapped_bytes += s.unmapped_bytes();
    }
    stats.map_seconds = t.elapsed().as_secs_f64();

    let piece = if opts.copy_piece_bytes == 0 {
        64 << 20
    } else {
        opts.copy_piece_bytes
    };
    let dsts: Vec<Vec<DevicePtr>> = order
        .iter()
        .map(|o| o.iter().map(|x| x.1).collect())
        .collect();
    // peer[k][j]: device k may read device j's memory of the tag.
    let mut peer = vec![vec![false; n]; n];
    for k in 0..n {
        for j in 0..n {
            if j == k || !opts.peer_copies {
                continue;
            }
            let (rk, oj) = (members[k].pool.driver(), members[j].pool.driver());
            let mut ok = rk.can_access_peer(oj.device()).unwrap_or(false);
            for (i, &size) in sizes.iter().enumerate() {
                ok = ok
                    && oj
                        .peer_readable(dsts[j][i], size, rk.device())
                        .unwrap_or(false);
            }
            peer[k][j] = ok;
            stats.direct_pairs += usize::from(!ok);
        }
    }
    if !opts.peer_copies {
        stats.direct_pairs = n * (n - 1);
    }
    let drivers: Vec<Arc<dyn Driver>> = members.iter().map(|m| m.pool.driver().clone()).collect();
    stats.delivered_bytes = sizes.iter().sum::<usize>() as u64 * n as u64;

    if replica_frames::any_compressed(&staged[h], &holder_segs) {
        let group = Members {
            drivers,
            engines,
            tags: members.iter().map(|m| m.tag).collect(),
            dsts,
            peer,
            piece,
        };
        let moved = replica_frames::restore(&group, &staged[h], &holder_segs, &sizes, h)
            .map_err(|f| on_device(&members[f.device], f.step, f.error))?;
        stats.host_bytes = moved.host_bytes;
        stats.decoded_bytes = moved.decoded_bytes;
        stats.peer_bytes = moved.peer_bytes;
        stats.host_seconds = moved.host_seconds;
        stats.peer_seconds = moved.peer_seconds;
        stats.seconds = t0.elapsed().as_secs_f64();
        return Ok(stats);
    }

    let align = members[h].lease().granularity().max(1);
    let parts = cut_parts(&sizes, n, align, round_up(piece, align).max(align));
    // Part k in host spans (the holder's backup), one list per part.
    let mut spans: Vec<Vec<(usize, HostSpan)>> = Vec::with_capacity(n);
    for part in &parts {
        let mut v = Vec::new();
        for p in part {
            for s in staged[h].backup_spans(order[h][p.seg].0, p.offset, p.len, piece)? {
                v.push((p.seg, s));
            }
        }
        spans.push(v);
    }

    // Phase 1: device k copies part k from the backup, all devices at once.
    let t = Instant::now();
    let results = on_threads(n, "a device's wake thread", |k| {
        let d = drivers[k].as_ref();
        // SAFETY: every member's memory is mapped (above); the spans point
        // into the holder's backup, busy for this wake.
        with_streams(d, |st| unsafe { copy_spans(d, &dsts[k], &spans[k], st) })
    });
    for (k, r) in results.into_iter().enumerate() {
        stats.host_bytes += r.map_err(|e| on_device(&members[k], "copying from the backup", e))?;
    }
    stats.host_seconds = t.elapsed().as_secs_f64();

    // Phase 2: device k gets every other part, from its device or the backup.
    let t = Instant::now();
    let results = on_threads(n, "a device's wake thread", |k| {
        let d = drivers[k].as_ref();
        let mut from_host = 0u64;
        let moved = with_streams(d, |st| {
            let mut moved = 0u64;
            let mut i = 0usize;
            for j in (0..n).filter(|&j| j != k) {
                if !peer[k][j] {
                    // SAFETY: as in phase 1.
                    from_host += unsafe { copy_spans(d, &dsts[k], &spans[j], st) }?;
                    continue;
                }
                for p in &parts[j] {
                    // SAFETY: both segments are mapped, of equal committed
                    // size (checked), device k may read device j's (checked
                    // above); the streams are synchronized before return.
                    unsafe {
                        d.copy_peer_async(
                            dsts[k][p.seg] + p.offset as u64,
                            dsts[j][p.seg] + p.offset as u64,
                            drivers[j].device(),
                            p.len,
                            st[i % 2],
                        )?
                    };
                    i += 1;
                    moved += p.len as u64;
                }
            }
            Ok(moved)
        })?;
        Ok((moved, from_host))
    });
    for (k, r) in results.into_iter().enumerate() {
        let (moved, from_host) =
            r.map_err(|e| on_device(&members[k], "exchanging parts with its peers", e))?;
        stats.peer_bytes += moved;
        stats.host_bytes += from_host;
    }
    stats.peer_seconds = t.elapsed().as_secs_f64();
    stats.seconds = t0.elapsed().as_secs_f64();
    Ok(stats)
}

/// `e` on `m`'s device, with what a failed wake of replicas leaves.
fn on_device(m: &Replica<'_>, step: &str, e: Error) -> Error {
    e.with_context(&format!(
        " (wake of replicas, device {} {step}: every replica stays asleep with the backup \
         intact; wake them again)",
        m.pool.device()
    ))
}

#[cfg(test)]
mod tests {
    use super::cut_parts;

    #[test]
    fn parts_cover_every_byte_once_on_aligned_bounds() {
        let sizes = [6 << 20, 2 << 20, 10 << 20];
        for n in 1..=5 {
            let parts = cut_parts(&sizes, n, 2 << 20, 4 << 20);
            let mut seen: Vec<(usize, usize, usize)> = parts
                .iter()
                .flatten()
                .map(|p| (p.seg, p.offset, p.len))
                .collect();
            seen.sort();
            let mut cursor = vec![0usize; sizes.len()];
            for (seg, off, len) in seen {
                assert_eq!(off, cursor[seg], "n={n}: gap or overlap in segment {seg}");
                assert!(len <= 4 << 20 && len > 0);
                cursor[seg] += len;
            }
            assert_eq!(cursor, sizes, "n={n}");
            let total: usize = parts.iter().flatten().map(|p| p.len).sum();
            assert_eq!(total, sizes.iter().sum::<usize>());
        }
    }
}
