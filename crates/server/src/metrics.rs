//! What `/metrics` serves, in the Prometheus text format (version 0.0.4) and its
//! naming conventions (base units, `_total` on counters, `_seconds` histograms).
//!
//! Two kinds of families:
//! - **the process's own**, served to anyone who can reach the port, as before:
//!   HTTP responses and their latency per route family, the scheduler's rounds, cycle
//!   and bind latency, the store's revision, the inference pools;
//! - **the tenants'** ([`tenants`]): queues (deserved, allocated, pending), jobs by
//!   phase, GPUs allocated by model, sandboxes by state and runtime class, tokens and
//!   cost. Each carries a `tenant` label and is served only to a caller who may see
//!   that tenant: a system key sees every tenant, a tenant's key its own, a scrape
//!   without a key none of them (so no tenant's names leak through an open port).
//!
//! Counters and histograms are atomics: recording one is lock-free, on the request
//! path and in the scheduler loop alike.

pub mod gather;
pub mod histogram;
pub mod tenants;

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

pub use histogram::Histogram;

/// Buckets of the HTTP latency histogram, in seconds (time to the response head).
pub const HTTP_BUCKETS: &[f64] = &[
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// Buckets of the scheduler's cycle and bind histograms, in seconds.
pub const SCHED_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// The HTTP methods counted by name; any other is `other`.
const METHODS: [&str; 6] = ["GET", "POST", "PUT", "DELETE", "PATCH", "other"];

/// The server's counters and histograms. Shared by the HTTP layer and the
/// scheduler loop.
#[derive(Debug)]
pub struct Metrics {
    /// Responses by status class: 1xx..5xx.
    pub http: [AtomicU64; 5],
    /// Route families (the first path segment after `/v1/`, sorted), and `other`.
    families: Vec<&'static str>,
    /// Latency per (family, method, status class), indexed by [`Self::slot`].
    latency: Vec<Histogram>,
    pub scheduler_rounds: AtomicU64,
    pub scheduler_bindings: AtomicU64,
    pub scheduler_evictions: AtomicU64,
    pub scheduler_conflicts: AtomicU64,
    /// One round of the scheduler loop: read the changes, plan, write the plan.
    pub scheduler_cycle: Histogram,
    /// Writing a round's bindings (and evictions) to the store, for rounds that
    /// bound something.
    pub scheduler_bind: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(
            crate::api::ROUTE_TABLES
                .iter()
                .flat_map(|t| t.iter().map(|r| r.path)),
        )
    }
}

impl Metrics {
    /// Counters for a server whose routes are `paths` (`/v1/jobs/{name}`, …).
    pub fn new<'a>(paths: impl IntoIterator<Item = &'a str>) -> Self {
        let mut families: Vec<&'static str> = paths
            .into_iter()
            .filter_map(family_of_path)
            .map(intern)
            .collect();
        families.push("other");
        families.sort_unstable();
        families.dedup();
        let latency = (0..families.len() * METHODS.len() * 5)
            .map(|_| Histogram::new(HTTP_BUCKETS))
            .collect();
        Metrics {
            http: Default::default(),
            families,
            latency,
            scheduler_rounds: AtomicU64::new(0),
            scheduler_bindings: AtomicU64::new(0),
            scheduler_evictions: AtomicU64::new(0),
            scheduler_conflicts: AtomicU64::new(0),
            scheduler_cycle: Histogram::new(SCHED_BUCKETS),
            scheduler_bind: Histogram::new(SCHED_BUCKETS),
        }
    }

    pub fn count_status(&self, status: u16) {
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.http[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one response: its status class, and its latency under the family of
    /// the route it matched (`route`: the route's template, `None` for no route).
    pub fn observe_request(&self, route: Option<&str>, method: &str, status: u16, secs: f64) {
        self.count_status(status);
        let family = route.and_then(family_of_path).unwrap_or("other");
        let f = self
            .families
            .binary_search(&family)
            .or_else(|_| self.families.binary_search(&"other"))
            .unwrap_or(0);
        let m = METHODS
            .iter()
            .position(|x| *x == method)
            .unwrap_or(METHODS.len() - 1);
        let class = (status / 100).clamp(1, 5) as usize - 1;
        self.latency[(f * METHODS.len() + m) * 5 + class].observe(secs);
    }

    /// Renders the process's own families; `revision` is the store's latest revision.
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
        histogram::header(
            &mut s,
            "tessera_http_request_duration_seconds",
            "Time from a request's arrival to its response head, by route family \
             (the first path segment after /v1/), method and status class.",
        );
        for (f, family) in self.families.iter().enumerate() {
            for (m, method) in METHODS.iter().enumerate() {
                for class in 0..5 {
                    let h = &self.latency[(f * METHODS.len() + m) * 5 + class];
                    if h.count() == 0 {
                        continue;
                    }
                    let labels = format!(
                        "family=\"{family}\",method=\"{method}\",class=\"{}xx\"",
                        class + 1
                    );
                    h.render(&mut s, "tessera_http_request_duration_seconds", &labels);
                }
            }
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
        for (name, help, h) in [
            (
                "tessera_scheduler_cycle_duration_seconds",
                "One scheduler round: reading the store's changes, planning, writing the plan.",
                &self.scheduler_cycle,
            ),
            (
                "tessera_scheduler_bind_duration_seconds",
                "Writing a round's bindings and evictions to the store (rounds that bound a task).",
                &self.scheduler_bind,
            ),
        ] {
            histogram::header(&mut s, name, help);
            h.render(&mut s, name, "");
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

/// `/v1/jobs/{name}` -> `jobs`; `None` for a path outside `/v1/` or a parameter
/// in the first place.
fn family_of_path(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v1/")?;
    let first = rest.split('/').next()?;
    (!first.is_empty() && !first.starts_with('{')).then_some(first)
}

/// Route families come from the static route tables; any other name (a test's
/// own list) is leaked once, at start.
fn intern(s: &str) -> &'static str {
    crate::api::ROUTE_TABLES
        .iter()
        .flat_map(|t| t.iter())
        .find_map(|r| family_of_path(r.path).filter(|f| *f == s))
        .unwrap_or_else(|| Box::leak(s.to_string().into_boxed_str()))
}

/// Writes `value` as a label value: `\`, `"` and new lines escaped.
pub fn label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_count_under_their_route_family() {
        let m = Metrics::new(["/v1/jobs", "/v1/jobs/{name}", "/v1/sandboxes/{id}/exec"]);
        m.observe_request(Some("/v1/jobs/{name}"), "GET", 200, 0.002);
        m.observe_request(Some("/v1/jobs"), "POST", 201, 0.2);
        m.observe_request(Some("/v1/nowhere"), "GET", 404, 0.0001);
        m.observe_request(None, "BREW", 404, 0.0001);
        let s = m.render(7);
        assert!(
            s.contains(
                "tessera_http_request_duration_seconds_count{family=\"jobs\",method=\"GET\",class=\"2xx\"} 1"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "tessera_http_request_duration_seconds_bucket{family=\"jobs\",method=\"POST\",class=\"2xx\",le=\"0.25\"} 1"
            ),
            "{s}"
        );
        // Unknown families and methods fold into `other`: the label set stays bounded.
        assert!(
            s.contains(
                "tessera_http_request_duration_seconds_count{family=\"other\",method=\"GET\",class=\"4xx\"} 1"
            ),
            "{s}"
        );
        assert!(
            s.contains(
                "tessera_http_request_duration_seconds_count{family=\"other\",method=\"other\",class=\"4xx\"} 1"
            ),
            "{s}"
        );
        assert!(
            s.contains("tessera_http_responses_total{class=\"4xx\"} 2"),
            "{s}"
        );
        assert!(
            !s.contains("family=\"sandboxes\""),
            "no series before a request: {s}"
        );
        assert!(s.contains("tessera_store_revision 7"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = String::new();
        label_value(&mut s, "a\"b\\c\nd");
        assert_eq!(s, "a\\\"b\\\\c\\nd");
    }
}
