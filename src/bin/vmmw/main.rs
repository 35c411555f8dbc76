//! `vmmw`: the command line. A plain dispatcher: each subcommand lives in its
//! own file with its own `Args` and `run`; adding one is a `mod` line, an enum
//! variant and a match arm. `main` owns what every command shares: the exit
//! codes (see `exit`) and where `--json` output goes (see `output`).

// First: its `outln!`/`out!` macros are used by the modules below.
#[macro_use]
mod output;

mod backend;
mod bench_alloc;
mod bench_chart;
mod bench_codec;
mod bench_load;
mod bench_multi;
mod bench_packed;
mod bench_pool;
mod bench_sleep;
mod bench_swap;
mod bench_update;
mod chart;
mod ctl;
mod demo;
mod demo_out;
mod escape;
mod exec;
mod exit;
mod inspect;
mod load;
mod load_verify;
mod pack;
mod parse;
mod plan;
mod report;
mod serve;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use serde_json::{json, Value};

use exit::{CliError, CliResult};
use output::{JsonTarget, StdoutToStderr};

/// Model weights in GPU memory through CUDA virtual memory management.
///
/// Every command runs on the cuda backend when a GPU is present and on the
/// host backend (a simulation in host memory) otherwise; --backend or
/// VMMW_BACKEND picks one.
#[derive(Parser)]
#[command(name = "vmmw", version, about, long_about, after_help = exit::HELP_EXIT_CODES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a small Llama-shaped checkpoint, load it in place into pool memory, sleep
    /// (weights offloaded, a cache discarded), wake, reload from the checkpoint,
    /// verify every byte at the same address, and print the memory timeline.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Demo(demo::Args),
    /// Validate a checkpoint's headers and show its tensors and mapped destinations.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Inspect(inspect::Args),
    /// The mapping without loading: each destination with its sources, slices and
    /// offsets, and what is missing, unexpected or skipped.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Plan(plan::Args),
    /// Load a checkpoint into pool memory and report what moved and how fast.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Load(load::Args),
    /// Load a checkpoint and share it with other processes on a Unix socket until
    /// SIGINT/SIGTERM; SIGHUP loads it again in place and publishes a new version.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Serve(serve::Args),
    /// Show a saved memory timeline (from `demo --json` or `load --json`) as a table or a chart.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Report(report::Args),
    /// Median cost of segment allocate+free against cuMemAlloc/cuMemFree, same sizes, same run.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchAlloc(bench_alloc::Args),
    /// Median cost of a cached alloc+free pair in the caching pool, per size.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchPool(bench_pool::Args),
    /// Load speed against the link and the disk, page-cached and cold, same run.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchLoad(bench_load::Args),
    /// Sleep/wake of ~16 GB of 8B-shaped weights against the per-segment pinning reference.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchSleep(bench_sleep::Args),
    /// Update a loaded checkpoint's destinations from device tensors of this process,
    /// against a plain device-to-device copy of the same bytes, same run.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchUpdate(bench_update::Args),
    /// OffloadCompressed against raw Offload: backup size per dtype, sleep and wake against the link.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchCodec(bench_codec::Args),
    /// Run a CUDA program with its cudaMalloc'd memory in vmmweights pools
    /// (LD_PRELOAD of libvmmw_preload.so) and a control socket, so `vmmw
    /// ctl` can sleep and wake it. Ends as the program does.
    Exec(exec::Args),
    /// Ask a process serving a control socket (`vmmw exec`) for its memory
    /// status, to sleep, or to wake.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Ctl(ctl::Args),
    /// Two models swapped (one sleeps while the other wakes) for every pair of policies, against the link and sleep-then-wake.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    BenchSwap(bench_swap::Args),
    /// Pack a checkpoint (safetensors file or folder, GGUF file): the same tensors,
    /// header and metadata, each tensor's bytes losslessly compressed (docs/PACKED.md).
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Pack(pack::PackArgs),
    /// Give back the original files of a packed checkpoint, bit for bit.
    #[command(after_help = exit::HELP_EXIT_CODES)]
    Unpack(pack::UnpackArgs),
}

/// What a command asked for on stdout, decided before it runs.
enum Json {
    /// Human output only.
    Off,
    /// The command returns the document.
    Returned,
    /// A benchmark writes it to a scratch file; it is copied to stdout.
    Bench(output::ScratchFile),
}

impl Command {
    fn json(&mut self) -> Json {
        let bench = |j: &mut Option<std::path::PathBuf>| match JsonTarget::resolve(j) {
            JsonTarget::Stdout(f) => Json::Bench(f),
            JsonTarget::Off | JsonTarget::File => Json::Off,
        };
        let flag = |on: bool| if on { Json::Returned } else { Json::Off };
        match self {
            Command::Demo(a) => flag(a.json),
            Command::Inspect(a) => flag(a.json),
            Command::Plan(a) => flag(a.json),
            Command::Load(a) => flag(a.json),
            Command::Report(a) => flag(a.json),
            Command::Serve(_) => Json::Off,
            Command::Exec(_) => Json::Off,
            Command::Ctl(a) => flag(a.json),
            Command::BenchAlloc(a) => bench(&mut a.json),
            Command::BenchPool(a) => bench(&mut a.json),
            Command::BenchLoad(a) => bench(&mut a.json),
            Command::BenchSleep(a) => bench(&mut a.json),
            Command::BenchUpdate(a) => bench(&mut a.json),
            Command::BenchCodec(a) => bench(&mut a.json),
            Command::BenchSwap(a) => bench(&mut a.json),
            Command::Pack(a) => flag(a.json),
            Command::Unpack(a) => flag(a.json),
        }
    }

    fn run(self) -> CliResult<Option<Value>> {
        match self {
            Command::Demo(a) => demo::run(a).map(Some),
            Command::Inspect(a) => inspect::run(a).map(Some),
            Command::Plan(a) => plan::run(a).map(Some),
            Command::Load(a) => load::run(a).map(Some),
            Command::Report(a) => report::run(a).map(Some),
            Command::Serve(a) => serve::run(a).map(Some),
            Command::Exec(a) => exec::run(a).map(Some),
            Command::Ctl(a) => ctl::run(a).map(Some),
            Command::BenchAlloc(mut a) => {
                let p = bench_chart::prepare(&a.backend, &a.chart, &mut a.json)?;
                bench_alloc::run(a)?;
                p.draw(bench_chart::Bench::Alloc)?;
                Ok(None)
            }
            Command::BenchPool(mut a) => {
                let p = bench_chart::prepare(&a.backend, &a.chart, &mut a.json)?;
                bench_pool::run(a)?;
                p.draw(bench_chart::Bench::Pool)?;
                Ok(None)
            }
            Command::BenchLoad(mut a) => {
                let p = bench_chart::prepare(&a.backend, &a.chart, &mut a.json)?;
                bench_load::run(a)?;
                p.draw(bench_chart::Bench::Load)?;
                Ok(None)
            }
            Command::BenchSleep(mut a) => {
                let p = bench_chart::prepare(&a.backend, &a.chart, &mut a.json)?;
                if let Some(c) = &a.reload_checkpoint {
                    // Headers only, before any device work.
                    lib(vmmweights::loader::Checkpoint::open(c))?;
                }
                bench_sleep::run(a)?;
                p.draw(bench_chart::Bench::Sleep)?;
                Ok(None)
            }
            Command::BenchUpdate(a) => {
                a.backend.check()?;
                bench_update::run(a)?;
                Ok(None)
            }
            Command::BenchCodec(a) => {
                bench_codec::run(a)?;
                Ok(None)
            }
            Command::BenchSwap(a) => {
                a.backend.check()?;
                bench_swap::run(a)?;
                Ok(None)
            }
            Command::Pack(a) => pack::run_pack(a).map(Some),
            Command::Unpack(a) => pack::run_unpack(a).map(Some),
        }
    }
}

fn main() -> ExitCode {
    let mut command = Cli::parse().command;
    let json = command.json();
    let redirect = (!matches!(json, Json::Off)).then(StdoutToStderr::new);
    // A panic is a bug; it still ends with a documented code (its message is
    // already on stderr).
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| command.run()));
    let run = run.unwrap_or_else(|_| {
        Err(CliError::failure(
            "internal error (a bug in vmmw; the panic message above says where)",
        ))
    });
    let result = run.and_then(|doc| match &json {
        Json::Bench(f) => output::read_json(f).map(Some),
        _ => Ok(doc),
    });
    match result {
        Ok(doc) => {
            if let Some(r) = redirect {
                r.finish(&doc.unwrap_or(Value::Null));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("vmmw: error: {e}");
            if let Some(r) = redirect {
                r.finish(&json!({
                    "error": { "kind": e.kind(), "exit_code": e.code, "message": e.message }
                }));
            }
            ExitCode::from(e.code)
        }
    }
}

/// Turn a library error into the command's error (for `?` in commands).
pub fn lib<T>(r: vmmweights::Result<T>) -> CliResult<T> {
    r.map_err(CliError::from)
}
