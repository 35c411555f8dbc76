//! `vmmw`: the command line. A plain dispatcher: each subcommand lives in its
//! own file with its own `Args` and `run`; adding one is a `mod` line, an enum
//! variant and a match arm.

mod backend;
mod bench_alloc;
mod bench_load;
mod bench_multi;
mod bench_pool;
mod bench_sleep;
mod demo;
mod inspect;
mod load;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Model weights in GPU memory through CUDA virtual memory management.
#[derive(Parser)]
#[command(name = "vmmw", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Allocate, write, verify, unmap/remap and free a few segments; report which backend ran.
    Demo(demo::Args),
    /// Median cost of segment allocate+free against cuMemAlloc/cuMemFree, same sizes, same run.
    BenchAlloc(bench_alloc::Args),
    /// Median cost of a cached alloc+free pair in the caching pool, per size.
    BenchPool(bench_pool::Args),
    /// Validate a checkpoint's headers and show its tensors and mapped destinations.
    Inspect(inspect::Args),
    /// Load a checkpoint into device memory the loader allocates.
    Load(load::Args),
    /// Load speed against the link and the disk, page-cached and cold, same run.
    BenchLoad(bench_load::Args),
    /// Sleep/wake of ~16 GB of 8B-shaped weights against the per-segment pinning reference.
    BenchSleep(bench_sleep::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Demo(a) => demo::run(a),
        Command::BenchAlloc(a) => bench_alloc::run(a),
        Command::BenchPool(a) => bench_pool::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Load(a) => load::run(a),
        Command::BenchLoad(a) => bench_load::run(a),
        Command::BenchSleep(a) => bench_sleep::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vmmw: error: {e}");
            ExitCode::FAILURE
        }
    }
}
