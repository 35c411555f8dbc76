//! `vmmw inspect`: what a checkpoint holds (validated headers, no data read;
//! for GGUF also its metadata and each tensor's ggml type and `ne`), and with `--preset`/`--rules`/`--tp-world`, the destinations the mapping
//! rules produce.

use std::collections::BTreeMap;

use serde_json::{json, Value};
use vmmweights::loader::gguf::Value as GgufValue;
use vmmweights::loader::{Checkpoint, DestSpec, Dtype, Plan, Rules, Tp};
use vmmweights::Error;

use crate::exit::{CliError, CliResult};
use crate::lib;
use crate::output::escape_name;

/// Mapping-rule options shared by `inspect`, `plan` and `load`.
#[derive(clap::Args, Debug, Clone)]
pub struct RuleArgs {
    /// Mapping preset: llama, mistral, qwen, qwen2, qwen3.
    #[arg(long, value_parser = crate::parse::preset)]
    pub preset: Option<String>,
    /// Mapping rules as a JSON file (overrides --preset; `inspect --print-rules` writes one).
    #[arg(long, value_name = "FILE")]
    pub rules: Option<std::path::PathBuf>,
    /// Head dimension for the preset's kv-head sharding.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..))]
    pub head_dim: u32,
    /// Tensor-parallel rank (0 ..= --tp-world - 1).
    #[arg(long, default_value_t = 0)]
    pub tp_rank: usize,
    /// Tensor-parallel world size (1 = no sharding).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub tp_world: u32,
    /// Destination dtype (BF16, F16, F32) when the loader allocates them.
    #[arg(long, value_parser = crate::parse::dtype)]
    pub dtype: Option<Dtype>,
}

impl RuleArgs {
    /// Whether any option asks for a mapping other than names as they are.
    pub fn any(&self) -> bool {
        self.preset.is_some() || self.rules.is_some() || self.tp_world > 1 || self.dtype.is_some()
    }

    /// The rules these options describe (identity names when none given).
    pub fn rules(&self) -> CliResult<Rules> {
        if self.tp_rank >= self.tp_world as usize {
            return Err(CliError::bad_input(format!(
                "--tp-rank {}: expected a rank below --tp-world {}",
                self.tp_rank, self.tp_world
            )));
        }
        let tp = (self.tp_world > 1).then_some(Tp {
            rank: self.tp_rank,
            world: self.tp_world as usize,
        });
        let mut r = match (&self.rules, &self.preset) {
            (Some(p), _) => {
                let text = lib(std::fs::read_to_string(p).map_err(|e| Error::io(p, e)))?;
                Rules::from_json(&text).map_err(|e| {
                    CliError::bad_input(format!(
                        "--rules {}: {}",
                        p.display(),
                        crate::backend::strip_kind(&e)
                    ))
                })?
            }
            (None, Some(p)) => lib(Rules::preset(p, None, self.head_dim as usize))?,
            (None, None) => Rules::default(),
        };
        if tp.is_some() {
            r.tp = tp;
        }
        if let Some(d) = self.dtype {
            r.dtype = Some(d);
        }
        Ok(r)
    }
}

/// Options of `vmmw inspect`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Checkpoint file or folder.
    checkpoint: std::path::PathBuf,
    #[command(flatten)]
    rules: RuleArgs,
    /// List every tensor.
    #[arg(long)]
    tensors: bool,
    /// Print the mapping rules as JSON (to save, edit and pass with --rules).
    #[arg(long)]
    print_rules: bool,
    /// Print one JSON document (docs/CLI.md) instead of the text.
    #[arg(long)]
    pub json: bool,
}

/// A destination as JSON.
pub fn dest_json(s: &DestSpec) -> Value {
    json!({"name": s.name, "dtype": s.dtype.name(), "shape": s.shape, "bytes": s.bytes()})
}

/// The checkpoint's format line, and its JSON (with a GGUF file's metadata
/// when `with_metadata`).
pub fn format_of(ckpt: &Checkpoint, with_metadata: bool) -> (String, Value) {
    let Some(g) = ckpt.gguf() else {
        return (
            "format: safetensors".into(),
            json!({"format": "safetensors"}),
        );
    };
    let f = &g.files[0];
    let line = format!(
        "format: GGUF v{} ({} file{}, alignment {}, {} metadata pairs; shapes row-major, ggml ne reversed)",
        f.version,
        g.files.len(),
        if g.files.len() == 1 { "" } else { "s" },
        f.alignment,
        g.metadata().len()
    );
    let mut doc = json!({"format": "gguf", "gguf_version": f.version, "alignment": f.alignment, "files": g.files.len()});
    if with_metadata {
        doc["metadata"] = g
            .metadata()
            .entries
            .iter()
            .map(|(k, v)| (k.clone(), metadata_json(v)))
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    (line, doc)
}

/// A metadata value as JSON: its GGUF type and value (arrays as their
/// element type, length and shortened text).
fn metadata_json(v: &GgufValue) -> Value {
    let value = match v {
        GgufValue::String(s) => json!(s),
        GgufValue::Bool(b) => json!(b),
        GgufValue::F32(_) | GgufValue::F64(_) => json!(v.as_float()),
        GgufValue::Array(a) => {
            return json!({"type": "array", "elem_type": a.elem_type().name(), "len": a.len(), "text": v.to_string()})
        }
        _ => match v.as_int() {
            Some(i) if i >= 0 => json!(i as u64),
            Some(i) => json!(i as i64),
            None => Value::Null,
        },
    };
    json!({"type": v.value_type().name(), "value": value})
}

pub fn run(a: Args) -> CliResult<Value> {
    let rules = a.rules.rules()?;
    let ckpt = lib(Checkpoint::open(&a.checkpoint))?;
    outln!(
        "checkpoint: {}",
        escape_name(&a.checkpoint.display().to_string())
    );
    for s in &ckpt.shards {
        outln!(
            "  shard {} ({} bytes)",
            escape_name(&s.path.display().to_string()),
            s.len
        );
    }
    let (format_line, format_doc) = format_of(&ckpt, true);
    outln!("  {format_line}");
    if let Some(g) = ckpt.gguf() {
        for (k, v) in &g.metadata().entries {
            outln!("    {} = {}", escape_name(k), v);
        }
    }
    let packed = ckpt.is_packed();
    let pct = |p: u64, b: u64| 100.0 * p as f64 / b.max(1) as f64;
    // (tensors, bytes, packed bytes)
    let mut by_dtype: BTreeMap<String, (usize, u64, u64)> = BTreeMap::new();
    for t in ckpt.tensors.values() {
        let e = by_dtype.entry(t.dtype.name().to_owned()).or_default();
        e.0 += 1;
        e.1 += t.len;
        e.2 += ckpt.packed_len(t).unwrap_or(t.len);
    }
    for (d, (n, b, p)) in &by_dtype {
        if packed {
            outln!(
                "  {d}: {n} tensors, {b} bytes, packed {p} ({:.1}%)",
                pct(*p, *b)
            );
        } else {
            outln!("  {d}: {n} tensors, {b} bytes");
        }
    }
    let packed_total: u64 = by_dtype.values().map(|v| v.2).sum();
    outln!(
        "  total: {} tensors, {} bytes of data{}",
        ckpt.tensors.len(),
        ckpt.data_bytes(),
        if packed {
            format!(
                ", packed {packed_total} ({:.1}%; files {} bytes, originals {})",
                pct(packed_total, ckpt.data_bytes()),
                ckpt.shards.iter().map(|s| s.len).sum::<u64>(),
                ckpt.shards.iter().map(|s| s.original_len()).sum::<u64>()
            )
        } else {
            String::new()
        }
    );
    if a.tensors {
        let gguf = ckpt.gguf().is_some();
        for t in ckpt.tensors.values() {
            let ggml = match t.dtype.ggml().filter(|_| gguf) {
                Some(g) => format!(" (ggml type {}, ne {:?})", g.id(), t.ggml_ne()),
                None => String::new(),
            };
            let ratio = match ckpt.packed_len(t) {
                Some(p) => format!(" packed {p} of {} ({:.1}%)", t.len, pct(p, t.len)),
                None => String::new(),
            };
            outln!(
                "  {} {} {:?}{ggml} shard {} @ {}{ratio}",
                escape_name(&t.name),
                t.dtype,
                t.shape,
                t.shard,
                t.offset
            );
        }
    }
    if a.print_rules {
        outln!("{}", rules.to_json());
    }
    let specs = if a.rules.any() {
        let specs = lib(Plan::destinations(&ckpt, &rules))?;
        outln!("destinations ({}):", specs.len());
        for s in &specs {
            outln!("  {} {} {:?}", escape_name(&s.name), s.dtype, s.shape);
        }
        Some(specs)
    } else {
        None
    };
    let mut doc = json!({
        "checkpoint": a.checkpoint.display().to_string(),
        "shards": ckpt.shards.iter().map(|s| json!({"path": s.path.display().to_string(), "bytes": s.len})).collect::<Vec<_>>(),
        "dtypes": by_dtype.iter().map(|(d, (n, b, p))| {
            let mut j = json!({"tensors": n, "bytes": b});
            if packed {
                j["packed_bytes"] = json!(p);
                j["packed_ratio"] = json!(*p as f64 / (*b).max(1) as f64);
            }
            (d.clone(), j)
        }).collect::<serde_json::Map<_, _>>(),
        "tensor_count": ckpt.tensors.len(),
        "data_bytes": ckpt.data_bytes(),
        "packed": packed,
    });
    if packed {
        doc["packed_bytes"] = json!(packed_total);
        doc["packed_ratio"] = json!(packed_total as f64 / ckpt.data_bytes().max(1) as f64);
        doc["packed_files"] = ckpt
            .shards
            .iter()
            .filter_map(|s| {
                let ix = s.packed.as_ref()?;
                Some(json!({"path": s.path.display().to_string(), "bytes": s.len,
                            "original_bytes": ix.orig_len, "frames": ix.frames.len(),
                            "format_version": vmmweights::loader::packed::VERSION}))
            })
            .collect();
    }
    if let (Some(d), Some(f)) = (doc.as_object_mut(), format_doc.as_object()) {
        d.extend(f.clone());
    }
    if a.tensors {
        doc["tensors"] = ckpt
            .tensors
            .values()
            .map(|t| {
                let mut j = json!({"name": t.name, "dtype": t.dtype.name(), "shape": t.shape,
                       "shard": t.shard, "offset": t.offset, "bytes": t.len});
                if let Some(p) = ckpt.packed_len(t) {
                    j["packed_bytes"] = json!(p);
                }
                if let Some(g) = t.dtype.ggml().filter(|_| ckpt.gguf().is_some()) {
                    j["ggml_type"] = json!(g.id());
                    j["ne"] = json!(t.ggml_ne());
                }
                j
            })
            .collect();
    }
    if let Some(specs) = &specs {
        doc["destinations"] = specs.iter().map(dest_json).collect();
    }
    if a.print_rules {
        doc["rules"] = serde_json::from_str(&rules.to_json()).unwrap_or(Value::Null);
    }
    Ok(doc)
}
