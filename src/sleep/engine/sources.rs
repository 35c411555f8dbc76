//! The reload sources of each tag: registration, the device bytes each still
//! restores (less what was freed, written again or changed since the load),
//! the proofs checked at a Reload sleep, and retirement of sources no tag
//! registers any more.

use std::sync::Arc;

use super::{EngineState, SleepEngine};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::sleep::proof::Proofs;
use crate::sleep::ranges;
use crate::sleep::reload::ReloadSource;
use crate::tag::TagId;

/// A reload source registered for a tag, with the device bytes it still
/// restores: what it wrote inside the tag's segments, less the blocks freed
/// since, the bytes a newer load wrote and the bytes changed since the load.
#[derive(Debug)]
pub(super) struct Registered {
    src: Arc<dyn ReloadSource>,
    live: Vec<(DevicePtr, usize)>,
    /// The hashes of what it wrote, taken right after the load.
    proofs: Proofs,
}

/// Reload sources no tag registers any more; [`ReloadSource::retire`] runs
/// on each when this drops.
#[must_use = "dropping it retires the sources: drop it where that may block"]
#[derive(Debug, Default)]
pub struct Retired(Vec<Arc<dyn ReloadSource>>);

impl Drop for Retired {
    fn drop(&mut self) {
        self.0.iter().for_each(|r| r.retire());
    }
}

/// A reload source and the device ranges it restores in one wake.
pub(super) type Replay = (Arc<dyn ReloadSource>, Vec<(DevicePtr, usize)>);

impl EngineState {
    /// The sources among `dropped` that no tag registers any more.
    fn unregistered(&self, dropped: Vec<Arc<dyn ReloadSource>>) -> Vec<Arc<dyn ReloadSource>> {
        let same = |a: &Arc<dyn ReloadSource>, b: &Arc<dyn ReloadSource>| {
            std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
        };
        dropped
            .into_iter()
            .filter(|d| !self.reload.values().flatten().any(|r| same(&r.src, d)))
            .collect()
    }

    /// Union of what `tag`'s sources still restore.
    pub(super) fn coverage(&self, tag: TagId) -> Vec<(DevicePtr, usize)> {
        ranges::normalize(
            self.reload
                .get(&tag)
                .into_iter()
                .flatten()
                .flat_map(|r| r.live.iter().copied())
                .collect(),
        )
    }
}

impl SleepEngine {
    /// Register a source for `tag`, restoring the bytes it wrote that lie
    /// inside `within` (the tag's segments; `None`: all it wrote). The bytes it
    /// covers are taken from the tag's older sources (a newer load into the
    /// same parameters supersedes the older one); an older source left with
    /// nothing is dropped, so no stale load is replayed and no checkpoint is
    /// kept open for nothing.
    ///
    /// The bytes it covers are hashed on the device now (see
    /// [`crate::sleep::proof`]), where they lie in `readable` (the tag's
    /// awake, mapped segments): a Reload sleep hashes them again and keeps
    /// what changed in the host backup. Covered bytes outside `readable` get
    /// no proof and are kept in the backup as if changed. An error hashing
    /// registers nothing.
    pub fn add_reload_source_within(
        &self,
        tag: TagId,
        source: Arc<dyn ReloadSource>,
        within: Option<&[(DevicePtr, usize)]>,
        readable: &[(DevicePtr, usize)],
    ) -> Result<()> {
        let covered = ranges::normalize(source.covered_ranges());
        let mut pieces = source.pieces();
        pieces.sort_unstable();
        pieces.dedup();
        let live = match within {
            None => covered,
            Some(w) => ranges::normalize(
                w.iter()
                    .flat_map(|&(a, l)| ranges::intersect(&covered, a, l))
                    .collect(),
            ),
        };
        // Proofs follow what the source wrote piece by piece.
        let live_readable = ranges::normalize(
            readable
                .iter()
                .flat_map(|&(a, l)| ranges::intersect(&live, a, l))
                .collect(),
        );
        let provable: Vec<(DevicePtr, usize)> = pieces
            .iter()
            .flat_map(|&(a, l)| ranges::intersect(&live_readable, a, l))
            .collect();
        // SAFETY: `provable` lies in `readable`, which the caller names as
        // mapped and readable; the load that wrote it has completed.
        let proofs = unsafe { Proofs::take(self.driver.as_ref(), &provable) }?;
        let retired = {
            let mut s = self.lock();
            s.loaded.insert(tag);
            let list = s.reload.entry(tag).or_default();
            for r in list.iter_mut() {
                for &(a, l) in &live {
                    r.live = ranges::subtract(&r.live, a, l);
                }
            }
            let mut dropped = Vec::new();
            list.retain(|r| {
                let keep = !r.live.is_empty();
                if !keep {
                    dropped.push(r.src.clone());
                }
                keep
            });
            if !live.is_empty() {
                list.push(Registered {
                    src: source,
                    live,
                    proofs,
                });
            }
            s.unregistered(dropped)
        };
        retired.iter().for_each(|r| r.retire());
        Ok(())
    }

    /// Before a Reload sleep of `tag`: refuse a tag no load registered a
    /// source for.
    pub(super) fn require_reload_source(&self, tag: TagId) -> Result<()> {
        if self.lock().loaded.contains(&tag) {
            return Ok(());
        }
        Err(Error::InvalidState(format!(
            "tag {tag} has no reload source (load it with the loader first, or use Offload/Discard)"
        )))
    }

    /// Hash again, on the device, every proof block of `tag`'s sources that
    /// lies in `readable` (awake, mapped and idle segments). Bytes of
    /// `readable` whose block changed since the load, and live bytes there no
    /// block proves, stop being restored from the checkpoint: a Reload sleep
    /// keeps them in the host backup. Coverage outside `readable` is kept. Returns the live bytes taken from the sources. An error (the
    /// hash failed) changes nothing. The device must be synchronized: queued
    /// writes land before the hashes are taken.
    pub(super) fn drop_changed_coverage(
        &self,
        tag: TagId,
        readable: &[(DevicePtr, usize)],
    ) -> Result<u64> {
        // Per source: the proof blocks `(address, length, hash)` it still needs.
        type Check = (Arc<dyn ReloadSource>, Vec<(DevicePtr, usize, u64)>);
        let checks: Vec<Check> = {
            let s = self.lock();
            s.reload
                .get(&tag)
                .into_iter()
                .flatten()
                .map(|r| (r.src.clone(), r.proofs.relevant(&r.live)))
                .collect()
        };
        let inside = |a: DevicePtr, l: usize| {
            readable
                .iter()
                .any(|&(ra, rl)| a >= ra && a + l as u64 <= ra + rl as u64)
        };
        let mut to_hash = Vec::new();
        let mut expected = Vec::new();
        // Per source: the blocks proven unchanged.
        let mut proven: Vec<Vec<(DevicePtr, usize)>> = vec![Vec::new(); checks.len()];
        for (i, (_, blocks)) in checks.iter().enumerate() {
            for &(a, l, h) in blocks {
                if inside(a, l) {
                    to_hash.push((a, l));
                    expected.push((i, h));
                }
            }
        }
        // SAFETY: every range lies in `readable`, mapped, readable and idle
        // (the caller's contract).
        let hashes = unsafe { self.driver.hash_ranges(&to_hash) }?;
        for ((&(a, l), &(i, want)), got) in to_hash.iter().zip(&expected).zip(hashes) {
            if got == want {
                proven[i].push((a, l));
            }
        }
        let same = |a: &Arc<dyn ReloadSource>, b: &Arc<dyn ReloadSource>| {
            std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
        };
        let (taken, retired) = {
            let mut s = self.lock();
            let mut taken = 0u64;
            let mut dropped = Vec::new();
            if let Some(list) = s.reload.get_mut(&tag) {
                list.retain_mut(|r| {
                    let Some(i) = checks.iter().position(|(src, _)| same(src, &r.src)) else {
                        return true;
                    };
                    // Bytes outside `readable` (segments asleep already,
                    // proven when they went to sleep and untouched since)
                    // keep their coverage: dropping it would lose them, as
                    // no backup holds them.
                    let mut outside = r.live.clone();
                    for &(a, l) in readable {
                        outside = ranges::subtract(&outside, a, l);
                    }
                    let kept = ranges::normalize(
                        proven[i]
                            .iter()
                            .flat_map(|&(a, l)| ranges::intersect(&r.live, a, l))
                            .chain(outside)
                            .collect(),
                    );
                    taken += ranges::total(&r.live) - ranges::total(&kept);
                    r.live = kept;
                    let keep = !r.live.is_empty();
                    if !keep {
                        dropped.push(r.src.clone());
                    }
                    keep
                });
                if list.is_empty() {
                    s.reload.remove(&tag);
                }
            }
            (taken, Retired(s.unregistered(dropped)))
        };
        drop(retired);
        Ok(taken)
    }

    /// The bytes `[ptr, ptr+len)` of `tag` no longer hold what any source
    /// wrote (the block was freed, or a load into it failed midway): no source
    /// restores them any more; sources left with nothing are dropped, and
    /// [`ReloadSource::retire`] runs when the returned value drops (callers
    /// holding a lock drop it after releasing theirs).
    pub fn retire_range(&self, tag: TagId, ptr: DevicePtr, len: usize) -> Retired {
        let retired = {
            let mut s = self.lock();
            let Some(list) = s.reload.get_mut(&tag) else {
                return Retired(Vec::new());
            };
            let mut dropped = Vec::new();
            list.retain_mut(|r| {
                r.live = ranges::subtract(&r.live, ptr, len);
                let keep = !r.live.is_empty();
                if !keep {
                    dropped.push(r.src.clone());
                }
                keep
            });
            if list.is_empty() {
                s.reload.remove(&tag);
            }
            s.unregistered(dropped)
        };
        Retired(retired)
    }

    /// Drop the reload sources of `tag`. Its segments asleep with Reload then
    /// wake with their backed-up bytes restored and the loaded bytes undefined
    /// (load them again after the wake).
    pub fn clear_reload_sources(&self, tag: TagId) {
        let retired = {
            let mut s = self.lock();
            s.loaded.remove(&tag);
            let dropped = s
                .reload
                .remove(&tag)
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.src)
                .collect();
            s.unregistered(dropped)
        };
        retired.iter().for_each(|r| r.retire());
    }

    /// The device bytes of `tag` its reload sources restore at wake.
    pub fn reload_coverage(&self, tag: TagId) -> Vec<(DevicePtr, usize)> {
        self.lock().coverage(tag)
    }

    pub(super) fn sources(&self, tag: TagId) -> Vec<Arc<dyn ReloadSource>> {
        let s = self.lock();
        s.reload
            .get(&tag)
            .into_iter()
            .flatten()
            .map(|r| r.src.clone())
            .collect()
    }

    /// Wait until every reload source of `tag` has finished what it prepares
    /// after a Reload sleep (e.g. pinning the checkpoint's page cache).
    pub fn wait_reload_prepared(&self, tag: TagId) {
        for src in self.sources(tag) {
            src.wait_prepared();
        }
    }

    /// True when `tag` has at least one reload source.
    pub fn has_reload_source(&self, tag: TagId) -> bool {
        self.lock().reload.get(&tag).is_some_and(|v| !v.is_empty())
    }

    /// What each of `tag`'s sources restores inside `reloadable` (the
    /// segments asleep with Reload), for the sources that restore anything.
    pub(super) fn replays(&self, tag: TagId, reloadable: &[(DevicePtr, usize)]) -> Vec<Replay> {
        if reloadable.is_empty() {
            return Vec::new();
        }
        let s = self.lock();
        s.reload
            .get(&tag)
            .into_iter()
            .flatten()
            .map(|r| {
                let parts = reloadable
                    .iter()
                    .flat_map(|&(a, l)| ranges::intersect(&r.live, a, l))
                    .collect::<Vec<_>>();
                (r.src.clone(), parts)
            })
            .filter(|(_, parts)| !parts.is_empty())
            .collect()
    }
}
