//! `vmmw bench-load`: how fast a checkpoint loads into device memory, against
//! the link and the disk, measured in the same run.
//!
//! Measures: the pinned host->device link (one 2 GiB copy, median of 5); our
//! load with page-cached files for each strategy (median of `--repeat`); with
//! `--cold`, the disk's parallel read rate and our load with the page cache
//! dropped. Prints GB/s (10^9 bytes/s) and the ratios to the targets (>= 90% of
//! the link page-cached, >= 95% of the disk cold).

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vmmweights::hostmem::PinnedHost;
use vmmweights::loader::*;
use vmmweights::units::parse_bytes;
use vmmweights::{Driver, Error, Result, Segment};

use crate::backend::BackendArgs;
use crate::load_verify::verify;

/// Options of `vmmw bench-load`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Checkpoint file or folder.
    checkpoint: std::path::PathBuf,
    /// Mapping preset (llama, mistral, qwen, qwen2, qwen3) or `none` for names
    /// as they are (the default, as in `load` and `plan`).
    #[arg(long, default_value = "none", value_parser = preset_or_none)]
    preset: String,
    /// Head dimension for the preset.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Strategies to time page-cached, comma-separated (auto, direct, staged, read,
    /// simple, populate, hybrid, stream), each optionally `name[:SLOT][@DIRECT_PERCENT][#THREADS][^DEPTH]`.
    #[arg(
        long,
        default_value = "auto,stream,staged,direct",
        value_delimiter = ',',
        value_parser = StrategySpec::parse
    )]
    strategies: Vec<StrategySpec>,
    /// Timed loads per strategy (median reported).
    #[arg(long, default_value_t = 3)]
    repeat: usize,
    /// Worker threads (0 = CPUs, at most 16).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Direct-path window size.
    #[arg(long, default_value = "64M", value_parser = crate::parse::size_text)]
    window: String,
    /// Where the destinations live: `segment` (one segment, laid out in plan
    /// order) or `pool` (the caching pool, as an engine allocates parameters).
    #[arg(long, default_value = "segment", value_parser = ["segment", "pool"])]
    dest: String,
    /// Staging slot size (0: sized to keep the slots in use in the CPU cache).
    #[arg(long, default_value = "0", value_parser = crate::parse::size_text)]
    slot: String,
    /// Staging slots per worker (0: chosen with the slot size).
    #[arg(long, default_value_t = 0)]
    depth: usize,
    /// Hybrid's share of bytes sent through direct windows, percent.
    #[arg(long, default_value_t = 25)]
    direct_percent: u8,
    /// Also drop the page cache and measure the disk and a cold load (needs root).
    #[arg(long)]
    cold: bool,
    /// Cold rounds: each measures the disk, then a cold load (means reported:
    /// a median of two would pair one round's disk with the other's load), so
    /// a disk whose speed drifts is compared with itself.
    #[arg(long, default_value_t = 2)]
    cold_repeat: usize,
    /// Check every extent's first and last bytes on the device against the file.
    #[arg(long)]
    verify: bool,
    /// Bytes of the link measurement's copy.
    #[arg(long, default_value = "2G", value_parser = crate::parse::size_text)]
    link_bytes: String,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Draw the results as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<std::path::PathBuf>,
    /// Several devices (`0,1`): time the checkpoint as replicas on all of them
    /// and as tensor-parallel ranks, and the replicas' wakes, against one
    /// device's load and wake (bench_multi.rs). That comparison uses the
    /// default copy strategy (and `--threads` per device); the options of the
    /// one-device strategy table (`--strategies`, `--cold`, `--chart`, ...) are
    /// refused with it.
    /// A packed checkpoint's original (docs/PACKED.md): after the first
    /// load, load it into destinations of its own and compare every
    /// destination, all its bytes, by a device hash.
    #[arg(long, value_name = "ORIGINAL")]
    same_as: Option<std::path::PathBuf>,
    /// Time N Reload wakes of the checkpoint (loaded into a pool with the same
    /// rules, slept with Reload, its page cache pinned) against the link.
    #[arg(long, default_value_t = 0, value_name = "N")]
    reload_wake: usize,
    #[arg(
        long,
        value_delimiter = ',',
        conflicts_with_all = [
            "strategies", "cold", "cold_repeat", "chart", "dest", "slot", "depth",
            "direct_percent", "window", "link_bytes",
        ]
    )]
    devices: Vec<i32>,
}

/// One `--strategies` entry: `name[:SLOT][@DIRECT_PERCENT][#THREADS][^DEPTH]`,
/// checked while the command line is read.
#[derive(Debug, Clone)]
struct StrategySpec {
    text: String,
    strategy: Strategy,
    slot: Option<usize>,
    direct_percent: Option<u8>,
    threads: Option<usize>,
    depth: Option<usize>,
}

impl StrategySpec {
    fn parse(s: &str) -> std::result::Result<StrategySpec, String> {
        let (rest, depth) = s.split_once('^').unwrap_or((s, ""));
        let (rest, threads) = rest.split_once('#').unwrap_or((rest, ""));
        let (rest, pct) = rest.split_once('@').unwrap_or((rest, ""));
        let (name, slot) = rest.split_once(':').unwrap_or((rest, ""));
        let bad = |w: &str, v: &str| {
            format!("`{s}`: {w} `{v}`; expected name[:SLOT][@DIRECT_PERCENT][#THREADS][^DEPTH], e.g. staged:4M#8")
        };
        let num = |w: &str, v: &str| -> std::result::Result<Option<usize>, String> {
            (!v.is_empty())
                .then(|| v.parse().map_err(|_| bad(w, v)))
                .transpose()
        };
        Ok(StrategySpec {
            text: s.to_owned(),
            strategy: crate::parse::strategy(name)?,
            slot: (!slot.is_empty())
                .then(|| crate::parse::size_usize(slot))
                .transpose()?,
            direct_percent: (!pct.is_empty())
                .then(|| match pct.parse::<u8>() {
                    Ok(p) if p <= 100 => Ok(p),
                    _ => Err(bad("direct percent", pct)),
                })
                .transpose()?,
            threads: num("thread count", threads)?,
            depth: num("depth", depth)?,
        })
    }

    fn apply(&self, base: CopyOptions) -> CopyOptions {
        let mut c = CopyOptions {
            strategy: self.strategy,
            ..base
        };
        if let Some(v) = self.slot {
            c.slot_bytes = v;
        }
        if let Some(v) = self.direct_percent {
            c.direct_percent = v;
        }
        if let Some(v) = self.threads {
            c.threads = v;
        }
        if let Some(v) = self.depth {
            c.depth = v;
        }
        c
    }
}

#[derive(Debug, serde::Serialize)]
struct Run {
    strategy: Strategy,
    label: String,
    cache: &'static str,
    seconds: Vec<f64>,
    median_s: f64,
    gbps: f64,
    copy_gbps: f64,
    ratio: Option<f64>,
    stats: CopyStats,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    backend: String,
    device: String,
    reason: String,
    checkpoint: String,
    bytes: u64,
    tensors: usize,
    destinations: usize,
    link_htod_gbps: f64,
    host_cache_memcpy_gbps: f64,
    /// The process's first load (auto), which pins the staging ring.
    first_load_s: f64,
    disk_read_gbps: Option<f64>,
    runs: Vec<Run>,
    /// Bytes of the checkpoint's files (for a packed one, the packed files).
    file_bytes: u64,
    /// Bytes of the original files (for a packed one, before packing).
    original_file_bytes: u64,
    /// Destinations found equal to the original's (`--same-as`).
    same_as_destinations: Option<usize>,
    /// Seconds of each Reload wake (`--reload-wake`).
    reload_wake_s: Vec<f64>,
    /// Bytes each Reload wake placed.
    reload_wake_bytes: u64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Pinned host->device bandwidth: one `len`-byte copy, median of 5.
fn link_bandwidth(d: &Arc<dyn Driver>, len: usize) -> Result<f64> {
    let host = PinnedHost::new(d, len, "pinned link-test buffer")?;
    let dev = Segment::allocate(d.clone(), len, 0)?;
    let s = d.stream_create()?;
    let mut t = Vec::new();
    for _ in 0..6 {
        let t0 = Instant::now();
        // SAFETY: both buffers hold `len` bytes and outlive the synchronized copy.
        unsafe { d.copy_htod_async(dev.ptr(), host.ptr(), len, s) }?;
        d.stream_synchronize(s)?;
        t.push(t0.elapsed().as_secs_f64());
    }
    d.stream_destroy(s)?;
    t.remove(0); // warm-up
    Ok(len as f64 / median(&mut t) / 1e9)
}

fn drop_caches() -> Result<()> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3")
        .map_err(|e| Error::io("/proc/sys/vm/drop_caches", e))
}

/// GB/s of `threads` threads running `read(buffer, shard, offset)` over every
/// 16 MiB chunk of the checkpoint's files; `read` returns the bytes it moved.
/// Each thread has its own buffer, allocated before the clock starts.
fn chunked_rate(
    ckpt: &Checkpoint,
    threads: usize,
    read: impl Fn(&mut [u8], &vmmweights::loader::Shard, u64) -> u64 + Sync,
) -> f64 {
    let chunk = 16u64 << 20;
    let work: Vec<(usize, u64)> = ckpt
        .shards
        .iter()
        .enumerate()
        .flat_map(|(i, s)| (0..s.len.div_ceil(chunk)).map(move |k| (i, k * chunk)))
        .collect();
    let next = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let mut bufs: Vec<Vec<u8>> = (0..threads).map(|_| vec![1u8; chunk as usize]).collect();
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for buf in bufs.iter_mut() {
            let (next, bytes, work, read) = (&next, &bytes, &work, &read);
            sc.spawn(move || loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(&(s, off)) = work.get(i) else { break };
                bytes.fetch_add(read(buf, &ckpt.shards[s], off), Ordering::SeqCst);
            });
        }
    });
    let secs = t0.elapsed().as_secs_f64();
    std::hint::black_box(&bufs);
    bytes.load(Ordering::SeqCst) as f64 / secs / 1e9
}

/// The host's page-cache read rate by memcpy: `threads` threads copy the whole
/// (page-cached) checkpoint, 16 MiB at a time, from a fresh mapping into their
/// own buffers; no device involved. The ceiling of any staging path on this host.
fn cache_copy_bandwidth(path: &std::path::Path, threads: usize) -> Result<f64> {
    let ckpt = Checkpoint::open(path)?;
    Ok(chunked_rate(&ckpt, threads, |buf, sh, off| {
        let n = (buf.len() as u64).min(sh.len - off) as usize;
        // SAFETY: `off + n <= len` inside the shard's mapping; `buf` holds at least `n` bytes.
        unsafe { std::ptr::copy_nonoverlapping(sh.ptr(off), buf.as_mut_ptr(), n) };
        n as u64
    }))
}

/// The disk's parallel read rate over the checkpoint's files (page cache dropped first).
fn disk_bandwidth(ckpt: &Checkpoint, threads: usize) -> Result<f64> {
    drop_caches()?;
    Ok(chunked_rate(ckpt, threads, |buf, sh, off| {
        sh.file.read_at(buf, off).map_or(0, |n| n as u64)
    }))
}

fn preset_or_none(s: &str) -> std::result::Result<String, String> {
    if s == "none" {
        Ok(s.to_owned())
    } else {
        crate::parse::preset(s).map_err(|e| format!("{e}, or none"))
    }
}

pub fn run(a: Args) -> Result<()> {
    if !a.devices.is_empty() {
        return crate::bench_multi::run(crate::bench_multi::MultiArgs {
            backend: &a.backend,
            checkpoint: &a.checkpoint,
            preset: &a.preset,
            head_dim: a.head_dim,
            devices: &a.devices,
            repeat: a.repeat,
            threads: a.threads,
            verify: a.verify,
            json: a.json.as_deref(),
        });
    }
    // The checkpoint and its mapping are checked before the device is opened.
    let rules = if a.preset == "none" {
        Rules::default()
    } else {
        Rules::preset(&a.preset, None, a.head_dim)?
    };
    let ckpt = Checkpoint::open(&a.checkpoint)?;
    let bytes = ckpt.data_bytes();
    let tensors = ckpt.tensors.len();
    let file_bytes: u64 = ckpt.shards.iter().map(|s| s.len).sum();
    let original_file_bytes: u64 = ckpt.shards.iter().map(|s| s.original_len()).sum();
    let specs = Plan::destinations(&ckpt, &rules)?;
    let opened = a.backend.open()?;
    let d = opened.driver.clone();
    outln!("backend: {}", d.kind());
    outln!("  device: {}", d.describe());
    outln!("  why:    {}", opened.reason);
    let total: usize = specs.iter().map(|s| s.bytes().div_ceil(256) * 256).sum();
    let alloc: Box<dyn vmmweights::loader::DestAllocator> = if a.dest == "pool" {
        Box::new(vmmweights::Pool::new(d.clone(), Default::default())?)
    } else {
        Box::new(SegmentAllocator::new(d.clone(), total))
    };
    let mut reg = Registry::new();
    reg.allocate(&specs, alloc.as_ref())?;
    outln!(
        "checkpoint: {} ({} shards, {tensors} tensors, {:.2} GB) -> {} destinations in {}",
        a.checkpoint.display(),
        ckpt.shards.len(),
        bytes as f64 / 1e9,
        reg.len(),
        if a.dest == "pool" {
            "the pool"
        } else {
            "one segment"
        }
    );
    drop(ckpt);
    let link_bytes = parse_bytes(&a.link_bytes).map_err(Error::InvalidArgument)? as usize;
    let link = link_bandwidth(&d, link_bytes)?;
    outln!(
        "link host->device (pinned, {} MiB, median of 5): {link:.1} GB/s",
        link_bytes >> 20
    );

    let base = CopyOptions {
        strategy: Strategy::Auto,
        threads: a.threads,
        window_bytes: parse_bytes(&a.window).map_err(Error::InvalidArgument)? as usize,
        slot_bytes: parse_bytes(&a.slot).map_err(Error::InvalidArgument)? as usize,
        depth: a.depth,
        direct_percent: a.direct_percent,
    };
    let load_with = |copy: CopyOptions| -> Result<(f64, ExecutedPlan)> {
        let t0 = Instant::now();
        let ckpt = Checkpoint::open(&a.checkpoint)?;
        let opts = LoadOptions {
            copy,
            ..Default::default()
        };
        // A bar on a terminal only; off one (the GPU scripts) nothing is drawn.
        let bar = crate::output::Progress::new("load", false);
        let show = |done: u64, total: u64| bar.update(done, total);
        let ctl = Control {
            progress: Some(&show),
            cancel: None,
        };
        let ex = load(&d, ckpt, &rules, &reg, &opts, &ctl);
        bar.finish();
        Ok((t0.elapsed().as_secs_f64(), ex?))
    };
    let load_once = |strategy: Strategy| load_with(CopyOptions { strategy, ..base });
    // Warm the page cache (and the driver) once. This is also the process's
    // first load: it pins the staging ring, which later loads reuse.
    let (first_s, ex) = load_once(Strategy::Auto)?;
    outln!(
        "first load in this process (auto; page cache as found, ring {} MiB {} in {:.3} s): {first_s:.3} s, {:.1} GB/s",
        ex.stats.ring_bytes >> 20,
        if ex.stats.ring_reused { "reused" } else { "pinned" },
        ex.stats.ring_seconds,
        bytes as f64 / first_s / 1e9
    );
    breakdown(&ex.stats);
    if a.verify {
        outln!("verify: {} rows match the file", verify(d.as_ref(), &ex)?);
    }
    drop(ex);
    let same = match &a.same_as {
        Some(orig) => {
            let n = crate::bench_packed::same_as(&d, &reg, orig, &rules)?;
            outln!(
                "same-as: all {n} destinations equal to the load of {} (device hash of every byte)",
                orig.display()
            );
            Some(n)
        }
        None => None,
    };
    let cpu_threads = if a.threads == 0 {
        std::thread::available_parallelism()
            .map_or(4, |n| n.get())
            .min(16)
    } else {
        a.threads
    };
    let mut copy_rates = Vec::new();
    for _ in 0..3 {
        copy_rates.push(cache_copy_bandwidth(&a.checkpoint, cpu_threads)?);
    }
    let cache_copy = median(&mut copy_rates);
    outln!(
        "host page-cache memcpy, no device ({cpu_threads} threads, fresh mapping, median of 3): {cache_copy:.1} GB/s"
    );
    let mut runs = Vec::new();
    outln!(
        "{:<8} {:<7} {:>9} {:>9} {:>9} {:>8}",
        "strategy",
        "cache",
        "median_s",
        "GB/s",
        "copyGB/s",
        "of link"
    );
    for spec in &a.strategies {
        let s = &spec.text;
        let copy = spec.apply(base);
        let mut secs = Vec::new();
        let mut last = None;
        for _ in 0..a.repeat.max(1) {
            let (t, ex) = load_with(copy)?;
            secs.push(t);
            last = Some(ex.stats);
        }
        let stats = last.expect("at least one run");
        let med = median(&mut secs.clone());
        let gbps = bytes as f64 / med / 1e9;
        outln!(
            "{:<8} {:<7} {:>9.3} {:>9.1} {:>9.1} {:>7.0}%  ({:.0}% of host memcpy)",
            s,
            "cached",
            med,
            gbps,
            stats.gbps(),
            100.0 * gbps / link,
            100.0 * gbps / cache_copy
        );
        breakdown(&stats);
        runs.push(Run {
            strategy: spec.strategy,
            label: s.clone(),
            cache: "cached",
            seconds: secs,
            median_s: med,
            gbps,
            copy_gbps: stats.gbps(),
            ratio: Some(gbps / link),
            stats,
        });
    }
    let mut disk = None;
    if a.cold {
        let threads = if a.threads == 0 { 16 } else { a.threads };
        let (mut rates, mut secs, mut last) = (Vec::new(), Vec::new(), None);
        for round in 1..=a.cold_repeat.max(1) {
            let ck = Checkpoint::open(&a.checkpoint)?;
            let rate = match disk_bandwidth(&ck, threads) {
                Err(e) => {
                    outln!("cold: not measured: {e}");
                    break;
                }
                Ok(rate) => rate,
            };
            drop(ck);
            drop_caches()?;
            let (t, ex) = load_once(Strategy::Auto)?;
            outln!(
                "cold round {round}: disk parallel read ({threads} threads, 16 MiB reads) {rate:.2} GB/s, \
                 then auto cold {t:.3} s = {:.2} GB/s ({:.0}% of that disk rate)",
                bytes as f64 / t / 1e9,
                100.0 * bytes as f64 / t / 1e9 / rate
            );
            breakdown(&ex.stats);
            rates.push(rate);
            secs.push(t);
            last = Some(ex.stats);
        }
        if let Some(stats) = last {
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
            let rate = mean(&rates);
            let per_round: Vec<f64> = secs.iter().map(|t| bytes as f64 / t / 1e9).collect();
            let gbps = mean(&per_round);
            let t = bytes as f64 / gbps / 1e9;
            // Each round's load against the disk rate measured just before it.
            let ratio = mean(
                &per_round
                    .iter()
                    .zip(&rates)
                    .map(|(g, r)| g / r)
                    .collect::<Vec<_>>(),
            );
            outln!(
                "disk parallel read, mean of {}: {rate:.2} GB/s",
                rates.len()
            );
            outln!(
                "{:<8} {:<7} {:>9.3} {:>9.1} {:>9.1} {:>7.0}% of disk (mean of the rounds' ratios)",
                "auto",
                "cold",
                t,
                gbps,
                stats.gbps(),
                100.0 * ratio
            );
            disk = Some(rate);
            runs.push(Run {
                strategy: Strategy::Auto,
                label: "auto".into(),
                cache: "cold",
                seconds: secs,
                // Cold: the time of the mean rate over the rounds.
                median_s: t,
                gbps,
                copy_gbps: stats.gbps(),
                ratio: Some(ratio),
                stats,
            });
        }
    }
    let destinations = reg.len();
    let (reload_wake_s, reload_wake_bytes) = if a.reload_wake > 0 {
        // The segment's memory goes back before the pool takes its own.
        drop(reg);
        drop(alloc);
        let (mut secs, b) =
            crate::bench_packed::reload_wake(&d, &a.checkpoint, &rules, a.reload_wake)?;
        let med = median(&mut secs.clone());
        outln!(
            "reload wake (median of {}): {med:.3} s, {:.1} GB/s placed, {:.2}x the link",
            secs.len(),
            b as f64 / med / 1e9,
            b as f64 / med / 1e9 / link
        );
        secs.sort_by(|x, y| x.total_cmp(y));
        (secs, b)
    } else {
        (Vec::new(), 0)
    };
    let report = Report {
        backend: d.kind().to_string(),
        device: d.describe(),
        reason: opened.reason.clone(),
        checkpoint: a.checkpoint.display().to_string(),
        bytes,
        tensors,
        destinations,
        link_htod_gbps: link,
        host_cache_memcpy_gbps: cache_copy,
        first_load_s: first_s,
        disk_read_gbps: disk,
        runs,
        file_bytes,
        original_file_bytes,
        same_as_destinations: same,
        reload_wake_s,
        reload_wake_bytes,
    };
    if let Some(p) = &a.json {
        std::fs::write(
            p,
            serde_json::to_string_pretty(&report).expect("serializable"),
        )
        .map_err(|e| Error::io(p, e))?;
    }
    Ok(())
}

/// Where a load's time went (worker sums are CPU-seconds over all workers).
fn breakdown(s: &vmmweights::loader::CopyStats) {
    outln!(
        "  time: copy {:.3} s wall = zero-fill {:.3} + ring {:.3} ({} MiB, {}; {} x {} KiB slots per worker{}) + direct {:.3} + staging; \
         per-worker sums over {} threads: slot fill {:.3} s, issue {:.3} s, wait {:.3} s; \
         bytes: staged {} (streamed {}) read {} direct {}",
        s.seconds,
        s.fill_zero_seconds,
        s.ring_seconds,
        s.ring_bytes >> 20,
        if s.ring_reused { "reused" } else { "pinned now" },
        s.depth,
        s.slot_bytes >> 10,
        if s.cache_resident { ", cache-resident" } else { "" },
        s.direct_seconds,
        s.threads,
        s.slot_fill_seconds,
        s.issue_seconds,
        s.wait_seconds,
        s.staged_bytes,
        s.streamed_bytes,
        s.read_bytes,
        s.direct_bytes
    );
}
