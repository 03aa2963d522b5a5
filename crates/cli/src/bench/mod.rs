//! `tessera bench …`: benchmarks that print a table, or one JSON document with `--json`.

pub mod agent;
pub mod agent_platform;
pub mod api;
pub mod browser;
pub mod console;
pub mod gateway;
pub mod gpushare;
pub mod guard;
pub mod k8s;
pub mod node;
pub mod sandbox;
pub mod sched;
pub mod tiers;
pub mod tools;
pub mod trust;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Batch scheduler throughput and decision latency on a synthetic cluster.
    Sched(sched::Args),
    /// Agent scheduler: parallel workers with optimistic concurrency.
    Agent(agent::Args),
    /// Guard: command-check latency and secret-scan throughput.
    Guard(guard::Args),
    /// Sandbox: cold create, warm claim, first exec, creations per minute.
    Sandbox(sandbox::Args),
    /// Control plane: job submissions per second and submit-to-bound latency
    /// against a real server on loopback.
    Api(api::Args),
    /// Agent platform: new session to first answer (warm pool), tool-gateway
    /// overhead per call and ledger writes per second.
    AgentPlatform(agent_platform::Args),
    /// Tool gateway alone: overhead per call (tool time excluded) per class of
    /// tool, replays, ledger writes per second.
    Tools(tools::Args),
    /// Kubernetes mode: pods bound per second and created-to-bound p99 against a
    /// real kube-apiserver with fake nodes.
    K8s(k8s::Args),
    /// Node runtime: sandboxed task start against plain fork+exec, eviction latency,
    /// and jobs per second to running and to completion on this machine (root).
    Node(node::Args),
    /// Inference gateway: its own time per request (request in to first byte
    /// forwarded, engine time excluded), plain and streaming, on loopback.
    Gateway(gateway::Args),
    /// GPU sharing on the fake CUDA driver: interception overhead per allocation
    /// and per launch, caps held, compute shares achieved.
    Gpushare(gpushare::Args),
    /// The console in headless Chromium at 5,000 nodes x 8 GPUs and 10,000 jobs:
    /// first paint of the cluster view, and a change applied from the watch
    /// against listing again and redrawing.
    Console(console::Args),
    /// The trust chain: template verify time, attestation round trip (swtpm), weights
    /// key release latency, and the sealed format's decrypt throughput.
    Trust(trust::Args),
}

/// Nearest-rank percentile of sorted samples (`p` in 0..=1); `None` when there
/// are none. Every benchmark reports percentiles through this one rule.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> Option<T> {
    let last = sorted.len().checked_sub(1)?;
    let i = (last as f64 * p).round() as usize;
    Some(sorted[i.min(last)])
}

pub fn run(c: BenchCommand) -> i32 {
    match c {
        BenchCommand::Sched(a) => sched::run(a),
        BenchCommand::Agent(a) => agent::run(a),
        BenchCommand::Guard(a) => guard::run(a),
        BenchCommand::Sandbox(a) => sandbox::run(a),
        BenchCommand::Api(a) => api::run(a),
        BenchCommand::AgentPlatform(a) => agent_platform::run(a),
        BenchCommand::Tools(a) => tools::run(a),
        BenchCommand::K8s(a) => k8s::run(a),
        BenchCommand::Gateway(a) => gateway::run(a),
        BenchCommand::Node(a) => node::run(a),
        BenchCommand::Gpushare(a) => gpushare::run(a),
        BenchCommand::Console(a) => console::run(a),
        BenchCommand::Trust(a) => trust::run(a),
    }
}
