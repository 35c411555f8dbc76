//! Device memory for a wake that may wait for it: each physical chunk is
//! created when the device has room, up to a deadline, instead of the wake
//! being refused at once when free memory is short.
//!
//! Memory comes back from two places: a sleep of this engine running at the
//! same time (a swap, [`super::SleepEngine::swap`]), which tells the waiter
//! through a [`Releases`] signal each time it unmaps chunks; and anything else
//! on the device (another process putting its model to sleep, another pool
//! trimming), which only the driver's free-memory figure shows, so the waiter
//! polls it. A create that fails for want of memory is retried when either
//! says there may be room; the deadline ends the wait with an
//! [`Error::OutOfMemory`] that names the tag, the bytes needed and the bytes
//! free.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::driver::{CreateFlags, DevicePtr, Driver, PeerAccess, PhysHandle};
use crate::error::{Error, Result};
use crate::segment::map_new_at;

/// How often a waiting wake asks the driver for its free memory when nothing
/// in this process signals: a cheap call (`cuMemGetInfo`), so the wait ends
/// within about this long of another process's release.
const POLL: Duration = Duration::from_millis(1);

/// Free memory a wake beside a sleep leaves the sleep until the sleep has
/// its own device memory (Reload's hash buffers, the codec's scratch): a
/// device with less free than the wake needs plus this waits for it.
const SLEEP_ROOM: u64 = 512 << 20;

/// What a sleep running beside a wake has released, told as it happens.
#[derive(Debug, Default)]
pub(super) struct Releases {
    /// (releases so far, the sleep has ended)
    state: Mutex<(u64, bool)>,
    /// The sleep holds the device memory it needs of its own.
    ready: Mutex<bool>,
    changed: Condvar,
}

impl Releases {
    /// The sleep has taken the device memory it needs of its own (it only
    /// gives memory back from now on).
    pub(super) fn ready(&self) {
        *self.ready.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Wait until the sleep is ready or has ended.
    fn wait_ready(&self) {
        loop {
            if *self.ready.lock().unwrap_or_else(|p| p.into_inner()) || self.snapshot().1 {
                return;
            }
            let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            let _ = self.changed.wait_timeout(s, Duration::from_millis(1));
        }
    }

    /// Some chunks were unmapped and released.
    pub(super) fn released(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.0 += 1;
        self.changed.notify_all();
    }

    /// The sleep has ended (done, failed or stopped): nothing more comes
    /// from it.
    pub(super) fn ended(&self) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.1 = true;
        self.changed.notify_all();
    }

    fn snapshot(&self) -> (u64, bool) {
        *self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wait at most `max` for a release or the end after `seen` releases.
    fn wait_past(&self, seen: u64, max: Duration) {
        let s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self
            .changed
            .wait_timeout_while(s, max, |s| s.0 == seen && !s.1);
    }
}

/// How long a wake may wait for device memory, and what it waits on.
#[derive(Debug)]
pub(super) struct Room<'a> {
    /// Longest wait for memory once nothing in this process will release
    /// more (zero: none, the wake fails at the first create refused for
    /// memory, as a plain wake).
    pub(super) wait: Duration,
    /// A sleep of this engine running beside the wake: while it runs the
    /// wake waits for its releases with no deadline (it frees memory as its
    /// copies complete, and cannot stop for want of device memory); the
    /// `wait` counts from its end.
    pub(super) beside: Option<&'a Releases>,
    /// Deadline of the wait, once it counts (see `beside`).
    deadline: Mutex<Option<Instant>>,
    /// Time spent waiting for memory so far (the wake's report says it).
    waited: Mutex<Duration>,
}

impl<'a> Room<'a> {
    /// No waiting: the first create refused for memory fails the wake.
    pub(super) fn none() -> Room<'static> {
        Room::new(Duration::ZERO, None)
    }

    pub(super) fn new(wait: Duration, beside: Option<&'a Releases>) -> Room<'a> {
        Room {
            // A deadline must fit in an `Instant`.
            wait: wait.min(Duration::from_secs(365 * 24 * 3600)),
            beside,
            deadline: Mutex::new(None),
            waited: Mutex::new(Duration::ZERO),
        }
    }

    /// Time this wake has spent waiting for device memory.
    pub(super) fn waited(&self) -> Duration {
        *self.waited.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Before a wake beside a sleep maps anything: when the device's free
    /// memory does not hold what the wake needs with room to spare, let the
    /// sleep take the little device memory of its own it needs first (it
    /// would otherwise fail for want of it, the wake having taken the last
    /// free chunks).
    pub(super) fn let_sleep_start(&self, driver: &dyn Driver, needed: u64) -> Result<()> {
        if let Some(r) = self.beside {
            if driver.mem_info()?.free < needed.saturating_add(SLEEP_ROOM) {
                r.wait_ready();
            }
        }
        Ok(())
    }

    /// True when this wake may wait for memory at all.
    pub(super) fn waits(&self) -> bool {
        !self.wait.is_zero() || self.beside.is_some()
    }

    /// The deadline now: none while a sleep beside runs, else `wait` from
    /// the first time it was asked for (or the sleep's end).
    fn deadline(&self) -> Option<Instant> {
        if self.beside.is_some_and(|r| !r.snapshot().1) {
            return None;
        }
        let mut d = self.deadline.lock().unwrap_or_else(|p| p.into_inner());
        Some(*d.get_or_insert_with(|| Instant::now() + self.wait))
    }

    /// Wait until the driver reports at least `bytes` free, a release beside
    /// may have made room, or the deadline passes. Returns false when the
    /// deadline has passed (the caller fails), true when a create is worth
    /// trying again.
    fn wait_for(&self, driver: &dyn Driver, bytes: u64) -> Result<bool> {
        let start = Instant::now();
        let r = self.wait_for_inner(driver, bytes);
        *self.waited.lock().unwrap_or_else(|p| p.into_inner()) += start.elapsed();
        r
    }

    fn wait_for_inner(&self, driver: &dyn Driver, bytes: u64) -> Result<bool> {
        loop {
            let seen = self.beside.map(|r| r.snapshot());
            let deadline = self.deadline();
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(false);
            }
            let step = deadline.map_or(POLL, |d| POLL.min(d - now));
            match (self.beside, seen) {
                (Some(r), Some((n, false))) => r.wait_past(n, step),
                _ => std::thread::sleep(step),
            }
            if driver.mem_info()?.free >= bytes || self.beside.map(|r| r.snapshot()) != seen {
                return Ok(true);
            }
        }
    }

    /// Create `size` bytes of physical memory, map them at `va` and grant
    /// access (as [`map_new_at`]), waiting for room as this wake may. `what`
    /// names the wake in the error; `needed` is the bytes the whole wake
    /// maps, which the error reports as requested.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn map(
        &self,
        driver: &dyn Driver,
        va: DevicePtr,
        size: usize,
        peers: &[PeerAccess],
        flags: CreateFlags,
        what: &dyn Fn() -> String,
        needed: u64,
    ) -> Result<PhysHandle> {
        self.with_room(driver, size as u64, what, needed, &mut || {
            map_new_at(driver, va, size, peers, flags)
        })
    }

    /// Run `make`, which needs `bytes` of device memory, again each time the
    /// device may have room, while it fails for want of memory and the wait
    /// allows. The error names `what`, `needed` and the free memory.
    pub(super) fn with_room<T>(
        &self,
        driver: &dyn Driver,
        bytes: u64,
        what: &dyn Fn() -> String,
        needed: u64,
        make: &mut dyn FnMut() -> Result<T>,
    ) -> Result<T> {
        let started = Instant::now();
        loop {
            match make() {
                Err(e) if e.is_out_of_memory() && self.waits() => {
                    if !self.wait_for(driver, bytes)? {
                        let free = driver.mem_info().map_or(0, |m| m.free);
                        return Err(Error::OutOfMemory {
                            what: format!(
                                "{} (waited {:.0} ms for device memory; a chunk of {bytes} bytes did not fit)",
                                what(),
                                started.elapsed().as_secs_f64() * 1e3
                            ),
                            requested: needed,
                            free,
                        });
                    }
                }
                r => return r,
            }
        }
    }
}
