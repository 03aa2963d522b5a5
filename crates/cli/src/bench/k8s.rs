//! `tessera bench k8s`: pods bound per second and created-to-bound latency
//! against a real kube-apiserver with fake nodes (see `tessera_k8s::bench`).
//! Without `--kubeconfig`, starts its own apiserver and etcd from
//! `TESSERA_KUBE_APISERVER` and `TESSERA_ETCD`. With `--kube-scheduler` the
//! same runs measure Kubernetes' own scheduler instead; with `--offline`, one
//! controller cycle is measured with no apiserver at all.

use std::path::PathBuf;

use tessera_k8s::bench::{BenchOptions, BenchResult, Contender, CycleCost};
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
    /// Measure kube-scheduler (this binary, v1.20 or later, e.g. built by
    /// `TESSERA_K8S_WITH_SCHEDULER=1 .ci/k8s-apiserver.sh`) instead of Tessera,
    /// against the same apiserver and harness.
    #[arg(long, value_name = "FILE", env = "TESSERA_KUBE_SCHEDULER")]
    pub kube_scheduler: Option<PathBuf>,
    /// No apiserver: measure one controller cycle (assembling the snapshot
    /// afresh, patching it after one pod changed, the scheduler's session)
    /// over `--nodes` nodes and `--pods` pods, `--pending` of them unbound.
    #[arg(long, conflicts_with_all = ["kubeconfig", "kube_scheduler"])]
    pub offline: bool,
    /// With `--offline`: how many of the pods are pending.
    #[arg(long, default_value_t = 100, requires = "offline")]
    pub pending: usize,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

fn cycle_table(c: &CycleCost) -> String {
    format!(
        "tessera bench k8s --offline: {} nodes, {} pods ({} pending), median of {} cycles\n\
         snapshot afresh ms   snapshot patched ms   schedule ms   placed\n\
         {:>18.2} {:>21.3} {:>13.2} {:>8}\n",
        c.nodes, c.pods, c.pending, c.runs, c.build_ms, c.patch_ms, c.schedule_ms, c.placed
    )
}

fn table(r: &BenchResult) -> String {
    let mut s = format!(
        "tessera bench k8s ({}): {} nodes, {} pods per run (nodes created at {:.0}/s)\n",
        r.scheduler, r.nodes, r.pods, r.node_create_per_sec
    );
    s.push_str(
        "run            bound   seconds   pods/s   p50 ms   p99 ms   created/s  cycles (patched)  decide ms  apply ms\n",
    );
    for x in &r.runs {
        s.push_str(&format!(
            "{:<13} {:>6} {:>9.2} {:>8.0} {:>8.0} {:>8.0} {:>11.0} {:>7} {:>9} {:>10.0} {:>9.0}\n",
            x.mode,
            x.bound,
            x.seconds,
            x.pods_per_sec,
            x.bind_p50_ms,
            x.bind_p99_ms,
            x.create_per_sec,
            x.cycles,
            format!("({})", x.patched_cycles),
            x.decide_ms,
            x.apply_ms
        ));
    }
    s.push_str("(binding-only latency is scheduler start to bound)\n");
    s.push_str("CPU seconds during each run:\n");
    for x in &r.runs {
        let parts: Vec<String> = x
            .cpu_seconds
            .iter()
            .map(|(n, c)| format!("{n} {c:.1}"))
            .collect();
        s.push_str(&format!("  {:<13} {}\n", x.mode, parts.join(", ")));
    }
    s
}

pub fn run(a: Args) -> i32 {
    if a.nodes == 0 || a.pods == 0 {
        return fail(EXIT_BAD_INPUT, "--nodes and --pods must be at least 1");
    }
    if a.offline {
        if a.pending > a.pods {
            return fail(
                EXIT_BAD_INPUT,
                format!("--pending {} is more than --pods {}", a.pending, a.pods),
            );
        }
        let c = tessera_k8s::bench::cycle_cost(a.nodes, a.pods, a.pending, 11);
        return if a.json {
            print_json(&c)
        } else {
            print_text(&cycle_table(&c))
        };
    }
    if let Some(k) = &a.kube_scheduler
        && !k.is_file()
    {
        return fail(
            EXIT_BAD_INPUT,
            format!(
                "--kube-scheduler {}: no such file (build it with TESSERA_K8S_WITH_SCHEDULER=1 bash .ci/k8s-apiserver.sh)",
                k.display()
            ),
        );
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    rt.block_on(async move {
        let mut _env: Option<TestEnv> = None;
        let mut kubeconfig = a.kubeconfig.clone();
        let mut dir = std::env::temp_dir();
        let mut processes = Vec::new();
        let client = match &a.kubeconfig {
            Some(p) => match tessera_k8s::client(Some(p.as_path())).await {
                Ok(c) => c,
                Err(e) => {
                    let (code, m) = crate::cmd::k8s::client_error(e);
                    return fail(code, m);
                }
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
                if a.kube_scheduler.is_some() {
                    match env.write_kubeconfig() {
                        Ok(p) => kubeconfig = Some(p),
                        Err(e) => return fail(EXIT_FAILURE, e),
                    }
                }
                dir = env.dir().to_path_buf();
                let (apiserver, etcd) = env.pids();
                processes = vec![("kube-apiserver", apiserver), ("etcd", etcd)];
                _env = Some(env);
                c
            }
        };
        let o = BenchOptions {
            nodes: a.nodes,
            pods: a.pods,
            concurrency: a.concurrency.max(1),
            create_concurrency: a.create_concurrency.max(1),
            contender: match (&a.kube_scheduler, kubeconfig) {
                (Some(b), Some(k)) => Contender::KubeScheduler {
                    binary: b.clone(),
                    kubeconfig: k,
                    dir,
                },
                _ => Contender::Tessera,
            },
            processes,
        };
        match tessera_k8s::bench::run(client, &o).await {
            Ok(r) if a.json => print_json(&r),
            Ok(r) => print_text(&table(&r)),
            Err(e) => fail(EXIT_FAILURE, e),
        }
    })
}
