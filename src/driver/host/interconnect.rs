//! The simulated interconnect: one process-wide table of mapped ranges with
//! access granted, recording which device owns each and which peers may read
//! or write it, checked by peer copies the way a GPU's page tables would be.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use super::HostDriver;
use crate::driver::{AccessMode, DevicePtr, PeerAccess};

/// One mapped range in the simulated interconnect: its owner and its peers.
#[derive(Debug)]
pub(super) struct Mapped {
    pub(super) end: u64,
    pub(super) driver: u64,
    pub(super) device: i32,
    pub(super) peers: Vec<PeerAccess>,
}

/// The process-wide table of mapped ranges with access granted, by start address.
pub(super) fn interconnect() -> std::sync::MutexGuard<'static, BTreeMap<u64, Mapped>> {
    static TABLE: OnceLock<Mutex<BTreeMap<u64, Mapped>>> = OnceLock::new();
    TABLE
        .get_or_init(|| Mutex::new(BTreeMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// True when every byte of `[va, va+len)` is mapped on `owner` and `who`
/// (the owner itself, or a peer with at least `need`) may touch it.
pub(super) fn range_allows(va: u64, len: usize, owner: i32, who: i32, need: AccessMode) -> bool {
    let table = interconnect();
    let end = va + len as u64;
    let mut cursor = va;
    for (&start, m) in table.range(..end) {
        if m.end <= cursor {
            continue;
        }
        if start > cursor || m.device != owner {
            return false;
        }
        let ok = who == owner
            || m.peers
                .iter()
                .any(|p| p.device == who && p.mode.allows(need));
        if !ok {
            return false;
        }
        cursor = m.end;
    }
    cursor >= end
}

impl HostDriver {
    /// The peers granted access to the mapped range starting at `va` (empty
    /// when none, or when nothing of ours is mapped there with access set).
    pub fn peer_access_at(&self, va: DevicePtr) -> Vec<PeerAccess> {
        interconnect()
            .get(&va)
            .filter(|m| m.driver == self.id)
            .map(|m| m.peers.clone())
            .unwrap_or_default()
    }
}
