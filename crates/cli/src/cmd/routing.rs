//! `tessera sim routing`: the routing simulator. Every router (round-robin,
//! least-load, SGLang-style cache-aware, llm-d-style weighted scorer, Tessera's)
//! over the same multi-turn agent workload, per seed; a table of KV hit rate,
//! TTFT p50/p99 and throughput, or JSON with `--json`.

use std::path::PathBuf;

use tessera_gateway::route::Policy;
use tessera_sim::routing::{self, Comparison, EngineSpec, Workload};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json, print_text};

/// `tessera sim <subcommand>`.
#[derive(Debug, clap::Subcommand)]
pub enum SimSubcommand {
    /// Compare inference routers on a simulated pool (KV hit rate, TTFT, throughput).
    Routing(Args),
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Workload: `default` (8 equal tenants), `tenant-heavy` (2 heavy tenants
    /// with long prompts and sessions, 24 light ones) or `all`.
    #[arg(long, default_value = "default")]
    pub workload: String,
    /// Seeds: a range `1..3` (inclusive) or a list `1,5`.
    #[arg(long, default_value = "1..3")]
    pub seeds: String,
    /// Routers, comma-separated, or `all`: round-robin, least-load,
    /// sglang-cache-aware, llm-d-weighted, tessera.
    #[arg(long, default_value = "all")]
    pub routers: String,
    /// Engines (replicas) in the pool.
    #[arg(long)]
    pub engines: Option<usize>,
    /// KV-cache blocks (16 tokens each) per engine.
    #[arg(long)]
    pub cache_blocks: Option<u32>,
    /// New sessions per second (overrides the workload's).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Seconds during which sessions start (overrides the workload's).
    #[arg(long)]
    pub duration: Option<f64>,
    /// Runs at once (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Write an SVG plot of hit rate and TTFT p99 per router.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(c: SimSubcommand) -> i32 {
    match c {
        SimSubcommand::Routing(a) => run_routing(a),
    }
}

fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let bad = |v: &str| {
        format!("--seeds: `{v}` is not a number; use a range like 1..3 or a list like 1,5")
    };
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad(a))?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .map_err(|_| bad(b))?;
        if b < a || b - a >= 1000 {
            return Err(format!("--seeds: {a}..{b} is empty or longer than 1000"));
        }
        return Ok((a..=b).collect());
    }
    let v = s
        .split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().map_err(|_| bad(v)))
        .collect::<Result<Vec<u64>, _>>()?;
    if v.is_empty() {
        return Err("--seeds: no seed given".into());
    }
    Ok(v)
}

struct Settings {
    workloads: Vec<Workload>,
    seeds: Vec<u64>,
    policies: Vec<Policy>,
    engine: EngineSpec,
    threads: usize,
}

fn resolve(a: &Args) -> Result<Settings, String> {
    let names: Vec<&str> = if a.workload == "all" {
        vec!["default", "tenant-heavy"]
    } else {
        vec![a.workload.as_str()]
    };
    let mut workloads = Vec::new();
    for n in names {
        let mut w = Workload::by_name(n).ok_or_else(|| {
            format!("--workload: unknown workload {n:?}; use default, tenant-heavy or all")
        })?;
        if let Some(r) = a.rate {
            if !(r.is_finite() && r > 0.0 && r <= 1000.0) {
                return Err(format!("--rate: {r} is outside (0, 1000]"));
            }
            w.session_rate = r;
        }
        if let Some(d) = a.duration {
            if !(d.is_finite() && d > 0.0 && d <= 86_400.0) {
                return Err(format!("--duration: {d} is outside (0, 86400]"));
            }
            w.duration_s = d;
        }
        workloads.push(w);
    }
    let policies = if a.routers.trim() == "all" {
        Policy::ALL.to_vec()
    } else {
        let mut v = Vec::new();
        for p in a
            .routers
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            let p: Policy = p.parse().map_err(|e| format!("--routers: {e}"))?;
            if !v.contains(&p) {
                v.push(p);
            }
        }
        if v.is_empty() {
            return Err("--routers: none given; try `all`".into());
        }
        v
    };
    let mut engine = EngineSpec::default();
    if let Some(n) = a.engines {
        if !(1..=tessera_gateway::route::MAX_ENDPOINTS).contains(&n) {
            return Err(format!("--engines: {n} is outside 1..=64"));
        }
        engine.engines = n;
    }
    if let Some(c) = a.cache_blocks {
        if c < 64 {
            return Err(format!("--cache-blocks: {c} is below 64"));
        }
        engine.cache_blocks = c;
    }
    let threads = if a.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        a.threads
    };
    Ok(Settings {
        workloads,
        seeds: parse_seeds(&a.seeds)?,
        policies,
        engine,
        threads,
    })
}

fn table(c: &Comparison) -> String {
    let mut s = format!(
        "workload {} (mean of {} seed(s): {:?})\n{:<20} {:>8} {:>12} {:>12} {:>12}\n",
        c.workload,
        c.seeds.len(),
        c.seeds,
        "router",
        "hit rate",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "tokens/s"
    );
    for r in &c.routers {
        s += &format!(
            "{:<20} {:>8.4} {:>12.1} {:>12.1} {:>12.0}\n",
            r.router, r.hit_rate, r.ttft_p50_ms, r.ttft_p99_ms, r.tokens_per_sec
        );
    }
    let seeds_ok = c.per_seed.iter().filter(|s| s.tessera_dominates).count();
    s += &format!(
        "tessera at least as good as the best other on hit rate and TTFT p99, better on one: {} (on {seeds_ok}/{} seeds)\n\n",
        if c.tessera_dominates { "yes" } else { "no" },
        c.per_seed.len()
    );
    s
}

fn run_routing(a: Args) -> i32 {
    let s = match resolve(&a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let jobs = (s.workloads.len() * s.seeds.len() * s.policies.len()) as u64;
    let bar = indicatif::ProgressBar::new(jobs);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} simulating [{bar:30}] {pos}/{len} runs {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let start = std::time::Instant::now();
    let comparisons: Vec<Comparison> = s
        .workloads
        .iter()
        .map(|w| {
            routing::compare(w, &s.engine, &s.seeds, &s.policies, s.threads, &|| {
                bar.inc(1)
            })
        })
        .collect();
    bar.finish_and_clear();
    eprintln!(
        "{jobs} runs ({} workload(s) x {} seed(s) x {} routers) in {:.1} s",
        s.workloads.len(),
        s.seeds.len(),
        s.policies.len(),
        start.elapsed().as_secs_f64()
    );
    if let Some(path) = &a.plot {
        let runs: Vec<(String, Vec<routing::RouterResult>)> = comparisons
            .iter()
            .map(|c| (c.workload.clone(), c.routers.clone()))
            .collect();
        if let Err(e) = std::fs::write(path, routing::plot::svg(&runs)) {
            return fail(
                EXIT_FAILURE,
                format!("cannot write {}: {e}", path.display()),
            );
        }
        eprintln!("plot written to {}", path.display());
    }
    if a.json {
        if comparisons.len() == 1 {
            return print_json(&comparisons[0]);
        }
        return print_json(&serde_json::json!({ "workloads": comparisons }));
    }
    let mut out = String::new();
    for c in &comparisons {
        out += &table(c);
    }
    print_text(&out)
}
