//! Property test of the pool and sleep/wake against a reference model.
//!
//! proptest draws sequences of alloc (direct and through tag scopes), free,
//! trim, sleep with mixed policies (offload, discard, reload,
//! offload_compressed), wake, and loads
//! (whose executed plans become reload sources). After every step: the pool's
//! invariants hold, its live blocks are exactly the model's (so none overlap),
//! the report agrees with the model per tag, asleep tags hold no physical
//! memory, and every byte the model says is defined is what was written: all
//! bytes of a tag just woken from offload, all loaded bytes of a tag just
//! woken from reload. Dropping the pool leaves nothing behind in the host
//! backend. Cases: `PROPTEST_CASES` (default 64).

use crate::common;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

use common::pool::*;
use proptest::prelude::*;
use vmmweights::loader::{self, Checkpoint, Control, Dtype, LoadOptions, Plan, Registry, Rules};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Mode, Pool, TagId};

const TAGS: [&str; 3] = ["model-a", "model-b", "model-arena"];

#[derive(Debug, Clone)]
enum Op {
    Alloc { tag: usize, size: usize },
    ScopedAlloc { tag: usize, size: usize },
    Free { pick: usize },
    Trim,
    Sleep { tag: usize, policy: Policy },
    Wake { tag: Option<usize> },
    Load { tag: usize },
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1usize..8 << 10, 1usize..2 * G, 1usize..6 * G];
    let policy = prop_oneof![
        Just(Policy::Offload),
        Just(Policy::Discard),
        Just(Policy::Reload),
        Just(Policy::OffloadCompressed)
    ];
    prop_oneof![
        6 => (0..3usize, size.clone()).prop_map(|(tag, size)| Op::Alloc { tag, size }),
        3 => (0..3usize, size).prop_map(|(tag, size)| Op::ScopedAlloc { tag, size }),
        5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => Just(Op::Trim),
        2 => (0..3usize, policy).prop_map(|(tag, policy)| Op::Sleep { tag, policy }),
        2 => proptest::option::of(0..3usize).prop_map(|tag| Op::Wake { tag }),
        1 => (0..3usize).prop_map(|tag| Op::Load { tag }),
    ]
}

/// A live block in the model.
#[derive(Debug, Clone)]
struct Live {
    size: usize,
    tag: TagId,
    /// Seed of the byte pattern written into it; None when its bytes are undefined.
    seed: Option<u64>,
    /// Expected bytes, for blocks a load wrote (never freed by the sequence).
    loaded: Option<Vec<u8>>,
}

fn pattern(seed: u64, i: usize) -> u8 {
    (seed as usize)
        .wrapping_mul(31)
        .wrapping_add(i.wrapping_mul(7)) as u8
        ^ (i >> 9) as u8
}

fn write_pattern(ptr: u64, size: usize, seed: u64) {
    // SAFETY: the pool handed out [ptr, ptr+size) in an awake tag, mapped read/write.
    let s = unsafe { std::slice::from_raw_parts_mut(ptr as usize as *mut u8, size) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = pattern(seed, i);
    }
}

fn check_bytes(ptr: u64, l: &Live) -> Result<(), TestCaseError> {
    // SAFETY: the block is live in an awake tag, so mapped and readable.
    let s = unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, l.size) };
    if let Some(want) = &l.loaded {
        prop_assert!(
            s[..want.len()] == want[..],
            "loaded block {ptr:#x} differs from its checkpoint bytes"
        );
    } else if let Some(seed) = l.seed {
        if let Some(i) = (0..l.size).find(|&i| s[i] != pattern(seed, i)) {
            return Err(TestCaseError::fail(format!(
                "block {ptr:#x}+{} of tag {}: byte {i} is {:#x}, expected {:#x}",
                l.size,
                l.tag,
                s[i],
                pattern(seed, i)
            )));
        }
    }
    Ok(())
}

/// The checkpoint every Load op loads (made once per process).
fn checkpoint_path() -> PathBuf {
    static PATH: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("vmmw-pool-model-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("model.safetensors");
        let bytes = vmmweights::fuzz::tiny_safetensors(&[
            ("w.q", Dtype::Bf16, &[64, 96]),
            ("w.k", Dtype::F32, &[3000]),
            ("w.norm", Dtype::F16, &[40]),
        ]);
        std::fs::write(&p, bytes).unwrap();
        p
    })
    .clone()
}

struct Harness {
    host: Arc<vmmweights::driver::host::HostDriver>,
    pool: Arc<Pool>,
    tags: Vec<TagId>,
    live: BTreeMap<u64, Live>,
    asleep: HashMap<TagId, Policy>,
    has_source: HashMap<TagId, bool>,
    /// Tags that ever held memory in the pool (or were configured in it):
    /// sleep and wake refuse the others.
    known: std::collections::HashSet<TagId>,
    next_seed: u64,
}

impl Harness {
    fn new() -> Harness {
        let host = host(512 << 20);
        let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
        let tags: Vec<TagId> = TAGS.iter().map(|n| tag::id(n).unwrap()).collect();
        pool.set_tag_mode(
            tags[2],
            Mode::Arena {
                reserve_bytes: 32 << 20,
                grow_step: 2 * G,
            },
        )
        .unwrap();
        Harness {
            known: [tags[2]].into_iter().collect(),
            host,
            pool,
            tags,
            live: BTreeMap::new(),
            asleep: HashMap::new(),
            has_source: HashMap::new(),
            next_seed: 1,
        }
    }

    fn alloc(&mut self, t: TagId, size: usize, scoped: bool) -> Result<(), TestCaseError> {
        let r = if scoped {
            let _scope = tag::scope(t).unwrap();
            self.pool.alloc(size)
        } else {
            self.pool.alloc_tagged(size, t)
        };
        if self.asleep.contains_key(&t) {
            prop_assert!(r.is_err(), "allocation in asleep tag {t} succeeded");
            return Ok(());
        }
        let b = r.map_err(|e| TestCaseError::fail(format!("alloc {size} in {t}: {e}")))?;
        self.known.insert(t);
        prop_assert_eq!(b.tag, t);
        prop_assert!(b.size >= size);
        if let Some((&p, l)) = self.live.range(..b.ptr + b.size as u64).next_back() {
            prop_assert!(
                p + l.size as u64 <= b.ptr,
                "new block {:#x} overlaps {p:#x}",
                b.ptr
            );
        }
        let seed = self.next_seed;
        self.next_seed += 1;
        write_pattern(b.ptr, b.size, seed);
        self.live.insert(
            b.ptr,
            Live {
                size: b.size,
                tag: t,
                seed: Some(seed),
                loaded: None,
            },
        );
        Ok(())
    }

    fn free(&mut self, pick: usize) -> Result<(), TestCaseError> {
        let candidates: Vec<u64> = self
            .live
            .iter()
            .filter(|(_, l)| l.loaded.is_none())
            .map(|(&p, _)| p)
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let p = candidates[pick % candidates.len()];
        let l = self.live.remove(&p).unwrap();
        if !self.asleep.contains_key(&l.tag) {
            check_bytes(p, &l)?;
        }
        self.pool
            .free(p)
            .map_err(|e| TestCaseError::fail(format!("free {p:#x}: {e}")))?;
        // A second free of the same pointer is refused and changes nothing.
        prop_assert!(self.pool.free(p).is_err());
        Ok(())
    }

    fn sleep(&mut self, t: TagId, policy: Policy) -> Result<(), TestCaseError> {
        let name = tag::name_of(t);
        let segments = self
            .pool
            .report()
            .tags
            .iter()
            .find(|u| u.tag == name)
            .map_or(0, |u| u.segments);
        let r = self.pool.sleep(&[(t, policy)]);
        if !self.known.contains(&t) {
            prop_assert!(
                r.is_err(),
                "sleep of tag {t}, which never held memory, succeeded"
            );
            prop_assert!(!self.pool.is_tag_asleep(t));
            return Ok(());
        }
        if self.asleep.contains_key(&t) {
            prop_assert!(r.is_ok(), "sleeping an asleep tag: {:?}", r.err());
            return Ok(());
        }
        if policy == Policy::Reload && !self.has_source.get(&t).copied().unwrap_or(false) {
            // Refused when there is memory to sleep; a tag without segments has nothing to do.
            prop_assert_eq!(
                r.is_err(),
                segments > 0,
                "reload sleep without a source: {:?}",
                r.err()
            );
            prop_assert!(!self.pool.is_tag_asleep(t));
            return Ok(());
        }
        r.map_err(|e| TestCaseError::fail(format!("sleep {t} {policy:?}: {e}")))?;
        // A tag without segments has nothing to sleep and stays awake.
        let holds = self.live.values().any(|l| l.tag == t);
        let asleep = self.pool.is_tag_asleep(t);
        prop_assert!(
            asleep || !holds,
            "tag {t} with live blocks is awake after sleep"
        );
        if asleep {
            self.asleep.insert(t, policy);
        }
        Ok(())
    }

    fn wake(&mut self, which: Option<TagId>) -> Result<(), TestCaseError> {
        let woken: Vec<TagId> = match which {
            Some(t) => vec![t],
            None => self.asleep.keys().copied().collect(),
        };
        if let Some(t) = which.filter(|t| !self.known.contains(t)) {
            prop_assert!(
                self.pool.wake(&[t]).is_err(),
                "wake of tag {t}, which never held memory, succeeded"
            );
            return Ok(());
        }
        let r = match which {
            Some(t) => self.pool.wake(&[t]),
            None => self.pool.wake(&[]),
        };
        r.map_err(|e| TestCaseError::fail(format!("wake {woken:?}: {e}")))?;
        for t in woken {
            let Some(policy) = self.asleep.remove(&t) else {
                continue;
            };
            for (&p, l) in self.live.iter_mut().filter(|(_, l)| l.tag == t) {
                match policy {
                    // Every byte comes back.
                    Policy::Offload | Policy::OffloadCompressed => check_bytes(p, l)?,
                    // Loaded bytes come back; the rest is undefined: write it again.
                    Policy::Reload if l.loaded.is_some() => check_bytes(p, l)?,
                    // Discarded loaded bytes are undefined: put them back by hand.
                    Policy::Discard if l.loaded.is_some() => {
                        let want = l.loaded.as_ref().unwrap();
                        // SAFETY: the block is live and its tag awake again.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                want.as_ptr(),
                                p as usize as *mut u8,
                                want.len(),
                            )
                        };
                    }
                    Policy::Discard | Policy::Reload => {
                        l.seed = Some(self.next_seed);
                        self.next_seed += 1;
                        write_pattern(p, l.size, l.seed.unwrap());
                    }
                }
            }
        }
        Ok(())
    }

    fn load(&mut self, t: TagId) -> Result<(), TestCaseError> {
        let path = checkpoint_path();
        let ckpt = Checkpoint::open(&path).unwrap();
        let rules = Rules::default();
        let specs = Plan::destinations(&ckpt, &rules).unwrap();
        let mut reg = Registry::new();
        let before: Vec<u64> = self.pool.live_blocks().iter().map(|b| b.ptr).collect();
        let r = {
            let _scope = tag::scope(t).unwrap();
            reg.allocate(&specs, &*self.pool)
        };
        if self.asleep.contains_key(&t) {
            prop_assert!(
                r.is_err(),
                "allocating destinations in asleep tag {t} succeeded"
            );
            return Ok(());
        }
        r.map_err(|e| TestCaseError::fail(format!("allocating destinations: {e}")))?;
        self.known.insert(t);
        let driver = self.pool.driver().clone();
        let executed = loader::load(
            &driver,
            ckpt,
            &rules,
            &reg,
            &LoadOptions::default(),
            &Control::default(),
        )
        .map_err(|e| TestCaseError::fail(format!("load: {e}")))?;
        let want = Checkpoint::open(&path).unwrap();
        for b in self.pool.live_blocks() {
            if before.contains(&b.ptr) {
                continue;
            }
            let d = reg
                .iter()
                .find(|d| d.ptr == b.ptr)
                .expect("a new block is a destination");
            self.live.insert(
                b.ptr,
                Live {
                    size: b.size,
                    tag: t,
                    seed: None,
                    loaded: Some(want.tensor_bytes(&d.name).unwrap().to_vec()),
                },
            );
        }
        self.pool.add_reload_source(t, Arc::new(executed)).unwrap();
        self.has_source.insert(t, true);
        Ok(())
    }

    fn check(&self) -> Result<(), TestCaseError> {
        self.pool.check_invariants().map_err(TestCaseError::fail)?;
        let live: BTreeMap<u64, (usize, TagId)> = self
            .pool
            .live_blocks()
            .into_iter()
            .map(|b| (b.ptr, (b.size, b.tag)))
            .collect();
        let want: BTreeMap<u64, (usize, TagId)> = self
            .live
            .iter()
            .map(|(&p, l)| (p, (l.size, l.tag)))
            .collect();
        prop_assert_eq!(live, want);
        let r = self.pool.report();
        let t = &r.total;
        prop_assert!(t.live_bytes <= t.reserved_bytes && t.tracked_bytes <= t.reserved_bytes);
        for (i, &tg) in self.tags.iter().enumerate() {
            let name = TAGS[i];
            let want_live: u64 = self
                .live
                .values()
                .filter(|l| l.tag == tg)
                .map(|l| l.size as u64)
                .sum();
            let u = r.tags.iter().find(|u| u.tag == name);
            let got_live = u.map_or(0, |u| u.live_bytes);
            prop_assert_eq!(got_live, want_live, "tag {} live bytes\n{}", name, r);
            let asleep = self.asleep.contains_key(&tg);
            prop_assert_eq!(
                self.pool.is_tag_asleep(tg),
                asleep,
                "tag {} asleep flag",
                name
            );
            if let Some(u) = u {
                prop_assert_eq!(u.asleep, asleep);
                if asleep {
                    prop_assert_eq!(
                        u.tracked_bytes,
                        0,
                        "asleep tag {} holds memory\n{}",
                        name,
                        r
                    );
                }
            }
        }
        prop_assert_eq!(self.host.counts().physical_bytes, t.tracked_bytes);
        // Bytes of awake tags are intact (sampled ends; full checks run at wake and free).
        for (&p, l) in &self.live {
            if self.asleep.contains_key(&l.tag) || l.size < 2 {
                continue;
            }
            let probe = Live {
                size: l.size.min(512),
                ..l.clone()
            };
            if probe.loaded.as_ref().is_some_and(|v| v.len() > 512) {
                continue;
            }
            check_bytes(p, &probe)?;
        }
        Ok(())
    }

    fn run(&mut self, ops: &[Op]) -> Result<(), TestCaseError> {
        for op in ops {
            match *op {
                Op::Alloc { tag, size } => self.alloc(self.tags[tag], size, false)?,
                Op::ScopedAlloc { tag, size } => self.alloc(self.tags[tag], size, true)?,
                Op::Free { pick } => self.free(pick)?,
                Op::Trim => {
                    self.pool
                        .trim()
                        .map_err(|e| TestCaseError::fail(e.to_string()))?;
                }
                Op::Sleep { tag, policy } => self.sleep(self.tags[tag], policy)?,
                Op::Wake { tag } => self.wake(tag.map(|i| self.tags[i]))?,
                Op::Load { tag } => self.load(self.tags[tag])?,
            }
            self.check()?;
        }
        // Wake everything and check every byte once more, then drop.
        self.wake(None)?;
        for (&p, l) in &self.live {
            check_bytes(p, l)?;
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn pool_and_sleep_match_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        let mut h = Harness::new();
        let r = h.run(&ops);
        let host = h.host.clone();
        drop(h);
        r?;
        let c = host.counts();
        prop_assert_eq!(
            (c.reservations, c.handles, c.mappings, c.physical_bytes),
            (0, 0, 0, 0),
            "leak after the pool was dropped: {:?}", c
        );
    }
}

/// Sequences proptest once shrank a real bug to, replayed on every run.
#[test]
fn regressions() {
    use Op::*;
    let cases: Vec<Vec<Op>> = vec![
        // Sleep, free everything, trim (no segments left), sleep again: the
        // second sleep cleared the asleep flag and let allocations in.
        vec![
            ScopedAlloc { tag: 0, size: 1 },
            Sleep {
                tag: 0,
                policy: Policy::Offload,
            },
            Free { pick: 0 },
            Trim,
            Sleep {
                tag: 0,
                policy: Policy::Offload,
            },
            Alloc { tag: 0, size: 100 },
        ],
    ];
    for ops in cases {
        let mut h = Harness::new();
        if let Err(e) = h.run(&ops) {
            panic!("{ops:?}: {e}");
        }
    }
}
