//! Counters served at `/metrics` in the Prometheus text format.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

/// The server's counters. Shared by the HTTP layer and the scheduler loop.
#[derive(Debug, Default)]
pub struct Metrics {
    /// Responses by status class: 1xx..5xx.
    pub http: [AtomicU64; 5],
    pub scheduler_rounds: AtomicU64,
    pub scheduler_bindings: AtomicU64,
    pub scheduler_evictions: AtomicU64,
    pub scheduler_conflicts: AtomicU64,
}

impl Metrics {
    pub fn count_status(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.http[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Renders the counters; `revision` is the store's latest revision.
    pub fn render(&self, revision: u64) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "# HELP tessera_http_responses_total HTTP responses by status class."
        );
        let _ = writeln!(s, "# TYPE tessera_http_responses_total counter");
        for (i, c) in self.http.iter().enumerate() {
            let _ = writeln!(
                s,
                "tessera_http_responses_total{{class=\"{}xx\"}} {}",
                i + 1,
                c.load(Ordering::Relaxed)
            );
        }
        for (name, help, v) in [
            (
                "tessera_scheduler_rounds_total",
                "Scheduler rounds run.",
                &self.scheduler_rounds,
            ),
            (
                "tessera_scheduler_bindings_total",
                "Task bindings written.",
                &self.scheduler_bindings,
            ),
            (
                "tessera_scheduler_evictions_total",
                "Task evictions written.",
                &self.scheduler_evictions,
            ),
            (
                "tessera_scheduler_conflicts_total",
                "Rounds retried because a job changed meanwhile.",
                &self.scheduler_conflicts,
            ),
        ] {
            let _ = writeln!(s, "# HELP {name} {help}");
            let _ = writeln!(s, "# TYPE {name} counter");
            let _ = writeln!(s, "{name} {}", v.load(Ordering::Relaxed));
        }
        let _ = writeln!(
            s,
            "# HELP tessera_store_revision The store's latest revision."
        );
        let _ = writeln!(s, "# TYPE tessera_store_revision gauge");
        let _ = writeln!(s, "tessera_store_revision {revision}");
        s
    }
}
