//! The read grants the devices of a group give each other, so a load or a
//! wake can fan out over peer copies. A grant is kept with the tag (see
//! `Pool::set_peer_access`), so later loads and wakes find it.

use crate::driver::{AccessMode, PeerAccess};
use crate::error::Result;
use crate::pool::Pool;
use crate::tag::TagId;

/// Add a read grant for each of `devices` (other than the pool's own) to
/// `tag`'s grants in `pool`. Returns the grants before, when they changed.
fn grant_read(
    pool: &Pool,
    tag: TagId,
    devices: &[i32],
    reachable_only: bool,
) -> Result<Option<Vec<PeerAccess>>> {
    let old = pool.peer_access(tag);
    let mut want = old.clone();
    for &dev in devices {
        if dev == pool.device() || want.iter().any(|p| p.device == dev) {
            continue;
        }
        if reachable_only && !pool.driver().can_access_peer(dev).unwrap_or(false) {
            continue;
        }
        want.push(PeerAccess {
            device: dev,
            mode: AccessMode::Read,
        });
    }
    if want == old {
        return Ok(None);
    }
    pool.set_peer_access(tag, &want)?;
    Ok(Some(old))
}

/// Grant every `(pool, tag)` read access for every other listed device that
/// can reach it (kept with the tag, set again at every map). A grant the
/// driver refuses is left out: the work then goes without that peer path.
pub(super) fn grant_reachable(members: &[(&Pool, TagId)]) {
    let devices: Vec<i32> = members.iter().map(|(p, _)| p.device()).collect();
    for &(pool, tag) in members {
        let old = pool.peer_access(tag);
        if grant_read(pool, tag, &devices, true).is_err() {
            let _ = pool.set_peer_access(tag, &old);
        }
    }
}

/// Grants added by [`grant_each`], to be put back by [`Grants::undo`].
#[derive(Default)]
pub(super) struct Grants<'p> {
    before: Vec<(&'p Pool, TagId, Vec<PeerAccess>)>,
}

impl Grants<'_> {
    /// Put back every grant as it was before.
    pub(super) fn undo(&self) {
        for (pool, tag, old) in &self.before {
            let _ = pool.set_peer_access(*tag, old);
        }
    }
}

/// Grant each `(pool, tags)` read access for every listed pool's device.
/// On an error the grants made so far are put back.
pub(super) fn grant_each<'p>(targets: &[(&'p Pool, Vec<TagId>)]) -> Result<Grants<'p>> {
    let devices: Vec<i32> = targets.iter().map(|(p, _)| p.device()).collect();
    let mut grants = Grants::default();
    for (pool, tags) in targets {
        for &tag in tags {
            match grant_read(pool, tag, &devices, false) {
                Ok(Some(old)) => grants.before.push((pool, tag, old)),
                Ok(None) => {}
                Err(e) => {
                    grants.undo();
                    return Err(e);
                }
            }
        }
    }
    Ok(grants)
}
