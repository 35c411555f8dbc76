//! Peer access of a tag on real GPUs (scripts/gpu.d/70-multi.sh): granted to
//! another device, read by it over the peer link, kept across sleep/wake under
//! each policy (the remap sets access again), given to segments created after
//! the grant, and revoked from every segment.
//!
//! With `VMMW_BACKEND=cuda` this needs two CUDA devices that can reach each
//! other and skips with a message otherwise; on the host backend it runs on
//! two simulated devices, so CI runs the same code. The steps that would make
//! a GPU fault (reading memory that is asleep or whose access was revoked)
//! are only in the host-backend test `loader_multi.rs`, where they are errors.

use crate::common;

use common::pool::{device_pools, G};
use vmmweights::driver::{AccessMode, PeerAccess, StreamId};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Pool};

/// Two pools on devices 0 and 1, and the bytes per block.
fn two_pools() -> Option<(Vec<Pool>, usize)> {
    let (pools, cuda) = device_pools("gpu_peers", 2, 2)?;
    Some((pools, if cuda { 64 << 20 } else { 3 * G }))
}

fn read(pool: &Pool, ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: nothing sleeps or frees the range during the read.
    unsafe { pool.read(ptr, &mut v) }.unwrap();
    v
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len)
        .map(|i| ((i * 7 + seed * 31) % 251) as u8)
        .collect()
}

#[test]
fn a_peer_reads_a_tag_across_sleep_and_wake_and_loses_it_on_revoke() {
    let Some((pools, n)) = two_pools() else {
        return;
    };
    let (p0, p1) = (&pools[0], &pools[1]);
    let t = tag::id("gpu-peers").unwrap();
    let a = p0.alloc_tagged(n, t).unwrap();
    let b = p1.alloc_tagged(n, t).unwrap();
    let mut data = pattern(n, 1);
    // SAFETY: a live, awake block of `n` bytes.
    unsafe { p0.write(a.ptr, &data) }.unwrap();
    // Device 1 pulls `len` bytes of device 0's `src` into its block `b`.
    let pull = |src: u64, len: usize| {
        // SAFETY: b is a live block of p1 of at least `len` bytes; `src` is
        // p0 memory the caller checked device 1 may read.
        unsafe {
            p1.driver()
                .copy_peer_async(b.ptr, src, 0, len, StreamId::DEFAULT)
                .unwrap()
        };
        p1.driver().synchronize().unwrap();
        read(p1, b.ptr, len)
    };

    assert!(!p0.driver().peer_readable(a.ptr, n, 1).unwrap());
    let grant = [PeerAccess {
        device: 1,
        mode: AccessMode::Read,
    }];
    p0.set_peer_access(t, &grant).unwrap();
    assert!(p0.driver().peer_readable(a.ptr, n, 1).unwrap());
    assert!(pull(a.ptr, n) == data, "device 1 reads what device 0 holds");

    for (round, policy) in [Policy::Offload, Policy::Discard, Policy::Offload]
        .into_iter()
        .enumerate()
    {
        p0.sleep(&[(t, policy)]).unwrap();
        p0.wake(&[t]).unwrap();
        assert!(
            p0.driver().peer_readable(a.ptr, n, 1).unwrap(),
            "access is set again after the remap ({policy:?})"
        );
        if policy == Policy::Discard {
            data = pattern(n, round + 2);
            // SAFETY: as above; the tag is awake again.
            unsafe { p0.write(a.ptr, &data) }.unwrap();
        }
        assert!(
            pull(a.ptr, n) == data,
            "device 1 reads the right bytes after {policy:?} and wake"
        );
    }

    // A segment created after the grant gets it; another tag does not.
    let c = p0.alloc_tagged(2 * n, t).unwrap();
    assert!(p0.driver().peer_readable(c.ptr, 2 * n, 1).unwrap());
    let other = tag::id("gpu-peers-other").unwrap();
    let d = p0.alloc_tagged(n, other).unwrap();
    assert!(!p0.driver().peer_readable(d.ptr, n, 1).unwrap());

    // Revoked from every segment of the tag; device 0 still uses its memory.
    p0.set_peer_access(t, &[]).unwrap();
    assert!(!p0.driver().peer_readable(a.ptr, n, 1).unwrap());
    assert!(!p0.driver().peer_readable(c.ptr, 2 * n, 1).unwrap());
    assert!(p0.peer_access(t).is_empty());
    assert!(
        read(p0, a.ptr, n) == data,
        "the owner's bytes outlive the revoke"
    );

    p0.free(c.ptr).unwrap();
    p0.free(d.ptr).unwrap();
    p0.free(a.ptr).unwrap();
    p1.free(b.ptr).unwrap();
}
