//! A multi-device load into pools, one pool per device: the awake check, the
//! peer grants replicas need, and the reload sources for sleep, around
//! [`load_multi`].

use std::collections::BTreeSet;

use super::multi::{load_multi, DeviceLoad, MultiLoaded, MultiMode};
use super::{Checkpoint, Control, LoadOptions, Registry, Rules};
use crate::driver::{AccessMode, PeerAccess};
use crate::error::Result;
use crate::pool::Pool;
use crate::tag::TagId;

/// One device's part of a load into pools.
#[derive(Debug, Clone, Copy)]
pub struct PoolLoad<'a> {
    /// The device's pool; its destinations should live in it.
    pub pool: &'a Pool,
    /// The device's rules.
    pub rules: &'a Rules,
    /// The device's destinations.
    pub registry: &'a Registry,
}

/// Load `ckpt` into every listed pool's destinations (see [`load_multi`]).
///
/// Each pool's destinations are checked as [`super::check_destinations`]
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
        super::check_destinations(t.pool, t.registry)?;
        let mut owned = BTreeSet::new();
        for d in t.registry.iter() {
            if let Some(seg) = t.pool.segment_of(d.ptr) {
                seg.ensure_awake(d.ptr, &format!("destination `{}`", d.name))?;
                owned.insert(seg.tag);
            }
        }
        tags.push(owned);
    }
    let mut granted: Vec<(usize, TagId, Vec<PeerAccess>)> = Vec::new();
    let undo = |granted: &[(usize, TagId, Vec<PeerAccess>)]| {
        for (k, tag, old) in granted {
            let _ = targets[*k].pool.set_peer_access(*tag, old);
        }
    };
    if mode == MultiMode::Replicas {
        for (k, t) in targets.iter().enumerate() {
            for &tag in &tags[k] {
                let old = t.pool.peer_access(tag);
                let mut want = old.clone();
                for o in targets {
                    let dev = o.pool.device();
                    if dev != t.pool.device() && !want.iter().any(|p| p.device == dev) {
                        want.push(PeerAccess {
                            device: dev,
                            mode: AccessMode::Read,
                        });
                    }
                }
                if want != old {
                    if let Err(e) = t.pool.set_peer_access(tag, &want) {
                        undo(&granted);
                        return Err(e);
                    }
                    granted.push((k, tag, old));
                }
            }
        }
    }
    let devices = device_loads(targets);
    let loaded = match load_multi(ckpt, &devices, mode, opts, ctl) {
        Ok(l) => l,
        Err(e) => {
            // Refused before any copy: nothing was written, so the grants go
            // back. After copies began, replicas may need them to repair.
            if matches!(e, crate::Error::Plan(_) | crate::Error::InvalidArgument(_)) {
                undo(&granted);
            }
            return Err(e);
        }
    };
    // A destination freed while the load ran now belongs to someone else: no
    // wake may replay the checkpoint into it. No plan is registered then, so
    // no older source replays what this load overwrote either.
    if let Err(e) = targets
        .iter()
        .try_for_each(|t| super::check_owners(t.registry))
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

fn device_loads<'a>(targets: &[PoolLoad<'a>]) -> Vec<DeviceLoad<'a>> {
    targets
        .iter()
        .map(|t| DeviceLoad {
            driver: t.pool.driver(),
            rules: t.rules,
            registry: t.registry,
        })
        .collect()
}

/// Wake replicas by the same fan-out as [`MultiMode::Replicas`]: every
/// target's tags that own destinations are woken (memory mapped again at the
/// same addresses, peer grants set again), then the checkpoint, one copy in
/// host memory (the page cache), is loaded once and fanned out over peer
/// copies. Meant for replicas put to sleep with
/// [`Policy::Discard`](crate::sleep::Policy::Discard): no per-device backup is
/// kept, and the wake reads host memory once instead of once per device.
///
/// A device list [`load_multi`] refuses (none, a device twice, two
/// backends) is refused before anything wakes. On an error after the wake
/// the tags are awake and the destinations hold what the load reached (see
/// [`load_multi`]); loading again repairs them.
pub fn wake_replicas(
    ckpt: Checkpoint,
    targets: &[PoolLoad<'_>],
    opts: &LoadOptions,
    ctl: &Control<'_>,
) -> Result<MultiLoaded> {
    // A device list the load would refuse wakes nothing.
    super::multi::check_devices(&device_loads(targets))?;
    for t in targets {
        let mut tags = BTreeSet::new();
        for d in t.registry.iter() {
            if let Some(seg) = t.pool.segment_of(d.ptr) {
                tags.insert(seg.tag);
            }
        }
        let asleep: Vec<TagId> = tags
            .into_iter()
            .filter(|&tag| t.pool.is_tag_asleep(tag))
            .collect();
        if !asleep.is_empty() {
            t.pool.wake(&asleep)?;
        }
    }
    load_multi_into_pools(ckpt, targets, MultiMode::Replicas, opts, ctl)
}
