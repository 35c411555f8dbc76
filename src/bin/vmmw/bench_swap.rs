//! `vmmw bench-swap`: two models of one device swapped, one put to sleep
//! while the other wakes (`Pool::swap`), for every pair of policies (the
//! one the waking model slept with x the one the other sleeps with), against
//! the link measured in the same run (host to device, device to host, and
//! both at once, so the duplex capacity is known) and against the same two
//! steps one after the other (sleep, then wake).
//!
//! The models are bf16 safetensors files shaped like the 8B model of the
//! other benchmarks, scaled to the size asked (by default about 5 GB each,
//! less on a device that cannot hold two with room to spare), written to a
//! folder once and loaded from the page cache, so Reload has a checkpoint to
//! restore from. Every woken model's bytes are hashed on the device and
//! compared with their hash right after the load.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use vmmweights::driver::{BackendKind, Driver};
use vmmweights::hostmem::PinnedHost;
use vmmweights::loader::Session;
use vmmweights::pool::{Pool, PoolConfig};
use vmmweights::sleep::Policy;
use vmmweights::tag::{self, TagId};
use vmmweights::{Error, Result, Segment};

use crate::bench_sleep::{median, model_segments};

const POLICIES: [Policy; 4] = [
    Policy::Offload,
    Policy::OffloadCompressed,
    Policy::Reload,
    Policy::Discard,
];

/// Options of `vmmw bench-swap`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: crate::backend::BackendArgs,
    /// Bytes of each model in MiB [default: about 5 GB, at most 28% of the
    /// device's memory; 256 MiB on the host backend].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub model_mib: Option<u64>,
    /// Timed rounds per pair (medians are reported).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub rounds: u32,
    /// The policies measured, on both sides (every pair of them), comma
    /// separated [default: offload,offload_compressed,reload,discard].
    #[arg(long, value_delimiter = ',', value_parser = parse_policy)]
    pub policies: Vec<Policy>,
    /// Folder for the two checkpoint files, kept for later runs (files of
    /// the right size are reused) [default: a temporary folder, removed].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<PathBuf>,
}

fn parse_policy(s: &str) -> std::result::Result<Policy, String> {
    Policy::parse(s).map_err(|e| e.to_string())
}

/// The link in one run: each direction alone, and both at once.
#[derive(Debug, Clone, Copy, serde::Serialize)]
struct Link {
    h2d_gbps: f64,
    d2h_gbps: f64,
    /// Each direction's rate while the other runs too.
    duplex_h2d_gbps: f64,
    duplex_d2h_gbps: f64,
    /// Bytes both directions moved together per second.
    duplex_total_gbps: f64,
}

impl Link {
    /// Seconds the link needs for `out` bytes device to host and `inn`
    /// bytes host to device, each direction alone at its own rate, the two
    /// at once: the larger side's time.
    fn larger_side(&self, out: u64, inn: u64) -> f64 {
        (out as f64 / self.d2h_gbps / 1e9).max(inn as f64 / self.h2d_gbps / 1e9)
    }

    /// The same at the rates measured with both directions busy.
    fn duplex(&self, out: u64, inn: u64) -> f64 {
        let (o, i) = (out as f64, inn as f64);
        match (out, inn) {
            (0, _) => i / self.h2d_gbps / 1e9,
            (_, 0) => o / self.d2h_gbps / 1e9,
            _ => (o / self.duplex_d2h_gbps / 1e9).max(i / self.duplex_h2d_gbps / 1e9),
        }
    }
}

/// One pair of policies.
#[derive(Debug, serde::Serialize)]
struct Row {
    /// The policy the waking model slept with.
    waking: Policy,
    /// The policy the other model sleeps with.
    sleeping: Policy,
    /// Bytes the sleep side copied device to host (encoded for
    /// OffloadCompressed).
    out_bytes: u64,
    /// Bytes the wake side copied host to device or re-read (Reload).
    in_bytes: u64,
    swap_s: f64,
    sequential_s: f64,
    /// The link's time for the larger side (`Link::larger_side`).
    link_s: f64,
    /// The ratios; none when no byte crosses the link (Discard to Discard).
    swap_over_link: Option<f64>,
    sequential_over_link: Option<f64>,
    /// The swap against the rates measured with both directions busy.
    swap_over_duplex: Option<f64>,
    /// The sleep alone and the wake alone (the halves of `sequential_s`).
    sleep_alone_s: f64,
    wake_alone_s: f64,
    /// The swap against the slower side alone: 1.0 is a perfect overlap
    /// (what a side bound by something else than the link, the codec of
    /// OffloadCompressed, is judged by).
    swap_over_slower_side: f64,
    /// Bytes of the woken model hashed equal to the load's (0 after Discard).
    verified_bytes: u64,
}

/// A model: its tag, its load, and the hash of its bytes after the load.
struct Model {
    tag: TagId,
    session: Session,
    ranges: Vec<(u64, usize)>,
    hash: Vec<u64>,
}

impl Model {
    fn load(pool: &Pool, path: &Path, name: &str) -> Result<Model> {
        let tag = tag::id(name)?;
        let session = Session::open(path)?;
        session.allocate(pool, tag)?;
        session.load(pool, None)?;
        let ranges: Vec<(u64, usize)> = session
            .destinations()
            .iter()
            .map(|d| (d.ptr, d.bytes()))
            .collect();
        let mut m = Model {
            tag,
            session,
            ranges,
            hash: Vec::new(),
        };
        m.hash = m.hashes(pool)?;
        Ok(m)
    }

    fn hashes(&self, pool: &Pool) -> Result<Vec<u64>> {
        pool.driver().synchronize()?;
        // SAFETY: the destinations are loaded, awake and idle (synchronized).
        unsafe { pool.driver().hash_ranges(&self.ranges) }
    }

    /// The bytes verified equal to the load's.
    fn verify(&self, pool: &Pool, what: &str) -> Result<u64> {
        if self.hashes(pool)? != self.hash {
            return Err(Error::InvalidState(format!(
                "{what}: the bytes of {} differ from its load",
                tag::name_of(self.tag)
            )));
        }
        Ok(self.ranges.iter().map(|&(_, l)| l as u64).sum())
    }

    /// Put back the loaded bytes after a Discard (and the reload source).
    fn restore(&self, pool: &Pool) -> Result<()> {
        self.session.load(pool, None).map(|_| ())
    }
}

/// Write a bf16 safetensors file of about `bytes` bytes shaped like the 8B
/// model (exponents of trained weights, random sign and mantissa), unless
/// one of that size is there already.
fn write_checkpoint(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let scale = (16.4e9 / bytes as f64).max(1.0);
    let sizes: Vec<usize> = model_segments(1)
        .iter()
        .map(|&s| (((s as f64 / scale) as usize) & !1).max(2))
        .collect();
    let mut header = String::from("{");
    let mut at = 0usize;
    for (i, &n) in sizes.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header.push_str(&format!(
            "\"t{i:03}\":{{\"dtype\":\"BF16\",\"shape\":[{}],\"data_offsets\":[{at},{}]}}",
            n / 2,
            at + n
        ));
        at += n;
    }
    header.push('}');
    while (header.len() + 8) % 8 != 0 {
        header.push(' ');
    }
    let total = 8 + header.len() as u64 + at as u64;
    if std::fs::metadata(path).is_ok_and(|m| m.len() == total) {
        return Ok(());
    }
    let io = |e| Error::io(path, e);
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&(header.len() as u64).to_le_bytes())
        .map_err(io)?;
    f.write_all(header.as_bytes()).map_err(io)?;
    f.set_len(total).map_err(io)?;
    let data_at = 8 + header.len() as u64;
    let threads = std::thread::available_parallelism()
        .map_or(4, |n| n.get())
        .min(16);
    const STEP: usize = 8 << 20;
    let steps = at.div_ceil(STEP);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let f = &f;
                s.spawn(move || -> std::io::Result<()> {
                    let mut buf = vec![0u8; STEP];
                    for k in (t..steps).step_by(threads) {
                        let n = STEP.min(at - k * STEP);
                        let mut x = (seed ^ k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                        for w in buf[..n].chunks_exact_mut(2) {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let v = ((x >> 20) as u16 & 0x807f) | ((118 + (x % 8) as u16) << 7);
                            w.copy_from_slice(&v.to_le_bytes());
                        }
                        f.write_all_at(&buf[..n], data_at + (k * STEP) as u64)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(std::io::Error::other("writer panicked")))
        })
    })
    .map_err(io)
}

/// Pinned copies of `bytes`: each direction alone, then both at once on two
/// streams (median of 5 after a warm-up).
fn measure_link(d: &Arc<dyn Driver>, bytes: usize) -> Result<Link> {
    let up = PinnedHost::driver_allocated(d, bytes)?;
    let down = PinnedHost::driver_allocated(d, bytes)?;
    let dev_a = Segment::allocate(d.clone(), bytes, 0)?;
    let dev_b = Segment::allocate(d.clone(), bytes, 0)?;
    let (s1, s2) = (d.stream_create()?, d.stream_create()?);
    let run = |h2d: bool, d2h: bool| -> Result<f64> {
        let t = Instant::now();
        // SAFETY: every buffer holds `bytes` bytes; the two copies touch
        // different buffers and are synchronized before the next.
        unsafe {
            if h2d {
                d.copy_htod_async(dev_a.ptr(), up.ptr(), bytes, s1)?;
            }
            if d2h {
                d.copy_dtoh_async(down.ptr(), dev_b.ptr(), bytes, s2)?;
            }
        }
        d.stream_synchronize(s1)?;
        d.stream_synchronize(s2)?;
        Ok(t.elapsed().as_secs_f64())
    };
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..6 {
        for (i, (a, b)) in [(true, false), (false, true), (true, true)]
            .into_iter()
            .enumerate()
        {
            let s = run(a, b)?;
            if round > 0 {
                times[i].push(s);
            }
        }
    }
    let _ = d.stream_destroy(s1);
    let _ = d.stream_destroy(s2);
    let gb = bytes as f64 / 1e9;
    let both = median(times[2].clone());
    Ok(Link {
        h2d_gbps: gb / median(times[0].clone()),
        d2h_gbps: gb / median(times[1].clone()),
        duplex_h2d_gbps: gb / both,
        duplex_d2h_gbps: gb / both,
        duplex_total_gbps: 2.0 * gb / both,
    })
}

/// Bytes of each model: asked for, or about 5 GB, at most 28% of the device
/// (two models, their codec scratch and the link's buffers fit with room).
fn model_bytes(d: &dyn Driver, asked: Option<u64>) -> Result<u64> {
    if let Some(mib) = asked {
        return Ok(mib << 20);
    }
    if d.kind() == BackendKind::Host {
        return Ok(256 << 20);
    }
    let total = d.mem_info()?.total;
    Ok(5_000_000_000u64.min(total / 100 * 28))
}

/// A folder for the checkpoints: the one asked for, or a temporary one
/// removed on drop.
struct Folder(PathBuf, bool);

impl Drop for Folder {
    fn drop(&mut self) {
        if self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Run the benchmark.
pub fn run(args: Args) -> Result<()> {
    let opened = args.backend.open()?;
    let d = opened.driver.clone();
    outln!("backend: {}", d.kind());
    outln!("  device: {}", d.describe());
    outln!("  why:    {}", opened.reason);
    let bytes = model_bytes(d.as_ref(), args.model_mib)?;
    let dir = match &args.dir {
        Some(p) => Folder(p.clone(), false),
        None => Folder(
            std::env::temp_dir().join(format!("vmmw-bench-swap-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir.0).map_err(|e| Error::io(&dir.0, e))?;
    let (path_a, path_b) = (
        dir.0.join("model-a.safetensors"),
        dir.0.join("model-b.safetensors"),
    );
    let t = Instant::now();
    write_checkpoint(&path_a, bytes, 1)?;
    write_checkpoint(&path_b, bytes, 2)?;
    outln!(
        "models: 2 x {:.2} GB in {} ({:.1} s to write or check)",
        bytes as f64 / 1e9,
        dir.0.display(),
        t.elapsed().as_secs_f64()
    );
    let link = measure_link(&d, (bytes as usize).min(1 << 30))?;
    outln!(
        "link: host->device {:.1} GB/s, device->host {:.1} GB/s; both at once {:.1} + {:.1} = {:.1} GB/s",
        link.h2d_gbps, link.d2h_gbps, link.duplex_h2d_gbps, link.duplex_d2h_gbps, link.duplex_total_gbps
    );
    let pool = Pool::new(d.clone(), PoolConfig::default())?;
    let a = Model::load(&pool, &path_a, "bench-swap-a")?;
    let b = Model::load(&pool, &path_b, "bench-swap-b")?;
    // Steady state: the backups' pinned memory is there before any timing.
    pool.reserve_backup(2 * bytes + (512 << 20))?;
    let policies = if args.policies.is_empty() {
        POLICIES.to_vec()
    } else {
        args.policies.clone()
    };
    let mut rows = Vec::new();
    for &waking in &policies {
        for &sleeping in &policies {
            rows.push(pair(&pool, &a, &b, waking, sleeping, &link, args.rounds)?);
        }
    }
    outln!();
    outln!("| waking slept with | sleeping with | out GB | in GB | swap s | sequential s | link s | swap / link | sequential / link | swap / duplex |");
    outln!("|---|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        outln!(
            "| {:?} | {:?} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} | {} |",
            r.waking,
            r.sleeping,
            r.out_bytes as f64 / 1e9,
            r.in_bytes as f64 / 1e9,
            r.swap_s,
            r.sequential_s,
            r.link_s,
            times(r.swap_over_link),
            times(r.sequential_over_link),
            times(r.swap_over_duplex)
        );
    }
    let verified: u64 = rows.iter().map(|r| r.verified_bytes).sum();
    outln!("verified: {verified} bytes of woken models hashed equal to their loads");
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "backend": d.kind().to_string(),
            "device": d.describe(),
            "reason": opened.reason,
            "model_bytes": bytes,
            "rounds": args.rounds,
            "link": link,
            "rows": rows,
            "verified_bytes": verified,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}

fn times(r: Option<f64>) -> String {
    r.map_or("-".to_owned(), |x| format!("{x:.2}x"))
}

/// Time one pair: `b` asleep with `waking` wakes while `a` sleeps with
/// `sleeping`, as a swap and as a sleep then a wake; a warm-up round first.
fn pair(
    pool: &Pool,
    a: &Model,
    b: &Model,
    waking: Policy,
    sleeping: Policy,
    link: &Link,
    rounds: u32,
) -> Result<Row> {
    let what = format!("{waking:?} wakes while {sleeping:?} sleeps");
    // `a` awake with its loaded bytes, `b` asleep with `waking`.
    let setup = || -> Result<()> {
        pool.wake(&[])?;
        for m in [a, b] {
            if m.verify(pool, "setup").is_err() {
                m.restore(pool)?;
            }
        }
        pool.sleep(&[(b.tag, waking)])?;
        Ok(())
    };
    let (mut swaps, mut seqs, mut sleeps, mut wakes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut out_bytes, mut in_bytes, mut verified) = (0u64, 0u64, 0u64);
    for round in 0..=rounds {
        setup()?;
        let o = pool.swap(&[(a.tag, sleeping)], &[b.tag])?;
        let secs = o.seconds;
        let (slept, woke) = o
            .into_result()
            .map_err(|e| Error::InvalidState(format!("{what}: {e}")))?;
        out_bytes = slept.iter().map(|c| c.report.copied_bytes).sum();
        in_bytes = woke
            .iter()
            .map(|c| c.report.copied_bytes + c.report.reloaded_bytes)
            .sum();
        if waking != Policy::Discard && (round == 0 || round == rounds) {
            verified += b.verify(pool, &what)?;
        }
        if round > 0 {
            swaps.push(secs);
        }
    }
    for round in 0..=rounds {
        setup()?;
        let t = Instant::now();
        pool.sleep(&[(a.tag, sleeping)])?;
        let slept = t.elapsed().as_secs_f64();
        pool.wake(&[b.tag])?;
        let secs = t.elapsed().as_secs_f64();
        if round > 0 {
            seqs.push(secs);
            sleeps.push(slept);
            wakes.push(secs - slept);
        }
    }
    let (swap_s, sequential_s) = (median(swaps), median(seqs));
    let (sleep_alone_s, wake_alone_s) = (median(sleeps), median(wakes));
    let link_s = link.larger_side(out_bytes, in_bytes);
    let crosses = out_bytes + in_bytes > 0;
    let ratio = |secs: f64, link: f64| crosses.then(|| secs / link);
    let row = Row {
        waking,
        sleeping,
        out_bytes,
        in_bytes,
        swap_s,
        sequential_s,
        link_s,
        swap_over_link: ratio(swap_s, link_s),
        sequential_over_link: ratio(sequential_s, link_s),
        swap_over_duplex: ratio(swap_s, link.duplex(out_bytes, in_bytes)),
        sleep_alone_s,
        wake_alone_s,
        swap_over_slower_side: swap_s / sleep_alone_s.max(wake_alone_s),
        verified_bytes: verified,
    };
    outln!(
        "{what}: swap {:.3} s, sequential {:.3} s, link {:.3} s ({} and {} the link)",
        row.swap_s,
        row.sequential_s,
        row.link_s,
        times(row.swap_over_link),
        times(row.sequential_over_link)
    );
    let _ = std::io::stdout().flush();
    Ok(row)
}
