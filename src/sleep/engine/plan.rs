//! The one snapshot a transition takes of its tag's segments, under the
//! caller's lock, and what each segment keeps on the host per policy.

use super::options::Policy;
use super::TagSegments;
use crate::driver::{CreateFlags, DevicePtr, PeerAccess};
use crate::segment::{Chunk, Segment, SleepState};
use crate::sleep::ranges;

/// What a sleep or wake knows about one segment between its locked steps.
#[derive(Debug)]
pub(super) struct SegTodo {
    pub(super) ptr: DevicePtr,
    pub(super) committed: usize,
    pub(super) state: SleepState,
    pub(super) chunks: Vec<Chunk>,
    /// The segment's peer grant, set again on every chunk mapped at wake.
    pub(super) peers: Vec<PeerAccess>,
    /// How the segment's chunks are created, again at wake (RDMA-capable or not).
    pub(super) flags: CreateFlags,
}

/// Which transition a snapshot is for, and so which segments it takes in.
#[derive(Debug, Clone, Copy)]
pub(super) enum Transition {
    /// The awake segments, and those an earlier failed sleep left partly mapped.
    Sleep,
    /// The asleep segments, their unmapped chunks first re-cut into chunks of
    /// `coalesce` bytes.
    Wake { coalesce: usize },
}

/// Take the snapshot of the segments of `segs` that `transition` changes, in
/// `segs`' order, under one call of `segs`.
pub(super) fn snapshot(segs: TagSegments<'_>, transition: Transition) -> Vec<SegTodo> {
    let mut todo = Vec::new();
    segs(&mut |ss| {
        for seg in ss.iter_mut() {
            let take = match transition {
                Transition::Sleep => {
                    seg.sleep_state() == SleepState::Awake || seg.mapped_bytes() > 0
                }
                Transition::Wake { coalesce } => {
                    let asleep = seg.sleep_state() != SleepState::Awake;
                    if asleep {
                        seg.rechunk_unmapped(coalesce);
                    }
                    asleep
                }
            };
            if take {
                todo.push(SegTodo::of(seg));
            }
        }
    });
    todo
}

impl SegTodo {
    fn of(seg: &Segment) -> SegTodo {
        SegTodo {
            ptr: seg.ptr(),
            committed: seg.committed(),
            state: seg.sleep_state(),
            chunks: seg.chunks().to_vec(),
            peers: seg.peers().to_vec(),
            flags: seg.create_flags(),
        }
    }

    /// Bytes of its chunks that have no physical memory.
    pub(super) fn unmapped_bytes(&self) -> u64 {
        self.chunks
            .iter()
            .filter(|c| c.handle.is_none())
            .map(|c| c.size as u64)
            .sum()
    }

    /// The segment ranges `(offset, len)` a sleep with `policy` keeps in the
    /// host backup: for Reload, the bytes of `in_use` (`None`: every
    /// committed byte) that `coverage` (what the tag's reload sources
    /// restore) leaves out.
    pub(super) fn host_keep(
        &self,
        policy: Policy,
        coverage: &[(DevicePtr, usize)],
        in_use: Option<&[(DevicePtr, usize)]>,
    ) -> Vec<(usize, usize)> {
        // A segment an earlier sleep left partly mapped has its backup
        // already and only unmaps.
        if self.state != SleepState::Awake || self.committed == 0 {
            return Vec::new();
        }
        match policy {
            Policy::Offload | Policy::OffloadCompressed => vec![(0, self.committed)],
            Policy::Discard => Vec::new(),
            Policy::Reload => {
                let mut rest = match in_use {
                    None => vec![(self.ptr, self.committed)],
                    Some(u) => ranges::intersect(u, self.ptr, self.committed),
                };
                for &(a, l) in &ranges::intersect(coverage, self.ptr, self.committed) {
                    rest = ranges::subtract(&rest, a, l);
                }
                rest.iter()
                    .map(|&(a, l)| ((a - self.ptr) as usize, l))
                    .collect()
            }
        }
    }
}
