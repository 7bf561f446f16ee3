//! `--svg FILE`: how throughput (left) and p99 (right) grow with the callers, one line per scenario
//! and baseline, written as SVG text by hand (a plotting crate for two charts would be most of the
//! bench's dependencies). Both axes are logarithmic: callers go 1, 16, 64, 256, and the baselines
//! and scenarios lie decades apart (a health Check against a hot row), which a linear axis would
//! flatten into the floor. The figures are the medians of the runs, as in the table. GitHub shows
//! the file in Markdown as an image: it has its own white background and plain fonts.

use std::fmt::Write as _;

use crate::summary::Summary;

const WIDTH: f64 = 1000.0;
/// Each panel's plotting area.
const PLOT_WIDTH: f64 = 380.0;
const PLOT_HEIGHT: f64 = 280.0;
const TOP: f64 = 60.0;
/// The left edges of the two panels' plotting areas.
const LEFTS: [f64; 2] = [80.0, 580.0];
/// Where the legend starts, and its rows.
const LEGEND_TOP: f64 = TOP + PLOT_HEIGHT + 70.0;
const LEGEND_ROW: f64 = 20.0;
const LEGEND_COLUMNS: usize = 2;

/// One colour per line, in the order the measurements were taken (3 baselines, 10 scenarios).
const COLOURS: &[&str] = &[
    "#555555", "#8c564b", "#bcbd22", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf",
    "#e377c2", "#7f7f7f", "#393b79", "#637939",
];

/// Which figure of a point a panel shows.
type Figure = fn(&Point) -> f64;

/// The two panels, left to right: their titles and figures.
const PANELS: [(&str, Figure); 2] = [
    (
        "throughput per second (calls; append_audit: rows), log scale",
        |point| point.per_second,
    ),
    ("p99 latency, ms, log scale", |point| point.p99_ms),
];

/// One line of the plot: a measurement at every concurrency that has it.
struct Series {
    legend: String,
    baseline: bool,
    /// In plan order.
    points: Vec<Point>,
}

/// One measurement's medians at one concurrency.
struct Point {
    callers: usize,
    per_second: f64,
    p99_ms: f64,
}

/// The plot of `summaries` at `concurrency` (the plan's), titled `title`.
pub fn plot(summaries: &[Summary], concurrency: &[usize], title: &str) -> String {
    let series = series(summaries);
    let rows = series.len().div_ceil(LEGEND_COLUMNS);
    let height = LEGEND_TOP + rows as f64 * LEGEND_ROW + 20.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="Helvetica, Arial, sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15" font-weight="bold">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    let x = XAxis::of(concurrency);
    for (&left, (label, pick)) in LEFTS.iter().zip(PANELS) {
        let values: Vec<f64> = series
            .iter()
            .flat_map(|line| line.points.iter().map(pick))
            .filter(|value| *value > 0.0)
            .collect();
        let y = YAxis::of(&values);
        panel(&mut svg, left, label, &x, &y);
        for (index, line) in series.iter().enumerate() {
            let colour = COLOURS[index % COLOURS.len()];
            let at: Vec<(f64, f64)> = line
                .points
                .iter()
                .filter(|point| pick(point) > 0.0)
                .map(|point| (left + x.at(point.callers), TOP + y.at(pick(point))))
                .collect();
            let path: Vec<String> = at.iter().map(|(px, py)| format!("{px:.1},{py:.1}")).collect();
            let dashes = if line.baseline {
                r#" stroke-dasharray="6 4""#
            } else {
                ""
            };
            let _ = writeln!(
                svg,
                r#"<polyline fill="none" stroke="{colour}" stroke-width="2"{dashes} points="{}"/>"#,
                path.join(" ")
            );
            for (px, py) in at {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{px:.1}" cy="{py:.1}" r="3" fill="{colour}"/>"#
                );
            }
        }
    }
    for (index, line) in series.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let column = index % LEGEND_COLUMNS;
        let row = index / LEGEND_COLUMNS;
        let left = LEFTS[0] + column as f64 * (LEFTS[1] - LEFTS[0]);
        let top = LEGEND_TOP + row as f64 * LEGEND_ROW;
        let dashes = if line.baseline {
            r#" stroke-dasharray="6 4""#
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<line x1="{left}" y1="{top}" x2="{}" y2="{top}" stroke="{colour}" stroke-width="2"{dashes}/>"#,
            left + 28.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}">{}</text>"#,
            left + 36.0,
            top + 4.0,
            escape(&line.legend)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// The lines to draw: one per measurement, in the order first measured.
fn series(summaries: &[Summary]) -> Vec<Series> {
    let mut lines: Vec<(&'static str, Series)> = Vec::new();
    for summary in summaries {
        let point = Point {
            callers: summary.concurrency,
            per_second: summary.per_second,
            p99_ms: summary.p99_ms,
        };
        match lines.iter_mut().find(|(name, _)| *name == summary.name) {
            Some((_, line)) => line.points.push(point),
            None => lines.push((
                summary.name,
                Series {
                    legend: legend(summary),
                    baseline: matches!(summary.name, "health" | "store-append" | "hot-row"),
                    points: vec![point],
                },
            )),
        }
    }
    lines.into_iter().map(|(_, line)| line).collect()
}

/// A line's name in the legend: the table's label, but for the baselines, whose labels name one
/// concurrency.
fn legend(summary: &Summary) -> String {
    match summary.name {
        "health" => "health Check (baseline)".to_owned(),
        "store-append" => "append_audit, batches of N (baseline; rows/s, p99 per batch)".to_owned(),
        "hot-row" => "hot row: the per-call statement on one row (baseline; ≤ 64 connections)".to_owned(),
        _ => summary.label.clone(),
    }
}

/// One panel: its frame, grid, tick labels and axis labels.
fn panel(svg: &mut String, left: f64, label: &str, x: &XAxis, y: &YAxis) {
    let bottom = TOP + PLOT_HEIGHT;
    for (position, text) in y.ticks() {
        let py = TOP + position;
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{py:.1}" x2="{}" y2="{py:.1}" stroke="#dddddd"/>"##,
            left + PLOT_WIDTH
        );
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{text}</text>"#,
            left - 6.0,
            py + 4.0
        );
    }
    for &callers in &x.ticks {
        let px = left + x.at(callers);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{TOP}" x2="{px:.1}" y2="{bottom}" stroke="#eeeeee"/>"##
        );
        let _ = writeln!(
            svg,
            r#"<text x="{px:.1}" y="{}" text-anchor="middle">{callers}</text>"#,
            bottom + 16.0
        );
    }
    let _ = writeln!(
        svg,
        r#"<rect x="{left}" y="{TOP}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">concurrent callers (log scale)</text>"#,
        left + PLOT_WIDTH / 2.0,
        bottom + 36.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle" font-weight="bold">{}</text>"#,
        left + PLOT_WIDTH / 2.0,
        TOP - 10.0,
        escape(label)
    );
}

/// Callers, on a log₂ scale across the plotting area's width.
struct XAxis {
    ticks: Vec<usize>,
    low: f64,
    high: f64,
}

impl XAxis {
    fn of(concurrency: &[usize]) -> XAxis {
        let mut ticks = concurrency.to_vec();
        ticks.sort_unstable();
        let log = |callers: usize| (callers.max(1) as f64).log2();
        XAxis {
            low: ticks.first().map_or(0.0, |&callers| log(callers)),
            high: ticks.last().map_or(0.0, |&callers| log(callers)),
            ticks,
        }
    }

    /// The offset of `callers` from the area's left edge; one concurrency alone sits in the middle.
    fn at(&self, callers: usize) -> f64 {
        let span = self.high - self.low;
        if span <= 0.0 {
            return PLOT_WIDTH / 2.0;
        }
        let margin = 20.0;
        margin + ((callers.max(1) as f64).log2() - self.low) / span * (PLOT_WIDTH - 2.0 * margin)
    }
}

/// Values on a log₁₀ scale, from the decade at or below the smallest to the one at or above the
/// largest.
struct YAxis {
    low: i32,
    high: i32,
}

impl YAxis {
    fn of(values: &[f64]) -> YAxis {
        let smallest = values.iter().copied().fold(f64::INFINITY, f64::min);
        let largest = values.iter().copied().fold(0.0, f64::max);
        if values.is_empty() {
            return YAxis { low: 0, high: 1 };
        }
        let low = smallest.log10().floor() as i32;
        let high = (largest.log10().ceil() as i32).max(low + 1);
        YAxis { low, high }
    }

    /// The offset of `value` from the area's top edge.
    fn at(&self, value: f64) -> f64 {
        let fraction = (value.log10() - f64::from(self.low)) / f64::from(self.high - self.low);
        PLOT_HEIGHT * (1.0 - fraction)
    }

    /// A grid line and label at every decade.
    fn ticks(&self) -> Vec<(f64, String)> {
        (self.low..=self.high)
            .map(|exponent| {
                let value = 10_f64.powi(exponent);
                (self.at(value), decade(exponent))
            })
            .collect()
    }
}

/// 10^exponent, short: 0.01, 1, 100, 10k, 1M.
fn decade(exponent: i32) -> String {
    match exponent {
        ..0 => format!("{}", 10_f64.powi(exponent)),
        0..3 => format!("{}", 10_i64.pow(exponent.unsigned_abs())),
        3..6 => format!("{}k", 10_i64.pow(exponent.unsigned_abs() - 3)),
        _ => format!("{}M", 10_i64.pow(exponent.unsigned_abs() - 6)),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// What keeps `svg` from being a plot of `lines` lines: empty when nothing does. The unit check's
/// test of the text, kept beside the writer so that both change together.
pub fn problems(svg: &str, lines: usize) -> Vec<String> {
    let mut found = Vec::new();
    if !svg.starts_with("<svg") {
        found.push("does not start with `<svg`".to_owned());
    }
    if !svg.trim_end().ends_with("</svg>") {
        found.push("does not end with `</svg>`".to_owned());
    }
    // Two panels, one polyline per line in each.
    let polylines = svg.matches("<polyline").count();
    if polylines != 2 * lines {
        found.push(format!(
            "{polylines} polyline(s) for {lines} line(s) in two panels"
        ));
    }
    let opened = svg.matches("<svg").count();
    let closed = svg.matches("</svg>").count();
    if opened != 1 || closed != 1 {
        found.push(format!("{opened} `<svg` and {closed} `</svg>`"));
    }
    for points in svg.split(r#"points=""#).skip(1) {
        let coordinates = points.split('"').next().unwrap_or_default();
        let numbers = coordinates.split([' ', ',']).filter(|number| !number.is_empty());
        if let Some(bad) = numbers
            .into_iter()
            .find(|number| !number.parse::<f64>().is_ok_and(f64::is_finite))
        {
            found.push(format!("a point at `{bad}`"));
        }
    }
    found
}
