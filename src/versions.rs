//! Each tag's weights version, process-wide, and who is told when it moves.
//!
//! A tag's weights start at version [`FIRST`]. An update ([`crate::update`])
//! names the version it expects to replace and, once every destination holds
//! the new bytes, moves the tag to the next one; an owner that rewrote weights
//! in place by other means announces it with [`publish`]. Watchers (a share
//! server serving the tag) are called with the new version, so importers see
//! the number the owner sees.
//!
//! Only one update of a tag runs at a time: [`begin`] hands out the tag's
//! [`Ticket`] and refuses a second one until the first is committed or dropped.
//!
//! Versions live per tag for the whole process (one tag in several pools, a
//! tensor-parallel engine driving many devices, has one version).
//!
//! Thread safety: every function may be called from any thread. Watchers are
//! called without the registry's lock held, on the thread that moved the
//! version, and must not block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use crate::error::{Error, Result};
use crate::tag::{self, TagId};

/// The version of weights nobody updated yet (what a load gives).
pub const FIRST: u64 = 1;

/// Called with a tag's new version.
pub type Watcher = Arc<dyn Fn(TagId, u64) + Send + Sync>;

/// Identifies a watcher for [`unwatch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WatchId(u64);

#[derive(Default)]
struct TagVersion {
    version: u64,
    /// An update is between [`begin`] and its commit or drop.
    busy: bool,
    /// The last update failed after it wrote destinations and could not
    /// finish: they hold a mix of versions until an update succeeds.
    torn: bool,
}

#[derive(Default)]
struct Registry {
    tags: HashMap<TagId, TagVersion>,
    watchers: Vec<(WatchId, TagId, Watcher)>,
    next_watch: u64,
}

fn registry() -> MutexGuard<'static, Registry> {
    static REGISTRY: OnceLock<Mutex<Registry>> = OnceLock::new();
    // Every change is a whole field assignment; a panic cannot leave it half done.
    REGISTRY
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn entry(r: &mut Registry, tag: TagId) -> &mut TagVersion {
    r.tags.entry(tag).or_insert_with(|| TagVersion {
        version: FIRST,
        ..TagVersion::default()
    })
}

/// The weights version of `tag` ([`FIRST`] until it moves).
pub fn current(tag: TagId) -> Result<u64> {
    tag::check(tag)?;
    Ok(registry().tags.get(&tag).map_or(FIRST, |t| t.version))
}

/// True while `tag`'s destinations may hold a mix of versions: an update
/// failed after writing and could not finish. The next successful update
/// clears it.
pub fn is_torn(tag: TagId) -> Result<bool> {
    tag::check(tag)?;
    Ok(registry().tags.get(&tag).is_some_and(|t| t.torn))
}

/// The right to move `tag` from one version to the next; at most one exists
/// per tag. Dropping it without [`Ticket::commit`] leaves the version as it was.
#[derive(Debug)]
#[must_use = "dropping the ticket gives up the update"]
pub struct Ticket {
    tag: TagId,
    base: u64,
    done: bool,
}

/// Start an update of `tag` from version `expected`. Refused with
/// [`Error::VersionMismatch`] when the tag is at another version, and with
/// `InvalidState` while another update of the tag holds its ticket.
pub fn begin(tag: TagId, expected: u64) -> Result<Ticket> {
    tag::check(tag)?;
    let mut r = registry();
    let t = entry(&mut r, tag);
    if t.busy {
        return Err(Error::InvalidState(format!(
            "another update of tag {} is running: one update of a tag at a time",
            tag::name_of(tag)
        )));
    }
    if t.version != expected {
        return Err(Error::VersionMismatch {
            tag: tag::name_of(tag),
            expected,
            current: t.version,
        });
    }
    t.busy = true;
    Ok(Ticket {
        tag,
        base: expected,
        done: false,
    })
}

impl Ticket {
    /// The tag this ticket moves.
    pub fn tag(&self) -> TagId {
        self.tag
    }

    /// The version the update replaces.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Every destination holds the new weights: move the tag to `base + 1`,
    /// clear its torn mark and tell the watchers. Returns the new version.
    pub fn commit(mut self) -> u64 {
        self.done = true;
        let v = self.base + 1;
        let watchers = {
            let mut r = registry();
            let t = entry(&mut r, self.tag);
            t.version = v;
            t.busy = false;
            t.torn = false;
            watchers_of(&r, self.tag)
        };
        for w in watchers {
            w(self.tag, v);
        }
        v
    }

    /// The update wrote destinations and could not finish: mark the tag torn
    /// (its version stays) and give up the ticket.
    pub fn tear(mut self) {
        self.done = true;
        let mut r = registry();
        let t = entry(&mut r, self.tag);
        t.torn = true;
        t.busy = false;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if !self.done {
            entry(&mut registry(), self.tag).busy = false;
        }
    }
}

/// Announce that `tag`'s weights were rewritten in place by other means (a
/// load of a new checkpoint into the same tensors): the version moves by one
/// and watchers are told. Refused with `InvalidState` while an update of the
/// tag runs. Returns the new version.
pub fn publish(tag: TagId) -> Result<u64> {
    tag::check(tag)?;
    let (v, watchers) = {
        let mut r = registry();
        let t = entry(&mut r, tag);
        if t.busy {
            return Err(Error::InvalidState(format!(
                "an update of tag {} is running: publish once it has returned",
                tag::name_of(tag)
            )));
        }
        t.version += 1;
        let v = t.version;
        (v, watchers_of(&r, tag))
    };
    for w in watchers {
        w(tag, v);
    }
    Ok(v)
}

fn watchers_of(r: &Registry, tag: TagId) -> Vec<Watcher> {
    r.watchers
        .iter()
        .filter(|(_, t, _)| *t == tag)
        .map(|(_, _, w)| w.clone())
        .collect()
}

/// Call `watcher` with every new version of `tag` until [`unwatch`].
pub fn watch(tag: TagId, watcher: Watcher) -> Result<WatchId> {
    tag::check(tag)?;
    let mut r = registry();
    r.next_watch += 1;
    let id = WatchId(r.next_watch);
    r.watchers.push((id, tag, watcher));
    Ok(id)
}

/// Stop calling a watcher. A call already running may still finish.
pub fn unwatch(id: WatchId) {
    registry().watchers.retain(|(w, _, _)| *w != id);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    #[test]
    fn a_ticket_moves_the_version_once_and_only_from_its_base() {
        let tag = tag::id("versions-unit-ticket").unwrap();
        let base = current(tag).unwrap();
        let seen = Arc::new(AtomicU64::new(0));
        let s = seen.clone();
        let w = watch(tag, Arc::new(move |_, v| s.store(v, Ordering::SeqCst))).unwrap();
        let t = begin(tag, base).unwrap();
        assert!(matches!(begin(tag, base), Err(Error::InvalidState(_))));
        assert!(publish(tag).is_err());
        assert_eq!(t.commit(), base + 1);
        assert_eq!(seen.load(Ordering::SeqCst), base + 1);
        let e = begin(tag, base).unwrap_err();
        assert!(matches!(e, Error::VersionMismatch { current, .. } if current == base + 1));
        drop(begin(tag, base + 1).unwrap());
        assert_eq!(current(tag).unwrap(), base + 1);
        begin(tag, base + 1).unwrap().tear();
        assert!(is_torn(tag).unwrap());
        assert_eq!(publish(tag).unwrap(), base + 2);
        unwatch(w);
        assert_eq!(seen.load(Ordering::SeqCst), base + 2);
        assert!(current(TagId(u32::MAX)).is_err());
    }
}
