//! Conversion scratch segments the driver would not take back.
//!
//! Each execution that converts allocates a small device scratch segment and
//! gives it back at the end with [`Segment::close`]. The copies into it have
//! completed by then, so a refused unmap or release is the driver's alone:
//! the load's bytes are whole, and failing the load would misreport it. The
//! segment is kept here instead (its reservation with it, so the range is
//! never reused), counted by [`unreleased_scratch`], and every later
//! execution on the same driver retries.

use std::sync::{Arc, Mutex};

use crate::driver::Driver;
use crate::segment::Segment;

static KEPT: Mutex<Vec<Segment>> = Mutex::new(Vec::new());

fn kept() -> std::sync::MutexGuard<'static, Vec<Segment>> {
    KEPT.lock().unwrap_or_else(|p| p.into_inner())
}

/// Give `seg` back, or keep it for a later retry when the driver refuses.
pub(super) fn give_back(seg: Segment) {
    if let Err(refusal) = seg.close() {
        kept().push(refusal.0);
    }
}

/// Retry the segments kept for `driver`.
pub(super) fn retry(driver: &Arc<dyn Driver>) {
    let mine: Vec<Segment> = {
        let mut g = kept();
        if g.is_empty() {
            return;
        }
        let (mine, others) = std::mem::take(&mut *g)
            .into_iter()
            .partition(|s| Arc::ptr_eq(s.driver(), driver));
        *g = others;
        mine
    };
    for seg in mine {
        give_back(seg);
    }
}

/// Scratch segments of `driver` kept because it refused to take them back,
/// and the physical bytes they hold (mapped, or unmapped with a failed release).
pub fn unreleased_scratch(driver: &Arc<dyn Driver>) -> (usize, u64) {
    let g = kept();
    let mine = g.iter().filter(|s| Arc::ptr_eq(s.driver(), driver));
    mine.fold((0, 0), |(n, bytes), s| {
        (
            n + 1,
            bytes + (s.mapped_bytes() + s.unreleased_bytes()) as u64,
        )
    })
}
