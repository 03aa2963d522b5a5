//! A Prometheus histogram over fixed buckets, lock-free: one atomic per bucket, the
//! count, and the sum in nanoseconds (observations are durations in seconds).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds, ascending, in seconds; `+Inf` is implied.
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last is above every bound.
    counts: Vec<AtomicU64>,
    sum_nanos: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "ascending bounds");
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_nanos: AtomicU64::new(0),
        }
    }

    /// Records one observation of `secs` seconds (a negative or NaN one as 0).
    pub fn observe(&self, secs: f64) {
        let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        let i = self.bounds.partition_point(|b| *b < secs);
        self.counts[i].fetch_add(1, Relaxed);
        self.sum_nanos
            .fetch_add((secs * 1e9).min(u64::MAX as f64) as u64, Relaxed);
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Relaxed)).sum()
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines of `name` with `labels`
    /// (`a="x",b="y"`, or empty).
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            cumulative += c.load(Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b}"),
                None => "+Inf".to_string(),
            };
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        let braces = |l: &str| {
            if l.is_empty() {
                String::new()
            } else {
                format!("{{{l}}}")
            }
        };
        let _ = writeln!(out, "{name}_sum{} {sum}", braces(labels));
        let _ = writeln!(out, "{name}_count{} {cumulative}", braces(labels));
    }
}

/// The `# HELP` and `# TYPE` lines of a histogram family.
pub fn header(out: &mut String, name: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_bounds_inclusive() {
        static B: &[f64] = &[0.1, 1.0];
        let h = Histogram::new(B);
        for s in [0.05, 0.1, 0.5, 2.0, f64::NAN, -1.0] {
            h.observe(s);
        }
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "a=\"b\"");
        assert_eq!(
            out,
            "x_seconds_bucket{a=\"b\",le=\"0.1\"} 4\n\
             x_seconds_bucket{a=\"b\",le=\"1\"} 5\n\
             x_seconds_bucket{a=\"b\",le=\"+Inf\"} 6\n\
             x_seconds_sum{a=\"b\"} 2.65\n\
             x_seconds_count{a=\"b\"} 6\n"
        );
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "");
        assert!(out.starts_with("x_seconds_bucket{le=\"0.1\"} 4\n"), "{out}");
        assert!(out.ends_with("x_seconds_count 6\n"), "{out}");
    }
}
