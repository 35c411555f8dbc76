//! Regression tests from the review of sleep/wake through the pool: each
//! reproduced a bug (lost backup, tag flagged awake while asleep, wake needing
//! memory for freed segments, stale backups after trim, empty arenas).
use std::sync::Arc;

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Mode, Pool, PoolConfig};
use vmmweights::segment::SleepState;
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag;

const G: usize = 64 << 10;

fn setup(limit: u64) -> (Arc<HostDriver>, Pool) {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: limit,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let config = PoolConfig {
        small_segment_bytes: 4 * G,
        small_request_max: 2 * G,
        large_segment_bytes: 16 * G,
        sleep: SleepOptions {
            copy_piece_bytes: 1 << 20,
            backup_slab_bytes: 4 << 20,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    };
    (h, Pool::new(d, config).unwrap())
}
fn write(d: &dyn Driver, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: `ptr` is an awake block of at least `data.len()` bytes.
    unsafe { d.copy_htod_async(ptr, data.as_ptr(), data.len(), StreamId::DEFAULT) }.unwrap();
}
fn read(d: &dyn Driver, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is an awake block of at least `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }.unwrap();
    v
}

/// An arena whose first commit failed (OOM) stays with 0 committed bytes; an
/// Offload sleep of the tag then fails with "backup of 0 bytes".
#[test]
fn f_arena_with_nothing_committed_breaks_offload_sleep() {
    let (h, pool) = setup(1 << 30);
    let t = tag::id("rv-arena0").unwrap();
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 64 * G,
            grow_step: 0,
        },
    )
    .unwrap();
    h.fail_nth(FaultOp::Create, 1);
    // first create fails -> OOM; release_cached drops the arena; retry recreates it and...
    let r = pool.alloc_tagged(4 * G, t);
    println!("alloc: {r:?}");
    h.clear_faults();
    if let Ok(b) = r {
        pool.free(b.ptr).unwrap();
    }
    // Force a state with an arena of 0 committed: fail twice.
    h.fail_nth(FaultOp::Create, 1);
    let r1 = pool.alloc_tagged(4 * G, t);
    h.fail_nth(FaultOp::Create, 1);
    let r2 = pool.alloc_tagged(4 * G, t);
    println!("r1 {r1:?} r2 {r2:?}");
    h.clear_faults();
    let other = tag::id("rv-arena0-other").unwrap();
    let _keep = pool.alloc_tagged(4 * G, other).unwrap();
    let segs: Vec<_> = pool
        .report()
        .tags
        .iter()
        .map(|u| (u.tag.clone(), u.segments, u.tracked_bytes))
        .collect();
    println!("report {segs:?}");
    let s = pool.sleep(&[(t, Policy::Offload)]);
    println!("sleep: {s:?}");
    assert!(
        s.is_ok(),
        "offload of a tag whose arena has nothing committed fails: {s:?}"
    );
}

/// Concurrent sleep and wake of the same tag can leave the tag marked awake
/// while its segments are asleep; the pool then hands out blocks in unmapped memory.
#[test]
fn f_concurrent_sleep_and_wake_leave_flag_inconsistent() {
    let (_h, pool) = setup(1 << 30);
    let pool = Arc::new(pool);
    let t = tag::id("rv-flag").unwrap();
    let b = pool.alloc_tagged(G, t).unwrap();
    pool.free(b.ptr).unwrap(); // cached free space in the tag's segment
    let _live = pool.alloc_tagged(G, t).unwrap();
    let mut bad = 0;
    for _ in 0..300 {
        std::thread::scope(|s| {
            let p1 = pool.clone();
            let p2 = pool.clone();
            s.spawn(move || {
                let _ = p1.sleep(&[(t, Policy::Discard)]);
            });
            s.spawn(move || {
                let _ = p2.wake(&[t]);
            });
        });
        let seg_asleep = pool.segment_of(_live.ptr).unwrap().sleep_state != SleepState::Awake;
        if seg_asleep && !pool.is_tag_asleep(t) {
            bad += 1;
            // allocation now succeeds from memory that is not mapped
            let nb = pool.alloc_tagged(512, t);
            println!(
                "flag awake, segment asleep; alloc -> {nb:?}, its segment state {:?}",
                nb.as_ref()
                    .ok()
                    .and_then(|b| pool.segment_of(b.ptr))
                    .map(|s| s.sleep_state)
            );
            if let Ok(nb) = nb {
                pool.free(nb.ptr).unwrap();
            }
            break;
        }
        pool.wake(&[t]).unwrap();
    }
    assert_eq!(bad, 0, "tag flagged awake while its segments sleep");
}

/// release_backup on one thread and an Offload sleep on another: the backup of
/// a segment that goes to sleep in between is freed (and unpinned).
#[test]
fn f_release_backup_races_with_sleep() {
    let (_h, pool) = setup(1 << 30);
    let pool = Arc::new(pool);
    let d = pool.driver().clone();
    let t = tag::id("rv-relbak").unwrap();
    let b = pool.alloc_tagged(8 * G, t).unwrap();
    write(d.as_ref(), b.ptr, &vec![0x42; b.size]);
    let mut lost = 0;
    for _ in 0..300 {
        // A completed cycle leaves the backup assigned to the awake segment.
        pool.sleep(&[(t, Policy::Offload)]).unwrap();
        pool.wake(&[t]).unwrap();
        std::thread::scope(|s| {
            let p1 = pool.clone();
            let p2 = pool.clone();
            s.spawn(move || {
                p1.release_backup();
            });
            s.spawn(move || {
                p2.sleep(&[(t, Policy::Offload)]).unwrap();
            });
        });
        if let Err(e) = pool.wake(&[t]) {
            println!("wake after race: {e}");
            lost += 1;
            break;
        }
        assert!(read(d.as_ref(), b.ptr, b.size).iter().all(|&x| x == 0x42));
    }
    assert_eq!(lost, 0, "an asleep segment lost its backup");
}

/// Dedicated (PyTorch) segments freed while asleep are woken (mapped and
/// copied) before being released; their bytes count against free memory.
#[test]
fn f_wake_needs_memory_for_segments_freed_while_asleep() {
    let (h, pool) = setup(16 * G as u64);
    let t = tag::id("rv-ded").unwrap();
    let a = pool.alloc_segment(8 * G, t).unwrap();
    let b = pool.alloc_segment(8 * G, t).unwrap();
    pool.sleep(&[(t, Policy::Offload)]).unwrap();
    pool.free_segment(b.ptr).unwrap(); // kept while asleep
                                       // Someone else takes half the device meanwhile.
    let o = tag::id("rv-ded-o").unwrap();
    let _x = pool.alloc_segment(8 * G, o).unwrap();
    let r = pool.wake(&[t]);
    assert!(r.is_ok(), "live bytes (8G) fit but wake wants 16G: {r:?}");
    assert_eq!(h.counts().physical_bytes, 16 * G as u64);
    pool.free_segment(a.ptr).unwrap();
}

/// A segment freed and trimmed while asleep keeps its pinned backup (and its
/// tag's host_backup_bytes) until the next sleep.
#[test]
fn f_trim_of_asleep_segment_keeps_backup() {
    let (_h, pool) = setup(1 << 30);
    let t = tag::id("rv-trim").unwrap();
    let b = pool.alloc_tagged(8 * G, t).unwrap();
    pool.sleep(&[(t, Policy::Offload)]).unwrap();
    pool.free(b.ptr).unwrap();
    let rel = pool.trim().unwrap();
    let r = pool.report();
    let u = r.tags.iter().find(|u| u.tag == "rv-trim");
    println!(
        "trim released {rel}; tag usage after trim: {:?}",
        u.map(|u| (u.segments, u.host_backup_bytes))
    );
    assert!(
        !pool.sleep_engine().backup_bytes_by_tag().contains_key(&t),
        "the trimmed segment's backup went back to the arena"
    );
    assert_eq!(u.map_or(0, |u| u.host_backup_bytes), 0);
    pool.wake(&[t]).unwrap();
}

#[test]
fn f_arena_zero_committed_after_failed_retry() {
    let (_h, pool) = setup(16 * G as u64);
    let t = tag::id("rv-arena1").unwrap();
    let other = tag::id("rv-arena1-other").unwrap();
    let x = pool.alloc_tagged(G, other).unwrap();
    pool.free(x.ptr).unwrap(); // a wholly free cached segment: the OOM retry releases it
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: 64 * G,
            grow_step: 0,
        },
    )
    .unwrap();
    let r = pool.alloc_tagged(20 * G, t);
    println!("alloc: {r:?}");
    let u: Vec<_> = pool
        .report()
        .tags
        .iter()
        .map(|u| (u.tag.clone(), u.segments, u.tracked_bytes))
        .collect();
    println!("report {u:?}");
    let s = pool.sleep(&[(t, Policy::Offload)]);
    println!("sleep: {s:?}");
    assert!(s.is_ok());
}
