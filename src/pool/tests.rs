//! Crate-internal hooks for the sleep layer: asleep tags and per-tag segment access.

use std::sync::Arc;

use super::*;
use crate::driver::host::{HostConfig, HostDriver};

fn pool() -> (Arc<HostDriver>, Pool) {
    let host = Arc::new(HostDriver::new(HostConfig {
        granularity: 64 << 10,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = host.clone();
    (host, Pool::new(d, PoolConfig::default()).unwrap())
}

#[test]
fn asleep_tags_refuse_allocation_and_free_only_updates_bookkeeping() {
    let (host, pool) = pool();
    let t = tag::id("unit-asleep").unwrap();
    let other = tag::id("unit-awake").unwrap();
    let a = pool.alloc_tagged(4096, t).unwrap();
    let seg = pool.alloc_segment(1 << 20, t).unwrap();
    let o = pool.alloc_tagged(4096, other).unwrap();

    // What the sleep layer does: unmap the tag's chunks, mark the tag asleep.
    let n = pool.with_tag_segments(t, |segs| {
        for s in segs.iter_mut() {
            s.unmap_all().unwrap();
            s.set_sleep_state(SleepState::Discarded);
        }
        segs.len()
    });
    assert_eq!(n, 2, "the small segment and the dedicated one");
    pool.set_tag_asleep(t, true);
    assert!(pool.is_tag_asleep(t));

    let e = pool.alloc_tagged(100, t).unwrap_err();
    assert!(
        matches!(e, Error::InvalidState(_)) && e.to_string().contains("unit-asleep"),
        "{e}"
    );
    assert!(pool.alloc_segment(100, t).is_err());
    assert!(
        pool.alloc_tagged(100, other).is_ok(),
        "other tags keep working"
    );

    let r = pool.report();
    let u = r.tag("unit-asleep").unwrap();
    assert!(
        u.asleep && u.tracked_bytes == 0 && u.discarded_bytes > 0,
        "{r}"
    );

    // Frees while asleep: a block only updates bookkeeping; a dedicated
    // segment (no memory behind it while asleep) is released at once, VA and all.
    let reservations = host.counts().reservations;
    pool.free(a.ptr).unwrap();
    assert_eq!(host.counts().reservations, reservations);
    pool.free_segment(seg.ptr).unwrap();
    assert_eq!(host.counts().reservations, reservations - 1);
    assert_eq!(pool.report().tag("unit-asleep").unwrap().live_bytes, 0);
    pool.check_invariants().unwrap();

    pool.with_tag_segments(t, |segs| {
        for s in segs.iter_mut() {
            s.map_all().unwrap();
            s.set_sleep_state(SleepState::Awake);
        }
    });
    pool.set_tag_asleep(t, false);
    assert_eq!(host.counts().reservations, reservations - 1);
    assert!(pool.alloc_tagged(100, t).is_ok());
    pool.free(o.ptr).unwrap();
}

#[test]
fn trim_frees_wholly_free_segments_of_asleep_tags_and_leaves_others_asleep() {
    let (host, pool) = pool();
    let t = tag::id("unit-asleep-trim").unwrap();
    let a = pool.alloc_tagged(4096, t).unwrap();
    let b = pool.alloc_tagged(8 << 20, t).unwrap();
    pool.with_tag_segments(t, |segs| {
        for s in segs.iter_mut() {
            s.unmap_all().unwrap();
            s.set_sleep_state(SleepState::Offloaded);
        }
    });
    pool.set_tag_asleep(t, true);
    pool.free(b.ptr).unwrap();
    assert_eq!(
        pool.trim().unwrap(),
        0,
        "asleep segments hold no physical memory"
    );
    let r = pool.report();
    let u = r.tag("unit-asleep-trim").unwrap();
    assert_eq!(
        u.segments, 1,
        "the wholly free segment went, the other stays: {r}"
    );
    assert_eq!(u.offloaded_bytes, u.reserved_bytes);
    pool.free(a.ptr).unwrap();
    pool.trim().unwrap();
    assert_eq!(host.counts().reservations, 0);
}
