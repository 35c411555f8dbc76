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
//! Before any bucket moves, the ranks check that their rings have one slot
//! size and one slot count, then rank 0 broadcasts the load's header (each
//! reader's files and tensors: names, dtypes, shapes); every rank compares it with its own view of the checkpoint and checks its plan
//! against its destinations, then every rank broadcasts its verdict, so a
//! refusal anywhere fails the load on every rank with every rank's problems
//! listed in one error, and nothing written. A rank's own problems (its
//! ring, its readers list, its checkpoint) are refused there too, never by
//! returning alone, which would leave the others waiting for it.
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
//! whole call, and this rank's reads by path). Should that registration
//! fail (hashing the checkpoint on the device), the error is returned with
//! the destinations written and the version moved, as a load into a pool
//! does: no older reload source covers them any more, so a Reload sleep of
//! the tag keeps their bytes in the host backup.

mod header;
mod source;

use std::sync::Arc;

use serde::Serialize;

use super::broadcast::{Collective, Ring};
use super::bucket::AnnouncedTensor;
use super::receive::receive;
use crate::error::{Error, Result};
use crate::loader::copy::CopyStats;
use crate::loader::{Checkpoint, ExecutedPlan, Plan, Session};
use crate::pool::Pool;
use crate::update::{self, SourceTensor, Staging, UpdateOptions, UpdateResult};
pub use header::TRAILER_BYTES;
use header::{check_readers, Local};
use source::LoadSource;

/// Ring slots a load uses unless set: three, so a reader reads bucket k + 2
/// while bucket k + 1 is broadcast and bucket k applied (with two, the read
/// and the broadcast take turns).
pub const LOAD_SLOTS: usize = 3;

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
    // Every problem of this rank's own is refused in the agreement, on
    // every rank together: a rank that returned alone would leave the
    // others waiting for it until their timeout.
    let slots = if ring.slot_bytes <= TRAILER_BYTES {
        Err(Error::InvalidArgument(format!(
            "broadcast load: slots of {} bytes; each bucket needs more than {TRAILER_BYTES} bytes (its reader's status)",
            ring.slot_bytes
        )))
    } else {
        Ok(())
    };
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
    let (side, made) = match ring.driver().stream_create() {
        Ok(s) => (Some(s), Ok(())),
        Err(e) => (
            None,
            Err(e.with_context(" (the broadcast load's side stream)")),
        ),
    };
    let local = slots
        .and(made)
        .and_then(|()| check_readers(&opts.readers, world))
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
