//! `vmmw bench-load --devices 0,1`: one checkpoint onto several devices of one
//! host, as replicas (each device loads a share from host memory, the shares
//! are exchanged over peer copies) and as tensor-parallel ranks (each device
//! loads its slices), against one device's load in the same run; and the
//! wakes: one device from its host backup against the replicas woken from one
//! host backup (the same bytes per device), raw (Offload) and compressed
//! (OffloadCompressed: every device decodes a share of the frames), and the
//! replicas woken by the checkpoint fan-out.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use vmmweights::devices::replicas::{
    self, Replica, ReplicaSleepOptions, ReplicaWakeOptions, ReplicaWakeStats,
};
use vmmweights::devices::{load_multi_into_pools, MultiMode, MultiStats, PoolLoad};
use vmmweights::driver;
use vmmweights::loader::*;
use vmmweights::sleep::Policy;
use vmmweights::{tag, Error, Pool, PoolConfig, Result};

use crate::backend::BackendArgs;

/// A progress line: on stdout, or on stderr when the JSON goes to stdout (`--json -`).
macro_rules! say {
    ($m:expr, $($arg:tt)*) => {
        if $m.json == Some(Path::new("-")) {
            eprintln!($($arg)*);
        } else {
            outln!($($arg)*);
        }
    };
}

/// What `--devices` runs with.
pub struct MultiArgs<'a> {
    pub backend: &'a BackendArgs,
    pub checkpoint: &'a Path,
    pub preset: &'a str,
    pub head_dim: usize,
    pub devices: &'a [i32],
    pub repeat: usize,
    /// Copy threads per device (0: the CPUs shared out).
    pub threads: usize,
    pub verify: bool,
    pub json: Option<&'a Path>,
}

#[derive(Debug, serde::Serialize)]
struct Phase {
    /// Seconds of every timed load.
    seconds: Vec<f64>,
    median_s: f64,
    /// Device bytes written on all devices together.
    delivered_bytes: u64,
    /// Delivered bytes per second over all devices.
    aggregate_gbps: f64,
    /// The last run's figures (host share, peer exchange, repairs).
    #[serde(skip_serializing_if = "Option::is_none")]
    last: Option<MultiStats>,
    /// The last wake from one host backup (`replicas_wake`).
    #[serde(skip_serializing_if = "Option::is_none")]
    last_wake: Option<ReplicaWakeStats>,
    /// Extent rows checked against the file, over all devices (`--verify`).
    verified_rows: usize,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    devices: Vec<String>,
    checkpoint: String,
    bytes: u64,
    one_device: Phase,
    /// One device's wake of its loaded tag from its host backup (Offload).
    one_device_wake: Phase,
    replicas: Phase,
    /// The replicas asleep on one host backup (`replicas::sleep`), woken on
    /// every device from it (`replicas::wake_from_backup`).
    replicas_wake: Phase,
    /// Seconds of each `replicas::sleep` before a timed wake.
    replicas_sleep_seconds: Vec<f64>,
    /// The wakes from a compressed backup (OffloadCompressed), when the
    /// backend has the codec.
    #[serde(skip_serializing_if = "Option::is_none")]
    compressed: Option<CompressedWakes>,
    /// The replicas slept with Discard, woken by one checkpoint fan-out
    /// (`replicas::wake_by_reload`).
    replicas_wake_checkpoint: Phase,
    ranks: Option<Phase>,
    /// Replicas' aggregate rate over one device's rate.
    replicas_speedup: f64,
}

/// One device's wake from its compressed backup against the replicas woken
/// from the holder's compressed backup; rates count raw bytes restored.
#[derive(Debug, serde::Serialize)]
struct CompressedWakes {
    /// Encoded bytes of the holder's backup over the raw bytes it restores.
    backup_ratio: f64,
    /// One device from its own compressed backup.
    one_device_wake: Phase,
    /// The replicas from one compressed backup (`replicas::sleep_with`
    /// OffloadCompressed, `replicas::wake_from_backup`).
    replicas_wake: Phase,
    /// Seconds of each compressed `replicas::sleep_with` before a timed wake.
    replicas_sleep_seconds: Vec<f64>,
    /// One device's compressed wake over its raw wake (its link).
    one_device_over_link: f64,
    /// The replicas' compressed wake over one device's raw wake: the link
    /// multiplied by the devices and by the codec.
    replicas_over_link: f64,
    /// The replicas' compressed wake over their raw wake.
    replicas_over_raw_replicas: f64,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

fn phase(seconds: Vec<f64>, delivered: u64, last: Option<MultiStats>, verified: usize) -> Phase {
    let m = median(&seconds);
    Phase {
        median_s: m,
        aggregate_gbps: delivered as f64 / m / 1e9,
        seconds,
        delivered_bytes: delivered,
        last,
        last_wake: None,
        verified_rows: verified,
    }
}

fn load_options(m: &MultiArgs<'_>) -> LoadOptions {
    let mut o = LoadOptions::default();
    o.copy.threads = m.threads;
    o
}

fn rules_for(preset: &str, tp: Option<Tp>, head_dim: usize) -> Result<Rules> {
    if preset == "none" {
        return Ok(Rules::default());
    }
    Rules::preset(preset, tp, head_dim)
}

/// Destinations of `rules` in `pool` under a tag named `name`.
fn allocate(pool: &Pool, ckpt: &Checkpoint, rules: &Rules, name: &str) -> Result<Registry> {
    let mut reg = Registry::new();
    let specs = Plan::destinations(ckpt, rules)?;
    allocate_in_pool(&mut reg, &specs, pool, tag::id(name)?)?;
    Ok(reg)
}

fn free_all(pool: &Pool, reg: &Registry) -> Result<()> {
    for d in reg.iter() {
        pool.free(d.ptr)?;
    }
    pool.trim()?;
    Ok(())
}

pub fn run(m: MultiArgs<'_>) -> Result<()> {
    let (choice, source) = m.backend.choice()?;
    let mut pools = Vec::new();
    for &dev in m.devices {
        let opened = driver::open(choice, dev)?;
        say!(
            m,
            "device {dev}: {} ({source}: {})",
            opened.driver.describe(),
            opened.reason
        );
        pools.push(Pool::new(opened.driver, PoolConfig::default())?);
    }
    let n = pools.len();
    let repeat = m.repeat.max(1);
    let rules = rules_for(m.preset, None, m.head_dim)?;
    let ckpt = Checkpoint::open(m.checkpoint)?;
    let bytes = ckpt.data_bytes();
    say!(
        m,
        "checkpoint: {} ({:.2} GB) onto {n} devices",
        m.checkpoint.display(),
        bytes as f64 / 1e9
    );

    // One device, as the reference.
    let reg = allocate(&pools[0], &ckpt, &rules, "bench-multi-one")?;
    let mut secs = Vec::new();
    let mut delivered = 0;
    let mut verified = 0;
    for i in 0..=repeat {
        let t = Instant::now();
        let ex = load_into_pool(
            &pools[0],
            Checkpoint::open(m.checkpoint)?,
            &rules,
            &reg,
            &load_options(&m),
            &Control::default(),
        )?;
        let s = t.elapsed().as_secs_f64();
        delivered = ex.plan().dst_bytes();
        if i > 0 {
            secs.push(s); // the first load pins the staging ring
        } else if m.verify {
            verified = crate::load_verify::verify(pools[0].driver().as_ref(), &ex)?;
        }
    }
    let one = phase(secs, delivered, None, verified);
    // One device's wake of the loaded tag from its host backup (Offload; the
    // first sleep pins the backup, untimed like every sleep).
    let one_tag = tag::id("bench-multi-one")?;
    // Rates count the bytes a wake restores (whole committed segments).
    let mut wakes = Vec::new();
    let mut restored = 0;
    for _ in 0..repeat {
        pools[0].sleep(&[(one_tag, Policy::Offload)])?;
        let t = Instant::now();
        let w = pools[0].wake(&[one_tag])?;
        wakes.push(t.elapsed().as_secs_f64());
        restored = w.iter().map(|c| c.report.copied_bytes).sum();
    }
    let one_wake = phase(wakes, restored, None, 0);
    pools[0].release_backup();
    // The same from a compressed backup; a backend without the codec skips
    // every compressed row.
    let one_wake_compressed = match one_device_compressed(&pools[0], one_tag, repeat) {
        Ok(p) => Some(p),
        Err(Error::Unsupported(why)) => {
            say!(m, "compressed wakes: skipped ({why})");
            None
        }
        Err(e) => return Err(e),
    };
    pools[0].release_backup();
    say!(
        m,
        "one device: {:.3} s, {:.1} GB/s",
        one.median_s,
        one.aggregate_gbps
    );
    free_all(&pools[0], &reg)?;

    // Replicas: the whole checkpoint on every device, host memory read once.
    let regs: Vec<Registry> = pools
        .iter()
        .map(|p| allocate(p, &ckpt, &rules, "bench-multi-replicas"))
        .collect::<Result<_>>()?;
    let (replicas, plans) = timed(
        &m,
        &pools,
        &regs,
        &vec![rules.clone(); n],
        MultiMode::Replicas,
    )?;
    say!(m,
        "replicas on {n} devices: {:.3} s, {:.1} GB/s delivered ({:.2}x one device; target 2x the link)",
        replicas.median_s,
        replicas.aggregate_gbps,
        replicas.aggregate_gbps / one.aggregate_gbps
    );
    // Wake of the replicas from one host backup: the first device's, read
    // once, each device a part over its link, the rest over peer copies.
    let rep_tag = tag::id("bench-multi-replicas")?;
    let group: Vec<Replica<'_>> = pools
        .iter()
        .map(|pool| Replica { pool, tag: rep_tag })
        .collect();
    let mut wakes = Vec::new();
    let mut sleeps = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        sleeps.push(replicas::sleep(&group)?.seconds);
        let t = Instant::now();
        let w = replicas::wake_from_backup(&group, &ReplicaWakeOptions::default())?;
        wakes.push(t.elapsed().as_secs_f64());
        last = Some(w);
    }
    let mut verified = 0;
    if m.verify {
        // Every device holds the checkpoint again, byte for byte at every extent's ends.
        for (p, ex) in pools.iter().zip(&plans) {
            verified += crate::load_verify::verify(p.driver().as_ref(), ex)?;
        }
    }
    let restored = last
        .as_ref()
        .map_or(0, |w: &ReplicaWakeStats| w.delivered_bytes);
    let mut replicas_wake = phase(wakes, restored, None, verified);
    replicas_wake.last_wake = last;
    pools[0].release_backup();
    let compressed = match one_wake_compressed {
        None => None,
        Some(one_c) => {
            let c =
                replicas_compressed(&m, &group, &plans, repeat, one_c, &one_wake, &replicas_wake)?;
            say!(
                m,
                "compressed wake ({:.1}% of raw in the backup): one device {:.3} s, {:.1} GB/s raw \
                 ({:.2}x its raw wake); {n} replicas from one backup {:.3} s, {:.1} GB/s delivered \
                 ({:.2}x one device's raw wake, {:.2}x the raw replicas' wake)",
                100.0 * c.backup_ratio,
                c.one_device_wake.median_s,
                c.one_device_wake.aggregate_gbps,
                c.one_device_over_link,
                c.replicas_wake.median_s,
                c.replicas_wake.aggregate_gbps,
                c.replicas_over_link,
                c.replicas_over_raw_replicas
            );
            pools[0].release_backup();
            Some(c)
        }
    };
    say!(
        m,
        "wake: one device from its backup {:.3} s, {:.1} GB/s; {n} replicas from one backup {:.3} s, \
         {:.1} GB/s delivered ({:.2}x; target 1.8x)",
        one_wake.median_s,
        one_wake.aggregate_gbps,
        replicas_wake.median_s,
        replicas_wake.aggregate_gbps,
        replicas_wake.aggregate_gbps / one_wake.aggregate_gbps
    );

    // Wake of the replicas asleep with no backup (Discard), by one fan-out
    // from the checkpoint in host memory.
    let targets: Vec<PoolLoad<'_>> = pools
        .iter()
        .zip(&regs)
        .map(|(pool, registry)| PoolLoad {
            pool,
            rules: &rules,
            registry,
        })
        .collect();
    let mut wakes = Vec::new();
    let mut last = None;
    for _ in 0..repeat {
        for p in &pools {
            p.sleep(&[(rep_tag, Policy::Discard)])?;
        }
        let t = Instant::now();
        let w = replicas::wake_by_reload(
            Checkpoint::open(m.checkpoint)?,
            &targets,
            &load_options(&m),
            &Control::default(),
        )?;
        wakes.push(t.elapsed().as_secs_f64());
        last = Some(w.stats);
    }
    let replicas_wake_checkpoint = phase(wakes, replicas.delivered_bytes, last, 0);
    say!(
        m,
        "wake: {n} replicas by checkpoint fan-out {:.3} s, {:.1} GB/s delivered",
        replicas_wake_checkpoint.median_s,
        replicas_wake_checkpoint.aggregate_gbps
    );
    drop(targets);
    for (p, r) in pools.iter().zip(&regs) {
        free_all(p, r)?;
    }

    // Tensor-parallel ranks: each device its slices, all at once.
    let ranks = if m.preset == "none" {
        say!(
            m,
            "ranks: skipped (needs a preset for tensor-parallel rules)"
        );
        None
    } else {
        let rules: Vec<Rules> = (0..n)
            .map(|rank| rules_for(m.preset, Some(Tp { rank, world: n }), m.head_dim))
            .collect::<Result<_>>()?;
        let regs: Vec<Registry> = pools
            .iter()
            .zip(&rules)
            .map(|(p, r)| allocate(p, &ckpt, r, "bench-multi-ranks"))
            .collect::<Result<_>>()?;
        let (ph, _) = timed(&m, &pools, &regs, &rules, MultiMode::Ranks)?;
        say!(
            m,
            "{n} tensor-parallel ranks: {:.3} s ({:.1} GB/s delivered)",
            ph.median_s,
            ph.aggregate_gbps
        );
        for (p, r) in pools.iter().zip(&regs) {
            free_all(p, r)?;
        }
        Some(ph)
    };
    let report = Report {
        devices: pools.iter().map(|p| p.driver().describe()).collect(),
        checkpoint: m.checkpoint.display().to_string(),
        bytes,
        replicas_speedup: replicas.aggregate_gbps / one.aggregate_gbps,
        one_device: one,
        one_device_wake: one_wake,
        replicas,
        replicas_wake,
        replicas_sleep_seconds: sleeps,
        compressed,
        replicas_wake_checkpoint,
        ranks,
    };
    if let Some(path) = m.json {
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::InvalidState(format!("report to JSON: {e}")))?;
        if path == Path::new("-") {
            outln!("{text}");
        } else {
            std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
            say!(m, "wrote {}", path.display());
        }
    }
    Ok(())
}

/// `repeat` wakes of `tag` in `pool` from its compressed backup, each after
/// an untimed OffloadCompressed sleep; `Unsupported` when the backend has no
/// codec. Rates count the raw bytes restored.
fn one_device_compressed(pool: &Pool, tag: tag::TagId, repeat: usize) -> Result<Phase> {
    let mut wakes = Vec::new();
    let mut restored = 0;
    for _ in 0..repeat {
        pool.sleep(&[(tag, Policy::OffloadCompressed)])?;
        let t = Instant::now();
        let w = pool.wake(&[tag])?;
        wakes.push(t.elapsed().as_secs_f64());
        restored = w.iter().map(|c| c.report.raw_bytes).sum();
    }
    Ok(phase(wakes, restored, None, 0))
}

/// `repeat` wakes of `group` from the holder's compressed backup, each after
/// an untimed `replicas::sleep_with` OffloadCompressed; checked against the
/// plans with `--verify`; with the ratios to the raw wakes of the same run.
fn replicas_compressed(
    m: &MultiArgs<'_>,
    group: &[Replica<'_>],
    plans: &[Arc<ExecutedPlan>],
    repeat: usize,
    one_device_wake: Phase,
    one_raw: &Phase,
    replicas_raw: &Phase,
) -> Result<CompressedWakes> {
    let opts = ReplicaSleepOptions {
        holder_policy: Policy::OffloadCompressed,
    };
    let (mut wakes, mut sleeps, mut last) = (Vec::new(), Vec::new(), None);
    let mut backup_ratio = 0.0;
    for _ in 0..repeat {
        let s = replicas::sleep_with(group, &opts)?;
        backup_ratio = s.backup_bytes as f64 / s.backup_raw_bytes.max(1) as f64;
        sleeps.push(s.seconds);
        let t = Instant::now();
        let w = replicas::wake_from_backup(group, &ReplicaWakeOptions::default())?;
        wakes.push(t.elapsed().as_secs_f64());
        last = Some(w);
    }
    let mut verified = 0;
    if m.verify {
        for (r, ex) in group.iter().zip(plans) {
            verified += crate::load_verify::verify(r.pool.driver().as_ref(), ex)?;
        }
    }
    let delivered = last.as_ref().map_or(0, |w| w.delivered_bytes);
    let mut replicas_wake = phase(wakes, delivered, None, verified);
    replicas_wake.last_wake = last;
    Ok(CompressedWakes {
        backup_ratio,
        one_device_over_link: one_device_wake.aggregate_gbps / one_raw.aggregate_gbps,
        replicas_over_link: replicas_wake.aggregate_gbps / one_raw.aggregate_gbps,
        replicas_over_raw_replicas: replicas_wake.aggregate_gbps / replicas_raw.aggregate_gbps,
        one_device_wake,
        replicas_wake,
        replicas_sleep_seconds: sleeps,
    })
}

/// `repeat` timed multi-device loads after one untimed (which pins the
/// staging rings and, with `--verify`, is checked on every device). Returns
/// the figures and the last load's executed plans.
fn timed(
    m: &MultiArgs<'_>,
    pools: &[Pool],
    regs: &[Registry],
    rules: &[Rules],
    mode: MultiMode,
) -> Result<(Phase, Vec<Arc<ExecutedPlan>>)> {
    let targets: Vec<PoolLoad<'_>> = pools
        .iter()
        .zip(regs)
        .zip(rules)
        .map(|((pool, registry), rules)| PoolLoad {
            pool,
            rules,
            registry,
        })
        .collect();
    let mut secs = Vec::new();
    let mut last = None;
    let mut plans = Vec::new();
    let mut verified = 0;
    for i in 0..=m.repeat.max(1) {
        let t = Instant::now();
        let loaded = load_multi_into_pools(
            Checkpoint::open(m.checkpoint)?,
            &targets,
            mode,
            &load_options(m),
            &Control::default(),
        )?;
        let s = t.elapsed().as_secs_f64();
        if i == 0 {
            if m.verify {
                for (p, ex) in pools.iter().zip(&loaded.plans) {
                    verified += crate::load_verify::verify(p.driver().as_ref(), ex)?;
                }
            }
        } else {
            secs.push(s);
        }
        last = Some(loaded.stats);
        plans = loaded.plans;
    }
    let delivered = last.as_ref().map_or(0, |s| s.delivered_bytes);
    Ok((phase(secs, delivered, last, verified), plans))
}
