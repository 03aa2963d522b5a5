//! `tessera bench gateway`: the inference gateway's own time per request
//! (request in to first byte forwarded, engine time excluded), plain and
//! streaming, on loopback with in-process test engines that answer at once.
//! See `tessera_gateway::bench` for what is and is not measured.

use serde::Serialize;
use tessera_gateway::bench::{BenchConfig, ModeSamples, run as bench};

use super::percentile;
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Requests measured per mode (plain, streaming).
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Requests at once.
    #[arg(long, default_value_t = 1)]
    pub concurrency: usize,
    /// Unmeasured requests per mode first.
    #[arg(long, default_value_t = 200)]
    pub warmup: usize,
    /// Bytes of system prompt per request (the gateway hashes the prompt's
    /// prefix blocks for routing).
    #[arg(long, default_value_t = 4096)]
    pub prompt_bytes: usize,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Mode {
    mode: &'static str,
    requests: usize,
    overhead_p50_us: u64,
    overhead_p99_us: u64,
    overhead_max_us: u64,
    ttfb_gateway_p50_us: u64,
    ttfb_gateway_p99_us: u64,
    ttfb_direct_p50_us: u64,
    ttfb_direct_p99_us: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    requests_per_mode: usize,
    concurrency: usize,
    prompt_bytes: usize,
    /// Over both modes.
    overhead_p50_us: u64,
    overhead_p99_us: u64,
    modes: Vec<Mode>,
}

fn pct(v: &[u64], p: f64) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    percentile(&s, p).unwrap_or(0)
}

fn mode(m: &ModeSamples) -> Mode {
    Mode {
        mode: m.mode,
        requests: m.overhead_us.len(),
        overhead_p50_us: pct(&m.overhead_us, 0.5),
        overhead_p99_us: pct(&m.overhead_us, 0.99),
        overhead_max_us: pct(&m.overhead_us, 1.0),
        ttfb_gateway_p50_us: pct(&m.ttfb_gateway_us, 0.5),
        ttfb_gateway_p99_us: pct(&m.ttfb_gateway_us, 0.99),
        ttfb_direct_p50_us: pct(&m.ttfb_direct_us, 0.5),
        ttfb_direct_p99_us: pct(&m.ttfb_direct_us, 0.99),
    }
}

pub fn run(a: Args) -> i32 {
    if a.requests == 0 || a.concurrency == 0 {
        return fail(
            EXIT_BAD_INPUT,
            "--requests and --concurrency must be at least 1",
        );
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    let cfg = BenchConfig {
        requests: a.requests,
        concurrency: a.concurrency,
        warmup: a.warmup,
        prompt_bytes: a.prompt_bytes,
    };
    let samples = match rt.block_on(bench(&cfg)) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let all: Vec<u64> = samples
        .iter()
        .flat_map(|m| m.overhead_us.iter().copied())
        .collect();
    let r = Report {
        requests_per_mode: a.requests,
        concurrency: a.concurrency,
        prompt_bytes: a.prompt_bytes,
        overhead_p50_us: pct(&all, 0.5),
        overhead_p99_us: pct(&all, 0.99),
        modes: samples.iter().map(mode).collect(),
    };
    if a.json {
        return print_json(&r);
    }
    println!(
        "tessera bench gateway ({} requests per mode, {} at once, {} B system prompt, loopback, test engines answering at once)",
        r.requests_per_mode, r.concurrency, r.prompt_bytes
    );
    println!(
        "{:<8} {:>9} {:>9} {:>9} {:>14} {:>14} {:>14}",
        "mode", "ovh p50", "ovh p99", "ovh max", "ttfb gw p50", "ttfb gw p99", "ttfb direct p50"
    );
    for m in &r.modes {
        println!(
            "{:<8} {:>9} {:>9} {:>9} {:>14} {:>14} {:>14}",
            m.mode,
            m.overhead_p50_us,
            m.overhead_p99_us,
            m.overhead_max_us,
            m.ttfb_gateway_p50_us,
            m.ttfb_gateway_p99_us,
            m.ttfb_direct_p50_us
        );
    }
    println!(
        "gateway overhead (request in to first byte forwarded, engine time excluded), µs: p50 {} p99 {}",
        r.overhead_p50_us, r.overhead_p99_us
    );
    0
}
