//! Sleep/wake through the pool on the host backend: tags, policies, report,
//! transactional wake, concurrency; and the hazards that must not come back (lost
//! backups, a tag flagged awake while asleep, wake needing memory for freed
//! segments, stale backups after trim, empty arenas).

use std::sync::Arc;

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Mode, Pool, PoolConfig};
use vmmweights::segment::SleepState;
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag;
use vmmweights::Error;

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

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn write(d: &dyn Driver, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: `ptr` is a live awake block of at least `data.len()` bytes.
    unsafe { d.copy_htod_async(ptr, data.as_ptr(), data.len(), StreamId::DEFAULT) }.unwrap();
}

fn read(d: &dyn Driver, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }.unwrap();
    v
}

#[test]
fn weights_offload_and_cache_discard_over_cycles() {
    let (h, pool) = setup(1 << 30);
    let d = pool.driver().clone();
    let weights = tag::id("test-sleep-weights").unwrap();
    let cache = tag::id("test-sleep-cache").unwrap();
    pool.set_tag_mode(
        cache,
        Mode::Arena {
            reserve_bytes: 64 << 20,
            grow_step: 4 * G,
        },
    )
    .unwrap();
    let mut rng = Rng(42);
    let mut blocks: Vec<(DevicePtr, Vec<u8>)> = Vec::new();
    let mut cache_blocks = Vec::new();
    // A cached default-tag segment exists from the start, so the allocation
    // made while asleep below does not change the physical total.
    let warm = pool.alloc(1000).unwrap();
    pool.free(warm.ptr).unwrap();
    for cycle in 0..8 {
        // Interleaved allocations of random sizes in both tags.
        for _ in 0..6 {
            let size = 1 + (rng.next() % (40 * G as u64)) as usize;
            let b = pool.alloc_tagged(size, weights).unwrap();
            let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
            write(d.as_ref(), b.ptr, &data);
            blocks.push((b.ptr, data));
            let c = pool
                .alloc_tagged(1 + (rng.next() % (8 * G as u64)) as usize, cache)
                .unwrap();
            cache_blocks.push(c);
        }
        if cycle % 2 == 1 {
            let (p, _) = blocks.swap_remove((rng.next() % blocks.len() as u64) as usize);
            pool.free(p).unwrap();
        }
        let before = pool.report();
        let tracked_w = before.tag("test-sleep-weights").unwrap().tracked_bytes;
        let tracked_c = before.tag("test-sleep-cache").unwrap().tracked_bytes;
        assert!(tracked_w > 0 && tracked_c > 0);
        let phys_before = h.counts().physical_bytes;

        let r = pool
            .sleep(&[(weights, Policy::Offload), (cache, Policy::Discard)])
            .unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            h.counts().physical_bytes,
            phys_before - tracked_w - tracked_c,
            "both tags' physical memory released"
        );
        let rep = pool.report();
        let w = rep.tag("test-sleep-weights").unwrap();
        assert!(w.asleep);
        assert_eq!(w.tracked_bytes, 0);
        assert_eq!(w.offloaded_bytes, tracked_w);
        assert!(w.host_backup_bytes >= tracked_w);
        let c = rep.tag("test-sleep-cache").unwrap();
        assert_eq!(c.discarded_bytes, tracked_c);
        assert_eq!(c.host_backup_bytes, 0);
        assert_eq!(
            w.live_bytes,
            before.tag("test-sleep-weights").unwrap().live_bytes
        );

        // No block from memory that is not there.
        let e = pool.alloc_tagged(100, weights).unwrap_err();
        assert!(matches!(e, Error::InvalidState(_)), "{e}");
        // Other tags still work while these sleep.
        let other = pool.alloc(1000).unwrap();
        pool.free(other.ptr).unwrap();
        // Sleeping again is a no-op.
        let again = pool.sleep(&[(weights, Policy::Offload)]).unwrap();
        assert_eq!(again[0].report.segments, 0);

        let woke = pool.wake(&[]).unwrap();
        assert_eq!(woke.len(), 2);
        assert_eq!(h.counts().physical_bytes, phys_before);
        for (p, data) in &blocks {
            assert!(
                &read(d.as_ref(), *p, data.len()) == data,
                "weights byte for byte, cycle {cycle}"
            );
        }
        for c in &cache_blocks {
            // Discarded memory comes back mapped: writable and readable.
            write(d.as_ref(), c.ptr, &vec![7u8; c.size]);
        }
        pool.check_invariants().unwrap();
        // New contents for the next round, so a stale backup would show.
        for (p, data) in blocks.iter_mut() {
            for b in data.iter_mut() {
                *b = b.wrapping_add(1);
            }
            write(d.as_ref(), *p, data);
        }
    }
    for (p, _) in blocks {
        pool.free(p).unwrap();
    }
    for c in cache_blocks {
        pool.free(c.ptr).unwrap();
    }
    pool.trim().unwrap();
    // The freed segments' backups were unpinned as the segments went;
    // whatever else the arena keeps goes on request, and then nothing is left.
    pool.release_backup();
    assert_eq!(pool.release_backup(), 0, "backup unpinned on request");
    drop(pool);
    let c = h.counts();
    assert_eq!((c.reservations, c.handles, c.mappings), (0, 0, 0));
}

#[test]
fn wake_out_of_memory_keeps_state_and_a_later_wake_succeeds() {
    let (h, pool) = setup(256 << 20);
    let d = pool.driver().clone();
    let t = tag::id("test-sleep-oom").unwrap();
    let blocks: Vec<_> = (0..4)
        .map(|i| {
            let b = pool.alloc_tagged(3 << 20, t).unwrap();
            write(d.as_ref(), b.ptr, &vec![i as u8 + 1; b.size]);
            b
        })
        .collect();
    pool.sleep(&[(t, Policy::Offload)]).unwrap();
    let asleep = pool.report();

    // Someone else took the memory: wake refuses before mapping anything.
    h.set_memory_limit(4 << 20);
    let e = pool.wake(&[t]).unwrap_err();
    let msg = e.to_string();
    assert!(e.is_out_of_memory(), "{msg}");
    assert!(msg.contains("test-sleep-oom"), "names the tag: {msg}");
    assert_eq!(h.counts().physical_bytes, 0);

    // Enough on paper, but creation fails midway: rolled back.
    h.set_memory_limit(256 << 20);
    h.fail_nth(FaultOp::Create, 3);
    pool.wake(&[t]).unwrap_err();
    assert_eq!(h.counts().physical_bytes, 0);
    let still = pool.report();
    let (a, b) = (
        asleep.tag("test-sleep-oom").unwrap(),
        still.tag("test-sleep-oom").unwrap(),
    );
    assert_eq!(
        (a.offloaded_bytes, a.host_backup_bytes, b.asleep),
        (b.offloaded_bytes, b.host_backup_bytes, true)
    );

    pool.wake(&[t]).unwrap();
    for (i, b) in blocks.iter().enumerate() {
        assert!(read(d.as_ref(), b.ptr, b.size)
            .iter()
            .all(|&x| x == i as u8 + 1));
    }
}

#[test]
fn reload_without_a_source_is_refused_and_changes_nothing() {
    let (h, pool) = setup(1 << 30);
    let t = tag::id("test-sleep-noreload").unwrap();
    let b = pool.alloc_tagged(G, t).unwrap();
    let phys = h.counts().physical_bytes;
    let e = pool.sleep(&[(t, Policy::Reload)]).unwrap_err();
    assert!(matches!(e, Error::InvalidState(_)), "{e}");
    assert!(e.to_string().contains("test-sleep-noreload"), "{e}");
    assert!(!pool.is_tag_asleep(t));
    assert_eq!(h.counts().physical_bytes, phys);
    pool.free(b.ptr).unwrap();
}

#[test]
fn unknown_tag_is_an_error() {
    let (_h, pool) = setup(1 << 30);
    let e = pool
        .sleep(&[(tag::TagId(u32::MAX - 1), Policy::Discard)])
        .unwrap_err();
    assert!(matches!(e, Error::UnknownTag(_)), "{e}");
    assert!(matches!(
        pool.wake(&[tag::TagId(u32::MAX - 1)]),
        Err(Error::UnknownTag(_))
    ));
}

#[test]
fn concurrent_sleep_wake_and_allocation_from_threads() {
    let (h, pool) = setup(1 << 30);
    let pool = Arc::new(pool);
    let d = pool.driver().clone();
    let tags: Vec<_> = (0..3)
        .map(|i| tag::id(&format!("test-sleep-conc-{i}")).unwrap())
        .collect();
    let blocks: Vec<_> = tags
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let b = pool.alloc_tagged(5 * G, t).unwrap();
            write(d.as_ref(), b.ptr, &vec![i as u8 + 10; b.size]);
            b
        })
        .collect();
    std::thread::scope(|s| {
        // Two threads cycle every tag at once; sleeping an asleep tag and waking
        // an awake one must be harmless.
        for _ in 0..2 {
            let pool = pool.clone();
            let tags = tags.clone();
            s.spawn(move || {
                for _ in 0..20 {
                    let items: Vec<_> = tags.iter().map(|&t| (t, Policy::Offload)).collect();
                    pool.sleep(&items).unwrap();
                    pool.wake(&tags).unwrap();
                }
            });
        }
        // Another allocates and frees in the default tag meanwhile.
        let pool2 = pool.clone();
        s.spawn(move || {
            for i in 0..200 {
                let b = pool2.alloc(1 + i * 100).unwrap();
                pool2.free(b.ptr).unwrap();
            }
        });
    });
    pool.wake(&[]).unwrap();
    for (i, b) in blocks.iter().enumerate() {
        assert!(read(d.as_ref(), b.ptr, b.size)
            .iter()
            .all(|&x| x == i as u8 + 10));
    }
    pool.check_invariants().unwrap();
    drop(blocks);
    drop(pool);
    assert_eq!(h.counts().handles, 0);
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
