//! How `vmmw demo` ends: the memory timeline as a table (and a chart when
//! asked), the verdict, and the JSON document.

use std::path::Path;
use std::sync::Arc;

use serde_json::{json, Value};
use vmmweights::report::Timeline;
use vmmweights::Driver;

use crate::exit::CliResult;
use crate::output::escape_controls;

/// Print the timeline and the verdict, draw the chart, and return the document.
pub fn finish(
    d: &Arc<dyn Driver>,
    reason: &str,
    chart: Option<&Path>,
    timeline: Timeline,
) -> CliResult<Value> {
    outln!("\n{}", escape_controls(&timeline.to_string()));
    if let Some(path) = chart {
        let title = format!("vmmw demo on {}: load, sleep, wake, reload", d.describe());
        crate::chart::timeline(path, &title, &timeline)?;
        outln!("chart: {}", path.display());
    }
    outln!(
        "demo: OK: every weight byte verified after offload and reload cycles, pointers unchanged"
    );
    Ok(json!({
        "backend": d.kind().to_string(),
        "device": d.describe(),
        "reason": reason,
        "verified": true,
        "timeline": timeline,
    }))
}
