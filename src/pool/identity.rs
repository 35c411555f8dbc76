//! Block identity: who owns a device address, as opposed to whether it is
//! live.
//!
//! A pool hands the same address out again once a block is freed; an address
//! alone cannot tell the loader that a destination it recorded now belongs to
//! someone else. So every block the pool hands out gets a [`BlockId`] from a
//! process-wide counter that never repeats, and anyone who writes into memory
//! later (a load, a Reload registration, an update) records the [`Owner`] of
//! each destination when it is registered and checks it with
//! [`check_owner`] before any byte moves: the one rule, used by every writer.
//!
//! [`owner_of`] looks an address up in every live pool of the process
//! (addresses are unique among live mappings, on CUDA's unified address space
//! as on the host backend's mmap), so a destination registered without naming
//! its pool is still recorded.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use super::{segment_base, State};
use crate::driver::DevicePtr;
use crate::error::{Error, Result};

/// The identity of one allocation of a pool block: unique in the process,
/// never reused, also across pools and after the block is freed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockId(pub u64);

impl std::fmt::Display for BlockId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "block #{}", self.0)
    }
}

/// What owned an address when it was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Owner {
    /// A live block of a pool.
    Block(BlockId),
    /// No live block of any pool: memory the caller owns (`cudaMalloc`'d,
    /// another allocator's, declared foreign to the loader), a free block, or nothing.
    Outside,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Block(id) => id.fmt(f),
            Owner::Outside => f.write_str("no pool block"),
        }
    }
}

/// The next block identity; 0 is never handed out.
pub(super) fn next_block_id() -> BlockId {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    BlockId(NEXT.fetch_add(1, Ordering::Relaxed))
}

type Pools = Vec<Weak<Mutex<State>>>;

/// Every live pool's state. Lock order: this list, then a pool's state; no
/// code holding a pool's state takes it.
fn pools() -> MutexGuard<'static, Pools> {
    static POOLS: Mutex<Pools> = Mutex::new(Vec::new());
    // Entries are pushed and removed whole: a poisoned list is still valid.
    POOLS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Make a new pool's blocks visible to [`owner_of`].
pub(super) fn enlist(state: &Arc<Mutex<State>>) {
    let mut list = pools();
    list.retain(|w| w.strong_count() > 0);
    list.push(Arc::downgrade(state));
}

/// Remove a pool about to be dropped. Called before its state drops, under
/// the list lock, so [`owner_of`] never keeps a dropped pool's segments alive.
pub(super) fn dismiss(state: &Arc<Mutex<State>>) {
    let target = Arc::downgrade(state);
    pools().retain(|w| !w.ptr_eq(&target) && w.strong_count() > 0);
}

/// The identity of the live block holding byte `ptr` in `st`, if any.
pub(super) fn block_at(st: &State, ptr: DevicePtr) -> Option<BlockId> {
    let base = segment_base(st, ptr)?;
    let e = &st.segs[&base];
    let (_, b) = e.blocks.containing((ptr - base) as usize)?;
    b.live.then_some(b.id)
}

/// Who owns the byte at `ptr` now: the live pool block holding it, in any
/// pool of this process, or [`Owner::Outside`].
///
/// Must not be called while holding a pool's lock.
pub fn owner_of(ptr: DevicePtr) -> Owner {
    owners_of(&[ptr])[0]
}

/// [`owner_of`] of each address, each pool's lock taken once for all.
fn owners_of(ptrs: &[DevicePtr]) -> Vec<Owner> {
    let mut out = vec![Owner::Outside; ptrs.len()];
    let list = pools();
    for w in list.iter() {
        let Some(state) = w.upgrade() else { continue };
        {
            let st = state.lock().unwrap_or_else(|p| p.into_inner());
            for (o, &ptr) in out.iter_mut().zip(ptrs) {
                if *o == Owner::Outside {
                    if let Some(id) = block_at(&st, ptr) {
                        *o = Owner::Block(id);
                    }
                }
            }
        }
        // The strong reference drops here, under the list lock: a pool being
        // dropped waits in `dismiss` until it is gone.
        drop(state);
    }
    out
}

/// The rule every writer into recorded destinations follows: `[ptr, ptr +
/// len)`, named `what` in errors, was owned by `recorded` when it was
/// registered and must still be. Refused with [`Error::DestinationChanged`]
/// (C status `VMMW_UNKNOWN_POINTER`) when the block recorded was freed, and
/// so when the address now belongs to a new block, or when memory recorded
/// outside every pool is now a pool block. Empty ranges are never written
/// and always pass.
///
/// It cannot see a block that an allocator on top of the pool (PyTorch's
/// caching allocator) hands to a new tensor without freeing it here; nor a
/// foreign range freed and reused outside every pool: the caller guarantees
/// those stay theirs.
///
/// Must not be called while holding a pool's lock.
pub fn check_owner(ptr: DevicePtr, len: usize, recorded: Owner, what: &str) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    check_owners(&[(ptr, len, recorded)], &|_| what.to_owned())
}

/// [`check_owner`] of every `(ptr, len, recorded)` range (each pool's lock
/// taken once: an update checks hundreds of destinations), `what(i)`
/// naming range i in the error, made only for the first that fails.
///
/// Must not be called while holding a pool's lock.
pub fn check_owners(
    ranges: &[(DevicePtr, usize, Owner)],
    what: &dyn Fn(usize) -> String,
) -> Result<()> {
    let ptrs: Vec<DevicePtr> = ranges.iter().map(|r| r.0).collect();
    let now = owners_of(&ptrs);
    let changed = ranges
        .iter()
        .zip(&now)
        .position(|(&(_, len, recorded), &now)| len != 0 && now != recorded);
    let Some(i) = changed else {
        return Ok(());
    };
    let (ptr, _, recorded) = ranges[i];
    Err(Error::DestinationChanged {
        what: what(i),
        ptr,
        recorded: recorded.to_string(),
        now: now[i].to_string(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::driver::host::{HostConfig, HostDriver};
    use crate::error::Status;
    use crate::pool::{Pool, PoolConfig};
    use crate::tag;

    fn pool() -> Pool {
        Pool::new(
            Arc::new(HostDriver::new(HostConfig::default())),
            PoolConfig::default(),
        )
        .unwrap()
    }

    #[test]
    fn an_address_handed_out_again_is_a_new_owner_in_any_pool() {
        let (a, b) = (pool(), pool());
        let t = tag::id("unit-identity").unwrap();
        let x = a.alloc_tagged(4096, t).unwrap();
        let y = b.alloc_tagged(4096, t).unwrap();
        assert_ne!(x.id, y.id, "identities are unique across pools");
        assert_eq!(owner_of(x.ptr + 100), Owner::Block(x.id));
        assert_eq!(owner_of(y.ptr), Owner::Block(y.id));
        check_owner(x.ptr, 4096, Owner::Block(x.id), "d").unwrap();

        a.free(x.ptr).unwrap();
        assert_eq!(owner_of(x.ptr), Owner::Outside, "a free block is no one's");
        let e = check_owner(x.ptr, 4096, Owner::Block(x.id), "destination `w`").unwrap_err();
        assert_eq!(e.status(), Status::UnknownPointer, "{e}");
        assert!(e.to_string().contains("destination `w`"), "{e}");
        let x2 = a.alloc_tagged(4096, t).unwrap();
        assert_eq!(x2.ptr, x.ptr, "the same address again");
        assert!(x2.id > x.id, "under a new identity");
        assert!(check_owner(x.ptr, 4096, Owner::Block(x.id), "d").is_err());
        // Memory recorded outside every pool that became a block changed hands too.
        assert!(check_owner(x.ptr, 4096, Owner::Outside, "d").is_err());
        // Nothing is written into an empty range: it always passes.
        check_owner(x.ptr, 0, Owner::Outside, "d").unwrap();
        a.check_invariants().unwrap();

        // A dropped pool leaves the lookup, and its memory is no one's.
        let gone = y.ptr;
        drop(b);
        assert_eq!(owner_of(gone), Owner::Outside);
        a.free(x2.ptr).unwrap();
    }

    #[test]
    fn lookups_while_pools_come_and_go_find_each_block_and_never_block() {
        let t = tag::id("unit-identity-churn").unwrap();
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for _ in 0..50 {
                        let p = pool();
                        let b = p.alloc_tagged(512, t).unwrap();
                        assert_eq!(owner_of(b.ptr), Owner::Block(b.id));
                        drop(p);
                    }
                });
            }
            s.spawn(|| {
                for _ in 0..500 {
                    let _ = owner_of(0x1000);
                }
            });
        });
    }
}
