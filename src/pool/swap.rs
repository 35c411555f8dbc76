//! A swap of a pool's tags: some put to sleep while others wake, at once,
//! through the sleep engine's [`SleepEngine::swap`](crate::sleep::SleepEngine::swap),
//! so the device-to-host copies of the one and the host-to-device copies of
//! the other share the link's two directions, and each chunk of the waking
//! tags is mapped as soon as the sleeping ones free room for it.

use std::time::Duration;

use super::sleep::{ending_on_panic, TagCycle};
use super::Pool;
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::segment::Segment;
use crate::sleep::{Policy, SwapSleep, SwapWake};
use crate::tag::{self, TagId};

/// Options of [`Pool::swap_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwapOptions {
    /// Once the sleep side has ended, how long the wake side may still wait
    /// for device memory released elsewhere (another process, another pool)
    /// before it fails transactionally. Zero (the default): the swap is
    /// refused up front when the waking tags need more than the device's
    /// free memory plus what the sleeping tags hold, and the wake fails as
    /// soon as the sleep has ended without making room.
    pub wait_for_memory: Duration,
}

/// What a swap did: each side on its own.
#[derive(Debug)]
pub struct SwapOutcome {
    /// The tags of the sleep list put to sleep, in order.
    pub slept: Vec<TagCycle>,
    /// Why the sleep side stopped, if it did: the tag named in the error is
    /// as [`Pool::sleep`] leaves a failed tag, the tags after it awake.
    pub sleep_error: Option<Error>,
    /// The tags of the wake list woken, in order.
    pub woke: Vec<TagCycle>,
    /// Why the wake side stopped, if it did: that tag is asleep with its
    /// backup intact, the ones after it as they were.
    pub wake_error: Option<Error>,
    /// Wall time of the sleep side.
    pub sleep_seconds: f64,
    /// Wall time of the wake side.
    pub wake_seconds: f64,
    /// Wall time of the whole swap.
    pub seconds: f64,
}

impl SwapOutcome {
    /// True when both sides did all they were asked.
    pub fn is_ok(&self) -> bool {
        self.sleep_error.is_none() && self.wake_error.is_none()
    }

    /// The tags slept and woken, or the first error: the wake side's, else
    /// the sleep side's.
    pub fn into_result(self) -> Result<(Vec<TagCycle>, Vec<TagCycle>)> {
        match (self.wake_error, self.sleep_error) {
            (Some(e), _) | (None, Some(e)) => Err(e),
            (None, None) => Ok((self.slept, self.woke)),
        }
    }
}

impl Pool {
    /// [`Pool::swap_with`] with the default options.
    pub fn swap(&self, sleep: &[(TagId, Policy)], wake: &[TagId]) -> Result<SwapOutcome> {
        self.swap_with(sleep, wake, SwapOptions::default())
    }

    /// Put the tags of `sleep` to sleep (each with its policy) and wake the
    /// tags of `wake`, at once: the sleep's device-to-host copies run on
    /// their streams while the wake's host-to-device copies (or Reload
    /// re-reads, or compressed decodes) run on others, and each physical
    /// chunk of the waking tags is created as soon as the device has room,
    /// the sleep releasing its memory chunk by chunk as copies complete. A
    /// swap between two models of one device takes about the link time of
    /// the larger one instead of the sum of both.
    ///
    /// Refused, with nothing changed: a tag unknown to this pool
    /// (`UnknownTag`), a tag listed twice or in both lists
    /// (`InvalidArgument`), a sleeping tag a load is writing into
    /// (`LoadInProgress`), a shared tag whose shares refuse the sleep, and
    /// (with no `wait_for_memory`) waking tags that need more than the
    /// device's free memory plus what the sleeping tags hold
    /// (`OutOfMemory`).
    ///
    /// Otherwise the two sides' outcomes come back apart in the
    /// [`SwapOutcome`]: each sleeping tag as [`Pool::sleep`] leaves it, each
    /// waking tag's wake transactional as [`Pool::wake`] (on a failure, even
    /// midway, it stays asleep with its backup intact). No byte is lost on
    /// either side. The pool lock is held only for short steps; every tag of
    /// both lists is in transition until the swap returns (allocation in it
    /// refused, other tags unaffected).
    pub fn swap_with(
        &self,
        sleep: &[(TagId, Policy)],
        wake: &[TagId],
        options: SwapOptions,
    ) -> Result<SwapOutcome> {
        self.check_swap_lists(sleep, wake)?;
        if options.wait_for_memory.is_zero() {
            let sleeping: Vec<TagId> = sleep.iter().map(|&(t, _)| t).collect();
            let needed = self.unmapped_bytes(wake);
            let held = self.mapped_bytes(&sleeping);
            let free = self.driver.mem_info()?.free;
            if needed > free.saturating_add(held) {
                let names: Vec<String> = wake.iter().map(|t| tag::name_of(*t)).collect();
                return Err(Error::OutOfMemory {
                    what: format!(
                        "swap waking tags [{}] (the sleeping tags free {held} bytes)",
                        names.join(", ")
                    ),
                    requested: needed,
                    free,
                });
            }
        }
        // A shared tag's shares may refuse the sleep; the gate stays locked
        // through the swap when one is shared, so no importer attaches to
        // memory going away.
        let gate = self.shares.lock();
        let was_asleep = self.begin_transitions(sleep, wake)?;
        for &(t, _) in sleep {
            if let Err(e) = gate.before_sleep(t) {
                self.end_swap(sleep, wake, &was_asleep);
                return Err(e);
            }
        }
        let gate = sleep
            .iter()
            .any(|&(t, _)| gate.is_shared(t))
            .then_some(gate);
        for (&(t, _), &asleep) in sleep.iter().zip(&was_asleep) {
            if !asleep {
                // New contents of its own: the mark of a group no longer holds.
                self.drop_tag_mark(t);
            }
        }
        // Bytes of free blocks carry nothing: Reload backs up only live ones.
        let in_use: Vec<Vec<(DevicePtr, usize)>> =
            sleep.iter().map(|&(t, _)| self.live_ranges(t)).collect();
        let segs_of = |t: TagId| {
            move |f: &mut dyn FnMut(&mut [&mut Segment])| f(&mut self.lock().tag_segments(t))
        };
        let sleep_segs: Vec<_> = sleep.iter().map(|&(t, _)| segs_of(t)).collect();
        let wake_segs: Vec<_> = wake.iter().map(|&t| segs_of(t)).collect();
        let sleep_sides: Vec<SwapSleep<'_>> = sleep
            .iter()
            .zip(&sleep_segs)
            .zip(&in_use)
            .map(|((&(tag, policy), segs), in_use)| SwapSleep {
                tag,
                policy,
                segs,
                in_use: Some(in_use),
            })
            .collect();
        let wake_sides: Vec<SwapWake<'_>> = wake
            .iter()
            .zip(&wake_segs)
            .map(|(&tag, segs)| SwapWake { tag, segs })
            .collect();
        let report = ending_on_panic(
            || {
                self.sleep
                    .swap(&sleep_sides, &wake_sides, options.wait_for_memory)
            },
            || self.end_swap(sleep, wake, &was_asleep),
        );
        let woken: Vec<TagId> = wake
            .iter()
            .zip(&report.woke)
            .filter(|(_, r)| r.is_ok())
            .map(|(&t, _)| t)
            .collect();
        for &t in &woken {
            // Woken on its own its mark is dropped.
            self.drop_tag_mark(t);
        }
        self.end_swap(sleep, wake, &was_asleep);
        drop(gate);
        let (mut slept, mut sleep_error) = (Vec::new(), None);
        for (&(tag, policy), r) in sleep.iter().zip(report.slept) {
            match r {
                Ok(report) => slept.push(TagCycle {
                    tag,
                    name: tag::name_of(tag),
                    policy: Some(policy),
                    report,
                }),
                Err(e) => sleep_error = Some(e),
            }
        }
        let (mut woke, mut wake_error) = (Vec::new(), None);
        for (&tag, r) in wake.iter().zip(report.woke) {
            match r {
                Ok(report) => woke.push(TagCycle {
                    tag,
                    name: tag::name_of(tag),
                    policy: None,
                    report,
                }),
                Err(e) => wake_error = Some(e),
            }
        }
        Ok(SwapOutcome {
            slept,
            sleep_error,
            woke,
            wake_error,
            sleep_seconds: report.sleep_seconds,
            wake_seconds: report.wake_seconds,
            seconds: report.seconds,
        })
    }

    /// Refuse unknown tags, and a tag listed twice or in both lists.
    fn check_swap_lists(&self, sleep: &[(TagId, Policy)], wake: &[TagId]) -> Result<()> {
        let all: Vec<TagId> = sleep
            .iter()
            .map(|&(t, _)| t)
            .chain(wake.iter().copied())
            .collect();
        for &t in &all {
            self.check_known(t)?;
        }
        for (i, &t) in all.iter().enumerate() {
            if let Some(j) = all[..i].iter().position(|&u| u == t) {
                let where_ = if j < sleep.len() && i >= sleep.len() {
                    "in both the sleep and the wake list"
                } else if i < sleep.len() {
                    "twice in the sleep list"
                } else {
                    "twice in the wake list"
                };
                return Err(Error::InvalidArgument(format!(
                    "swap: tag {} is {where_}: a swap puts each tag to sleep or wakes it, once",
                    tag::name_of(t)
                )));
            }
        }
        Ok(())
    }

    /// Bytes of `tags` physically mapped now: what putting them to sleep frees.
    fn mapped_bytes(&self, tags: &[TagId]) -> u64 {
        let st = self.lock();
        st.segs
            .values()
            .filter(|e| tags.contains(&e.tag))
            .map(|e| e.seg.mapped_bytes() as u64)
            .sum()
    }

    /// Mark every tag of both lists in transition at once (waiting, under
    /// one lock, until none is in one already, so two swaps naming the same
    /// tags in another order cannot wait for each other), the sleeping ones
    /// asleep. Refused, nothing marked, when a load writes into a sleeping
    /// tag. Returns whether each sleeping tag was asleep before.
    fn begin_transitions(&self, sleep: &[(TagId, Policy)], wake: &[TagId]) -> Result<Vec<bool>> {
        let mut st = self.lock();
        let all = || sleep.iter().map(|&(t, _)| t).chain(wake.iter().copied());
        while all().any(|t| st.in_transition(t)) {
            st = self.settled.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        for &(t, _) in sleep {
            let loads = st.tags.get(&t).map_or(0, |ts| ts.loads);
            if loads > 0 {
                return Err(Error::LoadInProgress {
                    tag: tag::name_of(t),
                    loads,
                });
            }
        }
        let mut was_asleep = Vec::with_capacity(sleep.len());
        for &(t, _) in sleep {
            let ts = st.tags.entry(t).or_default();
            ts.transition = true;
            was_asleep.push(ts.asleep);
            ts.asleep = true;
        }
        for &t in wake {
            st.tags.entry(t).or_default().transition = true;
        }
        Ok(was_asleep)
    }

    /// End the transitions [`Self::begin_transitions`] began.
    fn end_swap(&self, sleep: &[(TagId, Policy)], wake: &[TagId], was_asleep: &[bool]) {
        for (&(t, _), &asleep) in sleep.iter().zip(was_asleep) {
            self.end_transition(t, asleep);
        }
        for &t in wake {
            self.end_transition(t, false);
        }
    }
}
