//! Bad input and failures change nothing: double free, unknown pointers,
//! out of memory at the host limit, injected driver failures.

use crate::common;

use common::pool::*;
use vmmweights::driver::host::FaultOp;
use vmmweights::{tag, Error, Mode, Pool};

#[test]
fn double_free_and_unknown_pointers_leave_state_unchanged() {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let t = tag::id("err-free").unwrap();
    let a = pool.alloc_tagged(4096, t).unwrap();
    let b = pool.alloc_tagged(4096, t).unwrap();
    pool.free(a.ptr).unwrap();
    let before = pool.report();
    let blocks = pool.live_blocks();
    for (ptr, why) in [
        (a.ptr, "already freed"),
        (b.ptr + 512, "not the start of a block"),
        (0x10, "not inside any segment"),
        (u64::MAX - 7, "not inside any segment"),
    ] {
        match pool.free(ptr) {
            Err(e @ Error::UnknownPointer { .. }) => {
                assert!(e.to_string().contains(why), "{e}");
                assert!(e.to_string().contains(&format!("{ptr:#x}")), "{e}");
            }
            other => panic!("free({ptr:#x}) gave {other:?}"),
        }
        assert!(pool.free_segment(ptr).is_err());
    }
    // free_segment refuses pool blocks; free refuses nothing it handed out.
    assert!(matches!(
        pool.free_segment(b.ptr),
        Err(Error::UnknownPointer { .. })
    ));
    assert_eq!(pool.report(), before);
    assert_eq!(pool.live_blocks(), blocks);
    pool.check_invariants().unwrap();
    assert!(matches!(
        pool.alloc_tagged(0, t),
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        pool.alloc_tagged(10, vmmweights::TagId(777_777)),
        Err(Error::UnknownTag(_))
    ));
    pool.free(b.ptr).unwrap();
}

#[test]
fn out_of_memory_at_the_host_limit_returns_the_error_and_leaks_nothing() {
    let host = host(16 * G as u64);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let t = tag::id("err-oom").unwrap();
    let mut held = Vec::new();
    let err = loop {
        match pool.alloc_tagged(3 * G, t) {
            Ok(b) => held.push(b),
            Err(e) => break e,
        }
        assert!(held.len() < 100, "the limit was never hit");
    };
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert_eq!(held.len(), 5, "16 granules hold five 3-granule segments");
    pool.check_invariants().unwrap();
    let r = pool.report();
    assert_eq!(r.total.live_bytes, 5 * 3 * G as u64);
    // Cached memory is given back and retried before out-of-memory is reported:
    // free everything (cached, still tracked), then ask for one big block.
    for b in held.drain(..) {
        pool.free(b.ptr).unwrap();
    }
    assert_eq!(
        pool.report().total.tracked_bytes,
        15 * G as u64,
        "cached, not released"
    );
    let big = pool.alloc_tagged(14 * G, t).unwrap();
    assert_eq!(pool.report().total.tracked_bytes, 14 * G as u64);
    pool.free(big.ptr).unwrap();
    // Dedicated segments (the PyTorch path) too.
    let seg = pool.alloc_segment(10 * G, t).unwrap();
    assert!(pool
        .alloc_segment(10 * G, t)
        .unwrap_err()
        .is_out_of_memory());
    pool.free_segment(seg.ptr).unwrap();
    pool.trim().unwrap();
    drop(pool);
    let c = host.counts();
    assert_eq!(
        (c.reservations, c.handles, c.mappings, c.physical_bytes),
        (0, 0, 0, 0),
        "{c:?}"
    );
}

#[test]
fn injected_driver_failures_change_nothing() {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let t = tag::id("err-inject").unwrap();
    let arena = tag::id("err-inject-arena").unwrap();
    pool.set_tag_mode(
        arena,
        Mode::Arena {
            reserve_bytes: 64 * G,
            grow_step: 0,
        },
    )
    .unwrap();
    let keep = pool.alloc_tagged(100, t).unwrap();
    let first = pool.alloc_tagged(G, arena).unwrap();
    for op in [
        FaultOp::Reserve,
        FaultOp::Create,
        FaultOp::Map,
        FaultOp::SetAccess,
    ] {
        let before = pool.report();
        let counts = host.counts();
        host.fail_nth(op, 1);
        let r = pool.alloc_tagged(5 * G, t);
        host.clear_faults();
        assert!(r.is_err(), "{op:?}: allocation should fail");
        assert_eq!(pool.report(), before, "{op:?}");
        assert_eq!(host.counts(), counts, "{op:?}");
        pool.check_invariants().unwrap();
        if op != FaultOp::Reserve {
            // The arena exists already: growing it fails in commit and is undone.
            host.fail_nth(op, 1);
            let r = pool.alloc_tagged(3 * G, arena);
            host.clear_faults();
            assert!(r.is_err(), "{op:?}: arena growth should fail");
            assert_eq!(pool.report(), before, "{op:?} (arena)");
            pool.check_invariants().unwrap();
        }
    }
    pool.free(keep.ptr).unwrap();
    pool.free(first.ptr).unwrap();
}

#[test]
fn sleep_and_wake_refuse_a_tag_the_pool_never_held() {
    let host = host(1 << 30);
    let pool = Pool::new(dyn_driver(&host), small_config()).unwrap();
    let weights = tag::id("known-weights").unwrap();
    let typo = tag::id("known-weigths").unwrap();
    let b = pool.alloc_tagged(4096, weights).unwrap();
    let before = pool.report();
    for err in [
        pool.sleep(&[
            (weights, vmmweights::sleep::Policy::Offload),
            (typo, vmmweights::sleep::Policy::Offload),
        ])
        .unwrap_err(),
        pool.wake(&[typo]).unwrap_err(),
    ] {
        assert!(matches!(err, Error::UnknownTag(_)), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("known-weigths") && msg.contains("known-weights"),
            "{msg}"
        );
    }
    assert_eq!(pool.report(), before, "nothing slept");
    assert!(!pool.is_tag_asleep(weights));
    // A tag whose memory was freed is still known: sleeping it is a no-op, not an error.
    pool.free(b.ptr).unwrap();
    pool.trim().unwrap();
    pool.sleep(&[(weights, vmmweights::sleep::Policy::Discard)])
        .unwrap();
    pool.wake(&[weights]).unwrap();
}
