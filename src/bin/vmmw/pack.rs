//! `vmmw pack` and `vmmw unpack`: a checkpoint to a packed checkpoint
//! (docs/PACKED.md) and back, bit for bit.

use serde_json::{json, Value};
use vmmweights::loader::pack::{self, PackOptions, PackReport};
use vmmweights::units::parse_bytes;
use vmmweights::{BackendChoice, BackendKind, Error};

use crate::backend::BackendArgs;
use crate::exit::{CliError, CliResult};
use crate::lib;
use crate::output::escape_name;

/// Options of `vmmw pack`.
#[derive(clap::Args, Debug)]
pub struct PackArgs {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// A safetensors file, a folder with `model.safetensors.index.json` (or
    /// `model.safetensors`), or a GGUF file.
    input: std::path::PathBuf,
    /// The packed checkpoint to write: a folder for a folder, else a file.
    /// It must not exist (see --force).
    output: std::path::PathBuf,
    /// Raw bytes per frame: a multiple of 64K from 64K to 256M. Smaller frames
    /// let a tensor-parallel slice decode less; larger ones fill the GPU better.
    #[arg(long, default_value = "16M", value_parser = crate::parse::size_text)]
    frame: String,
    /// CPU threads reading, writing and (with --cpu) encoding (0: the CPUs, at most 16).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Encode with the reference encoder on CPU threads even when a GPU is present.
    #[arg(long)]
    cpu: bool,
    /// Replace an existing output file (a folder is never replaced).
    #[arg(long)]
    force: bool,
    /// Print one JSON document instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Options of `vmmw unpack`.
#[derive(clap::Args, Debug)]
pub struct UnpackArgs {
    /// A packed checkpoint: a file, or a folder with its index.
    input: std::path::PathBuf,
    /// Where to write the original: a folder for a folder, else a file. It
    /// must not exist (see --force).
    output: std::path::PathBuf,
    /// Decoding threads (0: the CPUs, at most 16).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Replace an existing output file (a folder is never replaced).
    #[arg(long)]
    force: bool,
    /// Print one JSON document instead of the text.
    #[arg(long)]
    pub json: bool,
}

fn report(verb: &str, r: &PackReport) -> Value {
    for f in &r.files {
        outln!(
            "  {} {} -> {} bytes ({:.1}%), {} frames",
            escape_name(&f.path.display().to_string()),
            f.original_bytes,
            f.packed_bytes,
            100.0 * f.packed_bytes as f64 / f.original_bytes.max(1) as f64,
            f.frames
        );
    }
    let rate = r.original_bytes as f64 / r.seconds.max(1e-9) / 1e9;
    outln!(
        "{verb} {} tensors: {} -> {} bytes ({:.1}%) in {:.2} s ({rate:.2} GB/s of original bytes, {}), then {:.2} s to sync and rename",
        r.tensors,
        r.original_bytes,
        r.packed_bytes,
        100.0 * r.packed_bytes as f64 / r.original_bytes.max(1) as f64,
        r.seconds,
        r.coder,
        r.sync_seconds
    );
    let mut doc = serde_json::to_value(r).unwrap_or(Value::Null);
    doc["gbps"] = json!(rate);
    doc["ratio"] = json!(r.packed_bytes as f64 / r.original_bytes.max(1) as f64);
    doc
}

pub fn run_pack(a: PackArgs) -> CliResult<Value> {
    let frame = parse_bytes(&a.frame).map_err(CliError::bad_input)?;
    // The GPU's kernels when there is one; a host backend asked for by name
    // runs the reference through the driver (the CI twin of the GPU path);
    // otherwise CPU threads.
    let driver = if a.cpu {
        None
    } else {
        let (choice, _) = lib(a.backend.choice())?;
        let opened = lib(a.backend.open())?;
        match opened.driver.kind() {
            BackendKind::Cuda => Some(opened.driver),
            BackendKind::Host if choice == BackendChoice::Host => Some(opened.driver),
            BackendKind::Host => None,
        }
    };
    let opts = PackOptions {
        frame_bytes: frame,
        threads: a.threads,
        driver,
        force: a.force,
    };
    let bar = crate::output::Progress::new("pack", false);
    let show = |done: u64, total: u64| bar.update(done, total);
    let r = pack::pack(&a.input, &a.output, &opts, Some(&show), None);
    bar.finish();
    let r = r.map_err(|e| match e {
        Error::InvalidArgument(m) => CliError::bad_input(m),
        e => CliError::from(e),
    })?;
    Ok(report("packed", &r))
}

pub fn run_unpack(a: UnpackArgs) -> CliResult<Value> {
    let bar = crate::output::Progress::new("unpack", false);
    let show = |done: u64, total: u64| bar.update(done, total);
    let r = pack::unpack(&a.input, &a.output, a.threads, a.force, Some(&show), None);
    bar.finish();
    let r = r.map_err(|e| match e {
        Error::InvalidArgument(m) => CliError::bad_input(m),
        e => CliError::from(e),
    })?;
    Ok(report("unpacked", &r))
}
