//! Loading generated checkpoints on the host backend: bytes equal the file's,
//! for every strategy, single file and sharded, with tiny windows and slots so
//! every cut in the copy engine is exercised.

use crate::common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use common::loader::*;
use vmmweights::loader::copy::staging;
use vmmweights::loader::*;
use vmmweights::sleep::reload::ReloadSource;
use vmmweights::Error;

fn identity_load(dir: &std::path::Path, opts: CopyOptions) {
    let d = host();
    let ckpt = Checkpoint::open(dir).unwrap();
    let rules = Rules::default();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    fill_pattern(d.as_ref(), &reg);
    let expect: Vec<(String, Vec<u8>)> = ckpt
        .tensors
        .keys()
        .map(|n| (n.clone(), ckpt.tensor_bytes(n).unwrap().to_vec()))
        .collect();
    let lo = LoadOptions {
        plan: PlanOptions::default(),
        copy: opts,
        reload_check: false,
    };
    let ex = load(&d, ckpt, &rules, &reg, &lo, &Control::default()).unwrap();
    for (n, bytes) in &expect {
        let dst = reg.get(n).unwrap();
        assert_eq!(
            &read(d.as_ref(), dst.ptr, dst.bytes()),
            bytes,
            "{n} with {opts:?}"
        );
    }
    assert_eq!(
        ex.stats.bytes,
        expect.iter().map(|(_, b)| b.len() as u64).sum::<u64>()
    );
}

#[test]
fn every_strategy_loads_exact_bytes_single_and_sharded() {
    let t = generate(&SMALL, Dtype::Bf16);
    let single = tempfile::tempdir().unwrap();
    write_file(&single.path().join("model.safetensors"), &t, Dtype::Bf16);
    let sharded = tempfile::tempdir().unwrap();
    write_sharded(sharded.path(), &t, Dtype::Bf16, 3);
    for strategy in [
        Strategy::Auto,
        Strategy::Direct,
        Strategy::Staged,
        Strategy::Read,
        Strategy::Simple,
        Strategy::Populate,
        Strategy::Hybrid,
        Strategy::Stream,
    ] {
        for (threads, window, slot, depth, direct_percent) in [
            (1, 64 << 20, 16 << 20, 0, 25),
            (3, 8192, 4096, 1, 50),
            (4, 12288, 8192, 2, 90),
            (5, 4096, 4096, 4, 10),
        ] {
            let o = CopyOptions {
                strategy,
                threads,
                window_bytes: window,
                slot_bytes: slot,
                depth,
                direct_percent,
            };
            identity_load(single.path(), o);
            identity_load(sharded.path(), o);
        }
    }
}

#[test]
fn symlinked_shards_load_like_the_hf_cache() {
    let t = generate(&SMALL, Dtype::Bf16);
    let blobs = tempfile::tempdir().unwrap();
    write_sharded(blobs.path(), &t, Dtype::Bf16, 2);
    let snap = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(blobs.path()).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), snap.path().join(e.file_name())).unwrap();
    }
    identity_load(snap.path(), CopyOptions::default());
}

#[test]
fn progress_reaches_total_and_cancel_leaves_destinations_untouched() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let rules = Rules::default();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    fill_pattern(d.as_ref(), &reg);

    let cancel = AtomicBool::new(true);
    let ctl = Control {
        progress: None,
        cancel: Some(&cancel),
    };
    let e = load(&d, ckpt, &rules, &reg, &LoadOptions::default(), &ctl).unwrap_err();
    assert!(matches!(e, Error::Cancelled { done: 0, .. }), "{e}");
    assert!(untouched(d.as_ref(), &reg));

    let calls = Mutex::new(Vec::new());
    let progress = |done: u64, total: u64| calls.lock().unwrap().push((done, total));
    cancel.store(false, Ordering::SeqCst);
    let ctl = Control {
        progress: Some(&progress),
        cancel: Some(&cancel),
    };
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let total = ckpt.data_bytes();
    load(&d, ckpt, &rules, &reg, &LoadOptions::default(), &ctl).unwrap();
    let calls = calls.into_inner().unwrap();
    assert_eq!(calls.last(), Some(&(total, total)));
    assert!(calls.windows(2).all(|w| w[0].0 <= w[1].0), "{calls:?}");
}

#[test]
fn executed_plan_reloads_exactly_the_requested_ranges() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let rules = Rules::preset("qwen3", Some(Tp { rank: 1, world: 2 }), SMALL.head_dim).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 8 << 20);
    let ex = load(
        &d,
        ckpt,
        &rules,
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
    let before: Vec<Vec<u8>> = reg
        .iter()
        .map(|x| read(d.as_ref(), x.ptr, x.bytes()))
        .collect();

    let covered = ex.covered_ranges();
    let total: usize = covered.iter().map(|r| r.1).sum();
    assert_eq!(total, reg.iter().map(|x| x.bytes()).sum::<usize>());

    // Wipe everything, then restore an odd-sized window in the middle and check
    // that exactly that window came back.
    fill_pattern(d.as_ref(), &reg);
    let (lo, len) = covered[0];
    let win = (lo + 1001, len / 3 + 7);
    let n = ex.reload(d.as_ref(), &[win]).unwrap();
    assert!(n as usize >= win.1);
    for (x, b) in reg.iter().zip(&before) {
        let now = read(d.as_ref(), x.ptr, x.bytes());
        for (i, (&a, &want)) in now.iter().zip(b).enumerate() {
            let addr = x.ptr + i as u64;
            let inside = addr >= win.0 && addr < win.0 + win.1 as u64;
            if inside {
                assert_eq!(a, want, "{} byte {i} inside the reloaded window", x.name);
            } else {
                assert_eq!(
                    a, PATTERN,
                    "{} byte {i} outside the window was written",
                    x.name
                );
            }
        }
    }
    // Restore everything.
    let n = ex.reload(d.as_ref(), &covered).unwrap();
    assert_eq!(n as usize, total);
    for (x, b) in reg.iter().zip(&before) {
        assert_eq!(&read(d.as_ref(), x.ptr, x.bytes()), b, "{}", x.name);
    }
}

/// Loads with the same options on one driver share one pinned staging ring:
/// the first pins it, later loads and the executed plan's Reload replays reuse
/// it, and the bytes stay exact through every reuse.
#[test]
fn staging_ring_is_reused_across_loads_and_reload_replays() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let rules = Rules::default();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    let opts = LoadOptions {
        copy: CopyOptions {
            strategy: Strategy::Read,
            threads: 3,
            slot_bytes: 8192,
            depth: 2,
            ..Default::default()
        },
        ..Default::default()
    };
    assert_eq!(
        staging::cached_staging_bytes(&d),
        0,
        "fresh driver, no ring"
    );
    let first = load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    assert!(!first.stats.ring_reused, "{:?}", first.stats);
    assert!(first.stats.ring_bytes >= 3 * 2 * 8192, "{:?}", first.stats);
    let cached = staging::cached_staging_bytes(&d);
    assert_eq!(
        cached as u64, first.stats.ring_bytes,
        "ring kept after the load"
    );

    fill_pattern(d.as_ref(), &reg);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let second = load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    assert!(second.stats.ring_reused, "{:?}", second.stats);
    assert_eq!(staging::cached_staging_bytes(&d), cached, "still one ring");
    for (name, (_, want)) in &t {
        let dst = reg.get(name).unwrap();
        assert_eq!(&read(d.as_ref(), dst.ptr, dst.bytes()), want, "{name}");
    }

    // A Reload replay runs through the same ring and restores every byte.
    fill_pattern(d.as_ref(), &reg);
    let covered = second.covered_ranges();
    second.reload(d.as_ref(), &covered).unwrap();
    let replay = second.last_replay().expect("replay statistics");
    assert!(replay.ring_reused, "{replay:?}");
    assert_eq!(replay.read_bytes, replay.bytes, "{replay:?}");
    for (name, (_, want)) in &t {
        let dst = reg.get(name).unwrap();
        assert_eq!(
            &read(d.as_ref(), dst.ptr, dst.bytes()),
            want,
            "{name} after replay"
        );
    }

    // A load needing a larger ring (rings are whole 2 MiB pages) replaces the cached one.
    let bigger = LoadOptions {
        copy: CopyOptions {
            depth: 4,
            slot_bytes: 1 << 20,
            ..opts.copy
        },
        ..opts
    };
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let third = load(&d, ckpt, &rules, &reg, &bigger, &Control::default()).unwrap();
    assert!(!third.stats.ring_reused, "{:?}", third.stats);
    assert_eq!(
        staging::cached_staging_bytes(&d) as u64,
        third.stats.ring_bytes
    );
    staging::release_staging();
    assert_eq!(staging::cached_staging_bytes(&d), 0);
}

/// A direct load replays through the staging ring (Reload must reach the link).
#[test]
fn direct_load_replays_through_the_staging_ring() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_file(&dir.path().join("model.safetensors"), &t, Dtype::Bf16);
    let d = host();
    let rules = Rules::default();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 4 << 20);
    let opts = LoadOptions {
        copy: CopyOptions {
            strategy: Strategy::Direct,
            threads: 2,
            window_bytes: 8192,
            slot_bytes: 4096,
            ..Default::default()
        },
        ..Default::default()
    };
    let ex = load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    assert_eq!(ex.stats.direct_bytes, ex.stats.bytes);
    assert_eq!(ex.replay_options().strategy, Strategy::Auto);
    fill_pattern(d.as_ref(), &reg);
    ex.reload(d.as_ref(), &ex.covered_ranges()).unwrap();
    let replay = ex.last_replay().unwrap();
    assert_eq!(replay.direct_bytes, 0, "{replay:?}");
    assert_eq!(replay.staged_bytes + replay.read_bytes, replay.bytes);
    for (name, (_, want)) in &t {
        let dst = reg.get(name).unwrap();
        assert_eq!(&read(d.as_ref(), dst.ptr, dst.bytes()), want, "{name}");
    }
}

/// Fused (qwen3 preset: qkv, gate_up, tied) loads give the same device bytes
/// through every strategy as through the plain staged path.
#[test]
fn fused_preset_loads_agree_across_strategies() {
    let t = generate(&SMALL, Dtype::Bf16);
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &t, Dtype::Bf16, 2);
    let d = host();
    let rules = Rules::preset("qwen3", None, SMALL.head_dim).unwrap();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let (_alloc, reg) = allocate_for(&d, &ckpt, &rules, 8 << 20);
    let run = |strategy: Strategy, threads: usize, slot: usize, depth: usize| {
        fill_pattern(d.as_ref(), &reg);
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let opts = LoadOptions {
            copy: CopyOptions {
                strategy,
                threads,
                slot_bytes: slot,
                window_bytes: 2 * slot,
                depth,
                ..Default::default()
            },
            ..Default::default()
        };
        load(&d, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
        reg.iter()
            .map(|x| (x.name.clone(), read(d.as_ref(), x.ptr, x.bytes())))
            .collect::<Vec<_>>()
    };
    let want = run(Strategy::Simple, 1, 16 << 20, 0);
    for strategy in [
        Strategy::Auto,
        Strategy::Staged,
        Strategy::Read,
        Strategy::Populate,
        Strategy::Hybrid,
        Strategy::Direct,
        Strategy::Stream,
    ] {
        for (threads, slot, depth) in [(0, 16 << 20, 0), (3, 4096, 1), (2, 12288, 2)] {
            let got = run(strategy, threads, slot, depth);
            for ((n, a), (_, b)) in got.iter().zip(&want) {
                assert!(
                    a == b,
                    "{n} differs with {strategy:?} threads {threads} slot {slot}"
                );
            }
        }
    }
}
