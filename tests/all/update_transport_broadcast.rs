//! The broadcast transport through the test collective (threads of this
//! process on the host backend), into engine ranks loaded through the llama
//! preset: a root that only sends and tensor-parallel worlds of 2, 4 and 8
//! each keeping only their slices, bitwise; a root that is an engine rank
//! too; a rank leaving mid-update failing every other rank with their last
//! version intact; ranks whose bucket sizes differ refused before any bucket
//! moves; NCCL missing or wrong named in the error.

use crate::common::loader::Tensors;
use crate::loader_tp::Model;
use crate::update_transport_ranks::{
    host_driver, model, new_values, send_tensors, write_checkpoint, Rank,
};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::nccl::Nccl;
use vmmweights::driver::testing::Testing;
use vmmweights::driver::StreamId;
use vmmweights::update::transport::broadcast::{
    self, BroadcastOptions, BroadcastSource, Collective, Ring,
};
use vmmweights::update::transport::receive;
use vmmweights::update::transport::test_collective::TestCollective;
use vmmweights::update::UpdateOptions;
use vmmweights::{DevicePtr, Error, Pool, PoolConfig, Status};

fn options(slot_bytes: usize) -> BroadcastOptions {
    BroadcastOptions {
        slots: 2,
        slot_bytes,
        timeout: Duration::from_secs(10),
    }
}

fn sender_pool() -> Arc<Pool> {
    Arc::new(Pool::new(host_driver(), PoolConfig::default()).unwrap())
}

fn run_rank(
    coll: &mut dyn Collective,
    r: &Rank,
    root: usize,
    slot: usize,
) -> vmmweights::Result<u64> {
    let ring = Ring::new(r.pool.clone(), &options(slot))?;
    let mut source = BroadcastSource::rank(coll, &ring, root);
    r.receive(&mut source).map(|d| d.version)
}

/// The test model's checkpoint loaded by both ranks of a tensor-parallel
/// world of two under `name`, and a trainer's new values (`seed`).
struct WorldOfTwo {
    m: Model,
    _dir: tempfile::TempDir,
    new: Tensors,
    ranks: [Rank; 2],
}

fn world_of_two(name: &str, seed: u64) -> WorldOfTwo {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, seed);
    let ranks = [
        Rank::load(dir.path(), &m, name, 0, 2),
        Rank::load(dir.path(), &m, name, 1, 2),
    ];
    WorldOfTwo {
        m,
        _dir: dir,
        new,
        ranks,
    }
}

/// What each rank holds now, and its version.
fn held(ranks: &[Rank]) -> Vec<(BTreeMap<String, Vec<u8>>, u64)> {
    ranks.iter().map(|r| (r.snapshot(), r.version())).collect()
}

/// Every rank still holds `before`, at the same version.
fn assert_kept(ranks: &[Rank], before: &[(BTreeMap<String, Vec<u8>>, u64)]) {
    for (r, (snap, v)) in ranks.iter().zip(before) {
        assert!(r.snapshot() == *snap, "rank {}: its last version", r.rank);
        assert_eq!(r.version(), *v, "rank {}", r.rank);
    }
}

#[test]
fn tensor_parallel_ranks_keep_only_their_slices_bitwise() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, 4000);
    let tensors = send_tensors(&new);
    for world in [2usize, 4, 8] {
        // Rank 0 is the trainer (a sender only); ranks 1..=world are the engine.
        let mut colls = TestCollective::group(world + 1, Duration::from_secs(10));
        let ranks: Vec<Rank> = (0..world)
            .map(|r| Rank::load(dir.path(), &m, "bcast-tp", r, world))
            .collect();
        let v0: Vec<u64> = ranks.iter().map(Rank::version).collect();
        let (root, others) = colls.split_at_mut(1);
        std::thread::scope(|s| {
            let root = &mut root[0];
            let tensors = &tensors;
            let sender = s.spawn(move || {
                let ring = Ring::new(sender_pool(), &options(3000)).unwrap();
                broadcast::send(root, &ring, tensors)
            });
            let handles: Vec<_> = others
                .iter_mut()
                .zip(&ranks)
                .map(|(c, r)| s.spawn(move || run_rank(c, r, 0, 3000)))
                .collect();
            sender.join().unwrap().unwrap();
            for (h, v) in handles.into_iter().zip(&v0) {
                assert_eq!(h.join().unwrap().unwrap(), v + 1);
            }
        });
        for r in &ranks {
            assert!(
                r.snapshot() == r.expected(&m, &new),
                "world {world}, rank {}: its slices of the update",
                r.rank
            );
        }
    }
}

#[test]
fn a_root_that_is_an_engine_rank_applies_the_update_too() {
    let WorldOfTwo { m, new, ranks, .. } = world_of_two("bcast-root", 5000);
    let tensors = send_tensors(&new);
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    let (a, b) = colls.split_at_mut(1);
    std::thread::scope(|s| {
        let (r0, r1) = (&ranks[0], &ranks[1]);
        let tensors = &tensors;
        let root = s.spawn(move || {
            let ring = Ring::new(r0.pool.clone(), &options(2048)).unwrap();
            let mut source = BroadcastSource::root(&mut a[0], &ring, tensors);
            r0.receive(&mut source)
        });
        let other = s.spawn(move || run_rank(&mut b[0], r1, 0, 2048));
        root.join().unwrap().unwrap();
        other.join().unwrap().unwrap();
    });
    for r in &ranks {
        assert!(r.snapshot() == r.expected(&m, &new), "rank {}", r.rank);
    }
}

/// A collective whose rank leaves (is dropped) before its `after`-th
/// broadcast: the test stand-in for a peer that dies mid-update or mid-load.
pub(crate) struct Leaving {
    pub(crate) inner: Option<TestCollective>,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) after: usize,
}

impl Collective for Leaving {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.world
    }
    unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        stream: StreamId,
    ) -> vmmweights::Result<()> {
        if self.after == 0 {
            self.inner = None;
            return Err(Error::InvalidState("this rank left".into()));
        }
        self.after -= 1;
        // SAFETY: forwarded from the caller's contract.
        unsafe {
            self.inner
                .as_mut()
                .unwrap()
                .broadcast(buf, len, root, stream)
        }
    }
    fn check(&self) -> vmmweights::Result<()> {
        self.inner.as_ref().map_or(Ok(()), |c| c.check())
    }
}

#[test]
fn a_rank_leaving_mid_update_fails_the_others_with_their_last_version() {
    let WorldOfTwo { new, ranks, .. } = world_of_two("bcast-leave", 6000);
    let tensors = send_tensors(&new);
    let before = held(&ranks);
    let [root, mut middle, mut last] = TestCollective::ranks(Duration::from_secs(10));
    std::thread::scope(|s| {
        let tensors = &tensors;
        let (r0, r1) = (&ranks[0], &ranks[1]);
        // The root leaves after the agreement (3 slot sizes, the header's
        // 2 broadcasts, 3 verdicts) and two buckets.
        let sender = s.spawn(move || {
            let ring = Ring::new(sender_pool(), &options(2048)).unwrap();
            let mut leaving = Leaving {
                inner: Some(root),
                rank: 0,
                world: 3,
                after: 10,
            };
            broadcast::send(&mut leaving, &ring, tensors)
        });
        let a = s.spawn(move || run_rank(&mut middle, r0, 0, 2048));
        let b = s.spawn(move || run_rank(&mut last, r1, 0, 2048));
        assert!(sender.join().unwrap().is_err());
        for h in [a, b] {
            let e = h.join().unwrap().unwrap_err();
            assert_eq!(e.status(), Status::UpdateSource, "{e}");
            assert!(e.to_string().contains("rank 0 left the group"), "{e}");
        }
    });
    assert_kept(&ranks, &before);
}

#[test]
fn ranks_with_different_bucket_sizes_are_refused_before_any_bucket() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, 7000);
    let tensors = send_tensors(&new);
    let r = Rank::load(dir.path(), &m, "bcast-sizes", 0, 1);
    let before = r.snapshot();
    let [mut root, mut other] = TestCollective::ranks(Duration::from_secs(10));
    std::thread::scope(|s| {
        let tensors = &tensors;
        let sender = s.spawn(move || {
            let ring = Ring::new(sender_pool(), &options(8192)).unwrap();
            broadcast::send(&mut root, &ring, tensors)
        });
        // Both ranks see both sizes and refuse alike, before the header.
        let e = run_rank(&mut other, &r, 0, 4096).unwrap_err().to_string();
        let sent = sender.join().unwrap().unwrap_err().to_string();
        for e in [e, sent] {
            assert!(
                e.contains("rank 0: 8192, rank 1: 4096 bytes")
                    && e.contains("every rank must use the same bucket size"),
                "{e}"
            );
        }
    });
    assert!(r.snapshot() == before);
}

/// A rank that refuses the update (here: it expects another version, and
/// another rank's plan names a tensor the root does not send) fails every
/// rank at once, before any bucket: each refusing rank with its own error,
/// the others naming every refusal; nothing written anywhere.
#[test]
fn a_rank_that_refuses_fails_every_rank_before_any_bucket() {
    let WorldOfTwo { new, ranks, .. } = world_of_two("bcast-refuse", 8000);
    let mut tensors = send_tensors(&new);
    // The root sends one tensor less: every engine rank's plan misses it.
    let dropped = tensors.pop().unwrap().name;
    let before = held(&ranks);
    let timeout = Duration::from_secs(20);
    let [mut root, mut c1, mut c2] = TestCollective::ranks(timeout);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        let tensors = &tensors;
        let (r0, r1) = (&ranks[0], &ranks[1]);
        let sender = s.spawn(move || {
            let ring = Ring::new(sender_pool(), &options(2048)).unwrap();
            broadcast::send(&mut root, &ring, tensors)
        });
        let a = s.spawn(move || run_rank(&mut c1, r0, 0, 2048));
        // Rank 2 also expects a version its tag is not at.
        let b = s.spawn(move || {
            let ring = Ring::new(r1.pool.clone(), &options(2048)).unwrap();
            let mut source = BroadcastSource::rank(&mut c2, &ring, 0);
            let opts = UpdateOptions::from_version(r1.version() + 5);
            receive(&mut source, &r1.session, &r1.pool, &opts)
        });
        let sent = sender.join().unwrap().unwrap_err();
        assert_eq!(sent.status(), Status::UpdateSource, "{sent}");
        let sent = sent.to_string();
        assert!(
            sent.contains("rank 1: ") && sent.contains("rank 2: ") && !sent.contains("rank 0: "),
            "the root hears both refusals: {sent}"
        );
        assert!(sent.contains(&dropped), "{sent}");
        let e1 = a.join().unwrap().unwrap_err();
        assert_eq!(e1.status(), Status::PlanMismatch, "its own refusal: {e1}");
        assert!(e1.to_string().contains(&dropped), "{e1}");
        let e2 = b.join().unwrap().unwrap_err();
        assert_eq!(e2.status(), Status::PlanMismatch, "its own refusal: {e2}");
        assert!(e2.to_string().contains("version"), "{e2}");
    });
    assert!(
        started.elapsed() < timeout / 4,
        "refused in {:?}, not at once",
        started.elapsed()
    );
    assert_kept(&ranks, &before);
}

/// A rank whose update fails after every rank accepted it (no device
/// memory for its staged update's scratch) still takes part in every
/// bucket's broadcast and in the vote after the last: every rank keeps its
/// last version, at once, naming the failing rank; the collective stays in
/// step for the next update, which every rank applies.
#[test]
fn a_rank_failing_after_the_agreement_makes_every_rank_keep_its_version() {
    let WorldOfTwo { m, new, ranks, .. } = world_of_two("bcast-late", 9500);
    let tensors = send_tensors(&new);
    let before = held(&ranks);
    let timeout = Duration::from_secs(20);
    let [mut root, mut c1, mut c2] = TestCollective::ranks(timeout);
    let started = std::time::Instant::now();
    for round in 0..2 {
        std::thread::scope(|s| {
            let tensors = &tensors;
            let (r0, r1) = (&ranks[0], &ranks[1]);
            let (root, c1, c2) = (&mut root, &mut c1, &mut c2);
            let sender = s.spawn(move || {
                let ring = Ring::new(sender_pool(), &options(2048)).unwrap();
                broadcast::send(root, &ring, tensors)
            });
            let a = s.spawn(move || run_rank(c1, r0, 0, 2048));
            let b = s.spawn(move || {
                let ring = Ring::new(r1.pool.clone(), &options(2048)).unwrap();
                if round == 0 {
                    // The next physical allocation is the update's scratch.
                    let faults = r1.pool.driver().faults().unwrap();
                    faults.fail_nth(FaultOp::Create, 1);
                }
                let mut source = BroadcastSource::rank(c2, &ring, 0);
                r1.receive(&mut source).map(|d| d.version)
            });
            let (sent, a, b) = (sender.join().unwrap(), a.join().unwrap(), b.join().unwrap());
            if round == 0 {
                let e = b.unwrap_err();
                assert!(
                    e.is_out_of_memory() || e.to_string().contains("scratch"),
                    "{e}"
                );
                for e in [sent.unwrap_err(), a.unwrap_err()] {
                    assert_eq!(e.status(), Status::UpdateSource, "{e}");
                    let e = e.to_string();
                    assert!(
                        e.contains("rank 2: ") && e.contains("no rank applies it"),
                        "{e}"
                    );
                }
            } else {
                sent.unwrap();
                assert_eq!(a.unwrap(), before[0].1 + 1);
                assert_eq!(b.unwrap(), before[1].1 + 1);
            }
        });
        if round == 0 {
            assert!(started.elapsed() < timeout / 4, "{:?}", started.elapsed());
            assert_kept(&ranks, &before);
        }
    }
    for r in &ranks {
        assert!(r.snapshot() == r.expected(&m, &new), "rank {}", r.rank);
    }
}

/// A root whose own tensors are refused (one named twice) still takes
/// part in the agreement: it fails with its own error, every other rank at
/// once with the root's reason, nothing written.
#[test]
fn a_root_refusing_its_own_tensors_fails_every_rank_at_once() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let new = new_values(&m, 9000);
    let mut tensors = send_tensors(&new);
    let twice = tensors[0].clone();
    tensors.push(twice.clone());
    let r = Rank::load(dir.path(), &m, "bcast-root-refuses", 0, 1);
    let before = (r.snapshot(), r.version());
    let timeout = Duration::from_secs(20);
    let [mut root, mut other] = TestCollective::ranks(timeout);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        let tensors = &tensors;
        let sender = s.spawn(move || {
            let ring = Ring::new(sender_pool(), &options(2048)).unwrap();
            broadcast::send(&mut root, &ring, tensors)
        });
        let e = run_rank(&mut other, &r, 0, 2048).unwrap_err();
        let sent = sender.join().unwrap().unwrap_err();
        assert_eq!(
            sent.status(),
            Status::InvalidArgument,
            "its own error: {sent}"
        );
        assert_eq!(e.status(), Status::UpdateSource, "{e}");
        for e in [e.to_string(), sent.to_string()] {
            assert!(e.contains(&twice.name) && e.contains("twice"), "{e}");
        }
    });
    assert!(started.elapsed() < timeout / 4, "{:?}", started.elapsed());
    assert!(r.snapshot() == before.0);
    assert_eq!(r.version(), before.1);
}

#[test]
fn a_missing_or_wrong_nccl_is_named() {
    // Only this test sets the variable, so its cases run in order here.
    std::env::set_var("VMMW_NCCL_LIBRARY", "/nonexistent/libnccl.so.2");
    let e = Nccl::open().unwrap_err().to_string();
    assert!(
        e.contains("/nonexistent/libnccl.so.2") && e.contains("VMMW_NCCL_LIBRARY"),
        "{e}"
    );
    std::env::set_var("VMMW_NCCL_LIBRARY", "libc.so.6");
    let e = Nccl::open().unwrap_err().to_string();
    assert!(e.contains("libc.so.6 lacks `ncclGetVersion`"), "{e}");
    std::env::remove_var("VMMW_NCCL_LIBRARY");
    if let Err(e) = Nccl::open() {
        assert!(e.to_string().contains("libnccl.so.2"), "{e}");
    }
}
