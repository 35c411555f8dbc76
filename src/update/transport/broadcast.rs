//! The broadcast transport: one root rank sends an update to every rank of a
//! collective, through a ring of device buffers on each rank's device.
//!
//! The ranks agree first (`agreement`): every rank's slot size,
//! the root's header (the announced tensors, as length then JSON), then
//! every rank's verdict on it ([`BucketSource::agree`]), so a refusal on any
//! rank fails every rank before any bucket. Then every bucket travels in
//! place in the ring, and after the last every rank votes on whether it
//! holds the whole update (a rank that failed meanwhile still takes part in
//! every broadcast), so a staged update is applied on every rank or on
//! none. Every
//! rank cuts the same plan from the header ([`plan_buckets`]), so no
//! per-bucket manifest travels and a rank's plan is its own. Bucket k+1's
//! broadcast is queued before bucket k is handed to the sink, so it lands
//! while k is applied; with two slots, a slot is broadcast into again only
//! after the bucket that was there was applied and released.
//!
//! The root may be an engine rank (it applies the update too, as in a
//! checkpoint load read on one rank and broadcast) or only a sender (a
//! trainer: [`send`] applies nothing). The collective is a trait: NCCL on the
//! GPU (`super::nccl`), and a thread-backed test collective in CI
//! (`super::test_collective`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::agreement::{self, Exchange, FromRoot};
use super::bucket::{plan_buckets, AnnouncedTensor, BucketManifest};
use super::receive::{drain, BucketSource};
use super::send::{SendData, SendTensor};
use super::{DEFAULT_BUCKET_BYTES, DEFAULT_SLOTS};
use crate::driver::{DevicePtr, Driver, EventId, StreamId};
use crate::error::{Error, Result};
use crate::pool::Pool;
use crate::tag;

/// A group of ranks that can broadcast device memory in place.
pub trait Collective: Send {
    /// This rank.
    fn rank(&self) -> usize;
    /// Ranks in the group.
    fn world(&self) -> usize;
    /// Queue an in-place broadcast of `len` bytes at `buf` from `root` on `stream`.
    ///
    /// # Safety
    /// `buf..buf+len` must be mapped read-write device memory of this rank's
    /// device until `stream` passes this point.
    unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        stream: StreamId,
    ) -> Result<()>;
    /// A failure the collective reported asynchronously (a rank died).
    fn check(&self) -> Result<()>;
}

/// How a broadcast ring is shaped.
#[derive(Debug, Clone)]
pub struct BroadcastOptions {
    /// Slots per rank (at least 2: one applied, one landing).
    pub slots: usize,
    /// Bytes per slot; every rank must use the same.
    pub slot_bytes: usize,
    /// Longest wait for one broadcast to complete.
    pub timeout: Duration,
}

impl Default for BroadcastOptions {
    fn default() -> Self {
        BroadcastOptions {
            slots: DEFAULT_SLOTS,
            slot_bytes: DEFAULT_BUCKET_BYTES,
            timeout: Duration::from_secs(300),
        }
    }
}

/// Longest header accepted from the root.
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// Smallest slot a ring accepts: the ranks' agreement first sends each
/// rank's slot size and count (16 bytes), which must be one broadcast on
/// every rank whatever its slot size; every later piece is cut alike once
/// the sizes agree.
pub const MIN_SLOT_BYTES: usize = 16;

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    tensors: Vec<AnnouncedTensor>,
}

/// One rank's ring: slots in its pool, a stream for the broadcasts, an event per slot.
#[derive(Debug)]
pub struct Ring {
    pool: Arc<Pool>,
    pub(super) slots: Vec<DevicePtr>,
    pub(super) slot_bytes: usize,
    pub(super) stream: StreamId,
    pub(super) events: Vec<EventId>,
    timeout: Duration,
}

impl Ring {
    /// Allocate `options.slots` slots in `pool` under a tag of their own.
    pub fn new(pool: Arc<Pool>, options: &BroadcastOptions) -> Result<Ring> {
        if options.slots < 2 || options.slots > 64 || options.slot_bytes < MIN_SLOT_BYTES {
            return Err(Error::InvalidArgument(format!(
                "broadcast ring of {} slots of {} bytes (2 to 64 slots of at least {MIN_SLOT_BYTES} bytes accepted)",
                options.slots, options.slot_bytes
            )));
        }
        static RINGS: AtomicU64 = AtomicU64::new(0);
        let t = tag::id(&format!(
            "vmmw.update.broadcast.{}.{}",
            std::process::id(),
            RINGS.fetch_add(1, Ordering::Relaxed)
        ))?;
        let mut ring = Ring {
            stream: pool.driver().stream_create()?,
            pool,
            slots: Vec::new(),
            slot_bytes: options.slot_bytes,
            events: Vec::new(),
            timeout: options.timeout,
        };
        for _ in 0..options.slots {
            ring.slots
                .push(ring.pool.alloc_tagged(options.slot_bytes, t)?.ptr);
            ring.events.push(ring.pool.driver().event_create()?);
        }
        Ok(ring)
    }

    pub(super) fn driver(&self) -> &Arc<dyn Driver> {
        self.pool.driver()
    }

    /// Wait for `event`, polling the collective so a dead rank is reported.
    pub(super) fn wait(&self, event: EventId, coll: &dyn Collective, what: &str) -> Result<()> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if self.driver().event_query(event)? {
                return Ok(());
            }
            coll.check()?;
            if Instant::now() >= deadline {
                return Err(Error::InvalidState(format!(
                    "broadcast: {what} did not complete within {:?} (a rank is stuck or gone)",
                    self.timeout
                )));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Broadcast `bytes` (meaningful on the root) through slot 0 and return
    /// them on every rank.
    pub(super) fn broadcast_bytes(
        &self,
        coll: &mut dyn Collective,
        root: usize,
        bytes: &mut Vec<u8>,
        len: u64,
    ) -> Result<()> {
        bytes.resize(len as usize, 0);
        let driver = self.driver().clone();
        for chunk in (0..bytes.len()).step_by(self.slot_bytes) {
            let n = (bytes.len() - chunk).min(self.slot_bytes);
            let piece = &mut bytes[chunk..chunk + n];
            // SAFETY: slot 0 is `slot_bytes` >= n of this ring's memory; the piece
            // lives until the stream is synchronized below.
            unsafe {
                if coll.rank() == root {
                    driver.copy_htod_async(self.slots[0], piece.as_ptr(), n, self.stream)?;
                }
                coll.broadcast(self.slots[0], n, root, self.stream)?;
                driver.event_record(self.events[0], self.stream)?;
            }
            self.wait(self.events[0], coll, "the header's broadcast")?;
            // SAFETY: as above; the broadcast completed.
            unsafe {
                driver.copy_dtoh_async(piece.as_mut_ptr(), self.slots[0], n, self.stream)?;
            }
            driver.stream_synchronize(self.stream)?;
        }
        Ok(())
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        let driver = self.pool.driver().clone();
        let _ = driver.stream_synchronize(self.stream);
        for &e in &self.events {
            let _ = driver.event_destroy(e);
        }
        let _ = driver.stream_destroy(self.stream);
        for &s in &self.slots {
            let _ = self.pool.free(s);
        }
    }
}

/// One rank's side of a broadcast update, as a [`BucketSource`].
pub struct BroadcastSource<'a> {
    coll: &'a mut dyn Collective,
    ring: &'a Ring,
    root: usize,
    /// The root's bytes (empty on other ranks).
    tensors: &'a [SendTensor<'a>],
    plan: Vec<BucketManifest>,
    /// Buckets queued for broadcast so far.
    queued: usize,
    /// Buckets handed to the sink so far.
    handed: usize,
    /// Buckets the sink released so far: their copies out of the slot have
    /// completed, so the slot may take another bucket.
    released: usize,
    /// This rank's own problem with the header (the root's with its own
    /// tensors), told in its verdict and returned with its kind kept.
    refused_here: Option<Error>,
    /// The root sent no header (it refused its tensors, or this rank could
    /// not read it): there is nothing to judge.
    no_header: bool,
    /// The header's broadcast completed: the ranks are in step, and the
    /// verdicts can be exchanged.
    in_step: bool,
    /// Every rank accepted the update: the buckets flow.
    agreed: bool,
    /// The vote after the last bucket was taken.
    voted: bool,
    /// A broadcast or a wait failed: the ranks are out of step, so no more
    /// broadcasts.
    broken: bool,
}

impl<'a> BroadcastSource<'a> {
    /// The root's source: it broadcasts `tensors`.
    pub fn root(
        coll: &'a mut dyn Collective,
        ring: &'a Ring,
        tensors: &'a [SendTensor<'a>],
    ) -> Self {
        let root = coll.rank();
        Self::new(coll, ring, root, tensors)
    }

    /// A receiving rank's source: it takes what `root` broadcasts.
    pub fn rank(coll: &'a mut dyn Collective, ring: &'a Ring, root: usize) -> Self {
        Self::new(coll, ring, root, &[])
    }

    fn new(
        coll: &'a mut dyn Collective,
        ring: &'a Ring,
        root: usize,
        tensors: &'a [SendTensor<'a>],
    ) -> Self {
        BroadcastSource {
            coll,
            ring,
            root,
            tensors,
            plan: Vec::new(),
            queued: 0,
            handed: 0,
            released: 0,
            refused_here: None,
            no_header: false,
            in_step: false,
            agreed: false,
            voted: false,
            broken: false,
        }
    }

    /// The root's header: its tensors, checked.
    fn header(&self) -> Result<Header> {
        let (tensors, _) = super::send::announce(self.tensors)?;
        Ok(Header { tensors })
    }

    /// Run one step of the agreement with its broadcasts (slot 0).
    fn step<T>(&mut self, f: impl FnOnce(Exchange<'_>) -> Result<T>) -> Result<T> {
        let (ring, coll) = (self.ring, &mut *self.coll);
        let r = f(&mut |root, bytes, len| ring.broadcast_bytes(coll, root, bytes, len));
        self.broken |= r.is_err();
        r
    }

    /// The vote after the last bucket: every rank says whether it holds
    /// the whole update (`mine`: why not). A staged update moves nothing
    /// into place before it, so a rank that failed after the agreement (no
    /// scratch for a staged update, a copy error) makes every rank keep its
    /// last version, at once, instead of leaving them waiting for it.
    fn vote(&mut self, mine: &[String]) -> Result<()> {
        self.voted = true;
        let (world, me, root) = (self.coll.world(), self.coll.rank(), self.root);
        let failed = self.step(|x| agreement::verdicts(world, me, mine, x))?;
        if failed.is_empty() {
            return Ok(());
        }
        Err(Error::UpdateSource(agreement::refusals(
            &format!(
                "broadcast from rank {root}: a rank could not apply the update, so no rank applies it (each keeps its last version)"
            ),
            &failed,
        )))
    }

    /// After this rank's update failed midway: take part in every bucket's
    /// broadcast the others still make (applying none), then in the vote,
    /// saying why, so no rank waits for this one.
    fn complete(&mut self, why: &str) {
        if !self.agreed || self.voted || self.broken {
            return;
        }
        let n = self.ring.slots.len();
        // The update returned: it holds no slot any more.
        while self.queued < self.plan.len() && !self.broken {
            let k = self.queued;
            if k >= n {
                let done = self.ring.wait(
                    self.ring.events[k % n],
                    self.coll,
                    &format!("bucket {}", k - n),
                );
                self.broken |= done.is_err();
                self.released = self.released.max(k + 1 - n);
            }
            if !self.broken {
                let queued = self.queue(k);
                self.broken |= queued.is_err();
            }
        }
        for k in self.plan.len().saturating_sub(n)..self.plan.len() {
            if !self.broken {
                let done =
                    self.ring
                        .wait(self.ring.events[k % n], self.coll, &format!("bucket {k}"));
                self.broken |= done.is_err();
            }
        }
        if !self.broken {
            let _ = self.vote(&[why.to_string()]);
        }
    }

    fn is_root(&self) -> bool {
        self.coll.rank() == self.root
    }

    /// Queue every bucket whose slot is free: bucket `k` takes the slot of
    /// bucket `k - n`, which must have been released (the sink may still be
    /// copying out of a slot it holds, on its own stream).
    fn queue_ready(&mut self) -> Result<()> {
        let n = self.ring.slots.len();
        while self.queued < self.plan.len() && self.queued < self.released + n {
            self.queue(self.queued)?;
        }
        Ok(())
    }

    /// Queue bucket `k`: on the root, its bytes into its slot first; then the broadcast.
    fn queue(&mut self, k: usize) -> Result<()> {
        let n = self.ring.slots.len();
        if k >= self.released + n {
            return Err(Error::InvalidState(format!(
                "broadcast: bucket {k} would overwrite the slot of bucket {}, which the update still holds",
                k - n
            )));
        }
        let slot = self.ring.slots[k % n];
        let b = &self.plan[k];
        let driver = self.ring.driver().clone();
        if self.is_root() {
            for e in &b.entries {
                let t = &self.tensors[e.tensor as usize];
                // SAFETY: the piece lies inside the slot (the plan cuts at the slot
                // size); the root's bytes outlive the update (borrowed for it).
                unsafe {
                    match t.data {
                        SendData::Host(h) => driver.copy_htod_async(
                            slot + e.at,
                            h[e.offset as usize..].as_ptr(),
                            e.len as usize,
                            self.ring.stream,
                        )?,
                        SendData::Device(p) => driver.copy_peer_async(
                            slot + e.at,
                            p + e.offset,
                            driver.device(),
                            e.len as usize,
                            self.ring.stream,
                        )?,
                    }
                }
            }
        }
        // SAFETY: the slot is this ring's memory of `slot_bytes` >= b.bytes.
        unsafe {
            self.coll
                .broadcast(slot, b.bytes as usize, self.root, self.ring.stream)?;
            driver.event_record(self.ring.events[k % n], self.ring.stream)?;
        }
        self.queued = k + 1;
        Ok(())
    }
}

impl BucketSource for BroadcastSource<'_> {
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>> {
        let (world, root) = (self.coll.world(), self.root);
        if root >= world {
            return Err(Error::InvalidArgument(format!(
                "broadcast: root {root} of a world of {world}"
            )));
        }
        // Every rank's slot size first: the header travels in slot-sized
        // pieces, which must match (see [`agreement`]).
        let shape = (self.ring.slot_bytes as u64, self.ring.slots.len() as u64);
        let shapes = self.step(|x| agreement::shapes(world, shape, x))?;
        agreement::same_shapes(&shapes, false, &format!("broadcast from rank {root}"))?;
        let mine = if self.is_root() {
            Some(self.header().map_err(|e| {
                let why = e.to_string();
                self.refused_here = Some(e);
                why
            }))
        } else {
            None
        };
        let header = self.step(|x| agreement::from_root(root, mine, MAX_HEADER_BYTES, x))?;
        self.in_step = true;
        let tensors = match header {
            FromRoot::Value(h) => h.tensors,
            // The root refuses its own tensors in its verdict; the others
            // have nothing to judge, and say nothing.
            FromRoot::Refused(_) => {
                self.no_header = true;
                Vec::new()
            }
            FromRoot::Unreadable(e) => {
                self.no_header = true;
                self.refused_here = Some(Error::InvalidArgument(e));
                Vec::new()
            }
        };
        let sizes: Vec<u64> = tensors.iter().map(|t| t.bytes).collect();
        match plan_buckets(&sizes, self.ring.slot_bytes as u64) {
            Ok(plan) => self.plan = plan,
            Err(e) => self.refused_here = self.refused_here.take().or(Some(e)),
        }
        // Every rank takes part in the verdicts whatever it found: a
        // problem anywhere fails every rank together.
        Ok(tensors)
    }

    fn agrees(&self) -> bool {
        self.in_step
    }

    fn agree(&mut self, verdict: Result<()>) -> Result<()> {
        if !self.in_step {
            // `begin` failed alike on every rank (a bad root, different
            // slot sizes) or the collective did: nothing to exchange.
            return verdict;
        }
        let (world, me, root) = (self.coll.world(), self.coll.rank(), self.root);
        // A problem with the header supersedes the verdict, which was
        // judged on no tensors.
        let own = self.refused_here.take();
        let mine: Vec<String> = match (&own, &verdict) {
            (Some(e), _) => vec![e.to_string()],
            (None, _) if self.no_header => Vec::new(),
            (None, Err(e)) => vec![e.to_string()],
            (None, Ok(())) => Vec::new(),
        };
        let refusals = self.step(|x| agreement::verdicts(world, me, &mine, x))?;
        self.agreed = own.is_none() && !self.no_header && verdict.is_ok() && refusals.is_empty();
        // This rank's own refusal keeps its kind (a version mismatch, a plan,
        // the root's tensors).
        if let Some(e) = own {
            return Err(e);
        }
        if !self.no_header {
            verdict?;
            if refusals.is_empty() {
                return Ok(());
            }
        }
        Err(Error::UpdateSource(agreement::refusals(
            &format!("broadcast from rank {root} refused before any byte moved"),
            &refusals,
        )))
    }

    fn slot_bytes(&self) -> u64 {
        self.ring.slot_bytes as u64
    }

    fn next(&mut self) -> Result<Option<(BucketManifest, DevicePtr)>> {
        let k = self.handed;
        if k == self.plan.len() {
            if self.agreed && !self.voted {
                self.vote(&[])?;
            }
            return Ok(None);
        }
        let n = self.ring.slots.len();
        // Bucket k's slot is free (the sink holds at most the bucket before
        // it); later buckets are queued as the sink releases their slots.
        let landed = self.queue_ready().and_then(|()| {
            self.ring
                .wait(self.ring.events[k % n], self.coll, &format!("bucket {k}"))
        });
        self.broken |= landed.is_err();
        landed?;
        self.handed = k + 1;
        Ok(Some((self.plan[k].clone(), self.ring.slots[k % n])))
    }

    fn release(&mut self, seq: u64) -> Result<()> {
        // The next bucket for this slot lands while the sink applies the
        // one it holds.
        self.released = self.released.max(seq as usize + 1);
        let queued = self.queue_ready();
        self.broken |= queued.is_err();
        queued
    }

    fn finish(&mut self, outcome: std::result::Result<u64, String>) {
        // A failure before the agreement ended is every rank's already; one
        // after it is told in the vote (see `complete`).
        if let Err(why) = outcome {
            self.complete(&why);
        }
    }
}

/// Broadcast `tensors` from this rank (the root) to every rank of `coll`,
/// applying nothing here. Returns once every bucket was broadcast.
pub fn send(coll: &mut dyn Collective, ring: &Ring, tensors: &[SendTensor<'_>]) -> Result<()> {
    let mut source = BroadcastSource::root(coll, ring, tensors);
    drain(&mut source).map(|_| ())
}
