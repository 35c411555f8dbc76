//! Sleep, wake and load under stress, on the host backend: a changed or
//! truncated checkpoint at wake, stale reload sources, sleep during a load,
//! failed synchronize and unmap, I/O errors mid-copy, a long wake next to
//! allocations in other tags, and Reload of a tag that holds more than the
//! checkpoint (a "model-like" tag: buffers, later allocations, padding).

use crate::common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::loader::*;
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::StreamId;
use vmmweights::loader::*;
use vmmweights::sleep::reload::ReloadSource;
use vmmweights::sleep::Policy;
use vmmweights::{tag, DevicePtr, Driver, Error, Pool, PoolConfig, Status, TagId};

fn pool() -> (Arc<HostDriver>, Arc<dyn Driver>, Pool) {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: 64 << 10,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let pool = Pool::new(d.clone(), PoolConfig::default()).unwrap();
    (h, d, pool)
}

fn write(d: &dyn Driver, ptr: DevicePtr, bytes: &[u8]) {
    // SAFETY: the range is a mapped block of this driver; `bytes` outlives the copy.
    unsafe { d.copy_htod_async(ptr, bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }.unwrap();
    d.synchronize().unwrap();
}

fn pattern(seed: u8, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect()
}

/// A checkpoint in `dir` loaded into blocks of `t` in `pool`.
struct Loaded {
    reg: Registry,
    plan: Arc<ExecutedPlan>,
}

fn load_into(d: &Arc<dyn Driver>, pool: &Pool, t: TagId, dir: &Path, check: bool) -> Loaded {
    let ckpt = Checkpoint::open(dir).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let mut reg = Registry::new();
    {
        let _scope = tag::scope(t).unwrap();
        reg.allocate(&Plan::destinations(&ckpt, &rules).unwrap(), pool)
            .unwrap();
    }
    let opts = LoadOptions {
        reload_check: check,
        ..Default::default()
    };
    let plan = Arc::new(load(d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap());
    pool.add_reload_source(t, plan.clone()).unwrap();
    Loaded { reg, plan }
}

fn checkpoint_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    dir
}

fn snapshot(d: &dyn Driver, ranges: &[(DevicePtr, usize)]) -> Vec<Vec<u8>> {
    ranges.iter().map(|&(p, n)| read(d, p, n)).collect()
}

/// Every live block of `t`, as (ptr, size).
fn blocks_of(pool: &Pool, t: TagId) -> Vec<(DevicePtr, usize)> {
    pool.live_blocks()
        .into_iter()
        .filter(|b| b.tag == t)
        .map(|b| (b.ptr, b.size))
        .collect()
}

fn shard_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    v.sort();
    v
}

/// Overwrite the last `n` bytes of `path` in place (same inode, same size).
fn rewrite_tail(path: &Path, n: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let len = f.metadata().unwrap().len();
    f.write_all_at(&vec![0x3C; n as usize], len - n).unwrap();
}

#[test]
fn model_like_tag_keeps_every_byte_the_loader_did_not_write_across_reload() {
    let (_h, d, pool) = pool();
    let t = tag::id("hz-model-like").unwrap();
    let dir = checkpoint_dir();
    let l = load_into(&d, &pool, t, dir.path(), false);
    // What a model adds in its tag: buffers it computes (small), later
    // allocations (one large), and bytes in the padding of loaded blocks.
    let small = pool.alloc_tagged(3000, t).unwrap();
    let large = pool.alloc_tagged(8 << 20, t).unwrap();
    write(d.as_ref(), small.ptr, &pattern(1, small.size));
    write(d.as_ref(), large.ptr, &pattern(2, large.size));
    for (i, dst) in l.reg.iter().enumerate() {
        let block = pool
            .live_blocks()
            .into_iter()
            .find(|b| b.ptr == dst.ptr)
            .unwrap();
        let pad = block.size - dst.bytes();
        if pad > 0 {
            write(
                d.as_ref(),
                dst.ptr + dst.bytes() as u64,
                &pattern(i as u8, pad),
            );
        }
    }
    let all = blocks_of(&pool, t);
    let before = snapshot(d.as_ref(), &all);
    let loaded: u64 = l.reg.iter().map(|x| x.bytes() as u64).sum();

    for round in 0..2 {
        pool.sleep(&[(t, Policy::Reload)]).unwrap();
        let u = pool.report().tag("hz-model-like").unwrap().clone();
        assert_eq!(u.tracked_bytes, 0, "round {round}: nothing stays mapped");
        assert_eq!(
            u.host_backup_bytes,
            u.live_bytes - loaded,
            "round {round}: the host holds exactly the live bytes no source covers"
        );
        let woke = pool.wake(&[t]).unwrap();
        assert!(woke[0].report.reloaded_bytes >= loaded);
        assert!(
            snapshot(d.as_ref(), &all) == before,
            "round {round}: every byte of the tag is back"
        );
    }
    drop(l.plan);
}

#[test]
fn freed_destination_is_not_replayed_and_its_source_retires() {
    let (_h, d, pool) = pool();
    let t = tag::id("hz-stale").unwrap();
    let dir = checkpoint_dir();
    let l = load_into(&d, &pool, t, dir.path(), false);
    let big = l
        .reg
        .iter()
        .map(|x| (x.ptr, x.bytes()))
        .max_by_key(|x| x.1)
        .unwrap();
    // A Reload cycle so the plan pins its page cache (the registered path).
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.sleep_engine().wait_reload_prepared(t);
    pool.wake(&[t]).unwrap();
    assert!(l.plan.pinned_source_bytes().unwrap() > 0);

    // Free the largest destination; the next block of its size takes its place.
    pool.free(big.0).unwrap();
    let again = pool.alloc_tagged(big.1, t).unwrap();
    assert_eq!(again.ptr, big.0, "the pool reuses the freed block");
    let mine = pattern(9, again.size);
    write(d.as_ref(), again.ptr, &mine);
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.wake(&[t]).unwrap();
    assert!(
        read(d.as_ref(), again.ptr, again.size) == mine,
        "the old checkpoint's bytes were replayed into a new block"
    );

    // Once every block it wrote is freed, the source is dropped and unpinned.
    for x in l.reg.iter().filter(|x| x.ptr != big.0) {
        pool.free(x.ptr).unwrap();
    }
    assert!(!pool.sleep_engine().has_reload_source(t));
    assert_eq!(
        Arc::strong_count(&l.plan),
        1,
        "only the test holds the plan"
    );
    assert_eq!(
        l.plan.pinned_source_bytes().unwrap(),
        0,
        "page cache unpinned"
    );
}

#[test]
fn changed_checkpoint_refuses_wake_before_any_byte_and_tag_stays_wakeable() {
    let (h, d, pool) = pool();
    let t = tag::id("hz-changed").unwrap();
    let dir = checkpoint_dir();
    let l = load_into(&d, &pool, t, dir.path(), false);
    let extra = pool.alloc_tagged(1 << 20, t).unwrap();
    let mine = pattern(5, extra.size);
    write(d.as_ref(), extra.ptr, &mine);
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    let phys = h.counts().physical_bytes;
    let backup = pool.report().tag("hz-changed").unwrap().host_backup_bytes;

    // Same size, same inode, new bytes (a rewrite in place).
    let shard = &shard_files(dir.path())[1];
    std::thread::sleep(Duration::from_millis(20));
    rewrite_tail(shard, 64);
    let e = pool.wake(&[t]).unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(&shard.display().to_string()) && msg.contains("changed"),
        "{msg}"
    );
    assert!(pool.is_tag_asleep(t), "the tag stays asleep");
    assert_eq!(h.counts().physical_bytes, phys, "nothing was mapped");
    let u = pool.report().tag("hz-changed").unwrap().clone();
    assert_eq!((u.tracked_bytes, u.host_backup_bytes), (0, backup));

    // The way out: forget the sources, wake (backed-up bytes come back), load again.
    pool.forget_reload_sources(t).unwrap();
    pool.wake(&[t]).unwrap();
    assert!(read(d.as_ref(), extra.ptr, extra.size) == mine);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    load(
        &d,
        ckpt,
        &rules,
        &l.reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
}

#[test]
fn content_check_catches_a_rewrite_that_keeps_size_and_mtime() {
    let (_h, d, pool) = pool();
    let dir = checkpoint_dir();
    let shard = shard_files(dir.path())[0].clone();
    for check in [false, true] {
        let t = tag::id(if check {
            "hz-checksum-on"
        } else {
            "hz-checksum-off"
        })
        .unwrap();
        let l = load_into(&d, &pool, t, dir.path(), check);
        assert_eq!(l.plan.has_checksums(), check);
        pool.sleep(&[(t, Policy::Reload)]).unwrap();
        // Flip bytes of a tensor and put the modification time back.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&shard)
            .unwrap();
        let mtime = f.metadata().unwrap().modified().unwrap();
        let len = f.metadata().unwrap().len();
        let old = std::fs::read(&shard).unwrap()[(len - 16) as usize..].to_vec();
        let new: Vec<u8> = old.iter().map(|x| !x).collect();
        f.write_all_at(&new, len - 16).unwrap();
        f.set_modified(mtime).unwrap();
        let r = pool.wake(&[t]);
        if check {
            let e = r.unwrap_err();
            assert!(e.to_string().contains("checksum"), "{e}");
            assert!(pool.is_tag_asleep(t));
            pool.forget_reload_sources(t).unwrap();
            pool.wake(&[t]).unwrap();
        } else {
            // Without the option a rewrite that keeps size and mtime is not seen.
            r.unwrap();
        }
        f.write_all_at(&old, len - 16).unwrap();
        f.set_modified(mtime).unwrap();
        for x in l.reg.iter() {
            pool.free(x.ptr).unwrap();
        }
    }
}

/// Runs in a child process (see the test below): every way of reading a
/// truncated checkpoint must fail with an error, never a signal.
#[test]
#[ignore = "run by truncated_checkpoint_gives_errors_never_a_signal in a child process"]
fn truncated_checkpoint_child() {
    let (_h, d, pool) = pool();
    let dir = checkpoint_dir();
    let shards = shard_files(dir.path());

    // 1. Wake through the pinned page cache (the registered path).
    let t = tag::id("hz-trunc-registered").unwrap();
    let l = load_into(&d, &pool, t, dir.path(), false);
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.sleep_engine().wait_reload_prepared(t);
    assert!(l.plan.pinned_source_bytes().unwrap() > 0);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&shards[0])
        .unwrap();
    f.set_len(100).unwrap();
    let e = pool.wake(&[t]).unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    assert!(pool.is_tag_asleep(t));

    // 2. A staged replay called directly (no engine check before it).
    let ranges: Vec<(DevicePtr, usize)> = l.reg.iter().map(|x| (x.ptr, x.bytes())).collect();
    pool.forget_reload_sources(t).unwrap();
    pool.wake(&[t]).unwrap();
    let e = l.plan.reload(d.as_ref(), &ranges).unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");

    // 3. A load of a checkpoint truncated after it was opened.
    let dir2 = checkpoint_dir();
    let ckpt = Checkpoint::open(dir2.path()).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 64 << 20);
    fill_pattern(d.as_ref(), &reg);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&shard_files(dir2.path())[1])
        .unwrap()
        .set_len(64)
        .unwrap();
    let e = load(
        &d,
        ckpt,
        &rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    assert!(untouched(d.as_ref(), &reg), "nothing was written");
    println!("CHILD-OK");
}

#[test]
fn truncated_checkpoint_gives_errors_never_a_signal() {
    use std::os::unix::process::ExitStatusExt;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sleep_hazards::truncated_checkpoint_child",
            "--ignored",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.signal(),
        None,
        "the child died of a signal:\n{text}"
    );
    assert!(out.status.success() && text.contains("CHILD-OK"), "{text}");
}

#[test]
fn sleep_of_a_tag_being_loaded_is_refused_with_load_in_progress() {
    let (_h, d, pool) = pool();
    let t = tag::id("hz-pinned").unwrap();
    let other = tag::id("hz-pinned-other").unwrap();
    let b = pool.alloc_tagged(1 << 20, t).unwrap();
    let o = pool.alloc_tagged(1 << 20, other).unwrap();
    write(d.as_ref(), b.ptr, &pattern(3, b.size));
    let pin = pool.pin_for_load(&[(b.ptr, b.size, "w")]).unwrap();
    assert_eq!(pin.tags(), &[t]);
    let e = pool.sleep(&[(t, Policy::Discard)]).unwrap_err();
    assert!(matches!(e, Error::LoadInProgress { .. }), "{e}");
    assert_eq!(e.status() as i32, 17);
    assert!(e.to_string().contains("hz-pinned"), "{e}");
    assert!(!pool.is_tag_asleep(t), "nothing changed");
    assert!(read(d.as_ref(), b.ptr, b.size) == pattern(3, b.size));
    // Other tags sleep freely meanwhile.
    pool.sleep(&[(other, Policy::Discard)]).unwrap();
    // A pin is refused for an asleep tag, with the destination named.
    let e = pool.pin_for_load(&[(o.ptr, o.size, "kv")]).unwrap_err();
    assert!(e.to_string().contains("destination `kv`"), "{e}");
    drop(pin);
    pool.sleep(&[(t, Policy::Offload)]).unwrap();
    pool.wake(&[]).unwrap();
    assert!(read(d.as_ref(), b.ptr, b.size) == pattern(3, b.size));
}

#[test]
fn a_failed_synchronize_never_unmaps() {
    let (h, d, pool) = pool();
    let t = tag::id("hz-sync").unwrap();
    let seg = pool.alloc_segment(2 << 20, t).unwrap();
    let b = pool.alloc_tagged(4096, t).unwrap();
    let c = pool.alloc_tagged(4 << 20, t).unwrap();
    write(d.as_ref(), b.ptr, &pattern(4, 4096));
    write(d.as_ref(), c.ptr, &pattern(6, c.size));
    let maps = h.counts().mappings;

    // Freeing a segment: the error is returned and the memory stays mapped.
    h.fail_nth(FaultOp::Synchronize, 1);
    let e = pool.free_segment(seg.ptr).unwrap_err();
    assert!(e.to_string().contains("synchronize"), "{e}");
    assert_eq!(
        h.counts().mappings,
        maps,
        "nothing unmapped under queued work"
    );
    assert_eq!(pool.segments_awaiting_release(), 1);
    pool.trim().unwrap();
    assert_eq!(pool.segments_awaiting_release(), 0);
    assert!(
        h.counts().mappings < maps,
        "released once the device is idle"
    );

    // Sleeping: refused before anything is unmapped.
    let maps = h.counts().mappings;
    h.fail_nth(FaultOp::Synchronize, 1);
    pool.sleep(&[(t, Policy::Discard)]).unwrap_err();
    assert_eq!(h.counts().mappings, maps);
    assert!(!pool.is_tag_asleep(t));
    assert!(read(d.as_ref(), b.ptr, 4096) == pattern(4, 4096));

    // A wake that fails midway and cannot synchronize keeps what it mapped
    // (asleep), and the next wake finishes with every byte back.
    pool.sleep(&[(t, Policy::Offload)]).unwrap();
    assert!(pool.alloc_tagged(1, t).is_err(), "asleep");
    h.fail_nth(FaultOp::Map, 2);
    h.fail_nth(FaultOp::Synchronize, 1);
    pool.wake(&[t]).unwrap_err();
    assert!(pool.is_tag_asleep(t));
    let u = pool.report().tag("hz-sync").unwrap().clone();
    assert!(
        u.tracked_bytes > 0,
        "the chunk mapped before the failure stays mapped"
    );
    pool.wake(&[t]).unwrap();
    assert!(read(d.as_ref(), b.ptr, 4096) == pattern(4, 4096));
    assert!(read(d.as_ref(), c.ptr, c.size) == pattern(6, c.size));
}

#[test]
fn a_retried_sleep_releases_what_a_failed_unmap_left_mapped() {
    let h = Arc::new(HostDriver::new(HostConfig {
        granularity: 64 << 10,
        memory_limit: 1 << 30,
    }));
    let d: Arc<dyn Driver> = h.clone();
    let pool = Pool::new(
        d.clone(),
        PoolConfig {
            chunk_bytes: 1 << 20,
            ..Default::default()
        },
    )
    .unwrap();
    for policy in [Policy::Discard, Policy::Offload] {
        let name = format!("hz-unmap-{policy:?}");
        let t = tag::id(&name).unwrap();
        let blocks: Vec<_> = (0..3)
            .map(|_| pool.alloc_tagged(6 << 20, t).unwrap())
            .collect();
        for (i, b) in blocks.iter().enumerate() {
            write(d.as_ref(), b.ptr, &pattern(i as u8, b.size));
        }
        h.fail_nth(FaultOp::Unmap, 4);
        let e = pool.sleep(&[(t, policy)]).unwrap_err();
        assert!(e.to_string().contains("sleeping again finishes"), "{e}");
        let u = pool.report().tag(&name).unwrap().clone();
        assert!(u.tracked_bytes > 0, "a chunk is still mapped");
        assert!(u.asleep);
        assert_eq!(
            u.awake_bytes, u.tracked_bytes,
            "what is still mapped is not reported asleep"
        );
        pool.sleep(&[(t, policy)]).unwrap();
        let u = pool.report().tag(&name).unwrap().clone();
        assert_eq!(u.tracked_bytes, 0, "the retry released every chunk");
        pool.wake(&[t]).unwrap();
        if policy == Policy::Offload {
            for (i, b) in blocks.iter().enumerate() {
                assert!(read(d.as_ref(), b.ptr, b.size) == pattern(i as u8, b.size));
            }
        }
        for b in blocks {
            pool.free(b.ptr).unwrap();
        }
    }
    pool.trim().unwrap();
    assert_eq!(h.counts().mappings, 0);
    assert_eq!(h.counts().handles, 0, "no physical handle left behind");
}

#[test]
fn io_error_mid_copy_leaves_destinations_partly_written_as_documented() {
    let d = host();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.safetensors");
    write_file(&path, &generate(&SMALL, Dtype::Bf16), Dtype::Bf16);
    let ckpt = Checkpoint::open(&path).unwrap();
    let rules = Rules::preset("llama", None, SMALL.head_dim).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 64 << 20);
    fill_pattern(d.as_ref(), &reg);
    let plan = Plan::build(&ckpt, &rules, &reg, &PlanOptions::default()).unwrap();
    // Shrink the file to half after it was opened and planned; `pread` past
    // the end fails (the mapping is never read: the Read strategy).
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let opts = CopyOptions {
        strategy: Strategy::Read,
        threads: 1,
        slot_bytes: 4096,
        ..Default::default()
    };
    let e = copy::execute(
        &d,
        &ckpt.shards,
        &plan.extents,
        &[],
        &opts,
        &Control::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::Io, "{e}");
    // The rule: no rollback; each destination byte holds its old value or
    // the checkpoint's.
    let (mut new, mut old) = (0usize, 0usize);
    for x in reg.iter() {
        let got = read(d.as_ref(), x.ptr, x.bytes());
        if got.iter().all(|&b| b == PATTERN) {
            old += 1;
        } else {
            new += 1;
        }
    }
    assert!(new > 0 && old > 0, "partly written: {new} new, {old} old");
    // loader::load checks the file first and writes nothing.
    fill_pattern(d.as_ref(), &reg);
    let e = load(
        &d,
        ckpt,
        &rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap_err();
    assert_eq!(e.status(), Status::CheckpointInvalid, "{e}");
    assert!(untouched(d.as_ref(), &reg));
}

/// A reload source that takes its time: stands for a cold checkpoint.
#[derive(Debug)]
struct SlowSource {
    range: (DevicePtr, usize),
    delay: Duration,
    started: AtomicBool,
}

impl ReloadSource for SlowSource {
    fn reload(&self, d: &dyn Driver, ranges: &[(DevicePtr, usize)]) -> vmmweights::Result<u64> {
        self.started.store(true, Ordering::SeqCst);
        std::thread::sleep(self.delay);
        let mut n = 0;
        for &(p, l) in ranges {
            // SAFETY: the engine passes mapped ranges of the tag.
            unsafe { d.memset_async(p, 0x5A, l, StreamId::DEFAULT) }?;
            n += l as u64;
        }
        d.synchronize()?;
        Ok(n)
    }

    fn covered_ranges(&self) -> Vec<(DevicePtr, usize)> {
        vec![self.range]
    }
}

#[test]
fn allocations_in_other_tags_return_at_once_during_a_long_wake() {
    let (_h, d, pool) = pool();
    let slow = tag::id("hz-slow-wake").unwrap();
    let other = tag::id("hz-slow-other").unwrap();
    let w = pool.alloc_tagged(64 << 20, slow).unwrap();
    let dedicated = pool.alloc_segment(2 << 20, slow).unwrap();
    let src = Arc::new(SlowSource {
        range: (w.ptr, w.size),
        delay: Duration::from_millis(1500),
        started: AtomicBool::new(false),
    });
    pool.add_reload_source(slow, src.clone()).unwrap();
    pool.sleep(&[(slow, Policy::Reload)]).unwrap();

    std::thread::scope(|s| {
        let t0 = Instant::now();
        let waking = s.spawn(|| pool.wake(&[slow]));
        while !src.started.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let mut took = Vec::new();
        for _ in 0..200 {
            let t = Instant::now();
            let b = pool.alloc_tagged(4096, other).unwrap();
            pool.free(b.ptr).unwrap();
            took.push(t.elapsed());
        }
        took.sort();
        let (median, worst) = (took[took.len() / 2], took[took.len() - 1]);
        // Allocation in the tag being woken is refused clearly, not blocked.
        let e = pool.alloc_tagged(4096, slow).unwrap_err();
        assert!(e.to_string().contains("being put to sleep or woken"), "{e}");
        // Freeing its dedicated segment is accepted; release waits for the wake.
        pool.free_segment(dedicated.ptr).unwrap();
        assert!(!waking.is_finished(), "the wake was still running");
        let r = waking.join().unwrap().unwrap();
        println!(
            "wake {:?}; alloc+free in another tag during it: median {median:?}, worst {worst:?}",
            t0.elapsed()
        );
        assert!(
            median < Duration::from_millis(1),
            "another tag's allocation took {median:?} (median) during the wake"
        );
        assert!(r[0].report.reloaded_bytes >= w.size as u64);
        assert!(
            worst < Duration::from_millis(50),
            "another tag waited {worst:?} (worst; the wake took 1.5 s)"
        );
    });
    assert!(read(d.as_ref(), w.ptr, 4096).iter().all(|&b| b == 0x5A));
    assert!(
        pool.segment_of(dedicated.ptr).is_none(),
        "released after the wake"
    );
    pool.check_invariants().unwrap();
}

/// Shared by the load's progress callback and the thread that tries to sleep.
struct Rendezvous {
    started: AtomicBool,
    tried: AtomicBool,
}

unsafe extern "C" fn wait_for_sleeper(_done: u64, _total: u64, user: *mut std::ffi::c_void) -> i32 {
    // SAFETY: `user` is the test's Rendezvous, alive for the whole load.
    let r = unsafe { &*(user as *const Rendezvous) };
    r.started.store(true, Ordering::SeqCst);
    let t0 = Instant::now();
    while !r.tried.load(Ordering::SeqCst) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(1));
    }
    0
}

#[test]
fn sleep_from_another_thread_during_a_c_api_load_is_refused() {
    use std::ffi::CString;
    use std::ptr;
    use vmmweights::ffi::destinations::vmmw_loader_allocate;
    use vmmweights::ffi::loader::{vmmw_loader_free, vmmw_loader_load, vmmw_loader_open};
    use vmmweights::ffi::pool::{vmmw_pool_free, vmmw_pool_new};
    use vmmweights::ffi::sleep::{vmmw_pool_sleep, vmmw_tag_policy_t, VMMW_POLICY_DISCARD};
    std::env::set_var("VMMW_BACKEND", "host");
    let dir = checkpoint_dir();
    let path = CString::new(dir.path().to_str().unwrap()).unwrap();
    let t = tag::id("hz-c-loading").unwrap();
    let r = Rendezvous {
        started: AtomicBool::new(false),
        tried: AtomicBool::new(false),
    };
    struct Handle(*mut vmmweights::ffi::pool::vmmw_pool_t);
    // SAFETY: the pool handle is thread-safe (documented); it outlives the scope.
    unsafe impl Send for Handle {}
    unsafe impl Sync for Handle {}
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
        let h = Handle(pool);
        let rc = std::thread::scope(|s| {
            let sleeper = s.spawn(|| {
                while !r.started.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let items = [vmmw_tag_policy_t {
                    tag: t.0,
                    policy: VMMW_POLICY_DISCARD,
                }];
                let hp = &h;
                let rc = vmmw_pool_sleep(hp.0, items.as_ptr(), 1, ptr::null_mut());
                r.tried.store(true, Ordering::SeqCst);
                rc
            });
            let load = vmmw_loader_load(
                loader,
                pool,
                Some(wait_for_sleeper),
                &r as *const Rendezvous as *mut std::ffi::c_void,
                ptr::null_mut(),
            );
            (load, sleeper.join().unwrap())
        });
        assert_eq!(rc.0, 0, "the load completes");
        assert_eq!(rc.1, Status::LoadInProgress as i32, "the sleep is refused");
        // Once the load returned, the tag sleeps.
        let items = [vmmw_tag_policy_t {
            tag: t.0,
            policy: VMMW_POLICY_DISCARD,
        }];
        assert_eq!(vmmw_pool_sleep(pool, items.as_ptr(), 1, ptr::null_mut()), 0);
        vmmw_loader_free(loader);
        vmmw_pool_free(pool);
    }
}
