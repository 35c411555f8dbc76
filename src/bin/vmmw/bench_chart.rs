//! `--chart FILE.svg` for the benchmarks: the checks every benchmark runs
//! before device work, and its results (the JSON document it writes) drawn as
//! labelled bars with the link or the baseline as reference lines.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::backend::BackendArgs;
use crate::chart::{self, Bar};
use crate::exit::{CliError, CliResult};
use crate::output::ScratchFile;

/// The shared options' checks, and where the chart's data will come from.
pub struct Prepared {
    chart: Option<PathBuf>,
    data: Option<PathBuf>,
    _scratch: Option<ScratchFile>,
}

/// Check `backend` and `chart` before any device work; when a chart is wanted
/// and `json` names no file, point `json` at a scratch file the chart reads.
pub fn prepare(
    backend: &BackendArgs,
    chart: &Option<PathBuf>,
    json: &mut Option<PathBuf>,
) -> CliResult<Prepared> {
    backend.check()?;
    let Some(c) = chart else {
        return Ok(Prepared {
            chart: None,
            data: None,
            _scratch: None,
        });
    };
    let chart = chart::check_path(c)?;
    if let Some(j) = json {
        return Ok(Prepared {
            chart: Some(chart),
            data: Some(j.clone()),
            _scratch: None,
        });
    }
    let f = std::env::temp_dir().join(format!("vmmw-chart-{}.json", std::process::id()));
    *json = Some(f.clone());
    Ok(Prepared {
        chart: Some(chart),
        data: Some(f.clone()),
        _scratch: Some(ScratchFile(f)),
    })
}

/// Which benchmark's document to draw.
#[derive(Clone, Copy)]
pub enum Bench {
    /// bench-alloc: microseconds per allocate+free, per size and method.
    Alloc,
    /// bench-pool: nanoseconds per cached pair, per size.
    Pool,
    /// bench-load: GB/s per strategy and cache state, against the link.
    Load,
    /// bench-sleep: GB/s per row, against the link both ways.
    Sleep,
}

impl Prepared {
    /// Draw the chart, when one was asked for, from the document the benchmark wrote.
    pub fn draw(&self, bench: Bench) -> CliResult<()> {
        let (Some(chart), Some(data)) = (&self.chart, &self.data) else {
            return Ok(());
        };
        let text = std::fs::read_to_string(data).map_err(|e| {
            CliError::failure(format!("reading the results {}: {e}", data.display()))
        })?;
        let doc: Value = serde_json::from_str(&text).map_err(|e| {
            CliError::failure(format!("the results {} are not JSON: {e}", data.display()))
        })?;
        draw(chart, bench, &doc)?;
        eprintln!("chart: {}", chart.display());
        Ok(())
    }
}

fn num(v: &Value, key: &str) -> f64 {
    v.get(key).and_then(Value::as_f64).unwrap_or(f64::NAN)
}

fn text(v: &Value, key: &str) -> String {
    v.get(key).and_then(Value::as_str).unwrap_or("?").to_owned()
}

fn rows<'a>(doc: &'a Value, key: &str) -> &'a [Value] {
    doc.get(key)
        .and_then(Value::as_array)
        .map_or(&[], |v| v.as_slice())
}

/// Draw `doc` (as `bench` writes it) to `path`.
pub fn draw(path: &Path, bench: Bench, doc: &Value) -> CliResult<()> {
    let device = text(doc, "device");
    let size = |r: &Value| vmmweights::report::human_bytes(num(r, "size") as u64);
    match bench {
        Bench::Alloc => {
            let bars: Vec<Bar> = rows(doc, "rows")
                .iter()
                .map(|r| Bar {
                    label: format!("{} {}", size(r), text(r, "label")),
                    value: num(r, "total_us_median"),
                })
                .collect();
            chart::bars(
                path,
                &format!("bench-alloc on {device}: allocate + free"),
                "microseconds (median), lower is better",
                &bars,
                &[],
            )
        }
        Bench::Pool => {
            let bars: Vec<Bar> = rows(doc, "rows")
                .iter()
                .map(|r| Bar {
                    label: size(r),
                    value: num(r, "pair_ns_median"),
                })
                .collect();
            chart::bars(
                path,
                &format!("bench-pool on {device}: cached alloc + free pair"),
                "nanoseconds (median), lower is better",
                &bars,
                &[],
            )
        }
        Bench::Load => {
            let bars: Vec<Bar> = rows(doc, "runs")
                .iter()
                .map(|r| Bar {
                    label: format!("{} ({})", text(r, "label"), text(r, "cache")),
                    value: num(r, "gbps"),
                })
                .collect();
            let mut refs = vec![("host to device link".to_owned(), num(doc, "link_htod_gbps"))];
            let disk = num(doc, "disk_read_gbps");
            if disk.is_finite() {
                refs.push(("disk read".to_owned(), disk));
            }
            chart::bars(
                path,
                &format!("bench-load on {device}"),
                "GB/s, higher is better",
                &bars,
                &refs,
            )
        }
        Bench::Sleep => {
            let bars: Vec<Bar> = rows(doc, "rows")
                .iter()
                .map(|r| Bar {
                    label: text(r, "what"),
                    value: num(r, "gb_per_s"),
                })
                .collect();
            chart::bars(
                path,
                &format!("bench-sleep on {device}"),
                "GB/s, higher is better",
                &bars,
                &[
                    ("link host to device".to_owned(), num(doc, "link_h2d_gbps")),
                    ("link device to host".to_owned(), num(doc, "link_d2h_gbps")),
                ],
            )
        }
    }
}
