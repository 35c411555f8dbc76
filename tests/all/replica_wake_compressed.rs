//! Replicas asleep on one compressed host backup (the holder slept with
//! OffloadCompressed), on the host backend's simulated devices: every member
//! woken bit for bit from the holder's frames (decoded on every device, the
//! decoded ranges exchanged over peer copies, or decoded again where a
//! device cannot read its peer), a corrupt frame and every injected driver
//! fault on any device failing the group wake with every member asleep and
//! the backup intact, and a holder policy without a full backup refused.

use crate::codec::{normal_bf16, Rng};
use crate::common;

use std::sync::Arc;

use common::fault::OPS;
use common::pool::{small_config, G};
use vmmweights::devices::replicas::{
    sleep as sleep_replicas, sleep_with, wake_from_backup, Replica, ReplicaSleepOptions,
    ReplicaSleepStats, ReplicaWakeOptions,
};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::pool::PoolConfig;
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::{tag, Driver, Error, Pool};

/// One pool per simulated device 0..n, with frames of 1 MiB in a ring of 2
/// and backup slabs of 1 MiB (so frames lie across slabs, as several runs).
fn pools(n: usize) -> Vec<Pool> {
    (0..n)
        .map(|k| {
            let cfg = HostConfig {
                granularity: G,
                memory_limit: 1 << 30,
            };
            let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(cfg, k as i32).unwrap());
            let config = PoolConfig {
                sleep: SleepOptions {
                    backup_slab_bytes: 1 << 20,
                    codec_frame_bytes: 1 << 20,
                    codec_ring: 2,
                    ..SleepOptions::default()
                },
                ..small_config()
            };
            Pool::new(d, config).unwrap()
        })
        .collect()
}

fn host(p: &Pool) -> &HostDriver {
    p.driver().as_host().unwrap()
}

/// The same blocks in every pool under `name`: bf16 weights over several
/// frames (the last one short), random bytes that stay raw, odd sizes, small
/// blocks sharing a segment. Returns the tag, each pool's block addresses
/// and the bytes.
fn replicas(pools: &[Pool], name: &str, seed: u64) -> (tag::TagId, Vec<Vec<u64>>, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = vec![
        normal_bf16((5 << 20) / 4 + 61, 0.02, seed),
        Rng::new(seed + 1).bytes((1 << 20) + 3),
        normal_bf16(1500, 1.0, seed + 2),
        normal_bf16((3 << 20) / 2 + 7, 0.02, seed + 3)[..(3 << 20) + 13].to_vec(),
        Rng::new(seed + 4).bytes(5000),
        normal_bf16(50 << 10, 0.002, seed + 5),
    ];
    with_blocks(pools, name, data)
}

/// The same kinds of blocks, fewer bytes: a segment of two frames, others of one.
fn small_replicas(
    pools: &[Pool],
    name: &str,
    seed: u64,
) -> (tag::TagId, Vec<Vec<u64>>, Vec<Vec<u8>>) {
    let data: Vec<Vec<u8>> = vec![
        normal_bf16((3 << 20) / 4 + 5, 0.02, seed),
        Rng::new(seed + 1).bytes(300_001),
        normal_bf16(1500, 1.0, seed + 2),
    ];
    with_blocks(pools, name, data)
}

/// `data` written into blocks of tag `name` in every pool.
/// Blocks holding `data` in a tag `name` on every pool: the tag, the
/// blocks' addresses per pool, and the data.
pub(crate) fn with_blocks(
    pools: &[Pool],
    name: &str,
    data: Vec<Vec<u8>>,
) -> (tag::TagId, Vec<Vec<u64>>, Vec<Vec<u8>>) {
    let t = tag::id(name).unwrap();
    let ptrs = pools
        .iter()
        .map(|p| {
            data.iter()
                .map(|d| {
                    let b = p.alloc_tagged(d.len(), t).unwrap();
                    // SAFETY: a live awake block of this pool, nothing else touches it.
                    unsafe { p.write(b.ptr, d) }.unwrap();
                    b.ptr
                })
                .collect()
        })
        .collect();
    (t, ptrs, data)
}

fn members(pools: &[Pool], t: tag::TagId) -> Vec<Replica<'_>> {
    pools.iter().map(|pool| Replica { pool, tag: t }).collect()
}

fn compressed() -> ReplicaSleepOptions {
    ReplicaSleepOptions {
        holder_policy: Policy::OffloadCompressed,
    }
}

fn sleep_compressed(pools: &[Pool], t: tag::TagId) -> ReplicaSleepStats {
    let s = sleep_with(&members(pools, t), &compressed()).unwrap();
    assert!(
        s.backup_bytes < s.backup_raw_bytes,
        "the holder's backup is encoded: {} bytes for {} raw",
        s.backup_bytes,
        s.backup_raw_bytes
    );
    s
}

/// Every pool's tag is awake and its blocks `ptrs[k]` hold `data`, byte
/// for byte; a failure names the device, the block and its first byte that
/// differs.
pub(crate) fn assert_exact(pools: &[Pool], ptrs: &[Vec<u64>], data: &[Vec<u8>], what: &str) {
    for (k, p) in pools.iter().enumerate() {
        assert!(!p.is_tag_asleep(p.segment_of(ptrs[k][0]).unwrap().tag));
        for (i, d) in data.iter().enumerate() {
            let mut got = vec![0u8; d.len()];
            // SAFETY: awake, nothing else touches it.
            unsafe { p.read(ptrs[k][i], &mut got) }.unwrap();
            let bad = got.iter().zip(d).position(|(a, b)| a != b);
            assert!(
                bad.is_none(),
                "{what}: device {k}, block {i}: bytes differ after wake, first at byte {bad:?}"
            );
        }
    }
}

fn physical(pools: &[Pool]) -> Vec<u64> {
    pools
        .iter()
        .map(|p| host(p).counts().physical_bytes)
        .collect()
}

fn small_pieces() -> ReplicaWakeOptions {
    ReplicaWakeOptions {
        copy_piece_bytes: 4 * G,
        ..ReplicaWakeOptions::default()
    }
}

fn wake_from_compressed_backup(n: usize) {
    let pools = pools(n);
    let (t, ptrs, data) = replicas(&pools, &format!("replica-codec-{n}"), 7 + n as u64);
    let awake = physical(&pools);
    let raw = awake[0];
    for cycle in 0..2 {
        let slept = sleep_compressed(&pools, t);
        assert_eq!(slept.backup_raw_bytes, raw, "the holder's memory, whole");
        assert_eq!(slept.released_bytes, raw * n as u64);
        for (k, p) in pools.iter().enumerate() {
            assert!(p.is_tag_asleep(t), "device {k} asleep");
            assert_eq!(host(p).counts().physical_bytes, 0, "device {k} released");
        }
        let w = wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
        assert_eq!(
            w.host_bytes, slept.backup_bytes,
            "cycle {cycle}: the encoded backup read once"
        );
        assert_eq!(w.decoded_bytes, raw, "every frame decoded once");
        assert_eq!(w.peer_bytes, raw * (n as u64 - 1), "the rest over peers");
        assert_eq!(w.delivered_bytes, raw * n as u64);
        assert_eq!(w.direct_pairs, 0);
        assert_eq!(physical(&pools), awake);
        assert_exact(&pools, &ptrs, &data, &format!("{n} devices, cycle {cycle}"));
    }
    // Raw and compressed backups alternate on the same group.
    sleep_replicas(&members(&pools, t)).unwrap();
    let w = wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_eq!((w.host_bytes, w.decoded_bytes), (raw, 0));
    assert_exact(&pools, &ptrs, &data, "raw after compressed");
    sleep_compressed(&pools, t);
    wake_from_backup(&members(&pools, t), &ReplicaWakeOptions::default()).unwrap();
    assert_exact(&pools, &ptrs, &data, "compressed after raw");
    for p in &pools {
        p.check_invariants().unwrap();
    }
}

#[test]
fn two_devices_wake_from_one_compressed_backup() {
    wake_from_compressed_backup(2);
}

#[test]
fn three_devices_wake_from_one_compressed_backup() {
    wake_from_compressed_backup(3);
}

#[test]
fn one_device_decodes_its_own_backup() {
    wake_from_compressed_backup(1);
}

#[test]
fn members_listed_in_another_order_get_the_holders_bytes() {
    let pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-codec-order", 11);
    sleep_compressed(&pools, t);
    let mut m = members(&pools, t);
    m.reverse();
    let w = wake_from_backup(&m, &small_pieces()).unwrap();
    assert_eq!(w.devices, vec![2, 1, 0]);
    assert_exact(&pools, &ptrs, &data, "reversed");
}

fn without_peer_access(n: usize) {
    let pools = pools(n);
    let (t, ptrs, data) = replicas(&pools, &format!("replica-codec-nopeer-{n}"), 13);
    let raw = physical(&pools)[0];
    let slept = sleep_compressed(&pools, t);
    // The last device's memory is readable by no one: the others decode the
    // frames it decoded, from the backup.
    pools[n - 1].set_peer_access(t, &[]).unwrap();
    let w = wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    let n64 = n as u64;
    assert_eq!(w.direct_pairs, n - 1);
    assert!(
        w.host_bytes > slept.backup_bytes && w.host_bytes < n64 * slept.backup_bytes,
        "{} host bytes for a backup of {}",
        w.host_bytes,
        slept.backup_bytes
    );
    assert!(w.decoded_bytes > raw && w.decoded_bytes < n64 * raw);
    assert_eq!(w.decoded_bytes + w.peer_bytes, n64 * raw, "every byte once");
    assert_exact(
        &pools,
        &ptrs,
        &data,
        &format!("{n} devices, the last unreadable"),
    );

    // Peer copies off: every device decodes every frame.
    let slept = sleep_compressed(&pools, t);
    let off = ReplicaWakeOptions {
        peer_copies: false,
        ..small_pieces()
    };
    let w = wake_from_backup(&members(&pools, t), &off).unwrap();
    assert_eq!(w.host_bytes, n64 * slept.backup_bytes);
    assert_eq!(w.decoded_bytes, n64 * raw);
    assert_eq!((w.peer_bytes, w.direct_pairs), (0, n * (n - 1)));
    assert_exact(
        &pools,
        &ptrs,
        &data,
        &format!("{n} devices, no peer copies"),
    );
}

#[test]
fn without_peer_access_devices_decode_the_frames_they_cannot_pull() {
    without_peer_access(2);
    without_peer_access(3);
}

/// What a failed group wake must leave: every member asleep with nothing
/// mapped (unless a device refused to synchronize, which keeps what it
/// mapped), no allocation in the tag, the holder's backup as it was.
fn assert_all_asleep(pools: &[Pool], t: tag::TagId, backup: u64, what: &str, unmapped: bool) {
    for (k, p) in pools.iter().enumerate() {
        assert!(p.is_tag_asleep(t), "{what}: device {k} still asleep");
        if unmapped {
            assert_eq!(
                host(p).counts().physical_bytes,
                0,
                "{what}: device {k}: nothing left mapped"
            );
        }
        assert!(
            p.alloc_tagged(64, t).is_err(),
            "{what}: device {k}: no allocation while asleep"
        );
    }
    assert_eq!(
        pools[0].sleep_engine().backup_held_bytes(),
        backup,
        "{what}: the backup stays"
    );
    let r = pools[0].report();
    let u = r.tags.iter().find(|u| u.asleep).expect("the holder's tag");
    assert!(u.host_backup_bytes < u.host_backup_raw_bytes, "{what}");
}

#[test]
fn a_frame_corrupted_on_its_way_to_any_device_fails_the_group_wake() {
    for (n, dev) in [(2usize, 0usize), (2, 1), (3, 2)] {
        let pools = pools(n);
        let (t, ptrs, data) = replicas(&pools, &format!("replica-codec-flip-{n}-{dev}"), 17);
        sleep_compressed(&pools, t);
        let backup = pools[0].sleep_engine().backup_held_bytes();
        for nth in [1, 2, 4] {
            let what = format!("{n} devices, copy {nth} to device {dev} flipped");
            host(&pools[dev])
                .faults()
                .corrupt_nth(FaultOp::CopyHtod, nth);
            let e = wake_from_backup(&members(&pools, t), &small_pieces())
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("corrupt")
                    && e.contains("checksum")
                    && e.contains(&format!("device {dev}")),
                "{what}: {e}"
            );
            assert_all_asleep(&pools, t, backup, &what, true);
        }
        wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
        assert_exact(&pools, &ptrs, &data, "after corrupt transfers");
    }
}

#[test]
fn a_corrupt_backup_fails_every_group_wake_and_nothing_wakes() {
    let pools = pools(3);
    let (t, _, _) = replicas(&pools, "replica-codec-corrupt-backup", 19);
    // The holder's second device-to-host copy is the first frame's bytes
    // (the first is its length word): one bit of the backup flips.
    host(&pools[0]).faults().corrupt_nth(FaultOp::CopyDtoh, 2);
    sleep_compressed(&pools, t);
    let backup = pools[0].sleep_engine().backup_held_bytes();
    for (round, opts) in [
        small_pieces(),
        ReplicaWakeOptions {
            peer_copies: false,
            ..small_pieces()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let e = wake_from_backup(&members(&pools, t), &opts)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("corrupt") && e.contains("checksum"),
            "{round}: {e}"
        );
        assert_all_asleep(&pools, t, backup, &format!("round {round}"), true);
    }
    // The holder alone refuses it too; the group stays as it was.
    let e = pools[0].wake(&[t]).unwrap_err().to_string();
    assert!(e.contains("corrupt"), "{e}");
    assert_all_asleep(&pools, t, backup, "the holder alone", true);
}

#[test]
fn every_injected_fault_on_any_device_leaves_the_group_asleep() {
    let mut fired = 0usize;
    let ops = OPS.iter().copied().chain([FaultOp::CopyPeer]);
    for op in ops {
        for (n, dev, nth) in [(2usize, 0usize, 1u64), (2, 1, 1), (2, 1, 2), (3, 2, 1)] {
            let what = format!("{op:?} #{nth} on device {dev} of {n}");
            let pools = pools(n);
            let (t, ptrs, data) = small_replicas(&pools, "replica-codec-faults", 23);
            sleep_compressed(&pools, t);
            let awake_backup = pools[0].sleep_engine().backup_held_bytes();
            host(&pools[dev]).fail_nth(op, nth);
            let r = wake_from_backup(&members(&pools, t), &small_pieces());
            let hit = !host(&pools[dev]).fault_pending(op);
            host(&pools[dev]).clear_faults();
            match r {
                Ok(_) => assert_exact(&pools, &ptrs, &data, &what),
                Err(e) => {
                    fired += usize::from(hit);
                    assert!(!matches!(e, Error::Panic(_)), "{what}: {e}");
                    assert!(
                        e.to_string().contains(&format!("device {dev}")),
                        "{what}: the error names the device: {e}"
                    );
                    // A device refusing to synchronize keeps what it
                    // mapped (asleep, counted as tracked).
                    let unmapped = op != FaultOp::Synchronize;
                    assert_all_asleep(&pools, t, awake_backup, &what, unmapped);
                    wake_from_backup(&members(&pools, t), &small_pieces())
                        .unwrap_or_else(|e| panic!("{what}: the retry: {e}"));
                    assert_exact(&pools, &ptrs, &data, &what);
                }
            }
            for p in &pools {
                p.check_invariants().unwrap();
            }
        }
    }
    println!("{fired} injected faults failed a group wake");
    assert!(fired > 20, "only {fired} faults failed a wake");
}

#[test]
fn a_holder_policy_without_a_full_backup_is_refused() {
    let pools = pools(2);
    let (t, ptrs, data) = replicas(&pools, "replica-codec-policy", 29);
    for policy in [Policy::Reload, Policy::Discard] {
        let e = sleep_with(
            &members(&pools, t),
            &ReplicaSleepOptions {
                holder_policy: policy,
            },
        )
        .unwrap_err();
        assert!(
            matches!(e, Error::InvalidArgument(_))
                && e.to_string().contains(&format!("{policy:?}")),
            "{e}"
        );
        for p in &pools {
            assert!(!p.is_tag_asleep(t), "{policy:?}: nothing sleeps");
        }
    }
    assert_exact(&pools, &ptrs, &data, "after refused policies");
}

#[test]
fn a_holder_backup_part_raw_part_compressed_wakes_every_member() {
    // The holder's raw sleep stops after its first segments (a copy to the
    // host fails); sleeping the group again compressed finishes it, so the
    // backup holds raw spans and codec frames side by side.
    let pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-codec-mixed", 31);
    host(&pools[0]).fail_nth(FaultOp::CopyDtoh, 3);
    sleep_replicas(&members(&pools, t)).unwrap_err();
    host(&pools[0]).clear_faults();
    assert!(pools[0].is_tag_asleep(t));
    let s = sleep_with(&members(&pools, t), &compressed()).unwrap();
    assert!(
        s.backup_bytes > 0,
        "the rest of the holder slept compressed"
    );
    let raw = physical(&pools).iter().sum::<u64>();
    assert_eq!(raw, 0, "every member released");
    let w = wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert!(
        w.decoded_bytes > 0 && w.decoded_bytes < w.delivered_bytes / 3,
        "{w:?}"
    );
    assert_exact(&pools, &ptrs, &data, "part raw, part compressed");
}

#[test]
fn a_device_without_room_for_its_codec_scratch_is_refused_before_anything_is_mapped() {
    let pools = pools(2);
    let (t, ptrs, data) = replicas(&pools, "replica-codec-room", 37);
    let awake = physical(&pools);
    sleep_compressed(&pools, t);
    // Room for device 1's memory, not for its ring of frame buffers too.
    host(&pools[1]).set_memory_limit(awake[1] + (1 << 20));
    let e = wake_from_backup(&members(&pools, t), &small_pieces()).unwrap_err();
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e}");
    assert!(e.to_string().contains("device 1"), "{e}");
    assert_eq!(physical(&pools), vec![0, 0], "nothing mapped");
    host(&pools[1]).set_memory_limit(1 << 30);
    wake_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_exact(&pools, &ptrs, &data, "after room was made");
}
