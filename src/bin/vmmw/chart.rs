//! Pictures as SVG files (plotters, SVG backend, no system fonts): a pool's
//! timeline (live, reserved and tracked bytes per tag over the snapshot steps,
//! sleeping steps shaded) and a benchmark's results as labelled bars.

use std::path::{Path, PathBuf};

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use vmmweights::report::{Boundary, TagUsage, Timeline};

use crate::exit::{CliError, CliResult};
use crate::output::escape_name;

/// Check a `--chart` path before any device work: it ends in `.svg` and its
/// folder exists.
pub fn check_path(p: &Path) -> CliResult<PathBuf> {
    let svg = p.extension().is_some_and(|e| e.eq_ignore_ascii_case("svg"));
    if !svg {
        return Err(CliError::bad_input(format!(
            "--chart `{}`: expected a file name ending in .svg",
            p.display()
        )));
    }
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        return Err(CliError::bad_input(format!(
            "--chart `{}`: expected a file in an existing folder; `{}` is not a folder",
            p.display(),
            dir.display()
        )));
    }
    Ok(p.to_owned())
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(230, 120, 20),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw_err(path: &Path, e: impl std::fmt::Display) -> CliError {
    CliError::failure(format!("drawing the chart {}: {e}", path.display()))
}

/// The unit bytes are drawn in, so that the largest value reads well.
fn unit_for(max: u64) -> (&'static str, f64) {
    match max {
        m if m >= 4 << 30 => ("GiB", (1u64 << 30) as f64),
        m if m >= 4 << 20 => ("MiB", (1u64 << 20) as f64),
        m if m >= 4 << 10 => ("KiB", 1024.0),
        _ => ("bytes", 1.0),
    }
}

/// A value with three significant digits or more ("0.912", "12.4", "3185").
fn short_number(v: f64) -> String {
    match v.abs() {
        x if x >= 100.0 => format!("{v:.0}"),
        x if x >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.3}"),
    }
}

fn shorten(s: &str, max: usize) -> String {
    let s = escape_name(s);
    if s.chars().count() <= max {
        s
    } else {
        s.chars().take(max - 1).collect::<String>() + "…"
    }
}

/// Draw `tl` to `path`, in two panels over the same steps. Above: physical
/// memory, per tag tracked bytes (solid) and live bytes (dots), and the total
/// host backup (grey). Below: reserved address space per tag (dashed). Steps
/// where a tag sleeps are shaded and labelled in both; the steps' names are
/// listed underneath.
pub fn timeline(path: &Path, title: &str, tl: &Timeline) -> CliResult<()> {
    let steps = &tl.boundaries;
    if steps.is_empty() {
        return Err(CliError::bad_input(
            "the timeline has no snapshots, so there is nothing to draw",
        ));
    }
    let mut tags: Vec<String> = Vec::new();
    for b in steps {
        for u in &b.report.tags {
            if !tags.contains(&u.tag) {
                tags.push(u.tag.clone());
            }
        }
    }
    let list_h = 40 + 20 * steps.len() as u32;
    let root = SVGBackend::new(path, (1100, 800 + list_h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let root = root
        .titled(&escape_name(title), ("sans-serif", 20))
        .map_err(|e| draw_err(path, e))?;
    let (physical, rest) = root.split_vertically(500);
    let (reserved, list) = rest.split_vertically(270);

    let phys = |u: &TagUsage| [u.tracked_bytes, u.live_bytes];
    let max_phys = steps
        .iter()
        .flat_map(|b| {
            b.report
                .tags
                .iter()
                .flat_map(phys)
                .chain([b.report.total.host_backup_bytes])
        })
        .max()
        .unwrap_or(0);
    let mut lines: Vec<Line> = Vec::new();
    for (k, tag) in tags.iter().enumerate() {
        let color = PALETTE[k % PALETTE.len()];
        let name = shorten(tag, 24);
        lines.push(Line {
            label: format!("{name}: tracked (physically backed)"),
            color,
            style: Style::Solid,
            values: per_step(steps, tag, |u| u.tracked_bytes),
        });
        lines.push(Line {
            label: format!("{name}: live (held by callers)"),
            color,
            style: Style::Dots,
            values: per_step(steps, tag, |u| u.live_bytes),
        });
    }
    lines.push(Line {
        label: "host backup (all tags)".to_owned(),
        color: RGBColor(110, 110, 110),
        style: Style::Solid,
        values: steps
            .iter()
            .map(|b| b.report.total.host_backup_bytes)
            .collect(),
    });
    panel(path, &physical, "device memory", steps, max_phys, &lines)?;

    let max_res = steps
        .iter()
        .flat_map(|b| b.report.tags.iter().map(|u| u.reserved_bytes))
        .max()
        .unwrap_or(0);
    let lines: Vec<Line> = tags
        .iter()
        .enumerate()
        .map(|(k, tag)| Line {
            label: format!("{}: reserved (address space)", shorten(tag, 24)),
            color: PALETTE[k % PALETTE.len()],
            style: Style::Dashed,
            values: per_step(steps, tag, |u| u.reserved_bytes),
        })
        .collect();
    panel(path, &reserved, "address space", steps, max_res, &lines)?;

    let style = ("sans-serif", 14).into_font();
    list.draw(&Text::new("steps:", (30, 10), style.clone()))
        .map_err(|e| draw_err(path, e))?;
    for (i, b) in steps.iter().enumerate() {
        list.draw(&Text::new(
            format!(
                "{:>2}. {} (t = {:.3} s)",
                i + 1,
                shorten(&b.name, 90),
                b.at_s
            ),
            (40, 32 + 20 * i as i32),
            style.clone(),
        ))
        .map_err(|e| draw_err(path, e))?;
    }
    root.present().map_err(|e| draw_err(path, e))
}

enum Style {
    Solid,
    Dots,
    Dashed,
}

struct Line {
    label: String,
    color: RGBColor,
    style: Style,
    values: Vec<u64>,
}

fn per_step(steps: &[Boundary], tag: &str, f: fn(&TagUsage) -> u64) -> Vec<u64> {
    steps
        .iter()
        .map(|b| b.report.tag(tag).map_or(0, f))
        .collect()
}

/// One panel: the lines over the steps, sleeping steps shaded, a legend.
fn panel(
    path: &Path,
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    what: &str,
    steps: &[Boundary],
    max: u64,
    lines: &[Line],
) -> CliResult<()> {
    let n = steps.len() as i32;
    let (unit, div) = unit_for(max);
    // Headroom above the data for the legend (upper right) and the sleep labels.
    let top = (max as f64 / div * 1.6).max(1.0);
    let label_y = (max as f64 / div * 1.1).max(0.5);
    let mut chart = ChartBuilder::on(area)
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(80)
        .build_cartesian_2d((0..n - 1).into_segmented(), 0f64..top)
        .map_err(|e| draw_err(path, e))?;
    let x_label = |x: &SegmentValue<i32>| match x {
        SegmentValue::CenterOf(i) => format!("{}", i + 1),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .x_labels(steps.len())
        .x_label_formatter(&x_label)
        .y_desc(format!("{what} ({unit})"))
        .disable_x_mesh()
        .light_line_style(TRANSPARENT)
        .draw()
        .map_err(|e| draw_err(path, e))?;

    let mut was_asleep = false;
    for (i, b) in steps.iter().enumerate() {
        let asleep: Vec<String> = b
            .report
            .tags
            .iter()
            .filter(|u| u.asleep)
            .map(|u| shorten(&u.tag, 16))
            .collect();
        let i = i as i32;
        let font = ("sans-serif", 12).into_font().color(&RGBColor(60, 70, 150));
        if asleep.is_empty() {
            if was_asleep {
                chart
                    .draw_series([Text::new("wake", (SegmentValue::Exact(i), label_y), font)])
                    .map_err(|e| draw_err(path, e))?;
            }
            was_asleep = false;
            continue;
        }
        was_asleep = true;
        chart
            .draw_series([Rectangle::new(
                [
                    (SegmentValue::Exact(i), 0.0),
                    (SegmentValue::Exact(i + 1), top),
                ],
                RGBColor(120, 140, 220).mix(0.15).filled(),
            )])
            .map_err(|e| draw_err(path, e))?;
        chart
            .draw_series([Text::new(
                format!("sleep: {}", asleep.join(", ")),
                (SegmentValue::Exact(i), label_y),
                font,
            )])
            .map_err(|e| draw_err(path, e))?;
    }

    for line in lines {
        let color = line.color;
        let points: Vec<(SegmentValue<i32>, f64)> = line
            .values
            .iter()
            .enumerate()
            .map(|(i, &v)| (SegmentValue::CenterOf(i as i32), v as f64 / div))
            .collect();
        let drawn = match line.style {
            Style::Solid => chart
                .draw_series(LineSeries::new(points, color.stroke_width(3)))
                .map_err(|e| draw_err(path, e))?
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3))
                }),
            Style::Dashed => chart
                .draw_series(DashedLineSeries::new(points, 8, 5, color.stroke_width(2)))
                .map_err(|e| draw_err(path, e))?
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 8, y)], color.stroke_width(2))
                }),
            Style::Dots => {
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(1)))
                    .map_err(|e| draw_err(path, e))?;
                chart
                    .draw_series(
                        points
                            .into_iter()
                            .map(move |p| Circle::new(p, 4, color.filled())),
                    )
                    .map_err(|e| draw_err(path, e))?
                    .legend(move |(x, y)| Circle::new((x + 10, y), 4, color.filled()))
            }
        };
        drawn.label(line.label.clone());
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()
        .map_err(|e| draw_err(path, e))
}

/// One bar of a results chart.
pub struct Bar {
    /// What was measured.
    pub label: String,
    /// The value, in the chart's unit.
    pub value: f64,
}

/// Draw `bars` as horizontal bars with their values, plus vertical reference
/// lines (a link's speed, a target) labelled at the top.
pub fn bars(
    path: &Path,
    title: &str,
    unit: &str,
    bars: &[Bar],
    references: &[(String, f64)],
) -> CliResult<()> {
    if bars.is_empty() {
        return Err(CliError::failure(
            "the benchmark produced no results to draw",
        ));
    }
    let n = bars.len() as i32;
    let references: Vec<&(String, f64)> = references.iter().filter(|r| r.1.is_finite()).collect();
    let max = bars
        .iter()
        .map(|b| b.value)
        .chain(references.iter().map(|r| r.1))
        .filter(|v| v.is_finite())
        .fold(0.0f64, f64::max);
    let right = (max * 1.18).max(1e-9);
    // Room for the longest label (about 7 px a character at 13 px).
    let longest = bars
        .iter()
        .map(|b| b.label.chars().count().min(70))
        .max()
        .unwrap_or(0);
    let label_area = (longest as u32 * 7 + 24).clamp(80, 520);
    let root = SVGBackend::new(path, (1200, 120 + 28 * bars.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(escape_name(title), ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(label_area)
        .build_cartesian_2d(0f64..right, (0..n - 1).into_segmented())
        .map_err(|e| draw_err(path, e))?;
    let y_label = |y: &SegmentValue<i32>| match y {
        // Top to bottom in the given order.
        SegmentValue::CenterOf(i) if *i < n => shorten(&bars[(n - 1 - i) as usize].label, 70),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .y_labels(bars.len())
        .y_label_formatter(&y_label)
        .x_desc(unit)
        .disable_y_mesh()
        .light_line_style(TRANSPARENT)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    for (k, b) in bars.iter().enumerate() {
        let i = n - 1 - k as i32;
        let v = if b.value.is_finite() {
            b.value.max(0.0)
        } else {
            0.0
        };
        let mut r = Rectangle::new(
            [
                (0.0, SegmentValue::Exact(i)),
                (v, SegmentValue::Exact(i + 1)),
            ],
            PALETTE[0].mix(0.8).filled(),
        );
        r.set_margin(4, 4, 0, 0);
        chart.draw_series([r]).map_err(|e| draw_err(path, e))?;
        chart
            .draw_series([Text::new(
                format!(" {}", short_number(b.value)),
                (v, SegmentValue::CenterOf(i)),
                ("sans-serif", 12),
            )])
            .map_err(|e| draw_err(path, e))?;
    }
    for (k, (name, x)) in references.iter().map(|r| (&r.0, r.1)).enumerate() {
        let color = PALETTE[(k + 1) % PALETTE.len()];
        chart
            .draw_series(DashedLineSeries::new(
                [(x, SegmentValue::Exact(0)), (x, SegmentValue::Exact(n))],
                6,
                4,
                color.stroke_width(2),
            ))
            .map_err(|e| draw_err(path, e))?
            .label(format!("{} ({x:.2})", escape_name(name)))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    if !references.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| draw_err(path, e))?;
    }
    root.present().map_err(|e| draw_err(path, e))
}
