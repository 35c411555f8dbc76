//! Concurrency, bounded in time (`VMMW_STRESS_SECONDS`, default 2 per test):
//! - threads allocating and freeing in one tag while others sleep and wake a
//!   second tag and load a checkpoint into a third, bytes checked throughout;
//! - the PyTorch entry points (`vmmw_torch_malloc` / `vmmw_torch_free`) from
//!   several threads at once, each thread in its own tag scope;
//! - sleep, and wake, called from two threads on the same tag at once.
//!
//! Each test prints how many operations it ran.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::pool::*;
use vmmweights::loader::{self, Checkpoint, Control, Dtype, LoadOptions, Plan, Registry, Rules};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool};

fn budget() -> Duration {
    let s = std::env::var("VMMW_STRESS_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(2.0);
    Duration::from_secs_f64(s)
}

fn fill_seed(ptr: u64, size: usize, seed: u8) {
    // SAFETY: a live block of an awake tag, mapped read/write, owned by the caller.
    unsafe { std::ptr::write_bytes(ptr as usize as *mut u8, seed, size) };
}

fn holds(ptr: u64, size: usize, seed: u8) -> bool {
    // SAFETY: as in `fill_seed`; the tag is awake while this runs.
    let s = unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, size) };
    s.iter().all(|&b| b == seed)
}

#[test]
fn alloc_free_while_other_tags_sleep_wake_and_load() {
    let host = host(1 << 30);
    let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
    let busy = tag::id("conc-busy").unwrap();
    let sleepy = tag::id("conc-sleepy").unwrap();
    let loaded = tag::id("conc-loaded").unwrap();
    // The sleepy tag's blocks, written once and checked after every wake.
    let sleepy_blocks: Vec<(u64, usize)> = [700usize, 9000, 3 * G, 100 << 10]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let b = pool.alloc_tagged(n, sleepy).unwrap();
            fill_seed(b.ptr, b.size, 0x40 + i as u8);
            (b.ptr, b.size)
        })
        .collect();
    // The checkpoint the loader thread loads again and again.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    std::fs::write(
        &path,
        vmmweights::fuzz::tiny_safetensors(&[
            ("x.a", Dtype::Bf16, &[64, 64]),
            ("x.b", Dtype::F32, &[5000]),
        ]),
    )
    .unwrap();
    let specs = Plan::destinations(&Checkpoint::open(&path).unwrap(), &Rules::default()).unwrap();
    let mut reg = Registry::new();
    {
        let _s = tag::scope(loaded).unwrap();
        reg.allocate(&specs, &*pool).unwrap();
    }
    let want = Checkpoint::open(&path).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let ops = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + budget();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let (pool, stop, ops) = (&pool, &stop, &ops);
            s.spawn(move || {
                let mut rng = Rng(0x51ee_d000 + t);
                let mut mine: Vec<(u64, usize, u8)> = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    if mine.len() < 16 && rng.below(3) != 0 {
                        let max = if rng.below(4) == 0 {
                            4 * G as u64
                        } else {
                            8192
                        };
                        let n = 1 + rng.below(max) as usize;
                        let _scope = tag::scope(busy).unwrap();
                        let b = pool.alloc(n).unwrap();
                        let seed = rng.below(250) as u8 + 1;
                        fill_seed(b.ptr, b.size, seed);
                        mine.push((b.ptr, b.size, seed));
                    } else if let Some((p, n, seed)) = mine.pop() {
                        assert!(holds(p, n, seed), "busy block {p:#x} changed");
                        pool.free(p).unwrap();
                    } else {
                        pool.trim().unwrap();
                    }
                    ops.fetch_add(1, Ordering::Relaxed);
                }
                for (p, n, seed) in mine {
                    assert!(holds(p, n, seed), "busy block {p:#x} changed");
                    pool.free(p).unwrap();
                }
            });
        }
        {
            let (pool, stop, ops, blocks) = (&pool, &stop, &ops, &sleepy_blocks);
            s.spawn(move || {
                let mut k = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    pool.sleep(&[(sleepy, Policy::Offload)]).unwrap();
                    assert!(pool.is_tag_asleep(sleepy));
                    // Allocation in an asleep tag is refused, not served.
                    assert!(matches!(
                        pool.alloc_tagged(100, sleepy),
                        Err(Error::InvalidState(_))
                    ));
                    pool.wake(&[sleepy]).unwrap();
                    for (i, &(p, n)) in blocks.iter().enumerate() {
                        assert!(
                            holds(p, n, 0x40 + i as u8),
                            "sleepy block {p:#x} changed across cycle {k}"
                        );
                    }
                    k += 1;
                    ops.fetch_add(2, Ordering::Relaxed);
                }
            });
        }
        {
            let (pool, stop, ops, reg, want, path) = (&pool, &stop, &ops, &reg, &want, &path);
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let ex = loader::load(
                        pool.driver(),
                        Checkpoint::open(path).unwrap(),
                        &Rules::default(),
                        reg,
                        &LoadOptions::default(),
                        &Control::default(),
                    )
                    .unwrap();
                    for d in reg.iter() {
                        // SAFETY: the destination is a live block of the awake `loaded` tag.
                        let got = unsafe {
                            std::slice::from_raw_parts(d.ptr as usize as *const u8, d.bytes())
                        };
                        assert_eq!(
                            got,
                            want.tensor_bytes(&d.name).unwrap(),
                            "`{}` after a load",
                            d.name
                        );
                    }
                    drop(ex);
                    ops.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        stop.store(true, Ordering::Relaxed);
    });
    pool.check_invariants().unwrap();
    println!(
        "mixed: {} operations in {:?}",
        ops.load(Ordering::Relaxed),
        budget()
    );
    for &(p, _) in &sleepy_blocks {
        pool.free(p).unwrap();
    }
    for d in reg.iter() {
        pool.free(d.ptr).unwrap();
    }
    pool.trim().unwrap();
    drop(pool);
    let c = host.counts();
    assert_eq!((c.reservations, c.handles, c.mappings), (0, 0, 0), "{c:?}");
}

#[test]
fn same_tag_sleep_and_wake_from_two_threads() {
    let host = host(1 << 30);
    let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
    let t = tag::id("conc-same").unwrap();
    let blocks: Vec<(u64, usize)> = (0..6)
        .map(|i| {
            let b = pool.alloc_tagged(1000 + i * 30_000, t).unwrap();
            fill_seed(b.ptr, b.size, 0x10 + i as u8);
            (b.ptr, b.size)
        })
        .collect();
    let check = |when: &str| {
        for (i, &(p, n)) in blocks.iter().enumerate() {
            assert!(holds(p, n, 0x10 + i as u8), "block {p:#x} changed ({when})");
        }
    };
    let deadline = Instant::now() + budget();
    let barrier = Barrier::new(2);
    let mut rounds = 0u64;
    while Instant::now() < deadline {
        // Both threads sleep at once, then both wake at once, then one sleeps
        // while the other wakes.
        for step in 0..3 {
            std::thread::scope(|s| {
                for who in 0..2 {
                    let (pool, barrier) = (&pool, &barrier);
                    s.spawn(move || {
                        barrier.wait();
                        let sleep = match step {
                            0 => true,
                            1 => false,
                            _ => who == 0,
                        };
                        if sleep {
                            pool.sleep(&[(t, Policy::Offload)]).unwrap();
                        } else {
                            pool.wake(&[t]).unwrap();
                        }
                    });
                }
            });
            pool.check_invariants().unwrap();
            let r = pool.report();
            let u = r.tags.iter().find(|u| u.tag == "conc-same").unwrap();
            match step {
                0 => assert!(u.asleep && u.tracked_bytes == 0, "{r}"),
                1 => {
                    assert!(!u.asleep && u.tracked_bytes == u.reserved_bytes, "{r}");
                    check("after two wakes");
                }
                _ => {
                    // Either order is fine; the state must be whole either way.
                    assert_eq!(u.asleep, u.tracked_bytes == 0, "{r}");
                    pool.wake(&[t]).unwrap();
                    check("after a racing sleep and wake");
                }
            }
        }
        rounds += 1;
    }
    println!("same tag: {rounds} rounds of racing sleep/wake");
    assert!(rounds > 0);
    for (p, _) in blocks {
        pool.free(p).unwrap();
    }
    pool.trim().unwrap();
    drop(pool);
    let c = host.counts();
    assert_eq!((c.reservations, c.handles, c.mappings), (0, 0, 0), "{c:?}");
}

#[test]
fn torch_entry_points_from_several_threads() {
    use vmmweights::ffi::torch::{vmmw_torch_free, vmmw_torch_malloc};
    // The entry points use the process-global pool; keep it on the host backend.
    std::env::set_var("VMMW_BACKEND", "host");
    let deadline = Instant::now() + budget();
    let calls = AtomicU64::new(0);
    let before = vmmweights::pool::torch::counters();
    std::thread::scope(|s| {
        for th in 0..4u64 {
            let calls = &calls;
            s.spawn(move || {
                let t = tag::id(&format!("conc-torch-{th}")).unwrap();
                let _scope = tag::scope(t).unwrap();
                let mut rng = Rng(0x70_4c4 + th);
                let mut mine: Vec<(usize, isize, u8)> = Vec::new();
                while Instant::now() < deadline {
                    if mine.len() < 8 && rng.below(2) == 0 {
                        let n = (1 + rng.below(3 << 20)) as isize;
                        // SAFETY: any arguments are accepted; the stream is not used.
                        let p = unsafe { vmmw_torch_malloc(n, 0, std::ptr::null_mut()) };
                        assert!(!p.is_null(), "torch malloc of {n} bytes failed");
                        let seed = rng.below(250) as u8 + 1;
                        fill_seed(p as u64, n as usize, seed);
                        mine.push((p as usize, n, seed));
                    } else if let Some((p, n, seed)) = mine.pop() {
                        assert!(
                            holds(p as u64, n as usize, seed),
                            "torch block {p:#x} changed"
                        );
                        // SAFETY: `p` came from vmmw_torch_malloc and is freed once.
                        unsafe { vmmw_torch_free(p as *mut _, n, 0, std::ptr::null_mut()) };
                    }
                    calls.fetch_add(1, Ordering::Relaxed);
                }
                for (p, n, seed) in mine {
                    assert!(holds(p as u64, n as usize, seed));
                    // SAFETY: as above.
                    unsafe { vmmw_torch_free(p as *mut _, n, 0, std::ptr::null_mut()) };
                }
            });
        }
    });
    let after = vmmweights::pool::torch::counters();
    assert_eq!(after.failed_mallocs, before.failed_mallocs);
    assert_eq!(after.unknown_frees, before.unknown_frees);
    assert_eq!(after.mallocs - before.mallocs, after.frees - before.frees);
    let pool = vmmweights::pool::registry::existing_pool(0).unwrap();
    pool.check_invariants().unwrap();
    assert!(pool.report().total.live_bytes == 0, "{}", pool.report());
    println!(
        "torch entry points: {} calls from 4 threads",
        calls.load(Ordering::Relaxed)
    );
}
