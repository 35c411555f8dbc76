//! Tags offered to other processes, and the gate that keeps a shared tag's
//! sleep and a new importer's attach from interleaving.
//!
//! The share layer registers a [`TagShare`] for each tag it serves. Before a
//! tag sleeps, the pool asks every share of that tag; a share refuses the sleep
//! (importers attached, refuse policy) or notifies its importers (revoke
//! policy). The gate's lock is held for the whole sleep of a shared tag, and
//! the share layer holds it while exporting a tag's memory to a new importer
//! or registering a share, so an attach sees the tag either wholly awake or
//! not at all.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::error::Result;
use crate::tag::TagId;

/// One share of a tag, as the pool sees it.
pub trait TagShare: Send + Sync + std::fmt::Debug {
    /// Called with the gate locked, before `tag` sleeps: an error refuses the
    /// sleep and leaves the tag awake.
    fn before_sleep(&self, tag: TagId) -> Result<()>;

    /// Called with the gate locked after `tag`'s weights version moved to
    /// `version` (an update, a publish). Must not block.
    fn version_moved(&self, tag: TagId, version: u64) {
        let _ = (tag, version);
    }
}

/// Registered shares: per tag, (registration id, share).
type ShareMap = HashMap<TagId, Vec<(u64, Arc<dyn TagShare>)>>;

/// The shares registered per tag; see the module docs.
#[derive(Debug, Default)]
pub struct ShareGate {
    shares: Mutex<ShareMap>,
    next_id: Mutex<u64>,
}

/// The gate, locked: no shared tag sleeps and no share is added or removed while it is held.
pub struct GateGuard<'a> {
    shares: MutexGuard<'a, ShareMap>,
}

impl GateGuard<'_> {
    /// True when `tag` has at least one share.
    pub fn is_shared(&self, tag: TagId) -> bool {
        self.shares.get(&tag).is_some_and(|l| !l.is_empty())
    }

    /// Tell every share of `tag` its version moved (see [`TagShare::version_moved`]).
    pub fn version_moved(&self, tag: TagId, version: u64) {
        for (_, s) in self.shares.get(&tag).into_iter().flatten() {
            s.version_moved(tag, version);
        }
    }

    /// Ask every share of `tag` whether it may sleep (see [`TagShare::before_sleep`]).
    pub fn before_sleep(&self, tag: TagId) -> Result<()> {
        for (_, s) in self.shares.get(&tag).into_iter().flatten() {
            s.before_sleep(tag)?;
        }
        Ok(())
    }
}

impl ShareGate {
    /// Lock the gate.
    pub fn lock(&self) -> GateGuard<'_> {
        GateGuard {
            shares: self.shares.lock().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// Register `share` for `tag`; the id removes it again.
    pub fn add(&self, tag: TagId, share: Arc<dyn TagShare>) -> u64 {
        let id = {
            let mut n = self.next_id.lock().unwrap_or_else(|p| p.into_inner());
            *n += 1;
            *n
        };
        self.lock().shares.entry(tag).or_default().push((id, share));
        id
    }

    /// Remove the share registered under `id` (no-op when absent).
    pub fn remove(&self, id: u64) {
        let mut g = self.lock();
        for list in g.shares.values_mut() {
            list.retain(|(i, _)| *i != id);
        }
        g.shares.retain(|_, l| !l.is_empty());
    }

    /// True when `tag` has at least one share.
    pub fn is_shared(&self, tag: TagId) -> bool {
        self.lock().shares.get(&tag).is_some_and(|l| !l.is_empty())
    }
}
