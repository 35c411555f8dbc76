//! Destinations hold an identity, not just an address: a loader never writes
//! into memory that changed hands. A destination whose pool block was freed
//! is refused before any byte moves, also once the pool handed the same
//! address to a new owner, on one device and on several; a Reload wake after
//! the refused load keeps the new owner's bytes; a block freed while a load
//! runs gets no reload source. Also the arena's impossible reservation.
//! Host backend.

use crate::common;

use std::cell::Cell;
use std::sync::Arc;

use common::loader::{generate, write_sharded, PATTERN, SMALL};
use common::pool::{self, small_config, G};
use vmmweights::devices::{load_multi_into_pools, MultiMode, PoolLoad};
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::loader::*;
use vmmweights::pool::{owner_of, Owner};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Mode, Pool, Status};

/// What the new owner writes into the block it was handed.
const NEW_OWNER: u8 = 0x55;

fn checkpoint() -> (tempfile::TempDir, Checkpoint) {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    (dir, ckpt)
}

fn host_pool() -> Pool {
    let h = pool::host(1 << 30);
    Pool::new(pool::dyn_driver(&h), small_config()).unwrap()
}

fn read(pool: &Pool, ptr: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    // SAFETY: nothing sleeps or frees the range during the read.
    unsafe { pool.read(ptr, &mut v) }.unwrap();
    v
}

fn write(pool: &Pool, ptr: u64, byte: u8, len: usize) {
    // SAFETY: a live, awake block of this pool that nothing else writes now.
    unsafe { pool.write(ptr, &vec![byte; len]) }.unwrap();
}

fn allocate(pool: &Pool, ckpt: &Checkpoint, t: tag::TagId) -> Registry {
    let mut reg = Registry::new();
    let specs = Plan::destinations(ckpt, &Rules::default()).unwrap();
    allocate_in_pool(&mut reg, &specs, pool, t).unwrap();
    reg
}

/// The destination at the lowest address: its free leaves a hole between
/// live neighbours, which the next request of its size fills.
fn lowest(reg: &Registry) -> Destination {
    reg.iter().min_by_key(|d| d.ptr).unwrap().clone()
}

/// Free `d`'s block and hand its address to a new owner, which writes
/// `NEW_OWNER` over it. Returns the new block's address (`d.ptr`).
fn change_hands(pool: &Pool, d: &Destination, t: tag::TagId) -> u64 {
    let before = owner_of(d.ptr);
    pool.free(d.ptr).unwrap();
    let b = pool.alloc_tagged(d.bytes(), t).unwrap();
    assert_eq!(b.ptr, d.ptr, "the pool hands the same address out again");
    assert_ne!(Owner::Block(b.id), before, "but as a new block");
    write(pool, b.ptr, NEW_OWNER, d.bytes());
    b.ptr
}

fn assert_changed(err: &Error, name: &str) {
    assert_eq!(err.status(), Status::UnknownPointer, "{err}");
    assert!(
        matches!(err, Error::DestinationChanged { what, .. } if what.contains(&format!("`{name}`"))),
        "the error names the destination `{name}`: {err}"
    );
}

#[test]
fn a_load_into_a_destination_that_changed_hands_is_refused_before_any_byte() {
    let pool = host_pool();
    let t = tag::id("identity-single").unwrap();
    let (_dir, ckpt) = checkpoint();
    let reg = allocate(&pool, &ckpt, t);
    let (rules, opts) = (Rules::default(), LoadOptions::default());
    load_into_pool(&pool, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();

    let d = lowest(&reg);
    change_hands(&pool, &d, t);
    // Every other destination holds a pattern: no byte may move anywhere.
    for o in reg.iter().filter(|o| o.name != d.name) {
        write(&pool, o.ptr, PATTERN, o.bytes());
    }
    let (_dir2, ckpt) = checkpoint();
    let err = load_into_pool(&pool, ckpt, &rules, &reg, &opts, &Control::default()).unwrap_err();
    assert_changed(&err, &d.name);
    assert!(
        read(&pool, d.ptr, d.bytes())
            .iter()
            .all(|&b| b == NEW_OWNER),
        "the new owner's bytes are intact"
    );
    for o in reg.iter().filter(|o| o.name != d.name) {
        assert!(
            read(&pool, o.ptr, o.bytes()).iter().all(|&b| b == PATTERN),
            "`{}` was written by a refused load",
            o.name
        );
    }
    // The refused load registered nothing over the new owner's block.
    let covered = pool.reload_coverage(t);
    let end = d.ptr + d.bytes() as u64;
    assert!(
        covered
            .iter()
            .all(|&(p, n)| p + n as u64 <= d.ptr || p >= end),
        "no reload source covers the new block: {covered:?}"
    );

    // A Reload wake after the refused load: the new owner's bytes survive.
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.wake(&[t]).unwrap();
    assert!(
        read(&pool, d.ptr, d.bytes())
            .iter()
            .all(|&b| b == NEW_OWNER),
        "a Reload wake after the refused load wrote over the new owner"
    );

    // The way forward: register again, recording the new owner.
    let mut again = Registry::new();
    again.register(&d.name, d.ptr, d.dtype, &d.shape).unwrap();
    assert_eq!(again.owner(again.get(&d.name).unwrap()), owner_of(d.ptr));
    let (_dir3, ckpt) = checkpoint();
    let opts = LoadOptions {
        plan: PlanOptions {
            allow_unexpected: true,
            ..PlanOptions::default()
        },
        ..LoadOptions::default()
    };
    load_into_pool(&pool, ckpt, &rules, &again, &opts, &Control::default()).unwrap();
    assert!(read(&pool, d.ptr, d.bytes())
        .iter()
        .any(|&b| b != NEW_OWNER));
}

#[test]
fn a_registered_destination_records_its_block_and_a_freed_one_is_refused() {
    let pool = host_pool();
    let t = tag::id("identity-registered").unwrap();
    let (_dir, ckpt) = checkpoint();
    let specs = Plan::destinations(&ckpt, &Rules::default()).unwrap();
    let mut reg = Registry::new();
    let mut blocks = Vec::new();
    for s in &specs {
        let b = pool.alloc_tagged(s.bytes(), t).unwrap();
        reg.register(&s.name, b.ptr, s.dtype, &s.shape).unwrap();
        assert_eq!(reg.owner(reg.get(&s.name).unwrap()), Owner::Block(b.id));
        blocks.push(b);
    }
    // Freed and not reused: refused as a changed destination, not written.
    let first = blocks.iter().min_by_key(|b| b.ptr).unwrap();
    let name = reg
        .iter()
        .find(|d| d.ptr == first.ptr)
        .unwrap()
        .name
        .clone();
    pool.free(first.ptr).unwrap();
    let e = check_destinations(&pool, &reg).unwrap_err();
    assert_changed(&e, &name);
    assert!(
        e.to_string().contains("no pool block"),
        "says the memory is no one's now: {e}"
    );
    // Handed out again: refused too, naming both identities.
    let b = pool.alloc_tagged(first.size, t).unwrap();
    assert_eq!(b.ptr, first.ptr);
    let e = check_owners(&reg).unwrap_err();
    assert_changed(&e, &name);
    let msg = e.to_string();
    assert!(
        msg.contains(&first.id.to_string()) && msg.contains(&b.id.to_string()),
        "{msg}"
    );

    // Registered in a free block (no one's), then handed to someone: refused
    // too, where the address check alone would pass.
    let hole = pool.alloc_tagged(4096, t).unwrap();
    pool.free(hole.ptr).unwrap();
    let mut early = Registry::new();
    early
        .register("early", hole.ptr, Dtype::F32, &[1024])
        .unwrap();
    assert_eq!(early.owner(early.get("early").unwrap()), Owner::Outside);
    let taken = pool.alloc_tagged(4096, t).unwrap();
    assert_eq!(taken.ptr, hole.ptr);
    let e = check_destinations(&pool, &early).unwrap_err();
    assert_changed(&e, "early");
}

#[test]
fn foreign_destinations_keep_their_contract() {
    // Memory outside every pool, declared foreign: recorded as outside and
    // loaded as before; no pool block ever claims it.
    let pool = host_pool();
    let (_dir, ckpt) = checkpoint();
    let d: Arc<dyn Driver> = pool.driver().clone();
    let (_alloc, mut reg) = common::loader::allocate_for(&d, &ckpt, &Rules::default(), 1 << 20);
    for dst in reg.clone().iter() {
        assert_eq!(reg.owner(dst), Owner::Outside);
        reg.declare_foreign(dst.ptr, dst.bytes() as u64).unwrap();
    }
    load_into_pool(
        &pool,
        ckpt,
        &Rules::default(),
        &reg,
        &LoadOptions::default(),
        &Control::default(),
    )
    .unwrap();
}

#[test]
fn a_block_freed_while_the_load_runs_gets_no_reload_source() {
    let pool = host_pool();
    let t = tag::id("identity-during").unwrap();
    let (_dir, ckpt) = checkpoint();
    let reg = allocate(&pool, &ckpt, t);
    let (rules, opts) = (Rules::default(), LoadOptions::default());
    load_into_pool(&pool, ckpt, &rules, &reg, &opts, &Control::default()).unwrap();
    let d = lowest(&reg);
    let moved = Cell::new(false);
    let progress = |_done: u64, _total: u64| {
        if !moved.replace(true) {
            pool.free(d.ptr).unwrap();
            let b = pool.alloc_tagged(d.bytes(), t).unwrap();
            assert_eq!(b.ptr, d.ptr);
        }
    };
    let ctl = Control {
        progress: Some(&progress),
        cancel: None,
    };
    let (_dir2, ckpt) = checkpoint();
    let err = load_into_pool(&pool, ckpt, &rules, &reg, &opts, &ctl).unwrap_err();
    assert!(moved.get(), "the load reported progress");
    assert_changed(&err, &d.name);
    // The load's plan was not registered, and the first load's source no
    // longer covers what this one overwrote: no wake replays anything here.
    let covered = pool.reload_coverage(t);
    assert!(covered.is_empty(), "{covered:?}");
    // With nothing to replay, a Reload sleep keeps every live byte of the
    // tag in the host backup: the new owner's bytes come back as they were.
    let mut before = vec![0u8; d.bytes()];
    // SAFETY: a live, awake block of the pool.
    unsafe { pool.read(d.ptr, &mut before) }.unwrap();
    pool.sleep(&[(t, Policy::Reload)]).unwrap();
    pool.wake(&[t]).unwrap();
    let mut after = vec![0u8; d.bytes()];
    // SAFETY: as above, after the wake.
    unsafe { pool.read(d.ptr, &mut after) }.unwrap();
    assert_eq!(after, before);
}

/// One pool per simulated device 0..n.
fn device_pools(n: usize) -> Vec<Pool> {
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

#[test]
fn a_multi_device_load_refuses_a_destination_that_changed_hands_on_any_device() {
    let (dir, _) = checkpoint();
    let pools = device_pools(2);
    let t = tag::id("identity-multi").unwrap();
    let rules = Rules::default();
    let ckpt = Checkpoint::open(dir.path()).unwrap();
    let regs: Vec<Registry> = pools.iter().map(|p| allocate(p, &ckpt, t)).collect();
    let targets: Vec<PoolLoad> = pools
        .iter()
        .zip(&regs)
        .map(|(pool, registry)| PoolLoad {
            pool,
            rules: &rules,
            registry,
        })
        .collect();
    let opts = LoadOptions::default();
    load_multi_into_pools(
        ckpt,
        &targets,
        MultiMode::Replicas,
        &opts,
        &Control::default(),
    )
    .unwrap();

    // Device 1's lowest destination changes hands; everything else holds a pattern.
    let d = lowest(&regs[1]);
    change_hands(&pools[1], &d, t);
    for (p, r) in pools.iter().zip(&regs) {
        for o in r.iter().filter(|o| !(p.device() == 1 && o.name == d.name)) {
            write(p, o.ptr, PATTERN, o.bytes());
        }
    }
    for mode in [MultiMode::Replicas, MultiMode::Ranks] {
        let ckpt = Checkpoint::open(dir.path()).unwrap();
        let err =
            load_multi_into_pools(ckpt, &targets, mode, &opts, &Control::default()).unwrap_err();
        assert_changed(&err, &d.name);
        assert!(read(&pools[1], d.ptr, d.bytes())
            .iter()
            .all(|&b| b == NEW_OWNER));
        for (p, r) in pools.iter().zip(&regs) {
            for o in r.iter().filter(|o| !(p.device() == 1 && o.name == d.name)) {
                assert!(
                    read(p, o.ptr, o.bytes()).iter().all(|&b| b == PATTERN),
                    "device {}: `{}` written by a refused load ({mode:?})",
                    p.device(),
                    o.name
                );
            }
        }
    }
    // A Reload wake of device 1 after the refused loads keeps the new owner's bytes.
    pools[1].sleep(&[(t, Policy::Reload)]).unwrap();
    pools[1].wake(&[t]).unwrap();
    assert!(read(&pools[1], d.ptr, d.bytes())
        .iter()
        .all(|&b| b == NEW_OWNER));
}

#[test]
fn an_arena_reservation_the_driver_cannot_make_is_out_of_memory() {
    let pool = host_pool();
    let t = tag::id("identity-arena-huge").unwrap();
    pool.set_tag_mode(
        t,
        Mode::Arena {
            reserve_bytes: vmmweights::units::MAX_BYTES,
            grow_step: 0,
        },
    )
    .unwrap();
    let before = pool.report();
    let err = pool.alloc_tagged(4096, t).unwrap_err();
    assert_eq!(err.status(), Status::OutOfMemory, "{err}");
    assert!(err.is_out_of_memory());
    assert!(
        err.to_string().contains("identity-arena-huge"),
        "names the tag: {err}"
    );
    assert_eq!(pool.report(), before, "nothing changed");
    pool.check_invariants().unwrap();
}

mod random {
    //! Property test: random sequences of allocations, frees, reallocations,
    //! loads and Reload sleep/wake cycles never write a byte outside a
    //! destination whose identity is unchanged. Every block the loader does
    //! not own (often handed out at a freed destination's address) holds its
    //! owner's byte after every step; a load succeeds exactly when no
    //! destination was freed since its registry was made. Cases:
    //! `PROPTEST_CASES` (default 32).

    use std::path::PathBuf;
    use std::sync::OnceLock;

    use proptest::prelude::*;
    use vmmweights::loader::{load_into_pool, Checkpoint, Control, Destination, Dtype};
    use vmmweights::loader::{LoadOptions, Registry, Rules};

    use super::{allocate, generate, host_pool, read, write, write_sharded, SMALL};
    use vmmweights::sleep::Policy;
    use vmmweights::{tag, Error, Pool, Status};

    #[derive(Debug, Clone)]
    enum Op {
        /// Free the `pick`-th destination's block (if not freed yet).
        FreeDest {
            pick: usize,
        },
        /// A new owner allocates the size of the `pick`-th destination (so
        /// it lands on a freed one's address), or `bytes` when `exact` is false.
        Alloc {
            pick: usize,
            exact: bool,
            bytes: usize,
        },
        /// A new owner frees its `pick`-th block.
        FreeOther {
            pick: usize,
        },
        /// Allocate a fresh registry and free the old one's blocks (a model
        /// initialised again).
        Reallocate,
        Load,
        /// Sleep the tag with Reload (refused without a source) and wake it.
        ReloadCycle,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => any::<usize>().prop_map(|pick| Op::FreeDest { pick }),
            4 => (any::<usize>(), any::<bool>(), 1usize..20_000)
                .prop_map(|(pick, exact, bytes)| Op::Alloc { pick, exact, bytes }),
            2 => any::<usize>().prop_map(|pick| Op::FreeOther { pick }),
            1 => Just(Op::Reallocate),
            3 => Just(Op::Load),
            1 => Just(Op::ReloadCycle),
        ]
    }

    fn checkpoint_dir() -> &'static PathBuf {
        static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
        &DIR.get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            write_sharded(dir.path(), &generate(&SMALL, Dtype::Bf16), Dtype::Bf16, 2);
            let p = dir.path().to_owned();
            (dir, p)
        })
        .1
    }

    /// A block someone other than the loader owns, and the byte it holds.
    struct Other {
        ptr: u64,
        bytes: usize,
        byte: u8,
    }

    struct Harness {
        pool: Pool,
        tag: tag::TagId,
        reg: Registry,
        /// Destinations of `reg` whose block was freed since `reg` was made.
        freed: Vec<String>,
        others: Vec<Other>,
        next_byte: u8,
    }

    impl Harness {
        fn new() -> Harness {
            let pool = host_pool();
            let tag = tag::id("identity-random").unwrap();
            let ckpt = Checkpoint::open(checkpoint_dir()).unwrap();
            let reg = allocate(&pool, &ckpt, tag);
            Harness {
                pool,
                tag,
                reg,
                freed: Vec::new(),
                others: Vec::new(),
                next_byte: 1,
            }
        }

        fn own(&mut self, ptr: u64, bytes: usize) {
            let byte = self.next_byte;
            self.next_byte = self.next_byte % 250 + 1;
            write(&self.pool, ptr, byte, bytes);
            self.others.push(Other { ptr, bytes, byte });
        }

        fn dest(&self, pick: usize) -> Destination {
            self.reg.iter().nth(pick % self.reg.len()).unwrap().clone()
        }

        fn step(&mut self, op: &Op) {
            match *op {
                Op::FreeDest { pick } => {
                    let d = self.dest(pick);
                    if !self.freed.contains(&d.name) {
                        self.pool.free(d.ptr).unwrap();
                        self.freed.push(d.name);
                    }
                }
                Op::Alloc { pick, exact, bytes } => {
                    let bytes = if exact {
                        self.dest(pick).bytes()
                    } else {
                        bytes
                    };
                    let b = self.pool.alloc_tagged(bytes, self.tag).unwrap();
                    self.own(b.ptr, bytes);
                }
                Op::FreeOther { pick } => {
                    if !self.others.is_empty() {
                        let o = self.others.swap_remove(pick % self.others.len());
                        self.pool.free(o.ptr).unwrap();
                    }
                }
                Op::Reallocate => {
                    let ckpt = Checkpoint::open(checkpoint_dir()).unwrap();
                    let old =
                        std::mem::replace(&mut self.reg, allocate(&self.pool, &ckpt, self.tag));
                    for d in old.iter().filter(|d| !self.freed.contains(&d.name)) {
                        self.pool.free(d.ptr).unwrap();
                    }
                    self.freed.clear();
                }
                Op::Load => {
                    let ckpt = Checkpoint::open(checkpoint_dir()).unwrap();
                    let r = load_into_pool(
                        &self.pool,
                        ckpt,
                        &Rules::default(),
                        &self.reg,
                        &LoadOptions::default(),
                        &Control::default(),
                    );
                    match (&r, self.freed.is_empty()) {
                        (Ok(_), true) => {}
                        (Err(e), false) => assert!(
                            matches!(e, Error::DestinationChanged { what, .. }
                                if self.freed.iter().any(|n| what.contains(&format!("`{n}`")))),
                            "{e}"
                        ),
                        _ => panic!(
                            "load gave {:?} with destinations freed: {:?}",
                            r.as_ref().map(|_| ()),
                            self.freed
                        ),
                    }
                }
                Op::ReloadCycle => {
                    match self.pool.sleep(&[(self.tag, Policy::Reload)]) {
                        Ok(_) => {}
                        Err(e) => assert_eq!(e.status(), Status::InvalidState, "{e}"),
                    }
                    if self.pool.is_tag_asleep(self.tag) {
                        self.pool.wake(&[self.tag]).unwrap();
                    }
                }
            }
        }

        fn check(&self, after: &Op) {
            self.pool.check_invariants().unwrap();
            for o in &self.others {
                let got = read(&self.pool, o.ptr, o.bytes);
                assert!(
                    got.iter().all(|&b| b == o.byte),
                    "after {after:?}: a block owned by someone else at {:#x} (+{}) lost its bytes",
                    o.ptr,
                    o.bytes
                );
            }
        }
    }

    fn cases() -> u32 {
        std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(32)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: cases(), failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn loads_never_write_outside_destinations_whose_identity_is_unchanged(
            ops in proptest::collection::vec(op(), 1..40)
        ) {
            let mut h = Harness::new();
            for op in &ops {
                h.step(op);
                h.check(op);
            }
        }
    }
}
