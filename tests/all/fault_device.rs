//! The fault matrix on whichever backend `VMMW_BACKEND` names, through the
//! driver's own fault table (`Testing::faults`): `cuda` on the GPU machine
//! (scripts/gpu.d/65-reliability.sh), the host backend otherwise (the CI twin).
//! With `VMMW_BACKEND=cuda` and no CUDA driver the test prints why and skips.
//!
//! Every step the table can fail (driver steps and the loader's file reads)
//! at its 1st and 2nd call, during alloc, free, trim, sleep (offload,
//! discard), wake (offload, reload) and a converting, padded load. Bytes are
//! written and compared through device copies, so the same code runs on a
//! GPU. For each case:
//! - a typed error (never a panic), or success when the fault was not reached;
//! - invariants hold, live blocks are unchanged, a failed wake leaves the tag asleep;
//! - after the fault clears, the operation (or, for free, a trim) succeeds,
//!   the report counts no leaked bytes (a trim gives back what a failed
//!   release kept), and every byte that must survive is intact;
//! - one more sleep/wake cycle of every tag works;
//! - after the pool is dropped nothing is left: host backend objects all
//!   gone; on cuda, free device memory back where it was (within 64 MiB).

use crate::common;

use std::io::Write;
use std::sync::Arc;

use common::fault::OPS;

use vmmweights::driver::fault::FaultOp;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::driver::testing::Testing;
use vmmweights::driver::{self, BackendChoice, BackendKind, StreamId};
use vmmweights::loader::{
    self, Checkpoint, Control, Dtype, ExecutedPlan, LoadOptions, Plan, Registry, Rules,
};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Driver, Error, Pool, PoolConfig, TagId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Alloc,
    Free,
    Trim,
    SleepOffload,
    SleepDiscard,
    WakeOffload,
    WakeReload,
    Load,
}

const PHASES: [Phase; 8] = [
    Phase::Alloc,
    Phase::Free,
    Phase::Trim,
    Phase::SleepOffload,
    Phase::SleepDiscard,
    Phase::WakeOffload,
    Phase::WakeReload,
    Phase::Load,
];

/// The driver `VMMW_BACKEND` names, or None (with the reason printed) when
/// cuda is asked for and no CUDA driver is present.
fn open() -> Option<Arc<dyn Driver>> {
    let choice = BackendChoice::from_env().unwrap();
    if matches!(choice, BackendChoice::Auto | BackendChoice::Host) {
        // Small granules keep the host twin quick.
        return Some(Arc::new(HostDriver::new(HostConfig {
            granularity: 64 << 10,
            memory_limit: 256 << 20,
        })));
    }
    match driver::open(choice, 0) {
        Ok(o) => Some(o.driver),
        Err(e @ Error::DriverUnavailable(_)) => {
            let _ = writeln!(
                std::io::stderr(),
                "fault_device: skipped, no CUDA driver present ({e}); run with VMMW_BACKEND=host for the twin"
            );
            None
        }
        Err(e) => panic!("opening {choice:?}: {e}"),
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed as usize).wrapping_mul(131).wrapping_add(i) as u8)
        .collect()
}

fn upload(d: &dyn Driver, ptr: u64, bytes: &[u8]) -> vmmweights::Result<()> {
    // SAFETY: `ptr` is a live pool block of at least `bytes.len()` bytes in an awake tag.
    unsafe { d.copy_htod_async(ptr, bytes.as_ptr(), bytes.len(), StreamId::DEFAULT) }?;
    d.synchronize()
}

fn download(d: &dyn Driver, ptr: u64, len: usize) -> vmmweights::Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    // SAFETY: as in `upload`; `v` holds `len` bytes.
    unsafe { d.copy_dtoh_async(v.as_mut_ptr(), ptr, len, StreamId::DEFAULT) }?;
    d.synchronize()?;
    Ok(v)
}

struct World {
    d: Arc<dyn Driver>,
    pool: Arc<Pool>,
    off: TagId,
    dis: TagId,
    rel: TagId,
    /// (ptr, bytes written) of patterned blocks.
    blocks: Vec<(u64, Vec<u8>)>,
    loaded: Vec<(u64, Vec<u8>)>,
    reg: Registry,
    rules: Rules,
    dir: tempfile::TempDir,
}

impl World {
    fn new(d: &Arc<dyn Driver>) -> Result<World, String> {
        let g = d.granularity();
        let config = PoolConfig {
            small_request_max: 8 << 10,
            small_segment_bytes: g,
            large_segment_bytes: 4 * g,
            ..PoolConfig::default()
        };
        let pool = Arc::new(Pool::new(d.clone(), config).map_err(|e| e.to_string())?);
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(
            dir.path().join("model.safetensors"),
            vmmweights::fuzz::tiny_safetensors(&[
                ("w.q", Dtype::Bf16, &[64, 80]),
                ("w.k", Dtype::F32, &[3000]),
                ("w.norm", Dtype::F16, &[40]),
            ]),
        )
        .map_err(|e| e.to_string())?;
        let rules = Rules::from_json(
            r#"{"dtype": "F32", "rules": [{"match": "w\\.norm", "pad": {"dim": 0, "to": 48}}]}"#,
        )
        .map_err(|e| e.to_string())?;
        let mut w = World {
            d: d.clone(),
            pool,
            off: tag::id("faultdev-offload").map_err(|e| e.to_string())?,
            dis: tag::id("faultdev-discard").map_err(|e| e.to_string())?,
            rel: tag::id("faultdev-reload").map_err(|e| e.to_string())?,
            blocks: Vec::new(),
            loaded: Vec::new(),
            reg: Registry::new(),
            rules,
            dir,
        };
        for (i, size) in [300usize, 5000, 3 * g, 70 << 10].into_iter().enumerate() {
            for t in [w.off, w.dis] {
                w.alloc(t, size, i as u64 + t.0 as u64 * 10)
                    .map_err(|e| e.to_string())?;
            }
        }
        let specs = Plan::destinations(&w.ckpt(), &w.rules).map_err(|e| e.to_string())?;
        {
            let _s = tag::scope(w.rel).map_err(|e| e.to_string())?;
            w.reg
                .allocate(&specs, &*w.pool)
                .map_err(|e| e.to_string())?;
        }
        let ex = w.load().map_err(|e| e.to_string())?;
        w.pool
            .add_reload_source(w.rel, Arc::new(ex))
            .map_err(|e| e.to_string())?;
        let mut loaded = Vec::new();
        for dst in w.reg.iter() {
            let bytes = download(d.as_ref(), dst.ptr, dst.bytes()).map_err(|e| e.to_string())?;
            loaded.push((dst.ptr, bytes));
        }
        w.loaded = loaded;
        Ok(w)
    }

    fn faults(&self) -> &vmmweights::driver::fault::Faults {
        self.d.faults().expect("both backends have a fault table")
    }

    fn ckpt(&self) -> Checkpoint {
        Checkpoint::open(self.dir.path().join("model.safetensors")).unwrap()
    }

    fn load(&self) -> vmmweights::Result<ExecutedPlan> {
        loader::load(
            self.pool.driver(),
            self.ckpt(),
            &self.rules,
            &self.reg,
            &LoadOptions::default(),
            &Control::default(),
        )
    }

    fn alloc(&mut self, t: TagId, size: usize, seed: u64) -> vmmweights::Result<u64> {
        let b = self.pool.alloc_tagged(size, t)?;
        let bytes = pattern(seed, b.size);
        upload(self.d.as_ref(), b.ptr, &bytes)?;
        self.blocks.push((b.ptr, bytes));
        Ok(b.ptr)
    }

    /// Bytes of every block in `tags` are as written; loaded bytes as loaded.
    fn verify(&self, tags: &[TagId]) -> Result<(), String> {
        for (p, want) in &self.blocks {
            let t = self.pool.segment_of(*p).ok_or("block lost")?.tag;
            if !tags.contains(&t) {
                continue;
            }
            let got = download(self.d.as_ref(), *p, want.len()).map_err(|e| e.to_string())?;
            if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
                return Err(format!("block {p:#x}: byte {i} changed"));
            }
        }
        for (p, want) in &self.loaded {
            let got = download(self.d.as_ref(), *p, want.len()).map_err(|e| e.to_string())?;
            if &got != want {
                return Err(format!("loaded destination {p:#x} changed"));
            }
        }
        Ok(())
    }
}

fn typed(e: &Error) -> Result<(), String> {
    match e {
        Error::Panic(m) => Err(format!("a panic crossed as an error: {m}")),
        e if e.to_string().is_empty() => Err("empty error message".into()),
        _ => Ok(()),
    }
}

fn run(w: &World, phase: Phase, own: Option<u64>) -> vmmweights::Result<()> {
    let g = w.d.granularity();
    match phase {
        Phase::Alloc => w.pool.alloc_tagged(5 * g, w.off).map(|_| ()),
        Phase::Free => w.pool.free_segment(own.expect("own segment")),
        Phase::Trim => w.pool.trim().map(|_| ()),
        Phase::SleepOffload => w.pool.sleep(&[(w.off, Policy::Offload)]).map(|_| ()),
        Phase::SleepDiscard => w.pool.sleep(&[(w.dis, Policy::Discard)]).map(|_| ()),
        Phase::WakeOffload => w.pool.wake(&[w.off]).map(|_| ()),
        Phase::WakeReload => w.pool.wake(&[w.rel]).map(|_| ()),
        Phase::Load => w.load().map(|_| ()),
    }
}

/// Returns whether the fault fired.
fn case(d: &Arc<dyn Driver>, phase: Phase, op: FaultOp, nth: u64) -> Result<bool, String> {
    let w = World::new(d)?;
    let (off, dis, rel) = (w.off, w.dis, w.rel);
    let g = d.granularity();
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
        _ => {}
    }
    let own = match phase {
        Phase::Free => Some(
            w.pool
                .alloc_segment(2 * g, dis)
                .map_err(|e| e.to_string())?
                .ptr,
        ),
        Phase::Trim => {
            // A cached, wholly free segment for trim to give back (larger
            // than the free room of every segment the world holds).
            let b = w.pool.alloc_tagged(5 * g, dis).map_err(|e| e.to_string())?;
            w.pool.free(b.ptr).map_err(|e| e.to_string())?;
            if w.pool.segment_of(b.ptr).is_none() {
                return Err("the trim phase found no cached segment".into());
            }
            None
        }
        _ => None,
    };
    let mut live_before = w.pool.live_blocks();
    if phase == Phase::Free {
        live_before.retain(|b| Some(b.ptr) != own);
    }
    w.faults().fail_nth(op, nth);
    let r = run(&w, phase, own);
    let fired = !w.faults().pending(op);
    w.faults().clear();
    if let Err(e) = &r {
        typed(e)?;
        w.pool.check_invariants()?;
        if w.pool.live_blocks() != live_before {
            return Err("live blocks changed".into());
        }
        let asleep = match phase {
            Phase::WakeOffload => Some(off),
            Phase::WakeReload => Some(rel),
            _ => None,
        };
        if asleep.is_some_and(|t| !w.pool.is_tag_asleep(t)) {
            return Err("a failed wake left the tag marked awake".into());
        }
        let retry = match phase {
            Phase::Free => w.pool.trim().map(|_| ()),
            p => run(&w, p, None),
        };
        retry.map_err(|e| format!("retry after the fault cleared: {e}"))?;
    } else if !fired {
        // Not reached: nothing to check beyond the rest.
    }
    if w.pool.report().leaked_bytes != 0 {
        w.pool
            .trim()
            .map_err(|e| format!("trim after the fault cleared: {e}"))?;
    }
    let report = w.pool.report();
    if report.leaked_bytes != 0 || report.leaked_segments != 0 {
        return Err(format!(
            "the report still counts {} leaked bytes in {} segments",
            report.leaked_bytes, report.leaked_segments
        ));
    }
    w.pool.check_invariants()?;
    match phase {
        Phase::SleepOffload => {
            w.pool.wake(&[]).map_err(|e| format!("wake: {e}"))?;
            w.verify(&[off, dis, rel])?;
        }
        Phase::SleepDiscard => {
            w.pool.wake(&[]).map_err(|e| format!("wake: {e}"))?;
            w.verify(&[off, rel])?;
        }
        _ => w.verify(&[off, dis, rel])?,
    }
    w.pool
        .sleep(&[(off, Policy::Offload), (rel, Policy::Reload)])
        .map_err(|e| format!("later sleep: {e}"))?;
    w.pool.wake(&[]).map_err(|e| format!("later wake: {e}"))?;
    w.verify(&[off, rel])?;
    Ok(fired)
}

/// What is left on the device once a world is dropped.
fn leftovers(d: &Arc<dyn Driver>, free_before: u64) -> Option<String> {
    if let Some(h) = d.as_host() {
        let c = h.counts();
        let n = c.reservations + c.handles + c.mappings;
        return (n > 0).then(|| format!("{c:?}"));
    }
    let free = d.mem_info().ok()?.free;
    (free + (64 << 20) < free_before)
        .then(|| format!("free device memory {free} bytes, was {free_before}"))
}

#[test]
fn fault_matrix_on_the_chosen_backend() {
    let Some(d) = open() else {
        return;
    };
    let _ = writeln!(std::io::stderr(), "fault_device: on {}", d.describe());
    // A first world warms what a backend sets up once (modules, rings).
    drop(World::new(&d).unwrap());
    let free_before = d.mem_info().map(|m| m.free).unwrap_or(0);
    let (mut cases, mut fired_total, mut failures, mut rows) = (0, 0, Vec::new(), Vec::new());
    for phase in PHASES {
        for op in OPS {
            let mut fired = 0;
            for nth in 1..=2 {
                cases += 1;
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    case(&d, phase, op, nth)
                }));
                d.faults().unwrap().clear();
                match r {
                    Ok(Ok(f)) => fired += f as usize,
                    Ok(Err(e)) => failures.push(format!("{phase:?} {op:?} #{nth}: {e}")),
                    Err(_) => failures.push(format!("{phase:?} {op:?} #{nth}: panicked")),
                }
                if let Some(left) = leftovers(&d, free_before) {
                    failures.push(format!("{phase:?} {op:?} #{nth}: left behind {left}"));
                }
            }
            fired_total += fired;
            if fired > 0 {
                rows.push(format!("{phase:?} {op:?} {fired}/2"));
            }
        }
    }
    let backend = match d.kind() {
        BackendKind::Cuda => "cuda",
        BackendKind::Host => "host",
    };
    println!(
        "fault matrix ({backend}): {cases} cases, {fired_total} faults fired, {} failing\n{}",
        failures.len(),
        rows.join("\n")
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
