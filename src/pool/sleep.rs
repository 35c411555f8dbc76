//! Sleep and wake of a pool's tags: each tag's segments go through the pool's
//! [`SleepEngine`], which takes the pool lock only for short steps; the tag is
//! marked in transition (and asleep, for sleep) so no block is handed out from
//! memory that is not there.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Pool;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::sleep::reload::ReloadSource;
use crate::sleep::{CycleReport, Policy, SleepEngine, SleepOptions, WakeOptions};
use crate::tag::{self, TagId};

/// What one sleep or wake call did to one tag.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TagCycle {
    /// The tag.
    pub tag: TagId,
    /// Its name.
    pub name: String,
    /// The policy it slept with (None for wake).
    pub policy: Option<Policy>,
    /// What happened.
    pub report: CycleReport,
}

/// Run `f`, the sleep engine's part of a transition; when it panics (a bug,
/// or a caller's reload source), run `end` before the panic goes on, so the
/// tags leave their transition: every later sleep, wake or swap of them would
/// otherwise wait for it forever, and the others behind those.
pub(super) fn ending_on_panic<R>(f: impl FnOnce() -> R, end: impl FnOnce()) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            end();
            std::panic::resume_unwind(p)
        }
    }
}

/// Tags a running load writes into (see [`Pool::pin_for_load`]); dropping it
/// lets them sleep again.
#[derive(Debug)]
pub struct LoadPin<'a> {
    pool: &'a Pool,
    tags: Vec<TagId>,
}

impl LoadPin<'_> {
    /// The pool tags pinned: those owning at least one destination.
    pub fn tags(&self) -> &[TagId] {
        &self.tags
    }
}

impl Drop for LoadPin<'_> {
    fn drop(&mut self) {
        let mut st = self.pool.lock();
        for t in &self.tags {
            if let Some(ts) = st.tags.get_mut(t) {
                ts.loads = ts.loads.saturating_sub(1);
            }
        }
        self.pool.settled.notify_all();
    }
}

impl Pool {
    /// The sleep engine (backup arena, streams, reload sources) of this pool.
    pub fn sleep_engine(&self) -> &SleepEngine {
        &self.sleep
    }

    /// Change the sleep options (copy piece size, streams, host-memory limit, debug fill...).
    pub fn set_sleep_options(&self, options: SleepOptions) -> Result<()> {
        options.validate()?;
        self.sleep.set_options(options);
        Ok(())
    }

    /// Put each listed tag to sleep with its policy. Every pointer stays valid;
    /// touching a sleeping tag's memory faults until it wakes. A tag already
    /// asleep is left as it is (what an earlier failed sleep left mapped is
    /// released). Tags are processed in order; on an error the tags before it
    /// are asleep and the failing tag is as the error says.
    ///
    /// Rules while a tag sleeps or wakes: the pool lock is held only for short
    /// bookkeeping steps, never across copies or reloads; allocation in that
    /// tag is refused (`InvalidState`), other tags allocate and free freely;
    /// a second sleep or wake of the same tag waits for the first. A tag that
    /// a load is writing into ([`Pool::pin_for_load`]) is refused with
    /// [`Error::LoadInProgress`] and nothing changes: sleep once the load has
    /// returned, or cancel it first.
    pub fn sleep(&self, items: &[(TagId, Policy)]) -> Result<Vec<TagCycle>> {
        for &(t, _) in items {
            self.check_known(t)?;
        }
        let mut out = Vec::with_capacity(items.len());
        for &(t, policy) in items {
            // A shared tag's shares may refuse the sleep; the gate stays locked
            // through the sleep so no importer attaches to memory going away.
            // An unshared tag lets the gate go once its transition has begun
            // (a share started from then on sees the transition and refuses),
            // so sleeps of other tags are not held up.
            let gate = self.shares.lock();
            let was_asleep = self.begin_transition(t, true)?;
            if !was_asleep {
                // New contents of its own: the mark of a group no longer holds.
                self.drop_tag_mark(t);
            }
            if let Err(e) = gate.before_sleep(t) {
                self.end_transition(t, was_asleep);
                return Err(e);
            }
            let gate = gate.is_shared(t).then_some(gate);
            // Bytes of free blocks carry nothing: Reload backs up only live ones.
            let in_use = self.live_ranges(t);
            let r = ending_on_panic(
                || {
                    self.sleep.sleep_tag(
                        t,
                        policy,
                        &|f| f(&mut self.lock().tag_segments(t)),
                        Some(&in_use),
                    )
                },
                || self.end_transition(t, was_asleep),
            );
            self.end_transition(t, was_asleep);
            drop(gate);
            out.push(TagCycle {
                tag: t,
                name: tag::name_of(t),
                policy: Some(policy),
                report: r?,
            });
        }
        Ok(out)
    }

    /// Wake the listed tags (all asleep tags when `tags` is empty). The bytes
    /// needed by all of them are checked against the device's free memory
    /// before anything is mapped; each tag's wake is transactional (see
    /// [`SleepEngine::wake_tag`]). The rules of [`Pool::sleep`] about the
    /// pool lock and concurrent calls hold here too.
    pub fn wake(&self, tags: &[TagId]) -> Result<Vec<TagCycle>> {
        self.wake_with(tags, WakeOptions::default())
    }

    /// [`Pool::wake`] with options. With a non-zero
    /// [`WakeOptions::wait_for_memory`], a wake short of free device memory
    /// is not refused at once: each physical chunk is created as the device
    /// has room, polling the driver's free memory, for as long as the option
    /// says (memory another process or pool is releasing: process A puts its
    /// model to sleep while process B wakes its own, both directions of the
    /// link at once), in all: the tags woken one after another share the
    /// wait. At the deadline the tag's wake fails as any wake does:
    /// asleep, backup intact, an [`Error::OutOfMemory`] naming the tag, the
    /// bytes needed and free. Only more than the device's total memory is
    /// refused up front. While it waits the wake holds this pool's
    /// transitions: a sleep of another tag of this pool waits for it, so its
    /// memory cannot make the room ([`Pool::swap`] puts one tag to sleep
    /// while another wakes).
    pub fn wake_with(&self, tags: &[TagId], options: WakeOptions) -> Result<Vec<TagCycle>> {
        for &t in tags {
            self.check_known(t)?;
        }
        let tags: Vec<TagId> = if tags.is_empty() {
            self.asleep_tags()
        } else {
            tags.to_vec()
        };
        let needed = self.unmapped_bytes(&tags);
        let mem = self.driver.mem_info()?;
        let waits = !options.wait_for_memory.is_zero();
        if needed > mem.free && (!waits || needed > mem.total) {
            let names: Vec<String> = tags.iter().map(|t| tag::name_of(*t)).collect();
            return Err(Error::OutOfMemory {
                what: format!(
                    "wake of tags [{}]{}",
                    names.join(", "),
                    if waits {
                        " (more than the device holds)"
                    } else {
                        ""
                    }
                ),
                requested: needed,
                free: mem.free,
            });
        }
        // The wait bounds the whole call, not each tag: a tag waits what
        // the ones before it left (at least an instant, so a wait that ran
        // out still fails as a waiting wake, naming how long it waited).
        let wait = options
            .wait_for_memory
            .min(Duration::from_secs(365 * 24 * 3600));
        let until = Instant::now() + wait;
        let mut out = Vec::with_capacity(tags.len());
        for t in tags {
            self.begin_transition(t, false)?;
            let left = if waits {
                until
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_nanos(1))
            } else {
                Duration::ZERO
            };
            let r = ending_on_panic(
                || {
                    self.sleep
                        .wake_tag_waiting(t, &|f| f(&mut self.lock().tag_segments(t)), left)
                },
                || self.end_transition(t, false),
            );
            if r.is_ok() {
                // Woken on its own its mark is dropped.
                self.drop_tag_mark(t);
            }
            self.end_transition(t, false);
            out.push(TagCycle {
                tag: t,
                name: tag::name_of(t),
                policy: None,
                report: r?,
            });
        }
        Ok(out)
    }

    /// Bytes the segments of `tags` have committed but not mapped: what
    /// waking them all maps.
    pub(super) fn unmapped_bytes(&self, tags: &[TagId]) -> u64 {
        let st = self.lock();
        st.segs
            .values()
            .filter(|e| tags.contains(&e.tag))
            .map(|e| (e.seg.committed() - e.seg.mapped_bytes()) as u64)
            .sum()
    }

    /// `Error::UnknownTag` unless `tag` is registered and has held memory in
    /// this pool (or was configured in it): sleeping or waking a misspelled
    /// tag must not succeed doing nothing.
    pub(super) fn check_known(&self, t: TagId) -> Result<()> {
        tag::check(t)?;
        let st = self.lock();
        if st.tags.contains_key(&t) {
            return Ok(());
        }
        let mut known: Vec<String> = st.tags.keys().map(|k| tag::name_of(*k)).collect();
        known.sort();
        Err(Error::UnknownTag(format!(
            "{t}: it never held memory in this pool (its tags: [{}]); check the spelling",
            known.join(", ")
        )))
    }

    /// Every live block of `t`, as normalized device ranges.
    pub(super) fn live_ranges(&self, t: TagId) -> Vec<(DevicePtr, usize)> {
        let st = self.lock();
        let v = st
            .segs
            .iter()
            .filter(|(_, e)| e.tag == t)
            .flat_map(|(&base, e)| {
                e.blocks
                    .iter()
                    .filter(|(_, b)| b.live)
                    .map(move |(off, b)| (base + off as u64, b.size))
            })
            .collect();
        crate::sleep::ranges::normalize(v)
    }

    /// Mark `t` in transition (waiting for one already running); a sleep also
    /// marks it asleep at once, so no block is handed out from memory about to
    /// go. Refused while a load writes into the tag, when `sleeping`.
    /// Returns whether the tag was asleep before.
    pub(super) fn begin_transition(&self, t: TagId, sleeping: bool) -> Result<bool> {
        let mut st = self.lock();
        while st.in_transition(t) {
            st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        let ts = st.tags.entry(t).or_default();
        if sleeping && ts.loads > 0 {
            return Err(Error::LoadInProgress {
                tag: tag::name_of(t),
                loads: ts.loads,
            });
        }
        ts.transition = true;
        let was_asleep = ts.asleep;
        if sleeping {
            ts.asleep = true;
        }
        Ok(was_asleep)
    }

    /// End `t`'s transition: the tag is asleep while any segment is (or, with
    /// `keep_asleep`, a sleep found it asleep already, even with no segments
    /// left after a trim), and the dedicated segments freed meanwhile are released.
    pub(super) fn end_transition(&self, t: TagId, keep_asleep: bool) {
        let (released, woke) = {
            let mut st = self.lock();
            let any_asleep = st
                .segs
                .values()
                .any(|e| e.tag == t && e.seg.sleep_state() != SleepState::Awake);
            let ts = st.tags.entry(t).or_default();
            ts.transition = false;
            let woke = ts.asleep && !(any_asleep || keep_asleep);
            ts.asleep = any_asleep || keep_asleep;
            let deferred = std::mem::take(&mut st.deferred);
            let mut released = Vec::new();
            for base in deferred {
                let ours = st.segs.get(&base).is_some_and(|e| e.tag == t);
                if !ours {
                    st.deferred.push(base);
                } else if st.segs[&base].blocks.is_wholly_free() {
                    released.extend(self.remove_segment(&mut st, base));
                }
            }
            self.settled.notify_all();
            (released, woke)
        };
        // A failure keeps them for a later free or trim, which reports it.
        let _ = self.release_segments(released);
        if woke {
            // New physical pages behind the tag: registrations of the old are stale.
            super::remap::remapped(t);
        }
    }

    /// Pin the pool tags that own `dests` (`(address, bytes, name)`) for a
    /// load: each must be awake and not in transition (checked, and the pin
    /// taken, under one lock hold), and until the returned guard drops, sleep
    /// of those tags is refused with [`Error::LoadInProgress`]. Destinations
    /// outside this pool are the caller's memory and are not checked.
    pub fn pin_for_load(&self, dests: &[(DevicePtr, usize, &str)]) -> Result<LoadPin<'_>> {
        let mut st = self.lock();
        let mut tags: Vec<TagId> = Vec::new();
        for &(ptr, _, name) in dests {
            let Some(base) = super::segment_base(&st, ptr) else {
                continue;
            };
            let e = &st.segs[&base];
            let ts = st.tags.get(&e.tag);
            let state = if ts.is_some_and(|t| t.transition) {
                Some("being put to sleep or woken")
            } else if ts.is_some_and(|t| t.asleep) || e.seg.sleep_state() != SleepState::Awake {
                Some("asleep")
            } else {
                None
            };
            if let Some(state) = state {
                return Err(Error::InvalidState(format!(
                    "destination `{name}` at {ptr:#x} is in tag {} ({state}): wake the tag before loading into it",
                    tag::name_of(e.tag)
                )));
            }
            if !tags.contains(&e.tag) {
                tags.push(e.tag);
            }
        }
        for &t in &tags {
            st.tags.entry(t).or_default().loads += 1;
        }
        Ok(LoadPin { pool: self, tags })
    }

    /// Drop `tag`'s reload sources. Its segments asleep with Reload then wake
    /// with their backed-up bytes restored and the loaded bytes undefined:
    /// the way to wake a tag whose checkpoint changed, then load it again.
    pub fn forget_reload_sources(&self, tag: TagId) -> Result<()> {
        tag::check(tag)?;
        self.sleep.clear_reload_sources(tag);
        Ok(())
    }

    /// The bytes `[ptr, ptr+len)` of `tag` no longer hold what the tag's
    /// reload sources wrote (a load into them failed midway): no source
    /// restores them; a later Reload sleep keeps them in the host backup.
    pub fn retire_reload_range(&self, tag: TagId, ptr: DevicePtr, len: usize) {
        drop(self.sleep.retire_range(tag, ptr, len));
    }

    /// Pin `bytes` of host backup ahead of time, so even the first offload
    /// sleep runs at the link's rate. Waits for a sleep or wake running now.
    pub fn reserve_backup(&self, bytes: u64) -> Result<()> {
        self.sleep.reserve_backup(bytes)
    }

    /// Unpin backup memory not holding an asleep segment's contents. Returns bytes unpinned.
    pub fn release_backup(&self) -> u64 {
        // Under the pool lock, so no sleep can start between the snapshot of
        // asleep segments and the release (the engine keeps the backups of a
        // transition already running).
        let st = self.lock();
        let asleep: HashSet<DevicePtr> = st
            .segs
            .iter()
            .filter(|(_, e)| e.seg.sleep_state() != SleepState::Awake)
            .map(|(&b, _)| b)
            .collect();
        self.sleep.release_backup(&|va| !asleep.contains(&va))
    }

    /// Drop the host backups `tags` kept after their last wake (a wake keeps
    /// them unless the sleep options say otherwise), leaving the pinned
    /// memory in the backup arena for the next sleep of any tag: a backup
    /// released, with no cost to pin again. With `unpin`, every backup slab
    /// holding no asleep segment's bytes is unpinned as well (as
    /// [`Pool::release_backup`]). Asleep tags keep theirs. Returns the bytes
    /// unpinned.
    pub fn drop_backups(&self, tags: &[TagId], unpin: bool) -> Result<u64> {
        for &t in tags {
            tag::check(t)?;
        }
        let wanted: HashSet<TagId> = tags.iter().copied().collect();
        // Under the pool lock, as `release_backup`: no sleep starts between
        // the snapshot of asleep segments and the drop.
        let st = self.lock();
        let asleep: HashSet<DevicePtr> = st
            .segs
            .iter()
            .filter(|(_, e)| e.seg.sleep_state() != SleepState::Awake)
            .map(|(&b, _)| b)
            .collect();
        Ok(self
            .sleep
            .drop_backups(&wanted, &|va| !asleep.contains(&va), unpin))
    }

    /// Register where `tag`'s bytes can be reloaded from (the loader's
    /// executed plan): the source restores what it wrote inside the tag's
    /// segments, and the bytes it covers are taken from older sources.
    pub fn add_reload_source(&self, tag: TagId, source: Arc<dyn ReloadSource>) -> Result<()> {
        tag::check(tag)?;
        // Pinned like a load while the source's bytes are hashed: no sleep
        // may unmap them meanwhile.
        let (within, readable, _pin) = {
            let mut st = self.lock();
            while st.in_transition(tag) {
                st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
            }
            st.tags.entry(tag).or_default().loads += 1;
            let pin = LoadPin {
                pool: self,
                tags: vec![tag],
            };
            let segs = st.segs.iter().filter(|(_, e)| e.tag == tag);
            let within: Vec<(DevicePtr, usize)> =
                segs.clone().map(|(&b, e)| (b, e.seg.reserved())).collect();
            let readable: Vec<(DevicePtr, usize)> = segs
                .filter(|(_, e)| {
                    e.seg.sleep_state() == SleepState::Awake
                        && e.seg.mapped_bytes() == e.seg.committed()
                })
                .map(|(&b, e)| (b, e.seg.committed()))
                .collect();
            (within, readable, pin)
        };
        self.sleep
            .add_reload_source_within(tag, source, Some(&within), &readable)
    }

    /// The device bytes of `tag` its reload sources restore at wake.
    pub fn reload_coverage(&self, tag: TagId) -> Vec<(DevicePtr, usize)> {
        self.sleep.reload_coverage(tag)
    }

    /// Tags that have at least one asleep segment or are marked asleep.
    pub fn asleep_tags(&self) -> Vec<TagId> {
        let st = self.lock();
        let mut v: Vec<TagId> = st
            .tags
            .iter()
            .filter(|(_, ts)| ts.asleep)
            .map(|(&t, _)| t)
            .collect();
        for e in st.segs.values() {
            if e.seg.sleep_state() != SleepState::Awake && !v.contains(&e.tag) {
                v.push(e.tag);
            }
        }
        v.sort();
        v
    }
}
