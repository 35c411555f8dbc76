//! A checkpoint load through the broadcast transport: reader ranks stream
//! the checkpoint's files from disk into the broadcast ring, bucket by
//! bucket, and every rank (readers included) applies each bucket to its own
//! destinations through its rules, as a load would (renames, skips, ties,
//! fused `qkv_proj`/`gate_up_proj`, tensor-parallel slices). No rank holds
//! more of the checkpoint than the ring's slots.
//!
//! It is an update of the destinations a load allocated: every rank opens
//! the checkpoint (headers only; only readers read tensor data), allocates
//! and registers its destinations as for a load ([`Session::allocate`]),
//! then calls [`load`] instead of [`Session::load`]. The update machinery
//! plans it (the load's plan over the checkpoint's tensors), checks it
//! before any byte moves, copies each bucket as it lands and moves the tag's
//! version by one. What a load adds that an update lacks is only where the
//! bytes come from, so the two share one path.
//!
//! Readers: each owns a contiguous run of the checkpoint's files, cut so
//! that readers read about the same bytes (one reader per node, or several
//! splitting the files). A reader is the root of its own buckets; the parts
//! follow one another in reader order through the same ring, so the next
//! part's first bucket lands while the last one of the previous part is
//! applied. A reader fills a slot with the loader's copy engine (the same
//! page-cache or `pread` staging as a load, [`crate::loader::copy`]).
//!
//! Before any bucket moves, the ranks check that their slots have one size,
//! then rank 0 broadcasts the load's header (each reader's files and
//! tensors: names, dtypes, shapes); every rank
//! compares it with its own view of the checkpoint and checks its plan
//! against its destinations, then every rank broadcasts its verdict, so a
//! refusal anywhere fails the load on every rank with every rank's problems
//! listed in one error, and nothing written.
//!
//! Each bucket carries a trailer ([`TRAILER_BYTES`]) after its bytes: the
//! reader's status. A reader that cannot read its files (a short or changed
//! file, an I/O error) broadcasts the bucket with its error in the trailer,
//! so every rank fails with the reader's message. After a failure every
//! rank completes the broadcasts any rank may have queued, so the
//! communicator stays usable. A rank that dies is seen through the
//! collective (its asynchronous error, or each broadcast's timeout).
//!
//! The failure rule: by default destinations are written as buckets land
//! ([`Staging::Streamed`]): a load that fails midway leaves them partly
//! written (each byte its old value or the checkpoint's), the tag marked torn
//! ([`Pool::tag_torn`]), its version unchanged, and the error is
//! [`Error::UpdateTorn`]; a failure before the first bucket landed writes
//! nothing. With [`BroadcastLoad::stage`] the buckets go to scratch first
//! (device memory the size of the destinations) and the destinations are
//! either untouched or whole, as for any update. Reload: a load that
//! succeeded registers the checkpoint as the tag's reload source, as a load
//! does, so a Reload wake reads the files on each rank, and is the session's
//! last result ([`Session::last_result`]: the checkpoint's bytes over the
//! whole call, and this rank's reads by path).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::broadcast::{Collective, Ring};
use super::bucket::{plan_buckets, AnnouncedTensor, BucketManifest};
use super::receive::{receive, BucketSource};
use crate::driver::{DevicePtr, StreamId};
use crate::error::{Error, Result};
use crate::loader::copy::{self, Control, CopyOptions, CopyStats};
use crate::loader::{Checkpoint, ExecutedPlan, Extent, Plan, Session, TensorInfo};
use crate::pool::Pool;
use crate::update::{self, SourceTensor, Staging, UpdateOptions, UpdateResult};

/// Ring slots a load uses unless set: three, so a reader reads bucket k + 2
/// while bucket k + 1 is broadcast and bucket k applied (with two, the read
/// and the broadcast take turns).
pub const LOAD_SLOTS: usize = 3;

/// Bytes after each bucket that carry its reader's status.
pub const TRAILER_BYTES: usize = 1024;

/// Bytes of a rank's verdict on the header.
const VERDICT_BYTES: usize = 1024;

/// Longest header accepted from rank 0.
const MAX_HEADER_BYTES: u64 = 256 << 20;

/// What a broadcast load reads and how it keeps the failure rule.
#[derive(Debug, Clone, Default)]
pub struct BroadcastLoad {
    /// Ranks that read the checkpoint's files, each a contiguous run of
    /// them (in this order); every rank must pass the same list.
    pub readers: Vec<usize>,
    /// Stage the buckets in scratch device memory (the size of the
    /// destinations) so a failed load leaves them untouched; otherwise they
    /// are written as buckets land.
    pub stage: bool,
}

/// What one broadcast load did on this rank.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BroadcastLoadReport {
    /// The destinations' side: the tag, its new version, bytes written.
    pub update: UpdateResult,
    /// Buckets broadcast, by every reader.
    pub buckets: u64,
    /// Bytes of checkpoint data broadcast, by every reader.
    pub bytes: u64,
    /// Files this rank read.
    pub files_read: u64,
    /// Bytes this rank read from them.
    pub bytes_read: u64,
}

/// One reader's share of the load.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Part {
    reader: u64,
    /// File names (within the checkpoint), in checkpoint order.
    files: Vec<String>,
    /// Their tensors, by file and offset.
    tensors: Vec<AnnouncedTensor>,
}

/// What every rank must agree on before a byte moves (besides the slot
/// size, agreed on first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Header {
    parts: Vec<Part>,
}

/// What rank 0 sent as the load's header.
enum FromRank0 {
    Header(Header),
    /// Rank 0 has none; its verdict says why.
    Refused,
    /// This rank could not read what it sent.
    Unreadable(String),
}

/// The local view of the load: the header this rank expects, and where
/// each announced tensor's bytes are in its checkpoint.
struct Local {
    header: Header,
    infos: Vec<TensorInfo>,
    ckpt: Checkpoint,
}

fn file_name(ckpt: &Checkpoint, shard: usize) -> String {
    let p = &ckpt.shards[shard].path;
    p.strip_prefix(&ckpt.root)
        .ok()
        .filter(|r| !r.as_os_str().is_empty())
        .unwrap_or_else(|| p.file_name().map_or(p.as_path(), std::path::Path::new))
        .display()
        .to_string()
}

/// Cut files of `per_shard` bytes into one contiguous run per reader (of
/// `readers`), about the same bytes each: a file goes to the reader whose
/// share of the total its middle byte falls in.
fn assign(per_shard: &[u64], readers: usize) -> Vec<Vec<usize>> {
    let total: u128 = per_shard.iter().map(|&b| b as u128).sum::<u128>().max(1);
    let n = readers as u128;
    let mut parts = vec![Vec::new(); readers];
    let mut before = 0u128;
    for (i, &b) in per_shard.iter().enumerate() {
        let mid = before + b as u128 / 2;
        let r = ((mid * n) / total).min(n - 1) as usize;
        parts[r].push(i);
        before += b as u128;
    }
    parts
}

/// Bytes of tensor data in each of `ckpt`'s files.
fn shard_bytes(ckpt: &Checkpoint) -> Vec<u64> {
    let mut per_shard = vec![0u64; ckpt.shards.len()];
    for t in ckpt.tensors.values() {
        per_shard[t.shard] += t.len;
    }
    per_shard
}

fn check_readers(readers: &[usize], world: usize) -> Result<()> {
    if readers.is_empty() {
        return Err(Error::InvalidArgument(
            "a broadcast load needs at least one reader rank".into(),
        ));
    }
    if readers.len() > world {
        return Err(Error::InvalidArgument(format!(
            "{} reader ranks for a world of {world}",
            readers.len()
        )));
    }
    for (i, &r) in readers.iter().enumerate() {
        if r >= world {
            return Err(Error::InvalidArgument(format!(
                "reader rank {r} of a world of {world}"
            )));
        }
        if readers[..i].contains(&r) {
            return Err(Error::InvalidArgument(format!(
                "reader rank {r} is listed twice"
            )));
        }
    }
    Ok(())
}

impl Local {
    fn new(ckpt: Checkpoint, readers: &[usize]) -> Local {
        let mut parts = Vec::with_capacity(readers.len());
        let mut infos = Vec::new();
        for (&reader, shards) in readers
            .iter()
            .zip(assign(&shard_bytes(&ckpt), readers.len()))
        {
            let mut tensors: Vec<&TensorInfo> = ckpt
                .tensors
                .values()
                .filter(|t| shards.contains(&t.shard) && t.len > 0)
                .collect();
            tensors.sort_by_key(|t| (t.shard, t.offset));
            parts.push(Part {
                reader: reader as u64,
                files: shards.iter().map(|&s| file_name(&ckpt, s)).collect(),
                tensors: tensors
                    .iter()
                    .map(|t| AnnouncedTensor {
                        name: t.name.clone(),
                        dtype: t.dtype.name().to_string(),
                        shape: t.shape.iter().map(|&d| d as u64).collect(),
                        bytes: t.len,
                    })
                    .collect(),
            });
            infos.extend(tensors.into_iter().cloned());
        }
        Local {
            header: Header { parts },
            infos,
            ckpt,
        }
    }
}

/// What differs between rank 0's header and this rank's, at most a few
/// lines of each kind.
fn differences(theirs: &Header, ours: &Header) -> Vec<String> {
    let mut out = Vec::new();
    let readers = |h: &Header| h.parts.iter().map(|p| p.reader).collect::<Vec<_>>();
    if readers(theirs) != readers(ours) {
        out.push(format!(
            "readers {:?} on rank 0, {:?} here",
            readers(theirs),
            readers(ours)
        ));
    } else {
        for (a, b) in theirs.parts.iter().zip(&ours.parts) {
            if a.files != b.files {
                out.push(format!(
                    "reader {} owns files {:?} on rank 0, {:?} here",
                    a.reader, a.files, b.files
                ));
            }
        }
    }
    let index = |h: &Header| -> BTreeMap<String, AnnouncedTensor> {
        h.parts
            .iter()
            .flat_map(|p| p.tensors.iter().map(|t| (t.name.clone(), t.clone())))
            .collect()
    };
    let (a, b) = (index(theirs), index(ours));
    let mut tensors = Vec::new();
    for (name, t) in &a {
        match b.get(name) {
            None => tensors.push(format!("`{}` only on rank 0", name.escape_debug())),
            Some(u) if u != t => tensors.push(format!(
                "`{}`: {} {:?} on rank 0, {} {:?} here",
                name.escape_debug(),
                t.dtype,
                t.shape,
                u.dtype,
                u.shape
            )),
            Some(_) => {}
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        tensors.push(format!("`{}` only here", name.escape_debug()));
    }
    let n = tensors.len();
    out.extend(tensors.into_iter().take(8));
    if n > 8 {
        out.push(format!("{} more tensors differ", n - 8));
    }
    if out.is_empty() && theirs != ours {
        out.push("the tensors' order differs from rank 0's".into());
    }
    out
}

fn encode_message(ok: bool, msg: &str, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    out[0] = if ok { 0 } else { 1 };
    let mut end = msg.len().min(len - 8);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    out[4..8].copy_from_slice(&(end as u32).to_le_bytes());
    out[8..8 + end].copy_from_slice(&msg.as_bytes()[..end]);
    out
}

/// (ok, message) of an encoded status; a malformed one reads as a failure.
fn decode_message(b: &[u8]) -> (bool, String) {
    let n = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes")) as usize;
    let msg = b
        .get(8..8 + n)
        .map(|m| String::from_utf8_lossy(m).into_owned())
        .unwrap_or_else(|| "a malformed status".into());
    (b[0] == 0, msg)
}

/// This rank's side of a broadcast load, as a [`BucketSource`].
struct LoadSource<'a> {
    coll: &'a mut dyn Collective,
    ring: &'a Ring,
    local: Option<Result<Local>>,
    /// Every check the update makes before its first copy, run on the
    /// announced tensors during the agreement.
    check: &'a dyn Fn(&[AnnouncedTensor]) -> Result<()>,
    copy: CopyOptions,
    /// Each bucket and its reader.
    plan: Vec<(usize, BucketManifest)>,
    infos: Vec<TensorInfo>,
    ckpt: Option<Checkpoint>,
    /// The status written after a reader's bucket, one per slot (live until
    /// the slot's broadcast completed).
    trailers: Vec<Vec<u8>>,
    /// Reads a received bucket's trailer.
    side: StreamId,
    queued: usize,
    handed: usize,
    released: usize,
    /// The first bucket that failed (read here or announced by its reader).
    failed_at: Option<usize>,
    /// The collective failed: no more broadcasts.
    broken: bool,
    files_read: std::collections::BTreeSet<usize>,
    bytes_read: u64,
    /// How this rank's reads went (by which path, on how many threads).
    read_paths: CopyStats,
}

impl LoadSource<'_> {
    fn me(&self) -> usize {
        self.coll.rank()
    }

    fn capacity(&self) -> usize {
        self.ring.slot_bytes - TRAILER_BYTES
    }

    fn exchange(&mut self, root: usize, bytes: &mut Vec<u8>, len: u64) -> Result<()> {
        let r = self.ring.broadcast_bytes(self.coll, root, bytes, len);
        self.broken |= r.is_err();
        r
    }

    /// Check that every rank's slots have this rank's size (the header is
    /// broadcast in slot-sized pieces, which must match): each rank
    /// broadcasts its size, so every rank refuses alike.
    fn same_slots(&mut self) -> Result<()> {
        let mut sizes = Vec::with_capacity(self.coll.world());
        for r in 0..self.coll.world() {
            let mut size = (self.ring.slot_bytes as u64).to_le_bytes().to_vec();
            self.exchange(r, &mut size, 8)?;
            sizes.push(u64::from_le_bytes(size.try_into().expect("8 bytes")));
        }
        if sizes.iter().all(|&s| s == sizes[0]) {
            return Ok(());
        }
        let each: Vec<String> = sizes
            .iter()
            .enumerate()
            .map(|(r, s)| format!("rank {r}: {s}"))
            .collect();
        Err(Error::InvalidArgument(format!(
            "broadcast load refused before any byte moved: ring slots of different sizes ({} bytes); every rank must use the same bucket size",
            each.join(", ")
        )))
    }

    /// Rank 0's header, as every rank receives it. An error here is the
    /// collective's (the ranks are out of step).
    fn header_of_rank0(&mut self) -> Result<FromRank0> {
        let encode = |h: &std::result::Result<Header, String>| {
            serde_json::to_vec(h)
                .map_err(|e| Error::InvalidState(format!("broadcast load: the header: {e}")))
        };
        let mut body = Vec::new();
        if self.me() == 0 {
            let mine = match &self.local {
                Some(Ok(l)) => Ok(l.header.clone()),
                Some(Err(e)) => Err(e.to_string()),
                None => Err("no header".to_string()),
            };
            body = encode(&mine)?;
            if body.len() as u64 > MAX_HEADER_BYTES {
                body = encode(&Err(format!(
                    "a header of {} bytes, past the {MAX_HEADER_BYTES} accepted",
                    body.len()
                )))?;
            }
        }
        let mut len = (body.len() as u64).to_le_bytes().to_vec();
        self.exchange(0, &mut len, 8)?;
        let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
        if len == 0 || len > MAX_HEADER_BYTES {
            self.broken = true;
            return Err(Error::InvalidArgument(format!(
                "broadcast load: header of {len} bytes from rank 0 (1 to {MAX_HEADER_BYTES} accepted)"
            )));
        }
        self.exchange(0, &mut body, len)?;
        Ok(
            match serde_json::from_slice::<std::result::Result<Header, String>>(&body) {
                Ok(Ok(h)) => FromRank0::Header(h),
                Ok(Err(_)) => FromRank0::Refused,
                Err(e) => FromRank0::Unreadable(format!("unreadable header from rank 0: {e}")),
            },
        )
    }

    /// This rank's problems with the load: its own checkpoint, rank 0's
    /// header against its own, its plan.
    fn problems(&self, theirs: &FromRank0) -> Vec<String> {
        let local = match &self.local {
            Some(Ok(l)) => l,
            Some(Err(e)) => return vec![e.to_string()],
            None => return vec!["no header".into()],
        };
        let theirs = match theirs {
            FromRank0::Header(h) => h,
            // Rank 0 states its own problem.
            FromRank0::Refused => return Vec::new(),
            FromRank0::Unreadable(e) => return vec![e.clone()],
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
        match (self.check)(&tensors) {
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
        let (root, b) = (&self.plan[k].0, &self.plan[k].1);
        if *root == self.me() {
            return Ok(());
        }
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
                self.side,
            )?;
        }
        driver.stream_synchronize(self.side)?;
        match decode_message(&trailer) {
            (true, _) => Ok(()),
            (false, msg) => Err(Error::UpdateSource(format!(
                "reader rank {root} could not read its part of the checkpoint: {msg}"
            ))),
        }
    }

    /// After a failure: take part in every broadcast another rank may have
    /// queued before it learned of it, so no rank waits for this one. A
    /// failure found at bucket k: every rank queued at most up to bucket
    /// k + slots - 2 (bucket k - 1 is released only after k is handed over).
    /// A failure of this rank alone (its own copies): every bucket.
    fn complete_broadcasts(&mut self) {
        if self.broken || self.plan.is_empty() {
            return;
        }
        let n = self.ring.slots.len();
        let me = self.me();
        let last = match self.failed_at {
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
        }
        let driver = self.ring.driver().clone();
        for k in self.queued..=last {
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
        }
    }
}

impl BucketSource for LoadSource<'_> {
    fn begin(&mut self) -> Result<Vec<AnnouncedTensor>> {
        self.same_slots()?;
        let theirs = self.header_of_rank0()?;
        let mine = self.problems(&theirs);
        let mut refusals: Vec<(usize, String)> = Vec::new();
        for r in 0..self.coll.world() {
            let mut verdict = Vec::new();
            if r == self.me() {
                verdict = encode_message(mine.is_empty(), &mine.join("; "), VERDICT_BYTES);
            }
            self.exchange(r, &mut verdict, VERDICT_BYTES as u64)?;
            if let (false, msg) = decode_message(&verdict) {
                let msg = if r == self.me() { mine.join("; ") } else { msg };
                refusals.push((r, msg));
            }
        }
        if !refusals.is_empty() {
            let lines: Vec<String> = refusals
                .iter()
                .map(|(r, m)| format!("rank {r}: {m}"))
                .collect();
            return Err(Error::InvalidArgument(format!(
                "broadcast load refused before any byte moved:\n  {}",
                lines.join("\n  ")
            )));
        }
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
        let _ = self.ring.driver().stream_destroy(self.side);
    }
}

/// Load the checkpoint `session` opened into its registered destinations in
/// `pool`, its bytes read by `opts.readers` and broadcast to every rank of
/// `coll` through `ring` (see the module docs). Every rank calls it with the
/// same readers and ring size; a ring of [`LOAD_SLOTS`] slots keeps the
/// reads, the broadcasts and the copies going at once. Returns what this
/// rank wrote and read.
pub fn load(
    coll: &mut dyn Collective,
    ring: &Ring,
    session: &Session,
    pool: &Pool,
    opts: &BroadcastLoad,
) -> Result<BroadcastLoadReport> {
    let called = std::time::Instant::now();
    if ring.slot_bytes <= TRAILER_BYTES {
        return Err(Error::InvalidArgument(format!(
            "broadcast load: slots of {} bytes; each bucket needs more than {TRAILER_BYTES} bytes (its reader's status)",
            ring.slot_bytes
        )));
    }
    let world = coll.world();
    let update_opts = UpdateOptions {
        expected_version: 0,
        tag: None,
        plan: session.options().plan,
        staging: if opts.stage {
            Staging::Always
        } else {
            Staging::Streamed
        },
    };
    let version =
        update::destinations_tag(session, pool).and_then(|t| Ok((t, pool.tag_version(t)?)));
    let local = check_readers(&opts.readers, world)
        .and_then(|()| Checkpoint::open(session.path()))
        .map(|ckpt| Local::new(ckpt, &opts.readers));
    let update_opts = match version {
        Ok((t, v)) => UpdateOptions {
            expected_version: v,
            tag: Some(t),
            ..update_opts
        },
        Err(_) => update_opts,
    };
    let local = version.and(local);
    let check = |tensors: &[AnnouncedTensor]| {
        let manifest = tensors
            .iter()
            .map(|t| {
                Ok(SourceTensor {
                    name: t.name.clone(),
                    dtype: crate::loader::Dtype::parse(&t.dtype).ok_or_else(|| {
                        Error::InvalidArgument(format!("unknown dtype `{}`", t.dtype))
                    })?,
                    shape: t.shape.iter().map(|&d| d as usize).collect(),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        update::check(session, pool, &manifest, &update_opts)
    };
    let side = ring.driver().stream_create()?;
    let mut source = LoadSource {
        coll,
        ring,
        local: Some(local),
        check: &check,
        copy: session.options().copy,
        plan: Vec::new(),
        infos: Vec::new(),
        ckpt: None,
        trailers: vec![Vec::new(); ring.slots.len()],
        side,
        queued: 0,
        handed: 0,
        released: 0,
        failed_at: None,
        broken: false,
        files_read: Default::default(),
        bytes_read: 0,
        read_paths: CopyStats::default(),
    };
    let done = receive(&mut source, session, pool, &update_opts)?;
    // Reload restores from the checkpoint, as after a load: every rank has
    // it open.
    let ckpt = source
        .ckpt
        .take()
        .expect("a load that ran has its checkpoint");
    let plan = Plan::build(
        &ckpt,
        &session.rules(),
        &session.shared_registry(),
        &update_opts.plan,
    )?;
    let bytes: u64 = source.plan.iter().map(|(_, b)| b.bytes).sum();
    let stats = CopyStats {
        bytes,
        seconds: called.elapsed().as_secs_f64(),
        ..source.read_paths
    };
    let executed = ExecutedPlan::new(Arc::new(ckpt), plan, source.copy, stats)
        .with_driver(pool.driver().clone());
    let executed = if session.options().reload_check {
        executed.with_checksums()?
    } else {
        executed
    };
    let executed = Arc::new(executed);
    pool.add_reload_source(done.tag, executed.clone())?;
    session.record_load(executed);
    Ok(BroadcastLoadReport {
        update: done,
        buckets: source.plan.len() as u64,
        bytes,
        files_read: source.files_read.len() as u64,
        bytes_read: source.bytes_read,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_round_trips_and_a_long_message_is_cut_at_a_character() {
        let (ok, msg) = decode_message(&encode_message(true, "", 64));
        assert!(ok && msg.is_empty());
        let long = "é".repeat(100);
        let b = encode_message(false, &long, 64);
        let (ok, msg) = decode_message(&b);
        assert!(!ok);
        assert_eq!(msg, "é".repeat(28), "56 bytes of 2-byte characters");
        // A length past the buffer reads as a failure, never a panic.
        let mut bad = encode_message(true, "x", 64);
        bad[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_message(&bad).1, "a malformed status");
    }

    fn announced(name: &str, shape: &[u64]) -> AnnouncedTensor {
        AnnouncedTensor {
            name: name.into(),
            dtype: "BF16".into(),
            shape: shape.to_vec(),
            bytes: shape.iter().product::<u64>() * 2,
        }
    }

    #[test]
    fn differences_name_each_kind_of_disagreement() {
        let part = |reader, files: &[&str], tensors| Part {
            reader,
            files: files.iter().map(|f| f.to_string()).collect(),
            tensors,
        };
        let ours = Header {
            parts: vec![
                part(
                    0,
                    &["a"],
                    vec![announced("x", &[2, 2]), announced("y", &[4])],
                ),
                part(1, &["b"], vec![announced("z", &[8])]),
            ],
        };
        assert!(differences(&ours, &ours).is_empty());
        let mut theirs = ours.clone();
        theirs.parts[0].tensors[1] = announced("y", &[2, 2]);
        theirs.parts[1].tensors.push(announced("w", &[1]));
        theirs.parts[1].files = vec!["c".into()];
        let d = differences(&theirs, &ours).join("\n");
        assert!(
            d.contains("`y`: BF16 [2, 2] on rank 0, BF16 [4] here"),
            "{d}"
        );
        assert!(d.contains("`w` only on rank 0"), "{d}");
        assert!(
            d.contains(r#"reader 1 owns files ["c"] on rank 0, ["b"] here"#),
            "{d}"
        );
        let mut reordered = ours.clone();
        reordered.parts[0].tensors.swap(0, 1);
        assert_eq!(
            differences(&reordered, &ours),
            vec!["the tensors' order differs from rank 0's".to_string()]
        );
        let mut readers = ours.clone();
        readers.parts[1].reader = 2;
        assert!(differences(&readers, &ours)[0].contains("readers [0, 2] on rank 0, [0, 1] here"));
    }

    proptest::proptest! {
        #[test]
        fn readers_own_contiguous_runs_of_every_file_about_evenly(
            sizes in proptest::collection::vec(0u64..1000, 1..12),
            n in 1usize..6,
        ) {
            let parts = assign(&sizes, n);
            proptest::prop_assert_eq!(parts.len(), n);
            // In order, each file once: contiguous runs.
            let flat: Vec<usize> = parts.iter().flatten().copied().collect();
            proptest::prop_assert_eq!(flat, (0..sizes.len()).collect::<Vec<_>>());
            // No reader reads more than its share and one file.
            let total: u64 = sizes.iter().sum();
            let largest = sizes.iter().copied().max().unwrap_or(0);
            for p in &parts {
                let mine: u64 = p.iter().map(|&i| sizes[i]).sum();
                proptest::prop_assert!(mine <= total / n as u64 + largest);
            }
        }
    }
}
