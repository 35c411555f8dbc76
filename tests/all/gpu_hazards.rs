//! The sleep/wake/load hazards on a real device, for the H200
//! evidence (scripts/gpu.d/60-hazards.sh): a changed and a truncated
//! checkpoint at wake followed by device work, a sleep during a load, and the
//! allocation latency in another tag during a large wake.
//!
//! With `VMMW_BACKEND=cuda` they run on the CUDA backend (sizes from the
//! environment, see each test); otherwise they run on the host backend with
//! small sizes, so CI runs the same code (the host-only regression tests are in
//! `sleep_hazards.rs`). `VMMW_BACKEND=cuda` without a usable driver fails.

use crate::common;

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::loader::*;
use vmmweights::driver::{ConvertType, StreamId};
use vmmweights::ffi::destinations::{
    vmmw_destination_t, vmmw_loader_allocate, vmmw_loader_destination,
};
use vmmweights::ffi::loader::{vmmw_loader_free, vmmw_loader_load, vmmw_loader_open};
use vmmweights::ffi::pool::{vmmw_pool_free, vmmw_pool_new, vmmw_pool_t};
use vmmweights::ffi::sleep::{
    vmmw_pool_sleep, vmmw_pool_wake, vmmw_tag_policy_t, VMMW_POLICY_DISCARD, VMMW_POLICY_OFFLOAD,
};
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, BackendChoice, DevicePtr, Driver, Pool, PoolConfig, Status};

/// The device under test, and whether it is the CUDA backend.
fn device() -> (Arc<dyn Driver>, bool) {
    match BackendChoice::from_env().unwrap() {
        BackendChoice::Cuda => {
            let d = vmmweights::driver::open(BackendChoice::Cuda, 0)
                .expect("VMMW_BACKEND=cuda but the CUDA driver did not open")
                .driver;
            (d, true)
        }
        _ => {
            eprintln!("gpu_hazards: host backend (set VMMW_BACKEND=cuda for the device run)");
            (host(), false)
        }
    }
}

fn env_bytes(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .map(|v| vmmweights::units::parse_bytes(&v).expect(name))
        .unwrap_or(default)
}

/// A generated checkpoint of roughly `mib` MiB (bf16), in a temporary folder.
fn generated(mib: usize) -> tempfile::TempDir {
    let hidden = if mib >= 64 { 1024 } else { 64 };
    let s = Shape {
        layers: (mib / 32).clamp(2, 64),
        hidden,
        inter: hidden * 4,
        vocab: if mib >= 64 { 16384 } else { 120 },
        heads: 8.min(hidden / 16),
        kv_heads: 2,
        head_dim: 16.max(hidden / 8),
        tied: false,
        qk_norm: true,
    };
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&s, Dtype::Bf16), Dtype::Bf16, 2);
    dir
}

fn shards(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

/// Device work on a loaded tensor: convert it to f32 on the device, read the
/// result back and compare with the checkpoint's values converted here. Shows
/// the context is usable and the weights are right.
fn device_work(d: &Arc<dyn Driver>, pool: &Pool, dst: DevicePtr, want_bf16: &[u8]) {
    let n = want_bf16.len() / 2;
    let out = pool
        .alloc_tagged(n * 4, tag::id("gpu-hz-scratch").unwrap())
        .unwrap();
    // SAFETY: `dst` holds n bf16 values, `out` room for n f32; both mapped.
    unsafe {
        d.convert_async(
            out.ptr,
            ConvertType::F32,
            dst,
            ConvertType::Bf16,
            n,
            StreamId::DEFAULT,
        )
    }
    .unwrap();
    d.synchronize().unwrap();
    let got = read(d.as_ref(), out.ptr, n * 4);
    for (i, (g, w)) in got.chunks(4).zip(want_bf16.chunks(2)).enumerate() {
        let w = half::bf16::from_le_bytes([w[0], w[1]]).to_f32();
        let g = f32::from_le_bytes([g[0], g[1], g[2], g[3]]);
        assert!(
            g == w || (g.is_nan() && w.is_nan()),
            "element {i}: {g} vs {w}"
        );
    }
    pool.free(out.ptr).unwrap();
}

#[test]
fn changed_then_truncated_checkpoint_fails_the_wake_cleanly_and_the_device_works_after() {
    let (d, cuda) = device();
    let dir = generated(if cuda { 512 } else { 1 });
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let t = tag::id("gpu-hz-changed").unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let name = ckpt.tensors.keys().next().unwrap().clone();
    let rules = Rules::default();
    let mut reg = Registry::new();
    {
        let _s = tag::scope(t).unwrap();
        reg.allocate(&Plan::destinations(&ckpt, &rules).unwrap(), &pool)
            .unwrap();
    }
    let plan = Arc::new(
        load(
            &d,
            ckpt,
            &rules,
            &reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap(),
    );
    pool.add_reload_source(t, plan.clone()).unwrap();
    let dst = reg.get(&name).unwrap().ptr;
    let want = plan.checkpoint().tensor_bytes(&name).unwrap().to_vec();
    device_work(&d, &pool, dst, &want);

    let file = shards(dir.path())[1].clone();
    let original = std::fs::read(&file).unwrap();
    for (case, truncate) in [("rewritten in place", false), ("truncated", true)] {
        pool.sleep(&[(t, Policy::Reload)]).unwrap();
        pool.sleep_engine().wait_reload_prepared(t);
        let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
        let len = f.metadata().unwrap().len();
        if truncate {
            f.set_len(len / 3).unwrap();
        } else {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&[0x11; 4096], len - 4096).unwrap();
        }
        let t0 = Instant::now();
        let e = pool.wake(&[t]).unwrap_err();
        println!("{case}: wake refused in {:?}: {e}", t0.elapsed());
        assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
        assert!(pool.is_tag_asleep(t), "{case}: the tag stays asleep");
        // Wake another way, then load the file (the changed one; the truncated
        // one put back) and use the device.
        pool.forget_reload_sources(t).unwrap();
        pool.wake(&[t]).unwrap();
        if truncate {
            std::fs::write(&file, &original).unwrap();
        }
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let want = ckpt.tensor_bytes(&name).unwrap().to_vec();
        let again = load(
            &d,
            ckpt,
            &rules,
            &reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .unwrap();
        pool.add_reload_source(t, Arc::new(again)).unwrap();
        device_work(&d, &pool, dst, &want);
        println!("{case}: load and device work after the refused wake: ok");
    }
}

struct LoadCtx {
    pool: *mut vmmw_pool_t,
    tag: u32,
    refused: u32,
    other: i32,
}

unsafe extern "C" fn sleep_from_progress(done: u64, total: u64, user: *mut c_void) -> i32 {
    // SAFETY: `user` is the LoadCtx of the running test, alive for the load.
    let ctx = unsafe { &mut *(user as *mut LoadCtx) };
    if done < total || ctx.refused == 0 {
        let items = [vmmw_tag_policy_t {
            tag: ctx.tag,
            policy: VMMW_POLICY_DISCARD,
        }];
        // SAFETY: the pool handle is live for the whole load.
        let rc = unsafe { vmmw_pool_sleep(ctx.pool, items.as_ptr(), 1, ptr::null_mut()) };
        if rc == Status::LoadInProgress as i32 {
            ctx.refused += 1;
        } else {
            ctx.other = rc;
        }
    }
    0
}

#[test]
fn sleep_during_a_load_is_refused_and_the_load_completes() {
    let (_d, cuda) = device();
    let generated_dir;
    let dir: PathBuf = match std::env::var("LOAD_DIR") {
        Ok(p) if cuda && Path::new(&p).exists() => p.into(),
        _ => {
            generated_dir = generated(if cuda { 512 } else { 1 });
            generated_dir.path().to_path_buf()
        }
    };
    let path = CString::new(dir.to_str().unwrap()).unwrap();
    let t = tag::id("gpu-hz-loading").unwrap();
    // SAFETY: every pointer passed is valid for the call; handles are freed once.
    unsafe {
        let mut pool = ptr::null_mut();
        assert_eq!(vmmw_pool_new(ptr::null(), &mut pool, ptr::null_mut()), 0);
        let mut loader = ptr::null_mut();
        assert_eq!(
            vmmw_loader_open(path.as_ptr(), &mut loader, ptr::null_mut()),
            0
        );
        assert_eq!(vmmw_loader_allocate(loader, pool, t.0, ptr::null_mut()), 0);
        let mut ctx = LoadCtx {
            pool,
            tag: t.0,
            refused: 0,
            other: 0,
        };
        let t0 = Instant::now();
        let rc = vmmw_loader_load(
            loader,
            pool,
            Some(sleep_from_progress),
            &mut ctx as *mut LoadCtx as *mut c_void,
            ptr::null_mut(),
        );
        println!(
            "load {:?}: {} sleeps refused with VMMW_LOAD_IN_PROGRESS during it",
            t0.elapsed(),
            ctx.refused
        );
        assert_eq!(rc, 0, "the load completes");
        assert!(
            ctx.refused > 0 && ctx.other == 0,
            "other status {}",
            ctx.other
        );

        // The weights are the checkpoint's (read through a second handle on
        // the same device), and the tag sleeps and wakes after.
        let ckpt = Checkpoint::open(&dir).unwrap();
        let d = vmmweights::driver::open(BackendChoice::from_env().unwrap(), 0)
            .unwrap()
            .driver;
        let check = |what: &str| {
            for (name, _) in ckpt.tensors.iter().step_by(7) {
                let cname = CString::new(name.as_str()).unwrap();
                let mut dst = vmmw_destination_t {
                    ptr: 0,
                    bytes: 0,
                    dtype: [0; 16],
                    ndim: 0,
                    shape: [0; vmmweights::ffi::loader::VMMW_MAX_DIMS],
                };
                assert_eq!(
                    vmmw_loader_destination(loader, cname.as_ptr(), &mut dst, ptr::null_mut()),
                    0
                );
                let want = ckpt.tensor_bytes(name).unwrap();
                assert!(
                    read(d.as_ref(), dst.ptr, want.len()) == want,
                    "{what}: tensor {name}"
                );
            }
        };
        check("after the load");
        let items = [vmmw_tag_policy_t {
            tag: t.0,
            policy: VMMW_POLICY_OFFLOAD,
        }];
        assert_eq!(vmmw_pool_sleep(pool, items.as_ptr(), 1, ptr::null_mut()), 0);
        assert_eq!(vmmw_pool_wake(pool, ptr::null(), 0, ptr::null_mut()), 0);
        check("after a sleep and wake");
        vmmw_loader_free(loader);
        vmmw_pool_free(pool);
    }
}

#[test]
fn allocation_in_another_tag_during_a_large_wake_returns_in_microseconds() {
    let (d, cuda) = device();
    let bytes = env_bytes(
        "VMMW_HAZARD_WAKE_BYTES",
        if cuda { 16 << 30 } else { 256 << 20 },
    );
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    let big = tag::id("gpu-hz-big").unwrap();
    let other = tag::id("gpu-hz-other").unwrap();
    let piece = 1usize << 30;
    let mut blocks = Vec::new();
    let mut left = bytes as usize;
    while left > 0 {
        let n = left.min(piece);
        let b = pool.alloc_tagged(n, big).unwrap();
        // SAFETY: the block is mapped.
        unsafe { d.memset_async(b.ptr, blocks.len() as u8 + 1, n, StreamId::DEFAULT) }.unwrap();
        blocks.push(b);
        left -= n;
    }
    d.synchronize().unwrap();
    pool.reserve_backup(bytes).unwrap();
    let warm = pool.alloc_tagged(4096, other).unwrap();
    pool.free(warm.ptr).unwrap();
    let slept = pool.sleep(&[(big, Policy::Offload)]).unwrap();
    std::thread::scope(|s| {
        let t0 = Instant::now();
        let waking = s.spawn(|| pool.wake(&[big]));
        let mut took: Vec<Duration> = Vec::new();
        while !waking.is_finished() {
            let t = Instant::now();
            let b = pool.alloc_tagged(4096, other).unwrap();
            pool.free(b.ptr).unwrap();
            took.push(t.elapsed());
            std::thread::sleep(Duration::from_micros(200));
        }
        let woke = waking.join().unwrap().unwrap();
        let wake_s = t0.elapsed();
        took.sort();
        let q = |f: f64| took[((took.len() - 1) as f64 * f) as usize];
        println!(
            "sleep {:.3} s, wake {:.3} s ({:.2} GB/s) of {} bytes; {} alloc+free of 4 KiB in another tag during it: median {:?}, p99 {:?}, worst {:?}",
            slept[0].report.seconds,
            wake_s.as_secs_f64(),
            bytes as f64 / wake_s.as_secs_f64() / 1e9,
            bytes,
            took.len(),
            q(0.5),
            q(0.99),
            q(1.0)
        );
        assert!(woke[0].report.copied_bytes >= bytes);
        assert!(!took.is_empty());
        assert!(q(0.5) < Duration::from_millis(1), "median {:?}", q(0.5));
    });
    for (i, b) in blocks.iter().enumerate().step_by(4) {
        let got = read(d.as_ref(), b.ptr + (b.size / 2) as u64, 4096);
        assert!(got.iter().all(|&x| x == i as u8 + 1), "block {i}");
    }
}
