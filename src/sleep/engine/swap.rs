//! A swap: some tags of this device put to sleep while others wake, at
//! once, so the two directions of the link overlap (PCIe is full duplex).
//!
//! The sleep runs on a thread of its own on the engine's first set of
//! streams (device-to-host copies, or none for Discard and Reload), the wake
//! on the calling thread on the second set (host-to-device copies, reload
//! re-reads, compressed decodes). Each physical chunk of the waking tags is
//! created as soon as the device has room: memory the sleep releases chunk by
//! chunk as each run's copies complete (`release.rs`), the waiting done by
//! `room.rs`. Both sides keep their own rules: each tag's sleep is as
//! [`SleepEngine::sleep_tag`], each tag's wake as transactional as
//! [`SleepEngine::wake_tag`], and the two outcomes are reported apart.

use std::time::{Duration, Instant};

use super::options::{CycleReport, Policy};
use super::room::{Releases, Room};
use super::sleep::Lane;
use super::SleepEngine;
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::segment::Segment;
use crate::tag::TagId;

/// A tag's segments as [`super::TagSegments`] gives them, callable from
/// the swap's two threads.
pub type SyncTagSegments<'a> = &'a (dyn Fn(&mut dyn FnMut(&mut [&mut Segment])) + Sync);

/// A tag a swap puts to sleep.
#[derive(Clone, Copy)]
pub struct SwapSleep<'a> {
    /// The tag.
    pub tag: TagId,
    /// What its sleep does with its memory.
    pub policy: Policy,
    /// Its segments.
    pub segs: SyncTagSegments<'a>,
    /// Its live blocks (see [`SleepEngine::sleep_tag`]).
    pub in_use: Option<&'a [(DevicePtr, usize)]>,
}

/// A tag a swap wakes.
#[derive(Clone, Copy)]
pub struct SwapWake<'a> {
    /// The tag.
    pub tag: TagId,
    /// Its segments.
    pub segs: SyncTagSegments<'a>,
}

/// What a swap did, each side on its own.
#[derive(Debug, Default)]
pub struct SwapReport {
    /// One entry per tag of the sleep list, in order, as far as the sleep
    /// went: it stops at the first tag that fails (the tags after it stay
    /// awake, untouched).
    pub slept: Vec<Result<CycleReport>>,
    /// One entry per tag of the wake list, in order, as far as the wake
    /// went: it stops at the first tag that fails (that tag stays asleep
    /// with its backup, those after it as they were).
    pub woke: Vec<Result<CycleReport>>,
    /// Wall time of the sleep side.
    pub sleep_seconds: f64,
    /// Wall time of the wake side.
    pub wake_seconds: f64,
    /// Wall time of the whole swap.
    pub seconds: f64,
}

/// Tells the wake that the sleep has ended, also when the sleep panics.
struct Ended<'r>(&'r Releases);

impl Drop for Ended<'_> {
    fn drop(&mut self) {
        self.0.ended();
    }
}

impl SleepEngine {
    /// Put the tags of `sleep` to sleep and wake those of `wake` at once.
    ///
    /// The device is synchronized once, first (as a sleep does); then the
    /// sleep side copies out and releases chunk by chunk while the wake side
    /// maps each chunk as soon as the device has room and restores into it.
    /// While the sleep runs, the wake waits for its releases with no
    /// deadline; once it has ended, the wake waits at most `wait` more for
    /// memory from elsewhere (zero: fails at once), then fails
    /// transactionally with [`crate::Error::OutOfMemory`] naming the tag,
    /// the bytes needed and free.
    ///
    /// The tags of the two lists must differ; the caller marks them all in
    /// transition. Sleep-side failures do not stop the wake (it may still
    /// find room), and a wake failure does not stop the sleep.
    pub fn swap(
        &self,
        sleep: &[SwapSleep<'_>],
        wake: &[SwapWake<'_>],
        wait: Duration,
    ) -> SwapReport {
        let t0 = Instant::now();
        let _one = self.one_transition();
        let releases = Releases::default();
        // One synchronize for both sides before either queues anything: the
        // sleep's own would otherwise wait for the wake's copies.
        let synced = if sleep.is_empty() {
            Ok(())
        } else {
            self.driver.synchronize()
        };
        let beside = (!sleep.is_empty()).then_some(&releases);
        let room = Room::new(wait, beside);
        let (mut report, sleep_panic) = std::thread::scope(|s| {
            let sleeper = (!sleep.is_empty()).then(|| {
                let releases = &releases;
                s.spawn(move || {
                    let _ended = Ended(releases);
                    let t = Instant::now();
                    let mut out = Vec::new();
                    if let Err(e) = synced {
                        out.push(Err(e));
                        return (out, t.elapsed().as_secs_f64());
                    }
                    let lane = Lane {
                        second: false,
                        synced: true,
                        releases: Some(releases),
                    };
                    for side in sleep {
                        let r = self.sleep_in(side.tag, side.policy, side.segs, side.in_use, lane);
                        let failed = r.is_err();
                        out.push(r);
                        if failed {
                            break;
                        }
                    }
                    (out, t.elapsed().as_secs_f64())
                })
            });
            let t = Instant::now();
            let lane = Lane {
                second: true,
                synced: true,
                releases: None,
            };
            let mut woke = Vec::new();
            for side in wake {
                let r = self.wake_in(side.tag, side.segs, lane, &room);
                let failed = r.is_err();
                woke.push(r);
                if failed {
                    break;
                }
            }
            let wake_seconds = t.elapsed().as_secs_f64();
            let (slept, sleep_seconds, panic) = match sleeper.map(|h| h.join()) {
                None => (Vec::new(), 0.0, None),
                Some(Ok((slept, secs))) => (slept, secs, None),
                Some(Err(p)) => (Vec::new(), 0.0, Some(p)),
            };
            (
                SwapReport {
                    slept,
                    woke,
                    sleep_seconds,
                    wake_seconds,
                    seconds: 0.0,
                },
                panic,
            )
        });
        if let Some(p) = sleep_panic {
            // The wake has finished (and stays as it is); the caller's
            // panic boundary turns this into an error.
            std::panic::resume_unwind(p);
        }
        report.seconds = t0.elapsed().as_secs_f64();
        report
    }
}
