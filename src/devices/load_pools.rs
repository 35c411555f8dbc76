//! A multi-device load into pools, one pool per device: the awake check, the
//! peer grants replicas need, and the reload sources for sleep, around
//! [`load_multi`].

use std::collections::BTreeSet;

use super::load::{load_multi, DeviceLoad, MultiLoaded, MultiMode};
use super::peers::{grant_each, Grants};
use crate::error::Result;
pub use crate::loader::PoolLoad;
use crate::loader::{self, Checkpoint, Control, LoadOptions};
use crate::pool::Pool;
use crate::tag::TagId;

/// Load `ckpt` into every listed pool's destinations (see [`load_multi`]).
///
/// Each pool's destinations are checked as [`loader::check_destinations`]
/// does (owned by what owned them at registration, in one live, awake block
/// of that pool or in a declared foreign range; nothing written otherwise).
/// A destination freed while the load ran fails it with
/// [`crate::Error::DestinationChanged`], and no reload source is registered.
/// For [`MultiMode::Replicas`] every tag that owns a destination is granted
/// read access for every other listed device (added to the tag's grants and
/// kept afterwards, so later loads and wakes can fan out too); when the load
/// fails before any byte is written the earlier grants are put back. Each
/// pool gets its device's executed plan as the reload source of those tags.
pub fn load_multi_into_pools(
    ckpt: Checkpoint,
    targets: &[PoolLoad<'_>],
    mode: MultiMode,
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<MultiLoaded> {
    let mut tags: Vec<BTreeSet<TagId>> = Vec::with_capacity(targets.len());
    for t in targets {
        loader::check_destinations(t.pool, t.registry)?;
        let mut owned = BTreeSet::new();
        for d in t.registry.iter() {
            if let Some(seg) = t.pool.segment_of(d.ptr) {
                seg.ensure_awake(d.ptr, &format!("destination `{}`", d.name))?;
                owned.insert(seg.tag);
            }
        }
        tags.push(owned);
    }
    let grants = if mode == MultiMode::Replicas {
        let each: Vec<(&Pool, Vec<TagId>)> = targets
            .iter()
            .zip(&tags)
            .map(|(t, owned)| (t.pool, owned.iter().copied().collect()))
            .collect();
        grant_each(&each)?
    } else {
        Grants::default()
    };
    let devices = device_loads(targets);
    let loaded = match load_multi(ckpt, &devices, mode, opts, ctl) {
        Ok(l) => l,
        Err(e) => {
            // Refused before any copy: nothing was written, so the grants go
            // back. After copies began, replicas may need them to repair.
            if matches!(e, crate::Error::Plan(_) | crate::Error::InvalidArgument(_)) {
                grants.undo();
            }
            return Err(e);
        }
    };
    // A destination freed while the load ran now belongs to someone else: no
    // wake may replay the checkpoint into it. No plan is registered then, so
    // no older source replays what this load overwrote either.
    if let Err(e) = targets
        .iter()
        .try_for_each(|t| loader::check_owners(t.registry))
    {
        for t in targets {
            for d in t.registry.iter() {
                if let Some(seg) = t.pool.segment_of(d.ptr) {
                    t.pool.retire_reload_range(seg.tag, d.ptr, d.bytes());
                }
            }
        }
        return Err(e);
    }
    for (k, t) in targets.iter().enumerate() {
        for &tag in &tags[k] {
            t.pool.add_reload_source(tag, loaded.plans[k].clone())?;
        }
    }
    Ok(loaded)
}

pub(super) fn device_loads<'a>(targets: &[PoolLoad<'a>]) -> Vec<DeviceLoad<'a>> {
    targets
        .iter()
        .map(|t| DeviceLoad {
            driver: t.pool.driver(),
            rules: t.rules,
            registry: t.registry,
        })
        .collect()
}
