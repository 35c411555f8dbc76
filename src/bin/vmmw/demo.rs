//! `vmmw demo`: the library's main job end to end, on whichever backend is
//! available (the host backend without a GPU). Writes a small Llama-shaped
//! checkpoint, loads it in place into pool memory tagged "weights" (q/k/v and
//! gate/up fused, as an engine holds them), adds a "kv_cache" arena, sleeps
//! (weights offloaded, cache discarded), wakes, verifies every weight byte at
//! the same address, then sleeps and wakes once more with the Reload policy
//! (no host backup: bytes come back from the checkpoint), and prints the
//! memory report's timeline. Any error or mismatch exits non-zero.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use safetensors::tensor::TensorView;
use vmmweights::driver::StreamId;
use vmmweights::loader::{Checkpoint, Destination, Session};
use vmmweights::sleep::Policy;
use vmmweights::{tag, DevicePtr, Driver, Error, Mode, Pool, PoolConfig, Result};

use crate::backend::BackendArgs;

/// Options of `vmmw demo`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    backend: BackendArgs,
    /// Transformer layers of the generated checkpoint.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256))]
    layers: u16,
    /// Hidden size of the generated checkpoint (a multiple of 128).
    #[arg(long, default_value_t = 512, value_parser = crate::parse::demo_hidden)]
    hidden: usize,
    /// Draw the pool's timeline as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<std::path::PathBuf>,
    /// Print one JSON document (docs/CLI.md) instead of the text.
    #[arg(long)]
    pub json: bool,
}

const MIB: f64 = (1 << 20) as f64;
const HEAD_DIM: usize = 64;

pub fn run(args: Args) -> crate::exit::CliResult<serde_json::Value> {
    args.backend.check()?;
    let chart = args
        .chart
        .as_deref()
        .map(crate::chart::check_path)
        .transpose()?;
    let opened = args.backend.open()?;
    let d = opened.driver;
    outln!("backend: {}", d.kind());
    outln!("  device: {}", d.describe());
    outln!("  why:    {}", opened.reason);

    let dir = std::env::temp_dir().join(format!("vmmw-demo-{}", std::process::id()));
    let result = demo(&d, &dir, args.layers as usize, args.hidden);
    let _ = std::fs::remove_dir_all(&dir);
    let timeline = result?;
    crate::demo_out::finish(&d, &opened.reason, chart.as_deref(), timeline)
}

fn demo(
    d: &Arc<dyn Driver>,
    dir: &Path,
    layers: usize,
    hidden: usize,
) -> Result<vmmweights::report::Timeline> {
    let file = write_checkpoint(dir, layers, hidden)?;
    let ckpt = Checkpoint::open(&file)?;
    outln!(
        "checkpoint: {} ({} tensors, {:.1} MiB, bf16, Llama names)",
        file.display(),
        ckpt.tensors.len(),
        std::fs::metadata(&file)
            .map_err(|e| Error::io(&file, e))?
            .len() as f64
            / MIB
    );

    let pool = Pool::new(d.clone(), PoolConfig::default())?;
    let weights = tag::id("weights")?;
    let kv = tag::id("kv_cache")?;
    pool.set_tag_mode(
        kv,
        Mode::Arena {
            reserve_bytes: 1 << 30,
            grow_step: 64 << 20,
        },
    )?;

    // Parameters are allocated first, fused as an engine holds them; the
    // loader then fills them in place.
    let session = Session::open(&file)?;
    session.set_preset("llama", None, HEAD_DIM)?;
    session.allocate(&pool, weights)?;
    let names: Vec<String> = session.destinations().into_iter().map(|x| x.name).collect();
    outln!(
        "parameters: {} destinations, e.g. {}",
        names.len(),
        names
            .iter()
            .filter(|n| n.contains("qkv") || n.contains("gate_up"))
            .take(2)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ")
    );
    let progress = |done: u64, total: u64| {
        if done == total {
            outln!(
                "  progress: {:.1} of {:.1} MiB",
                done as f64 / MIB,
                total as f64 / MIB
            );
        }
        std::ops::ControlFlow::Continue(())
    };
    // The load also registers itself as the weights' reload source.
    let plan = session.load(&pool, Some(&progress))?;
    let reg = session.destinations();
    outln!(
        "load: {:.1} MiB in {:.3} s",
        plan.stats.bytes as f64 / MIB,
        plan.stats.seconds
    );
    let loaded = checksums(&pool, &reg)?;
    pool.snapshot("loaded");

    let cache = {
        let _scope = tag::scope(kv)?;
        pool.alloc(96 << 20)?
    };
    // SAFETY: the cache block is awake and `size` bytes long.
    unsafe { d.memset_async(cache.ptr, 0x11, cache.size, StreamId::DEFAULT)? };
    d.synchronize()?;
    pool.snapshot("cache allocated");

    for cycle in pool.sleep(&[(weights, Policy::Offload), (kv, Policy::Discard)])? {
        outln!(
            "sleep {:10} {:?}: {} segment(s), {:.1} MiB released in {:.4} s",
            cycle.name,
            cycle.policy.unwrap_or(Policy::Discard),
            cycle.report.segments,
            cycle.report.physical_bytes as f64 / MIB,
            cycle.report.seconds
        );
    }
    pool.snapshot("asleep (weights offloaded, cache discarded)");
    for cycle in pool.wake(&[])? {
        outln!(
            "wake  {:10}: {} segment(s), {:.1} MiB mapped, {:.1} MiB restored in {:.4} s",
            cycle.name,
            cycle.report.segments,
            cycle.report.physical_bytes as f64 / MIB,
            cycle.report.copied_bytes as f64 / MIB,
            cycle.report.seconds
        );
    }
    verify(&pool, &reg, &loaded, "offload")?;
    pool.snapshot("awake");

    pool.sleep(&[(weights, Policy::Reload)])?;
    pool.snapshot("asleep (weights reloadable, host keeps only unloaded bytes)");
    let woke = pool.wake(&[weights])?;
    outln!(
        "reload wake: {:.1} MiB restored from the checkpoint in {:.4} s",
        woke[0].report.reloaded_bytes as f64 / MIB,
        woke[0].report.seconds
    );
    verify(&pool, &reg, &loaded, "reload")?;

    pool.free(cache.ptr)?;
    for x in reg.iter() {
        pool.free(x.ptr)?;
    }
    pool.trim()?;
    pool.release_backup();
    pool.snapshot("freed and trimmed");
    Ok(pool.timeline())
}

/// A Llama-shaped bf16 checkpoint with deterministic values.
fn write_checkpoint(dir: &Path, layers: usize, hidden: usize) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let (heads, kv_heads, inter, vocab) =
        (hidden / HEAD_DIM, hidden / HEAD_DIM / 2, hidden * 3, 4096);
    let mut shapes: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![vocab, hidden])];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        shapes.push((format!("{p}.input_layernorm.weight"), vec![hidden]));
        shapes.push((format!("{p}.post_attention_layernorm.weight"), vec![hidden]));
        shapes.push((
            format!("{p}.self_attn.q_proj.weight"),
            vec![heads * HEAD_DIM, hidden],
        ));
        shapes.push((
            format!("{p}.self_attn.k_proj.weight"),
            vec![kv_heads * HEAD_DIM, hidden],
        ));
        shapes.push((
            format!("{p}.self_attn.v_proj.weight"),
            vec![kv_heads * HEAD_DIM, hidden],
        ));
        shapes.push((
            format!("{p}.self_attn.o_proj.weight"),
            vec![hidden, heads * HEAD_DIM],
        ));
        shapes.push((format!("{p}.mlp.gate_proj.weight"), vec![inter, hidden]));
        shapes.push((format!("{p}.mlp.up_proj.weight"), vec![inter, hidden]));
        shapes.push((format!("{p}.mlp.down_proj.weight"), vec![hidden, inter]));
    }
    shapes.push(("model.norm.weight".into(), vec![hidden]));
    shapes.push(("lm_head.weight".into(), vec![vocab, hidden]));
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = shapes
        .into_iter()
        .enumerate()
        .map(|(i, (n, s))| {
            let len = s.iter().product::<usize>() * 2;
            let mut x = (i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
            let bytes = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect();
            (n, s, bytes)
        })
        .collect();
    let views = data
        .iter()
        .map(|(n, s, b)| {
            TensorView::new(safetensors::Dtype::BF16, s.clone(), b)
                .map(|v| (n.clone(), v))
                .map_err(|e| Error::InvalidArgument(format!("tensor {n}: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let path = dir.join("model.safetensors");
    safetensors::serialize_to_file(views, None, &path)
        .map_err(|e| Error::InvalidArgument(format!("writing {}: {e}", path.display())))?;
    Ok(path)
}

fn read(pool: &Pool, ptr: DevicePtr, len: usize) -> Result<Vec<u8>> {
    let mut v = vec![0u8; len];
    // SAFETY: nothing sleeps or frees the destination during the read.
    unsafe { pool.read(ptr, &mut v)? };
    Ok(v)
}

/// FNV-1a of every destination's bytes.
fn checksums(pool: &Pool, reg: &[Destination]) -> Result<Vec<(String, DevicePtr, u64)>> {
    reg.iter()
        .map(|x| {
            let bytes = read(pool, x.ptr, x.bytes())?;
            let h = bytes.iter().fold(0xcbf29ce484222325u64, |h, &b| {
                (h ^ b as u64).wrapping_mul(0x100000001b3)
            });
            Ok((x.name.clone(), x.ptr, h))
        })
        .collect()
}

fn verify(
    pool: &Pool,
    reg: &[Destination],
    want: &[(String, DevicePtr, u64)],
    what: &str,
) -> Result<()> {
    let got = checksums(pool, reg)?;
    for (w, g) in want.iter().zip(&got) {
        if w != g {
            return Err(Error::InvalidState(format!(
                "after the {what} cycle, parameter `{}` at {:#x} differs from what was loaded",
                w.0, w.1
            )));
        }
    }
    outln!(
        "verified {} parameters after the {what} cycle: same bytes, same addresses",
        got.len()
    );
    Ok(())
}
