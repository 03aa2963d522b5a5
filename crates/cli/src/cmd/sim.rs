//! `tessera sim`: replay the Alibaba GPU trace under placement policies, with the
//! FGD paper's protocol (shuffle per seed, inflate to 130 % of GPU capacity, one
//! attempt per pod, no departures).

use std::path::{Path, PathBuf};
use std::time::Instant;

use tessera_sched::gpu::Policy;
use tessera_sim::replay::{self, PolicySummary, ReplayConfig};
use tessera_sim::trace;

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

const DEFAULT_NODES: &str = "data/alibaba-gpu-v2023/openb_node_list_gpu_node.csv";
const DEFAULT_PODS: &str = "data/alibaba-gpu-v2023/openb_pod_list_default.csv";

/// The table's columns, for `--help`.
const COLUMNS: &str = "\
Columns of the table (means over the seeds; GPU amounts in % of the cluster's GPU capacity):
  policy         random, dotprod, clustering, packing, bestfit, fgd: the FGD paper's
                 policies as its simulator scores them; fgd-mem: FGD whose typical tasks
                 also ask for memory; tessera (ours): fgd-mem that also looks down the
                 chain of fills a share's gap will get, counts GPUs stranded for lack of
                 CPU and charges taking a contended GPU model (crates/sched/src/gpu/outlook.rs)
  alloc@100 %    GPUs allocated when the arrived GPU request reaches 100 % of capacity
  alloc@130 %    the same at 130 % (the end of the replay)
  unalloc@100 %  100 - alloc@100: the paper's \"unallocated GPU\" (lower is better)
  vs fgd pp      unalloc@100 of fgd minus this policy's (positive: fewer GPUs left unallocated)
  frag@90 %      fragmented GPU capacity at 90 % arrived, against the simulator's typical tasks
Under the table, the floor: a lower bound on unalloc@100 that no policy can beat on the same
arrivals (shares above half a GPU leave gaps only small shares can fill; tasks that accept few
GPU models cannot use the others), and how far fgd and tessera are above it.
The plot (--plot FILE.svg) draws, per policy, the GPU request that arrived but was not allocated
(% of capacity) against the arrived request (%); at 100 % it is unalloc@100.";

#[derive(Debug, clap::Args)]
#[command(after_help = COLUMNS)]
pub struct SimArgs {
    /// Other simulations (`routing`); without one, the GPU-trace replay.
    #[command(subcommand)]
    pub sub: Option<super::routing::SimSubcommand>,
    /// Node list (openb CSV). Default: the copy in the repository's data/ folder.
    #[arg(long, value_name = "FILE")]
    pub nodes: Option<PathBuf>,
    /// Pod list (openb CSV). Default: the production trace in data/.
    #[arg(long, value_name = "FILE")]
    pub pods: Option<PathBuf>,
    /// Policies, comma-separated, or `all` (every one but fgd-mem): random, dotprod,
    /// clustering, packing, bestfit, fgd, fgd-mem, tessera (ours).
    #[arg(long, default_value = "all", value_name = "P[,P...]|all")]
    pub policy: String,
    /// Seeds: a range `42..51` (inclusive) or a list `42,43`.
    #[arg(long, default_value = "42..51")]
    pub seeds: String,
    /// Arrived GPU request at the end, as a multiple of GPU capacity.
    #[arg(long, default_value_t = 1.3)]
    pub inflate: f64,
    /// Worker threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Write an SVG plot: GPU request arrived but not allocated, against the
    /// arrived request (both in % of capacity), one line per policy.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// `paper`: the FGD paper's protocol. `realtime`: arrivals and departures at
    /// the trace's creation/deletion times, a FIFO queue with retries after each
    /// departure; reports queueing delay percentiles (first seed only).
    #[arg(long, default_value = "paper", value_parser = ["paper", "realtime"])]
    pub mode: String,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Settings resolved from [`SimArgs`].
struct Settings {
    nodes: PathBuf,
    pods: PathBuf,
    policies: Vec<Policy>,
    seeds: Vec<u64>,
    cfg: ReplayConfig,
}

fn default_path(rel: &str) -> PathBuf {
    let here = PathBuf::from(rel);
    if here.exists() {
        return here;
    }
    // Running from elsewhere: the repository this binary was built from.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn parse_policies(s: &str) -> Result<Vec<Policy>, String> {
    if s.trim() == "all" {
        return Ok(Policy::GRID.to_vec());
    }
    let mut out = Vec::new();
    for p in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let p: Policy = p.parse().map_err(|e| format!("--policy: {e}"))?;
        if !out.contains(&p) {
            out.push(p);
        }
    }
    if out.is_empty() {
        return Err("--policy: no policy given; try `all` or `fgd,bestfit`".into());
    }
    Ok(out)
}

fn parse_seeds(s: &str) -> Result<Vec<u64>, String> {
    let bad = |v: &str| {
        format!("--seeds: `{v}` is not a number; use a range like 42..51 or a list like 42,43")
    };
    if let Some((a, b)) = s.split_once("..") {
        let a: u64 = a.trim().parse().map_err(|_| bad(a))?;
        let b: u64 = b
            .trim()
            .trim_start_matches('=')
            .parse()
            .map_err(|_| bad(b))?;
        if b < a {
            return Err(format!("--seeds: empty range {a}..{b}"));
        }
        if b - a >= 10_000 {
            return Err(format!(
                "--seeds: {} seeds is too many (at most 10000)",
                b - a + 1
            ));
        }
        return Ok((a..=b).collect());
    }
    s.split(',')
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .map(|v| v.parse().map_err(|_| bad(v)))
        .collect::<Result<Vec<u64>, _>>()
        .and_then(|v| {
            if v.is_empty() {
                Err("--seeds: no seed given".into())
            } else {
                Ok(v)
            }
        })
}

fn resolve(a: &SimArgs) -> Result<Settings, String> {
    if !(a.inflate.is_finite() && a.inflate > 0.0 && a.inflate <= 10.0) {
        return Err(format!("--inflate: {} is outside (0, 10]", a.inflate));
    }
    Ok(Settings {
        nodes: a
            .nodes
            .clone()
            .unwrap_or_else(|| default_path(DEFAULT_NODES)),
        pods: a.pods.clone().unwrap_or_else(|| default_path(DEFAULT_PODS)),
        policies: parse_policies(&a.policy)?,
        seeds: parse_seeds(&a.seeds)?,
        cfg: ReplayConfig {
            inflate: a.inflate,
            ..ReplayConfig::default()
        },
    })
}

pub fn run(mut a: SimArgs) -> i32 {
    if let Some(sub) = a.sub.take() {
        return super::routing::run(sub);
    }
    let s = match resolve(&a) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let nodes = match trace::load_nodes(&s.nodes) {
        Ok(n) => n,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("{e} (--nodes)")),
    };
    let pods = match trace::load_pods(&s.pods) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("{e} (--pods)")),
    };
    let prep = match replay::prepare(&nodes, &pods, &s.cfg) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    if a.mode == "realtime" {
        return run_realtime(&a, &s, &prep);
    }
    let jobs = (s.policies.len() * s.seeds.len()) as u64;
    let bar = indicatif::ProgressBar::new(jobs);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} replaying [{bar:30}] {pos}/{len} runs {elapsed}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let start = Instant::now();
    let summaries = replay::run_grid(&prep, &s.policies, &s.seeds, &s.cfg, a.threads, &|_| {
        bar.inc(1)
    });
    bar.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let floors: Vec<f64> = s
        .seeds
        .iter()
        .map(|&seed| replay::floor_at_100(&prep, seed, s.cfg.inflate))
        .collect();
    let floor = floors.iter().sum::<f64>() / floors.len().max(1) as f64;
    eprintln!(
        "{} runs ({} policies x {} seeds) of {} pods on {} nodes in {secs:.1} s",
        jobs,
        s.policies.len(),
        s.seeds.len(),
        pods.len(),
        nodes.len()
    );
    if let Some(path) = &a.plot {
        let title = format!(
            "{}: GPU request not allocated vs arrived",
            s.pods
                .file_name()
                .map_or_else(String::new, |f| f.to_string_lossy().into_owned())
        );
        if let Err(e) = std::fs::write(path, replay::svg_plot(&title, &summaries)) {
            return fail(
                EXIT_FAILURE,
                format!("cannot write {}: {e}", path.display()),
            );
        }
        eprintln!("plot written to {}", path.display());
    }
    if a.json {
        return print_json(&json(&s, &summaries, floor));
    }
    print_table(&summaries, floor);
    0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn fgd_unalloc(sums: &[PolicySummary]) -> Option<f64> {
    sums.iter()
        .find(|p| p.policy == Policy::Fgd)
        .map(|p| p.unalloc_at_100)
}

fn json(s: &Settings, sums: &[PolicySummary], floor: f64) -> serde_json::Value {
    let fgd = fgd_unalloc(sums);
    serde_json::json!({
        "floor_unalloc_at_100": round2(floor),
        "nodes": s.nodes.display().to_string(),
        "pods": s.pods.display().to_string(),
        "seeds": s.seeds,
        "inflate": s.cfg.inflate,
        "policies": sums.iter().map(|p| serde_json::json!({
            "policy": p.policy.name(),
            "alloc_at_100": round2(p.alloc_at_100),
            "alloc_at_130": round2(p.alloc_at_130),
            "unalloc_at_100": round2(p.unalloc_at_100),
            "frag_at_90": round2(p.frag_at_90),
            "better_than_fgd_pp": fgd.map(|f| round2(f - p.unalloc_at_100)),
        })).collect::<Vec<_>>(),
    })
}

fn print_table(sums: &[PolicySummary], floor: f64) {
    let fgd = fgd_unalloc(sums);
    println!(
        "{:<12} {:>13} {:>13} {:>15} {:>10} {:>11}",
        "policy", "alloc@100 %", "alloc@130 %", "unalloc@100 %", "vs fgd pp", "frag@90 %"
    );
    for p in sums {
        let vs = fgd.map_or_else(|| "-".into(), |f| format!("{:+.2}", f - p.unalloc_at_100));
        println!(
            "{:<12} {:>13.2} {:>13.2} {:>15.2} {:>10} {:>11.2}",
            p.policy.name(),
            p.alloc_at_100,
            p.alloc_at_130,
            p.unalloc_at_100,
            vs,
            p.frag_at_90
        );
    }
    let above = |pol: Policy| {
        sums.iter()
            .find(|p| p.policy == pol)
            .map(|p| {
                format!(
                    ", {} {:.2} pp above it",
                    pol.name(),
                    p.unalloc_at_100 - floor
                )
            })
            .unwrap_or_default()
    };
    println!(
        "floor: unalloc@100 >= {floor:.2} % for any policy on these arrivals{}{}",
        above(Policy::Fgd),
        above(Policy::Tessera)
    );
}

fn run_realtime(a: &SimArgs, s: &Settings, prep: &replay::Prepared) -> i32 {
    let seed = s.seeds[0];
    let start = Instant::now();
    let bar = indicatif::ProgressBar::new(s.policies.len() as u64);
    let results: Vec<Result<replay::RealtimeResult, replay::PrepareError>> =
        std::thread::scope(|sc| {
            let handles: Vec<_> = s
                .policies
                .iter()
                .map(|&p| {
                    let bar = &bar;
                    sc.spawn(move || {
                        let r = replay::run_realtime(prep, p, seed);
                        bar.inc(1);
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| {
                        Err(replay::PrepareError("a replay thread panicked".into()))
                    })
                })
                .collect()
        });
    bar.finish_and_clear();
    let mut rows = Vec::new();
    for r in results {
        match r {
            Ok(r) => rows.push(r),
            Err(e) => return fail(EXIT_BAD_INPUT, format!("{e} (--pods {})", s.pods.display())),
        }
    }
    eprintln!(
        "real-time replay of {} pods, {} policies, seed {seed}, in {:.1} s",
        prep.pods.len(),
        rows.len(),
        start.elapsed().as_secs_f64()
    );
    let pct = |n: usize, of: usize| {
        if of == 0 {
            0.0
        } else {
            round2(100.0 * n as f64 / of as f64)
        }
    };
    if a.json {
        return print_json(&serde_json::json!({
            "mode": "realtime",
            "pods": s.pods.display().to_string(),
            "seed": seed,
            "policies": rows.iter().map(|r| serde_json::json!({
                "policy": r.policy.name(),
                "placed_pct": pct(r.placed, r.pods),
                "immediate_pct": pct(r.immediate, r.pods),
                "delay_p50_s": r.delay_p50,
                "delay_p90_s": r.delay_p90,
                "delay_p99_s": r.delay_p99,
                "delay_max_s": r.delay_max,
            })).collect::<Vec<_>>(),
        }));
    }
    println!(
        "{:<12} {:>9} {:>11} {:>9} {:>9} {:>9} {:>10}",
        "policy", "placed %", "immediate %", "p50 s", "p90 s", "p99 s", "max s"
    );
    for r in &rows {
        println!(
            "{:<12} {:>9.2} {:>11.2} {:>9} {:>9} {:>9} {:>10}",
            r.policy.name(),
            pct(r.placed, r.pods),
            pct(r.immediate, r.pods),
            r.delay_p50,
            r.delay_p90,
            r.delay_p99,
            r.delay_max
        );
    }
    0
}
