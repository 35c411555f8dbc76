//! `vmmw bench-pool`: the median cost of a cached alloc+free pair in the
//! caching pool (the block comes from a segment the pool already holds, as in
//! steady state), per size. `tests/torch/bench_pool.py` runs it next to the
//! same measurement through PyTorch's caching allocator.
//!
//! A pair takes well under a microsecond, so each sample times a batch of
//! pairs and divides; the median is over batches.

use std::sync::Arc;
use std::time::Instant;

use vmmweights::units::parse_bytes;
use vmmweights::{tag, Error, Pool, PoolConfig, Result};

use crate::backend::BackendArgs;

/// Options of `vmmw bench-pool`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Sizes, comma-separated, with K/M/G suffixes.
    #[arg(long, default_value = "512,64K,1M,16M,256M", value_delimiter = ',', value_parser = crate::parse::size_text)]
    sizes: Vec<String>,
    /// Timed batches per size (the median is over these).
    #[arg(long, default_value_t = 200)]
    batches: usize,
    /// Alloc+free pairs per batch.
    #[arg(long, default_value_t = 100)]
    pairs: usize,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Draw the results as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<std::path::PathBuf>,
}

#[derive(Debug, serde::Serialize)]
struct Row {
    size: u64,
    pair_ns_median: f64,
    pair_ns_p10: f64,
    pair_ns_p90: f64,
}

#[derive(Debug, serde::Serialize)]
struct Output {
    what: &'static str,
    backend: String,
    device: String,
    reason: String,
    batches: usize,
    pairs_per_batch: usize,
    rows: Vec<Row>,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

pub fn run(args: Args) -> Result<()> {
    if args.batches == 0 || args.pairs == 0 {
        return Err(Error::InvalidArgument(
            "--batches and --pairs must be at least 1".into(),
        ));
    }
    let sizes = args
        .sizes
        .iter()
        .map(|s| {
            parse_bytes(s)
                .ok()
                .filter(|&n| n > 0)
                .map(|n| n as usize)
                .ok_or_else(|| {
                    Error::InvalidArgument(format!(
                        "size `{s}`: expected a positive byte count like 64K"
                    ))
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let opened = args.backend.open()?;
    let driver = opened.driver.clone();
    let pool = Arc::new(Pool::new(driver.clone(), PoolConfig::default())?);
    let t = tag::id("bench")?;
    outln!("backend: {}", driver.kind());
    outln!("  device: {}", driver.describe());
    outln!("  why:    {}", opened.reason);
    outln!(
        "  cached alloc+free pairs: {} batches of {} pairs per size, median per pair",
        args.batches,
        args.pairs
    );
    outln!(
        "{:>12} {:>14} {:>12} {:>12}",
        "size",
        "median ns",
        "p10 ns",
        "p90 ns"
    );
    let mut rows = Vec::new();
    for &size in &sizes {
        // Warm: the first allocation creates the segment; later pairs reuse it.
        let b = pool.alloc_tagged(size, t)?;
        pool.free(b.ptr)?;
        let mut samples = Vec::with_capacity(args.batches);
        for _ in 0..args.batches {
            let t0 = Instant::now();
            for _ in 0..args.pairs {
                let b = pool.alloc_tagged(size, t)?;
                pool.free(std::hint::black_box(b.ptr))?;
            }
            samples.push(t0.elapsed().as_nanos() as f64 / args.pairs as f64);
        }
        samples.sort_by(f64::total_cmp);
        let row = Row {
            size: size as u64,
            pair_ns_median: percentile(&samples, 0.5),
            pair_ns_p10: percentile(&samples, 0.1),
            pair_ns_p90: percentile(&samples, 0.9),
        };
        outln!(
            "{:>12} {:>14.1} {:>12.1} {:>12.1}",
            size,
            row.pair_ns_median,
            row.pair_ns_p10,
            row.pair_ns_p90
        );
        rows.push(row);
    }
    pool.trim()?;
    let out = Output {
        what: "vmmweights Pool: cached alloc+free pair",
        backend: driver.kind().to_string(),
        device: driver.describe(),
        reason: opened.reason,
        batches: args.batches,
        pairs_per_batch: args.pairs,
        rows,
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&out).expect("plain data serializes");
        std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}
