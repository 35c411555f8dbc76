//! The safetensors loader: open and validate a checkpoint, map its tensors to
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
pub mod copy;
pub mod dtype;
pub mod executed;
mod into_pool;
pub mod plan;
pub mod registry;
pub mod rules;

use std::sync::Arc;

pub use checkpoint::{Checkpoint, Shard, TensorInfo};
pub use copy::{Control, CopyOptions, CopyStats, Strategy};
pub use dtype::Dtype;
pub use executed::ExecutedPlan;
pub use into_pool::{allocate_in_pool, load_into_pool};
pub use plan::{Extent, Fill, Plan, PlanOptions};
pub use registry::{DestAllocator, DestSpec, Destination, Registry, SegmentAllocator};
pub use rules::{Fuse, Pad, Rule, Rules, Shard as ShardRule, Tie, Tp};

use crate::driver::Driver;
use crate::error::Result;

/// Options of one load.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadOptions {
    /// Plan options (allow missing / unexpected).
    pub plan: PlanOptions,
    /// Copy engine options.
    pub copy: CopyOptions,
}

/// Plan and execute a load of `ckpt` into `registry`'s destinations.
///
/// Every check (checkpoint, rules, plan) happens before any byte is written:
/// on such an error the destinations are untouched. On [`crate::Error::Cancelled`]
/// or a driver error during the copy, destinations are partly written.
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
    let stats = copy::execute(
        driver,
        &ckpt.shards,
        &plan.extents,
        &plan.fills,
        &opts.copy,
        ctl,
    )?;
    Ok(ExecutedPlan::new(Arc::new(ckpt), plan, opts.copy, stats).with_driver(driver.clone()))
}
