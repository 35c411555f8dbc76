//! `vmmw load`: load a checkpoint into pool memory tagged "weights" on the
//! chosen backend, and report what moved and how fast, with the pool's
//! timeline (allocated, loaded, freed) as JSON or a chart.

use serde_json::{json, Value};
use vmmweights::loader::*;
use vmmweights::{tag, Pool, PoolConfig};

use crate::backend::BackendArgs;
use crate::exit::CliResult;
use crate::inspect::RuleArgs;
use crate::lib;
use crate::output::{escape_name, Progress};

/// Options of `vmmw load`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// Checkpoint file or folder.
    checkpoint: std::path::PathBuf,
    #[command(flatten)]
    rules: RuleArgs,
    /// Copy strategy: auto, direct, staged, read, simple, populate, hybrid, stream.
    #[arg(long, default_value = "auto", value_parser = crate::parse::strategy)]
    strategy: Strategy,
    /// Worker threads (0 = CPUs, at most 16).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=16))]
    threads: u8,
    /// Direct-path window size.
    #[arg(long, default_value = "64M", value_parser = crate::parse::size_usize)]
    window: usize,
    /// Staging slot size (0: sized to keep the slots in use in the CPU cache).
    #[arg(long, default_value = "0", value_parser = crate::parse::size_usize)]
    slot: usize,
    /// Report progress off a terminal too, as a line per tenth on stderr
    /// (on a terminal a progress bar is always drawn).
    #[arg(long)]
    progress: bool,
    /// Draw the pool's timeline (allocated, loaded, freed) as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<std::path::PathBuf>,
    /// Print one JSON document (docs/CLI.md) instead of the text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: Args) -> CliResult<Value> {
    // Everything the user wrote is checked before the device is opened.
    a.backend.check()?;
    let chart = a
        .chart
        .as_deref()
        .map(crate::chart::check_path)
        .transpose()?;
    let session = lib(Session::open(&a.checkpoint))?;
    lib(session.set_rules(a.rules.rules()?))?;
    lib(session.destination_specs())?;

    let opened = lib(a.backend.open())?;
    let d = opened.driver.clone();
    outln!("backend: {}", d.kind());
    outln!("  device: {}", d.describe());
    outln!("  why:    {}", opened.reason);
    let pool = lib(Pool::new(d.clone(), PoolConfig::default()))?;
    let weights = lib(tag::id("weights"))?;
    lib(session.allocate(&pool, weights))?;
    pool.snapshot("allocated");
    let copy = CopyOptions {
        strategy: a.strategy,
        threads: a.threads as usize,
        window_bytes: a.window,
        slot_bytes: a.slot,
        ..Default::default()
    };
    lib(session.set_options(PlanOptions::default(), copy))?;
    let progress = Progress::new("load", a.progress);
    let show = |done: u64, total: u64| {
        progress.update(done, total);
        std::ops::ControlFlow::Continue(())
    };
    let loaded = session.load(&pool, Some(&show));
    progress.finish();
    let ex = lib(loaded)?;
    pool.snapshot("loaded");
    let s = ex.stats;
    outln!(
        "loaded {} bytes into {} destinations in {:.3} s ({:.2} GB/s): direct {} staged {} read {} zero-filled {}, {} threads",
        s.bytes,
        session.destination_count(),
        s.seconds,
        s.gbps(),
        s.direct_bytes,
        s.staged_bytes,
        s.read_bytes,
        s.filled_bytes,
        s.threads
    );
    let skipped = ex.plan().skipped.clone();
    if !skipped.is_empty() {
        let names: Vec<String> = skipped.iter().map(|n| escape_name(n)).collect();
        outln!("skipped by rules: {}", names.join(", "));
    }
    drop(ex);
    for x in session.destinations() {
        lib(pool.free(x.ptr))?;
    }
    lib(pool.trim())?;
    pool.snapshot("freed and trimmed");
    let timeline = pool.timeline();
    if let Some(path) = &chart {
        let title = format!(
            "vmmw load {} on {}",
            a.checkpoint.file_name().map_or_else(
                || a.checkpoint.display().to_string(),
                |f| f.to_string_lossy().into_owned()
            ),
            d.describe()
        );
        crate::chart::timeline(path, &title, &timeline)?;
        outln!("chart: {}", path.display());
    }
    Ok(json!({
        "backend": d.kind().to_string(),
        "device": d.describe(),
        "reason": opened.reason,
        "checkpoint": a.checkpoint.display().to_string(),
        "destinations": session.destination_count(),
        "bytes": s.bytes,
        "seconds": s.seconds,
        "gbps": s.gbps(),
        "stats": serde_json::to_value(s).unwrap_or(Value::Null),
        "skipped": skipped,
        "timeline": timeline,
    }))
}
