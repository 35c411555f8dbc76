//! A free, trim, allocation retry, arena trim or sleep whose unmap or release
//! the driver refuses: the failure is visible and safe.
//! - the call returns the driver's error, naming the segment and its tag;
//! - the segment keeps its reservation (no later allocation overlaps it) and
//!   the memory the driver still holds;
//! - the pool report counts it (`leaked_bytes`, `leaked_segments`,
//!   `leaked_reserved_bytes`), outside every tag's figures;
//! - a trim after the fault clears gives everything back: the report counts
//!   nothing and the host backend holds only the live blocks.

use crate::common;

use std::sync::Arc;

use common::pool::*;
use vmmweights::driver::host::{FaultOp, HostCounts, HostDriver};
use vmmweights::{tag, Error, Mode, Pool, TagId};

fn setup(name: &str) -> (Arc<HostDriver>, Pool, TagId) {
    let host = host(64 << 20);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    (host, pool, tag::id(name).unwrap())
}

/// The error is the injected driver failure and names the segment and tag.
fn names_segment(e: &Error, base: u64, t: TagId) {
    let s = e.to_string();
    assert!(matches!(e, Error::Driver { .. }), "not a driver error: {s}");
    assert!(s.contains("injected failure"), "{s}");
    assert!(s.contains(&format!("{base:#x}")), "segment not named: {s}");
    assert!(s.contains(&t.to_string()), "tag not named: {s}");
    assert!(s.contains("leaked_bytes"), "{s}");
}

/// Many new segments: none may land on the kept range. Returns them, for the
/// caller to free once the driver works again.
fn no_overlap(pool: &Pool, base: u64, len: usize, t: TagId) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..16 {
        let b = pool.alloc_segment(2 * G, t).unwrap();
        assert!(
            b.ptr + b.size as u64 <= base || b.ptr >= base + len as u64,
            "a new segment at {:#x} reuses the kept range {base:#x}+{len}",
            b.ptr
        );
        got.push(b.ptr);
    }
    got
}

fn nothing_leaked(host: &HostDriver, pool: &Pool, live: HostCounts) {
    let r = pool.report();
    assert_eq!(
        (r.leaked_bytes, r.leaked_segments, r.leaked_reserved_bytes),
        (0, 0, 0)
    );
    assert_eq!(pool.segments_awaiting_release(), 0);
    let c = host.counts();
    assert_eq!(
        (c.reservations, c.handles, c.mappings, c.physical_bytes),
        (
            live.reservations,
            live.handles,
            live.mappings,
            live.physical_bytes
        )
    );
    pool.check_invariants().unwrap();
}

#[test]
fn free_segment_with_a_failed_unmap_or_release_is_reported_and_retried_by_trim() {
    for op in [FaultOp::Unmap, FaultOp::Release] {
        let (host, pool, t) = setup(&format!("free-fault-{op:?}"));
        let keep = pool.alloc_tagged(4096, t).unwrap();
        let live = host.counts();
        let b = pool.alloc_segment(3 * G, t).unwrap();
        host.fail_always(op);
        let e = pool.free_segment(b.ptr).unwrap_err();
        names_segment(&e, b.ptr, t);
        // The block is freed: the pointer is no longer known.
        assert!(matches!(
            pool.free_segment(b.ptr),
            Err(Error::UnknownPointer { .. })
        ));
        assert_eq!(pool.live_blocks().len(), 1);
        let r = pool.report();
        assert_eq!(r.leaked_segments, 1, "{op:?}");
        assert_eq!(r.leaked_bytes, 3 * G as u64, "{op:?}");
        assert_eq!(r.leaked_reserved_bytes, 3 * G as u64, "{op:?}");
        assert_eq!(
            r.total.reserved_bytes,
            pool.segment_of(keep.ptr).unwrap().reserved_bytes as u64
        );
        // The reservation stays: nothing new lands on it.
        assert_eq!(host.counts().reservations, live.reservations + 1);
        let fresh = no_overlap(&pool, b.ptr, b.size, t);
        // A trim while the driver still refuses: an error, still counted.
        let e = pool.trim().unwrap_err();
        names_segment(&e, b.ptr, t);
        assert_eq!(pool.report().leaked_segments, 1);
        host.clear_faults();
        for p in fresh {
            pool.free_segment(p).unwrap();
        }
        pool.trim().unwrap();
        nothing_leaked(&host, &pool, live);
        pool.free(keep.ptr).unwrap();
    }
}

#[test]
fn free_of_a_pool_block_then_trim_with_a_failed_unmap() {
    let (host, pool, t) = setup("free-fault-trim");
    let base_counts = host.counts();
    let a = pool.alloc_tagged(40 << 10, t).unwrap();
    let base = pool.segment_of(a.ptr).unwrap().base;
    let reserved = pool.segment_of(a.ptr).unwrap().reserved_bytes;
    // A pool block's free only caches its segment: no driver call.
    host.fail_nth(FaultOp::Unmap, 1);
    pool.free(a.ptr).unwrap();
    assert!(host.fault_pending(FaultOp::Unmap));
    let e = pool.trim().unwrap_err();
    names_segment(&e, base, t);
    assert_eq!(pool.report().leaked_reserved_bytes, reserved as u64);
    assert!(pool.segment_of(a.ptr).is_none());
    for p in no_overlap(&pool, base, reserved, t) {
        pool.free_segment(p).unwrap();
    }
    // The fault fired once; the free above or this trim gave it back.
    pool.trim().unwrap();
    nothing_leaked(&host, &pool, base_counts);
}

#[test]
fn allocation_retry_after_out_of_memory_keeps_what_it_could_not_release() {
    let host = host(8 * G as u64);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let t = tag::id("free-fault-oom").unwrap();
    let base_counts = host.counts();
    // Fill the device with cached (free) segments.
    let blocks: Vec<_> = (0..2)
        .map(|_| pool.alloc_tagged(3 * G, t).unwrap())
        .collect();
    for b in &blocks {
        pool.free(b.ptr).unwrap();
    }
    host.fail_always(FaultOp::Release);
    // Needs the cached memory back; the release is refused, so the retry
    // finds no memory and the allocation fails.
    let e = pool.alloc_tagged(6 * G, t).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let r = pool.report();
    assert_eq!(r.leaked_segments, 2);
    assert_eq!(r.leaked_bytes, 6 * G as u64);
    host.clear_faults();
    // The retry gives the memory back, and the allocation then fits.
    let b = pool.alloc_tagged(6 * G, t).unwrap();
    assert_eq!(pool.report().leaked_bytes, 0);
    pool.free(b.ptr).unwrap();
    pool.trim().unwrap();
    nothing_leaked(&host, &pool, base_counts);
}

#[test]
fn arena_trim_with_a_failed_unmap_keeps_the_chunk_mapped_and_reusable() {
    let (host, pool, t) = setup("free-fault-arena");
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 16 * G,
            grow_step: G,
        },
    )
    .unwrap();
    let base_counts = host.counts();
    let a = pool.alloc_tagged(G, t).unwrap();
    let b = pool.alloc_tagged(3 * G, t).unwrap();
    pool.free(b.ptr).unwrap();
    let tracked = pool.report().total.tracked_bytes;
    host.fail_always(FaultOp::Unmap);
    assert!(pool.trim().is_err());
    // Nothing was unmapped, so the bookkeeping still counts it all.
    assert_eq!(pool.report().total.tracked_bytes, tracked);
    pool.check_invariants().unwrap();
    host.clear_faults();
    // Allocating over the tail again needs no map over a live mapping.
    let c = pool.alloc_tagged(3 * G, t).unwrap();
    fill(c.ptr, c.size, 0x5c);
    verify(c.ptr, c.size, 0x5c);
    pool.free(c.ptr).unwrap();
    pool.trim().unwrap();
    assert_eq!(pool.report().total.tracked_bytes, G as u64);
    pool.free(a.ptr).unwrap();
    pool.trim().unwrap();
    nothing_leaked(&host, &pool, base_counts);
}

#[test]
fn sleep_with_a_failed_release_counts_the_handle_until_trim() {
    let (host, pool, t) = setup("free-fault-sleep");
    let a = pool.alloc_tagged(3 * G, t).unwrap();
    fill(a.ptr, a.size, 0x33);
    host.fail_nth(FaultOp::Release, 1);
    let _ = pool.sleep(&[(t, vmmweights::sleep::Policy::Offload)]);
    host.clear_faults();
    if !pool.is_tag_asleep(t) {
        pool.sleep(&[(t, vmmweights::sleep::Policy::Offload)])
            .unwrap();
    }
    // The chunk is unmapped; its handle was refused and is still held.
    let r = pool.report();
    assert!(r.leaked_bytes > 0, "{r:?}");
    assert_eq!(r.leaked_segments, 0);
    pool.trim().unwrap();
    assert_eq!(pool.report().leaked_bytes, 0);
    pool.wake(&[t]).unwrap();
    verify(a.ptr, a.size, 0x33);
    pool.free(a.ptr).unwrap();
    pool.trim().unwrap();
    nothing_leaked(&host, &pool, HostCounts::default());
}

#[test]
fn dropping_a_pool_with_kept_segments_does_not_panic() {
    let (host, pool, t) = setup("free-fault-drop");
    let b = pool.alloc_segment(2 * G, t).unwrap();
    host.fail_nth(FaultOp::Unmap, 1);
    assert!(pool.free_segment(b.ptr).is_err());
    assert_eq!(pool.segments_awaiting_release(), 1);
    // The fault has fired: drop gives the kept segment back.
    drop(pool);
    let c = host.counts();
    assert_eq!((c.reservations, c.handles, c.mappings), (0, 0, 0));
}

#[test]
fn load_scratch_with_a_failed_unmap_is_kept_and_given_back_by_the_next_load() {
    use vmmweights::loader::{
        self, copy, Checkpoint, Control, Dtype, LoadOptions, Plan, Registry, Rules,
    };
    let (host, pool, t) = setup("free-fault-scratch");
    let driver = pool.driver().clone();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(
        &path,
        vmmweights::fuzz::tiny_safetensors(&[("w", Dtype::Bf16, &[64, 64])]),
    )
    .unwrap();
    let rules = Rules::from_json(r#"{"dtype": "F32"}"#).unwrap();
    let mut reg = Registry::new();
    {
        let _s = tag::scope(t).unwrap();
        let specs = Plan::destinations(&Checkpoint::open(&path).unwrap(), &rules).unwrap();
        reg.allocate(&specs, &pool).unwrap();
    }
    let load = || {
        loader::load(
            &driver,
            Checkpoint::open(&path).unwrap(),
            &rules,
            &reg,
            &LoadOptions::default(),
            &Control::default(),
        )
    };
    load().unwrap();
    let want: Vec<u8> = {
        let d = reg.iter().next().unwrap();
        // SAFETY: a live destination of an awake tag.
        unsafe { std::slice::from_raw_parts(d.ptr as usize as *const u8, d.bytes()) }.to_vec()
    };
    let counts = host.counts();
    // The only unmap in a converting load is its scratch's: the bytes are
    // whole, so the load succeeds and the scratch is kept, counted.
    host.fail_nth(FaultOp::Unmap, 1);
    load().unwrap();
    assert!(
        !host.fault_pending(FaultOp::Unmap),
        "the scratch unmap was not reached"
    );
    let (n, bytes) = copy::unreleased_scratch(&driver);
    assert_eq!(n, 1);
    assert!(bytes > 0);
    assert_eq!(host.counts().reservations, counts.reservations + 1);
    // The next converting load on this driver gives it back.
    load().unwrap();
    assert_eq!(copy::unreleased_scratch(&driver), (0, 0));
    assert_eq!(host.counts(), counts);
    let d = reg.iter().next().unwrap();
    // SAFETY: as above.
    let got = unsafe { std::slice::from_raw_parts(d.ptr as usize as *const u8, d.bytes()) };
    assert_eq!(got, &want[..]);
}
