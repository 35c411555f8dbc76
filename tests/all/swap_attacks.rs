//! Attacks on swaps, waiting wakes and the chunks a stopped transition
//! leaves mapped, on the host backend: every case checks that no byte is
//! lost, or that the loss is refused loudly.

use crate::common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::loader::{generate, write_sharded, SMALL};
use vmmweights::driver::host::{FaultOp, HostConfig, HostDriver};
use vmmweights::driver::{DevicePtr, Driver};
use vmmweights::loader::{Dtype, Session};
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::tag::{self, TagId};

const G: usize = 64 << 10;
const BLOCK: usize = 4 << 20;
const POLICIES: [Policy; 4] = [
    Policy::Offload,
    Policy::OffloadCompressed,
    Policy::Discard,
    Policy::Reload,
];

fn unique(name: &str) -> TagId {
    static N: AtomicUsize = AtomicUsize::new(0);
    tag::id(&format!(
        "swap-attack-{name}-{}",
        N.fetch_add(1, Ordering::Relaxed)
    ))
    .unwrap()
}

fn config() -> PoolConfig {
    PoolConfig {
        small_segment_bytes: 4 * G,
        small_request_max: 2 * G,
        large_segment_bytes: 16 * G,
        chunk_bytes: 4 * G,
        sleep: SleepOptions {
            copy_piece_bytes: 1 << 20,
            backup_slab_bytes: 4 << 20,
            wake_coalesce_bytes: 8 * G,
            codec_frame_bytes: 1 << 20,
            codec_ring: 2,
            ..SleepOptions::default()
        },
        ..PoolConfig::default()
    }
}

struct World {
    h: Arc<HostDriver>,
    pool: Pool,
}

impl World {
    fn new(limit: u64) -> World {
        let h = Arc::new(HostDriver::new(HostConfig {
            granularity: G,
            memory_limit: limit,
        }));
        let d: Arc<dyn Driver> = h.clone();
        World {
            pool: Pool::new(d, config()).unwrap(),
            h,
        }
    }

    fn d(&self) -> &dyn Driver {
        self.h.as_ref()
    }

    /// A tag holding one block of `len` random bytes.
    fn block(&self, name: &str, len: usize, seed: u64) -> (TagId, DevicePtr, Vec<u8>) {
        let t = unique(name);
        let b = self.pool.alloc_tagged(len, t).unwrap();
        let data = pattern(seed, b.size);
        write(self.d(), b.ptr, &data);
        (t, b.ptr, data)
    }

    fn mapped(&self, t: TagId) -> u64 {
        self.pool
            .report()
            .tag(&tag::name_of(t))
            .map_or(0, |u| u.tracked_bytes)
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(d: &dyn Driver, ptr: DevicePtr, data: &[u8]) {
    // SAFETY: `ptr` is a live awake block of at least `data.len()` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_device(d, ptr, data) }.unwrap();
}

fn read(d: &dyn Driver, ptr: DevicePtr, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: `ptr` is a live awake block of at least `len` bytes.
    unsafe { vmmweights::driver::sync_copy::copy_to_host(d, &mut v, ptr) }.unwrap();
    v
}

/// The first offset where `a` and `b` differ.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// A wake that fails midway on a device that then refuses to synchronize
/// cannot unmap what it mapped: those chunks stay mapped in the asleep
/// segment, holding what the failed copies left. The next wake must still
/// restore the backup into them (they are not chunks a stopped sleep left
/// holding the bytes).
#[test]
fn a_wake_after_a_failed_wake_that_kept_its_chunks_restores_every_byte() {
    for policy in [Policy::Offload, Policy::OffloadCompressed] {
        let w = World::new(1 << 30);
        let (t, ptr, data) = w.block("kept", BLOCK, 21);
        w.pool.sleep(&[(t, policy)]).unwrap();
        assert_eq!(w.mapped(t), 0);
        // The third copy fails; the undo cannot show the device idle.
        w.h.fail_nth(FaultOp::CopyHtod, 3);
        w.h.fail_always(FaultOp::Synchronize);
        let e = w.pool.wake(&[t]).unwrap_err();
        w.h.clear_faults();
        assert!(w.pool.is_tag_asleep(t), "{policy:?}: {e}");
        assert!(
            w.mapped(t) > 0,
            "{policy:?}: the failed wake could not unmap its chunks"
        );
        w.pool.wake(&[t]).unwrap();
        let got = read(w.d(), ptr, data.len());
        assert!(
            got == data,
            "{policy:?}: byte {:?} differs after the second wake",
            first_diff(&got, &data)
        );
    }
}

/// A tag holding a loaded checkpoint whose bytes were then written over in
/// part (Reload must keep those writes: README "What Reload restores"), and
/// a block no checkpoint restores.
struct Model {
    tag: TagId,
    _session: Session,
}

fn checkpoint() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    dir
}

impl World {
    fn model(&self, dir: &std::path::Path, name: &str, seed: u64) -> Model {
        let tag = unique(name);
        let session = Session::open(dir).unwrap();
        session.allocate(&self.pool, tag).unwrap();
        session.load(&self.pool, None).unwrap();
        let b = self.pool.alloc_tagged(BLOCK, tag).unwrap();
        write(self.d(), b.ptr, &pattern(seed ^ b.ptr, b.size));
        // Every live block changed in its middle after the load.
        for blk in self.pool.live_blocks().into_iter().filter(|x| x.tag == tag) {
            let n = (blk.size / 3).clamp(1, 4096);
            write(
                self.d(),
                blk.ptr + (blk.size / 2) as u64,
                &pattern(seed ^ 0x5eed ^ blk.ptr, n.min(blk.size - blk.size / 2)),
            );
        }
        Model {
            tag,
            _session: session,
        }
    }

    fn bytes(&self, t: TagId) -> Vec<(DevicePtr, Vec<u8>)> {
        self.pool
            .live_blocks()
            .into_iter()
            .filter(|b| b.tag == t)
            .map(|b| (b.ptr, read(self.d(), b.ptr, b.size)))
            .collect()
    }

    fn same(&self, t: TagId, before: &[(DevicePtr, Vec<u8>)], what: &str) {
        let now = self.bytes(t);
        assert_eq!(now.len(), before.len(), "{what}: live blocks changed");
        for ((p, a), (q, b)) in now.iter().zip(before) {
            assert_eq!(p, q, "{what}: a block moved");
            assert!(
                a == b,
                "{what}: block at {p:#x} differs at byte {:?}",
                first_diff(a, b)
            );
        }
    }
}

/// Every policy pair, with the loaded bytes of both tags written over after
/// their load: Reload on either side keeps the writes; on a device with room
/// for both and on one with room for one and a half.
#[test]
fn every_policy_pair_keeps_bytes_written_after_the_load() {
    let dir = checkpoint();
    let probe = World::new(1 << 30);
    let one = {
        let m = probe.model(dir.path(), "probe", 0);
        probe.mapped(m.tag)
    };
    for limit in [1 << 30, one + one / 2] {
        for asleep in POLICIES {
            for sleeping in POLICIES {
                let what = format!("{sleeping:?} sleeps while {asleep:?} wakes, device {limit}");
                let w = World::new(limit);
                let a = w.model(dir.path(), "a", 31);
                w.pool.sleep(&[(a.tag, Policy::Offload)]).unwrap();
                let b = w.model(dir.path(), "b", 32);
                let bytes_b = w.bytes(b.tag);
                w.pool.sleep(&[(b.tag, asleep)]).unwrap();
                w.pool.wake(&[a.tag]).unwrap();
                let bytes_a = w.bytes(a.tag);
                let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]).unwrap();
                assert!(
                    out.is_ok(),
                    "{what}: {:?} / {:?}",
                    out.sleep_error,
                    out.wake_error
                );
                if asleep != Policy::Discard {
                    w.same(b.tag, &bytes_b, &what);
                }
                let back = w.pool.swap(&[(b.tag, asleep)], &[a.tag]).unwrap();
                assert!(
                    back.is_ok(),
                    "{what}, back: {:?} / {:?}",
                    back.sleep_error,
                    back.wake_error
                );
                if sleeping != Policy::Discard {
                    w.same(a.tag, &bytes_a, &format!("{what}, back"));
                }
                w.pool.check_invariants().unwrap();
            }
        }
    }
}

/// Each asleep byte the pool hands out of a backup is the byte the block
/// held: a read either fails loudly or returns exactly that.
fn backup_reads_are_fresh(w: &World, t: TagId, before: &[(DevicePtr, Vec<u8>)], what: &str) {
    if !w.pool.is_tag_asleep(t) {
        return;
    }
    for (p, want) in before {
        let mut got = vec![0u8; want.len()];
        if w.pool.read_backup(*p, &mut got).is_ok() {
            assert!(
                got == *want,
                "{what}: a backup read of the block at {p:#x} returned other bytes (byte {:?})",
                first_diff(&got, want)
            );
        }
    }
}

/// A swap whose sides fail midway at each driver step, then either a wake
/// straight away or a sleep that finishes first: no byte of either tag is
/// lost, and no backup read returns bytes the block did not hold. One pool
/// per policy goes through every case in turn, so what a stopped transition
/// leaves behind meets the next one.
#[test]
fn a_swap_failing_at_each_driver_step_loses_nothing() {
    let dir = checkpoint();
    let ops = [
        FaultOp::CopyDtoh,
        FaultOp::Unmap,
        FaultOp::Release,
        FaultOp::Codec,
        FaultOp::HostRegister,
        FaultOp::Hash,
        FaultOp::Create,
        FaultOp::Map,
        FaultOp::SetAccess,
        FaultOp::Reserve,
        FaultOp::CopyHtod,
        FaultOp::Synchronize,
        FaultOp::FileRead,
    ];
    let mut fired = 0;
    for sleeping in POLICIES {
        let w = World::new(1 << 30);
        let a = w.model(dir.path(), "a", 41);
        let b = w.model(dir.path(), "b", 42);
        for op in ops {
            for nth in [1, 2, 5] {
                let finish_first = nth != 2;
                let what = format!("{sleeping:?} sleeping, {op:?} #{nth}");
                let bytes_b = w.bytes(b.tag);
                // The waking side decodes frames where the fault is the codec's.
                let asleep = match op {
                    FaultOp::Codec | FaultOp::Synchronize => Policy::OffloadCompressed,
                    FaultOp::FileRead => Policy::Reload,
                    _ => Policy::Offload,
                };
                w.pool.sleep(&[(b.tag, asleep)]).unwrap();
                let bytes_a = w.bytes(a.tag);
                w.h.fail_nth(op, nth);
                let out = w.pool.swap(&[(a.tag, sleeping)], &[b.tag]);
                fired += usize::from(!w.h.fault_pending(op));
                w.h.clear_faults();
                let out = match out {
                    Ok(out) => out,
                    Err(e) => panic!("{what}: refused up front: {e}"),
                };
                if out.sleep_error.is_some() {
                    backup_reads_are_fresh(&w, a.tag, &bytes_a, &what);
                    if finish_first {
                        w.pool.sleep(&[(a.tag, sleeping)]).unwrap();
                        backup_reads_are_fresh(&w, a.tag, &bytes_a, &what);
                    }
                }
                if out.wake_error.is_some() {
                    assert!(w.pool.is_tag_asleep(b.tag), "{what}");
                    w.pool.wake(&[b.tag]).unwrap();
                }
                w.same(b.tag, &bytes_b, &format!("{what}: b"));
                w.pool.wake(&[a.tag]).unwrap();
                if sleeping != Policy::Discard {
                    w.same(a.tag, &bytes_a, &format!("{what}: a"));
                }
                w.pool.check_invariants().unwrap();
            }
        }
    }
    assert!(fired > 100, "only {fired} faults fired");
}
