//! `vmmw bench-codec`: OffloadCompressed against raw Offload on the same
//! bytes in the same run, with the link measured alongside: the encoded size
//! per dtype, and the effective sleep and wake rates (raw bytes per second)
//! as ratios to the link and to Offload.
//!
//! Datasets: every checkpoint given (loaded into the pool as a load would:
//! their values are whatever the files hold), then synthetic tensors: bf16
//! and fp16 from N(0, 0.02^2) (initialised LLM weights), fp32 from the same,
//! and random bytes (data that does not compress). Each wake is checked
//! against a device hash of the bytes before the sleep.

use std::path::PathBuf;
use std::sync::Arc;

use vmmweights::codec::Layout;
use vmmweights::driver::{DevicePtr, Driver, StreamId};
use vmmweights::sleep::{Policy, SleepOptions};
use vmmweights::{tag, Error, Pool, PoolConfig, Result};

use crate::bench_sleep::{link_bandwidth, median};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: crate::backend::BackendArgs,
    /// A checkpoint (safetensors file or folder) to bench on, loaded into the
    /// pool first; repeat for several.
    #[arg(long)]
    pub checkpoint: Vec<PathBuf>,
    /// MiB of each synthetic dataset.
    #[arg(long, default_value_t = 4096)]
    pub mib: usize,
    /// Timed sleep/wake cycles per policy (after one untimed warm-up).
    #[arg(long, default_value_t = 3)]
    pub cycles: usize,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
    /// Also sweep the codec's frame size and ring depth (frames of 16, 32
    /// and 64 MiB x rings of 2, 3 and 4 buffers) on the synthetic bf16 and
    /// random data, and print the best and the suggested default.
    #[arg(long)]
    pub sweep: bool,
    /// Run only the sweep (with `--sweep`): no checkpoints, no main rows.
    #[arg(long)]
    pub sweep_only: bool,
}

/// Frame sizes (MiB) and ring depths `--sweep` measures.
const SWEEP_FRAME_MIB: [usize; 3] = [16, 32, 64];
const SWEEP_RING: [usize; 3] = [2, 3, 4];

/// One point of the sweep on one dataset.
#[derive(Debug, Clone, serde::Serialize)]
struct SweepPoint {
    dataset: String,
    frame_mib: usize,
    ring: usize,
    sleep_vs_link: f64,
    wake_vs_link: f64,
    /// Offload's time over this point's (above 1: faster than raw Offload).
    sleep_vs_offload: f64,
    wake_vs_offload: f64,
}

/// One dataset's figures.
#[derive(Debug, serde::Serialize)]
struct Row {
    dataset: String,
    layout: Layout,
    /// Committed bytes of the segments (block padding included): what the
    /// backup restores.
    raw_bytes: u64,
    encoded_bytes: u64,
    backup_ratio: f64,
    /// The data alone, encoded by the reference codec on the host (synthetic
    /// datasets): the ratio without segment padding.
    data_ratio: Option<f64>,
    offload_sleep_gb_s: f64,
    offload_wake_gb_s: f64,
    compressed_sleep_gb_s: f64,
    compressed_wake_gb_s: f64,
    sleep_vs_link: f64,
    wake_vs_link: f64,
    sleep_vs_offload: f64,
    wake_vs_offload: f64,
    /// Sleeps of each policy into an empty arena (they pin the backup),
    /// the median of [`FIRST_SLEEPS`]: raw bytes per second over the link,
    /// and Offload's time over OffloadCompressed's.
    first_sleep_vs_link: f64,
    first_sleep_offload_vs_link: f64,
    first_sleep_vs_offload: f64,
}

/// The synthetic datasets: name, layout, one pattern of `n` bytes (at most
/// 64 MiB) tiled over the dataset.
fn synthetic(n: usize) -> Vec<(&'static str, Layout, Vec<u8>)> {
    let n = n.clamp(8, 64 << 20) / 8 * 8;
    let mut x = 0x5EED_u64;
    let mut next = move || {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        vmmweights::codec::checksum::mix(x, 0)
    };
    let mut normal = || {
        let u1 = ((next() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (next() >> 11) as f64 / (1u64 << 53) as f64;
        0.02 * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    };
    let bf16: Vec<u8> = (0..n / 2)
        .flat_map(|_| half::bf16::from_f64(normal()).to_le_bytes())
        .collect();
    let f16: Vec<u8> = (0..n / 2)
        .flat_map(|_| half::f16::from_f64(normal()).to_le_bytes())
        .collect();
    let f32: Vec<u8> = (0..n / 4)
        .flat_map(|_| (normal() as f32).to_le_bytes())
        .collect();
    let mut y = 0xABCD_u64;
    let random: Vec<u8> = (0..n / 8)
        .flat_map(|_| {
            y = y.wrapping_add(0x9E37_79B9_7F4A_7C15);
            vmmweights::codec::checksum::mix(y, 1).to_le_bytes()
        })
        .collect();
    vec![
        ("synthetic bf16 N(0, 0.02^2)", Layout::Half, bf16),
        ("synthetic fp16 N(0, 0.02^2)", Layout::Half, f16),
        ("synthetic fp32 N(0, 0.02^2)", Layout::Single, f32),
        ("random bytes (as bf16)", Layout::Half, random),
    ]
}

fn pool_for(d: &Arc<dyn Driver>, layout: Layout) -> Result<Pool> {
    Pool::new(
        d.clone(),
        PoolConfig {
            sleep: SleepOptions {
                codec_layout: layout,
                ..SleepOptions::default()
            },
            ..PoolConfig::default()
        },
    )
}

/// Per policy (Offload, OffloadCompressed): median sleep and wake seconds,
/// raw and encoded bytes; and each policy's median first-sleep seconds.
type Measured = ([(f64, f64, u64, u64); 2], [f64; 2]);

/// Sleep and wake `t` with each policy, each from an empty backup arena;
/// every wake checked by device hash. Also each policy's median seconds of
/// a sleep into an empty arena (one that pins).
fn measure(
    pool: &Pool,
    t: tag::TagId,
    ranges: &[(DevicePtr, usize)],
    cycles: usize,
) -> Result<Measured> {
    let (o, o_first) = measure_cold(pool, t, ranges, cycles, Policy::Offload)?;
    let (c, c_first) = measure_cold(pool, t, ranges, cycles, Policy::OffloadCompressed)?;
    Ok(([o, c], [o_first, c_first]))
}

/// Median sleep and wake seconds of `t` with `policy` over `cycles` cycles
/// (after one untimed), raw and encoded bytes; every wake checked by device
/// hash against the bytes before the first sleep.
fn measure_policy(
    pool: &Pool,
    t: tag::TagId,
    ranges: &[(DevicePtr, usize)],
    cycles: usize,
    policy: Policy,
) -> Result<(f64, f64, u64, u64)> {
    measure_cold(pool, t, ranges, cycles, policy).map(|(m, _)| m)
}

/// Sleeps from an empty arena timed per policy and dataset: their median is
/// reported, since how fast the host pins memory varies from one sleep to
/// the next by more than the policies differ.
const FIRST_SLEEPS: usize = 3;

/// [`measure_policy`] after sleeps from an empty backup arena (every pinned
/// slab given back before each), and the median seconds of those sleeps,
/// which pin their backup.
fn measure_cold(
    pool: &Pool,
    t: tag::TagId,
    ranges: &[(DevicePtr, usize)],
    cycles: usize,
    policy: Policy,
) -> Result<((f64, f64, u64, u64), f64)> {
    let d = pool.driver().clone();
    d.synchronize()?;
    // SAFETY: the ranges are live, awake blocks; the device is synchronized.
    let want = unsafe { d.hash_ranges(ranges) }?;
    let mut firsts = Vec::with_capacity(FIRST_SLEEPS);
    for c in 0..FIRST_SLEEPS {
        pool.release_backup();
        let s = pool.sleep(&[(t, policy)])?;
        pool.wake(&[t])?;
        // SAFETY: as above: awake again, the wake synchronized its copies.
        if unsafe { d.hash_ranges(ranges) }? != want {
            return Err(Error::InvalidState(format!(
                "{policy:?}: the bytes after the wake of first sleep {c} differ from those before it"
            )));
        }
        firsts.push(s[0].report.seconds);
    }
    let (mut sleeps, mut wakes) = (Vec::new(), Vec::new());
    let (mut raw, mut encoded) = (0u64, 0u64);
    // Cycle 0 warms the arena's reuse (a backup assigned per segment).
    for c in 0..=cycles {
        let s = pool.sleep(&[(t, policy)])?;
        let w = pool.wake(&[t])?;
        // SAFETY: as above: awake again, the wake synchronized its copies.
        let got = unsafe { d.hash_ranges(ranges) }?;
        if got != want {
            return Err(Error::InvalidState(format!(
                "{policy:?}: the bytes after wake {c} differ from those before the sleep"
            )));
        }
        if c > 0 {
            sleeps.push(s[0].report.seconds);
            wakes.push(w[0].report.seconds);
        }
        let r = &s[0].report;
        (raw, encoded) = match policy {
            Policy::OffloadCompressed => (r.raw_bytes, r.copied_bytes),
            _ => (r.copied_bytes, r.copied_bytes),
        };
    }
    Ok((
        (median(sleeps), median(wakes), raw, encoded),
        median(firsts),
    ))
}

/// `total` bytes of `pattern` tiled over tensors of 256 MiB (as the large
/// weights of a model) tagged `t`; their ranges.
fn fill(
    pool: &Pool,
    t: tag::TagId,
    total: usize,
    pattern: &[u8],
) -> Result<Vec<(DevicePtr, usize)>> {
    let d = pool.driver().clone();
    let mut ranges = Vec::new();
    let mut at = 0usize;
    while at < total {
        let n = (256usize << 20).min(total - at);
        let b = pool.alloc_tagged(n, t)?;
        let mut off = 0;
        while off < n {
            let k = pattern.len().min(n - off);
            // SAFETY: inside the block just allocated; synchronized below
            // before `pattern` can go.
            unsafe {
                d.copy_htod_async(b.ptr + off as u64, pattern.as_ptr(), k, StreamId::DEFAULT)
            }?;
            off += k;
        }
        ranges.push((b.ptr, n));
        at += n;
    }
    d.synchronize()?;
    Ok(ranges)
}

/// Measure every frame size and ring depth of the sweep on the synthetic
/// bf16 and random datasets of `total` bytes; print each point, the best
/// for sleep and for wake, and the suggested default: the point with the
/// highest bf16 min(sleep / 1.2, wake / 1.3) (the targets over the link)
/// among those whose random-data sleep and wake stay within 3% of raw
/// Offload.
fn sweep(
    d: &Arc<dyn Driver>,
    total: usize,
    cycles: usize,
    link: (f64, f64),
) -> Result<Vec<SweepPoint>> {
    let (h2d, d2h) = link;
    let mut points = Vec::new();
    for (name, layout, pattern) in synthetic(total)
        .into_iter()
        .filter(|(n, _, _)| n.starts_with("synthetic bf16") || n.starts_with("random"))
    {
        let pool = pool_for(d, layout)?;
        let t = tag::id("bench-codec-sweep")?;
        let ranges = fill(&pool, t, total, &pattern)?;
        let (os, ow, _, _) = measure_policy(&pool, t, &ranges, cycles, Policy::Offload)?;
        for frame_mib in SWEEP_FRAME_MIB {
            for ring in SWEEP_RING {
                pool.set_sleep_options(SleepOptions {
                    codec_layout: layout,
                    codec_frame_bytes: frame_mib << 20,
                    codec_ring: ring,
                    ..SleepOptions::default()
                })?;
                let (cs, cw, raw, _) =
                    measure_policy(&pool, t, &ranges, cycles, Policy::OffloadCompressed)?;
                let p = SweepPoint {
                    dataset: name.to_owned(),
                    frame_mib,
                    ring,
                    sleep_vs_link: raw as f64 / cs / 1e9 / d2h,
                    wake_vs_link: raw as f64 / cw / 1e9 / h2d,
                    sleep_vs_offload: os / cs,
                    wake_vs_offload: ow / cw,
                };
                outln!(
                    "sweep {}: frame {} MiB, ring {}: sleep {:.2}x link, {:.2}x Offload; wake {:.2}x link, {:.2}x Offload",
                    p.dataset, p.frame_mib, p.ring, p.sleep_vs_link, p.sleep_vs_offload, p.wake_vs_link, p.wake_vs_offload
                );
                points.push(p);
            }
        }
    }
    let bf16: Vec<&SweepPoint> = points
        .iter()
        .filter(|p| p.dataset.starts_with("synthetic bf16"))
        .collect();
    let random_ok = |p: &SweepPoint| {
        points.iter().any(|r| {
            r.dataset.starts_with("random")
                && (r.frame_mib, r.ring) == (p.frame_mib, p.ring)
                && r.sleep_vs_offload >= 0.97
                && r.wake_vs_offload >= 0.97
        })
    };
    let best = |key: &dyn Fn(&SweepPoint) -> f64| {
        bf16.iter()
            .copied()
            .max_by(|a, b| key(a).total_cmp(&key(b)))
            .map(|p| {
                format!(
                    "frame {} MiB, ring {} ({:.2}x)",
                    p.frame_mib,
                    p.ring,
                    key(p)
                )
            })
            .unwrap_or_default()
    };
    outln!("sweep best bf16 sleep: {}", best(&|p| p.sleep_vs_link));
    outln!("sweep best bf16 wake: {}", best(&|p| p.wake_vs_link));
    let score = |p: &SweepPoint| (p.sleep_vs_link / 1.2).min(p.wake_vs_link / 1.3);
    let chosen = bf16
        .iter()
        .copied()
        .filter(|p| random_ok(p))
        .max_by(|a, b| score(a).total_cmp(&score(b)));
    let dflt = SleepOptions::default();
    match chosen {
        Some(p) => outln!(
            "sweep chosen default: frame {} MiB, ring {} (bf16 sleep {:.2}x, wake {:.2}x link; random within 3% of Offload); the built-in default is frame {} MiB, ring {} (VMMW_CODEC_FRAME_MIB={} VMMW_CODEC_RING={} to try it)",
            p.frame_mib, p.ring, p.sleep_vs_link, p.wake_vs_link,
            dflt.codec_frame_bytes >> 20, dflt.codec_ring, p.frame_mib, p.ring
        ),
        None => outln!(
            "sweep chosen default: none keeps random data within 3% of Offload; the built-in default is frame {} MiB, ring {}",
            dflt.codec_frame_bytes >> 20, dflt.codec_ring
        ),
    }
    Ok(points)
}

fn row(
    dataset: &str,
    layout: Layout,
    (m, first): Measured,
    link: (f64, f64),
    data_ratio: Option<f64>,
) -> Row {
    let (h2d, d2h) = link;
    let [(os, ow, raw, _), (cs, cw, craw, enc)] = m;
    let [o_first, c_first] = first;
    let gbps = |bytes: u64, s: f64| bytes as f64 / s / 1e9;
    let r = Row {
        dataset: dataset.to_owned(),
        layout,
        raw_bytes: craw,
        encoded_bytes: enc,
        backup_ratio: enc as f64 / craw.max(1) as f64,
        data_ratio,
        offload_sleep_gb_s: gbps(raw, os),
        offload_wake_gb_s: gbps(raw, ow),
        compressed_sleep_gb_s: gbps(craw, cs),
        compressed_wake_gb_s: gbps(craw, cw),
        sleep_vs_link: gbps(craw, cs) / d2h,
        wake_vs_link: gbps(craw, cw) / h2d,
        sleep_vs_offload: os / cs,
        wake_vs_offload: ow / cw,
        first_sleep_vs_link: gbps(craw, c_first) / d2h,
        first_sleep_offload_vs_link: gbps(raw, o_first) / d2h,
        first_sleep_vs_offload: o_first / c_first,
    };
    outln!(
        "{}: backup {:.1}% of {:.2} GB ({:?}{}); sleep {:.2} GB/s = {:.2}x link, {:.2}x Offload; wake {:.2} GB/s = {:.2}x link, {:.2}x Offload",
        r.dataset,
        100.0 * r.backup_ratio,
        r.raw_bytes as f64 / 1e9,
        layout,
        r.data_ratio
            .map(|x| format!("; the data alone {:.1}%", 100.0 * x))
            .unwrap_or_default(),
        r.compressed_sleep_gb_s,
        r.sleep_vs_link,
        r.sleep_vs_offload,
        r.compressed_wake_gb_s,
        r.wake_vs_link,
        r.wake_vs_offload
    );
    outln!(
        "{}: first sleep (pins its backup): OffloadCompressed {:.2}x link, Offload {:.2}x link, {:.2}x Offload",
        r.dataset,
        r.first_sleep_vs_link,
        r.first_sleep_offload_vs_link,
        r.first_sleep_vs_offload
    );
    r
}

/// Run the benchmark.
pub fn run(args: Args) -> Result<()> {
    let opened = args.backend.open()?;
    let d = opened.driver.clone();
    outln!(
        "backend: {} ({}; {})",
        d.kind(),
        d.describe(),
        opened.reason
    );
    let link = link_bandwidth(&d, (1 << 30).min(args.mib.max(1) << 20))?;
    outln!(
        "link: host->device {:.2} GB/s, device->host {:.2} GB/s (pinned, 1 GiB, median of 5)",
        link.0,
        link.1
    );
    let cycles = args.cycles.max(1);
    let mut rows = Vec::new();
    let main = !(args.sweep && args.sweep_only);
    for path in args.checkpoint.iter().filter(|_| main) {
        let pool = pool_for(&d, Layout::Half)?;
        let t = tag::id("bench-codec-ckpt")?;
        let session = vmmweights::loader::Session::open(path)?;
        session.allocate(&pool, t)?;
        session.load(&pool, None)?;
        let reg = session.destinations();
        let ranges: Vec<(DevicePtr, usize)> = reg.iter().map(|x| (x.ptr, x.bytes())).collect();
        // Code by the width of the dtype holding the most bytes.
        let mut by_dtype: std::collections::BTreeMap<&str, usize> = Default::default();
        for x in reg.iter() {
            *by_dtype.entry(x.dtype.name()).or_default() += x.bytes();
        }
        let (dtype, _) = by_dtype
            .iter()
            .max_by_key(|&(_, &n)| n)
            .map(|(&d, &n)| (d, n))
            .unwrap_or(("BF16", 0));
        let layout = Layout::for_dtype(dtype);
        pool.set_sleep_options(SleepOptions {
            codec_layout: layout,
            ..SleepOptions::default()
        })?;
        let m = measure(&pool, t, &ranges, cycles)?;
        rows.push(row(
            &format!("checkpoint {} (mostly {dtype})", path.display()),
            layout,
            m,
            link,
            None,
        ));
    }
    let total = args.mib.max(1) << 20;
    for (name, layout, pattern) in synthetic(total).into_iter().filter(|_| main) {
        let pool = pool_for(&d, layout)?;
        let t = tag::id("bench-codec-synthetic")?;
        let ranges = fill(&pool, t, total, &pattern)?;
        let m = measure(&pool, t, &ranges, cycles)?;
        let data = vmmweights::codec::encode(&pattern, layout).len() as f64 / pattern.len() as f64;
        rows.push(row(name, layout, m, link, Some(data)));
    }
    let sweep = if args.sweep {
        sweep(&d, total, cycles, link)?
    } else {
        Vec::new()
    };
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "backend": d.kind().to_string(),
            "device": d.describe(),
            "link_h2d_gb_s": link.0,
            "link_d2h_gb_s": link.1,
            "cycles": cycles,
            "rows": rows,
            "sweep": sweep,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default()).map_err(
            |e| Error::Io {
                path: path.clone(),
                source: e,
            },
        )?;
    }
    Ok(())
}
