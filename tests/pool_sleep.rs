//! Sleep/wake through the pool on the host backend: tags, policies, report,
//! transactional wake, concurrency.

use std::sync::Arc;

use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Mode, Pool, PoolConfig};
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
    assert!(pool.release_backup() > 0, "backup unpinned on request");
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
