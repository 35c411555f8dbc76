//! Sleep and wake of a pool's tags: each tag's segments go through the pool's
//! [`SleepEngine`], under the pool lock, and the tag is marked asleep so no
//! block is handed out from memory that is not there.

use std::collections::HashSet;
use std::sync::Arc;

use super::Pool;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::SleepState;
use crate::sleep::reload::ReloadSource;
use crate::sleep::{CycleReport, Policy, SleepEngine, SleepOptions};
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

impl Pool {
    /// The sleep engine (backup arena, streams, reload sources) of this pool.
    pub fn sleep_engine(&self) -> &SleepEngine {
        &self.sleep
    }

    /// Change the sleep options (copy piece size, streams, host-memory limit, debug fill...).
    pub fn set_sleep_options(&self, options: SleepOptions) {
        self.sleep.set_options(options);
    }

    /// Put each listed tag to sleep with its policy. Every pointer stays valid;
    /// touching a sleeping tag's memory faults until it wakes. A tag already
    /// asleep is left as it is. Tags are processed in order; on an error the
    /// tags before it are asleep and the failing tag is as the error says.
    pub fn sleep(&self, items: &[(TagId, Policy)]) -> Result<Vec<TagCycle>> {
        for &(t, _) in items {
            self.check_known(t)?;
        }
        let mut out = Vec::with_capacity(items.len());
        for &(t, policy) in items {
            // One pool-lock hold per tag: marking the tag asleep, the engine's
            // work and settling the mark cannot interleave with another
            // thread's wake of the same tag or with allocations in it.
            let r = {
                let mut st = self.lock();
                st.tags.entry(t).or_default().asleep = true;
                let mut segs = st.tag_segments(t);
                let r = self.sleep.sleep(t, &mut segs, policy);
                let any_asleep = segs.iter().any(|s| s.sleep_state() != SleepState::Awake);
                drop(segs);
                if !any_asleep {
                    st.tags.entry(t).or_default().asleep = false;
                }
                r
            };
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
    /// before anything is mapped; each tag's wake is transactional.
    pub fn wake(&self, tags: &[TagId]) -> Result<Vec<TagCycle>> {
        for &t in tags {
            self.check_known(t)?;
        }
        let tags: Vec<TagId> = if tags.is_empty() {
            self.asleep_tags()
        } else {
            tags.to_vec()
        };
        let needed: u64 = {
            let st = self.lock();
            st.segs
                .values()
                .filter(|e| tags.contains(&e.tag))
                .map(|e| (e.seg.committed() - e.seg.mapped_bytes()) as u64)
                .sum()
        };
        let free = self.driver.mem_info()?.free;
        if needed > free {
            let names: Vec<String> = tags.iter().map(|t| tag::name_of(*t)).collect();
            return Err(Error::OutOfMemory {
                what: format!("wake of tags [{}]", names.join(", ")),
                requested: needed,
                free,
            });
        }
        let mut out = Vec::with_capacity(tags.len());
        for t in tags {
            let r = {
                let mut st = self.lock();
                let mut segs = st.tag_segments(t);
                let r = self.sleep.wake(t, &mut segs);
                let all_awake = segs.iter().all(|s| s.sleep_state() == SleepState::Awake);
                drop(segs);
                if all_awake {
                    st.tags.entry(t).or_default().asleep = false;
                }
                r
            };
            out.push(TagCycle {
                tag: t,
                name: tag::name_of(t),
                policy: None,
                report: r?,
            });
        }
        Ok(out)
    }

    /// `Error::UnknownTag` unless `tag` is registered and has held memory in
    /// this pool (or was configured in it): sleeping or waking a misspelled
    /// tag must not succeed doing nothing.
    fn check_known(&self, t: TagId) -> Result<()> {
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

    /// Pin `bytes` of host backup ahead of time, so even the first offload
    /// sleep runs at the link's rate.
    pub fn reserve_backup(&self, bytes: u64) -> Result<()> {
        self.sleep.reserve_backup(bytes)
    }

    /// Unpin backup memory not holding an asleep segment's contents. Returns bytes unpinned.
    pub fn release_backup(&self) -> u64 {
        // Under the pool lock, so no sleep can reuse a backup between the
        // snapshot of asleep segments and the release.
        let st = self.lock();
        let asleep: HashSet<DevicePtr> = st
            .segs
            .iter()
            .filter(|(_, e)| e.seg.sleep_state() != SleepState::Awake)
            .map(|(&b, _)| b)
            .collect();
        self.sleep.release_backup(&|va| !asleep.contains(&va))
    }

    /// Register where `tag`'s bytes can be reloaded from (the loader's executed plan).
    pub fn add_reload_source(&self, tag: TagId, source: Arc<dyn ReloadSource>) -> Result<()> {
        tag::check(tag)?;
        self.sleep.add_reload_source(tag, source);
        Ok(())
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
