//! The bookkeeping behind one host driver: its physical handles,
//! reservations and mappings, and the live-object counts tests check.

use std::collections::{BTreeMap, HashMap};

use super::HostDriver;

/// Live objects of the host backend, for leak checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostCounts {
    /// VA reservations not yet freed.
    pub reservations: usize,
    /// Physical handles not yet released.
    pub handles: usize,
    /// Mapped ranges.
    pub mappings: usize,
    /// Bytes of physical memory counted against the limit (created, and released-but-mapped).
    pub physical_bytes: u64,
    /// Streams not yet destroyed.
    pub streams: usize,
    /// Events not yet destroyed.
    pub events: usize,
}

/// One physical handle: a memfd, or an imported descriptor.
#[derive(Debug)]
pub(super) struct Phys {
    pub(super) fd: libc::c_int,
    pub(super) size: usize,
    pub(super) released: bool,
    pub(super) maps: usize,
    /// Counted against the memory limit: created here, not imported.
    pub(super) counted: bool,
}

/// Everything one driver has made and not yet returned.
#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) reservations: BTreeMap<u64, usize>,
    pub(super) handles: HashMap<u64, Phys>,
    /// va -> (size, handle id)
    pub(super) mappings: BTreeMap<u64, (usize, u64)>,
    pub(super) physical_bytes: u64,
    pub(super) memory_limit: u64,
    pub(super) next_handle: u64,
    /// Hand out the lowest free handle id instead of a new one, as a CUDA
    /// driver may give a released handle's value to the next allocation.
    pub(super) reuse_handle_ids: bool,
    pub(super) next_stream: u64,
    pub(super) next_event: u64,
    pub(super) streams: usize,
    pub(super) events: usize,
}

impl State {
    /// Forget handle `id` once it is released and unmapped, returning its
    /// bytes to the limit.
    pub(super) fn drop_phys_if_done(s: &mut State, id: u64) {
        let done = s
            .handles
            .get(&id)
            .is_some_and(|p| p.released && p.maps == 0);
        if done {
            if let Some(p) = s.handles.remove(&id) {
                if p.counted {
                    s.physical_bytes -= p.size as u64;
                }
            }
        }
    }
}

impl HostDriver {
    /// Live objects, for leak checks in tests.
    pub fn counts(&self) -> HostCounts {
        let s = self.state();
        HostCounts {
            reservations: s.reservations.len(),
            handles: s.handles.values().filter(|p| !p.released).count(),
            mappings: s.mappings.len(),
            physical_bytes: s.physical_bytes,
            streams: s.streams,
            events: s.events,
        }
    }
}
