//! Loading into a [`Pool`]: destinations allocated from the pool under one tag
//! (given back if any allocation fails), the awake check before a load writes
//! pool memory, and the executed plan registered as the reload source of every
//! tag it filled. The C API, the command line and the tests call these, so all
//! of them follow the same steps.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use super::{load, Checkpoint, Control, DestAllocator, DestSpec, ExecutedPlan, LoadOptions};
use super::{Registry, Rules};
use crate::driver::DevicePtr;
use crate::error::Result;
use crate::pool::Pool;
use crate::tag::{self, TagId};

/// Parameters the loader allocates from a plan come from the pool, in the
/// calling thread's tag. Nothing is given back on failure; see
/// [`allocate_in_pool`] for that.
impl DestAllocator for Pool {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        // The pool aligns every block to at least 512 bytes.
        Ok(Pool::alloc(self, bytes)?.ptr)
    }
}

/// Allocates destinations from a pool under one tag, remembering them so a
/// failure can give them back.
struct TaggedPoolDest<'a> {
    pool: &'a Pool,
    tag: TagId,
    taken: Mutex<Vec<DevicePtr>>,
}

impl DestAllocator for TaggedPoolDest<'_> {
    fn alloc(&self, bytes: usize) -> Result<DevicePtr> {
        let b = self.pool.alloc_tagged(bytes, self.tag)?;
        self.taken
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(b.ptr);
        Ok(b.ptr)
    }
}

/// Allocate every destination of `specs` in `pool` under `tag` and register
/// them in `registry`. On failure nothing is registered and every block taken
/// is freed again. The blocks belong to the pool.
pub fn allocate_in_pool(
    registry: &mut Registry,
    specs: &[DestSpec],
    pool: &Pool,
    tag: TagId,
) -> Result<()> {
    tag::check(tag)?;
    let alloc = TaggedPoolDest {
        pool,
        tag,
        taken: Mutex::new(Vec::new()),
    };
    let r = registry.allocate(specs, &alloc);
    if r.is_err() {
        for ptr in alloc.taken.into_inner().unwrap_or_else(|e| e.into_inner()) {
            let _ = pool.free(ptr);
        }
    }
    r
}

/// Load `ckpt` into `registry`'s destinations on `pool`'s device (as
/// [`load`]), then register the executed plan in the pool as the reload
/// source of every tag that owns a destination, so those tags can sleep with
/// the Reload policy.
///
/// Destinations inside the pool must be awake (`InvalidState` naming the
/// destination and its tag, nothing written); destinations outside it are the
/// caller's memory.
pub fn load_into_pool(
    pool: &Pool,
    ckpt: Checkpoint,
    rules: &Rules,
    registry: &Registry,
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<Arc<ExecutedPlan>> {
    // Writing into a sleeping tag would fault.
    for d in registry.iter() {
        if let Some(seg) = pool.segment_of(d.ptr) {
            seg.ensure_awake(d.ptr, &format!("destination `{}`", d.name))?;
        }
    }
    let executed = Arc::new(load(pool.driver(), ckpt, rules, registry, opts, ctl)?);
    let tags: BTreeSet<TagId> = registry
        .iter()
        .filter_map(|d| pool.segment_of(d.ptr).map(|s| s.tag))
        .collect();
    for t in tags {
        pool.add_reload_source(t, executed.clone())?;
    }
    Ok(executed)
}
