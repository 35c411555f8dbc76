//! `vmmw load`: load a checkpoint into destinations the loader allocates on
//! the chosen backend, and report what moved and how fast.

use std::sync::atomic::AtomicBool;

use vmmweights::loader::*;
use vmmweights::units::parse_bytes;
use vmmweights::{Error, Result};

use crate::backend::BackendArgs;
use crate::inspect::RuleArgs;

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
    #[arg(long, default_value = "auto")]
    strategy: String,
    /// Worker threads (0 = CPUs, at most 16).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Direct-path window size.
    #[arg(long, default_value = "64M")]
    window: String,
    /// Staging slot size (0: sized to keep the slots in use in the CPU cache).
    #[arg(long, default_value = "0")]
    slot: String,
    /// Print progress.
    #[arg(long)]
    progress: bool,
}

pub fn run(a: Args) -> Result<()> {
    let opened = a.backend.open()?;
    let d = opened.driver.clone();
    println!("backend: {} ({})", d.describe(), opened.reason);
    let rules = a.rules.rules()?;
    let ckpt = Checkpoint::open(&a.checkpoint)?;
    let specs = Plan::destinations(&ckpt, &rules)?;
    let total: usize = specs.iter().map(|s| s.bytes().div_ceil(256) * 256).sum();
    let alloc = SegmentAllocator::new(d.clone(), total.max(1));
    let mut reg = Registry::new();
    reg.allocate(&specs, &alloc)?;
    let opts = LoadOptions {
        copy: CopyOptions {
            strategy: Strategy::parse(&a.strategy)?,
            threads: a.threads,
            window_bytes: parse_bytes(&a.window).map_err(Error::InvalidArgument)? as usize,
            slot_bytes: parse_bytes(&a.slot).map_err(Error::InvalidArgument)? as usize,
            ..Default::default()
        },
        ..Default::default()
    };
    let cancel = AtomicBool::new(false);
    let show = |done: u64, total: u64| eprintln!("  {done} / {total} bytes");
    let ctl = Control {
        progress: a.progress.then_some(&show as &dyn Fn(u64, u64)),
        cancel: Some(&cancel),
    };
    let ex = load(&d, ckpt, &rules, &reg, &opts, &ctl)?;
    let s = ex.stats;
    println!(
        "loaded {} bytes into {} destinations in {:.3} s ({:.2} GB/s): direct {} staged {} read {} zero-filled {}, {} threads",
        s.bytes,
        reg.len(),
        s.seconds,
        s.gbps(),
        s.direct_bytes,
        s.staged_bytes,
        s.read_bytes,
        s.filled_bytes,
        s.threads
    );
    if !ex.plan().skipped.is_empty() {
        println!("skipped by rules: {}", ex.plan().skipped.join(", "));
    }
    Ok(())
}
