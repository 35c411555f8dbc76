//! A test collective, not a product: the ranks are threads of one process on
//! the host backend, and a broadcast is a memory copy between them behind a
//! rendezvous. CI runs the broadcast transport's bucketing, ordering,
//! double-buffering and failure paths through it, where there is no NCCL.
//!
//! A rank that leaves (its `TestCollective` dropped) fails every other rank's
//! next broadcast and check, as NCCL's asynchronous error does for a dead peer.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::broadcast::Collective;
use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};

#[derive(Debug, Default)]
struct Round {
    /// Broadcasts every rank has completed.
    done: u64,
    /// The root's buffer of the round in progress.
    source: Option<(DevicePtr, usize)>,
    /// Ranks that arrived in the round in progress.
    arrived: usize,
    /// Ranks that copied out in the round in progress.
    copied: usize,
    /// A rank that left, if any, and the broadcasts it had completed.
    left: Option<(usize, u64)>,
}

#[derive(Debug)]
struct Group {
    world: usize,
    round: Mutex<Round>,
    moved: Condvar,
    timeout: Duration,
}

/// One rank of a test collective.
#[derive(Debug)]
pub struct TestCollective {
    group: Arc<Group>,
    rank: usize,
    rounds: u64,
}

impl TestCollective {
    /// The `world` ranks of a new group, in rank order; a broadcast waits at
    /// most `timeout` for the others.
    pub fn group(world: usize, timeout: Duration) -> Vec<TestCollective> {
        let group = Arc::new(Group {
            world,
            round: Mutex::new(Round::default()),
            moved: Condvar::new(),
            timeout,
        });
        (0..world)
            .map(|rank| TestCollective {
                group: group.clone(),
                rank,
                rounds: 0,
            })
            .collect()
    }

    /// [`Self::group`] of `N` ranks as an array, to be named rank by rank.
    pub fn ranks<const N: usize>(timeout: Duration) -> [TestCollective; N] {
        match Self::group(N, timeout).try_into() {
            Ok(ranks) => ranks,
            Err(_) => unreachable!("a group of N has N ranks"),
        }
    }

    fn wait<'a>(
        &self,
        mut g: std::sync::MutexGuard<'a, Round>,
        deadline: Instant,
        until: impl Fn(&Round) -> bool,
    ) -> Result<std::sync::MutexGuard<'a, Round>> {
        loop {
            if let Some((r, n)) = g.left {
                if n <= self.rounds {
                    return Err(left(r));
                }
            }
            if until(&g) {
                return Ok(g);
            }
            let left_time = deadline.saturating_duration_since(Instant::now());
            if left_time.is_zero() {
                return Err(Error::InvalidState(format!(
                    "test collective: rank {} waited {:?} for the others",
                    self.rank, self.group.timeout
                )));
            }
            g = self
                .group
                .moved
                .wait_timeout(g, left_time)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

fn left(rank: usize) -> Error {
    Error::InvalidState(format!("test collective: rank {rank} left the group"))
}

impl Collective for TestCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.group.world
    }

    unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        _stream: StreamId,
    ) -> Result<()> {
        // Host backend copies complete when queued, so the root's bytes are in
        // place; the rendezvous orders the ranks.
        let deadline = Instant::now() + self.group.timeout;
        let round = self.rounds;
        let g = self.group.round.lock().unwrap_or_else(|p| p.into_inner());
        // The previous round must be over for every rank.
        let mut g = self.wait(g, deadline, |r| r.done == round)?;
        if self.rank == root {
            g.source = Some((buf, len));
        }
        g.arrived += 1;
        self.group.moved.notify_all();
        let mut g = self.wait(g, deadline, |r| r.source.is_some())?;
        let (src, src_len) = g.source.expect("set");
        if src_len != len {
            return Err(Error::InvalidArgument(format!(
                "test collective: rank {} broadcasts {len} bytes, the root {src_len}",
                self.rank
            )));
        }
        if self.rank != root {
            // SAFETY: the root's buffer stays valid until every rank copied (the
            // root waits below); the caller vouches for `buf`.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, buf as *mut u8, len) };
        }
        g.copied += 1;
        if g.copied == self.group.world {
            *g = Round {
                done: round + 1,
                left: g.left,
                ..Round::default()
            };
        }
        self.group.moved.notify_all();
        drop(self.wait(g, deadline, |r| r.done > round)?);
        self.rounds += 1;
        Ok(())
    }

    fn check(&self) -> Result<()> {
        let g = self.group.round.lock().unwrap_or_else(|p| p.into_inner());
        match g.left {
            Some((r, n)) if n <= self.rounds => Err(left(r)),
            _ => Ok(()),
        }
    }
}

impl Drop for TestCollective {
    fn drop(&mut self) {
        let mut g = self.group.round.lock().unwrap_or_else(|p| p.into_inner());
        // The others fail only when they wait for a broadcast this rank did
        // not complete.
        if g.left.is_none() {
            g.left = Some((self.rank, self.rounds));
        }
        self.group.moved.notify_all();
    }
}
