//! Loading into a [`Pool`]: destinations allocated from the pool under one tag
//! (given back if any allocation fails), the awake check and pin of the tags a
//! load writes into, and the executed plan registered as the reload source of
//! every tag it filled. The C API, the command line and the tests call these, so all
//! of them follow the same steps.

use std::sync::{Arc, Mutex};

use super::registry::Destination;
use super::{load, Checkpoint, Control, DestAllocator, DestSpec, ExecutedPlan, LoadOptions};
use super::{Registry, Rules};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};
use crate::pool::{Owner, Pool};
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

/// Check, before a load writes anything, the destinations against `pool`.
/// First each destination's owner must be the one recorded when it was
/// registered ([`check_owners`]). Then each one touching the pool's memory
/// must lie inside one live block whose
/// tag is awake (`UnknownPointer` in a free block, `InvalidArgument` when it runs past its block and would
/// overwrite a neighbour, `InvalidState` when asleep); every other
/// destination must lie wholly inside a range the caller declared its own
/// ([`Registry::declare_foreign`]; `UnknownPointer` otherwise, which also
/// catches memory of another pool, asleep or not). A declaration never
/// exempts pool memory from its check.
pub fn check_destinations(pool: &Pool, registry: &Registry) -> Result<()> {
    // A freed and reallocated block is live again, but someone else's.
    check_owners(registry)?;
    // Writing past a block overwrites its neighbour; writing into a sleeping
    // tag, or memory no one mapped, faults.
    let dests: Vec<(&str, DevicePtr, usize)> = registry
        .iter()
        .map(|d| (d.name.as_str(), d.ptr, d.bytes()))
        .filter(|d| d.2 != 0)
        .collect();
    let ranges: Vec<(DevicePtr, usize)> = dests.iter().map(|d| (d.1, d.2)).collect();
    // Pool memory is always checked, declared foreign or not.
    pool.check_live_ranges(
        &ranges,
        &|i| format!("destination `{}`", dests[i].0),
        &mut |i| {
            let (ptr, len) = ranges[i];
            if registry.in_foreign(ptr, len as u64) {
                return Ok(());
            }
            Err(Error::UnknownPointer {
                ptr,
                why: "a destination outside the pool the load runs on: allocate it from that pool, or declare its range the caller's own (vmmw_loader_declare_foreign)",
            })
        },
    )
}

/// Check that every destination of `registry` is still owned by what owned it
/// when it was registered ([`crate::pool::check_owner`]):
/// [`Error::DestinationChanged`] naming the first one whose block was freed.
/// Loads call it before writing, and again before registering what they
/// wrote as a reload source.
pub fn check_owners(registry: &Registry) -> Result<()> {
    let dests: Vec<&Destination> = registry.iter().collect();
    let ranges: Vec<(DevicePtr, usize, Owner)> = dests
        .iter()
        .map(|d| (d.ptr, d.bytes(), registry.owner(d)))
        .collect();
    crate::pool::check_owners(&ranges, &|i| format!("destination `{}`", dests[i].name))
}

/// Load `ckpt` into `registry`'s destinations on `pool`'s device (as
/// [`load`]), then register the executed plan in the pool as the reload
/// source of every tag that owns a destination, so those tags can sleep with
/// the Reload policy.
///
/// The pool tags holding destinations must be awake (`InvalidState` naming
/// the destination and its tag, nothing written) and are pinned for the whole
/// load, checked and pinned under one pool-lock hold
/// ([`Pool::pin_for_load`]): a sleep of them meanwhile, from another thread
/// or from the progress callback, fails with
/// [`Error::LoadInProgress`](crate::Error::LoadInProgress) and changes
/// nothing. Before that the destinations are checked against the pool
/// ([`check_destinations`]): outside the pool only declared ranges are
/// written.
///
/// A destination freed while the load ran (another thread's free) fails the
/// load with [`Error::DestinationChanged`] and registers no reload source,
/// so no wake replays the checkpoint into that memory's new owner.
///
/// On an error once copying started the destinations are partly written (see
/// [`load`]); then no older reload source replays them any more (a later
/// Reload sleep keeps their bytes in the host backup). For simplicity the same
/// holds after errors found before any byte was written.
pub fn load_into_pool(
    pool: &Pool,
    ckpt: Checkpoint,
    rules: &Rules,
    registry: &Registry,
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<Arc<ExecutedPlan>> {
    check_destinations(pool, registry)?;
    let dests: Vec<(DevicePtr, usize, &str)> = registry
        .iter()
        .map(|d| (d.ptr, d.bytes(), d.name.as_str()))
        .collect();
    let pin = pool.pin_for_load(&dests)?;
    let loaded = load(pool.driver(), ckpt, rules, registry, opts, ctl)
        .and_then(|e| check_owners(registry).map(|()| e));
    let executed = match loaded {
        Ok(e) => Arc::new(e),
        Err(e) => {
            for &(ptr, bytes, _) in &dests {
                if let Some(seg) = pool.segment_of(ptr) {
                    pool.retire_reload_range(seg.tag, ptr, bytes);
                }
            }
            return Err(e);
        }
    };
    // Registered before the pin drops: no sleep sees the tags between the
    // load and its source.
    for &t in pin.tags() {
        pool.add_reload_source(t, executed.clone())?;
    }
    drop(pin);
    Ok(executed)
}
