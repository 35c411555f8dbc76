//! `vmmw bench-sleep`: sleep/wake of ~16 GB of weights shaped like an 8B model,
//! ours against the reference path (pinned host memory allocated per segment
//! at sleep, one synchronous copy per segment), with the link's bandwidth
//! measured in the same run.

use std::sync::Arc;
use std::time::Instant;

use vmmweights::driver::sync_copy::{copy_to_device, copy_to_host};
use vmmweights::driver::{BackendKind, Driver, StreamId};
use vmmweights::hostmem::PinnedHost;
use vmmweights::sleep::{Policy, SleepEngine, SleepOptions};
use vmmweights::tag::TagId;
use vmmweights::{Error, Result, Segment};

/// Sizes in bytes of the weights of an 8B-shaped bf16 model (hidden 4096,
/// intermediate 12288, 36 layers, vocabulary 151936, 32 q / 8 kv heads of 128,
/// fused qkv and gate_up, untied lm_head), as one allocation per tensor the way
/// the PyTorch path sees them; small norms are grouped per 9 layers.
pub fn model_segments(scale_div: usize) -> Vec<usize> {
    let (h, i, layers, vocab) = (4096usize, 12288usize, 36usize, 151936usize);
    let bf16 = 2;
    let mut v = vec![vocab * h * bf16];
    for _ in 0..layers {
        v.push((32 + 8 + 8) * 128 * h * bf16); // qkv
        v.push(h * h * bf16); // o_proj
        v.push(2 * i * h * bf16); // gate_up
        v.push(h * i * bf16); // down
    }
    for _ in 0..4 {
        v.push(9 * (2 * h + 2 * 128) * bf16); // norms of 9 layers
    }
    v.push(vocab * h * bf16); // lm_head
    v.iter().map(|&b| (b / scale_div.max(1)).max(1)).collect()
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Pinned host<->device bandwidth: one `bytes` copy each way, median of 5.
pub fn link_bandwidth(d: &Arc<dyn Driver>, bytes: usize) -> Result<(f64, f64)> {
    // What PyTorch's `pin_memory` and the reference use.
    let host = PinnedHost::driver_allocated(d, bytes)?;
    let dev = Segment::allocate(d.clone(), bytes, 0)?;
    let (mut h2d, mut d2h) = (Vec::new(), Vec::new());
    for _ in 0..6 {
        let t = Instant::now();
        // SAFETY: both buffers hold `bytes` bytes; synchronized before reuse.
        unsafe { d.copy_htod_async(dev.ptr(), host.ptr(), bytes, StreamId::DEFAULT)? };
        d.stream_synchronize(StreamId::DEFAULT)?;
        h2d.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
        let t = Instant::now();
        // SAFETY: as above.
        unsafe { d.copy_dtoh_async(host.ptr(), dev.ptr(), bytes, StreamId::DEFAULT)? };
        d.stream_synchronize(StreamId::DEFAULT)?;
        d2h.push(bytes as f64 / t.elapsed().as_secs_f64() / 1e9);
    }
    // The first of six is a warm-up.
    Ok((median(h2d[1..].to_vec()), median(d2h[1..].to_vec())))
}

/// Write a distinct, checkable pattern into every segment: the whole segment
/// filled with one byte, then its first and last KiB from a seeded sequence.
fn fill(d: &dyn Driver, segs: &[Segment]) -> Result<()> {
    for (i, s) in segs.iter().enumerate() {
        // SAFETY: the segment is awake and `committed` bytes long.
        unsafe {
            d.memset_async(
                s.ptr(),
                (i * 37 + 1) as u8,
                s.committed(),
                StreamId::DEFAULT,
            )?
        };
        let edge = edge_bytes(i, s.committed().min(1024));
        let tail = s.committed() - edge.len();
        // SAFETY: both writes lie inside the awake segment.
        unsafe {
            copy_to_device(d, s.ptr(), &edge)?;
            copy_to_device(d, s.ptr() + tail as u64, &edge)?;
        }
    }
    Ok(())
}

fn edge_bytes(i: usize, n: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9e3779b97f4a7c15);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Check the pattern of `fill` at the edges and in the middle of every segment.
fn verify(d: &dyn Driver, segs: &[Segment]) -> Result<()> {
    for (i, s) in segs.iter().enumerate() {
        let n = s.committed().min(1024);
        let want = edge_bytes(i, n);
        let mut got = vec![0u8; n];
        let mut mid = [0u8; 64];
        let tail = s.committed() - n;
        let mid_at = (s.committed() / 2).min(s.committed().saturating_sub(64));
        // SAFETY: the reads lie inside the awake segment.
        unsafe { copy_to_host(d, &mut got, s.ptr())? };
        let head_ok = got == want;
        // SAFETY: as above.
        unsafe { copy_to_host(d, &mut got, s.ptr() + tail as u64)? };
        let tail_ok = got == want;
        let mid_ok = if s.committed() > 2 * n + 64 {
            // SAFETY: as above.
            unsafe { copy_to_host(d, &mut mid, s.ptr() + mid_at as u64)? };
            mid.iter().all(|&b| b == (i * 37 + 1) as u8)
        } else {
            true
        };
        if !(head_ok && tail_ok && mid_ok) {
            return Err(Error::InvalidState(format!(
                "segment {i} at {:#x}: contents differ after wake (head {head_ok}, tail {tail_ok}, middle {mid_ok})",
                s.ptr()
            )));
        }
    }
    Ok(())
}

/// One row of the result table.
#[derive(Debug, serde::Serialize)]
pub struct Row {
    /// What was measured.
    pub what: String,
    /// Seconds.
    pub seconds: f64,
    /// GB/s over the bytes moved or released.
    pub gb_per_s: f64,
    /// Against the relevant link direction (or the target's unit), when meaningful.
    pub ratio: Option<f64>,
    /// The target this row is judged against.
    pub target: String,
}

/// Options of `vmmw bench-sleep`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: crate::backend::BackendArgs,
    /// Divide every segment size by this (1 = the full 16.4 GB model).
    #[arg(long, default_value_t = 1)]
    scale_div: usize,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Draw the results as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<std::path::PathBuf>,
    /// A checkpoint (file or folder) to load into the pool for the Reload rows:
    /// load it, sleep with Reload (the host keeps only bytes the load did not write), time the wake from the page cache.
    #[arg(long)]
    pub reload_checkpoint: Option<std::path::PathBuf>,
}

/// Run the benchmark.
pub fn run(args: Args) -> Result<()> {
    let opened = args.backend.open()?;
    let d = &opened.driver;
    outln!("backend: {}", d.kind());
    outln!("  device: {}", d.describe());
    outln!("  why:    {}", opened.reason);
    bench(
        opened.driver,
        &opened.reason,
        args.scale_div,
        args.json.as_deref(),
        args.reload_checkpoint.as_deref(),
    )
}

/// The Reload rows: load `path` into a pool, sleep with Reload, time the
/// sleep (whose device hashes prove the loaded bytes unchanged; their cost is
/// timed alone too) and the wake from the page cache; then change a tenth of
/// the loaded bytes in place, as a weight update does, and time the sleep
/// that keeps them in the host backup and the wake that restores them.
/// Each wake is checked against what the tensors held before their sleep.
fn reload_rows(d: &Arc<dyn Driver>, path: &std::path::Path, h2d: f64) -> Result<Vec<Row>> {
    use vmmweights::loader::Session;
    use vmmweights::{tag, Pool, PoolConfig};
    let pool = Pool::new(d.clone(), PoolConfig::default())?;
    let weights = tag::id("weights")?;
    let session = Session::open(path)?;
    session.allocate(&pool, weights)?;
    let reg = session.destinations();
    let t = Instant::now();
    // The load also registers itself as the weights' reload source.
    let plan = session.load(&pool, None)?;
    let load_s = t.elapsed().as_secs_f64();
    let st = &plan.stats;
    outln!(
        "reload: first load of the checkpoint: {:.3} s; copied from the page cache {} B (streamed {}), read with pread (not in the page cache) {} B, ring {} MiB ({}, {:.3} s)",
        load_s,
        st.staged_bytes,
        st.streamed_bytes,
        st.read_bytes,
        st.ring_bytes >> 20,
        if st.ring_reused { "reused" } else { "pinned now" },
        st.ring_seconds
    );
    let bytes: f64 = reg.iter().map(|x| x.bytes() as f64).sum();
    // The first and last 4 KiB of every tensor, to check each wake.
    let probe = || -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        for x in reg.iter() {
            let n = x.bytes().min(4096);
            for at in [x.ptr, x.ptr + (x.bytes() - n) as u64] {
                let mut v = vec![0u8; n];
                // SAFETY: `n` bytes of a loaded, awake destination; nothing sleeps it meanwhile.
                unsafe { pool.read(at, &mut v) }?;
                out.push((at, v));
            }
        }
        Ok(out)
    };
    let check = |want: &[(u64, Vec<u8>)], what: &str| -> Result<()> {
        for (ptr, want) in want {
            let mut got = vec![0u8; want.len()];
            // SAFETY: as above, after wake.
            unsafe { pool.read(*ptr, &mut got)? };
            if &got != want {
                return Err(Error::InvalidState(format!(
                    "tensor bytes at {ptr:#x} differ after the {what}"
                )));
            }
        }
        Ok(())
    };
    // What the proof alone costs: hashing every loaded byte on the device.
    let coverage = pool.reload_coverage(weights);
    let t = Instant::now();
    // SAFETY: the coverage lies in loaded, awake destinations; the load has completed.
    unsafe { d.hash_ranges(&coverage) }?;
    let hash_s = t.elapsed().as_secs_f64();
    let hashed: f64 = coverage.iter().map(|&(_, l)| l as f64).sum();

    let before = probe()?;
    let slept = pool.sleep(&[(weights, Policy::Reload)])?;
    // The Reload sleep starts pinning the checkpoint's page cache in the
    // background; a wake that comes later DMAs straight from it.
    let t = Instant::now();
    pool.sleep_engine().wait_reload_prepared(weights);
    outln!(
        "reload: checkpoint page cache pinned {:.3} s after the sleep returned (background); {} B changed",
        t.elapsed().as_secs_f64(),
        slept[0].report.changed_bytes
    );
    let woke = pool.wake(&[weights])?;
    check(&before, "Reload wake")?;

    // A weight update: every tenth tensor (by count) rewritten in place.
    let mut changed = 0u64;
    for x in reg.iter().step_by(10) {
        // SAFETY: a loaded, awake destination; synchronized below.
        unsafe { d.memset_async(x.ptr, 0x5A, x.bytes(), StreamId::DEFAULT) }?;
        changed += x.bytes() as u64;
    }
    d.synchronize()?;
    let updated = probe()?;
    let slept2 = pool.sleep(&[(weights, Policy::Reload)])?;
    pool.sleep_engine().wait_reload_prepared(weights);
    let woke2 = pool.wake(&[weights])?;
    check(&updated, "Reload wake after an update")?;
    let (s2, w2) = (&slept2[0].report, &woke2[0].report);
    outln!(
        "reload: after updating {changed} B in place: {} B found changed, {} B kept in the backup; wake reloaded {} B and copied {} B back",
        s2.changed_bytes, s2.copied_bytes, w2.reloaded_bytes, w2.copied_bytes
    );
    if s2.changed_bytes < changed {
        return Err(Error::InvalidState(format!(
            "the sleep found {} changed bytes of the {changed} updated",
            s2.changed_bytes
        )));
    }
    let row = |what: &str, secs: f64, bytes: f64, link: Option<f64>, target: &str| Row {
        what: what.to_owned(),
        seconds: secs,
        gb_per_s: bytes / secs / 1e9,
        ratio: link.map(|l| bytes / secs / 1e9 / l),
        target: target.to_owned(),
    };
    Ok(vec![
        row(
            "ours: first load in the process (page cache as found)",
            load_s,
            bytes,
            Some(h2d),
            "-",
        ),
        row(
            "ours: proof of the loaded bytes (device hash)",
            hash_s,
            hashed,
            None,
            "<= 0.030 s",
        ),
        row(
            "ours: sleep with Reload (host keeps unloaded bytes only)",
            slept[0].report.seconds,
            bytes,
            None,
            "-",
        ),
        row(
            "ours: Reload wake from the page cache",
            woke[0].report.seconds,
            bytes,
            Some(h2d),
            ">= 0.90 of h2d",
        ),
        row(
            "ours: sleep with Reload, a tenth updated",
            s2.seconds,
            bytes,
            None,
            "-",
        ),
        row(
            "ours: Reload wake, a tenth from the backup",
            w2.seconds,
            bytes,
            Some(h2d),
            ">= 0.90 of h2d",
        ),
    ])
}

fn bench(
    d: Arc<dyn Driver>,
    reason: &str,
    scale_div: usize,
    json: Option<&std::path::Path>,
    reload: Option<&std::path::Path>,
) -> Result<()> {
    if d.kind() != BackendKind::Cuda {
        return Err(Error::Unsupported(format!(
            "bench-sleep measures the GPU link and needs the cuda backend (got {}); run it on the GPU machine",
            d.kind()
        )));
    }
    let sizes = model_segments(scale_div);
    let total: usize = sizes.iter().sum();
    let gb = total as f64 / 1e9;
    outln!("device: {}", d.describe());
    outln!("model: {} segments, {:.2} GB", sizes.len(), gb);
    let (h2d, d2h) = link_bandwidth(&d, (2usize << 30) / scale_div.max(1))?;
    outln!("link: host->device {h2d:.1} GB/s, device->host {d2h:.1} GB/s (pinned, median of 5)");
    let mut rows: Vec<Row> = Vec::new();
    let row = |what: &str, secs: f64, bytes: f64, link: Option<f64>, target: &str| Row {
        what: what.to_owned(),
        seconds: secs,
        gb_per_s: bytes / secs / 1e9,
        ratio: link.map(|l| bytes / secs / 1e9 / l),
        target: target.to_owned(),
    };

    let mut segs: Vec<Segment> = sizes
        .iter()
        .map(|&s| Segment::allocate(d.clone(), s, 0))
        .collect::<Result<_>>()?;
    let bytes = segs.iter().map(|s| s.committed()).sum::<usize>() as f64;
    fill(d.as_ref(), &segs)?;

    // Reference: pinned memory allocated per segment at sleep time, one
    // synchronous copy per segment; copies back at wake.
    let t = Instant::now();
    let mut backups = Vec::new();
    for s in segs.iter_mut() {
        let p = PinnedHost::driver_allocated(&d, s.committed())?;
        // SAFETY: both sides hold `committed` bytes; synchronized right after.
        unsafe { d.copy_dtoh_async(p.ptr(), s.ptr(), p.len(), StreamId::DEFAULT)? };
        d.stream_synchronize(StreamId::DEFAULT)?;
        s.unmap_all()?;
        backups.push(p);
    }
    let ref_sleep = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for (s, p) in segs.iter_mut().zip(&backups) {
        s.map_all()?;
        // SAFETY: the segment was just mapped; both sides hold `len` bytes.
        unsafe { d.copy_htod_async(s.ptr(), p.ptr(), p.len(), StreamId::DEFAULT)? };
        d.stream_synchronize(StreamId::DEFAULT)?;
    }
    let ref_wake = t.elapsed().as_secs_f64();
    drop(backups);
    verify(d.as_ref(), &segs)?;
    rows.push(row(
        "reference sleep (pin per segment at sleep)",
        ref_sleep,
        bytes,
        Some(d2h),
        "-",
    ));
    rows.push(row("reference wake", ref_wake, bytes, Some(h2d), "-"));

    // Ours: first sleep pins as it goes; later sleeps reuse the arena.
    let engine = SleepEngine::new(d.clone(), SleepOptions::default());
    let mut refs: Vec<&mut Segment> = segs.iter_mut().collect();
    let first = engine.sleep(TagId(1), &mut refs, Policy::Offload)?;
    let wake1 = engine.wake(TagId(1), &mut refs)?;
    let mut later = Vec::new();
    let mut wakes = vec![wake1.seconds];
    for _ in 0..3 {
        later.push(engine.sleep(TagId(1), &mut refs, Policy::Offload)?.seconds);
        wakes.push(engine.wake(TagId(1), &mut refs)?.seconds);
    }
    // Variants of the copy pipeline, with the backup present.
    let base = engine.options();
    let mut variants = Vec::new();
    for (piece, streams, chunk) in [
        (64usize << 20, 2usize, 256usize << 20),
        (256 << 20, 2, 256 << 20),
        (64 << 20, 4, 256 << 20),
        (64 << 20, 2, 1 << 30),
    ] {
        engine.set_options(SleepOptions {
            copy_piece_bytes: piece / scale_div.max(1),
            streams,
            wake_coalesce_bytes: chunk / scale_div.max(1),
            ..base.clone()
        });
        let (mut s, mut w) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            s.push(engine.sleep(TagId(1), &mut refs, Policy::Offload)?.seconds);
            w.push(engine.wake(TagId(1), &mut refs)?.seconds);
        }
        variants.push((piece >> 20, streams, chunk >> 20, median(s), median(w)));
    }
    engine.set_options(base);
    drop(refs);
    verify(d.as_ref(), &segs)?;
    for (piece, streams, chunk, s, w) in &variants {
        let label = format!("piece {piece} MiB, {streams} streams, wake chunk {chunk} MiB");
        rows.push(row(
            &format!("variant {label}: sleep"),
            *s,
            bytes,
            Some(d2h),
            "-",
        ));
        rows.push(row(
            &format!("variant {label}: wake"),
            *w,
            bytes,
            Some(h2d),
            "-",
        ));
    }
    rows.push(row(
        "ours: first sleep, no reserve-ahead",
        first.seconds,
        bytes,
        Some(d2h),
        &format!(">= 10x reference ({:.1}x)", ref_sleep / first.seconds),
    ));
    rows.push(row(
        "ours: later sleep (median of 3)",
        median(later),
        bytes,
        Some(d2h),
        ">= 0.95 of d2h",
    ));
    rows.push(row(
        "ours: wake (median of 4)",
        median(wakes),
        bytes,
        Some(h2d),
        ">= 0.95 of h2d",
    ));
    drop(engine);

    // Reserve-ahead, then the first sleep.
    let engine = SleepEngine::new(d.clone(), SleepOptions::default());
    let t = Instant::now();
    engine.reserve_backup(bytes as u64)?;
    let reserve = t.elapsed().as_secs_f64();
    let mut refs: Vec<&mut Segment> = segs.iter_mut().collect();
    let after_reserve = engine.sleep(TagId(1), &mut refs, Policy::Offload)?;
    engine.wake(TagId(1), &mut refs)?;
    drop(refs);
    verify(d.as_ref(), &segs)?;
    rows.push(row(
        "ours: reserve-ahead of the backup (pinning)",
        reserve,
        bytes,
        None,
        "-",
    ));
    rows.push(row(
        "ours: first sleep after reserve-ahead",
        after_reserve.seconds,
        bytes,
        Some(d2h),
        ">= 0.95 of d2h",
    ));
    drop(engine);

    // Discard-only sleep, PyTorch path shape (one segment per allocation).
    let engine = SleepEngine::new(d.clone(), SleepOptions::default());
    let mut refs: Vec<&mut Segment> = segs.iter_mut().collect();
    let disc = engine.sleep(TagId(2), &mut refs, Policy::Discard)?;
    engine.wake(TagId(2), &mut refs)?;
    drop(refs);
    rows.push(row(
        &format!(
            "ours: discard sleep, {} segments (PyTorch path)",
            segs.len()
        ),
        disc.seconds,
        bytes,
        None,
        "<= 0.050 s",
    ));
    drop(segs);

    // Discard-only sleep of a native arena: one reservation, 1 GiB chunks.
    let mut arena = Segment::allocate(d.clone(), total, (1usize << 30) / scale_div.max(1))?;
    let chunks = arena.chunks().len();
    let t = Instant::now();
    let disc_arena = engine.sleep(TagId(3), &mut [&mut arena], Policy::Discard)?;
    let _ = t;
    engine.wake(TagId(3), &mut [&mut arena])?;
    rows.push(row(
        &format!("ours: discard sleep, native arena ({chunks} chunks)"),
        disc_arena.seconds,
        arena.committed() as f64,
        None,
        "<= 0.015 s",
    ));
    drop(arena);
    drop(engine);

    if let Some(path) = reload {
        rows.extend(reload_rows(&d, path, h2d)?);
    }

    outln!();
    outln!(
        "{:<52} {:>9} {:>9} {:>7}  target",
        "what",
        "seconds",
        "GB/s",
        "ratio"
    );
    for r in &rows {
        outln!(
            "{:<52} {:>9.4} {:>9.2} {:>7}  {}",
            r.what,
            r.seconds,
            r.gb_per_s,
            r.ratio.map_or("-".to_owned(), |x| format!("{x:.3}")),
            r.target
        );
    }
    if let Some(path) = json {
        let doc = serde_json::json!({
            "backend": d.kind().to_string(),
            "device": d.describe(),
            "reason": reason,
            "bytes": bytes,
            "segments": sizes.len(),
            "link_h2d_gbps": h2d,
            "link_d2h_gbps": d2h,
            "rows": rows,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| Error::io(path, e))?;
    }
    Ok(())
}
