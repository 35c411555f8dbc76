//! Compressed sleeps stopped midway and finished by sleeping again, with
//! physical chunks that end inside a codec frame (chunk_bytes not a multiple
//! of the frame): the finished backup is a whole one, its frames one after
//! another over the segment, so a wake of replicas from it (which takes the
//! frames as they lie) gets every byte, as a plain wake does; and swaps of
//! tags such a sleep left partly asleep, on either side, lose nothing.

use std::sync::Arc;

use crate::codec::normal_bf16;
use crate::replica_wake_compressed::{assert_exact, with_blocks};
use vmmweights::devices::replicas::{
    sleep_with, wake_from_backup, Replica, ReplicaSleepOptions, ReplicaWakeOptions,
};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::pool::PoolConfig;
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::{tag, Driver, Pool};

const G: usize = 64 << 10;

fn pools(n: i32) -> Vec<Pool> {
    (0..n)
        .map(|k| {
            let cfg = HostConfig {
                granularity: G,
                memory_limit: 1 << 30,
            };
            let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(cfg, k).unwrap());
            let config = PoolConfig {
                large_segment_bytes: 16 * G,
                // 192 KiB chunks: frames of 1 MiB end inside one.
                chunk_bytes: 3 * G,
                sleep: SleepOptions {
                    copy_piece_bytes: 1 << 20,
                    // Woken memory keeps chunks of that size too.
                    wake_coalesce_bytes: 3 * G,
                    codec_frame_bytes: 1 << 20,
                    codec_ring: 2,
                    ..SleepOptions::default()
                },
                ..PoolConfig::default()
            };
            Pool::new(d, config).unwrap()
        })
        .collect()
}

#[test]
fn replicas_wake_from_a_compressed_backup_finished_after_a_stop() {
    for nth in 2..=4 {
        let pools = pools(2);
        let name = format!("stale-replicas-{nth}");
        let (t, ptrs, data) = with_blocks(&pools, &name, vec![normal_bf16(2 << 20, 0.02, 5)]);
        let m: Vec<Replica<'_>> = pools.iter().map(|pool| Replica { pool, tag: t }).collect();
        let opts = ReplicaSleepOptions {
            holder_policy: Policy::OffloadCompressed,
        };
        let h = pools[0].driver().as_host().unwrap();
        h.fail_nth(FaultOp::CopyDtoh, nth);
        let stopped = sleep_with(&m, &opts);
        h.clear_faults();
        assert!(stopped.is_err(), "copy #{nth}: the fault was not reached");
        sleep_with(&m, &opts).unwrap();
        wake_from_backup(&m, &ReplicaWakeOptions::default())
            .unwrap_or_else(|e| panic!("copy #{nth}: {e}"));
        assert_exact(&pools, &ptrs, &data, &format!("copy #{nth}"));
    }
}

#[test]
fn a_plain_wake_and_backup_reads_after_a_compressed_sleep_finished_after_a_stop() {
    for nth in 2..=4 {
        let pools = pools(1);
        let p = &pools[0];
        let t = tag::id(&format!("stale-plain-{nth}")).unwrap();
        let data = normal_bf16(2 << 20, 0.02, 6);
        let b = p.alloc_tagged(data.len(), t).unwrap();
        // SAFETY: a live awake block of this pool, nothing else touches it.
        unsafe { p.write(b.ptr, &data) }.unwrap();
        let h = p.driver().as_host().unwrap();
        h.fail_nth(FaultOp::CopyDtoh, nth);
        assert!(p.sleep(&[(t, Policy::OffloadCompressed)]).is_err());
        h.clear_faults();
        // Every byte a backup read returns is the block's.
        let mut got = vec![0u8; data.len()];
        for at in (0..data.len()).step_by(G) {
            let n = G.min(data.len() - at);
            if p.read_backup(b.ptr + at as u64, &mut got[..n]).is_ok() {
                assert!(
                    got[..n] == data[at..at + n],
                    "copy #{nth}: a stale read at {at}"
                );
            }
        }
        p.sleep(&[(t, Policy::OffloadCompressed)]).unwrap();
        p.read_backup(b.ptr, &mut got).unwrap();
        assert!(got == data, "copy #{nth}: the finished backup");
        p.wake(&[t]).unwrap();
        let mut back = vec![0u8; data.len()];
        // SAFETY: awake, nothing else touches it.
        unsafe { p.read(b.ptr, &mut back) }.unwrap();
        assert!(back == data, "copy #{nth}: the woken block");
    }
}

/// Swaps of tags a stopped sleep left partly asleep (chunks still mapped,
/// stale in their backups), on either side: the sleeping one is finished
/// (its stale chunks copied again), the waking one keeps what its mapped
/// chunks hold, and every byte of both comes back.
#[test]
fn swaps_of_tags_a_stopped_sleep_left_partly_asleep() {
    // Raw copies go chunk by chunk, compressed ones frame by frame: the
    // counts stop each after its first run of chunks is released.
    for (policy, counts) in [
        (Policy::Offload, [8, 14]),
        (Policy::OffloadCompressed, [3, 4]),
    ] {
        for nth in counts {
            let what = format!("{policy:?}, copy #{nth}");
            let pools = pools(1);
            let p = &pools[0];
            let h = p.driver().as_host().unwrap();
            let blocks: Vec<(tag::TagId, u64, Vec<u8>)> = ["a", "b"]
                .iter()
                .enumerate()
                .map(|(k, n)| {
                    let t = tag::id(&format!("stale-swap-{n}-{policy:?}-{nth}")).unwrap();
                    let data = normal_bf16(2 << 20, 0.02, 7 + k as u64);
                    let b = p.alloc_tagged(data.len(), t).unwrap();
                    // SAFETY: a live awake block of this pool, nothing else touches it.
                    unsafe { p.write(b.ptr, &data) }.unwrap();
                    (t, b.ptr, data)
                })
                .collect();
            let (a, b) = (blocks[0].0, blocks[1].0);
            let same = |(t, ptr, data): &(tag::TagId, u64, Vec<u8>), when: &str| {
                assert!(!p.is_tag_asleep(*t), "{what}, {when}");
                let mut got = vec![0u8; data.len()];
                // SAFETY: awake, nothing else touches it.
                unsafe { p.read(*ptr, &mut got) }.unwrap();
                assert!(got == *data, "{what}, {when}: bytes differ");
            };
            // b stops midway, then a swap wakes it while a sleeps.
            h.fail_nth(FaultOp::CopyDtoh, nth);
            assert!(p.sleep(&[(b, policy)]).is_err(), "{what}");
            h.clear_faults();
            assert!(p.is_tag_asleep(b), "{what}: b partly asleep");
            let out = p.swap(&[(a, policy)], &[b]).unwrap();
            assert!(
                out.is_ok(),
                "{what}: {:?} / {:?}",
                out.sleep_error,
                out.wake_error
            );
            same(&blocks[1], "b woken from a stopped sleep");
            // a stops midway; a swap finishes its sleep (and b's), the next
            // one wakes both.
            p.wake(&[a]).unwrap();
            h.fail_nth(FaultOp::CopyDtoh, nth);
            assert!(p.sleep(&[(a, policy)]).is_err(), "{what}");
            h.clear_faults();
            assert!(p.is_tag_asleep(a), "{what}: a partly asleep");
            let out = p.swap(&[(a, policy), (b, policy)], &[]).unwrap();
            assert!(out.is_ok(), "{what}: {:?}", out.sleep_error);
            let mut got = vec![0u8; blocks[0].2.len()];
            p.read_backup(blocks[0].1, &mut got).unwrap();
            assert!(got == blocks[0].2, "{what}: a's finished backup");
            let out = p.swap(&[], &[a, b]).unwrap();
            assert!(out.is_ok(), "{what}: {:?}", out.wake_error);
            same(&blocks[0], "a");
            same(&blocks[1], "b");
            p.check_invariants().unwrap();
        }
    }
}
