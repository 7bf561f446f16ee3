//! What a run prints: the table (each `Decide` figure beside its ratios to the two baselines of the
//! same concurrency) or, with `--json`, the same figures as one JSON document; and the machine's
//! load average around the run, since a shared machine's figures mean little without it.

use std::fmt::Write as _;

use serde_json::{json, Value};

use crate::callers::Measured;
use crate::plan::Plan;

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
    pub measurements: Vec<Measured>,
}

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

struct Ratios {
    throughput: Option<f64>,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl Report {
    fn baseline(&self, concurrency: usize, name: &str) -> Option<&Measured> {
        self.measurements
            .iter()
            .find(|measured| measured.concurrency == concurrency && measured.name == name)
    }

    /// A Decide figure against a baseline of the same concurrency.
    fn ratios(&self, measured: &Measured, baseline: &str) -> Option<Ratios> {
        if !measured.name.starts_with("decide") {
            return None;
        }
        let base = self.baseline(measured.concurrency, baseline)?;
        Some(Ratios {
            throughput: ratio(measured.per_second(), base.per_second()),
            p50: ratio(measured.percentile_ms(0.50), base.percentile_ms(0.50)),
            p99: ratio(measured.percentile_ms(0.99), base.percentile_ms(0.99)),
        })
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
        let _ = writeln!(
            text,
            "each measurement: {} ms warm-up, then {} ms counted; {} principal(s) in rotation",
            self.plan.warmup.as_millis(),
            self.plan.duration.as_millis(),
            self.plan.principals,
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
        let _ = writeln!(
            text,
            "{:>7}  {:<30} {:>10} {:>8} {:>8}   {:>17}   {:>17}   {:>17}",
            "callers",
            "measurement",
            "per s",
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
        let mut last = 0;
        for measured in &self.measurements {
            if last != 0 && measured.concurrency != last {
                text.push('\n');
            }
            last = measured.concurrency;
            let health = self.ratios(measured, "health");
            let store = self.ratios(measured, "store-append");
            let line = format!(
                "{:>7}  {:<30} {:>10.0} {:>8.3} {:>8.3}   {:>17}   {:>17}   {:>17}",
                measured.concurrency,
                measured.label,
                measured.per_second(),
                measured.percentile_ms(0.50),
                measured.percentile_ms(0.99),
                pair(&health, &store, |r| r.throughput),
                pair(&health, &store, |r| r.p50),
                pair(&health, &store, |r| r.p99),
            );
            let _ = writeln!(text, "{}", line.trim_end());
            if measured.errors > 0 || measured.not_allowed > 0 {
                let _ = writeln!(
                    text,
                    "{:>7}  ! {} error(s), {} answer(s) not allow (or not SERVING); first: {}",
                    "",
                    measured.errors,
                    measured.not_allowed,
                    measured.problem.as_deref().unwrap_or("?")
                );
            }
        }
        text.push_str(
            "\nhc = the health Check baseline, st = the append_audit baseline (rows/s; latency per \
             batch), same concurrency, same run.\n",
        );
        text
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
            .measurements
            .iter()
            .map(|measured| {
                let against = |baseline: &str| {
                    self.ratios(measured, baseline).map_or(Value::Null, |ratios| {
                        json!({
                            "per_second": figure(ratios.throughput),
                            "p50": figure(ratios.p50),
                            "p99": figure(ratios.p99),
                        })
                    })
                };
                json!({
                    "concurrency": measured.concurrency,
                    "measurement": measured.name,
                    "unit": if measured.name == "store-append" { "rows" } else { "calls" },
                    "completed": measured.completed,
                    "seconds": measured.seconds,
                    "per_second": measured.per_second(),
                    "p50_ms": measured.percentile_ms(0.50),
                    "p99_ms": measured.percentile_ms(0.99),
                    "max_ms": measured.percentile_ms(1.0),
                    "errors": measured.errors,
                    "not_allowed": measured.not_allowed,
                    "problem": measured.problem,
                    "ratio_to_health": against("health"),
                    "ratio_to_store": against("store-append"),
                })
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
            "load_average_before": self.load_before,
            "load_average_after": self.load_after,
            "measurements": rows,
        })
    }
}
