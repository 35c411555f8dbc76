//! Sleep and wake: release the physical memory behind live allocations and
//! bring it back at the same addresses.
//!
//! Per segment, a state machine (`SleepState` on the segment):
//! `Awake -> {Offloaded | Discarded | Reloadable} -> Awake`. Sleeping an asleep
//! segment and waking an awake one are no-ops. The VA reservation is never
//! touched, so every pointer stays valid across any number of cycles.
//!
//! - Offload copies the contents into a pinned host backup (a [`BackupArena`](backup::BackupArena)
//!   that persists across cycles), then unmaps and releases.
//! - Discard waits for queued work, then unmaps and releases.
//! - Reload keeps in the host backup only the bytes no reload source covers
//!   (model buffers, later allocations, padding); at wake the tag's
//!   [`ReloadSource`](reload::ReloadSource)s (the loader's executed plans) write the rest again from
//!   the checkpoint, after checking it is unchanged. A source stops covering a
//!   block once it is freed, so nothing stale is replayed.
//! - The pool lock is not held across copies and reloads: a tag in transition
//!   is marked, its allocations are refused, other tags carry on.
//!
//! Wake is transactional: it compares the bytes it needs with the device's
//! free memory before mapping anything, and if a create or map still fails
//! midway, every chunk it mapped is unmapped again, the segments stay asleep
//! with their backups intact, and a later wake can succeed.
//!
//! Speed: copies are cut into pieces issued round-robin on several streams;
//! at sleep, creating the next backup slab overlaps the copies already queued,
//! and at wake, creating and mapping chunk k+1 overlaps copying chunk k.

pub mod backup;
mod engine;
pub mod proof;
pub mod ranges;
pub mod reload;

pub use engine::*;
