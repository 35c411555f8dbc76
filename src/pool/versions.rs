//! Each tag's weights version in this pool, and the one update that may
//! move it at a time.
//!
//! A tag's weights start at version [`FIRST_VERSION`]. An update
//! ([`crate::update`]) names the version it replaces and, once every
//! destination holds the new bytes, moves the tag to the next one
//! ([`VersionTicket::commit`]); an owner that rewrote weights in place by
//! other means announces it with [`Pool::publish`]. Each move is passed to
//! the tag's shares ([`super::shares::TagShare::version_moved`]), so attached
//! importers see the number the owner sees.
//!
//! Versions are per pool, that is per device: each rank of a
//! tensor-parallel engine versions its own slices.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::Pool;
use crate::error::{Error, Result};
use crate::tag::{self, TagId};

/// The version of weights nobody updated yet (what a load gives).
pub const FIRST_VERSION: u64 = 1;

#[derive(Debug, Clone, Copy)]
struct TagVersion {
    version: u64,
    /// An update is between its ticket and the ticket's end.
    busy: bool,
    /// The last update failed after it wrote destinations and could not
    /// finish: they hold a mix of versions until an update succeeds.
    torn: bool,
}

impl Default for TagVersion {
    fn default() -> TagVersion {
        TagVersion {
            version: FIRST_VERSION,
            busy: false,
            torn: false,
        }
    }
}

/// The versions of a pool's tags.
#[derive(Debug, Default)]
pub(super) struct Versions(Mutex<HashMap<TagId, TagVersion>>);

impl Versions {
    fn lock(&self) -> MutexGuard<'_, HashMap<TagId, TagVersion>> {
        // Every change is whole fields; a panic cannot leave one half done.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The right to move one tag of one pool from one version to the next; at
/// most one exists per tag and pool. Dropping it without
/// [`VersionTicket::commit`] leaves the version as it was.
#[derive(Debug)]
#[must_use = "dropping the ticket gives up the update"]
pub struct VersionTicket<'a> {
    pool: &'a Pool,
    tag: TagId,
    base: u64,
    done: bool,
}

impl Pool {
    /// The weights version of `tag` in this pool ([`FIRST_VERSION`] until it moves).
    pub fn tag_version(&self, tag: TagId) -> Result<u64> {
        tag::check(tag)?;
        Ok(self
            .versions
            .lock()
            .get(&tag)
            .copied()
            .unwrap_or_default()
            .version)
    }

    /// True while `tag`'s destinations may hold a mix of versions: an update
    /// failed after writing and could not finish. The next successful update
    /// clears it.
    pub fn tag_torn(&self, tag: TagId) -> Result<bool> {
        tag::check(tag)?;
        Ok(self.versions.lock().get(&tag).is_some_and(|t| t.torn))
    }

    /// Start an update of `tag` from version `expected`. Refused with
    /// [`Error::VersionMismatch`] when the tag is at another version, and
    /// with `InvalidState` while another update of the tag holds its ticket.
    pub fn begin_update(&self, tag: TagId, expected: u64) -> Result<VersionTicket<'_>> {
        tag::check(tag)?;
        let mut v = self.versions.lock();
        let t = v.entry(tag).or_default();
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
        Ok(VersionTicket {
            pool: self,
            tag,
            base: expected,
            done: false,
        })
    }

    /// Announce that `tag`'s weights were rewritten in place by other means
    /// than an update (a load of a new checkpoint into the same tensors):
    /// the version moves by one and the tag's shares are told. Refused with
    /// `InvalidState` while an update of the tag runs. Returns the new version.
    pub fn publish(&self, tag: TagId) -> Result<u64> {
        tag::check(tag)?;
        let v = {
            let mut v = self.versions.lock();
            let t = v.entry(tag).or_default();
            if t.busy {
                return Err(Error::InvalidState(format!(
                    "an update of tag {} is running: publish once it has returned",
                    tag::name_of(tag)
                )));
            }
            t.version += 1;
            t.version
        };
        self.shares.lock().version_moved(tag, v);
        Ok(v)
    }

    /// Move `tag`'s version by one without telling its shares: a share
    /// revoking its importers (it tells them itself, holding the gate).
    pub(crate) fn advance_version_for_revoke(&self, tag: TagId) -> u64 {
        let mut v = self.versions.lock();
        let t = v.entry(tag).or_default();
        t.version += 1;
        t.version
    }
}

impl VersionTicket<'_> {
    /// The tag this ticket moves.
    pub fn tag(&self) -> TagId {
        self.tag
    }

    /// The version the update replaces.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Every destination holds the new weights: move the tag to `base + 1`,
    /// clear its torn mark and tell its shares. Returns the new version.
    pub fn commit(mut self) -> u64 {
        self.done = true;
        let v = self.base + 1;
        {
            let mut m = self.pool.versions.lock();
            let t = m.entry(self.tag).or_default();
            t.version = v;
            t.busy = false;
            t.torn = false;
        }
        self.pool.shares.lock().version_moved(self.tag, v);
        v
    }

    /// The update wrote destinations and could not finish: mark the tag torn
    /// (its version stays) and give up the ticket.
    pub fn tear(mut self) {
        self.done = true;
        let mut m = self.pool.versions.lock();
        let t = m.entry(self.tag).or_default();
        t.torn = true;
        t.busy = false;
    }
}

impl Drop for VersionTicket<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.pool.versions.lock().entry(self.tag).or_default().busy = false;
        }
    }
}
