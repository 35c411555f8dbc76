//! `vmmw report`: a saved memory timeline as a table, a chart, or JSON.
//! Reads the timeline that `demo --json` and `load --json` print (the
//! document's "timeline"), or a bare timeline as `Timeline::to_json` writes it
//! (the C API's and the Python helper's timeline JSON), so a run on the GPU
//! machine can be drawn anywhere.

use serde_json::Value;
use vmmweights::report::Timeline;

use crate::exit::{CliError, CliResult};
use crate::output::escape_controls;

/// Options of `vmmw report`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// A JSON file holding a timeline (`-` for stdin).
    file: std::path::PathBuf,
    /// Draw the timeline as an SVG chart to FILE.svg.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<std::path::PathBuf>,
    /// The chart's title.
    #[arg(long, default_value = "memory timeline")]
    title: String,
    /// Print the timeline as one JSON document (docs/CLI.md) instead of the table.
    #[arg(long)]
    pub json: bool,
}

fn read(path: &std::path::Path) -> CliResult<Timeline> {
    let text = if path.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| CliError::bad_input(format!("reading the timeline from stdin: {e}")))?
    } else {
        std::fs::read_to_string(path)
            .map_err(|e| CliError::bad_input(format!("{}: cannot read it: {e}", path.display())))?
    };
    let bad = |e: String| {
        CliError::bad_input(format!(
            "{}: expected JSON holding a timeline (a document with \"timeline\", as `vmmw demo --json` prints, or {{\"boundaries\": [...]}}): {e}",
            path.display()
        ))
    };
    let doc: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let tl = match doc.get("timeline") {
        Some(t) => t.clone(),
        None => doc,
    };
    serde_json::from_value(tl).map_err(|e| bad(e.to_string()))
}

pub fn run(a: Args) -> CliResult<Value> {
    let chart = a
        .chart
        .as_deref()
        .map(crate::chart::check_path)
        .transpose()?;
    let tl = read(&a.file)?;
    out!("{}", escape_controls(&tl.to_string()));
    if let Some(path) = &chart {
        crate::chart::timeline(path, &a.title, &tl)?;
        outln!("chart: {}", path.display());
    }
    Ok(serde_json::json!({ "timeline": tl }))
}
