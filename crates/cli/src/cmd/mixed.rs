//! `tessera sim-mixed`: training gangs through the batch scheduler and agent bursts
//! through the agent scheduler on one cluster, with shards moving between them.
//! Prints a summary and a time series (or JSON), and writes an SVG plot on request.

use tessera_sched::agent::ShardMode;
use tessera_sim::mixed::{Burst, MixedConfig, run};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json, print_text};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Simulated seconds.
    #[arg(long, default_value_t = 180.0)]
    pub duration: f64,
    /// Nodes (8 GPUs, 128 cores each).
    #[arg(long, default_value_t = 32)]
    pub nodes: usize,
    /// Agent tasks per second outside the burst.
    #[arg(long, default_value_t = 150.0)]
    pub agent_rate: f64,
    /// The agent burst: START,END,RATE (seconds, seconds, tasks per second).
    #[arg(long, default_value = "50,100,3000")]
    pub burst: String,
    /// Agent sandbox lifetime range in ms: MIN,MAX.
    #[arg(long, default_value = "100,500")]
    pub lifetime_ms: String,
    /// Training gangs per minute.
    #[arg(long, default_value_t = 20.0)]
    pub training_per_min: f64,
    /// Shard mode of the agent scheduler: soft (prefer own shard, may borrow) or hard.
    #[arg(long, default_value = "soft")]
    pub mode: String,
    /// Fewest nodes the agent shard keeps (headroom for bursts).
    #[arg(long, default_value_t = 1)]
    pub min_agent_nodes: usize,
    /// Most nodes that change hands per controller round.
    #[arg(long, default_value_t = 4)]
    pub max_step: usize,
    /// Seed.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// Print every Nth sample in the table.
    #[arg(long, default_value_t = 5)]
    pub every: usize,
    /// Write an SVG plot of shard sizes, GPU utilisation and agent p99 here.
    #[arg(long)]
    pub svg: Option<std::path::PathBuf>,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn pair(flag: &str, s: &str) -> Result<Vec<f64>, String> {
    s.split(',')
        .map(|x| {
            x.trim()
                .parse::<f64>()
                .map_err(|_| format!("{flag} {s:?}: {x:?} is not a number"))
        })
        .collect()
}

fn settings(a: &Args) -> Result<MixedConfig, String> {
    let mut c = MixedConfig {
        seed: a.seed,
        ..Default::default()
    };
    if !(a.duration > 0.0 && a.duration <= 86_400.0) {
        return Err(format!(
            "--duration {}: give 0 < seconds <= 86400",
            a.duration
        ));
    }
    if a.nodes == 0 || a.nodes > 100_000 {
        return Err(format!("--nodes {}: give 1..=100000", a.nodes));
    }
    let rates_ok = (0.0..=1e6).contains(&a.agent_rate) && (0.0..=1e4).contains(&a.training_per_min);
    if !rates_ok {
        return Err("--agent-rate must be 0..=1e6 and --training-per-min 0..=1e4".into());
    }
    c.duration_s = a.duration;
    c.nodes = a.nodes;
    c.initial_agent_nodes = c.initial_agent_nodes.min(a.nodes);
    c.agent_rate = a.agent_rate;
    c.training_per_min = a.training_per_min;
    let b = pair("--burst", &a.burst)?;
    match b.as_slice() {
        [s, e, r] if *s >= 0.0 && e >= s && (0.0..=1e6).contains(r) => {
            c.bursts = vec![Burst {
                start_s: *s,
                end_s: *e,
                rate: *r,
            }]
        }
        _ => {
            return Err(format!(
                "--burst {:?}: give START,END,RATE with START <= END, e.g. 50,100,3000",
                a.burst
            ));
        }
    }
    let l = pair("--lifetime-ms", &a.lifetime_ms)?;
    match l.as_slice() {
        [lo, hi] if *lo >= 1.0 && hi >= lo && *hi <= 3.6e6 => {
            c.agent_lifetime_ms = (*lo as u64, *hi as u64)
        }
        _ => {
            return Err(format!(
                "--lifetime-ms {:?}: give MIN,MAX in ms, 1 <= MIN <= MAX",
                a.lifetime_ms
            ));
        }
    }
    c.agent_mode = match a.mode.as_str() {
        "hard" => ShardMode::Hard,
        "soft" => ShardMode::Soft,
        m => return Err(format!("--mode {m:?}: give hard or soft")),
    };
    if a.min_agent_nodes > a.nodes || a.max_step == 0 {
        return Err(format!(
            "--min-agent-nodes {} must be at most --nodes {}, and --max-step at least 1",
            a.min_agent_nodes, a.nodes
        ));
    }
    c.initial_agent_nodes = c.initial_agent_nodes.max(a.min_agent_nodes);
    for p in &mut c.policies {
        match p {
            tessera_sched::agent::Policy::NodeCount { min, max } => {
                *max = (*max).min(a.nodes).max(a.min_agent_nodes);
                *min = a.min_agent_nodes;
            }
            tessera_sched::agent::Policy::MaxStep { nodes } => *nodes = a.max_step,
            _ => {}
        }
    }
    Ok(c)
}

pub fn run_cmd(a: Args) -> i32 {
    let cfg = match settings(&a) {
        Ok(c) => c,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    eprintln!(
        "sim-mixed: {} nodes, {} simulated seconds",
        cfg.nodes, cfg.duration_s
    );
    let report = run(&cfg);
    if let Some(path) = &a.svg {
        if let Err(e) = std::fs::write(path, report.svg(cfg.nodes)) {
            return fail(
                EXIT_FAILURE,
                format!("cannot write {}: {e}", path.display()),
            );
        }
        eprintln!("sim-mixed: plot written to {}", path.display());
    }
    if a.json {
        print_json(&report)
    } else {
        print_text(&report.table(a.every))
    }
}
