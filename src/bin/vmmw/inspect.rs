//! `vmmw inspect`: what a checkpoint holds (validated headers, no data read),
//! and with `--preset`/`--rules`, the destinations the mapping rules produce.

use std::collections::BTreeMap;

use vmmweights::loader::{Checkpoint, Plan, Rules, Tp};
use vmmweights::{Error, Result};

/// Mapping-rule options shared by `inspect` and `load`.
#[derive(clap::Args, Debug, Clone)]
pub struct RuleArgs {
    /// Mapping preset: llama, mistral, qwen, qwen2, qwen3.
    #[arg(long)]
    pub preset: Option<String>,
    /// Mapping rules as a JSON file (overrides --preset).
    #[arg(long)]
    pub rules: Option<std::path::PathBuf>,
    /// Head dimension for the preset's kv-head sharding.
    #[arg(long, default_value_t = 128)]
    pub head_dim: usize,
    /// Tensor-parallel rank.
    #[arg(long, default_value_t = 0)]
    pub tp_rank: usize,
    /// Tensor-parallel world size (1 = no sharding).
    #[arg(long, default_value_t = 1)]
    pub tp_world: usize,
    /// Destination dtype (BF16, F16, F32) when the loader allocates them.
    #[arg(long)]
    pub dtype: Option<String>,
}

impl RuleArgs {
    /// The rules these options describe (identity names when none given).
    pub fn rules(&self) -> Result<Rules> {
        let tp = (self.tp_world > 1).then_some(Tp {
            rank: self.tp_rank,
            world: self.tp_world,
        });
        let mut r = match (&self.rules, &self.preset) {
            (Some(p), _) => {
                let text = std::fs::read_to_string(p).map_err(|e| Error::io(p, e))?;
                Rules::from_json(&text)?
            }
            (None, Some(p)) => Rules::preset(p, None, self.head_dim)?,
            (None, None) => Rules::default(),
        };
        if tp.is_some() {
            r.tp = tp;
        }
        if let Some(d) = &self.dtype {
            r.dtype = Some(
                vmmweights::loader::Dtype::parse(d)
                    .ok_or_else(|| Error::InvalidArgument(format!("unknown dtype `{d}`")))?,
            );
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
}

pub fn run(a: Args) -> Result<()> {
    let ckpt = Checkpoint::open(&a.checkpoint)?;
    println!("checkpoint: {}", a.checkpoint.display());
    for s in &ckpt.shards {
        println!("  shard {} ({} bytes)", s.path.display(), s.len);
    }
    let mut by_dtype: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for t in ckpt.tensors.values() {
        let e = by_dtype.entry(t.dtype.to_string()).or_default();
        e.0 += 1;
        e.1 += t.len;
    }
    for (d, (n, b)) in &by_dtype {
        println!("  {d}: {n} tensors, {b} bytes");
    }
    println!(
        "  total: {} tensors, {} bytes of data",
        ckpt.tensors.len(),
        ckpt.data_bytes()
    );
    if a.tensors {
        for t in ckpt.tensors.values() {
            println!(
                "  {} {} {:?} shard {} @ {}",
                t.name, t.dtype, t.shape, t.shard, t.offset
            );
        }
    }
    if a.rules.preset.is_some() || a.rules.rules.is_some() || a.rules.tp_world > 1 {
        let rules = a.rules.rules()?;
        if a.print_rules {
            println!("{}", rules.to_json());
        }
        let specs = Plan::destinations(&ckpt, &rules)?;
        println!("destinations ({}):", specs.len());
        for s in &specs {
            println!("  {} {} {:?}", s.name, s.dtype, s.shape);
        }
    }
    Ok(())
}
