//! `vmmw plan`: the mapping without loading. Builds the same checked plan a
//! load executes, against destinations at made-up addresses (the layout the
//! loader would allocate, or a `--registry` file's), and shows for each
//! destination which source bytes land where, plus what is missing,
//! unexpected or skipped. Reads headers only: no tensor data, no device.

use serde::Deserialize;
use serde_json::{json, Value};
use vmmweights::loader::{Checkpoint, DestSpec, Dtype, Plan, PlanOptions, Registry};
use vmmweights::report::human_bytes;

use crate::exit::{CliError, CliResult};
use crate::inspect::RuleArgs;
use crate::lib;
use crate::output::escape_name;

/// Options of `vmmw plan`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint file or folder.
    checkpoint: std::path::PathBuf,
    #[command(flatten)]
    rules: RuleArgs,
    /// The destinations an engine holds, as JSON: a list of {"name", "dtype",
    /// "shape"}, or a document with such a "destinations" list (as `inspect
    /// --json` prints). Without it, the destinations the rules produce.
    #[arg(long, value_name = "FILE")]
    registry: Option<std::path::PathBuf>,
    /// Print one JSON document (docs/CLI.md) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// Where the made-up layout starts (any nonzero address works; this one is
/// easy to tell from a real pointer).
const BASE: u64 = 1 << 44;

#[derive(Deserialize)]
struct SpecFile {
    name: String,
    dtype: String,
    shape: Vec<usize>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RegistryFile {
    List(Vec<SpecFile>),
    Doc { destinations: Vec<SpecFile> },
}

fn read_registry(path: &std::path::Path) -> CliResult<Vec<DestSpec>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        CliError::bad_input(format!(
            "--registry {}: cannot read it: {e}",
            path.display()
        ))
    })?;
    let file: RegistryFile = serde_json::from_str(&text).map_err(|e| {
        CliError::bad_input(format!(
            "--registry {}: expected a JSON list of {{\"name\", \"dtype\", \"shape\"}} (or a document with a \"destinations\" list): {e}",
            path.display()
        ))
    })?;
    let list = match file {
        RegistryFile::List(l) | RegistryFile::Doc { destinations: l } => l,
    };
    list.into_iter()
        .map(|s| {
            let dtype = Dtype::parse(&s.dtype).ok_or_else(|| {
                CliError::bad_input(format!(
                    "--registry {}: destination `{}` has dtype `{}`; expected one of {}",
                    path.display(),
                    escape_name(&s.name),
                    escape_name(&s.dtype),
                    Dtype::known_names()
                ))
            })?;
            Ok(DestSpec {
                name: s.name,
                dtype,
                shape: s.shape,
            })
        })
        .collect()
}

pub fn run(a: Args) -> CliResult<Value> {
    let rules = a.rules.rules()?;
    let specs = a.registry.as_deref().map(read_registry).transpose()?;
    let ckpt = lib(Checkpoint::open(&a.checkpoint))?;
    let specs = match specs {
        Some(s) => s,
        None => lib(Plan::destinations(&ckpt, &rules))?,
    };
    let mut reg = Registry::new();
    let mut at = BASE;
    for s in &specs {
        reg.register(&s.name, at, s.dtype, &s.shape).map_err(|e| {
            CliError::bad_input(format!(
                "--registry: {}",
                escape_name(&crate::backend::strip_kind(&e))
            ))
        })?;
        let bytes = (s.bytes() as u64).max(1);
        at = bytes
            .div_ceil(256)
            .checked_mul(256)
            .and_then(|b| at.checked_add(b))
            .ok_or_else(|| {
                CliError::bad_input("--registry: the destinations add up to more than 2^64 bytes")
            })?;
    }
    let opts = PlanOptions {
        allow_missing: true,
        allow_unexpected: true,
    };
    let plan = lib(Plan::build(&ckpt, &rules, &reg, &opts))?;

    outln!(
        "plan: {} ({} destinations; reads {} of the checkpoint, writes {})",
        escape_name(&a.checkpoint.display().to_string()),
        reg.len(),
        human_bytes(plan.src_bytes()),
        human_bytes(plan.dst_bytes())
    );
    let (format_line, format_doc) = crate::inspect::format_of(&ckpt, false);
    outln!("{format_line}");
    let mut dests = Vec::new();
    for s in &specs {
        let d = reg.get(&s.name).expect("registered above");
        let (lo, hi) = (d.ptr, d.ptr + d.bytes() as u64);
        outln!(
            "{} {} {:?} ({}) at layout offset {}",
            escape_name(&d.name),
            d.dtype,
            d.shape,
            human_bytes(d.bytes() as u64),
            d.ptr - BASE
        );
        let mut sources = Vec::new();
        for e in plan.extents.iter().filter(|e| e.dst >= lo && e.dst < hi) {
            let src = &plan.sources[e.source as usize];
            let tensor_at = ckpt.tensor(src).map_or(0, |t| t.offset);
            let convert = e
                .convert
                .map(|(f, t)| format!("{f:?} -> {t:?}").to_lowercase());
            outln!(
                "  <- {}: {} rows of {} B (pitch {}) from shard {} @ {} (tensor byte {}) to +{} (pitch {}){}",
                escape_name(src),
                e.height,
                e.width,
                e.src_pitch,
                e.shard,
                e.src,
                e.src - tensor_at,
                e.dst - lo,
                e.dst_pitch,
                convert.as_deref().map(|c| format!(", {c}")).unwrap_or_default()
            );
            sources.push(json!({
                "source": src,
                "shard": e.shard,
                "file_offset": e.src,
                "tensor_offset": e.src - tensor_at,
                "rows": e.height,
                "row_bytes": e.width,
                "src_pitch": e.src_pitch,
                "dst_offset": e.dst - lo,
                "dst_pitch": e.dst_pitch,
                "dst_row_bytes": e.dst_width(),
                "convert": convert,
            }));
        }
        let mut fills = Vec::new();
        for f in plan.fills.iter().filter(|f| f.dst >= lo && f.dst < hi) {
            outln!("  zero fill: {} B at +{}", f.len, f.dst - lo);
            fills.push(json!({"dst_offset": f.dst - lo, "bytes": f.len}));
        }
        if sources.is_empty() && fills.is_empty() {
            outln!("  (nothing: missing from the checkpoint)");
        }
        dests.push(json!({
            "name": d.name,
            "dtype": d.dtype.name(),
            "shape": d.shape,
            "bytes": d.bytes(),
            "layout_offset": d.ptr - BASE,
            "sources": sources,
            "fills": fills,
        }));
    }
    for (what, list) in [
        ("skipped by rules", &plan.skipped),
        ("missing (destinations no tensor fills)", &plan.missing),
        ("unexpected (tensors with no destination)", &plan.unexpected),
    ] {
        let names: Vec<String> = list.iter().map(|n| escape_name(n)).collect();
        outln!("{what} ({}): {}", names.len(), names.join(", "));
    }
    Ok(json!({
        "checkpoint": a.checkpoint.display().to_string(),
        "format": format_doc,
        "shards": ckpt.shards.iter().map(|s| s.path.display().to_string()).collect::<Vec<_>>(),
        "src_bytes": plan.src_bytes(),
        "dst_bytes": plan.dst_bytes(),
        "destinations": dests,
        "skipped": plan.skipped,
        "missing": plan.missing,
        "unexpected": plan.unexpected,
    }))
}
