//! Fault injection, table-driven: every driver step the host backend can fail
//! (`FaultOp`, synchronize included) and the loader's file reads, at its 1st,
//! 2nd and 3rd call, during alloc, free, sleep
//! (offload, discard, offload_compressed), wake (offload, reload,
//! offload_compressed) and load. For each case:
//! - the operation returns a typed error (never a panic) or, when the fault
//!   was not reached, succeeds;
//! - the pool's invariants hold and its live blocks are unchanged;
//! - after the fault clears, the same operation succeeds and every byte that
//!   should survive is intact;
//! - once the retry (and, where the report counts leaked bytes, a trim)
//!   succeeded, the pool report counts no leaked bytes, and
//!   dropping the pool leaves nothing in the host backend: what a failed
//!   unmap, release or synchronize kept is given back by the retry (a later
//!   free, trim, or execution that converts).
//!
//! The summary (cases, faults that fired, leaks) is printed; run with
//! `--nocapture` to see it.

use crate::common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::fault::OPS;
use common::pool::*;
use vmmweights::driver::host::{FaultOp, HostDriver};
use vmmweights::loader::{
    self, Checkpoint, Control, Dtype, ExecutedPlan, LoadOptions, Plan, Registry, Rules,
};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool, TagId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Alloc,
    Free,
    SleepOffload,
    SleepDiscard,
    WakeOffload,
    WakeReload,
    SleepCompressed,
    WakeCompressed,
    Load,
}

const PHASES: [Phase; 9] = [
    Phase::Alloc,
    Phase::Free,
    Phase::SleepOffload,
    Phase::SleepDiscard,
    Phase::WakeOffload,
    Phase::WakeReload,
    Phase::Load,
    Phase::SleepCompressed,
    Phase::WakeCompressed,
];

fn pattern(seed: u64, i: usize) -> u8 {
    (seed as usize).wrapping_mul(131).wrapping_add(i) as u8
}

/// A pool with patterned blocks in an offload tag and a discard tag, and a
/// loaded checkpoint (converted and padded) in a reload tag.
struct World {
    host: Arc<HostDriver>,
    pool: Arc<Pool>,
    off: TagId,
    dis: TagId,
    rel: TagId,
    blocks: BTreeMap<u64, (usize, u64)>,
    loaded: Vec<(u64, Vec<u8>)>,
    reg: Registry,
    dir: tempfile::TempDir,
}

fn rules() -> Rules {
    Rules::from_json(
        r#"{"dtype": "F32", "rules": [{"match": "w\\.norm", "pad": {"dim": 0, "to": 48}}]}"#,
    )
    .unwrap()
}

impl World {
    fn new() -> World {
        let host = host(256 << 20);
        let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("model.safetensors"),
            vmmweights::fuzz::tiny_safetensors(&[
                ("w.q", Dtype::Bf16, &[32, 80]),
                ("w.k", Dtype::F32, &[2000]),
                ("w.norm", Dtype::F16, &[40]),
            ]),
        )
        .unwrap();
        let mut w = World {
            host,
            pool,
            off: tag::id("fault-offload").unwrap(),
            dis: tag::id("fault-discard").unwrap(),
            rel: tag::id("fault-reload").unwrap(),
            blocks: BTreeMap::new(),
            loaded: Vec::new(),
            reg: Registry::new(),
            dir,
        };
        for (i, size) in [300usize, 5000, 3 * G, 70 << 10].into_iter().enumerate() {
            for t in [w.off, w.dis] {
                w.alloc(t, size, i as u64 + t.0 as u64 * 10).unwrap();
            }
        }
        let specs = Plan::destinations(&w.ckpt(), &rules()).unwrap();
        {
            let _s = tag::scope(w.rel).unwrap();
            w.reg.allocate(&specs, &*w.pool).unwrap();
        }
        let ex = w.load().unwrap();
        w.pool.add_reload_source(w.rel, Arc::new(ex)).unwrap();
        w.loaded = w
            .reg
            .iter()
            .map(|d| (d.ptr, read(d.ptr, d.bytes())))
            .collect();
        w
    }

    fn ckpt(&self) -> Checkpoint {
        Checkpoint::open(self.dir.path().join("model.safetensors")).unwrap()
    }

    fn load(&self) -> vmmweights::Result<ExecutedPlan> {
        loader::load(
            self.pool.driver(),
            self.ckpt(),
            &rules(),
            &self.reg,
            &LoadOptions::default(),
            &Control::default(),
        )
    }

    fn alloc(&mut self, t: TagId, size: usize, seed: u64) -> vmmweights::Result<u64> {
        let b = self.pool.alloc_tagged(size, t)?;
        // SAFETY: a fresh block in an awake tag, mapped read/write.
        let s = unsafe { std::slice::from_raw_parts_mut(b.ptr as usize as *mut u8, b.size) };
        for (i, x) in s.iter_mut().enumerate() {
            *x = pattern(seed, i);
        }
        self.blocks.insert(b.ptr, (b.size, seed));
        Ok(b.ptr)
    }

    /// Bytes of every block in `tags` are as written; loaded bytes as loaded.
    fn verify(&self, tags: &[TagId], loaded: bool) -> Result<(), String> {
        for (&p, &(size, seed)) in &self.blocks {
            let t = self.pool.segment_of(p).unwrap().tag;
            if !tags.contains(&t) {
                continue;
            }
            let got = read(p, size);
            if let Some(i) = (0..size).find(|&i| got[i] != pattern(seed, i)) {
                return Err(format!("block {p:#x}+{size}: byte {i} changed"));
            }
        }
        if loaded {
            for (p, want) in &self.loaded {
                if &read(*p, want.len()) != want {
                    return Err(format!("loaded destination {p:#x} changed"));
                }
            }
        }
        Ok(())
    }

    fn consistent(&self, live_before: &[vmmweights::Block]) -> Result<(), String> {
        self.pool.check_invariants()?;
        let live = self.pool.live_blocks();
        if live != live_before {
            return Err(format!(
                "live blocks changed: {} before, {} after",
                live_before.len(),
                live.len()
            ));
        }
        Ok(())
    }
}

fn read(ptr: u64, len: usize) -> Vec<u8> {
    // SAFETY: callers pass live blocks of awake tags, mapped and readable.
    unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, len) }.to_vec()
}

fn typed(e: &Error) -> Result<(), String> {
    match e {
        Error::Panic(m) => Err(format!("a panic crossed as an error: {m}")),
        e if e.to_string().is_empty() => Err("empty error message".into()),
        _ => Ok(()),
    }
}

/// Run `phase` with `op` failing at its `nth` call. Returns whether the fault
/// fired and the host objects leaked after the pool was dropped.
fn case(phase: Phase, op: FaultOp, nth: u64) -> Result<(bool, usize), String> {
    let w = World::new();
    let (off, dis, rel) = (w.off, w.dis, w.rel);
    let all = [off, dis, rel];
    // Put the tags to sleep first where the phase is a wake.
    match phase {
        Phase::WakeOffload => {
            w.pool
                .sleep(&[(off, Policy::Offload)])
                .map_err(|e| e.to_string())?;
        }
        Phase::WakeReload => {
            w.pool
                .sleep(&[(rel, Policy::Reload)])
                .map_err(|e| e.to_string())?;
        }
        Phase::WakeCompressed => {
            w.pool
                .sleep(&[(off, Policy::OffloadCompressed)])
                .map_err(|e| e.to_string())?;
        }
        _ => {}
    }
    // A block with a segment of its own: freeing it releases the segment.
    let own = if phase == Phase::Free {
        Some(
            w.pool
                .alloc_segment(2 * G, dis)
                .map_err(|e| e.to_string())?,
        )
    } else {
        None
    };
    let live_before = w.pool.live_blocks();
    w.host.fail_nth(op, nth);
    let r: vmmweights::Result<()> = match phase {
        Phase::Alloc => w.pool.alloc_tagged(5 * G, off).map(|_| ()),
        Phase::Free => w.pool.free_segment(own.unwrap().ptr),
        Phase::SleepOffload => w.pool.sleep(&[(off, Policy::Offload)]).map(|_| ()),
        Phase::SleepDiscard => w.pool.sleep(&[(dis, Policy::Discard)]).map(|_| ()),
        Phase::WakeOffload => w.pool.wake(&[off]).map(|_| ()),
        Phase::WakeReload => w.pool.wake(&[rel]).map(|_| ()),
        Phase::SleepCompressed => w
            .pool
            .sleep(&[(off, Policy::OffloadCompressed)])
            .map(|_| ()),
        Phase::WakeCompressed => w.pool.wake(&[off]).map(|_| ()),
        Phase::Load => w.load().map(|_| ()),
    };
    let fired = !w.host.fault_pending(op);
    w.host.clear_faults();
    if let Err(e) = &r {
        typed(e)?;
        // A free whose release could not synchronize still frees the block
        // (its segment waits, mapped, for a later free or trim).
        let mut expect = live_before.clone();
        if phase == Phase::Free {
            expect.retain(|b| Some(b.ptr) != own.map(|o| o.ptr));
        }
        w.consistent(&expect)?;
        // What the error left asleep stays asleep; what it says is awake is.
        match phase {
            Phase::WakeOffload if !w.pool.is_tag_asleep(off) => {
                return Err("a failed wake left the tag marked awake".into())
            }
            Phase::WakeReload if !w.pool.is_tag_asleep(rel) => {
                return Err("a failed wake left the tag marked awake".into())
            }
            Phase::WakeCompressed if !w.pool.is_tag_asleep(off) => {
                return Err("a failed wake left the tag marked awake".into())
            }
            _ => {}
        }
        // Retry after the fault cleared.
        let retry =
            match phase {
                Phase::Alloc => w.pool.alloc_tagged(5 * G, off).map(|_| ()),
                Phase::Free => w.pool.trim().map(|_| ()).and_then(|()| {
                    match w.pool.segments_awaiting_release() {
                        0 => Ok(()),
                        n => Err(Error::InvalidState(format!(
                            "{n} segments still await release"
                        ))),
                    }
                }),
                Phase::SleepOffload => w.pool.sleep(&[(off, Policy::Offload)]).map(|_| ()),
                Phase::SleepDiscard => w.pool.sleep(&[(dis, Policy::Discard)]).map(|_| ()),
                Phase::WakeOffload => w.pool.wake(&[off]).map(|_| ()),
                Phase::WakeReload => w.pool.wake(&[rel]).map(|_| ()),
                Phase::SleepCompressed => w
                    .pool
                    .sleep(&[(off, Policy::OffloadCompressed)])
                    .map(|_| ()),
                Phase::WakeCompressed => w.pool.wake(&[off]).map(|_| ()),
                Phase::Load => w.load().map(|_| ()),
            };
        retry.map_err(|e| format!("retry after the fault cleared: {e}"))?;
    }
    // A handle whose release failed during sleep is kept by its segment;
    // a trim gives it back.
    if w.pool.report().leaked_bytes != 0 {
        w.pool
            .trim()
            .map_err(|e| format!("trim after the fault cleared: {e}"))?;
    }
    let report = w.pool.report();
    if report.leaked_bytes != 0 || report.leaked_segments != 0 {
        return Err(format!(
            "after the retry the report still counts {} leaked bytes in {} segments",
            report.leaked_bytes, report.leaked_segments
        ));
    }
    w.pool.check_invariants()?;
    // Bring everything back and check the bytes that must survive.
    match phase {
        Phase::SleepOffload | Phase::SleepCompressed => {
            w.pool.wake(&[]).map_err(|e| format!("wake: {e}"))?;
            w.verify(&all, true)?;
        }
        Phase::SleepDiscard => {
            w.pool.wake(&[]).map_err(|e| format!("wake: {e}"))?;
            w.verify(&[off, rel], true)?;
        }
        _ => w.verify(&all, true)?,
    }
    // The pool keeps working: one more sleep/wake cycle of every tag.
    w.pool
        .sleep(&[(off, Policy::Offload), (rel, Policy::Reload)])
        .map_err(|e| format!("later sleep: {e}"))?;
    w.pool.wake(&[]).map_err(|e| format!("later wake: {e}"))?;
    w.verify(&[off, rel], true)?;
    let host = w.host.clone();
    drop(w);
    let c = host.counts();
    let leaked = c.reservations + c.handles + c.mappings;
    Ok((fired, leaked))
}

#[test]
fn every_fault_in_every_phase() {
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    let (mut cases, mut fired_total) = (0, 0);
    for phase in PHASES {
        for op in OPS {
            let (mut fired, mut leaks) = (0, 0);
            for nth in 1..=3 {
                cases += 1;
                match std::panic::catch_unwind(|| case(phase, op, nth)) {
                    Ok(Ok((f, leaked))) => {
                        fired += f as usize;
                        if leaked > 0 {
                            leaks += 1;
                            failures.push(format!(
                                "{phase:?} {op:?} #{nth}: {leaked} host objects leaked"
                            ));
                        }
                    }
                    Ok(Err(e)) => failures.push(format!("{phase:?} {op:?} #{nth}: {e}")),
                    Err(_) => failures.push(format!("{phase:?} {op:?} #{nth}: panicked")),
                }
            }
            fired_total += fired;
            if fired > 0 || leaks > 0 {
                summary.push(format!("{phase:?}\t{op:?}\tfired {fired}/3\tleaks {leaks}"));
            }
        }
    }
    println!(
        "fault table: {cases} cases, {fired_total} faults fired\n{}",
        summary.join("\n")
    );
    assert!(
        failures.is_empty(),
        "{} failing cases:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        fired_total > 40,
        "only {fired_total} faults fired: the table does not reach the driver"
    );
}
