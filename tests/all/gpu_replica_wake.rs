//! Replicas asleep on one host backup on real GPUs (scripts/gpu.d/70-multi.sh):
//! the same blocks and bytes in a tag on every device, slept with one backup
//! (the first device's; the others release their memory), woken on every
//! device from it (each device a part over its link, the rest over peer
//! copies, then with peer copies off), byte-exact on every device after each;
//! then a host copy and a peer copy made to fail on the last device mid-wake
//! (the driver's fault table, on both backends): every replica stays asleep
//! with its memory released, and the retry is byte-exact. The same from one
//! compressed backup (the holder slept with OffloadCompressed), every device
//! decoding a share of its frames.
//!
//! With `VMMW_BACKEND=cuda` this uses every CUDA device that opens (at least
//! two that reach each other; it skips with a message otherwise); on the host
//! backend it runs on three simulated devices, so CI runs the same code. More
//! failure cases (a device out of memory, faults on other devices) are in
//! `replica_wake.rs`.

use crate::codec::normal_bf16;
use crate::common;
use crate::replica_wake_compressed::{assert_exact, with_blocks};

use common::backend::skip;
use common::pool::{device_pools, Rng, G};
use vmmweights::devices::replicas::{
    sleep as sleep_replicas, sleep_with, wake_from_backup as wake_replicas_from_backup, Replica,
    ReplicaSleepOptions, ReplicaWakeOptions,
};
use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::testing::Testing;
use vmmweights::driver::BackendKind;
use vmmweights::sleep::Policy;
use vmmweights::{Error, Pool};

/// Pools on the devices and the size of a big block.
fn pools() -> Option<(Vec<Pool>, usize)> {
    let (pools, cuda) = device_pools("gpu_replica_wake", usize::MAX, 3)?;
    Some((pools, if cuda { 256 << 20 } else { 5 * G + 4321 }))
}

#[test]
fn replicas_wake_from_one_backup_byte_exact_on_every_device() {
    let Some((pools, big)) = pools() else {
        return;
    };
    let n = pools.len();
    let mut rng = Rng(0x5eed);
    let sizes = [big, 3000, big / 2 + 17, 1 << 20];
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&s| (0..s).map(|_| rng.next() as u8).collect())
        .collect();
    let (t, ptrs, data) = with_blocks(&pools, "gpu-replica-wake", data);
    let check = |what: &str| assert_exact(&pools, &ptrs, &data, what);
    let group: Vec<Replica<'_>> = pools.iter().map(|pool| Replica { pool, tag: t }).collect();
    for (round, peer_copies) in [(1, true), (2, false), (3, true)] {
        let free_awake: Vec<u64> = pools
            .iter()
            .map(|p| p.driver().mem_info().unwrap().free)
            .collect();
        let s = sleep_replicas(&group).unwrap();
        for (k, p) in pools.iter().enumerate() {
            let free = p.driver().mem_info().unwrap().free;
            assert!(
                free > free_awake[k],
                "device {k}: memory released while asleep"
            );
            assert_eq!(
                p.sleep_engine().backup_held_bytes() > 0,
                k == 0,
                "device {k}: the backup is on device 0 only"
            );
        }
        let o = ReplicaWakeOptions {
            peer_copies,
            ..ReplicaWakeOptions::default()
        };
        let w = wake_replicas_from_backup(&group, &o).unwrap();
        let want_host = if peer_copies {
            s.backup_bytes
        } else {
            s.backup_bytes * n as u64
        };
        assert_eq!(w.host_bytes, want_host, "round {round}");
        assert_eq!(w.delivered_bytes, s.backup_bytes * n as u64);
        println!(
            "round {round} ({}): {n} devices, backup {:.1} MB, wake {:.4} s = {:.1} GB/s delivered \
             (map {:.4} s, host {:.4} s, peer {:.4} s, {} direct pairs)",
            if peer_copies { "peer copies" } else { "every device from the backup" },
            s.backup_bytes as f64 / 1e6,
            w.seconds,
            w.aggregate_gbps(),
            w.map_seconds,
            w.host_seconds,
            w.peer_seconds,
            w.direct_pairs
        );
        check(&format!("round {round}"));
    }

    // A device failing mid-wake loses nothing; the retry restores every byte.
    let last = pools.last().unwrap();
    let faults = last
        .driver()
        .faults()
        .expect("both backends have a fault table");
    // Pieces small enough that every device's part takes several copies.
    let pieces = ReplicaWakeOptions {
        copy_piece_bytes: big / 4,
        ..ReplicaWakeOptions::default()
    };
    for (op, nth) in [(FaultOp::CopyHtod, 2), (FaultOp::CopyPeer, 1)] {
        sleep_replicas(&group).unwrap();
        let asleep: Vec<u64> = pools
            .iter()
            .map(|p| p.driver().mem_info().unwrap().free)
            .collect();
        faults.fail_nth(op, nth);
        let err = wake_replicas_from_backup(&group, &pieces).unwrap_err();
        faults.clear();
        let dev = last.device();
        assert!(
            err.to_string().contains(&format!("device {dev}")),
            "{op:?}: {err}"
        );
        for (k, p) in pools.iter().enumerate() {
            assert!(p.is_tag_asleep(t), "{op:?}: device {k} stays asleep");
            let free = p.driver().mem_info().unwrap().free;
            // Other processes may move a GPU's free memory a little; the
            // replica's memory (hundreds of MB) must be released again.
            assert!(
                free + (16 << 20) >= asleep[k],
                "{op:?}: device {k} kept memory mapped"
            );
        }
        println!(
            "fault {op:?} on device {dev} mid-wake: every replica asleep, memory released ({err})"
        );
        wake_replicas_from_backup(&group, &pieces).unwrap();
        check(&format!("retry after {op:?}"));
    }
}

/// Replicas asleep on one compressed backup (the holder slept with
/// OffloadCompressed): every device decodes a share of the holder's frames
/// and pulls the rest over peer copies (then, with peer copies off, decodes
/// every frame), byte-exact on every device; a decode made to fail on the
/// last device mid-wake (peer copies off, so it decodes) leaves every
/// replica asleep, and the retry is byte-exact. Skips on cuda without the codec kernels.
#[test]
fn replicas_wake_from_one_compressed_backup_byte_exact_on_every_device() {
    let test = "replicas_wake_from_one_compressed_backup_byte_exact_on_every_device";
    let Some((pools, big)) = pools() else {
        return;
    };
    let n = pools.len();
    let mut rng = Rng(0xc0de);
    let data: Vec<Vec<u8>> = vec![
        normal_bf16(big / 2 + 5, 0.02, 71),
        (0..3000).map(|_| rng.next() as u8).collect(),
        normal_bf16(big / 4 + 17, 1.0, 72),
        (0..(1 << 20) + 3).map(|_| rng.next() as u8).collect(),
    ];
    let (t, ptrs, data) = with_blocks(&pools, "gpu-replica-wake-compressed", data);
    let check = |what: &str| assert_exact(&pools, &ptrs, &data, what);
    let group: Vec<Replica<'_>> = pools.iter().map(|pool| Replica { pool, tag: t }).collect();
    let coded = ReplicaSleepOptions {
        holder_policy: Policy::OffloadCompressed,
    };
    for (round, peer_copies) in [(1, true), (2, false), (3, true)] {
        let s = match sleep_with(&group, &coded) {
            Err(Error::Unsupported(why)) if pools[0].driver().kind() == BackendKind::Cuda => {
                skip(test, &why);
                return;
            }
            r => r.unwrap(),
        };
        assert!(s.backup_bytes < s.backup_raw_bytes, "round {round}: {s:?}");
        let o = ReplicaWakeOptions {
            peer_copies,
            ..ReplicaWakeOptions::default()
        };
        let w = wake_replicas_from_backup(&group, &o).unwrap();
        let copies = if peer_copies { 1 } else { n as u64 };
        assert_eq!(w.host_bytes, s.backup_bytes * copies, "round {round}");
        assert_eq!(
            w.decoded_bytes,
            s.backup_raw_bytes * copies,
            "round {round}"
        );
        assert_eq!(w.delivered_bytes, s.backup_raw_bytes * n as u64);
        println!(
            "compressed round {round} ({}): {n} devices, backup {:.1} MB for {:.1} MB raw, wake \
             {:.4} s = {:.1} GB/s delivered (map {:.4} s, host+decode {:.4} s, peer {:.4} s)",
            if peer_copies {
                "peer copies"
            } else {
                "every device decodes every frame"
            },
            s.backup_bytes as f64 / 1e6,
            s.backup_raw_bytes as f64 / 1e6,
            w.seconds,
            w.aggregate_gbps(),
            w.map_seconds,
            w.host_seconds,
            w.peer_seconds
        );
        check(&format!("compressed round {round}"));
    }
    let last = pools.last().unwrap();
    let faults = last
        .driver()
        .faults()
        .expect("both backends have a fault table");
    sleep_with(&group, &coded).unwrap();
    // Without peer copies every device decodes every frame, the last one too.
    let every = ReplicaWakeOptions {
        peer_copies: false,
        ..ReplicaWakeOptions::default()
    };
    faults.fail_nth(FaultOp::Codec, 1);
    let err = wake_replicas_from_backup(&group, &every).unwrap_err();
    faults.clear();
    assert!(
        err.to_string()
            .contains(&format!("device {}", last.device())),
        "{err}"
    );
    for (k, p) in pools.iter().enumerate() {
        assert!(p.is_tag_asleep(t), "device {k} stays asleep after {err}");
    }
    println!(
        "a decode failing on device {} mid-wake: every replica asleep ({err})",
        last.device()
    );
    wake_replicas_from_backup(&group, &ReplicaWakeOptions::default()).unwrap();
    check("retry after a failed decode");
}
