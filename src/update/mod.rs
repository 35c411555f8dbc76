//! Updates: new weights into live destinations, by checkpoint name, through
//! the same rules as a load (rename, skip, tie and alias, fused
//! `qkv_proj`/`gate_up_proj`, tensor-parallel slices).
//!
//! ```no_run
//! # use vmmweights::{loader::{Dtype, Session}, update::*, Pool};
//! # fn f(session: &Session, pool: &Pool, ptr: u64) -> vmmweights::Result<()> {
//! let mut src = Tensors::new();
//! // SAFETY: `ptr` holds the tensor's bytes until `update` returns.
//! unsafe { src.add("model.embed_tokens.weight", Dtype::Bf16, &[151936, 4096], Bytes::Device(ptr))? };
//! let done = update(session, pool, &mut src, &UpdateOptions::from_version(1))?;
//! assert_eq!(done.version, 2);
//! # Ok(()) }
//! ```
//!
//! An update reads a [`Source`]: the tensors it brings (its manifest), then
//! their bytes as pieces in batches. Everything is checked before any byte
//! moves, every problem listed in one error: the tag's version against the
//! update's base version ([`Error::VersionMismatch`] when that is the only
//! problem), missing, unknown and mis-shaped tensors as a load checks them
//! (`Error::Plan`), a dtype that would need a conversion.
//!
//! # The failure rule
//! An update leaves every destination either untouched or fully written
//! with the new version, never a mix; the tag's version moves (by one) only
//! when every destination holds the new bytes. Two ways, chosen by the source
//! (a third, streamed, gives the rule up for destinations that serve nothing
//! yet):
//!
//! - **Staged** (a source whose bytes arrive over time: a transport, a
//!   bucket ring). Pieces are copied into scratch device memory laid out as
//!   the destinations it writes; a source that fails or ends short leaves the
//!   destinations untouched (the scratch is dropped) and the error is
//!   [`Error::UpdateSource`]. Once every byte has arrived, one device-to-device
//!   copy per destination moves the scratch into place. Costs device memory
//!   equal to the bytes the update writes, for the update's duration, and one
//!   more pass over them in device memory.
//! - **Streamed** (asked for with [`Staging::Streamed`]: destinations that
//!   serve nothing yet, as a load's). Pieces are copied straight into the
//!   destinations as they arrive; a source that fails midway leaves them
//!   partly written, the tag marked torn and its version unchanged.
//! - **Direct** (a [`Source::resident`] source: tensors of this process,
//!   whose bytes cannot go missing). Every piece is collected and its
//!   coverage checked first, then copied straight into the destinations: no
//!   scratch, one pass.
//!
//! Staged and direct, the copies into the destinations can still fail (a device
//! error); the update then rolls forward: it waits for the device and runs
//! them all again from the same bytes (the scratch, or the resident
//! source). When that retry fails too the destinations hold a mix: the tag
//! is marked torn ([`Pool::tag_torn`]), its version stays, and the
//! error is [`Error::UpdateTorn`]; an update that succeeds clears the mark.
//!
//! # Versions
//! A tag's version in a pool is [`Pool::tag_version`]; an update names the
//! version it replaces ([`UpdateOptions::expected_version`]) and produces
//! the next one. Importers attached through a share of the tag
//! ([`crate::share::Server`]) see the new version.
//!
//! # Reload
//! What an update writes is marked written in the pool
//! ([`Pool::mark_written`]): a Reload sleep of the tag keeps those bytes in
//! its host backup instead of restoring the checkpoint, so a wake brings
//! the update back.
//!
//! Thread safety: one update of a tag runs at a time (a second is refused
//! with `InvalidState`); the tag cannot sleep while an update writes into it
//! (`LoadInProgress`). Nothing may read the destinations on the device while
//! an update writes them.

mod cut;
mod plan;
mod resolved;
mod run;
pub mod source;
pub mod transport;

pub use cut::{Copy2d, Coverage};
pub use plan::UpdatePlan;
pub use resolved::Resolved;
pub use source::{Batch, Bytes, Piece, Source, SourceTensor, Tensors};

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::loader::{Plan, PlanOptions, Registry, Rules, Session, TensorInfo};
use crate::pool::Pool;
use crate::tag::TagId;

/// How an update keeps the failure rule (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Staging {
    /// Direct for a resident source, staged otherwise.
    #[default]
    Auto,
    /// Always stage, also a resident source (costs the scratch).
    Always,
    /// Never stage: copy each batch into the destinations as it arrives, no
    /// scratch and one pass. A source that fails midway leaves the
    /// destinations partly written (a load's rule): the tag is marked torn,
    /// its version stays, and the error is [`Error::UpdateTorn`]. For
    /// destinations that serve nothing yet, such as a load's
    /// ([`transport::broadcast_load`]).
    Streamed,
}

/// Options of one update.
#[derive(Debug, Clone, Copy)]
pub struct UpdateOptions {
    /// The tag version the update replaces; it produces the next one.
    pub expected_version: u64,
    /// The tag to version; None: the one pool tag the destinations lie in.
    pub tag: Option<TagId>,
    /// `allow_missing`: update only the destinations the source fills
    /// (others keep their bytes); `allow_unexpected`: skip source tensors
    /// no destination receives.
    pub plan: PlanOptions,
    /// Direct or staged.
    pub staging: Staging,
}

impl UpdateOptions {
    /// Default options for an update from version `expected`.
    pub fn from_version(expected: u64) -> UpdateOptions {
        UpdateOptions {
            expected_version: expected,
            tag: None,
            plan: PlanOptions::default(),
            staging: Staging::Auto,
        }
    }
}

/// What an update did.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UpdateResult {
    /// The tag versioned.
    pub tag: TagId,
    /// Its new version.
    pub version: u64,
    /// Bytes written into destinations.
    pub bytes: u64,
    /// Destinations written.
    pub destinations: u64,
    /// Copies issued (a 2D copy counts once).
    pub copies: u64,
    /// True when the update staged through scratch memory.
    pub staged: bool,
    /// True when the copies into the destinations failed once and ran again.
    pub retried: bool,
    /// Seconds from the first copy to the last byte in place.
    pub seconds: f64,
    /// Where the call's time went.
    pub phases: UpdatePhases,
}

/// Where an update's time went, in seconds of the calling thread, from the
/// call to its return. Together they make up the call's time, less what a
/// staged source spends producing its buckets.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct UpdatePhases {
    /// Checks and plan: options, the destinations against the pool, the
    /// plan (kept by the session), the tag's version, pinning, the source's
    /// pieces collected and their coverage, the copy list.
    pub plan: f64,
    /// Queuing the copies and pad fills on the device (for a staged update:
    /// the source's buckets into scratch, then the scratch into place).
    pub issue: f64,
    /// Waiting for the device to finish the copies.
    pub wait: f64,
    /// Reload retirement of the written ranges (done while the device
    /// copies), the version publish, the stream's release.
    pub bookkeeping: f64,
}

impl UpdateResult {
    /// Bytes written per second, in GB/s.
    pub fn gbps(&self) -> f64 {
        if self.seconds > 0.0 {
            self.bytes as f64 / self.seconds / 1e9
        } else {
            0.0
        }
    }
}

/// Update the destinations registered in `session` (by a load, or by hand)
/// from `source`, through the session's rules, on `pool`'s device (see the
/// module docs). Returns the new version and what was written.
///
/// The session keeps the plan ([`Session::plan_for`]): updates that repeat
/// with the same source tensors plan once, and find it again by comparing
/// their tensors with the kept ones ([`Session::kept_plan`]).
pub fn update(
    session: &Session,
    pool: &Pool,
    source: &mut dyn Source,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    let plan_for = |t: &BTreeMap<String, TensorInfo>, o: &PlanOptions| session.plan_for(t, o);
    let kept = |o: &PlanOptions, same: &dyn Fn(&BTreeMap<String, TensorInfo>) -> bool| {
        session.kept_plan(o, same)
    };
    let plans = run::Plans {
        plan_for: &plan_for,
        kept: &kept,
    };
    run::run(pool, &plans, &session.shared_registry(), source, opts)
}

/// [`update`] with the rules and destinations given directly (planned at
/// every call).
pub fn update_registry(
    pool: &Pool,
    rules: &Rules,
    registry: &Registry,
    source: &mut dyn Source,
    opts: &UpdateOptions,
) -> Result<UpdateResult> {
    let plan_for = |t: &BTreeMap<String, TensorInfo>, o: &PlanOptions| {
        Plan::build_for(t, rules, registry, o).map(Arc::new)
    };
    let plans = run::Plans {
        plan_for: &plan_for,
        kept: &|_: &PlanOptions, _: &dyn Fn(&BTreeMap<String, TensorInfo>) -> bool| None,
    };
    run::run(pool, &plans, registry, source, opts)
}

/// Make every check [`update`] makes before its first copy (options,
/// destinations, plan, version) for a source bringing `manifest`, moving
/// nothing; every problem in one error.
pub fn check(
    session: &Session,
    pool: &Pool,
    manifest: &[SourceTensor],
    opts: &UpdateOptions,
) -> Result<()> {
    check_options(opts)?;
    let registry = session.shared_registry();
    crate::loader::check_destinations(pool, &registry)?;
    let plan_for = |t: &BTreeMap<String, TensorInfo>, o: &PlanOptions| session.plan_for(t, o);
    let kept = |o: &PlanOptions, same: &dyn Fn(&BTreeMap<String, TensorInfo>) -> bool| {
        session.kept_plan(o, same)
    };
    plan::build(
        manifest,
        &plan_for,
        &kept,
        &registry,
        pool,
        opts.tag,
        opts.expected_version,
        &opts.plan,
    )
    .map(|_| ())
}

/// The one pool tag `session`'s registered destinations lie in (the tag a
/// load into them versions).
pub fn destinations_tag(session: &Session, pool: &Pool) -> Result<TagId> {
    let mut tags: Vec<TagId> = Vec::new();
    for d in session.destinations() {
        let Some(seg) = pool.segment_of(d.ptr) else {
            return Err(Error::InvalidArgument(format!(
                "destination `{}` lies outside the pool: a load through the update path writes pool memory of one tag",
                d.name.escape_debug()
            )));
        };
        if !tags.contains(&seg.tag) {
            tags.push(seg.tag);
        }
    }
    match tags[..] {
        [t] => Ok(t),
        [] => Err(Error::InvalidState(
            "no destination is registered: allocate them first (as for a load)".into(),
        )),
        _ => Err(Error::InvalidArgument(format!(
            "the destinations lie in {} tags; a load through the update path versions one",
            tags.len()
        ))),
    }
}

/// Refuse an update whose `expected_version` is 0 (versions start at
/// [`crate::pool::versions::FIRST_VERSION`]).
fn check_options(opts: &UpdateOptions) -> Result<()> {
    if opts.expected_version == 0 {
        return Err(Error::InvalidArgument(format!(
            "update expected_version 0: versions start at {}",
            crate::pool::versions::FIRST_VERSION
        )));
    }
    Ok(())
}
