//! What an update derives from a load plan alone (the extents by source
//! tensor, the destinations written), kept per plan: a session hands
//! repeated updates with the same source tensors the same plan (the same
//! `Arc`, replaced when its rules or destinations change), so an RL loop
//! resolves it once. Everything that depends on the pool's state (owners,
//! liveness, the tag, its version) is still checked at every update.

use std::sync::{Arc, Mutex, Weak};

use crate::driver::DevicePtr;
use crate::loader::{Plan, Registry};

/// Plans kept at most; the oldest goes first.
const KEPT: usize = 8;

/// One plan's derived parts.
#[derive(Debug)]
pub struct Resolved {
    /// Indices into `plan.extents`, per manifest entry, ordered by offset.
    pub by_tensor: Vec<Vec<usize>>,
    /// Each destination the update writes, whole: `(address, bytes, name)`,
    /// by address.
    pub written: Vec<(DevicePtr, usize, String)>,
}

/// Kept entries: the plan (weak: a replaced plan drops out; its allocation
/// stays while the entry does, so no other plan can share its address).
static KEPT_PLANS: Mutex<Vec<(Weak<Plan>, Arc<Resolved>)>> = Mutex::new(Vec::new());

/// `plan`'s derived parts, for a manifest of `tensors` entries, resolved
/// now or kept from an earlier update with the same plan.
pub fn resolve(plan: &Arc<Plan>, tensors: usize, registry: &Registry) -> Arc<Resolved> {
    let mut kept = KEPT_PLANS.lock().unwrap_or_else(|p| p.into_inner());
    kept.retain(|(p, _)| p.strong_count() > 0);
    let hit = kept
        .iter()
        .find(|(p, r)| std::ptr::eq(p.as_ptr(), Arc::as_ptr(plan)) && r.by_tensor.len() == tensors);
    if let Some((_, r)) = hit {
        return r.clone();
    }
    let r = Arc::new(Resolved {
        by_tensor: by_tensor(plan, tensors),
        written: written_destinations(plan, registry),
    });
    if kept.len() >= KEPT {
        kept.remove(0);
    }
    kept.push((Arc::downgrade(plan), r.clone()));
    r
}

fn by_tensor(plan: &Plan, tensors: usize) -> Vec<Vec<usize>> {
    let mut by_tensor = vec![Vec::new(); tensors];
    for (i, e) in plan.extents.iter().enumerate() {
        by_tensor[e.shard as usize].push(i);
    }
    for v in &mut by_tensor {
        v.sort_by_key(|&i| plan.extents[i].src);
    }
    by_tensor
}

/// Each destination some extent or fill writes, whole, by address.
fn written_destinations(plan: &Plan, registry: &Registry) -> Vec<(DevicePtr, usize, String)> {
    let mut dests: Vec<(DevicePtr, usize, String)> = registry
        .iter()
        .map(|d| (d.ptr, d.bytes(), d.name.clone()))
        .collect();
    dests.sort_by_key(|d| d.0);
    let mut hit = vec![false; dests.len()];
    let mut mark = |addr: DevicePtr| {
        let i = dests.partition_point(|d| d.0 <= addr);
        if i > 0 && addr < dests[i - 1].0 + dests[i - 1].1 as u64 {
            hit[i - 1] = true;
        }
    };
    for e in &plan.extents {
        mark(e.dst);
    }
    for f in &plan.fills {
        mark(f.dst);
    }
    dests
        .into_iter()
        .zip(hit)
        .filter_map(|(d, h)| h.then_some(d))
        .collect()
}
