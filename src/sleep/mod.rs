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
//! - Reload keeps no backup; at wake the tag's [`ReloadSource`](reload::ReloadSource)s (the loader's
//!   executed plans) write the bytes again from the checkpoint.
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
pub mod reload;

pub use engine::*;
