//! The staging ring's shape as the copy engine chooses it on the host backend:
//! a page-cached load uses the slots `geometry` sizes for this machine's
//! last-level cache; a checkpoint dropped from the page cache is read with
//! large slots by pread; both land the file's exact bytes.

mod common;

use std::os::fd::AsRawFd;

use common::loader::*;
use vmmweights::loader::copy::geometry::{self, CachedFill};
use vmmweights::loader::copy::staging::resident_fraction;
use vmmweights::loader::*;

/// Loads in one process share the cache (`geometry::ActiveWorkers`), so the
/// tests here, which check the geometry one load gets, run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// About 28 MB of bf16: enough 1 MiB residency probes to tell cached from cold.
const MEDIUM: Shape = Shape {
    layers: 4,
    hidden: 512,
    inter: 1024,
    vocab: 4000,
    heads: 8,
    kv_heads: 4,
    head_dim: 64,
    tied: false,
    qk_norm: true,
};

/// A fresh two-shard MEDIUM checkpoint: its tensors and the folder holding it.
fn medium_checkpoint() -> (Tensors, tempfile::TempDir) {
    let t = generate(&MEDIUM, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    (t, dir)
}

/// Load `dir` (written from `t`) with `copy`; assert every tensor's bytes
/// against `t` (not the file, which would pull it into the page cache); return
/// the stats.
fn load_with(dir: &std::path::Path, t: &Tensors, copy: CopyOptions) -> CopyStats {
    let d = host();
    let ckpt = Checkpoint::open(dir).unwrap();
    let rules = Rules::default();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 64 << 20);
    fill_pattern(d.as_ref(), &reg);
    let opts = LoadOptions {
        copy,
        ..Default::default()
    };
    let ex = load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    assert_eq!(reg.iter().count(), t.len());
    for (n, (_, bytes)) in t {
        let dst = reg.get(n).unwrap();
        assert!(
            read(d.as_ref(), dst.ptr, dst.bytes()) == *bytes,
            "{n}: loaded bytes differ from the file"
        );
    }
    ex.stats
}

fn load_default(dir: &std::path::Path, t: &Tensors) -> CopyStats {
    load_with(dir, t, CopyOptions::default())
}

/// The geometry `workers` staging workers should get on this machine.
fn expected(workers: usize) -> geometry::Geometry {
    // No other load runs meanwhile (`serial`).
    let usable = geometry::cache_share(geometry::last_level_caches(), workers, 0);
    geometry::for_cache(usable, workers)
}

fn shard_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    v
}

/// Write back and drop the files' pages from the page cache (no root needed
/// for clean pages). Returns the share of their pages still resident.
fn drop_from_page_cache(files: &[std::path::PathBuf]) -> f64 {
    let (mut resident, mut total) = (0.0, 0.0);
    for p in files {
        let f = std::fs::File::open(p).unwrap();
        f.sync_all().unwrap();
        // SAFETY: advice on a file descriptor we own; no memory is touched.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0, "posix_fadvise on {}", p.display());
        let len = f.metadata().unwrap().len() as usize;
        // SAFETY: a read-only private mapping of a file we hold open, dropped below.
        let m = unsafe { memmap2::Mmap::map(&f) }.unwrap();
        resident += resident_fraction(m.as_ptr(), len) * len as f64;
        total += len as f64;
    }
    resident / total
}

#[test]
fn page_cached_load_uses_the_slots_sized_for_this_machines_cache() {
    let _one = serial();
    let (t, dir) = medium_checkpoint();
    let stats = load_default(dir.path(), &t);
    let want = expected(stats.threads);
    assert_eq!(stats.slot_bytes, want.slot_bytes as u64, "{stats:?}");
    assert_eq!(stats.depth, want.depth, "{stats:?}");
    assert_eq!(
        stats.cache_resident,
        want.fill == CachedFill::CacheResident,
        "{stats:?}"
    );
    assert_eq!(stats.read_bytes, 0, "page-cached data is copied, not read");
    assert!(stats.ring_bytes >= (stats.threads * want.depth * want.slot_bytes) as u64);
    // Cache-resident slots are filled with plain stores, the others streamed.
    let want_streamed = match want.fill {
        CachedFill::CacheResident => 0,
        CachedFill::Streaming => stats.staged_bytes,
    };
    assert_eq!(stats.streamed_bytes, want_streamed, "{stats:?}");
}

#[test]
fn slots_given_too_large_for_the_cache_are_streamed() {
    let _one = serial();
    let (t, dir) = medium_checkpoint();
    let slot = 32 << 20;
    let stats = load_with(
        dir.path(),
        &t,
        CopyOptions {
            threads: 2,
            slot_bytes: slot,
            ..Default::default()
        },
    );
    let usable = geometry::cache_share(geometry::last_level_caches(), 2, 0);
    let want = geometry::with_overrides(usable, 2, Some(slot), None);
    assert_eq!(
        (stats.slot_bytes, stats.depth),
        (slot as u64, want.depth),
        "{stats:?}"
    );
    assert_eq!(stats.staged_bytes, stats.bytes, "{stats:?}");
    // 2 x 2 x 32 MiB fits half of a last-level cache only from 256 MiB up: on
    // smaller ones (CI's) this takes the streaming branch.
    if want.fill == CachedFill::Streaming {
        assert_eq!(want.depth, geometry::LARGE.depth);
        assert!(!stats.cache_resident, "{stats:?}");
        assert_eq!(stats.streamed_bytes, stats.staged_bytes, "{stats:?}");
    } else {
        assert!(stats.cache_resident, "{stats:?}");
        assert_eq!(stats.streamed_bytes, 0, "{stats:?}");
    }
}

#[test]
fn a_load_running_meanwhile_leaves_a_smaller_share_of_the_cache() {
    let _one = serial();
    let (t, dir) = medium_checkpoint();
    let caches = geometry::last_level_caches();
    // Stand-in for loads on other devices: 62 staging workers running.
    let (others, _) = geometry::ActiveWorkers::enter(62);
    let stats = load_with(
        dir.path(),
        &t,
        CopyOptions {
            threads: 2,
            ..Default::default()
        },
    );
    drop(others);
    let shared = geometry::for_cache(geometry::cache_share(caches, 2, 62), 2);
    assert_eq!(
        (stats.slot_bytes, stats.depth),
        (shared.slot_bytes as u64, shared.depth),
        "{stats:?}"
    );
    // Where this machine's cache would give 2 workers alone cache-resident
    // slots, 64 workers sharing it get less or none (CI's 32 MiB L3: 4 MiB
    // slots alone, the large streamed shape shared).
    let alone = geometry::for_cache(geometry::cache_share(caches, 2, 0), 2);
    if alone.fill == CachedFill::CacheResident {
        assert!(shared.slot_bytes < alone.slot_bytes || shared == geometry::LARGE);
    }
}

#[test]
fn hybrid_without_direct_windows_sizes_slots_for_all_its_workers() {
    let _one = serial();
    let (t, dir) = medium_checkpoint();
    // 0% direct: no windows, so all 3 threads stage.
    let stats = load_with(
        dir.path(),
        &t,
        CopyOptions {
            strategy: Strategy::Hybrid,
            threads: 3,
            direct_percent: 0,
            ..Default::default()
        },
    );
    assert_eq!(stats.direct_bytes, 0, "{stats:?}");
    let want = expected(3);
    assert_eq!(
        (stats.slot_bytes, stats.depth),
        (want.slot_bytes as u64, want.depth),
        "{stats:?}"
    );
}

#[test]
fn cold_checkpoint_is_read_with_large_slots() {
    let _one = serial();
    let (t, dir) = medium_checkpoint();
    let left = drop_from_page_cache(&shard_files(dir.path()));
    if left > 0.2 {
        eprintln!(
            "SKIP cold_checkpoint_is_read_with_large_slots: {:.0}% of the shards stayed in the \
             page cache after POSIX_FADV_DONTNEED (a tmpfs or similar temp dir), so no cold load \
             can be staged here",
            100.0 * left
        );
        return;
    }
    let stats = load_default(dir.path(), &t);
    assert_eq!(
        stats.slot_bytes,
        geometry::LARGE.slot_bytes as u64,
        "{stats:?}"
    );
    assert_eq!(stats.depth, geometry::LARGE.depth, "{stats:?}");
    assert!(!stats.cache_resident, "{stats:?}");
    assert!(
        stats.read_bytes > 0,
        "cold slots are read with pread: {stats:?}"
    );
}
