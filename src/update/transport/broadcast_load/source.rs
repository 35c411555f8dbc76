//! One rank's side of a broadcast load, as a [`BucketSource`]: the
//! agreement before any byte moves, each bucket read (on its reader) and
//! broadcast through the ring, its reader's status checked on arrival, and
//! the broadcasts completed after a failure so no rank waits for another.

use super::super::agreement::{self, decode_message, encode_message, Exchange, FromRoot};
use super::super::broadcast::{Collective, Ring};
use super::super::bucket::{check_announced, plan_buckets, AnnouncedTensor, BucketManifest};
use super::super::receive::BucketSource;
use super::header::{differences, Header, Local, TRAILER_BYTES};
use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::loader::copy::{self, Control, CopyOptions, CopyStats};
use crate::loader::{Checkpoint, Extent, TensorInfo};

/// Longest header accepted from rank 0.
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// This rank's side of a broadcast load, as a [`BucketSource`].
pub(super) struct LoadSource<'a> {
    pub(super) coll: &'a mut dyn Collective,
    pub(super) ring: &'a Ring,
    pub(super) local: Option<Result<Local>>,
    /// Every check the update makes before its first copy, run on the
    /// announced tensors during the agreement.
    pub(super) check: &'a dyn Fn(&[AnnouncedTensor]) -> Result<()>,
    pub(super) copy: CopyOptions,
    /// Each bucket and its reader.
    pub(super) plan: Vec<(usize, BucketManifest)>,
    pub(super) infos: Vec<TensorInfo>,
    pub(super) ckpt: Option<Checkpoint>,
    /// The status written after a reader's bucket, one per slot (live until
    /// the slot's broadcast completed).
    pub(super) trailers: Vec<Vec<u8>>,
    /// Reads a received bucket's trailer.
    /// None when it could not be made (this rank then refuses the load
    /// in the agreement, before any trailer is read).
    pub(super) side: Option<StreamId>,
    pub(super) queued: usize,
    pub(super) handed: usize,
    pub(super) released: usize,
    /// The first bucket that failed (read here or announced by its reader).
    pub(super) failed_at: Option<usize>,
    /// The collective failed: no more broadcasts.
    pub(super) broken: bool,
    pub(super) files_read: std::collections::BTreeSet<usize>,
    pub(super) bytes_read: u64,
    /// How this rank's reads went (by which path, on how many threads).
    pub(super) read_paths: CopyStats,
}

impl LoadSource<'_> {
    fn me(&self) -> usize {
        self.coll.rank()
    }

    fn capacity(&self) -> usize {
        self.ring.slot_bytes - TRAILER_BYTES
    }

    /// Run one step of the agreement with its broadcasts; an error from it
    /// (the collective's, not a refusal) leaves the ranks out of step: no
    /// more broadcasts.
    fn step<T>(&mut self, f: impl FnOnce(Exchange<'_>) -> Result<T>) -> Result<T> {
        let (ring, coll) = (self.ring, &mut *self.coll);
        let r = f(&mut |root, bytes, len| ring.broadcast_bytes(coll, root, bytes, len));
        self.broken |= r.is_err();
        r
    }

    /// The agreement before any byte moves (see [`agreement`]): every
    /// rank's ring (the same slot size, since the header is broadcast in
    /// slot-sized pieces, and the same count, since after a failure the
    /// buckets a rank passes along depend on it), rank 0's header, then
    /// every rank's verdict on it.
    fn agree(&mut self) -> Result<()> {
        let (world, me) = (self.coll.world(), self.me());
        let shape = (self.ring.slot_bytes as u64, self.ring.slots.len() as u64);
        let shapes = self.step(|x| agreement::shapes(world, shape, x))?;
        agreement::same_shapes(&shapes, true, "broadcast load")?;
        let mine = (me == 0).then(|| match &self.local {
            Some(Ok(l)) => Ok(l.header.clone()),
            Some(Err(e)) => Err(e.to_string()),
            None => Err("no header".to_string()),
        });
        let theirs = self.step(|x| agreement::from_root(0, mine, MAX_HEADER_BYTES, x))?;
        let problems = self.problems(&theirs);
        let refusals = self.step(|x| agreement::verdicts(world, me, &problems, x))?;
        if !refusals.is_empty() {
            return Err(Error::InvalidArgument(agreement::refusals(
                "broadcast load refused before any byte moved",
                &refusals,
            )));
        }
        Ok(())
    }

    /// This rank's problems with the load: its own checkpoint, rank 0's
    /// header against its own, its plan.
    fn problems(&self, theirs: &FromRoot<Header>) -> Vec<String> {
        let local = match &self.local {
            Some(Ok(l)) => l,
            Some(Err(e)) => return vec![e.to_string()],
            None => return vec!["no header".into()],
        };
        let theirs = match theirs {
            FromRoot::Value(h) => h,
            // Rank 0 states its own problem, the others none: rank 0 may
            // have sent no header with its own checkpoint read (a header
            // past the bound), and must refuse then too.
            FromRoot::Refused(why) if self.me() == 0 => return vec![why.clone()],
            FromRoot::Refused(_) => return Vec::new(),
            FromRoot::Unreadable(e) => return vec![e.clone()],
        };
        let diff = differences(theirs, &local.header);
        if !diff.is_empty() {
            return diff;
        }
        let tensors: Vec<AnnouncedTensor> = local
            .header
            .parts
            .iter()
            .flat_map(|p| p.tensors.iter().cloned())
            .collect();
        // What the transport refuses after the agreement (names past its
        // bound) is refused here, on every rank, before any byte moves.
        match check_announced(&tensors).and_then(|()| (self.check)(&tensors)) {
            Ok(()) => Vec::new(),
            Err(e) => vec![e.to_string()],
        }
    }

    /// Queue every bucket whose slot is free (bucket k takes the slot of
    /// bucket k - slots, which must have been released).
    fn queue_ready(&mut self) -> Result<()> {
        let n = self.ring.slots.len();
        while self.failed_at.is_none()
            && self.queued < self.plan.len()
            && self.queued < self.released + n
        {
            self.queue(self.queued)?;
        }
        Ok(())
    }

    /// Fill bucket `k`'s slot from this reader's files.
    fn read(&mut self, k: usize, slot: DevicePtr) -> Result<()> {
        let ckpt = self.ckpt.as_ref().expect("a reader has its checkpoint");
        let b = &self.plan[k].1;
        let mut shards: Vec<usize> = Vec::new();
        let extents: Vec<Extent> = b
            .entries
            .iter()
            .map(|e| {
                let t = &self.infos[e.tensor as usize];
                if !shards.contains(&t.shard) {
                    shards.push(t.shard);
                }
                Extent {
                    shard: t.shard as u32,
                    src: t.offset + e.offset,
                    src_pitch: e.len,
                    width: e.len,
                    height: 1,
                    dst: slot + e.at,
                    dst_pitch: e.len,
                    convert: None,
                    source: e.tensor,
                }
            })
            .collect();
        // A file changed since it was opened is refused before it is read
        // (a truncated mapping would fault), and again after.
        let unchanged = |ckpt: &Checkpoint| {
            shards
                .iter()
                .try_for_each(|&s| ckpt.shards[s].check_unchanged())
        };
        unchanged(ckpt)?;
        let stats = copy::execute(
            self.ring.driver(),
            &ckpt.shards,
            &extents,
            &[],
            &self.copy,
            &Control::default(),
        )?;
        unchanged(ckpt)?;
        self.read_paths.direct_bytes += stats.direct_bytes;
        self.read_paths.staged_bytes += stats.staged_bytes;
        self.read_paths.read_bytes += stats.read_bytes;
        self.read_paths.threads = stats.threads;
        self.bytes_read += b.bytes;
        self.files_read.extend(shards);
        Ok(())
    }

    /// Queue bucket `k`: on its reader, its bytes and status into its slot
    /// first; then the broadcast of both.
    fn queue(&mut self, k: usize) -> Result<()> {
        let n = self.ring.slots.len();
        let slot = self.ring.slots[k % n];
        let (root, bytes) = (self.plan[k].0, self.plan[k].1.bytes as usize);
        let driver = self.ring.driver().clone();
        let mut read = Ok(());
        if root == self.me() {
            read = self.read(k, slot);
            self.trailers[k % n] = match &read {
                Ok(()) => encode_message(true, "", TRAILER_BYTES),
                Err(e) => encode_message(false, &e.to_string(), TRAILER_BYTES),
            };
            // SAFETY: the trailer lies inside the slot (buckets leave
            // TRAILER_BYTES free); its host bytes live in `trailers` until
            // the slot is queued again, after this broadcast completed.
            unsafe {
                driver.copy_htod_async(
                    slot + bytes as u64,
                    self.trailers[k % n].as_ptr(),
                    TRAILER_BYTES,
                    self.ring.stream,
                )?;
            }
        }
        // SAFETY: the slot is this ring's memory of `slot_bytes` >= bytes +
        // TRAILER_BYTES.
        let sent = unsafe {
            self.coll
                .broadcast(slot, bytes + TRAILER_BYTES, root, self.ring.stream)
                .and_then(|()| driver.event_record(self.ring.events[k % n], self.ring.stream))
        };
        self.broken |= sent.is_err();
        sent?;
        self.queued = k + 1;
        if let Err(e) = read {
            self.failed_at = Some(k);
            return Err(Error::UpdateSource(format!(
                "reader rank {root} could not read its part of the checkpoint: {e}"
            )));
        }
        Ok(())
    }

    /// The status its reader wrote after bucket `k` (landed).
    fn status(&self, k: usize) -> Result<()> {
        match self.reader_failure(k)? {
            None => Ok(()),
            Some(msg) => Err(Error::UpdateSource(format!(
                "reader rank {} could not read its part of the checkpoint: {msg}",
                self.plan[k].0
            ))),
        }
    }

    /// What the reader of bucket `k` (landed) reported in its trailer: its
    /// failure, or `None` when it read the bucket (or is this rank).
    fn reader_failure(&self, k: usize) -> Result<Option<String>> {
        let b = &self.plan[k].1;
        if self.plan[k].0 == self.me() {
            return Ok(None);
        }
        let side = self.side.ok_or_else(|| {
            Error::InvalidState("broadcast load: no stream to read a trailer on".into())
        })?;
        let n = self.ring.slots.len();
        let mut trailer = vec![0u8; TRAILER_BYTES];
        let driver = self.ring.driver();
        // SAFETY: the trailer lies inside the slot, whose broadcast
        // completed; the host buffer lives until the side stream is
        // synchronized below.
        unsafe {
            driver.copy_dtoh_async(
                trailer.as_mut_ptr(),
                self.ring.slots[k % n] + b.bytes,
                TRAILER_BYTES,
                side,
            )?;
        }
        driver.stream_synchronize(side)?;
        Ok(match decode_message(&trailer) {
            (true, _) => None,
            (false, msg) => Some(msg),
        })
    }

    /// After a failure: take part in every broadcast another rank may have
    /// queued before it learned of it, so no rank waits for this one. A
    /// failure found at bucket k: every rank queued at most up to bucket
    /// k + slots - 2 (bucket k - 1 is released only after k is handed over).
    /// A failure of this rank alone (its own copies): every bucket, unless a
    /// reader reports a failure in a bucket passed along here (at bucket k
    /// the others stop at k + slots - 2, as above, and so does this rank).
    fn complete_broadcasts(&mut self) {
        if self.broken || self.plan.is_empty() {
            return;
        }
        let n = self.ring.slots.len();
        let me = self.me();
        let mut last = match self.failed_at {
            Some(k) => k + n - 2,
            // This rank's failure reaches the others at its first bucket as
            // a reader, if any is left: they stop there, as above.
            None => (self.queued..self.plan.len())
                .find(|&k| self.plan[k].0 == me)
                .map_or(usize::MAX, |k| k + n - 2),
        }
        .min(self.plan.len() - 1);
        // Whatever is queued from now on is only passed along.
        self.failed_at.get_or_insert(self.queued);
        // The slots are free once what was queued landed (each wait bounded
        // by the ring's timeout, the collective's errors polled).
        for j in self.handed..self.queued {
            let n_slot = j % n;
            let landed =
                self.ring
                    .wait(self.ring.events[n_slot], self.coll, &format!("bucket {j}"));
            if landed.is_err() {
                self.broken = true;
                return;
            }
            last = last.min(self.stop_after(j));
        }
        let driver = self.ring.driver().clone();
        while self.queued <= last {
            let k = self.queued;
            let (root, bytes) = (self.plan[k].0, self.plan[k].1.bytes as usize);
            let slot = self.ring.slots[k % n];
            if root == self.me() {
                self.trailers[k % n] = encode_message(
                    false,
                    &format!("reader rank {root} stopped at an earlier failure"),
                    TRAILER_BYTES,
                );
            }
            // SAFETY: as in `queue`; the update returned, so no slot is held.
            let sent = unsafe {
                (if root == self.me() {
                    driver.copy_htod_async(
                        slot + bytes as u64,
                        self.trailers[k % n].as_ptr(),
                        TRAILER_BYTES,
                        self.ring.stream,
                    )
                } else {
                    Ok(())
                })
                .and_then(|()| {
                    self.coll
                        .broadcast(slot, bytes + TRAILER_BYTES, root, self.ring.stream)
                })
                .and_then(|()| driver.event_record(self.ring.events[k % n], self.ring.stream))
                .and_then(|()| {
                    self.ring
                        .wait(self.ring.events[k % n], self.coll, &format!("bucket {k}"))
                })
            };
            if sent.is_err() {
                self.broken = true;
                return;
            }
            self.queued = k + 1;
            last = last.min(self.stop_after(k));
        }
    }

    /// The last bucket to pass along once bucket `k` landed: where every
    /// rank stops when its reader reported a failure (a trailer that cannot
    /// be read changes nothing), else any.
    fn stop_after(&self, k: usize) -> usize {
        match self.reader_failure(k) {
            Ok(Some(_)) => (k + self.ring.slots.len()).saturating_sub(2),
            _ => usize::MAX,
        }
    }
}

impl BucketSource for LoadSource<'_> {
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>> {
        self.agree()?;
        let Some(Ok(local)) = self.local.take() else {
            return Err(Error::InvalidState(
                "broadcast load: its header was taken (the load began twice)".into(),
            ));
        };
        let mut announced = Vec::new();
        for p in &local.header.parts {
            let base = announced.len() as u32;
            let sizes: Vec<u64> = p.tensors.iter().map(|t| t.bytes).collect();
            for mut b in plan_buckets(&sizes, self.capacity() as u64)? {
                b.seq = self.plan.len() as u64;
                for e in &mut b.entries {
                    e.tensor += base;
                }
                self.plan.push((p.reader as usize, b));
            }
            announced.extend(p.tensors.iter().cloned());
        }
        self.infos = local.infos;
        self.ckpt = Some(local.ckpt);
        Ok(announced)
    }

    fn slot_bytes(&self) -> u64 {
        self.capacity() as u64
    }

    fn next(&mut self) -> Result<Option<(BucketManifest, DevicePtr)>> {
        let k = self.handed;
        if k == self.plan.len() {
            return Ok(None);
        }
        let n = self.ring.slots.len();
        self.queue_ready()?;
        let waited = self
            .ring
            .wait(self.ring.events[k % n], self.coll, &format!("bucket {k}"));
        self.broken |= waited.is_err();
        waited?;
        if let Err(e) = self.status(k) {
            self.failed_at = Some(k);
            return Err(e);
        }
        self.handed = k + 1;
        Ok(Some((self.plan[k].1.clone(), self.ring.slots[k % n])))
    }

    fn release(&mut self, seq: u64) -> Result<()> {
        self.released = self.released.max(seq as usize + 1);
        self.queue_ready()
    }

    fn finish(&mut self, outcome: std::result::Result<u64, String>) {
        if outcome.is_err() {
            self.complete_broadcasts();
        }
    }
}

impl Drop for LoadSource<'_> {
    fn drop(&mut self) {
        if let Some(side) = self.side {
            let _ = self.ring.driver().stream_destroy(side);
        }
    }
}
