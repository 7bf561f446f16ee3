//! The runs of a plan (`--repeat N`) folded into one row per concurrency and measurement: the
//! median of the runs' throughputs, p50s and p99s, and the range of their throughputs. A median
//! rather than a mean: on a shared machine, one run disturbed by someone else's compile should move
//! the figure as little as it can. With one run, the row is that run's figures.

use crate::callers::Measured;

/// One measurement over every run of the plan.
pub struct Summary {
    pub concurrency: usize,
    /// `health`, `store-append`, `hot-row` or a scenario name.
    pub name: &'static str,
    /// The first run's label.
    pub label: String,
    /// Each run's throughput, in run order.
    pub runs: Vec<f64>,
    /// The medians of the runs.
    pub per_second: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    /// The slowest call of any run.
    pub max_ms: f64,
    /// Totals over the runs.
    pub completed: u64,
    pub seconds: f64,
    pub errors: u64,
    pub not_allowed: u64,
    /// The first run's first problem.
    pub problem: Option<String>,
}

impl Summary {
    pub fn min_per_second(&self) -> f64 {
        self.runs.iter().copied().fold(f64::INFINITY, f64::min)
    }

    pub fn max_per_second(&self) -> f64 {
        self.runs.iter().copied().fold(0.0, f64::max)
    }
}

/// One row per (concurrency, measurement), in the order the first run measured them.
pub fn summarize(measurements: &[Measured]) -> Vec<Summary> {
    let mut keys: Vec<(usize, &'static str)> = Vec::new();
    for measured in measurements {
        let key = (measured.concurrency, measured.name);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(concurrency, name)| {
            let runs: Vec<&Measured> = measurements
                .iter()
                .filter(|measured| measured.concurrency == concurrency && measured.name == name)
                .collect();
            let of = |figure: fn(&Measured) -> f64| {
                median(&runs.iter().map(|run| figure(run)).collect::<Vec<_>>())
            };
            Summary {
                concurrency,
                name,
                label: runs[0].label.clone(),
                runs: runs.iter().map(|run| run.per_second()).collect(),
                per_second: of(Measured::per_second),
                p50_ms: of(|run| run.percentile_ms(0.50)),
                p99_ms: of(|run| run.percentile_ms(0.99)),
                max_ms: runs.iter().map(|run| run.percentile_ms(1.0)).fold(0.0, f64::max),
                completed: runs.iter().map(|run| run.completed).sum(),
                seconds: runs.iter().map(|run| run.seconds).sum(),
                errors: runs.iter().map(|run| run.errors).sum(),
                not_allowed: runs.iter().map(|run| run.not_allowed).sum(),
                problem: runs.iter().find_map(|run| run.problem.clone()),
            }
        })
        .collect()
}

/// The middle value; with an even count, the mean of the two middle ones; 0 for none.
pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        count if count % 2 == 1 => sorted[count / 2],
        count => (sorted[count / 2 - 1] + sorted[count / 2]) / 2.0,
    }
}
