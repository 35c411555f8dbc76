//! The loader: open and validate a checkpoint (safetensors, or GGUF picked by
//! its magic bytes, see [`gguf`]), map its tensors to
//! destinations through rules, plan every copy before any I/O, then copy in
//! place into device memory at the link's rate.
//!
//! Loading into a [`Pool`](crate::Pool) (destinations allocated under one tag,
//! the awake check, the reload source registered for sleep): [`allocate_in_pool`]
//! and [`load_into_pool`], the calls the C API and the command line use. Into
//! memory of your own: [`load`] with any [`DestAllocator`], as below.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use vmmweights::loader::*;
//! # fn f(driver: Arc<dyn vmmweights::Driver>) -> vmmweights::Result<()> {
//! let ckpt = Checkpoint::open("/models/llama")?;
//! let rules = Rules::preset("llama", None, 128)?;
//! let alloc = SegmentAllocator::new(driver.clone(), 256 << 20);
//! let mut reg = Registry::new();
//! reg.allocate(&Plan::destinations(&ckpt, &rules)?, &alloc)?;
//! let loaded = load(&driver, ckpt, &rules, &reg, &LoadOptions::default(), &Control::default())?;
//! println!("{:.1} GB/s", loaded.stats.gbps());
//! # Ok(()) }
//! ```

pub mod checkpoint;
mod checksum;
pub mod copy;
pub mod dtype;
pub mod executed;
pub mod ggml_type;
pub mod gguf;
mod into_pool;
mod layout;
mod not_checkpoint;
pub mod pack;
pub mod packed;
pub mod plan;
mod read_error;
pub mod registry;
pub mod rules;
pub mod session;
pub mod shard;
pub mod tensor;

use std::sync::Arc;

pub use checkpoint::{Checkpoint, FileIdentity, Format, Shard, TensorInfo};
pub use copy::{Control, CopyOptions, CopyStats, Strategy};
pub use dtype::Dtype;
pub use executed::ExecutedPlan;
pub use into_pool::{allocate_in_pool, check_destinations, check_owners, load_into_pool};
pub use plan::{Extent, Fill, Plan, PlanOptions};
pub use registry::{DestAllocator, DestSpec, Destination, Registry, SegmentAllocator};
pub use rules::{Fuse, Pad, Rule, Rules, Shard as ShardRule, Tie, Tp};
pub use session::{PlanSummary, PoolLoad, Progress, Session};

use crate::driver::Driver;
use crate::error::Result;

/// Options of one load.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Plan options (allow missing / unexpected).
    pub plan: PlanOptions,
    /// Copy engine options.
    pub copy: CopyOptions,
    /// Keep a checksum of every loaded extent (one more read of the loaded
    /// bytes, through `pread`), so each Reload wake also proves, before
    /// restoring anything, that the files still hold them, also when a file
    /// was rewritten in place keeping its size and modification time. Off by
    /// default: identity, size and modification time are always checked.
    pub reload_check: bool,
}

/// Plan and execute a load of `ckpt` into `registry`'s destinations.
///
/// Every check (checkpoint, rules, plan, and that no shard changed since it
/// was opened) happens before any byte is written: on such an error the
/// destinations are untouched. An error once copying has started
/// ([`crate::Error::Cancelled`], an I/O error reading a shard, a driver error)
/// leaves the destinations partly written, with no rollback: each byte holds
/// its old value or the checkpoint's, in units of whole copy slots or windows.
/// Load again to finish (callers that register reload sources must also stop
/// older sources from replaying those bytes, see
/// [`crate::Pool::retire_reload_range`]).
/// Returns the executed plan, which sleep's Reload policy can replay.
pub fn load(
    driver: &Arc<dyn Driver>,
    ckpt: Checkpoint,
    rules: &Rules,
    registry: &Registry,
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<ExecutedPlan> {
    let plan = Plan::build(&ckpt, rules, registry, &opts.plan)?;
    ckpt.check_unchanged()?;
    let stats = copy::execute(
        driver,
        &ckpt.shards,
        &plan.extents,
        &plan.fills,
        &opts.copy,
        ctl,
    )
    .map_err(|e| read_error::name_tensor(e, &plan.sources))?;
    // A shard rewritten during the copies may have given torn data.
    ckpt.check_unchanged()?;
    let executed =
        ExecutedPlan::new(Arc::new(ckpt), plan, opts.copy, stats).with_driver(driver.clone());
    if opts.reload_check {
        executed.with_checksums()
    } else {
        Ok(executed)
    }
}
