//! The broadcast transport through the test collective (threads of this
//! process on the host backend): a root that only sends and engine ranks in
//! tensor-parallel worlds of 2, 4 and 8 each keeping only their slices,
//! bitwise; a root that is an engine rank too; a rank leaving mid-update
//! failing every other rank with their last version intact; ranks whose
//! bucket sizes differ refused before any bucket moves; NCCL missing or
//! wrong named in the error.

use std::sync::Arc;
use std::time::Duration;

use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::nccl::Nccl;
use vmmweights::driver::sync_copy::copy_to_host;
use vmmweights::driver::Driver;
use vmmweights::loader::dtype::Dtype;
use vmmweights::loader::registry::Destination;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::update::transport::broadcast::{
    self, BroadcastOptions, BroadcastSource, Collective, Ring,
};
use vmmweights::update::transport::test_collective::TestCollective;
use vmmweights::update::transport::{
    receive, AnnouncedTensor, BucketSink, Landed, SendData, SendTensor,
};
use vmmweights::{tag, Error};

const G: usize = 64 << 10;

fn pool() -> Arc<Pool> {
    let d: Arc<dyn Driver> = Arc::new(HostDriver::new(HostConfig {
        granularity: G,
        memory_limit: 1 << 30,
    }));
    Arc::new(
        Pool::new(
            d,
            PoolConfig {
                small_segment_bytes: 4 * G,
                small_request_max: 2 * G,
                large_segment_bytes: 16 * G,
                ..PoolConfig::default()
            },
        )
        .unwrap(),
    )
}

fn specs() -> Vec<(&'static str, Dtype, Vec<usize>)> {
    vec![
        ("model.embed_tokens.weight", Dtype::Bf16, vec![256, 72]),
        (
            "model.layers.0.mlp.gate_up_proj.weight",
            Dtype::F32,
            vec![64, 129],
        ),
        ("model.norm.weight", Dtype::F32, vec![8, 3]),
    ]
}

fn weights(seed: u64) -> Vec<Vec<u8>> {
    specs()
        .iter()
        .enumerate()
        .map(|(i, (_, d, s))| {
            let mut x = seed.wrapping_mul(0x9e3779b97f4a7c15) ^ (i as u64 + 1);
            (0..s.iter().product::<usize>() * d.size())
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect()
}

fn send_tensors(data: &[Vec<u8>]) -> Vec<SendTensor<'_>> {
    specs()
        .into_iter()
        .zip(data)
        .map(|((name, dtype, shape), d)| SendTensor {
            name: name.into(),
            dtype,
            shape,
            data: SendData::Host(d),
        })
        .collect()
}

/// One engine rank: its slices (dim 0 cut) of each tensor, at version 1.
struct Engine {
    pool: Arc<Pool>,
    dests: Vec<Destination>,
    rank: usize,
    world: usize,
}

impl Engine {
    fn new(rank: usize, world: usize) -> Engine {
        let pool = pool();
        let t = tag::id("broadcast-engine").unwrap();
        let full = weights(1);
        let dests = specs()
            .into_iter()
            .enumerate()
            .map(|(i, (name, dtype, mut shape))| {
                shape[0] /= world;
                let n = shape.iter().product::<usize>() * dtype.size();
                let ptr = pool.alloc_tagged(n, t).unwrap().ptr;
                // SAFETY: host backend: the block is mapped read-write here.
                unsafe {
                    std::slice::from_raw_parts_mut(ptr as *mut u8, n)
                        .copy_from_slice(&full[i][rank * n..(rank + 1) * n])
                };
                Destination {
                    name: name.into(),
                    ptr,
                    dtype,
                    shape,
                }
            })
            .collect();
        Engine {
            pool,
            dests,
            rank,
            world,
        }
    }

    fn read(&self) -> Vec<Vec<u8>> {
        self.dests
            .iter()
            .map(|d| {
                let mut v = vec![0u8; d.bytes()];
                // SAFETY: the destination is mapped for its bytes.
                unsafe { copy_to_host(self.pool.driver().as_ref(), &mut v, d.ptr).unwrap() };
                v
            })
            .collect()
    }

    fn expected(&self, seed: u64) -> Vec<Vec<u8>> {
        weights(seed)
            .into_iter()
            .map(|f| {
                let n = f.len() / self.world;
                f[self.rank * n..(self.rank + 1) * n].to_vec()
            })
            .collect()
    }
}

/// Keeps this rank's byte range of each tensor; stages, writes at commit.
struct SliceSink<'a> {
    engine: &'a Engine,
    staged: Vec<Vec<u8>>,
}

impl BucketSink for SliceSink<'_> {
    fn begin(&mut self, tensors: &[AnnouncedTensor]) -> vmmweights::Result<()> {
        if tensors.len() != self.engine.dests.len() {
            return Err(Error::InvalidArgument("tensor count".into()));
        }
        self.staged = self
            .engine
            .dests
            .iter()
            .map(|d| vec![0u8; d.bytes()])
            .collect();
        Ok(())
    }

    fn apply(&mut self, b: Landed<'_>) -> vmmweights::Result<()> {
        for e in &b.manifest.entries {
            let i = e.tensor as usize;
            let keep = self.staged[i].len() as u64;
            let lo = keep * self.engine.rank as u64;
            let (a, z) = (e.offset.max(lo), (e.offset + e.len).min(lo + keep));
            if a < z {
                let dst = &mut self.staged[i][(a - lo) as usize..(z - lo) as usize];
                // SAFETY: the piece lies inside the landed bucket.
                unsafe {
                    copy_to_host(
                        self.engine.pool.driver().as_ref(),
                        dst,
                        b.src + e.at + (a - e.offset),
                    )?
                };
            }
        }
        Ok(())
    }

    fn commit(&mut self) -> vmmweights::Result<u64> {
        for (d, s) in self.engine.dests.iter().zip(&self.staged) {
            // SAFETY: host backend: the destination is mapped read-write here.
            unsafe { std::slice::from_raw_parts_mut(d.ptr as *mut u8, s.len()).copy_from_slice(s) };
        }
        Ok(2)
    }

    fn abort(&mut self) {
        self.staged.clear();
    }
}

fn options(slot_bytes: usize) -> BroadcastOptions {
    BroadcastOptions {
        slots: 2,
        slot_bytes,
        timeout: Duration::from_secs(10),
    }
}

fn run_rank(
    coll: &mut TestCollective,
    engine: &Engine,
    root: usize,
    slot: usize,
) -> vmmweights::Result<u64> {
    let ring = Ring::new(engine.pool.clone(), &options(slot))?;
    let mut source = BroadcastSource::rank(coll, &ring, root);
    let mut sink = SliceSink {
        engine,
        staged: Vec::new(),
    };
    receive(&mut source, &mut sink)
}

#[test]
fn tensor_parallel_ranks_keep_only_their_slices_bitwise() {
    for world in [2usize, 4, 8] {
        // Rank 0 is the trainer (a sender only); ranks 1..=world are the engine.
        let mut colls = TestCollective::group(world + 1, Duration::from_secs(10));
        let engines: Vec<Engine> = (0..world).map(|r| Engine::new(r, world)).collect();
        let data = weights(5);
        let tensors = send_tensors(&data);
        let (root, ranks) = colls.split_at_mut(1);
        std::thread::scope(|s| {
            let root = &mut root[0];
            let tensors = &tensors;
            let sender = s.spawn(move || {
                let ring = Ring::new(pool(), &options(12 << 10)).unwrap();
                broadcast::send(root, &ring, tensors)
            });
            let handles: Vec<_> = ranks
                .iter_mut()
                .zip(&engines)
                .map(|(c, e)| s.spawn(move || run_rank(c, e, 0, 12 << 10)))
                .collect();
            sender.join().unwrap().unwrap();
            for h in handles {
                assert_eq!(h.join().unwrap().unwrap(), 2);
            }
        });
        for e in &engines {
            assert!(
                e.read() == e.expected(5),
                "world {world}, rank {}: its slice of the update",
                e.rank
            );
        }
    }
}

#[test]
fn a_root_that_is_an_engine_rank_applies_the_update_too() {
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    let engines = [Engine::new(0, 1), Engine::new(0, 1)];
    let data = weights(9);
    let tensors = send_tensors(&data);
    std::thread::scope(|s| {
        let (a, b) = colls.split_at_mut(1);
        let (e0, e1) = (&engines[0], &engines[1]);
        let tensors = &tensors;
        let root = s.spawn(move || {
            let ring = Ring::new(e0.pool.clone(), &options(8 << 10)).unwrap();
            let mut source = BroadcastSource::root(&mut a[0], &ring, tensors);
            let mut sink = SliceSink {
                engine: e0,
                staged: Vec::new(),
            };
            receive(&mut source, &mut sink)
        });
        let other = s.spawn(move || run_rank(&mut b[0], e1, 0, 8 << 10));
        root.join().unwrap().unwrap();
        other.join().unwrap().unwrap();
    });
    for e in &engines {
        assert!(e.read() == e.expected(9));
    }
}

/// A collective whose rank leaves after `after` broadcasts: the test stand-in
/// for a peer that dies mid-update.
struct Leaving {
    inner: Option<TestCollective>,
    after: usize,
}

impl Collective for Leaving {
    fn rank(&self) -> usize {
        self.inner.as_ref().map_or(0, |c| c.rank())
    }
    fn world(&self) -> usize {
        self.inner.as_ref().map_or(0, |c| c.world())
    }
    unsafe fn broadcast(
        &mut self,
        buf: u64,
        len: usize,
        root: usize,
        stream: vmmweights::driver::StreamId,
    ) -> vmmweights::Result<()> {
        if self.after == 0 {
            self.inner = None;
            return Err(Error::InvalidState("this rank left".into()));
        }
        self.after -= 1;
        // SAFETY: forwarded.
        unsafe {
            self.inner
                .as_mut()
                .unwrap()
                .broadcast(buf, len, root, stream)
        }
    }
    fn check(&self) -> vmmweights::Result<()> {
        Ok(())
    }
}

#[test]
fn a_rank_leaving_mid_update_fails_the_others_with_their_last_version() {
    let mut colls = TestCollective::group(3, Duration::from_secs(10));
    let engines = [Engine::new(0, 2), Engine::new(1, 2)];
    let data = weights(11);
    let tensors = send_tensors(&data);
    let mut last = colls.pop().unwrap();
    let mut middle = colls.pop().unwrap();
    let root = colls.pop().unwrap();
    std::thread::scope(|s| {
        let tensors = &tensors;
        let (e0, e1) = (&engines[0], &engines[1]);
        // The root leaves after the header (2 broadcasts) and one bucket.
        let sender = s.spawn(move || {
            let ring = Ring::new(pool(), &options(4 << 10)).unwrap();
            let mut leaving = Leaving {
                inner: Some(root),
                after: 3,
            };
            broadcast::send(&mut leaving, &ring, tensors)
        });
        let a = s.spawn(move || run_rank(&mut middle, e0, 0, 4 << 10));
        let b = s.spawn(move || run_rank(&mut last, e1, 0, 4 << 10));
        assert!(sender.join().unwrap().is_err());
        for h in [a, b] {
            let e = h.join().unwrap().unwrap_err().to_string();
            assert!(e.contains("rank 0 left the group"), "{e}");
        }
    });
    for e in &engines {
        assert!(
            e.read() == e.expected(1),
            "rank {}: the last version is intact",
            e.rank
        );
    }
}

#[test]
fn ranks_with_different_bucket_sizes_are_refused_before_any_bucket() {
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    let engine = Engine::new(0, 1);
    let data = weights(3);
    let tensors = send_tensors(&data);
    let mut other = colls.pop().unwrap();
    let mut root = colls.pop().unwrap();
    std::thread::scope(|s| {
        let tensors = &tensors;
        let sender = s.spawn(move || {
            let ring = Ring::new(pool(), &options(8 << 10)).unwrap();
            broadcast::send(&mut root, &ring, tensors)
        });
        let e = run_rank(&mut other, &engine, 0, 4 << 10)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("every rank must use the same bucket size"),
            "{e}"
        );
        // The refusing rank leaves; the root's next broadcast fails at once.
        drop(other);
        let e = sender.join().unwrap().unwrap_err().to_string();
        assert!(e.contains("rank 1 left the group"), "{e}");
    });
    assert!(engine.read() == engine.expected(1));
}

#[test]
fn a_missing_or_wrong_nccl_is_named() {
    // One test sets the variable, so the cases run in order here.
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
