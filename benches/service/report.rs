//! What a run prints: the table (each `Decide` figure beside its ratios to the health and store
//! baselines of the same concurrency, and per concurrency the comparisons issue 14 sets targets
//! for) or, with `--json`, the same figures as one JSON document; and the machine's load average
//! around the run, since a shared machine's figures mean little without it. Every figure is the
//! median of the runs (`summary`).

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::callers::Measured;
use crate::plan::Plan;
use crate::summary::Summary;

/// Where the callers went.
pub struct Target {
    pub url: String,
    pub in_process: bool,
}

pub struct Report {
    pub store: &'static str,
    pub database: String,
    pub target: Target,
    pub plan: Plan,
    pub load_before: Option<[f64; 3]>,
    pub load_after: Option<[f64; 3]>,
    /// Every run's measurements, in the order they were taken.
    pub measurements: Vec<Measured>,
    /// One row per concurrency and measurement, over the runs.
    pub summaries: Vec<Summary>,
}

/// A ratio of two measurements' median throughputs at one concurrency.
struct Comparison {
    /// Its JSON key.
    key: &'static str,
    /// Its name in the table.
    label: &'static str,
    over: &'static str,
    under: &'static str,
}

/// The comparisons issue 14 sets targets for (at 64 callers on PostgreSQL): capped ÷ uncapped ≥
/// 0.8, capped-hot ÷ uncapped ≥ 0.6, capped-hot ÷ hot-row ≥ 3.
const COMPARISONS: &[Comparison] = &[
    Comparison {
        key: "capped_over_uncapped",
        label: "capped ÷ uncapped",
        over: "decide-capped",
        under: "decide-uncapped",
    },
    Comparison {
        key: "capped_hot_over_uncapped",
        label: "capped-hot ÷ uncapped",
        over: "decide-capped-hot",
        under: "decide-uncapped",
    },
    Comparison {
        key: "capped_hot_over_hot_row",
        label: "capped-hot ÷ hot-row",
        over: "decide-capped-hot",
        under: "hot-row",
    },
    Comparison {
        key: "uncapped_shadow_over_uncapped",
        label: "uncapped with shadow ÷ uncapped",
        over: "decide-uncapped-shadow",
        under: "decide-uncapped",
    },
    Comparison {
        key: "capped_shadow_over_capped",
        label: "capped with shadow ÷ capped",
        over: "decide-capped-shadow",
        under: "decide-capped",
    },
    Comparison {
        key: "uncapped_shadow_differs_over_uncapped",
        label: "uncapped, shadow differs ÷ uncapped",
        over: "decide-uncapped-shadow-differs",
        under: "decide-uncapped",
    },
];

/// `/proc/loadavg`'s three averages, where there is one.
pub fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut fields = text.split_whitespace().map(|field| field.parse::<f64>().ok());
    Some([fields.next()??, fields.next()??, fields.next()??])
}

/// A figure divided by a baseline's, when both exist.
fn ratio(value: f64, baseline: f64) -> Option<f64> {
    (baseline > 0.0 && value > 0.0).then(|| value / baseline)
}

/// A comparison taken within each run: the two measurements of one run follow each other within
/// seconds, so a machine that slows down for a while (someone else's build) moves both, and the
/// ratio of one run's pair is steadier than the ratio of two medians taken from different runs.
pub struct Paired {
    /// Each run's ratio, in run order (a run with a zero throughput left out).
    pub runs: Vec<f64>,
}

impl Paired {
    pub fn of(over: &[f64], under: &[f64]) -> Paired {
        Paired {
            runs: over
                .iter()
                .zip(under)
                .filter_map(|(&over, &under)| ratio(over, under))
                .collect(),
        }
    }

    pub fn median(&self) -> Option<f64> {
        (!self.runs.is_empty()).then(|| crate::summary::median(&self.runs))
    }

    fn min(&self) -> f64 {
        self.runs.iter().copied().fold(f64::INFINITY, f64::min)
    }

    fn max(&self) -> f64 {
        self.runs.iter().copied().fold(0.0, f64::max)
    }
}

struct Ratios {
    throughput: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl Report {
    fn summary(&self, concurrency: usize, name: &str) -> Option<&Summary> {
        self.summaries
            .iter()
            .find(|summary| summary.concurrency == concurrency && summary.name == name)
    }

    /// A Decide figure against a baseline of the same concurrency.
    fn ratios(&self, summary: &Summary, baseline: &str) -> Option<Ratios> {
        if !summary.name.starts_with("decide") {
            return None;
        }
        let base = self.summary(summary.concurrency, baseline)?;
        Some(Ratios {
            throughput: ratio(summary.per_second, base.per_second),
            p50: ratio(summary.p50_ms, base.p50_ms),
            p99: ratio(summary.p99_ms, base.p99_ms),
        })
    }

    /// The comparisons at `concurrency` whose two measurements were both taken, each with its
    /// ratio (none when a throughput is zero) and the same ratio run by run.
    fn comparisons(&self, concurrency: usize) -> Vec<(&'static Comparison, Option<f64>, Paired)> {
        COMPARISONS
            .iter()
            .filter_map(|comparison| {
                let over = self.summary(concurrency, comparison.over)?;
                let under = self.summary(concurrency, comparison.under)?;
                Some((
                    comparison,
                    ratio(over.per_second, under.per_second),
                    Paired::of(&over.runs, &under.runs),
                ))
            })
            .collect()
    }

    /// The concurrencies measured, in plan order.
    fn concurrencies(&self) -> &[usize] {
        &self.plan.concurrency
    }

    fn header(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(
            text,
            "service bench: store {} ({}); server {} at {}; one channel (HTTP/2 connection) per caller",
            self.store,
            self.database,
            if self.target.in_process {
                "in-process"
            } else {
                "external"
            },
            self.target.url,
        );
        if let Some(pool) = self.plan.store_connections {
            let _ = writeln!(text, "store pool: {pool} connection(s)");
        }
        if let Some(batch) = self.plan.audit_batch {
            let _ = writeln!(text, "audit batch: at most {batch}");
        }
        if let Some(in_flight) = self.plan.audit_in_flight {
            let _ = writeln!(text, "audit transactions at once: at most {in_flight}");
        }
        let _ = writeln!(
            text,
            "each measurement: {} ms warm-up, then {} ms counted; {} principal(s) in rotation; {}",
            self.plan.warmup.as_millis(),
            self.plan.duration.as_millis(),
            self.plan.principals,
            if self.plan.repeat == 1 {
                "one run".to_owned()
            } else {
                format!(
                    "{} runs of the whole plan, each figure their median",
                    self.plan.repeat
                )
            },
        );
        let show = |load: Option<[f64; 3]>| {
            load.map_or_else(
                || "unknown".to_owned(),
                |[one, five, fifteen]| format!("{one:.2} {five:.2} {fifteen:.2}"),
            )
        };
        let _ = writeln!(
            text,
            "load average before: {}; after: {}",
            show(self.load_before),
            show(self.load_after)
        );
        text
    }

    pub fn table(&self) -> String {
        let mut text = self.header();
        text.push('\n');
        // The range of the runs' throughputs, only when there are several runs.
        let ranged = self.plan.repeat > 1;
        let range = |summary: &Summary| {
            if ranged {
                format!(
                    " {:>13}",
                    format!("{:.0}–{:.0}", summary.min_per_second(), summary.max_per_second())
                )
            } else {
                String::new()
            }
        };
        let _ = writeln!(
            text,
            "{:>7}  {:<34} {:>10}{} {:>8} {:>8}   {:>17}   {:>17}   {:>17}",
            "callers",
            "measurement",
            "per s",
            if ranged {
                format!(" {:>13}", "min–max")
            } else {
                String::new()
            },
            "p50 ms",
            "p99 ms",
            "per s ÷ hc / st",
            "p50 ÷ hc / st",
            "p99 ÷ hc / st"
        );
        let show = |value: Option<f64>| value.map_or_else(|| "—".to_owned(), |value| format!("{value:.2}"));
        let pair = |health: &Option<Ratios>, store: &Option<Ratios>, pick: fn(&Ratios) -> Option<f64>| match (
            health, store,
        ) {
            (None, None) => String::new(),
            _ => format!(
                "{} / {}",
                show(health.as_ref().and_then(pick)),
                show(store.as_ref().and_then(pick))
            ),
        };
        for (index, &concurrency) in self.concurrencies().iter().enumerate() {
            if index > 0 {
                text.push('\n');
            }
            for summary in self
                .summaries
                .iter()
                .filter(|summary| summary.concurrency == concurrency)
            {
                let health = self.ratios(summary, "health");
                let store = self.ratios(summary, "store-append");
                let line = format!(
                    "{:>7}  {:<34} {:>10.0}{} {:>8.3} {:>8.3}   {:>17}   {:>17}   {:>17}",
                    summary.concurrency,
                    summary.label,
                    summary.per_second,
                    range(summary),
                    summary.p50_ms,
                    summary.p99_ms,
                    pair(&health, &store, |r| r.throughput),
                    pair(&health, &store, |r| r.p50),
                    pair(&health, &store, |r| r.p99),
                );
                let _ = writeln!(text, "{}", line.trim_end());
                if summary.errors > 0 || summary.not_allowed > 0 {
                    let _ = writeln!(
                        text,
                        "{:>7}  ! {} error(s), {} answer(s) not allow (or not SERVING); first: {}",
                        "",
                        summary.errors,
                        summary.not_allowed,
                        summary.problem.as_deref().unwrap_or("?")
                    );
                }
            }
            let compared: Vec<String> = self
                .comparisons(concurrency)
                .into_iter()
                .map(|(comparison, value, paired)| match paired.median() {
                    Some(median) if paired.runs.len() > 1 => format!(
                        "{} {} (run by run {median:.2}, {:.2}–{:.2})",
                        comparison.label,
                        show(value),
                        paired.min(),
                        paired.max()
                    ),
                    _ => format!("{} {}", comparison.label, show(value)),
                })
                .collect();
            if !compared.is_empty() {
                let _ = writeln!(text, "{:>7}  = {}", "", compared.join("; "));
            }
        }
        text.push_str(
            "\nhc = the health Check baseline, st = the append_audit baseline (rows/s; latency per \
             batch), same concurrency, same run.\nhot row = the store's old per-call conditional \
             statement on one row, one autocommit transaction each (connections capped at 64; on \
             SQLite one writer at a time).\n= throughputs of the medians (run by run: the median \
             of each run's own ratio, and their range); issue 14's targets at 64 callers on \
             PostgreSQL: capped ÷ uncapped ≥ 0.80, capped-hot ÷ uncapped ≥ 0.60, \
             capped-hot ÷ hot-row ≥ 3.\n",
        );
        text
    }

    /// The plot `--svg` writes: throughput and p99 against callers, the medians of the runs.
    pub fn svg(&self) -> String {
        let title = format!(
            "capgate service bench: {} store, {} ms per measurement, {}",
            self.store,
            self.plan.duration.as_millis(),
            if self.plan.repeat == 1 {
                "one run".to_owned()
            } else {
                format!("median of {} runs", self.plan.repeat)
            }
        );
        crate::svg::plot(&self.summaries, &self.plan.concurrency, &title)
    }

    /// The JSON document, as the CLI prints its own: pretty, with a final newline.
    pub fn json(&self) -> String {
        // Serialising a `Value` cannot fail: its keys are strings.
        let mut text = serde_json::to_string_pretty(&self.document()).unwrap_or_default();
        text.push('\n');
        text
    }

    fn document(&self) -> Value {
        let figure = |value: Option<f64>| value.map_or(Value::Null, |value| json!(value));
        let rows: Vec<Value> = self
            .summaries
            .iter()
            .map(|summary| {
                let against = |baseline: &str| {
                    self.ratios(summary, baseline).map_or(Value::Null, |ratios| {
                        json!({
                            "per_second": figure(ratios.throughput),
                            "p50": figure(ratios.p50),
                            "p99": figure(ratios.p99),
                        })
                    })
                };
                json!({
                    "concurrency": summary.concurrency,
                    "measurement": summary.name,
                    "label": summary.label,
                    "unit": if summary.name == "store-append" { "rows" } else { "calls" },
                    "runs": summary.runs.len(),
                    "completed": summary.completed,
                    "seconds": summary.seconds,
                    "per_second": summary.per_second,
                    "per_second_min": summary.min_per_second(),
                    "per_second_max": summary.max_per_second(),
                    "per_second_runs": summary.runs,
                    "p50_ms": summary.p50_ms,
                    "p99_ms": summary.p99_ms,
                    "max_ms": summary.max_ms,
                    "errors": summary.errors,
                    "not_allowed": summary.not_allowed,
                    "problem": summary.problem,
                    "ratio_to_health": against("health"),
                    "ratio_to_store": against("store-append"),
                })
            })
            .collect();
        let comparisons: Vec<Value> = self
            .concurrencies()
            .iter()
            .map(|&concurrency| {
                let mut row = serde_json::Map::new();
                row.insert("concurrency".to_owned(), json!(concurrency));
                for (comparison, value, paired) in self.comparisons(concurrency) {
                    row.insert(comparison.key.to_owned(), figure(value));
                    row.insert(format!("{}_by_run", comparison.key), json!(paired.runs));
                    row.insert(
                        format!("{}_by_run_median", comparison.key),
                        figure(paired.median()),
                    );
                }
                Value::Object(row)
            })
            .collect();
        json!({
            "store": self.store,
            "database": self.database,
            "server": self.target.url,
            "in_process": self.target.in_process,
            "channels": "one per caller",
            "warmup_ms": self.plan.warmup.as_millis() as u64,
            "duration_ms": self.plan.duration.as_millis() as u64,
            "principals": self.plan.principals,
            "repeat": self.plan.repeat,
            "store_connections": self.plan.store_connections,
            "audit_batch": self.plan.audit_batch,
            "audit_in_flight": self.plan.audit_in_flight,
            "statistic": "median of the runs",
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
            "measurements": rows,
            "comparisons": comparisons,
        })
    }
}
