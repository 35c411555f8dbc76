//! Fault injection on the loader's reads of checkpoint bytes (`FaultOp::FileRead`:
//! each `pread` or mapping copy into a staging slot, each direct window, each
//! checksum read), armed through the driver's fault table like every driver step.
//!
//! Load: for every copy strategy, with and without conversion and checksums
//! for Reload, the k-th read fails (k = 1, 2, 3, 5, 9). The load returns `Error::Io` naming the shard file
//! and a tensor of the plan; every destination byte holds its old value or
//! the checkpoint's (the loader's promise: partly written, no torn bytes
//! from elsewhere); the pool's invariants and live blocks are unchanged; no
//! stream or event is left behind; and a retry after the fault clears writes
//! exactly what a clean load writes.
//!
//! Wake: a tag asleep with Reload (replay by each strategy, with and without
//! checksums) whose k-th read fails: `Error::Io` naming the file, the tag stays
//! asleep with no physical memory, and a later wake restores every byte. A
//! Discard wake reads no file.

use crate::common;

use std::sync::Arc;

use common::pool::*;
use vmmweights::driver::host::{FaultOp, HostDriver};
use vmmweights::loader::{
    self, Checkpoint, Control, CopyOptions, Dtype, ExecutedPlan, LoadOptions, Plan, Registry,
    Rules, Strategy,
};
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool, TagId};

const STRATEGIES: [Strategy; 9] = [
    Strategy::Auto,
    Strategy::Direct,
    Strategy::Staged,
    Strategy::Read,
    Strategy::Simple,
    Strategy::Populate,
    Strategy::Hybrid,
    Strategy::Stream,
    Strategy::Registered,
];

const SENTINEL: u8 = 0xA5;

struct World {
    host: Arc<HostDriver>,
    pool: Arc<Pool>,
    tag: TagId,
    reg: Registry,
    rules: Rules,
    opts: LoadOptions,
    dir: tempfile::TempDir,
}

fn rules(convert: bool) -> Rules {
    let json = if convert {
        r#"{"dtype": "F32", "rules": [{"match": "w\\.norm", "pad": {"dim": 0, "to": 48}}]}"#
    } else {
        r#"{"rules": [{"match": "w\\.norm", "pad": {"dim": 0, "to": 48}}]}"#
    };
    Rules::from_json(json).unwrap()
}

impl World {
    fn new(name: &str, strategy: Strategy, convert: bool, reload_check: bool) -> World {
        let host = host(256 << 20);
        let pool = Arc::new(Pool::new(dyn_driver(&host), small_config()).unwrap());
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("model.safetensors"),
            vmmweights::fuzz::tiny_safetensors(&[
                ("w.q", Dtype::Bf16, &[64, 96]),
                ("w.k", Dtype::F32, &[3000]),
                ("w.v", Dtype::F16, &[48, 80]),
                ("w.norm", Dtype::F16, &[40]),
            ]),
        )
        .unwrap();
        let rules = rules(convert);
        let opts = LoadOptions {
            copy: CopyOptions {
                strategy,
                threads: 2,
                // Small windows and slots: every load takes several reads.
                window_bytes: 4096,
                slot_bytes: 4096,
                depth: 2,
                ..CopyOptions::default()
            },
            reload_check,
            ..LoadOptions::default()
        };
        let mut w = World {
            host,
            pool,
            tag: tag::id(name).unwrap(),
            reg: Registry::new(),
            rules,
            opts,
            dir,
        };
        let specs = Plan::destinations(&w.ckpt(), &w.rules).unwrap();
        {
            let _s = tag::scope(w.tag).unwrap();
            w.reg.allocate(&specs, &*w.pool).unwrap();
        }
        w
    }

    fn path(&self) -> std::path::PathBuf {
        self.dir.path().join("model.safetensors")
    }

    fn ckpt(&self) -> Checkpoint {
        Checkpoint::open(self.path()).unwrap()
    }

    fn load(&self) -> vmmweights::Result<ExecutedPlan> {
        loader::load(
            self.pool.driver(),
            self.ckpt(),
            &self.rules,
            &self.reg,
            &self.opts,
            &Control::default(),
        )
    }

    fn snapshot(&self) -> Vec<Vec<u8>> {
        self.reg.iter().map(|d| read(d.ptr, d.bytes())).collect()
    }

    fn fill(&self, byte: u8) {
        for d in self.reg.iter() {
            // SAFETY: a live destination of an awake tag, mapped read/write.
            unsafe { std::ptr::write_bytes(d.ptr as usize as *mut u8, byte, d.bytes()) };
        }
    }

    fn names(&self) -> Vec<String> {
        self.reg.iter().map(|d| d.name.clone()).collect()
    }
}

fn read(ptr: u64, len: usize) -> Vec<u8> {
    // SAFETY: callers pass live destinations of awake tags, mapped and readable.
    unsafe { std::slice::from_raw_parts(ptr as usize as *const u8, len) }.to_vec()
}

/// The error is an I/O error on the shard file naming one of the tensors.
fn names_file_and_tensor(e: &Error, w: &World) -> Result<(), String> {
    let s = e.to_string();
    match e {
        Error::Io { path, .. } if *path == w.path() => {}
        _ => {
            return Err(format!(
                "expected an I/O error on {}: {s}",
                w.path().display()
            ))
        }
    }
    if !s.contains("injected read failure") {
        return Err(format!("the cause is not the injected read: {s}"));
    }
    // Destination names equal source names here (no renames).
    if !w.names().iter().any(|n| s.contains(&format!("`{n}`"))) {
        return Err(format!("no tensor named: {s}"));
    }
    Ok(())
}

fn load_case(strategy: Strategy, convert: bool, check: bool, k: u64) -> Result<bool, String> {
    let w = World::new("fault-read-load", strategy, convert, check);
    // A clean load gives the reference bytes.
    w.load().map_err(|e| format!("clean load: {e}"))?;
    let want = w.snapshot();
    w.fill(SENTINEL);
    let live = w.pool.live_blocks();
    let before = w.host.counts();
    w.host.fail_nth(FaultOp::FileRead, k);
    let r = w.load();
    let fired = !w.host.fault_pending(FaultOp::FileRead);
    w.host.clear_faults();
    match (&r, fired) {
        (Ok(_), true) => return Err("the read fault fired but the load succeeded".into()),
        (Err(e), false) => return Err(format!("the load failed without the fault: {e}")),
        (Err(e), true) => names_file_and_tensor(e, &w)?,
        (Ok(_), false) => {}
    }
    // Partly written at most: each byte old or new.
    for (i, (d, want)) in w.reg.iter().zip(&want).enumerate() {
        let got = read(d.ptr, d.bytes());
        if let Some(b) = (0..got.len()).find(|&b| got[b] != SENTINEL && got[b] != want[b]) {
            return Err(format!(
                "destination {i} (`{}`) byte {b} is {:#x}: neither its old value nor the checkpoint's",
                d.name, got[b]
            ));
        }
    }
    w.pool.check_invariants()?;
    if w.pool.live_blocks() != live {
        return Err("live blocks changed".into());
    }
    let after = w.host.counts();
    if (after.streams, after.events) != (before.streams, before.events) {
        return Err(format!(
            "streams/events left behind: {before:?} before, {after:?} after"
        ));
    }
    w.load()
        .map_err(|e| format!("retry after the fault cleared: {e}"))?;
    if w.snapshot() != want {
        return Err("the retry's bytes differ from a clean load".into());
    }
    Ok(fired)
}

#[test]
fn load_with_a_read_fault_at_the_kth_read() {
    let (mut cases, mut fired, mut failures) = (0, 0, Vec::new());
    for strategy in STRATEGIES {
        // Checksums for Reload (`reload_check`) read the loaded bytes once more.
        for (convert, check) in [(false, false), (true, false), (true, true)] {
            for k in [1, 2, 3, 5, 9] {
                cases += 1;
                let what = format!("{strategy:?} convert={convert} checksums={check} k={k}");
                match std::panic::catch_unwind(|| load_case(strategy, convert, check, k)) {
                    Ok(Ok(f)) => fired += f as usize,
                    Ok(Err(e)) => failures.push(format!("{what}: {e}")),
                    Err(_) => failures.push(format!("{what}: panicked")),
                }
            }
        }
    }
    println!("file-read faults at load: {cases} cases, {fired} fired");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Every strategy reads at least 5 times with 4 KiB slots and windows.
    assert!(
        fired >= 9 * 3 * 4,
        "only {fired} of {cases} read faults fired"
    );
}

fn wake_case(strategy: Strategy, check: bool, k: u64) -> Result<bool, String> {
    let w = World::new("fault-read-wake", strategy, true, check);
    let ex = w.load().map_err(|e| format!("load: {e}"))?;
    let want = w.snapshot();
    let ex = Arc::new(ex);
    w.pool
        .add_reload_source(w.tag, ex.clone())
        .map_err(|e| format!("add_reload_source: {e}"))?;
    w.pool
        .sleep(&[(w.tag, Policy::Reload)])
        .map_err(|e| format!("sleep: {e}"))?;
    // Pinning the page cache runs in the background: finish it, so the
    // replay path is the same on every run.
    vmmweights::sleep::reload::ReloadSource::wait_prepared(&*ex);
    let before = w.host.counts();
    w.host.fail_nth(FaultOp::FileRead, k);
    let r = w.pool.wake(&[w.tag]);
    let fired = !w.host.fault_pending(FaultOp::FileRead);
    w.host.clear_faults();
    match (&r, fired) {
        (Ok(_), true) => return Err("the read fault fired but the wake succeeded".into()),
        (Err(e), false) => return Err(format!("the wake failed without the fault: {e}")),
        (Err(e), true) => {
            let s = e.to_string();
            match e {
                Error::Io { path, .. } if *path == w.path() => {}
                _ => return Err(format!("expected an I/O error on the shard: {s}")),
            }
            if !w.pool.is_tag_asleep(w.tag) {
                return Err("a failed wake left the tag awake".into());
            }
            for d in w.reg.iter() {
                let seg = w.pool.segment_of(d.ptr).ok_or("destination lost")?;
                if seg.tracked_bytes != 0 {
                    return Err(format!(
                        "the asleep tag holds {} bytes of memory after a failed wake",
                        seg.tracked_bytes
                    ));
                }
            }
            let after = w.host.counts();
            if after.physical_bytes != before.physical_bytes
                || (after.streams, after.events) != (before.streams, before.events)
            {
                return Err(format!("failed wake left {after:?}, was {before:?}"));
            }
        }
        (Ok(_), false) => {}
    }
    w.pool.check_invariants()?;
    if w.pool.is_tag_asleep(w.tag) {
        w.pool
            .wake(&[w.tag])
            .map_err(|e| format!("wake after the fault cleared: {e}"))?;
    }
    if w.snapshot() != want {
        return Err("bytes after wake differ from the load".into());
    }
    // And the tag keeps cycling.
    w.pool
        .sleep(&[(w.tag, Policy::Reload)])
        .map_err(|e| format!("later sleep: {e}"))?;
    w.pool
        .wake(&[w.tag])
        .map_err(|e| format!("later wake: {e}"))?;
    if w.snapshot() != want {
        return Err("bytes after a later cycle differ".into());
    }
    Ok(fired)
}

#[test]
fn reload_wake_with_a_read_fault_stays_asleep_and_wakes_later() {
    let (mut cases, mut fired, mut failures) = (0, 0, Vec::new());
    for strategy in STRATEGIES {
        for check in [false, true] {
            for k in [1, 2, 4] {
                cases += 1;
                match std::panic::catch_unwind(|| wake_case(strategy, check, k)) {
                    Ok(Ok(f)) => fired += f as usize,
                    Ok(Err(e)) => failures.push(format!("{strategy:?} check={check} k={k}: {e}")),
                    Err(_) => failures.push(format!("{strategy:?} check={check} k={k}: panicked")),
                }
            }
        }
    }
    println!("file-read faults at Reload wake: {cases} cases, {fired} fired");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        fired >= cases * 2 / 3,
        "only {fired} of {cases} read faults fired"
    );
}

#[test]
fn discard_wake_reads_no_file() {
    let w = World::new("fault-read-discard", Strategy::Auto, false, false);
    w.load().unwrap();
    w.pool.sleep(&[(w.tag, Policy::Discard)]).unwrap();
    w.host.fail_always(FaultOp::FileRead);
    w.pool.wake(&[w.tag]).unwrap();
    w.host.clear_faults();
    assert!(!w.pool.is_tag_asleep(w.tag));
    w.pool.check_invariants().unwrap();
    // Loading again after the discard gives the checkpoint's bytes.
    w.fill(SENTINEL);
    w.load().unwrap();
    let want = w.snapshot();
    assert!(want.iter().all(|d| d.iter().any(|&b| b != SENTINEL)));
}
