//! `tessera k8s …`: Tessera as a secondary scheduler on Kubernetes.
//! `manifests` prints the CRDs, RBAC and a Deployment; `run` runs the scheduler
//! and its controllers in or out of the cluster. See `docs/k8s.md`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand};
use tessera_k8s::manifests::{ManifestOptions, render};
use tessera_k8s::{LeaseConfig, Metrics, RunConfig};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_text};

#[derive(Debug, Subcommand)]
pub enum K8sCommand {
    /// Print the CRDs (PodGroup, Queue, NodeShard), RBAC and a Deployment as YAML
    /// for `kubectl apply -f -`.
    Manifests(ManifestArgs),
    /// Run the scheduler against a cluster: pods with `schedulerName: tessera`,
    /// PodGroups and Queues (Tessera's, Volcano's, scheduler-plugins'), with
    /// leader election among replicas.
    Run(RunArgs),
}

#[derive(Debug, Args)]
pub struct ManifestArgs {
    /// Namespace of the Deployment, its ServiceAccount and the lease.
    #[arg(long, default_value = "tessera-system")]
    pub namespace: String,
    /// Container image of the scheduler.
    #[arg(long, default_value = "ghcr.io/tessera/tessera:latest")]
    pub image: String,
    /// Replicas (one leads; the others wait on the lease).
    #[arg(long, default_value_t = 2)]
    pub replicas: u32,
    /// The `schedulerName` pods use to ask for Tessera.
    #[arg(long, default_value = "tessera")]
    pub scheduler_name: String,
    /// Also print Volcano's and scheduler-plugins' PodGroup/Queue CRDs, for
    /// clusters that have jobs written for them but not those projects.
    #[arg(long)]
    pub foreign_crds: bool,
    /// A Kubernetes RuntimeClass for Tessera runtime class NAME, run by the nodes' CRI
    /// handler HANDLER (`isolated=kata-qemu`, `sandboxed=runsc`), with the node selector
    /// `runtime-class.tessera.io/NAME: "true"`: its pods land only on nodes labelled so
    /// (`kubectl label node N runtime-class.tessera.io/NAME=true`). Repeatable.
    #[arg(long = "runtime-class", value_name = "NAME=HANDLER", value_parser = runtime_class_flag)]
    pub runtime_classes: Vec<tessera_k8s::manifests::RuntimeClassManifest>,
}

fn runtime_class_flag(s: &str) -> Result<tessera_k8s::manifests::RuntimeClassManifest, String> {
    let (name, handler) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: write NAME=HANDLER, e.g. isolated=kata-qemu"))?;
    tessera_sandbox::class::check_name(name).map_err(|e| e.to_string())?;
    // A CRI handler is a DNS label (Kubernetes validates it the same way).
    if handler.is_empty()
        || handler.len() > 63
        || !handler
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(format!(
            "handler {handler:?}: a CRI runtime handler name (a-z, 0-9, '-'; at most 63)"
        ));
    }
    Ok(tessera_k8s::manifests::RuntimeClassManifest {
        name: name.to_string(),
        handler: handler.to_string(),
        node_selector: [(tessera_sandbox::class::label(name), "true".to_string())].into(),
    })
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Kubeconfig file (default: in-cluster service account, then
    /// $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The `schedulerName` of the pods to place.
    #[arg(long, default_value = "tessera")]
    pub scheduler_name: String,
    /// Namespace of the leader-election lease.
    #[arg(long, default_value = "tessera-system")]
    pub lease_namespace: String,
    /// Name of the leader-election lease.
    #[arg(long, default_value = "tessera-scheduler")]
    pub lease_name: String,
    /// This replica's identity on the lease (default: $POD_NAME, else host name
    /// and process id).
    #[arg(long)]
    pub identity: Option<String>,
    /// Run without leader election (only ever one replica!).
    #[arg(long)]
    pub no_leader_elect: bool,
    /// Writes in flight at once (bindings, evictions, status).
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Do not write an event for each pending reason (the pod condition still is).
    #[arg(long)]
    pub no_events: bool,
    /// Node label keys of the network tiers (rack, spine, …), bottom up,
    /// comma-separated; read when the cluster has no Volcano HyperNodes.
    #[arg(
        long,
        value_name = "KEYS",
        value_delimiter = ',',
        default_values_t = tessera_k8s::network::default_label_keys()
    )]
    pub network_label_keys: Vec<String>,
    /// The scheduler's `actions` and `tiers`, as in `tessera sched plan` files
    /// (Volcano's spelling accepted); the default is `tessera up`'s: Volcano's usual
    /// configuration with the `reservation` plugin on.
    #[arg(long, value_name = "FILE")]
    pub scheduler_config: Option<PathBuf>,
}

pub fn run(c: K8sCommand) -> i32 {
    match c {
        K8sCommand::Manifests(a) => manifests(a),
        K8sCommand::Run(a) => run_cmd(a),
    }
}

fn manifests(a: ManifestArgs) -> i32 {
    if a.namespace.is_empty() || a.image.is_empty() || a.scheduler_name.is_empty() {
        return fail(
            EXIT_BAD_INPUT,
            "--namespace, --image and --scheduler-name must not be empty",
        );
    }
    print_text(&render(&ManifestOptions {
        namespace: a.namespace,
        image: a.image,
        replicas: a.replicas,
        scheduler_name: a.scheduler_name,
        foreign_crds: a.foreign_crds,
        runtime_classes: a.runtime_classes,
    }))
}

/// What to tell the user when there is no client: the exit status and message.
pub fn client_error(e: tessera_k8s::ClientError) -> (i32, String) {
    use tessera_k8s::ClientError as E;
    match e {
        E::Kubeconfig { .. } => (EXIT_BAD_INPUT, format!("--kubeconfig {e}")),
        E::NoCluster(_) => (
            EXIT_BAD_INPUT,
            format!("{e}; pass --kubeconfig FILE or run in a pod"),
        ),
        E::Client(_) => (EXIT_FAILURE, e.to_string()),
    }
}

fn run_cmd(a: RunArgs) -> i32 {
    let mut sched = tessera_server::scheduler::SchedulerSettings::default();
    if let Some(path) = &a.scheduler_config {
        match tessera_sim::scenario::load_config(path) {
            Ok(c) => sched.config = c,
            Err(e) => return fail(EXIT_BAD_INPUT, format!("--scheduler-config: {e}")),
        }
    }
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    rt.block_on(async move {
        let client = match tessera_k8s::client(a.kubeconfig.as_deref()).await {
            Ok(c) => c,
            Err(e) => {
                let (code, msg) = client_error(e);
                return fail(code, msg);
            }
        };
        let identity = a
            .identity
            .or_else(|| std::env::var("POD_NAME").ok())
            .unwrap_or_else(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .map(|h| h.trim().to_string())
                    .unwrap_or_else(|_| "tessera".into());
                format!("{host}-{}", std::process::id())
            });
        let cfg = RunConfig {
            scheduler_name: a.scheduler_name,
            lease: (!a.no_leader_elect)
                .then(|| LeaseConfig::new(&a.lease_namespace, &a.lease_name, &identity)),
            concurrency: a.concurrency.max(1),
            period: Duration::from_secs(5),
            events: !a.no_events,
            network_label_keys: a
                .network_label_keys
                .iter()
                .map(|k| k.trim().to_string())
                .filter(|k| !k.is_empty())
                .collect(),
            sched: sched.config.clone(),
            ..RunConfig::default()
        };
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("tessera k8s run: stopping");
            let _ = tx.send(true);
        });
        eprintln!(
            "tessera k8s run: {identity} scheduling pods of schedulerName {}",
            cfg.scheduler_name
        );
        eprintln!("tessera k8s run: scheduler: {}", sched.describe());
        loop {
            let r = tessera_k8s::run(
                client.clone(),
                cfg.clone(),
                Arc::new(Metrics::default()),
                rx.clone(),
            )
            .await;
            match r {
                Ok(()) => return 0,
                // A CRD installed after the start: watch it too.
                Err(e @ tessera_k8s::RunError::ApisChanged(_)) => {
                    eprintln!("tessera k8s run: {e}; starting again");
                }
                Err(e) => return fail(EXIT_FAILURE, e),
            }
        }
    })
}
