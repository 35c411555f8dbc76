//! `vmmw bench-alloc`: what a VMM segment costs to allocate and free, against
//! the classic allocator (`cuMemAlloc`/`cuMemFree`, what `cudaMalloc`/`cudaFree`
//! call) for the same sizes, in the same run, medians over N iterations.
//! Methods are interleaved inside each iteration so drift hits them alike.

use std::sync::Arc;
use std::time::{Duration, Instant};

use vmmweights::driver::cuda::CudaDriver;
use vmmweights::driver::host::{HostConfig, HostDriver};
use vmmweights::units::parse_bytes;
use vmmweights::{BackendChoice, Driver, Error, Result, Segment};

use crate::backend::BackendArgs;

/// Options of `vmmw bench-alloc`.
#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(flatten)]
    pub backend: BackendArgs,
    /// Timed iterations per size and method.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Sizes, comma-separated, with K/M/G suffixes.
    #[arg(long, default_value = "2M,20M,256M,4G", value_delimiter = ',', value_parser = crate::parse::size_text)]
    sizes: Vec<String>,
    /// Chunk size of the chunked-segment variant (run for sizes above it).
    #[arg(long, default_value = "2M", value_parser = crate::parse::size_text)]
    chunk: String,
    /// Write the results as JSON to FILE; `--json` alone (or `--json -`) prints
    /// them on stdout and moves the other lines to stderr.
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "-")]
    pub json: Option<std::path::PathBuf>,
    /// Draw the results as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<std::path::PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Method {
    /// cuMemAlloc + cuMemFree.
    CuMemAlloc,
    /// Segment::allocate with one physical chunk, then drop.
    SegmentOneChunk,
    /// Segment::allocate in chunks of `--chunk` bytes, then drop.
    SegmentChunked,
}

impl Method {
    fn label(self, chunk: usize) -> String {
        match self {
            Method::CuMemAlloc => "cuMemAlloc/cuMemFree".to_owned(),
            Method::SegmentOneChunk => "segment, 1 chunk".to_owned(),
            Method::SegmentChunked => format!("segment, {} MiB chunks", chunk >> 20),
        }
    }
}

#[derive(Debug, serde::Serialize)]
struct Row {
    size: u64,
    method: Method,
    label: String,
    chunks: usize,
    alloc_us_median: f64,
    free_us_median: f64,
    total_us_median: f64,
    /// total_us_median / cuMemAlloc's total_us_median for this size; None without a baseline.
    ratio_vs_cumemalloc: Option<f64>,
    total_us_samples: Vec<f64>,
}

#[derive(Debug, serde::Serialize)]
struct Report {
    unix_time: u64,
    backend: String,
    device: String,
    reason: String,
    iters: usize,
    warmup: usize,
    chunk_bytes: usize,
    rows: Vec<Row>,
}

/// The driver under test, with the concrete CUDA driver kept for the baseline.
struct Bench {
    driver: Arc<dyn Driver>,
    cuda: Option<Arc<CudaDriver>>,
    reason: String,
}

fn open(args: &BackendArgs) -> Result<Bench> {
    let (choice, source) = args.choice()?;
    let cuda = |why: String| -> Result<Bench> {
        let c = Arc::new(CudaDriver::open(args.device)?);
        Ok(Bench {
            driver: c.clone(),
            cuda: Some(c),
            reason: why,
        })
    };
    let host = |why: String| -> Result<Bench> {
        Ok(Bench {
            driver: Arc::new(HostDriver::new(HostConfig::from_env()?)),
            cuda: None,
            reason: why,
        })
    };
    match choice {
        BackendChoice::Cuda => cuda(format!("{source}: cuda requested")),
        BackendChoice::Host => host(format!("{source}: host requested")),
        BackendChoice::Auto => match cuda(format!("{source}: CUDA driver and device found")) {
            Err(Error::DriverUnavailable(why)) => host(format!(
                "{source}: no usable CUDA ({why}); host backend, no cuMemAlloc baseline"
            )),
            r => r,
        },
    }
}

/// One alloc+free; returns (alloc time, free time, chunks).
fn once(b: &Bench, m: Method, size: usize, chunk: usize) -> Result<(Duration, Duration, usize)> {
    match m {
        Method::CuMemAlloc => {
            let c = b.cuda.as_ref().expect("baseline only runs on cuda");
            let t0 = Instant::now();
            let p = c.legacy_alloc(size)?;
            let t1 = Instant::now();
            c.legacy_free(p)?;
            Ok((t1 - t0, t1.elapsed(), 1))
        }
        Method::SegmentOneChunk | Method::SegmentChunked => {
            let cs = if m == Method::SegmentChunked {
                chunk
            } else {
                0
            };
            let t0 = Instant::now();
            let seg = Segment::allocate(b.driver.clone(), size, cs)?;
            let t1 = Instant::now();
            let n = seg.chunks().len();
            drop(seg);
            Ok((t1 - t0, t1.elapsed(), n))
        }
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

pub fn run(args: Args) -> Result<()> {
    if args.iters == 0 {
        return Err(Error::InvalidArgument("--iters must be at least 1".into()));
    }
    let parse = |s: &str| {
        parse_bytes(s)
            .map(|n| n as usize)
            .map_err(|e| Error::InvalidArgument(format!("size `{s}`: {e}")))
    };
    let sizes = args
        .sizes
        .iter()
        .map(|s| parse(s))
        .collect::<Result<Vec<_>>>()?;
    let chunk = parse(&args.chunk)?;
    if sizes.contains(&0) || chunk == 0 {
        return Err(Error::InvalidArgument(
            "sizes and --chunk must be non-zero".into(),
        ));
    }
    let b = open(&args.backend)?;
    outln!("backend: {}", b.driver.kind());
    outln!("  device: {}", b.driver.describe());
    outln!("  why:    {}", b.reason);
    outln!(
        "  {} timed iterations after {} warm-up, methods interleaved; times are wall clock per call, \
         free includes the device synchronize both paths do",
        args.iters, args.warmup
    );

    let mut rows = Vec::new();
    for &size in &sizes {
        let mut methods = vec![Method::SegmentOneChunk];
        if b.cuda.is_some() {
            methods.insert(0, Method::CuMemAlloc);
        }
        if size > chunk {
            methods.push(Method::SegmentChunked);
        }
        let mut alloc = vec![Vec::new(); methods.len()];
        let mut free = vec![Vec::new(); methods.len()];
        let mut chunks = vec![0; methods.len()];
        for it in 0..args.warmup + args.iters {
            for (k, &m) in methods.iter().enumerate() {
                let (a, f, n) = once(&b, m, size, chunk)?;
                if it >= args.warmup {
                    alloc[k].push(us(a));
                    free[k].push(us(f));
                    chunks[k] = n;
                }
            }
        }
        let mut base_total = None;
        for (k, &m) in methods.iter().enumerate() {
            let mut total: Vec<f64> = alloc[k].iter().zip(&free[k]).map(|(a, f)| a + f).collect();
            let samples = total.clone();
            let total_med = median(&mut total);
            if m == Method::CuMemAlloc {
                base_total = Some(total_med);
            }
            rows.push(Row {
                size: size as u64,
                method: m,
                label: m.label(chunk),
                chunks: chunks[k],
                alloc_us_median: median(&mut alloc[k]),
                free_us_median: median(&mut free[k]),
                total_us_median: total_med,
                ratio_vs_cumemalloc: base_total.map(|base| total_med / base),
                total_us_samples: samples,
            });
        }
    }

    print_table(&rows);
    if let Some(path) = &args.json {
        let report = Report {
            unix_time: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            backend: b.driver.kind().to_string(),
            device: b.driver.describe(),
            reason: b.reason.clone(),
            iters: args.iters,
            warmup: args.warmup,
            chunk_bytes: chunk,
            rows,
        };
        let text = serde_json::to_string_pretty(&report)
            .map_err(|e| Error::InvalidState(format!("serializing the report: {e}")))?;
        std::fs::write(path, text).map_err(|e| Error::io(path, e))?;
        outln!("wrote {}", path.display());
    }
    Ok(())
}

fn human(size: u64) -> String {
    if size >= 1 << 30 && size.is_multiple_of(1 << 30) {
        format!("{} GiB", size >> 30)
    } else if size >= 1 << 20 && size.is_multiple_of(1 << 20) {
        format!("{} MiB", size >> 20)
    } else {
        format!("{size} B")
    }
}

fn print_table(rows: &[Row]) {
    outln!(
        "| size | method | chunks | alloc median (us) | free median (us) | alloc+free median (us) | vs cuMemAlloc |"
    );
    outln!("|---|---|---:|---:|---:|---:|---:|");
    for r in rows {
        outln!(
            "| {} | {} | {} | {:.1} | {:.1} | {:.1} | {} |",
            human(r.size),
            r.label,
            r.chunks,
            r.alloc_us_median,
            r.free_us_median,
            r.total_us_median,
            r.ratio_vs_cumemalloc
                .map_or("n/a".to_owned(), |x| format!("{x:.2}x"))
        );
    }
}
