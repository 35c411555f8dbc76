//! OffloadCompressed through the pool: bytes come back bit for bit, the host
//! backup holds only encoded bytes (reported per tag and per cycle), reads of
//! asleep memory decode on the host, and a failed or corrupt wake leaves the
//! tag asleep, its memory released and its backup intact. Runs on every
//! backend (scripts/gpu.d/64-codec.sh runs it on cuda).

use std::sync::Arc;

use crate::codec::{normal_bf16, Rng};
use crate::common::backend::{on_each_backend, skip, Backend};
use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::{tag, Error};

fn pool(b: &Backend) -> Pool {
    let config = PoolConfig {
        sleep: SleepOptions {
            backup_slab_bytes: 8 << 20,
            // The 40 MiB of `fill` cross more frames than the ring holds.
            codec_frame_bytes: 16 << 20,
            codec_ring: 2,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    };
    Pool::new(b.driver.clone(), config).unwrap()
}

/// A pool whose sleeps pin their backup in slabs of `slab` bytes and code
/// frames of `frame` bytes through a ring of two buffers.
fn slab_pool(b: &Backend, slab: usize, frame: usize) -> Pool {
    let sleep = SleepOptions {
        pipeline_slab_bytes: slab,
        codec_frame_bytes: frame,
        codec_ring: 2,
        ..SleepOptions::default()
    };
    let config = PoolConfig {
        sleep,
        ..PoolConfig::default()
    };
    Pool::new(b.driver.clone(), config).unwrap()
}

fn write(d: &Arc<dyn Driver>, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: `ptr` is a live awake block of at least `data.len()` bytes.
    unsafe { d.copy_htod_async(ptr, data.as_ptr(), data.len(), StreamId::DEFAULT) }.unwrap();
    d.stream_synchronize(StreamId::DEFAULT).unwrap();
}

fn read(d: &Arc<dyn Driver>, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }.unwrap();
    d.stream_synchronize(StreamId::DEFAULT).unwrap();
    v
}

/// bf16 weights over more frames than the test pool's ring holds, a block of
/// random bytes and a small odd-sized one: `(ptr, bytes)`.
fn fill(p: &Pool, t: tag::TagId) -> Vec<(DevicePtr, Vec<u8>)> {
    let d = p.driver().clone();
    let data = vec![
        normal_bf16((40 << 20) / 2 + 12_345, 0.02, 41),
        Rng::new(42).bytes(3 << 20),
        normal_bf16(1001, 1.0, 43)[..2001].to_vec(),
    ];
    data.into_iter()
        .map(|bytes| {
            let blk = p.alloc_tagged(bytes.len(), t).unwrap();
            write(&d, blk.ptr, &bytes);
            (blk.ptr, bytes)
        })
        .collect()
}

fn check(p: &Pool, blocks: &[(DevicePtr, Vec<u8>)], what: &str) {
    let d = p.driver().clone();
    for (i, (ptr, want)) in blocks.iter().enumerate() {
        assert!(
            read(&d, *ptr, want.len()) == *want,
            "{what}: block {i} ({} bytes) differs after wake",
            want.len()
        );
    }
}

/// Sleep `t` compressed; false (after a skip) when the backend has no codec.
fn sleep_compressed(p: &Pool, t: tag::TagId, test: &str, b: &Backend) -> bool {
    match p.sleep(&[(t, Policy::OffloadCompressed)]) {
        Err(Error::Unsupported(why)) if b.is_cuda() => {
            skip(test, &why);
            false
        }
        r => {
            let cycles = r.unwrap();
            let c = &cycles[0].report;
            assert!(c.raw_bytes > 0, "{test}: the cycle reports no raw bytes");
            assert!(
                c.copied_bytes < c.raw_bytes,
                "{test}: {} encoded bytes crossed the link for {} raw",
                c.copied_bytes,
                c.raw_bytes
            );
            true
        }
    }
}

#[test]
fn bytes_come_back_and_the_backup_is_smaller() {
    let test = "bytes_come_back_and_the_backup_is_smaller";
    on_each_backend(test, |b| {
        let p = pool(b);
        let t = tag::id("compressed-weights").unwrap();
        let blocks = fill(&p, t);
        for cycle in 0..2 {
            if !sleep_compressed(&p, t, test, b) {
                return;
            }
            let r = p.report();
            let u = r
                .tags
                .iter()
                .find(|u| u.tag == "compressed-weights")
                .unwrap();
            assert!(u.asleep);
            assert_eq!(u.tracked_bytes, 0, "physical memory released");
            assert_eq!(
                u.host_backup_raw_bytes, u.offloaded_bytes,
                "raw bytes restored"
            );
            let ratio = u.host_backup_bytes as f64 / u.host_backup_raw_bytes as f64;
            // 40 MiB of bf16 at about 70%, 3 MiB random at 100%, padding zeros.
            assert!(ratio < 0.78, "cycle {cycle}: backup at {ratio:.3} of raw");
            let text = r.to_string();
            assert!(text.contains("backup compressed to"), "{text}");
            // Reads of asleep memory decode on the host.
            let (ptr, want) = &blocks[0];
            let mut got = vec![0u8; 100_000];
            p.read_backup(ptr + 3_000_001, &mut got).unwrap();
            assert!(
                got[..] == want[3_000_001..3_100_001],
                "read_backup of compressed bytes"
            );
            let w = p.wake(&[t]).unwrap();
            assert!(w[0].report.raw_bytes > w[0].report.copied_bytes);
            check(&p, &blocks, &format!("{}: cycle {cycle}", b.kind()));
        }
        // The same tag sleeps raw afterwards, then compressed again.
        p.sleep(&[(t, Policy::Offload)]).unwrap();
        p.wake(&[t]).unwrap();
        check(&p, &blocks, "Offload after OffloadCompressed");
        assert!(sleep_compressed(&p, t, test, b));
        p.wake(&[t]).unwrap();
        check(&p, &blocks, "OffloadCompressed after Offload");
    });
}

#[test]
fn a_failed_decode_leaves_the_tag_asleep_with_its_backup() {
    let test = "a_failed_decode_leaves_the_tag_asleep_with_its_backup";
    on_each_backend(test, |b| {
        let p = pool(b);
        let t = tag::id("compressed-fault").unwrap();
        let blocks = fill(&p, t);
        if !sleep_compressed(&p, t, test, b) {
            return;
        }
        let before = p.report();
        let faults = b
            .driver
            .faults()
            .expect("both backends take injected faults");
        // The second frame's decode fails (a driver error).
        faults.fail_nth(FaultOp::Codec, 2);
        let e = p.wake(&[t]).unwrap_err();
        assert!(e.to_string().contains("codec"), "{e}");
        let after = p.report();
        let (u0, u1) = (
            before
                .tags
                .iter()
                .find(|u| u.tag == "compressed-fault")
                .unwrap(),
            after
                .tags
                .iter()
                .find(|u| u.tag == "compressed-fault")
                .unwrap(),
        );
        assert!(u1.asleep, "the tag stays asleep");
        assert_eq!(
            u1.tracked_bytes, 0,
            "what the wake mapped is released again"
        );
        assert_eq!(
            u1.host_backup_bytes, u0.host_backup_bytes,
            "the backup stays"
        );
        p.wake(&[t]).unwrap();
        check(&p, &blocks, "wake after a failed decode");
    });
}

#[test]
fn a_corrupt_transfer_fails_the_wake_and_the_backup_survives() {
    let test = "a_corrupt_transfer_fails_the_wake_and_the_backup_survives";
    on_each_backend(test, |b| {
        let Some(h) = b.host() else {
            skip(
                test,
                "corrupting a transfer needs the host backend's fault injection",
            );
            return;
        };
        let p = pool(b);
        let t = tag::id("compressed-corrupt").unwrap();
        let blocks = fill(&p, t);
        assert!(sleep_compressed(&p, t, test, b));
        for nth in [1, 2, 3, 4] {
            // One bit of the nth frame copied to the device flips.
            h.faults().corrupt_nth(FaultOp::CopyHtod, nth);
            let e = p.wake(&[t]).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("corrupt")
                    && msg.contains("compressed-corrupt")
                    && msg.contains("checksum"),
                "copy {nth}: {msg}"
            );
            let u = p.report();
            let u = u
                .tags
                .iter()
                .find(|u| u.tag == "compressed-corrupt")
                .unwrap();
            assert!(
                u.asleep && u.tracked_bytes == 0,
                "copy {nth}: the tag stays asleep, released"
            );
        }
        p.wake(&[t]).unwrap();
        check(&p, &blocks, "wake after corrupt transfers");
    });
}

#[test]
fn a_backup_over_the_host_limit_is_refused_before_anything_moves() {
    // The check counts the largest the frames can be (every block raw), so a
    // sleep never runs out of host memory midway.
    let test = "a_backup_over_the_host_limit_is_refused_before_anything_moves";
    on_each_backend(test, |b| {
        let p = pool(b);
        let t = tag::id("compressed-limit").unwrap();
        let blocks = fill(&p, t);
        let committed = p
            .report()
            .tags
            .iter()
            .find(|u| u.tag == "compressed-limit")
            .unwrap()
            .tracked_bytes;
        p.set_sleep_options(SleepOptions {
            backup_slab_bytes: 1 << 20,
            // Room for the raw bytes, not for the frames' headers.
            host_memory_limit: committed,
            ..SleepOptions::default()
        })
        .unwrap();
        let e = p.sleep(&[(t, Policy::OffloadCompressed)]).unwrap_err();
        assert!(matches!(e, Error::HostOutOfMemory { .. }), "{e}");
        assert!(!p.is_tag_asleep(t), "nothing slept");
        check(&p, &blocks, "after a refused sleep");
        p.set_sleep_options(SleepOptions::default()).unwrap();
        if sleep_compressed(&p, t, test, b) {
            p.wake(&[t]).unwrap();
            check(&p, &blocks, "after a sleep with room");
        }
    });
}

/// A device too full for the codec's ring (its creation refused as out of
/// memory): the sleep keeps raw backups, as Offload, instead of failing,
/// and says so; the wake gives every byte back, and the next sleep with
/// room compresses again.
#[test]
fn a_device_too_full_for_the_codec_falls_back_to_raw_backups() {
    let test = "a_device_too_full_for_the_codec_falls_back_to_raw_backups";
    on_each_backend(test, |b| {
        let p = pool(b);
        let t = tag::id("compressed-full").unwrap();
        let blocks = fill(&p, t);
        let faults = b
            .driver
            .faults()
            .expect("both backends take injected faults");
        faults.fail_nth(FaultOp::Create, 1);
        let cycles = p.sleep(&[(t, Policy::OffloadCompressed)]).unwrap();
        faults.clear();
        let c = &cycles[0].report;
        assert!(c.codec_fallback, "{test}: {c:?}");
        assert_eq!(c.raw_bytes, 0, "{test}: nothing was encoded: {c:?}");
        let u = p.report();
        let u = u.tags.iter().find(|u| u.tag == "compressed-full").unwrap();
        assert!(u.asleep);
        assert!(
            u.host_backup_bytes >= blocks.iter().map(|b| b.1.len() as u64).sum::<u64>(),
            "{test}: a raw backup of every byte: {u:?}"
        );
        p.wake(&[t]).unwrap();
        check(&p, &blocks, "after a sleep that fell back to raw backups");
        if sleep_compressed(&p, t, test, b) {
            p.wake(&[t]).unwrap();
            check(&p, &blocks, "after a compressed sleep with room");
        }
    });
}

/// Pool `p` with frames of `frame` bytes and a ring of `ring` buffers.
fn set_codec(p: &Pool, frame: usize, ring: usize) -> vmmweights::Result<()> {
    p.set_sleep_options(SleepOptions {
        backup_slab_bytes: 8 << 20,
        codec_frame_bytes: frame,
        codec_ring: ring,
        ..SleepOptions::default()
    })
}

#[test]
fn every_frame_size_and_ring_depth_gives_the_bytes_back() {
    let test = "every_frame_size_and_ring_depth_gives_the_bytes_back";
    on_each_backend(test, |b| {
        let p = pool(b);
        let t = tag::id("compressed-ring").unwrap();
        let d = p.driver().clone();
        // Several segments of several frames each, one shorter than a frame,
        // so the ring wraps inside segments and across them.
        let blocks: Vec<(DevicePtr, Vec<u8>)> = [
            normal_bf16((5 << 20) / 2 + 777, 0.02, 51),
            Rng::new(52).bytes((1 << 20) + 4096),
            normal_bf16((3 << 20) / 2, 0.02, 53),
            normal_bf16(5000, 1.0, 54),
        ]
        .into_iter()
        .map(|bytes| {
            let blk = p.alloc_tagged(bytes.len(), t).unwrap();
            write(&d, blk.ptr, &bytes);
            (blk.ptr, bytes)
        })
        .collect();
        for (frame, ring) in [(1 << 20, 2), (1 << 20, 8), (3 << 20, 3), (64 << 20, 4)] {
            set_codec(&p, frame, ring).unwrap();
            if !sleep_compressed(&p, t, test, b) {
                return;
            }
            // Reads of asleep memory cross frame edges.
            let (ptr, want) = &blocks[0];
            let mut got = vec![0u8; 3 << 20];
            p.read_backup(ptr + 1_000_000, &mut got).unwrap();
            assert!(
                got[..] == want[1_000_000..1_000_000 + (3 << 20)],
                "frame {frame}, ring {ring}: read_backup"
            );
            p.wake(&[t]).unwrap();
            check(
                &p,
                &blocks,
                &format!("{}: frame {frame}, ring {ring}", b.kind()),
            );
        }
        // A backup made with one frame size wakes under another.
        set_codec(&p, 2 << 20, 2).unwrap();
        assert!(sleep_compressed(&p, t, test, b));
        set_codec(&p, 1 << 20, 5).unwrap();
        p.wake(&[t]).unwrap();
        check(
            &p,
            &blocks,
            "frames of 2 MiB woken with the options of 1 MiB",
        );
        // A corrupt frame deep in the ring still fails the wake, the tag asleep.
        if let Some(h) = b.host() {
            set_codec(&p, 1 << 20, 4).unwrap();
            assert!(sleep_compressed(&p, t, test, b));
            for nth in [1, 6, 9] {
                h.faults().corrupt_nth(FaultOp::CopyHtod, nth);
                let e = p.wake(&[t]).unwrap_err().to_string();
                assert!(
                    e.contains("corrupt") && e.contains("checksum"),
                    "copy {nth}: {e}"
                );
                let r = p.report();
                let u = r.tags.iter().find(|u| u.tag == "compressed-ring").unwrap();
                assert!(
                    u.asleep && u.tracked_bytes == 0,
                    "copy {nth}: asleep, released"
                );
            }
            p.wake(&[t]).unwrap();
            check(&p, &blocks, "wake after corrupt frames in a ring of 4");
        }
    });
}

#[test]
fn codec_frame_and_ring_options_out_of_range_are_refused() {
    on_each_backend(
        "codec_frame_and_ring_options_out_of_range_are_refused",
        |b| {
            let p = pool(b);
            let before = p.sleep_engine().options();
            for (frame, ring, what) in [
                (0, 3, "codec_frame_bytes"),
                ((1 << 20) + 4096, 3, "codec_frame_bytes"),
                (512 << 20, 3, "codec_frame_bytes"),
                (16 << 20, 1, "codec_ring"),
                (16 << 20, 9, "codec_ring"),
            ] {
                let e = set_codec(&p, frame, ring).unwrap_err();
                assert!(
                    matches!(e, Error::InvalidArgument(_)) && e.to_string().contains(what),
                    "frame {frame}, ring {ring}: {e}"
                );
                let now = p.sleep_engine().options();
                assert_eq!(
                    (now.codec_frame_bytes, now.codec_ring),
                    (before.codec_frame_bytes, before.codec_ring)
                );
            }
        },
    );
}

/// A first compressed sleep pins its backup in the background, in slabs of
/// the pipeline size up to the frames' bound, and keeps only what the frames
/// took: the arena ends at most one slab above the encoded bytes, and the
/// next sleep pins nothing new.
#[test]
fn a_first_sleep_pins_ahead_and_keeps_about_the_encoded_bytes() {
    let test = "a_first_sleep_pins_ahead_and_keeps_about_the_encoded_bytes";
    on_each_backend(test, |b| {
        // Pinned slabs are whole 2 MiB pages.
        let slab = 2usize << 20;
        let p = slab_pool(b, slab, 16 << 20);
        let t = tag::id("compressed-pinned-ahead").unwrap();
        let blocks = fill(&p, t);
        let held = || p.sleep_engine().backup_held_bytes();
        assert_eq!(held(), 0, "a fresh pool pins nothing");
        for cycle in 0..2 {
            let cycles = match p.sleep(&[(t, Policy::OffloadCompressed)]) {
                Err(Error::Unsupported(why)) if b.is_cuda() => return skip(test, &why),
                r => r.unwrap(),
            };
            let c = &cycles[0].report;
            let encoded = c.copied_bytes;
            assert!(encoded < c.raw_bytes * 4 / 5, "{test}: bf16 weights shrink");
            // Frames fill the slabs they take in order; the lookahead the
            // pipeline pinned past the last frame is given back.
            assert!(
                encoded <= held() && held() <= encoded + slab as u64,
                "{test}: cycle {cycle}: {} pinned for {encoded} encoded bytes (slabs of {slab})",
                held()
            );
            if cycle == 0 {
                assert!(
                    held() > encoded,
                    "{test}: the backup was pinned ahead in slabs, not frame by frame"
                );
                assert_eq!(c.newly_pinned_bytes, held());
            } else {
                assert_eq!(
                    c.newly_pinned_bytes, 0,
                    "{test}: the second sleep reuses the arena"
                );
            }
            p.wake(&[t]).unwrap();
            check(&p, &blocks, &format!("{test}: cycle {cycle}"));
        }
    });
}

/// A compressed sleep that fails at any frame (the encode of a later segment
/// after earlier ones were unmapped early), or whose background pinning fails
/// at a slab, leaves complete backups only: the
/// segments asleep hold every frame and the error counts them, the failing
/// segment stays awake with no backup; sleeping again finishes, the arena
/// ends at most one pinning slab above the encoded bytes, and every byte
/// comes back.
#[test]
fn a_sleep_failing_at_any_frame_keeps_only_complete_backups() {
    let test = "a_sleep_failing_at_any_frame_keeps_only_complete_backups";
    on_each_backend(test, |b| {
        let slab = 2usize << 20;
        let frame = 1usize << 20;
        let faults = b
            .driver
            .faults()
            .expect("both backends take injected faults");
        let mut fired_after_early = false;
        // The first frame, then (once the frames are counted) one inside the
        // first segments, the last two and one past the last; the first
        // slabs the background pinning registers.
        let mut cases = vec![(FaultOp::Codec, 1usize)];
        let mut at = 0;
        while at < cases.len() {
            let (op, nth) = cases[at];
            at += 1;
            // Small slabs: the frames' bound spans many, so the pinning runs
            // in the background and is stopped midway by the failure.
            let p = slab_pool(b, slab, frame);
            let t = tag::id("compressed-fails-midway").unwrap();
            // Frames of several segments; a bound of more than four slabs.
            let d = p.driver().clone();
            let blocks: Vec<(DevicePtr, Vec<u8>)> = [
                normal_bf16((8 << 20) / 2 + 777, 0.02, 51),
                Rng::new(52).bytes(1 << 20),
                normal_bf16(1001, 1.0, 53)[..2001].to_vec(),
            ]
            .into_iter()
            .map(|bytes| {
                let blk = p.alloc_tagged(bytes.len(), t).unwrap();
                write(&d, blk.ptr, &bytes);
                (blk.ptr, bytes)
            })
            .collect();
            // Segment base -> committed bytes, before the sleep.
            let mut segs = std::collections::BTreeMap::new();
            for (ptr, _) in &blocks {
                let s = p.segment_of(*ptr).unwrap();
                segs.insert(s.base, s.tracked_bytes);
            }
            let frames: usize = segs.values().map(|c| c.div_ceil(frame)).sum();
            if at == 1 {
                let codec = [frames / 2, frames - 1, frames, frames + 1];
                cases.extend(codec.map(|n| (FaultOp::Codec, n)));
                cases.extend((1..=3).map(|n| (FaultOp::HostRegister, n)));
            }
            let what = format!("{op:?} #{nth}");
            faults.fail_nth(op, nth as u64);
            let r = p.sleep(&[(t, Policy::OffloadCompressed)]);
            let fired = !faults.pending(op);
            faults.fail_nth(op, 0);
            match r {
                Err(Error::Unsupported(why)) if b.is_cuda() => return skip(test, &why),
                // A slab pinned ahead that fails unneeded fails nothing.
                Ok(_) if op == FaultOp::HostRegister => continue,
                Ok(_) => {
                    assert!(!fired, "{test}: {what}: a failed encode went unreported");
                    assert!(nth > frames, "{test}: {what} of {frames} did not fail");
                    continue;
                }
                Err(e) => {
                    assert!(fired, "{test}: {what}: {e}");
                    let asleep: Vec<(DevicePtr, usize)> = segs
                        .iter()
                        .filter(|(&base, _)| {
                            p.segment_of(base).unwrap().sleep_state != vmmweights::SleepState::Awake
                        })
                        .map(|(&base, &c)| (base, c))
                        .collect();
                    for &(base, _) in &asleep {
                        assert_eq!(
                            p.segment_of(base).unwrap().tracked_bytes,
                            0,
                            "{test}: {what}: an asleep segment is released"
                        );
                    }
                    let msg = e.to_string();
                    if asleep.is_empty() {
                        assert!(!msg.contains("stopped after"), "{test}: {what}: {msg}");
                    } else {
                        fired_after_early = true;
                        let want = format!("stopped after {} of {}", asleep.len(), segs.len());
                        assert!(msg.contains(&want), "{test}: {what}: {msg} (want {want})");
                    }
                    // Only complete backups: those of the asleep segments.
                    let raw = p
                        .sleep_engine()
                        .backup_raw_bytes_by_tag()
                        .get(&t)
                        .copied()
                        .unwrap_or(0);
                    let want: u64 = asleep.iter().map(|&(_, c)| c as u64).sum();
                    assert_eq!(
                        raw, want,
                        "{test}: {what}: backups restore {raw} bytes, the asleep segments hold {want}"
                    );
                }
            }
            let c = p.sleep(&[(t, Policy::OffloadCompressed)]).unwrap();
            assert!(p.is_tag_asleep(t), "{test}: {what}: asleep after the retry");
            let encoded: u64 = p
                .sleep_engine()
                .backup_bytes_by_tag()
                .get(&t)
                .copied()
                .unwrap_or(0);
            let held = p.sleep_engine().backup_held_bytes();
            assert!(
                encoded <= held && held <= encoded + slab as u64,
                "{test}: {what}: {held} pinned for {encoded} encoded bytes after the retry ({:?})",
                c[0].report
            );
            p.wake(&[t]).unwrap();
            check(&p, &blocks, &format!("{test}: {what}"));
        }
        assert!(
            fired_after_early,
            "{test}: no failure came after a segment was asleep: the tag has one segment"
        );
    });
}

/// The host-memory check of a compressed sleep counts the pinned pages its
/// frames' bound takes (every block stored raw, as random bytes are): a
/// limit of the bound itself is refused before anything moves, a limit of
/// its pages runs and the arena stays under it, pinned in the background or
/// frame by frame.
#[test]
fn the_pinned_backup_stays_under_the_limit_at_the_frames_bound() {
    let test = "the_pinned_backup_stays_under_the_limit_at_the_frames_bound";
    on_each_backend(test, |b| {
        let frame = 1usize << 20;
        let page = 2u64 << 20;
        // Background pinning (a bound over four 2 MiB slabs, and slabs of a
        // page and a half), then on demand. Whole granules of random bytes:
        // every block is stored raw.
        for (bytes, slab) in [
            (10usize << 20, 2usize << 20),
            (10 << 20, 3 << 20),
            (4 << 20, 64 << 20),
        ] {
            let p = slab_pool(b, slab, frame);
            let t = tag::id("compressed-at-the-limit").unwrap();
            let data = Rng::new(61).bytes(bytes);
            // A segment of its own, filled: no zero tail to compress.
            let blk = p.alloc_segment(data.len(), t).unwrap();
            write(p.driver(), blk.ptr, &data);
            let committed = p.segment_of(blk.ptr).unwrap().tracked_bytes;
            let bound: u64 = (0..committed)
                .step_by(frame)
                .map(|at| {
                    vmmweights::codec::format::max_frame_bytes(frame.min(committed - at)) as u64
                })
                .sum();
            let set_limit = |limit: u64| {
                let mut o = p.sleep_engine().options();
                o.host_memory_limit = limit;
                p.set_sleep_options(o).unwrap();
            };
            set_limit(bound);
            match p.sleep(&[(t, Policy::OffloadCompressed)]) {
                Err(Error::Unsupported(why)) if b.is_cuda() => return skip(test, &why),
                Err(Error::HostOutOfMemory { .. }) => {}
                r => panic!("{test}: a bound of {bound} under a limit of {bound}: {r:?}"),
            }
            assert!(!p.is_tag_asleep(t), "{test}: nothing slept");
            assert_eq!(
                p.sleep_engine().backup_held_bytes(),
                0,
                "{test}: nothing pinned"
            );
            let limit = bound.next_multiple_of(page);
            set_limit(limit);
            p.sleep(&[(t, Policy::OffloadCompressed)])
                .unwrap_or_else(|e| panic!("{test}: a bound of {bound} under {limit}: {e}"));
            let held = p.sleep_engine().backup_held_bytes();
            assert!(
                held <= limit,
                "{test}: {held} bytes pinned under a limit of {limit} (slabs of {slab})"
            );
            p.wake(&[t]).unwrap();
            check(&p, &[(blk.ptr, data)], test);
        }
    });
}
