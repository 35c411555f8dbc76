//! A checkpoint load through the broadcast transport, on the test
//! collective (threads of this process on the host backend): every rank of
//! worlds 1, 2 and 4 (tensor-parallel) holds bitwise what a normal load puts
//! there, with one reader and with several owning different files; a
//! reader whose file changed fails the load on every rank, nothing reported
//! as loaded, the communicator still usable; a corrupt file on one rank
//! refused on every rank before any byte; a staged load that fails
//! leaves the destinations untouched; headers that differ between ranks
//! are refused on every rank before any byte moves, each rank's problem
//! listed; a rank that leaves mid-load fails the others without a hang; a
//! GGUF checkpoint (quantized tensors cut by rows) loads the same way; a
//! rank failing alone before a reader fails stopping with the others; rings
//! of different lengths and names past the transport's bound refused in the
//! agreement; an empty tensor loaded as a normal load does; a torn load
//! repaired by loading again.

use crate::update_transport_broadcast::Leaving;
use crate::update_transport_ranks::{host_driver, model, write_checkpoint, Rank};

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::loader_tp::Model;
use vmmweights::driver::StreamId;
use vmmweights::loader::{Session, Tp};
use vmmweights::update::transport::broadcast::{BroadcastOptions, Collective, Ring};
use vmmweights::update::transport::broadcast_load::{
    self, BroadcastLoad, BroadcastLoadReport, TRAILER_BYTES,
};
use vmmweights::update::transport::test_collective::TestCollective;
use vmmweights::{tag, DevicePtr, Pool, PoolConfig, Status};

use tempfile::TempDir;

/// Rings of `slots` slots holding `bytes` of checkpoint each.
fn options(bytes: usize, slots: usize) -> BroadcastOptions {
    BroadcastOptions {
        slots,
        slot_bytes: bytes + TRAILER_BYTES,
        timeout: Duration::from_secs(10),
    }
}

/// A rank whose destinations are allocated from `src` under the tag
/// `tag_name`, not loaded; `configure` sets the session up first.
fn allocated_with(
    src: &Path,
    tag_name: &str,
    (rank, world): (usize, usize),
    configure: impl FnOnce(&Session),
) -> Rank {
    let pool = Arc::new(Pool::new(host_driver(), PoolConfig::default()).unwrap());
    let t = tag::id(tag_name).unwrap();
    let session = Session::open(src).unwrap();
    configure(&session);
    session.allocate(&pool, t).unwrap();
    Rank {
        pool,
        session,
        tag: t,
        rank,
        world,
    }
}

/// A rank whose destinations are allocated as for a load, not loaded.
fn allocated(dir: &Path, m: &Model, name: &str, rank: usize, world: usize) -> Rank {
    let t = format!("{name}-{world}-{rank}");
    allocated_with(dir, &t, (rank, world), |session| {
        let tp = (world > 1).then_some(Tp { rank, world });
        session.set_preset(m.preset, tp, m.shape.head_dim).unwrap();
    })
}

/// `world` ranks allocated from the checkpoint in `dir`.
fn allocated_world(dir: &Path, m: &Model, name: &str, world: usize) -> Vec<Rank> {
    (0..world)
        .map(|r| allocated(dir, m, name, r, world))
        .collect()
}

/// Rank r allocated from its own copy of the checkpoint, `dirs[r]`.
fn allocated_copies(dirs: &[TempDir], m: &Model, name: &str) -> Vec<Rank> {
    dirs.iter()
        .enumerate()
        .map(|(r, d)| allocated(d.path(), m, name, r, dirs.len()))
        .collect()
}

/// A checkpoint of the test model and `world` ranks allocated from it.
fn world(name: &str, world: usize) -> (Model, TempDir, Vec<Rank>) {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    let ranks = allocated_world(dir.path(), &m, name, world);
    (m, dir, ranks)
}

/// A rank of a world of one whose destinations are allocated from `dir`'s
/// files as they are (no preset), under the tag `name`.
fn allocated_as_is(dir: &Path, name: &str) -> Rank {
    allocated_with(dir, name, (0, 1), |_| {})
}

/// Run `f` on every rank, each on a thread of its own with its own
/// collective; the results in rank order.
fn on_every_rank<C: Send, T: Send>(
    colls: impl IntoIterator<Item = C>,
    ranks: &[Rank],
    f: impl Fn(C, &Rank) -> T + Sync,
) -> Vec<T> {
    let f = &f;
    std::thread::scope(|s| {
        let handles: Vec<_> = colls
            .into_iter()
            .zip(ranks)
            .map(|(c, r)| s.spawn(move || f(c, r)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn load_rank(
    coll: &mut dyn Collective,
    r: &Rank,
    readers: &[usize],
    (bytes, slots): (usize, usize),
    stage: bool,
) -> vmmweights::Result<BroadcastLoadReport> {
    let ring = Ring::new(r.pool.clone(), &options(bytes, slots))?;
    let opts = BroadcastLoad {
        readers: readers.to_vec(),
        stage,
    };
    broadcast_load::load(coll, &ring, &r.session, &r.pool, &opts)
}

/// Run one broadcast load on every rank, each with its own collective.
fn load_all(
    colls: &mut [impl Collective],
    ranks: &[Rank],
    readers: &[usize],
    ring: (usize, usize),
    stage: bool,
) -> Vec<vmmweights::Result<BroadcastLoadReport>> {
    on_every_rank(colls.iter_mut(), ranks, |c, r| {
        load_rank(c, r, readers, ring, stage)
    })
}

/// Whether `r` holds bitwise what a normal load of `dir` puts there.
fn holds_a_normal_load(r: &Rank, dir: &Path, m: &Model) -> bool {
    let normal = Rank::load(dir, m, "bload-normal", r.rank, r.world);
    r.snapshot() == normal.snapshot()
}

#[test]
fn every_rank_holds_what_a_normal_load_puts_there() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    for (world, readers, slots) in [
        (1usize, vec![0usize], 2usize),
        (2, vec![0], 2),
        (2, vec![1], 3),
        (4, vec![0], 2),
        (4, vec![3, 1], 3),
        (4, vec![0, 1, 2, 3], 2),
    ] {
        let ranks: Vec<Rank> = (0..world)
            .map(|r| allocated(dir.path(), &m, "bload", r, world))
            .collect();
        let v0: Vec<u64> = ranks.iter().map(Rank::version).collect();
        let mut colls = TestCollective::group(world, Duration::from_secs(10));
        let reports = load_all(&mut colls, &ranks, &readers, (3000, slots), false);
        let reports: Vec<BroadcastLoadReport> = reports
            .into_iter()
            .map(|r| r.unwrap_or_else(|e| panic!("world {world}, readers {readers:?}: {e}")))
            .collect();
        for ((r, rep), v) in ranks.iter().zip(&reports).zip(&v0) {
            assert!(
                holds_a_normal_load(r, dir.path(), &m),
                "world {world}, readers {readers:?}, rank {}: bitwise a normal load",
                r.rank
            );
            assert_eq!(rep.update.version, v + 1);
            assert!(!rep.update.staged);
            assert!(!r.pool.tag_torn(r.tag).unwrap());
            let last = r.session.last_result().expect("reported as loaded");
            assert_eq!(last.stats.bytes, rep.bytes);
            if !readers.contains(&r.rank) {
                assert_eq!((rep.files_read, rep.bytes_read), (0, 0));
            }
        }
        // The readers share the files: each read some, together all of
        // them once.
        let files: u64 = reports.iter().map(|r| r.files_read).sum();
        let read: u64 = reports.iter().map(|r| r.bytes_read).sum();
        assert_eq!(files, 3, "world {world}, readers {readers:?}");
        assert_eq!(read, reports[0].bytes);
        if readers.len() > 1 && readers.len() <= 3 {
            for &rd in &readers {
                assert!(reports[rd].files_read > 0, "reader {rd} read its files");
            }
        }
    }
}

#[test]
fn a_staged_load_is_bitwise_too() {
    let (m, dir, ranks) = world("bload-staged", 2);
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    for (r, rep) in ranks
        .iter()
        .zip(load_all(&mut colls, &ranks, &[0, 1], (5000, 2), true))
    {
        assert!(rep.unwrap().update.staged);
        assert!(holds_a_normal_load(r, dir.path(), &m));
    }
}

/// A collective that runs `act` once, just before its `at`-th broadcast
/// (counted from 0), then forwards to `inner`.
struct Act<F: FnMut()> {
    inner: TestCollective,
    at: usize,
    n: usize,
    act: Option<F>,
}

impl<F: FnMut() + Send> Collective for Act<F> {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    unsafe fn broadcast(
        &mut self,
        buf: DevicePtr,
        len: usize,
        root: usize,
        stream: StreamId,
    ) -> vmmweights::Result<()> {
        if self.n == self.at {
            if let Some(mut f) = self.act.take() {
                f();
            }
        }
        self.n += 1;
        // SAFETY: forwarded from the caller's contract.
        unsafe { self.inner.broadcast(buf, len, root, stream) }
    }
    fn check(&self) -> vmmweights::Result<()> {
        self.inner.check()
    }
}

/// The collectives of a group of `world` whose broadcasts wait `timeout`
/// for the others, rank r's running `act(r)` just before its `at`-th
/// broadcast.
fn acting<F: FnMut() + Send>(
    world: usize,
    timeout: Duration,
    at: usize,
    act: impl Fn(usize) -> F,
) -> Vec<Act<F>> {
    TestCollective::group(world, timeout)
        .into_iter()
        .map(|c| Act {
            act: Some(act(c.rank())),
            inner: c,
            at,
            n: 0,
        })
        .collect()
}

/// Cut `file` 100 bytes short.
fn cut_short(file: &Path) {
    let len = std::fs::metadata(file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(file).unwrap();
    f.set_len(len - 100).unwrap();
}

/// Each rank with its own copy of the checkpoint (one per node).
fn copies(m: &Model, world: usize) -> Vec<TempDir> {
    (0..world)
        .map(|_| {
            let d = tempfile::tempdir().unwrap();
            write_checkpoint(d.path(), m);
            d
        })
        .collect()
}

const LAST_FILE: &str = "model-00003-of-00003.safetensors";

/// Once a load on `colls` failed: fresh destinations on every rank (rank r
/// reading `dirs[r]`) loaded by the same group, readers 0 and 1, each
/// holding what a normal load puts there.
fn the_group_loads_again(
    colls: &mut [impl Collective],
    dirs: &[TempDir],
    m: &Model,
    name: &str,
    ring: (usize, usize),
    stage: bool,
) {
    let ranks = allocated_copies(dirs, m, name);
    for (r, res) in ranks
        .iter()
        .zip(load_all(colls, &ranks, &[0, 1], ring, stage))
    {
        res.unwrap_or_else(|e| panic!("ring {ring:?}, rank {}: {e}", r.rank));
        assert!(
            holds_a_normal_load(r, dirs[r.rank].path(), m),
            "rank {}",
            r.rank
        );
    }
}

#[test]
fn a_reader_whose_file_changed_fails_the_load_on_every_rank() {
    let m = model();
    for (stage, slots) in [(false, 2), (true, 2), (false, 3), (false, 4)] {
        let dirs = copies(&m, 4);
        let ranks = allocated_copies(&dirs, &m, "bload-short");
        let before: Vec<_> = ranks.iter().map(|r| (r.snapshot(), r.version())).collect();
        // Reader 1 owns the last file; it is cut short once the load is
        // agreed on (4 slot sizes, the header's length and body, 4 verdicts:
        // 10 broadcasts), before reader 1 reads it.
        let victim = dirs[1].path().join(LAST_FILE);
        let mut colls = acting(4, Duration::from_secs(10), 10, |rank| {
            let victim = victim.clone();
            move || {
                if rank == 1 {
                    cut_short(&victim);
                }
            }
        });
        let results = load_all(&mut colls, &ranks, &[0, 1], (3000, slots), stage);
        for (r, res) in ranks.iter().zip(results) {
            let e = res.unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains("reader rank 1 could not read") && msg.contains(LAST_FILE),
                "rank {}: {msg}",
                r.rank
            );
            assert!(r.session.last_result().is_none(), "nothing reported loaded");
            assert_eq!(r.version(), before[r.rank].1, "the version stays");
            if stage {
                assert_eq!(e.status(), Status::UpdateSource, "{msg}");
                assert!(r.snapshot() == before[r.rank].0, "staged: untouched");
                assert!(!r.pool.tag_torn(r.tag).unwrap());
            } else {
                // Reader 0's part landed first: the destinations hold some of it.
                assert_eq!(e.status(), Status::UpdateTorn, "{msg}");
                assert!(r.pool.tag_torn(r.tag).unwrap());
            }
        }
        // Every rank took part in the same broadcasts: the group serves a
        // load again once the file is whole.
        write_checkpoint(dirs[1].path(), &m);
        the_group_loads_again(&mut colls, &dirs, &m, "bload-again", (3000, slots), stage);
    }
}

#[test]
fn headers_that_differ_are_refused_on_every_rank_before_any_byte() {
    let m = model();
    // Rank 1's files lack a tensor and hold one of another shape (rewritten
    // after its destinations were allocated); rank 2 names other readers.
    let dirs = copies(&m, 4);
    let ranks = allocated_copies(&dirs, &m, "bload-hdr");
    let mut other = crate::loader_tp::tensors(&m);
    let dropped = other.keys().nth(1).unwrap().clone();
    other.remove(&dropped);
    let (reshaped, (shape, _)) = other.iter_mut().next().unwrap();
    let reshaped = reshaped.clone();
    *shape = vec![shape.iter().product::<usize>()];
    for f in std::fs::read_dir(dirs[1].path()).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }
    crate::common::loader::write_sharded(
        dirs[1].path(),
        &other,
        vmmweights::loader::Dtype::Bf16,
        3,
    );
    let before: Vec<_> = ranks.iter().map(|r| (r.snapshot(), r.version())).collect();
    let colls = TestCollective::group(4, Duration::from_secs(10));
    let results = on_every_rank(colls, &ranks, |mut c, r| {
        let readers: &[usize] = if r.rank == 2 { &[1, 0] } else { &[0, 1] };
        load_rank(&mut c, r, readers, (3000, 2), false)
    });
    for (r, res) in ranks.iter().zip(results) {
        let e = res.unwrap_err();
        assert_eq!(e.status(), Status::UpdateSource, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("refused before any byte moved"), "{msg}");
        assert!(
            msg.contains(&format!("`{dropped}` only on rank 0")),
            "{msg}"
        );
        assert!(msg.contains(&format!("`{reshaped}`: BF16")), "{msg}");
        assert!(
            msg.contains("rank 2: readers [0, 1] on rank 0, [1, 0] here"),
            "{msg}"
        );
        assert!(
            !msg.contains("rank 0:") && !msg.contains("rank 3:"),
            "{msg}"
        );
        assert!(
            r.snapshot() == before[r.rank].0,
            "rank {}: untouched",
            r.rank
        );
        assert_eq!(r.version(), before[r.rank].1);
        assert!(!r.pool.tag_torn(r.tag).unwrap());
    }
}

#[test]
fn ranks_with_different_slots_are_refused_alike() {
    let (_, _dir, ranks) = world("bload-slots", 2);
    let colls = TestCollective::group(2, Duration::from_secs(10));
    let results = on_every_rank(colls, &ranks, |mut c, r| {
        load_rank(&mut c, r, &[0], (3000 + r.rank, 2), false)
    });
    let s0 = 3000 + TRAILER_BYTES;
    for res in results {
        let e = res.unwrap_err().to_string();
        assert!(
            e.contains(&format!("rank 0: {s0}, rank 1: {}", s0 + 1))
                && e.contains("same bucket size"),
            "{e}"
        );
    }
}

#[test]
fn bad_arguments_are_refused_on_every_rank() {
    let m = model();
    let dir = tempfile::tempdir().unwrap();
    write_checkpoint(dir.path(), &m);
    for (readers, want) in [
        (vec![], "at least one reader"),
        (vec![2usize], "reader rank 2 of a world of 2"),
        (vec![1, 1], "listed twice"),
        (vec![0, 1, 0], "3 reader ranks for a world of 2"),
    ] {
        let ranks = allocated_world(dir.path(), &m, "bload-args", 2);
        let mut colls = TestCollective::group(2, Duration::from_secs(10));
        for res in load_all(&mut colls, &ranks, &readers, (3000, 2), false) {
            let e = res.unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
    // A ring too small for a bucket's status, on one rank or on every
    // rank: refused on every rank together, at once (a rank that returned
    // alone would leave the others waiting for their timeout).
    let timeout = Duration::from_secs(20);
    for small in [vec![1usize], vec![0, 1]] {
        let ranks = allocated_world(dir.path(), &m, "bload-small", 2);
        let colls = TestCollective::group(2, timeout);
        let started = std::time::Instant::now();
        let results = on_every_rank(colls, &ranks, |mut c, r| {
            let slot_bytes = if small.contains(&r.rank) {
                TRAILER_BYTES
            } else {
                3000 + TRAILER_BYTES
            };
            let ring = Ring::new(
                r.pool.clone(),
                &BroadcastOptions {
                    slots: 2,
                    slot_bytes,
                    timeout,
                },
            )
            .unwrap();
            let opts = BroadcastLoad {
                readers: vec![0],
                stage: false,
            };
            broadcast_load::load(&mut c, &ring, &r.session, &r.pool, &opts)
        });
        assert!(
            started.elapsed() < timeout / 4,
            "{small:?}: refused in {:?}, not at once",
            started.elapsed()
        );
        for (rank, res) in results.into_iter().enumerate() {
            let e = res.unwrap_err().to_string();
            let refused = if small.len() == 2 {
                let why = format!("slots of {TRAILER_BYTES} bytes; each bucket needs more");
                e.matches(&why).count() == 2 && e.contains("rank 0: ") && e.contains("rank 1: ")
            } else {
                e.contains("same bucket size")
            };
            assert!(refused, "{small:?}, rank {rank}: {e}");
        }
        for r in &ranks {
            assert_eq!(r.version(), 1, "nothing written");
        }
    }
}

#[test]
fn a_rank_leaving_mid_load_fails_the_others_without_a_hang() {
    let (_, _dir, ranks) = world("bload-leave", 4);
    let started = std::time::Instant::now();
    let mut colls: Vec<Leaving> = TestCollective::group(4, Duration::from_secs(10))
        .into_iter()
        .enumerate()
        .map(|(r, c)| Leaving {
            inner: Some(c),
            rank: r,
            world: 4,
            // Rank 2 leaves after the agreement (10 broadcasts) and three
            // buckets.
            after: if r == 2 { 13 } else { usize::MAX },
        })
        .collect();
    let results = load_all(&mut colls, &ranks, &[0], (3000, 2), false);
    assert!(
        started.elapsed() < Duration::from_secs(9),
        "the others learn at once, not by their timeout"
    );
    for (r, res) in ranks.iter().zip(results) {
        let e = res.unwrap_err();
        assert!(
            matches!(e.status(), Status::UpdateTorn | Status::UpdateSource),
            "rank {}: {e}",
            r.rank
        );
        if r.rank != 2 {
            assert!(e.to_string().contains("rank 2 left the group"), "{e}");
        }
        assert!(r.session.last_result().is_none());
    }
}

#[test]
fn a_gguf_checkpoint_loads_through_the_same_path() {
    use crate::common::gguf::{pattern, File};
    use vmmweights::loader::Rules;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    // F32, Q8_0 and Q4_K tensors, split by rows over two ranks (whole blocks).
    File::new(
        vec![],
        &[
            ("norm.weight", &[8, 2], 0, pattern(1, 8 * 2 * 4)),
            ("blk.0.attn_q.weight", &[64, 4], 8, pattern(2, 2 * 4 * 34)),
            ("blk.0.ffn_up.weight", &[256, 2], 12, pattern(3, 2 * 144)),
        ],
    )
    .write(&path);
    let rules = |rank: usize| {
        Rules::from_json(&format!(
            r#"{{"tp":{{"rank":{rank},"world":2}},"rules":[{{"match":".*","shard":{{"dim":0}}}}]}}"#
        ))
        .unwrap()
    };
    let rank = |r: usize, name: &str, load: bool| {
        let rank = allocated_with(&path, &format!("{name}-{r}"), (r, 2), |session| {
            session.set_rules(rules(r)).unwrap();
        });
        if load {
            rank.session.load(&rank.pool, None).unwrap();
        }
        rank
    };
    let ranks = [rank(0, "bload-gguf", false), rank(1, "bload-gguf", false)];
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    for (r, res) in ranks
        .iter()
        .zip(load_all(&mut colls, &ranks, &[1], (200, 2), false))
    {
        assert_eq!(
            res.unwrap().files_read,
            r.rank as u64,
            "rank 1 reads the file"
        );
    }
    for r in &ranks {
        let normal = rank(r.rank, "bload-gguf-normal", true);
        assert!(r.snapshot() == normal.snapshot(), "rank {}", r.rank);
        assert_eq!(r.snapshot().len(), 3);
    }
}

#[test]
fn reload_after_a_broadcast_load_reads_the_checkpoint_again() {
    use vmmweights::sleep::Policy;
    let (m, dir, ranks) = world("bload-reload", 2);
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    for res in load_all(&mut colls, &ranks, &[0], (3000, 2), false) {
        res.unwrap();
    }
    for r in &ranks {
        let normal = Rank::load(dir.path(), &m, "bload-reload-normal", r.rank, 2);
        let want = normal.snapshot();
        // The checkpoint is the tag's reload source, as after a load: the
        // sleep keeps in its host backup what a normal load's keeps (the
        // bytes no destination covers), the wake reads the files.
        let kept = |k: &Rank| {
            k.pool.sleep(&[(k.tag, Policy::Reload)]).unwrap()[0]
                .report
                .copied_bytes
        };
        let total: u64 = want.values().map(|v| v.len() as u64).sum();
        let ours = kept(r);
        assert!(
            ours < total,
            "rank {}: {ours} of {total} bytes kept",
            r.rank
        );
        assert_eq!(ours, kept(&normal), "rank {}", r.rank);
        r.pool.wake(&[r.tag]).unwrap();
        assert!(r.snapshot() == want, "rank {}", r.rank);
    }
}

#[test]
fn a_rank_that_stalls_mid_load_fails_every_rank_within_the_timeout() {
    let (_, _dir, ranks) = world("bload-stall", 4);
    // Each broadcast waits at most 1 s for the others; rank 2 stalls 3 s
    // after the agreement (10 broadcasts) and two buckets.
    let mut colls = acting(4, Duration::from_secs(1), 12, |rank| {
        move || {
            if rank == 2 {
                std::thread::sleep(Duration::from_secs(3));
            }
        }
    });
    let started = std::time::Instant::now();
    let results = load_all(&mut colls, &ranks, &[0], (3000, 2), false);
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "bounded by the timeout"
    );
    for (r, res) in ranks.iter().zip(results) {
        let e = res.unwrap_err();
        assert!(
            e.to_string().contains("waited 1s for the others"),
            "rank {}: {e}",
            r.rank
        );
        assert!(r.session.last_result().is_none());
    }
}

#[test]
fn a_corrupt_file_on_one_rank_is_refused_on_every_rank_before_any_byte() {
    let m = model();
    let dirs = copies(&m, 2);
    let ranks = allocated_copies(&dirs, &m, "bload-corrupt");
    let before: Vec<_> = ranks.iter().map(|r| r.snapshot()).collect();
    // Rank 1's copy of the last file gets a garbage header length.
    let victim = dirs[1].path().join(LAST_FILE);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(&victim, bytes).unwrap();
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    for (r, res) in ranks
        .iter()
        .zip(load_all(&mut colls, &ranks, &[0, 1], (3000, 2), false))
    {
        let e = res.unwrap_err();
        assert_eq!(e.status(), Status::UpdateSource, "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("refused before any byte moved")
                && msg.contains("rank 1: ")
                && msg.contains(LAST_FILE),
            "rank {}: {msg}",
            r.rank
        );
        assert!(r.snapshot() == before[r.rank], "rank {}: untouched", r.rank);
    }
}

#[test]
fn a_reader_failing_after_another_rank_failed_alone_stops_every_rank_together() {
    use vmmweights::driver::fault::FaultOp;
    use vmmweights::driver::testing::Testing;
    let m = model();
    for slots in [2, 3] {
        let dirs = copies(&m, 4);
        let ranks = allocated_copies(&dirs, &m, "bload-twice");
        // Once the load is agreed on (10 broadcasts): rank 2, no reader,
        // fails its first copy into its destinations (a failure of its own,
        // which it passes along to the end); reader 1's file is cut short
        // before it reads it, so the others stop at reader 1's first bucket.
        let victim = dirs[1].path().join(LAST_FILE);
        let mut colls = acting(4, Duration::from_secs(10), 10, |rank| {
            let victim = victim.clone();
            let driver = ranks[rank].pool.driver().clone();
            move || match rank {
                1 => cut_short(&victim),
                2 => driver.faults().unwrap().fail_nth(FaultOp::CopyDtod, 1),
                _ => {}
            }
        });
        let t0 = std::time::Instant::now();
        let results = load_all(&mut colls, &ranks, &[0, 1], (3000, slots), false);
        let took = t0.elapsed();
        for (r, res) in ranks.iter().zip(results) {
            let e = res.unwrap_err();
            assert_eq!(e.status(), Status::UpdateTorn, "rank {}: {e}", r.rank);
        }
        assert!(
            took < Duration::from_secs(5),
            "slots {slots}: every rank stops at the same bucket, no rank waits for the \
             broadcast timeout ({took:?})"
        );
        // The ranks took part in the same broadcasts: the group loads again.
        write_checkpoint(dirs[1].path(), &m);
        let ring = (3000, slots);
        the_group_loads_again(&mut colls, &dirs, &m, "bload-twice-again", ring, false);
    }
}

/// A safetensors file of `tensors` (name, shape, F32 values in order).
fn write_f32_safetensors(path: &Path, tensors: &[(&str, &[usize])]) {
    let mut header = serde_json::Map::new();
    let mut at = 0usize;
    for (name, shape) in tensors {
        let len = 4 * shape.iter().product::<usize>();
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": "F32", "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut h = serde_json::to_vec(&header).unwrap();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend((0..at as u32).map(|i| (i % 251) as u8));
    std::fs::write(path, out).unwrap();
}

#[test]
fn an_empty_tensor_in_the_checkpoint_loads_as_a_normal_load_does() {
    let dir = tempfile::tempdir().unwrap();
    write_f32_safetensors(
        &dir.path().join("model.safetensors"),
        &[("a", &[64, 4]), ("empty", &[0, 4]), ("b", &[16])],
    );
    let normal = allocated_as_is(dir.path(), "bload-empty-normal");
    (normal.session)
        .load(&normal.pool, None)
        .expect("a normal load takes it");
    let r = allocated_as_is(dir.path(), "bload-empty");
    let before = r.version();
    let mut coll = TestCollective::group(1, Duration::from_secs(10))
        .pop()
        .unwrap();
    let rep = load_rank(&mut coll, &r, &[0], (3000, 2), false)
        .unwrap_or_else(|e| panic!("an empty tensor loads by broadcast too: {e}"));
    assert_eq!(rep.update.version, before + 1);
    assert!(!r.pool.tag_torn(r.tag).unwrap());
    let want = normal.snapshot();
    assert_eq!(want.len(), 3, "three destinations, one of them empty");
    assert!(r.snapshot() == want, "bitwise a normal load");
}

#[test]
fn ranks_with_rings_of_different_slot_counts_are_refused_alike() {
    // After a failure every rank passes along the buckets the others may
    // have queued, which depends on the ring's slots: ranks with rings of
    // different lengths would stop at different buckets.
    let (_, _dir, ranks) = world("bload-nslots", 2);
    let before: Vec<_> = ranks.iter().map(|r| (r.snapshot(), r.version())).collect();
    let colls = TestCollective::group(2, Duration::from_secs(10));
    let results = on_every_rank(colls, &ranks, |mut c, r| {
        load_rank(&mut c, r, &[0], (3000, 2 + r.rank), false)
    });
    for (r, res) in ranks.iter().zip(results) {
        let e = res.unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.status(), Status::UpdateSource, "{msg}");
        assert!(
            msg.contains("rank 0: 2 slots, rank 1: 3 slots") && msg.contains("same ring"),
            "{msg}"
        );
        assert!(r.snapshot() == before[r.rank].0, "nothing written");
        assert_eq!(r.version(), before[r.rank].1);
    }
}

#[test]
fn a_tensor_name_past_the_transport_bound_is_refused_in_the_agreement() {
    let dir = tempfile::tempdir().unwrap();
    let long = "w".repeat(5000);
    write_f32_safetensors(
        &dir.path().join("model.safetensors"),
        &[("a", &[64, 4]), (&long, &[16])],
    );
    let ranks: Vec<Rank> = (0..2)
        .map(|r| allocated_as_is(dir.path(), &format!("bload-long-{r}")))
        .collect();
    let colls = TestCollective::group(2, Duration::from_secs(10));
    let t0 = std::time::Instant::now();
    let results = on_every_rank(colls, &ranks, |mut c, r| {
        load_rank(&mut c, r, &[0], (3000, 3), false)
    });
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "no rank waits for the timeout"
    );
    for (r, res) in ranks.iter().zip(results) {
        let e = res.unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.status(), Status::UpdateSource, "{msg}");
        assert!(
            msg.contains("refused before any byte moved") && msg.contains("name of 5000 bytes"),
            "{msg}"
        );
        assert!(!r.pool.tag_torn(r.tag).unwrap());
    }
}

#[test]
fn a_torn_load_is_repaired_by_loading_the_same_destinations_again() {
    use vmmweights::driver::fault::FaultOp;
    use vmmweights::driver::testing::Testing;
    let (m, dir, ranks) = world("bload-repair", 2);
    let v0: Vec<u64> = ranks.iter().map(Rank::version).collect();
    // Rank 1 fails its third copy into its destinations: torn there.
    ranks[1]
        .pool
        .driver()
        .faults()
        .unwrap()
        .fail_nth(FaultOp::CopyDtod, 3);
    let mut colls = TestCollective::group(2, Duration::from_secs(10));
    let results = load_all(&mut colls, &ranks, &[0], (3000, 3), false);
    let e = results[1].as_ref().unwrap_err();
    assert_eq!(e.status(), Status::UpdateTorn, "{e}");
    assert!(ranks[1].pool.tag_torn(ranks[1].tag).unwrap());
    assert_eq!(ranks[1].version(), v0[1], "the version stays");
    assert!(ranks[1].session.last_result().is_none());
    // Loading again on the same destinations repairs them and clears the mark.
    for (r, res) in ranks
        .iter()
        .zip(load_all(&mut colls, &ranks, &[0], (3000, 3), false))
    {
        res.unwrap_or_else(|e| panic!("rank {}: loading again repairs: {e}", r.rank));
        assert!(!r.pool.tag_torn(r.tag).unwrap(), "rank {}", r.rank);
        assert!(holds_a_normal_load(r, dir.path(), &m));
    }
}
