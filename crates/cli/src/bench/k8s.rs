//! `tessera bench k8s`: pods bound per second and created-to-bound latency
//! against a real kube-apiserver with fake nodes (see `tessera_k8s::bench`).
//! Without `--kubeconfig`, starts its own apiserver and etcd from
//! `TESSERA_KUBE_APISERVER` and `TESSERA_ETCD`.

use std::path::PathBuf;

use tessera_k8s::bench::{BenchOptions, BenchResult};
use tessera_k8s::testenv::{TestEnv, binaries};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json, print_text};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Fake nodes to create (32 cores, 128 GiB, 110 pods each).
    #[arg(long, default_value_t = 5000)]
    pub nodes: usize,
    /// Pods per run (two runs: end to end, then binding only).
    #[arg(long, default_value_t = 10_000)]
    pub pods: usize,
    /// Writes the scheduler keeps in flight.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Creates the harness keeps in flight.
    #[arg(long, default_value_t = 64)]
    pub create_concurrency: usize,
    /// Use this cluster (it must be empty and disposable) instead of starting
    /// an apiserver.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn table(r: &BenchResult) -> String {
    let mut s = format!(
        "tessera bench k8s: {} nodes, {} pods per run (nodes created at {:.0}/s)\n",
        r.nodes, r.pods, r.node_create_per_sec
    );
    s.push_str(
        "run            bound   seconds   pods/s   p50 ms   p99 ms   created/s  cycles  decide ms  apply ms\n",
    );
    for x in &r.runs {
        s.push_str(&format!(
            "{:<13} {:>6} {:>9.2} {:>8.0} {:>8.0} {:>8.0} {:>11.0} {:>7} {:>10.0} {:>9.0}\n",
            x.mode,
            x.bound,
            x.seconds,
            x.pods_per_sec,
            x.bind_p50_ms,
            x.bind_p99_ms,
            x.create_per_sec,
            x.cycles,
            x.decide_ms,
            x.apply_ms
        ));
    }
    s.push_str("(binding-only latency is controller start to bound)\n");
    s
}

pub fn run(a: Args) -> i32 {
    if a.nodes == 0 || a.pods == 0 {
        return fail(EXIT_BAD_INPUT, "--nodes and --pods must be at least 1");
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    rt.block_on(async move {
        let mut _env = None;
        let client = match &a.kubeconfig {
            Some(p) => match crate::cmd::k8s::client(Some(p)).await {
                Ok(c) => c,
                Err((code, m)) => return fail(code, m),
            },
            None => {
                let b = match binaries() {
                    Ok(b) => b,
                    Err(e) => return fail(EXIT_BAD_INPUT, format!("{e}; or pass --kubeconfig")),
                };
                eprintln!("starting kube-apiserver and etcd on loopback…");
                let env = match TestEnv::start(&b).await {
                    Ok(e) => e,
                    Err(e) => return fail(EXIT_FAILURE, e),
                };
                let c = match env.client() {
                    Ok(c) => c,
                    Err(e) => return fail(EXIT_FAILURE, e),
                };
                _env = Some(env);
                c
            }
        };
        let o = BenchOptions {
            nodes: a.nodes,
            pods: a.pods,
            concurrency: a.concurrency.max(1),
            create_concurrency: a.create_concurrency.max(1),
        };
        match tessera_k8s::bench::run(client, &o).await {
            Ok(r) if a.json => print_json(&r),
            Ok(r) => print_text(&table(&r)),
            Err(e) => fail(EXIT_FAILURE, e),
        }
    })
}
