//! The tenants' families of `/metrics`: every series carries a `tenant` label and is
//! rendered only for the tenants the scraping caller may see ([`Scope`]). The
//! services gather plain facts ([`Facts`]); this module only renders them, in a
//! stable order (sorted labels), so two scrapes of an unchanged server are equal.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::label_value;

/// Whose series a scrape gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// No key: none of the tenants' families.
    Anonymous,
    /// A tenant's key: that tenant's series.
    Tenant(String),
    /// A system key: every tenant's.
    All,
}

impl Scope {
    /// Whether the scrape may see `tenant`'s series.
    pub fn sees(&self, tenant: &str) -> bool {
        match self {
            Scope::Anonymous => false,
            Scope::Tenant(t) => t == tenant,
            Scope::All => true,
        }
    }
}

/// Resources of one queue row, in base units.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Amounts {
    /// CPU cores.
    pub cpu: f64,
    pub memory_bytes: f64,
    /// GPUs (fractions as parts of one).
    pub gpu: f64,
}

/// A queue with what the proportion plugin gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueFacts {
    pub tenant: String,
    pub queue: String,
    pub deserved: Amounts,
    pub allocated: Amounts,
    pub pending: Amounts,
}

/// Usage metered for a tenant since its first record (durable: the store's totals).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UsageFacts {
    pub tokens_in: f64,
    pub tokens_cached: f64,
    pub tokens_out: f64,
    pub gpu_seconds: f64,
    pub cpu_seconds: f64,
    pub cost: f64,
    pub currency: String,
}

/// What the services know now, for the tenants in scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Facts {
    pub queues: Vec<QueueFacts>,
    /// (tenant, queue, phase) -> jobs.
    pub jobs: BTreeMap<(String, String, String), u64>,
    /// (tenant, GPU model) -> milli-GPUs held by the tenant's tasks.
    pub gpu_milli: BTreeMap<(String, String), u64>,
    /// (tenant, state, runtime class) -> sandboxes.
    pub sandboxes: BTreeMap<(String, String, String), u64>,
    /// tenant -> its metered usage.
    pub usage: BTreeMap<String, UsageFacts>,
}

/// Renders `facts` as Prometheus families (only series of tenants in `scope`).
pub fn render(facts: &Facts, scope: &Scope) -> String {
    let mut s = String::new();
    if *scope == Scope::Anonymous {
        return s;
    }
    let mut fam = Family::new(&mut s);

    for (name, help, pick) in [
        (
            "tessera_queue_deserved",
            "A queue's fair share of the cluster as the proportion plugin divides it \
             (cpu in cores, memory in bytes, gpu in GPUs).",
            (|q: &QueueFacts| q.deserved) as fn(&QueueFacts) -> Amounts,
        ),
        (
            "tessera_queue_allocated",
            "What a queue's running jobs (and its children's) hold.",
            |q: &QueueFacts| q.allocated,
        ),
        (
            "tessera_queue_pending",
            "What a queue's waiting jobs (and its children's) still ask for.",
            |q: &QueueFacts| q.pending,
        ),
    ] {
        fam.start(name, help, "gauge");
        for q in facts.queues.iter().filter(|q| scope.sees(&q.tenant)) {
            let a = pick(q);
            for (resource, v) in [("cpu", a.cpu), ("memory", a.memory_bytes), ("gpu", a.gpu)] {
                fam.sample(
                    name,
                    &[
                        ("tenant", &q.tenant),
                        ("queue", &q.queue),
                        ("resource", resource),
                    ],
                    v,
                );
            }
        }
    }

    fam.start(
        "tessera_jobs",
        "Jobs the store holds, by queue and phase.",
        "gauge",
    );
    for ((t, q, p), n) in facts.jobs.iter().filter(|((t, _, _), _)| scope.sees(t)) {
        fam.sample(
            "tessera_jobs",
            &[("tenant", t), ("queue", q), ("phase", p)],
            *n as f64,
        );
    }

    fam.start(
        "tessera_gpus_allocated",
        "GPUs held by a tenant's tasks, by GPU model (a fraction counts as its share).",
        "gauge",
    );
    for ((t, m), milli) in facts.gpu_milli.iter().filter(|((t, _), _)| scope.sees(t)) {
        fam.sample(
            "tessera_gpus_allocated",
            &[("tenant", t), ("model", m)],
            *milli as f64 / 1000.0,
        );
    }

    fam.start(
        "tessera_sandboxes",
        "Sandboxes of the sandbox API, by state and runtime class.",
        "gauge",
    );
    for ((t, st, c), n) in facts
        .sandboxes
        .iter()
        .filter(|((t, _, _), _)| scope.sees(t))
    {
        fam.sample(
            "tessera_sandboxes",
            &[("tenant", t), ("state", st), ("runtime_class", c)],
            *n as f64,
        );
    }

    let usage: Vec<(&String, &UsageFacts)> =
        facts.usage.iter().filter(|(t, _)| scope.sees(t)).collect();
    fam.start(
        "tessera_tokens_total",
        "Model tokens metered through the inference gateway and agent sessions: input \
         tokens not read from the engine's cache, input tokens read from it, and output.",
        "counter",
    );
    for (t, u) in &usage {
        for (ty, v) in [
            ("input_uncached", u.tokens_in),
            ("input_cached", u.tokens_cached),
            ("output", u.tokens_out),
        ] {
            fam.sample("tessera_tokens_total", &[("tenant", t), ("type", ty)], v);
        }
    }
    for (name, help, pick) in [
        (
            "tessera_metered_gpu_seconds_total",
            "GPU-seconds metered to a tenant's sessions.",
            (|u: &UsageFacts| u.gpu_seconds) as fn(&UsageFacts) -> f64,
        ),
        (
            "tessera_metered_cpu_seconds_total",
            "CPU-seconds metered to a tenant's sessions.",
            |u: &UsageFacts| u.cpu_seconds,
        ),
    ] {
        fam.start(name, help, "counter");
        for (t, u) in &usage {
            fam.sample(name, &[("tenant", t)], pick(u));
        }
    }
    fam.start(
        "tessera_cost_total",
        "Cost metered to a tenant (tokens, GPU- and CPU-seconds, tool fees) at its prices.",
        "counter",
    );
    for (t, u) in &usage {
        fam.sample(
            "tessera_cost_total",
            &[("tenant", t), ("currency", &u.currency)],
            u.cost,
        );
    }
    s
}

/// Writes families one after another.
struct Family<'a> {
    out: &'a mut String,
}

impl<'a> Family<'a> {
    fn new(out: &'a mut String) -> Self {
        Family { out }
    }

    fn start(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        self.out.push('{');
        for (i, (k, val)) in labels.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            self.out.push_str(k);
            self.out.push_str("=\"");
            label_value(self.out, val);
            self.out.push('"');
        }
        let _ = writeln!(self.out, "}} {v}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts() -> Facts {
        let mut f = Facts::default();
        for t in ["alpha", "beta"] {
            f.queues.push(QueueFacts {
                tenant: t.into(),
                queue: "q".into(),
                deserved: Amounts {
                    cpu: 2.0,
                    memory_bytes: 1024.0,
                    gpu: 1.5,
                },
                allocated: Amounts::default(),
                pending: Amounts::default(),
            });
            f.jobs.insert((t.into(), "q".into(), "running".into()), 3);
            f.gpu_milli.insert((t.into(), "H100".into()), 2500);
            f.sandboxes
                .insert((t.into(), "running".into(), "standard".into()), 1);
            f.usage.insert(
                t.into(),
                UsageFacts {
                    tokens_in: 10.0,
                    cost: 0.5,
                    currency: "USD".into(),
                    ..Default::default()
                },
            );
        }
        f
    }

    #[test]
    fn a_tenant_sees_only_its_own_series_and_no_key_sees_none() {
        let f = facts();
        assert_eq!(render(&f, &Scope::Anonymous), "");
        let a = render(&f, &Scope::Tenant("alpha".into()));
        assert!(!a.contains("beta"), "{a}");
        assert!(
            a.contains("tessera_queue_deserved{tenant=\"alpha\",queue=\"q\",resource=\"gpu\"} 1.5"),
            "{a}"
        );
        assert!(
            a.contains("tessera_gpus_allocated{tenant=\"alpha\",model=\"H100\"} 2.5"),
            "{a}"
        );
        assert!(
            a.contains("tessera_jobs{tenant=\"alpha\",queue=\"q\",phase=\"running\"} 3"),
            "{a}"
        );
        assert!(
            a.contains("tessera_tokens_total{tenant=\"alpha\",type=\"input_uncached\"} 10"),
            "{a}"
        );
        assert!(
            a.contains("tessera_cost_total{tenant=\"alpha\",currency=\"USD\"} 0.5"),
            "{a}"
        );
        let all = render(&f, &Scope::All);
        assert!(all.contains("tenant=\"alpha\"") && all.contains("tenant=\"beta\""));
        // Every family is announced once, with its type, whatever the scope.
        for s in [&a, &all] {
            assert_eq!(s.matches("# TYPE tessera_jobs gauge").count(), 1);
        }
    }
}
