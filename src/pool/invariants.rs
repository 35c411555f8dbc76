//! The pool's internal invariants, checked by the tests after every step.

use std::collections::BTreeSet;

use super::{Pool, SegmentClass};
use crate::driver::DevicePtr;
use crate::segment::SleepState;
use crate::tag::TagId;

impl Pool {
    /// Check the pool's internal invariants; an error string names the first broken one.
    /// For tests: blocks tile every segment, the free index matches the free
    /// blocks, live counters match, no two segments overlap, every live block
    /// has an identity of its own.
    pub fn check_invariants(&self) -> std::result::Result<(), String> {
        let st = self.lock();
        let mut expected_free: BTreeSet<(TagId, SegmentClass, usize, DevicePtr, usize)> =
            BTreeSet::new();
        let mut prev_end = 0u64;
        let mut ids = BTreeSet::new();
        for (&base, e) in &st.segs {
            if base < prev_end {
                return Err(format!("segment {base:#x} overlaps the previous one"));
            }
            prev_end = base + e.seg.reserved() as u64;
            if e.seg.ptr() != base || e.blocks.total() != e.seg.reserved() {
                return Err(format!("segment {base:#x}: block map does not cover it"));
            }
            let (mut at, mut live, mut n, mut prev_free) = (0usize, 0usize, 0usize, false);
            for (off, b) in e.blocks.iter() {
                if off != at {
                    return Err(format!("segment {base:#x}: gap or overlap at offset {off}"));
                }
                if b.live {
                    live += b.size;
                    n += 1;
                    if b.id.0 == 0 || !ids.insert(b.id) {
                        return Err(format!(
                            "segment {base:#x}: live block at {off} has identity {} (missing or repeated)",
                            b.id
                        ));
                    }
                    if e.class == SegmentClass::Arena
                        && off + b.size > e.seg.committed()
                        && e.seg.sleep_state() == SleepState::Awake
                    {
                        return Err(format!(
                            "arena {base:#x}: live block at {off} (+{}) beyond committed {}",
                            b.size,
                            e.seg.committed()
                        ));
                    }
                } else {
                    if prev_free {
                        return Err(format!("segment {base:#x}: adjacent free blocks at {off}"));
                    }
                    let indexed = e.class != SegmentClass::Dedicated;
                    if indexed {
                        expected_free.insert((e.tag, e.class, b.size, base, off));
                    }
                }
                prev_free = !b.live;
                at += b.size;
            }
            if live != e.live_bytes || n != e.live_blocks {
                return Err(format!(
                    "segment {base:#x}: live counters {}/{} but blocks say {live}/{n}",
                    e.live_bytes, e.live_blocks
                ));
            }
        }
        let actual: BTreeSet<_> = st
            .free
            .iter()
            .flat_map(|(&(t, c), set)| set.iter().map(move |&(s, b, o)| (t, c, s, b, o)))
            .collect();
        if actual != expected_free {
            return Err(format!(
                "free index differs from the free blocks: index has {} entries {:?}, blocks {} {:?}",
                actual.len(),
                actual.difference(&expected_free).collect::<Vec<_>>(),
                expected_free.len(),
                expected_free.difference(&actual).collect::<Vec<_>>(),
            ));
        }
        Ok(())
    }
}
