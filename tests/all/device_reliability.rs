//! Out of memory at wake made real, and a sleep/wake soak, on whichever
//! backend `VMMW_BACKEND` names: `host` in CI (the twin), `cuda` on the GPU
//! machine (scripts/gpu.d/65-reliability.sh). With `VMMW_BACKEND=cuda` and no
//! usable device the tests fail; with it unset and no device they run on host.
//!
//! - Wake OOM: a tag is offloaded, the device is filled with another
//!   allocation (physical memory created outside the pool until the driver
//!   refuses more), then wake must fail with out-of-memory, leave the tag
//!   asleep with its backup whole, and succeed once the filler is released,
//!   with every byte as before.
//! - Soak: `VMMW_SOAK_CYCLES` (default 50) cycles of sleep (weights
//!   offloaded, activations discarded) and wake with a "forward pass" between
//!   (the device converts the bf16 weights to f32 activations); every output
//!   must be bitwise equal to the first, and free device memory and pinned
//!   backup bytes must be the same after every wake. `VMMW_SOAK_MIB` sets
//!   the weight bytes (default 1; the host backend converts on the CPU);
//!   `VMMW_SOAK_MAX_SECONDS` stops early (the count done is printed).

use std::io::Write;
use std::sync::Arc;
use std::time::Instant;

use vmmweights::driver::{self, BackendChoice, ConvertType, PhysHandle, StreamId};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool, PoolConfig};

/// The tests share one device: filling it must not starve the soak.
static DEVICE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn open() -> Arc<dyn Driver> {
    let choice = BackendChoice::from_env().unwrap();
    let opened = driver::open(choice, 0).unwrap_or_else(|e| panic!("opening {choice:?}: {e}"));
    let _ = writeln!(std::io::stderr(), "backend: {}", opened.driver.describe());
    opened.driver
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn upload(d: &dyn Driver, ptr: u64, bytes: &[u8]) {
    // SAFETY: `ptr` is a live pool block of at least `bytes.len()` bytes in an awake tag.
    unsafe { d.copy_htod_async(ptr, bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }.unwrap();
    d.synchronize().unwrap();
}

fn download(d: &dyn Driver, ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `upload`; `v` holds `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }.unwrap();
    d.synchronize().unwrap();
    v
}

/// Finite bf16 values, deterministic.
fn weights(n_elems: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n_elems * 2);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..n_elems {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let f = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0;
        out.extend(half::bf16::from_f32(f).to_bits().to_le_bytes());
    }
    out
}

/// Create physical memory until the driver refuses, big pieces first.
fn fill_device(d: &dyn Driver) -> Vec<PhysHandle> {
    let g = d.granularity();
    let mut held = Vec::new();
    for piece in [1usize << 30, 64 << 20, g] {
        let piece = piece.max(g) / g * g;
        loop {
            match d.create(piece) {
                Ok(h) => held.push(h),
                Err(e) if e.is_out_of_memory() => break,
                Err(e) => panic!("filling the device: {e}"),
            }
        }
    }
    held
}

#[test]
fn wake_out_of_memory_is_clean_and_a_later_wake_succeeds() {
    let _device = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let d = open();
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let t = tag::id("rel-oom-weights").unwrap();
    let mib = env_usize("VMMW_OOM_MIB", 64);
    let b = pool.alloc_tagged(mib << 20, t).unwrap();
    let data = weights(b.size / 2);
    upload(d.as_ref(), b.ptr, &data);
    pool.sleep(&[(t, Policy::Offload)]).unwrap();

    let filler = fill_device(d.as_ref());
    let free = d.mem_info().unwrap().free;
    let _ = writeln!(
        std::io::stderr(),
        "filled the device with {} handles; {free} bytes free, the tag needs {}",
        filler.len(),
        b.size
    );
    let e = pool.wake(&[t]).unwrap_err();
    let msg = e.to_string();
    let _ = writeln!(std::io::stderr(), "wake with a full device: {msg}");
    assert!(
        matches!(e, Error::OutOfMemory { .. }),
        "expected out of memory, got {e:?}"
    );
    assert!(
        msg.contains("rel-oom-weights"),
        "the error names the tag: {msg}"
    );
    // Nothing lost: still asleep, no memory held, the backup whole.
    assert!(pool.is_tag_asleep(t));
    let r = pool.report();
    let u = r.tags.iter().find(|u| u.tag == "rel-oom-weights").unwrap();
    assert_eq!(u.tracked_bytes, 0, "{r}");
    assert_eq!(u.host_backup_bytes, b.size as u64, "{r}");
    pool.check_invariants().unwrap();
    // A second attempt while still full fails the same way.
    assert!(pool.wake(&[t]).unwrap_err().is_out_of_memory());

    for h in filler {
        d.release(h).unwrap();
    }
    pool.wake(&[t]).unwrap();
    assert!(!pool.is_tag_asleep(t));
    assert!(
        download(d.as_ref(), b.ptr, b.size) == data,
        "bytes differ after the later wake"
    );
    pool.free(b.ptr).unwrap();
    pool.trim().unwrap();
}

#[test]
fn soak_sleep_wake_cycles_stay_flat_and_bitwise_equal() {
    let _device = DEVICE.lock().unwrap_or_else(|p| p.into_inner());
    let d = open();
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let wt = tag::id("rel-soak-weights").unwrap();
    let at = tag::id("rel-soak-activations").unwrap();
    let cycles = env_usize("VMMW_SOAK_CYCLES", 50);
    let bytes = env_usize("VMMW_SOAK_MIB", 1) << 20;
    let elems = bytes / 2;
    // The forward pass reads the first 8 Mi weights (all of them when fewer).
    let fwd = elems.min(8 << 20);
    let max_secs = std::env::var("VMMW_SOAK_MAX_SECONDS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok());
    let w = pool.alloc_tagged(bytes, wt).unwrap();
    let a = pool.alloc_tagged(fwd * 4, at).unwrap();
    let all = weights(elems);
    upload(d.as_ref(), w.ptr, &all);
    let forward = || {
        // SAFETY: both blocks are live in awake tags, sized for `elems` elements, disjoint.
        unsafe {
            d.convert_async(
                a.ptr,
                ConvertType::F32,
                w.ptr,
                ConvertType::Bf16,
                fwd,
                StreamId::DEFAULT,
            )
        }
        .unwrap();
        d.synchronize().unwrap();
        download(d.as_ref(), a.ptr, fwd * 4)
    };
    let first = forward();
    let mut flat: Option<(u64, u64)> = None;
    let (mut free_min, mut free_max) = (u64::MAX, 0u64);
    let t0 = Instant::now();
    let mut done = 0;
    for k in 0..cycles {
        if max_secs.is_some_and(|m| t0.elapsed().as_secs_f64() > m) {
            break;
        }
        pool.sleep(&[(wt, Policy::Offload), (at, Policy::Discard)])
            .unwrap();
        pool.wake(&[]).unwrap();
        let out = forward();
        assert!(
            out == first,
            "cycle {k}: forward output differs from the first"
        );
        if k % 100 == 99 || k + 1 == cycles {
            assert!(
                download(d.as_ref(), w.ptr, bytes) == all,
                "cycle {k}: weights differ"
            );
        }
        done += 1;
        let free = d.mem_info().unwrap().free;
        let pinned = pool.sleep_engine().backup_held_bytes();
        free_min = free_min.min(free);
        free_max = free_max.max(free);
        match flat {
            None => flat = Some((free, pinned)),
            Some((f0, p0)) => {
                assert_eq!(
                    pinned, p0,
                    "cycle {k}: pinned backup grew from {p0} to {pinned}"
                );
                // Exact on host; on a GPU the driver may move a few pages of its own.
                let slack = if d.kind() == vmmweights::BackendKind::Host {
                    0
                } else {
                    64 << 20
                };
                assert!(
                    free.abs_diff(f0) <= slack,
                    "cycle {k}: free device memory moved from {f0} to {free}"
                );
            }
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let _ = writeln!(
        std::io::stderr(),
        "soak: {done} of {cycles} cycles of {} MiB weights + {} MiB activations in {secs:.1}s ({:.1} ms/cycle); free device memory {free_min}..{free_max}; pinned backup {} bytes; outputs bitwise equal",
        bytes >> 20,
        (fwd * 4) >> 20,
        secs * 1000.0 / done.max(1) as f64,
        pool.sleep_engine().backup_held_bytes()
    );
    pool.free(w.ptr).unwrap();
    pool.free(a.ptr).unwrap();
    pool.trim().unwrap();
}
