//! Replicas asleep on one host backup, on the host backend's simulated
//! devices: one backup taken from the first device, every device woken from
//! it (host memory read once, parts exchanged by peer copies), the fallback
//! to copies from the backup, and devices failing mid-wake (nothing lost, a
//! retry succeeds, bytes exact on every device).

use crate::common;

use std::sync::Arc;

use common::pool::{small_config, Rng, G};
use vmmweights::devices::replicas::{
    sleep as sleep_replicas, wake_from_backup as wake_replicas_from_backup, Replica,
    ReplicaWakeOptions,
};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool};

/// One pool per simulated device 0..n.
fn pools(n: usize) -> Vec<Pool> {
    (0..n)
        .map(|k| {
            let cfg = HostConfig {
                granularity: G,
                memory_limit: 1 << 30,
            };
            let d: Arc<dyn Driver> = Arc::new(HostDriver::for_device(cfg, k as i32).unwrap());
            Pool::new(d, small_config()).unwrap()
        })
        .collect()
}

fn host(p: &Pool) -> &HostDriver {
    p.driver().as_host().unwrap()
}

/// Sizes of the blocks every replica allocates: small, large and own-segment ones.
const SIZES: [usize; 6] = [3000, 100 << 10, 7 * G + 123, 5000, 300 << 10, 2 * G];

/// The same blocks in every pool under `name`, filled with the same random
/// bytes. Returns the tag, each pool's block addresses and the bytes.
fn replicas(pools: &[Pool], name: &str, seed: u64) -> (tag::TagId, Vec<Vec<u64>>, Vec<Vec<u8>>) {
    let t = tag::id(name).unwrap();
    let mut rng = Rng(seed);
    let data: Vec<Vec<u8>> = SIZES
        .iter()
        .map(|&n| (0..n).map(|_| rng.next() as u8).collect())
        .collect();
    let ptrs = pools
        .iter()
        .map(|p| {
            SIZES
                .iter()
                .zip(&data)
                .map(|(&n, d)| {
                    let b = p.alloc_tagged(n, t).unwrap();
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

fn assert_exact(pools: &[Pool], ptrs: &[Vec<u64>], data: &[Vec<u8>]) {
    for (k, p) in pools.iter().enumerate() {
        for (i, d) in data.iter().enumerate() {
            let mut got = vec![0u8; d.len()];
            // SAFETY: awake, nothing else touches it.
            unsafe { p.read(ptrs[k][i], &mut got) }.unwrap();
            assert!(got == *d, "device {k}, block {i}: bytes differ after wake");
        }
    }
}

/// Physical bytes the tag's memory holds on each device (the host backend's count).
fn physical(pools: &[Pool]) -> Vec<u64> {
    pools
        .iter()
        .map(|p| host(p).counts().physical_bytes)
        .collect()
}

fn small_pieces() -> ReplicaWakeOptions {
    ReplicaWakeOptions {
        copy_piece_bytes: G,
        ..ReplicaWakeOptions::default()
    }
}

fn wake_from_one_backup(n: usize) {
    let pools = pools(n);
    let (t, ptrs, data) = replicas(&pools, &format!("replica-wake-{n}"), 7 + n as u64);
    let awake = physical(&pools);
    let slept = sleep_replicas(&members(&pools, t)).unwrap();
    let total: u64 = awake[0];
    assert_eq!(
        slept.backup_bytes, total,
        "the holder's memory backed up whole"
    );
    assert_eq!(slept.released_bytes, total * n as u64);
    for (k, p) in pools.iter().enumerate() {
        assert!(p.is_tag_asleep(t), "device {k} asleep");
        assert_eq!(host(p).counts().physical_bytes, 0, "device {k} released");
        let held = p.sleep_engine().backup_held_bytes();
        if k == 0 {
            assert!(held >= total, "the holder keeps the one backup");
        } else {
            assert_eq!(held, 0, "device {k} keeps no backup");
        }
    }
    let w = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_eq!(w.host_bytes, total, "host memory read once");
    assert_eq!(
        w.peer_bytes,
        total * (n as u64 - 1),
        "every other part over peers"
    );
    assert_eq!(w.delivered_bytes, total * n as u64);
    assert_eq!(w.direct_pairs, 0);
    assert_eq!(physical(&pools), awake);
    for p in &pools {
        assert!(!p.is_tag_asleep(t));
    }
    assert_exact(&pools, &ptrs, &data);
    // A second cycle works the same way (the backup memory is reused).
    sleep_replicas(&members(&pools, t)).unwrap();
    wake_replicas_from_backup(&members(&pools, t), &ReplicaWakeOptions::default()).unwrap();
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn two_devices_wake_from_one_backup_read_once() {
    wake_from_one_backup(2);
}

#[test]
fn three_and_four_devices_wake_from_one_backup_read_once() {
    wake_from_one_backup(3);
    wake_from_one_backup(4);
}

#[test]
fn one_device_is_a_plain_offload() {
    wake_from_one_backup(1);
}

#[test]
fn members_listed_in_another_order_still_restore_the_holders_bytes() {
    let pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-order", 11);
    sleep_replicas(&members(&pools, t)).unwrap();
    let mut m = members(&pools, t);
    m.reverse();
    let w = wake_replicas_from_backup(&m, &small_pieces()).unwrap();
    assert_eq!(w.devices, vec![2, 1, 0]);
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn without_peer_access_every_device_copies_from_the_backup() {
    let pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-nopeer", 13);
    let total = physical(&pools)[0];
    sleep_replicas(&members(&pools, t)).unwrap();
    // Device 2's memory is readable by no one: its part goes to the others from the backup.
    pools[2].set_peer_access(t, &[]).unwrap();
    let w = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_eq!(
        w.direct_pairs, 2,
        "devices 0 and 1 read device 2's part from the backup"
    );
    assert!(w.host_bytes > total && w.host_bytes < 3 * total);
    assert_exact(&pools, &ptrs, &data);

    // Peer copies turned off: the whole backup over every device's link.
    sleep_replicas(&members(&pools, t)).unwrap();
    let off = ReplicaWakeOptions {
        peer_copies: false,
        ..small_pieces()
    };
    let w = wake_replicas_from_backup(&members(&pools, t), &off).unwrap();
    assert_eq!(w.host_bytes, 3 * total);
    assert_eq!(w.peer_bytes, 0);
    assert_eq!(w.direct_pairs, 6);
    assert_exact(&pools, &ptrs, &data);
}

/// Arm `fault` on device `dev`, wake: it fails naming the device, every tag
/// stays asleep with nothing mapped and the backup intact; then a retry
/// restores exact bytes everywhere.
fn fault_mid_wake(n: usize, dev: usize, arm: impl Fn(&HostDriver), name: &str) {
    let pools = pools(n);
    let (t, ptrs, data) = replicas(&pools, name, 17 + dev as u64);
    sleep_replicas(&members(&pools, t)).unwrap();
    let backup = pools[0].sleep_engine().backup_held_bytes();
    arm(host(&pools[dev]));
    let err = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap_err();
    assert!(
        err.to_string().contains(&format!("device {dev}")),
        "the error names device {dev}: {err}"
    );
    for (k, p) in pools.iter().enumerate() {
        assert!(p.is_tag_asleep(t), "device {k} still asleep after {err}");
        assert_eq!(
            host(p).counts().physical_bytes,
            0,
            "device {k}: nothing left mapped"
        );
        assert!(
            p.alloc_tagged(64, t).is_err(),
            "device {k}: no allocation while asleep"
        );
    }
    assert_eq!(pools[0].sleep_engine().backup_held_bytes(), backup);
    host(&pools[dev]).clear_faults();
    wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn a_host_copy_failing_on_one_device_mid_wake_loses_nothing() {
    fault_mid_wake(3, 1, |h| h.fail_nth(FaultOp::CopyHtod, 3), "replica-htod-1");
    fault_mid_wake(2, 0, |h| h.fail_nth(FaultOp::CopyHtod, 2), "replica-htod-0");
}

#[test]
fn a_peer_copy_failing_on_one_device_mid_wake_loses_nothing() {
    fault_mid_wake(3, 2, |h| h.fail_nth(FaultOp::CopyPeer, 4), "replica-peer-2");
    fault_mid_wake(2, 1, |h| h.fail_always(FaultOp::CopyPeer), "replica-peer-1");
}

#[test]
fn a_device_out_of_memory_mid_map_loses_nothing() {
    fault_mid_wake(3, 2, |h| h.fail_nth(FaultOp::Create, 2), "replica-create-2");
}

#[test]
fn a_device_without_room_is_refused_before_anything_is_mapped() {
    let pools = pools(2);
    let (t, ptrs, data) = replicas(&pools, "replica-oom", 19);
    sleep_replicas(&members(&pools, t)).unwrap();
    host(&pools[1]).set_memory_limit(G as u64);
    let err = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err}");
    assert_eq!(physical(&pools), vec![0, 0]);
    host(&pools[1]).set_memory_limit(1 << 30);
    wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn replicas_laid_out_differently_are_refused_and_nothing_sleeps() {
    let pools = pools(2);
    let (t, _, _) = replicas(&pools, "replica-layout", 23);
    pools[1].alloc_tagged(G * 3, t).unwrap();
    let err = sleep_replicas(&members(&pools, t)).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    assert!(err.to_string().contains("laid out differently"), "{err}");
    assert!(!pools[0].is_tag_asleep(t) && !pools[1].is_tag_asleep(t));

    let same = [
        Replica {
            pool: &pools[0],
            tag: t,
        },
        Replica {
            pool: &pools[0],
            tag: t,
        },
    ];
    let err = sleep_replicas(&same).unwrap_err();
    assert!(err.to_string().contains("listed twice"), "{err}");
    assert!(sleep_replicas(&[]).is_err());
}

#[test]
fn a_member_woken_alone_leaves_the_group() {
    let pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-alone", 29);
    sleep_replicas(&members(&pools, t)).unwrap();
    // The holder woken alone gets its own backup back.
    pools[0].wake(&[t]).unwrap();
    assert_exact(&pools[..1], &ptrs[..1], &data);
    let err = wake_replicas_from_backup(&members(&pools[1..], t), &small_pieces()).unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    let err = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap_err();
    assert!(err.to_string().contains("device 0"), "{err}");
    assert!(pools[1].is_tag_asleep(t) && pools[2].is_tag_asleep(t));
    // The others wake on their own, their bytes undefined (they kept no backup).
    for p in &pools[1..] {
        p.wake(&[t]).unwrap();
        assert!(!p.is_tag_asleep(t));
    }
}

#[test]
fn a_holder_asleep_without_a_backup_is_refused() {
    let pools = pools(2);
    let (t, _, _) = replicas(&pools, "replica-discarded-holder", 31);
    pools[0].sleep(&[(t, Policy::Discard)]).unwrap();
    let err = sleep_replicas(&members(&pools, t)).unwrap_err();
    assert!(
        err.to_string().contains("without a full host backup"),
        "{err}"
    );
    assert!(
        !pools[1].is_tag_asleep(t),
        "the other replica keeps its memory"
    );
}

#[test]
fn two_groups_sharing_pools_wake_at_once_in_opposite_orders() {
    let pools = pools(2);
    let (a, pa, da) = replicas(&pools, "replica-concurrent-a", 37);
    let (b, pb, db) = replicas(&pools, "replica-concurrent-b", 41);
    for _ in 0..20 {
        sleep_replicas(&members(&pools, a)).unwrap();
        let rev: Vec<Replica<'_>> = pools
            .iter()
            .rev()
            .map(|pool| Replica { pool, tag: b })
            .collect();
        sleep_replicas(&rev).unwrap();
        std::thread::scope(|s| {
            s.spawn(|| wake_replicas_from_backup(&members(&pools, a), &small_pieces()).unwrap());
            s.spawn(|| wake_replicas_from_backup(&rev, &small_pieces()).unwrap());
        });
    }
    assert_exact(&pools, &pa, &da);
    assert_exact(&pools, &pb, &db);
}

#[test]
fn a_sleep_stopped_by_a_device_keeps_the_error_kind() {
    // The holder's backup over the host-memory limit: HostOutOfMemory (the
    // C status VMMW_HOST_OUT_OF_MEMORY), naming the device; nothing sleeps.
    let pools = pools(2);
    let (t, ptrs, data) = replicas(&pools, "replica-sleep-kind", 37);
    pools[0]
        .set_sleep_options(vmmweights::sleep::SleepOptions {
            host_memory_limit: G as u64,
            ..Default::default()
        })
        .unwrap();
    let err = sleep_replicas(&members(&pools, t)).unwrap_err();
    assert!(matches!(err, Error::HostOutOfMemory { .. }), "{err:?}");
    assert!(err.to_string().contains("device 0"), "{err}");
    assert!(
        !pools[1].is_tag_asleep(t),
        "the other replica keeps its memory"
    );

    // A load writing into a later member: LoadInProgress, the holder asleep.
    pools[0]
        .set_sleep_options(vmmweights::sleep::SleepOptions::default())
        .unwrap();
    let pin = pools[1].pin_for_load(&[(ptrs[1][0], 1, "x")]).unwrap();
    let err = sleep_replicas(&members(&pools, t)).unwrap_err();
    assert!(matches!(err, Error::LoadInProgress { .. }), "{err:?}");
    drop(pin);
    sleep_replicas(&members(&pools, t)).unwrap();
    wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn a_sleep_failing_midway_on_any_device_finishes_when_repeated() {
    // (device, step, nth): the holder's backup copy failing after some of
    // its segments slept, a later device's unmap or release failing.
    let cases = [
        (0usize, FaultOp::CopyDtoh, 2u64),
        (0, FaultOp::Unmap, 3),
        (1, FaultOp::Unmap, 2),
        (2, FaultOp::Release, 1),
    ];
    for (dev, op, nth) in cases {
        let pools = pools(3);
        let name = format!("replica-sleep-midway-{dev}-{op:?}");
        let (t, ptrs, data) = replicas(&pools, &name, 47);
        host(&pools[dev]).fail_nth(op, nth);
        sleep_replicas(&members(&pools, t)).unwrap_err();
        host(&pools[dev]).clear_faults();
        assert!(pools[0].is_tag_asleep(t), "{name}: the holder sleeps first");
        sleep_replicas(&members(&pools, t))
            .unwrap_or_else(|e| panic!("{name}: sleeping again must finish: {e}"));
        wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
        assert_exact(&pools, &ptrs, &data);
        for p in &pools {
            p.check_invariants().unwrap();
            assert_eq!(p.unreleased().segments, 0, "{name}");
        }
    }
}

#[test]
fn two_sleeps_of_one_group_at_once_leave_one_group() {
    let pools = pools(4);
    let (t, ptrs, data) = replicas(&pools, "replica-sleep-race", 53);
    for round in 0..100 {
        std::thread::scope(|s| {
            let a = s.spawn(|| sleep_replicas(&members(&pools, t)));
            let b = s.spawn(|| sleep_replicas(&members(&pools, t)));
            a.join().unwrap().unwrap();
            b.join().unwrap().unwrap();
        });
        wake_replicas_from_backup(&members(&pools, t), &small_pieces())
            .unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    assert_exact(&pools, &ptrs, &data);
}

#[test]
fn the_rest_of_a_group_whose_pool_was_dropped_wakes_with_its_bytes() {
    let mut pools = pools(3);
    let (t, ptrs, data) = replicas(&pools, "replica-dropped-pool", 59);
    sleep_replicas(&members(&pools, t)).unwrap();
    drop(pools.pop());
    let err = wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap_err();
    assert!(matches!(err, Error::InvalidState(_)), "{err}");
    // The error shows the way that keeps every member's bytes.
    assert!(err.to_string().contains("put them to sleep again"), "{err}");
    sleep_replicas(&members(&pools, t)).unwrap();
    wake_replicas_from_backup(&members(&pools, t), &small_pieces()).unwrap();
    assert_exact(&pools, &ptrs[..2], &data);
}

#[test]
fn members_slept_one_by_one_with_a_compressed_holder_form_no_group() {
    // A holder put to sleep with OffloadCompressed on its own (not by
    // `sleep_with`) forms no replica group, so the wake from one backup
    // refuses it before anything moves, and the holder still wakes from it
    // on its own.
    let pools = pools(2);
    let (t, ptrs, data) = replicas(&pools, "replica-wake-compressed", 99);
    pools[0].sleep(&[(t, Policy::OffloadCompressed)]).unwrap();
    pools[1].sleep(&[(t, Policy::Discard)]).unwrap();
    let e =
        wake_replicas_from_backup(&members(&pools, t), &ReplicaWakeOptions::default()).unwrap_err();
    assert!(
        matches!(e, Error::InvalidState(_)) && e.to_string().contains("replica group"),
        "{e}"
    );
    for (k, p) in pools.iter().enumerate() {
        assert!(p.is_tag_asleep(t), "device {k} stays asleep");
        assert_eq!(host(p).counts().physical_bytes, 0, "device {k} released");
    }
    pools[0].wake(&[t]).unwrap();
    assert_exact(&pools[..1], &ptrs[..1], &data);
}
