//! `tessera-server`: the control plane. A JSON API under `/v1` (axum) with an
//! OpenAPI document, API keys and per-tenant roles, every read and write scoped to
//! the caller's tenant, an audit log, watches as server-sent events, and the
//! scheduler loop that turns pending jobs into bindings.
//!
//! Layers: [`api`] translates HTTP to calls on [`plane::ControlPlane`], which holds
//! the rules and talks to the store; [`scheduler`] runs the batch scheduler over a
//! snapshot of the store. Only this crate knows HTTP; only the store knows SQL.
// The OpenAPI document is one `json!` literal, deeper than the default limit allows.
#![recursion_limit = "256"]

pub mod access;
pub mod agents;
pub mod api;
pub mod attestation;
pub mod auth;
pub mod classes;
pub mod cluster;
pub mod exchange;
pub mod exec;
pub mod gateway;
pub mod gpu;
pub mod guardpol;
pub mod heartbeat;
pub mod identity;
pub mod jobfile;
pub mod jobs;
mod keyfile;
pub mod mcp;
pub mod metrics;
pub mod node;
pub mod oidc;
pub mod otlp;
pub mod placement;
pub mod plane;
pub mod problem;
pub mod queuecaps;
pub mod redact;
pub mod sandboxes;
pub mod scheduler;
pub mod tools;
pub mod ui;
pub mod weights;
pub mod wire;

use std::net::SocketAddr;
use std::time::Duration;

pub use plane::{Caller, ControlPlane, SYSTEM_TENANT};
pub use problem::{ApiError, Code};
pub use tessera_store::{AnyStore, PgStore, SqliteStore};

/// Makes the data folder the server's alone (0700): the store, task logs and templates
/// live there and no workload may read it. A folder it creates is private from the
/// start; an existing one readable by others is tightened when it is empty or already
/// holds a Tessera store, else left as it is with a warning (returned) — it may be a
/// folder the operator shares on purpose.
pub fn prepare_data_dir(dir: &std::path::Path) -> Result<Option<String>, String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map(|()| None)
            .map_err(|e| format!("creating the data folder {}: {e}", dir.display())),
        Err(e) => Err(format!("the data folder {}: {e}", dir.display())),
        Ok(m) if !m.is_dir() => Err(format!("the data folder {} is not a folder", dir.display())),
        Ok(m) if m.permissions().mode() & 0o077 == 0 => Ok(None),
        Ok(_) => {
            let ours = dir.join("tessera.db").exists()
                || std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
            if ours {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    .map(|()| None)
                    .map_err(|e| format!("making the data folder {} private: {e}", dir.display()))
            } else {
                Ok(Some(format!(
                    "the data folder {} can be read by other users; Tessera keeps its store, \
                     task logs and templates there: use a folder of its own (--data DIR)",
                    dir.display()
                )))
            }
        }
    }
}

/// How to run the server.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// Largest request body accepted, in bytes (larger gets 413).
    pub body_limit: usize,
    /// The scheduler to run, or `None` for no scheduler loop.
    pub scheduler: Option<scheduler::ScheduleFn>,
    /// How often the scheduler runs when nothing changes.
    pub schedule_period: Duration,
    /// Register the local machine as a node at start.
    pub register_local_node: bool,
    /// Run the tasks bound to the local node as child processes, with their logs
    /// in this folder (needs `register_local_node`).
    pub executor_logs: Option<std::path::PathBuf>,
    /// Accept OIDC bearer tokens from this issuer too.
    pub oidc: Option<oidc::OidcConfig>,
    /// How the change log is trimmed.
    pub compaction: Compaction,
    /// Simulated nodes to register, whose tasks run in simulated time.
    pub simulated: Option<Simulated>,
    /// The pillars served beside the core API, each configured by its module.
    pub sandboxes: sandboxes::SandboxesConfig,
    pub agents: agents::AgentsConfig,
    pub tools: tools::ToolsConfig,
    pub gateway: gateway::GatewayConfig,
    /// The runtime guard of every workload (sandboxes, sessions, built-in tools, job
    /// tasks): the operator's policy as the floor; tenants add their own through
    /// `PUT /v1/guard/policy`, which can only tighten it.
    pub guard: std::sync::Arc<tessera_sandbox::PolicyGuard>,
    /// The local node's runtime: how job tasks run on this machine.
    pub node: NodeSettings,
    /// The template registry's folder (`tessera template import` writes there);
    /// `None`: only the built-in `host` template.
    pub templates: Option<std::path::PathBuf>,
    /// The trust policy every template is admitted by, at submit and at every start
    /// (`tessera up --trust-policy FILE`; needs `templates`).
    pub trust: Option<std::sync::Arc<tessera_sandbox::trust::TrustPolicy>>,
    /// Runtime classes (`standard`, `isolated`, and the operator's) and each tenant's
    /// minimum class.
    pub classes: classes::ClassPolicy,
}

/// How the local node runs job tasks (each in a sandbox of the node runtime).
#[derive(Clone)]
pub struct NodeSettings {
    /// The sandboxes' init program; `None`: `tessera-sandbox-init` next to this program.
    pub init: Option<tessera_sandbox::InitProgram>,
    /// The data folder: masked in every task's sandbox, watched for disk pressure.
    pub data_dir: Option<std::path::PathBuf>,
    /// Restart back-off.
    pub lifecycle: jobs::Lifecycle,
    /// Where GPUs come from (`None`: NVML).
    pub gpus: Option<std::sync::Arc<dyn tessera_node::gpu::GpuSource>>,
    /// Device nodes and MIG capability files.
    pub devices: tessera_node::DeviceDirs,
    /// MIG actuation (`None`: `nvidia-smi` where it runs, else none).
    pub mig: Option<std::sync::Arc<dyn tessera_node::mig::MigBackend>>,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// GPU-share enforcement of fractional tasks (default: the CUDA interposer;
    /// a fractional task is refused, with the fix, where it is missing).
    pub gpushare: tessera_node::gpushare::Enforcement,
    /// The CPU and memory the local node gives API sandboxes, which the agent
    /// scheduler places within (`None`: the node's allocatable).
    pub sandbox_capacity: Option<tessera_sched::agent::Demand>,
    /// GPU fault events (`None`: NVML's Xid / ECC events where the node has GPUs).
    pub faults: Option<std::sync::Arc<dyn tessera_node::faults::FaultSource>>,
    /// A micro-VM kernel template (`tessera template build --kernel`): with it, the
    /// local node runs the micro-VM tier too (QEMU must be installed) and advertises
    /// the classes that map to it; without it, only the namespace tier's.
    pub vm_kernel: Option<std::path::PathBuf>,
    /// The local node's TPM, as a TCTI (`device:/dev/tpmrm0`, `swtpm:host=…,port=…`), or
    /// `swtpm` for a software TPM this server starts (proves the protocol, not
    /// hardware). `None`: the node is never attested.
    pub tpm: Option<String>,
    /// How often the node is re-attested.
    pub attest_period: Duration,
}

impl Default for NodeSettings {
    fn default() -> Self {
        NodeSettings {
            init: None,
            data_dir: None,
            lifecycle: jobs::Lifecycle::default(),
            gpus: None,
            devices: Default::default(),
            mig: None,
            heartbeat: Duration::from_secs(5),
            gpushare: Default::default(),
            sandbox_capacity: None,
            faults: None,
            vm_kernel: None,
            tpm: None,
            attest_period: Duration::from_secs(60),
        }
    }
}

impl std::fmt::Debug for NodeSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSettings")
            .field("init", &self.init)
            .field("data_dir", &self.data_dir)
            .finish()
    }
}

impl std::fmt::Debug for ServerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConfig")
            .field("listen", &self.listen)
            .field("body_limit", &self.body_limit)
            .field("scheduler", &self.scheduler.is_some())
            .field("schedule_period", &self.schedule_period)
            .field("executor_logs", &self.executor_logs)
            .finish()
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7700)),
            body_limit: 1 << 20,
            scheduler: Some(scheduler::batch_scheduler()),
            schedule_period: Duration::from_secs(1),
            register_local_node: true,
            executor_logs: None,
            oidc: None,
            compaction: Compaction::default(),
            simulated: None,
            sandboxes: Default::default(),
            agents: Default::default(),
            tools: Default::default(),
            gateway: Default::default(),
            guard: Default::default(),
            node: Default::default(),
            templates: None,
            trust: None,
            classes: Default::default(),
        }
    }
}

/// Simulated nodes (`tessera up --cluster`): registered at start with the label
/// `tessera.io/simulated=true`; a task bound to one with a `duration` succeeds
/// after `duration / speedup` seconds.
#[derive(Debug, Clone)]
pub struct Simulated {
    pub nodes: Vec<tessera_model::Node>,
    pub speedup: f64,
}

/// The label that marks simulated nodes.
pub const SIMULATED_LABEL: &str = "tessera.io/simulated";

/// Change-log compaction: every `every`, drop the changes older than the last
/// `keep` revisions. A watch that asks for a dropped revision gets 410 (code
/// `compacted`) and must list again.
#[derive(Debug, Clone, Copy)]
pub struct Compaction {
    pub keep: u64,
    pub every: Duration,
}

impl Default for Compaction {
    fn default() -> Self {
        Compaction {
            keep: 100_000,
            every: Duration::from_secs(60),
        }
    }
}

/// Compacts the change log on `c`'s period until `stop` turns true.
async fn compact_loop(
    store: AnyStore,
    c: Compaction,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use tessera_store::Store;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(c.every) => {}
            _ = stop.changed() => return,
        }
        let rev = match store.revision().await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("compaction: reading the revision failed: {e}");
                continue;
            }
        };
        if rev > c.keep
            && let Err(e) = store.compact(rev - c.keep).await
        {
            tracing::warn!("compaction through {} failed: {e}", rev - c.keep);
        }
    }
}

/// A running server.
pub struct Running {
    /// Where it listens (the real port when asked for port 0).
    pub addr: SocketAddr,
    /// The admin key, on the first start of a fresh store only.
    pub admin_key: Option<String>,
    pub plane: ControlPlane,
    stop: tokio::sync::watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").field("addr", &self.addr).finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("first-start setup failed: {0}")]
    Bootstrap(ApiError),
    /// A module (sandboxes, agents, tools, gateway) could not start.
    #[error("{what} could not start: {message}")]
    Component { what: &'static str, message: String },
}

/// The micro-VM tier of `tessera up --vm-kernel DIR`: the server's guard, its init
/// program as the guest's agent, images cached under the data folder. A server asked
/// for it that cannot make it does not start.
async fn start_microvm(
    cfg: &ServerConfig,
    kernel: &std::path::Path,
) -> Result<std::sync::Arc<tessera_sandbox::vm::MicroVmTier>, StartError> {
    let cache = node_data(cfg).join("vm");
    let mut vcfg = tessera_sandbox::vm::MicroVmConfig::new(kernel, cache);
    vcfg.guard = cfg.guard.clone();
    vcfg.init = cfg.node.init.clone();
    let tier = tokio::task::spawn_blocking(move || tessera_sandbox::vm::MicroVmTier::new(vcfg))
        .await
        .map_err(|e| StartError::Component {
            what: "micro-VM tier",
            message: e.to_string(),
        })?
        .map_err(|e| StartError::Component {
            what: "micro-VM tier",
            message: format!(
                "{e} (kernel template {}; or start without --vm-kernel)",
                kernel.display()
            ),
        })?;
    tracing::info!(
        "tessera: micro-VM tier: {}",
        tessera_sandbox::Tier::info(&*tier).detail
    );
    Ok(tier)
}

/// Bootstraps the store (first start), registers the local node, starts the
/// scheduler loop and the HTTP server.
pub async fn start(store: AnyStore, cfg: ServerConfig) -> Result<Running, StartError> {
    let oidc = oidc::start(cfg.oidc.as_ref()).await?;
    let plane = ControlPlane::new(store.clone())
        .with_logs(cfg.executor_logs.clone())
        .with_oidc(oidc.clone())
        .with_guard(cfg.guard.clone())
        .with_classes(cfg.classes.clone())
        .with_templates(match &cfg.templates {
            Some(dir) => Some(
                tessera_sandbox::TemplateRegistry::open(dir)
                    .map_err(|e| StartError::Component {
                        what: "templates",
                        message: e.to_string(),
                    })?
                    .with_policy(cfg.trust.clone()),
            ),
            // A policy with no registry would have nothing to ask it: refuse.
            None if cfg.trust.is_some() => {
                return Err(StartError::Component {
                    what: "trust policy",
                    message: "a trust policy needs a template registry (--templates DIR)".into(),
                });
            }
            None => None,
        });
    let admin_key = plane.bootstrap().await.map_err(StartError::Bootstrap)?;
    // Tenants' own guard policies, beside the operator's floor.
    plane
        .load_guard_policies()
        .await
        .map_err(StartError::Bootstrap)?;
    // GPU discovery (NVML) only when this machine is to be a node.
    let gpus: std::sync::Arc<dyn tessera_node::gpu::GpuSource> = cfg
        .node
        .gpus
        .clone()
        .unwrap_or_else(|| std::sync::Arc::new(gpu::NvmlSource));
    cfg.classes
        .check()
        .map_err(|message| StartError::Component {
            what: "runtime classes",
            message,
        })?;
    // The micro-VM tier, made before any namespace sandbox exists (it clears stale
    // cgroups of its own at start).
    let microvm = match &cfg.node.vm_kernel {
        None => None,
        Some(k) => Some(start_microvm(&cfg, k).await?),
    };
    let local = if cfg.register_local_node {
        let mut n = node::local_node_with(gpus.as_ref());
        let mut tiers = vec![tessera_sandbox::TierKind::Namespace];
        if microvm.is_some() {
            tiers.push(tessera_sandbox::TierKind::Microvm);
        }
        n.labels.extend(cfg.classes.classes.node_labels(&tiers));
        // Taints the node agent set (a device-view mismatch) stay until it clears them.
        if let Ok(Some(o)) = tessera_store::Store::get(
            plane.store(),
            &tessera_store::Key::new(plane::kind::NODE, "", &n.name),
        )
        .await
            && let Ok(old) = serde_json::from_value::<tessera_model::Node>(o.body)
        {
            n.taints = old.taints;
            n.unschedulable = old.unschedulable;
        }
        plane.upsert_node(&n).await.map_err(StartError::Bootstrap)?;
        n
    } else {
        tessera_model::Node::new(node::local_name(), Default::default())
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen)
        .await
        .map_err(|source| StartError::Listen {
            addr: cfg.listen,
            source,
        })?;
    let addr = listener.local_addr().map_err(|source| StartError::Listen {
        addr: cfg.listen,
        source,
    })?;
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    // Every redaction anywhere (sandboxes, sessions, tools, jobs, the API) is audited.
    let mut tasks = vec![redact::start_audit(&plane, stop_rx.clone())];
    tasks.extend(oidc.and_then(|v| v.refresher(stop_rx.clone())));
    let metrics = std::sync::Arc::new(metrics::Metrics::default());
    let cluster = cluster::ClusterState::new(plane.store().clone(), stop_rx.clone());
    if let Some(f) = cfg.scheduler.clone().map(|f| cluster.observe(f)) {
        tasks.push(tokio::spawn(scheduler::run_loop(
            store,
            f,
            cfg.schedule_period,
            stop_rx.clone(),
            metrics.clone(),
        )));
    }
    tasks.push(tokio::spawn(compact_loop(
        plane.store().clone(),
        cfg.compaction,
        stop_rx.clone(),
    )));
    tasks.push(tokio::spawn(jobs::run_controller(
        plane.store().clone(),
        cfg.node.lifecycle,
        stop_rx.clone(),
    )));
    // Node attestation (the local node's TPM): registered, measured and verified now,
    // then every period.
    let attester = match (&cfg.node.tpm, cfg.register_local_node) {
        (Some(tcti), true) => {
            let a = start_attestation(&cfg, &plane, &local.name, tcti).await?;
            tasks.push(tokio::spawn(attestation::run_loop(
                a.clone(),
                cfg.node.attest_period,
                stop_rx.clone(),
            )));
            Some(a)
        }
        _ => None,
    };
    // Model weights: sealed at rest under the KEK in the data folder; released by
    // the key service to the attested local node only.
    let weights =
        weights::KeyService::open(plane.store().clone(), &node_data(&cfg)).map_err(|message| {
            StartError::Component {
                what: "weights key service",
                message,
            }
        })?;
    if let (true, Some(logs)) = (cfg.register_local_node, cfg.executor_logs.clone()) {
        let data = cfg
            .node
            .data_dir
            .clone()
            .or_else(|| logs.parent().map(|p| p.to_path_buf()));
        let mut masked: Vec<std::path::PathBuf> = data.iter().cloned().collect();
        masked.push(logs.clone());
        let masked = masked
            .into_iter()
            .map(|p| std::fs::canonicalize(&p).unwrap_or(p))
            .collect();
        let share_dir = data
            .clone()
            .unwrap_or_else(|| logs.clone())
            .join("node")
            .join("gpushare");
        let gpushare = tessera_node::gpushare::hook(&cfg.node.gpushare, &share_dir);
        if !local.gpus.is_empty() {
            tracing::info!("tessera: GPU shares {}", gpushare.describe());
        }
        let ncfg = tessera_node::NodeConfig {
            name: local.name.clone(),
            init: cfg.node.init.clone(),
            guard: cfg.guard.clone(),
            cgroups: true,
            masked_paths: masked,
            devices: cfg.node.devices.clone(),
            gpus: gpus.clone(),
            gpushare,
            gpu_libs: Vec::new(),
            defaults: Default::default(),
            faults: cfg.node.faults.clone().or_else(|| {
                if local.gpus.is_empty() {
                    return None;
                }
                let idx: Vec<u32> = local.gpus.iter().map(|g| g.index).collect();
                match tessera_node::faults::NvmlFaults::open(&idx) {
                    Ok(f) => Some(std::sync::Arc::new(f) as _),
                    Err(e) => {
                        tracing::warn!("tessera: GPU fault events are not watched: {e}");
                        None
                    }
                }
            }),
            microvm: microvm.clone(),
            weights: attester
                .as_ref()
                .map(|a| tessera_node::weights::WeightsAccess {
                    broker: std::sync::Arc::new(weights::LocalBroker {
                        service: weights.clone(),
                        handle: tokio::runtime::Handle::current(),
                    }),
                    tpm: a.tpm(),
                }),
        };
        let node = tokio::task::spawn_blocking(move || tessera_node::NodeRuntime::new(ncfg))
            .await
            .map_err(|e| StartError::Component {
                what: "node runtime",
                message: e.to_string(),
            })?
            .map_err(|e| e.to_string());
        if let Err(e) = &node {
            tracing::warn!("tessera: job tasks cannot run on this node: {e}");
        }
        let mig_backend = cfg.node.mig.clone().or_else(|| {
            (!local.gpus.is_empty())
                .then(tessera_node::mig::NvidiaSmiMig::detect)
                .flatten()
                .map(|b| {
                    std::sync::Arc::new(b) as std::sync::Arc<dyn tessera_node::mig::MigBackend>
                })
        });
        let journal = data
            .clone()
            .unwrap_or_else(|| logs.clone())
            .join("node")
            .join("mig-journal.json");
        let runner = exec::NodeRunner {
            node,
            logs,
            templates: plane.templates().cloned(),
            classes: std::sync::Arc::new(cfg.classes.clone()),
            mig: std::sync::Arc::new(tessera_node::mig::Actuator::new(mig_backend, journal)),
            heartbeat: cfg.node.heartbeat,
            data_dir: data,
        };
        let mut ecfg = exec::ExecConfig::local(local.name.clone(), runner);
        ecfg.lifecycle = cfg.node.lifecycle;
        tasks.push(tokio::spawn(exec::run_executor(
            plane.store().clone(),
            ecfg,
            stop_rx.clone(),
        )));
    }
    if let Some(sim) = &cfg.simulated {
        if !(sim.speedup.is_finite() && sim.speedup > 0.0) {
            return Err(StartError::Component {
                what: "simulated nodes",
                message: format!("speed-up {} must be a positive number", sim.speedup),
            });
        }
        let mut names = std::collections::BTreeSet::new();
        for n in &sim.nodes {
            let mut n = n.clone();
            n.labels.insert(SIMULATED_LABEL.into(), "true".into());
            plane
                .upsert_node(&n)
                .await
                .map_err(|e| StartError::Component {
                    what: "simulated nodes",
                    message: format!("node {:?}: {e}", n.name),
                })?;
            names.insert(n.name);
        }
        tasks.push(tokio::spawn(exec::run_executor(
            plane.store().clone(),
            exec::ExecConfig {
                nodes: names,
                runner: exec::Runner::Simulated {
                    speedup: sim.speedup,
                },
                lifecycle: cfg.node.lifecycle,
            },
            stop_rx.clone(),
        )));
    }
    // API sandboxes are placed on the local node by the agent scheduler, within
    // the capacity it gives them (its allocatable; unbounded where the machine is
    // not registered as a node).
    let sandbox_cap = cfg.node.sandbox_capacity.unwrap_or_else(|| {
        let a = &local.allocatable;
        if a.cpu_milli == 0 && a.memory == 0 {
            placement::capacity(u64::MAX / 2, u64::MAX / 2)
        } else {
            placement::capacity(a.cpu_milli, a.memory)
        }
    });
    let (sandboxes, t) = sandboxes::SandboxesState::start(
        &plane,
        &cfg.sandboxes,
        &stop_rx,
        vec![(local.name.clone(), sandbox_cap)],
        microvm.clone(),
        node_data(&cfg).join("sandbox-snapshots"),
    )
    .await?;
    tasks.extend(t);
    // The agent platform forwards each sandbox's control socket to this address.
    let mut agents_cfg = cfg.agents.clone();
    agents_cfg.host.api_addr.get_or_insert(addr);
    // Idle sessions' files, kept on the node between their sandboxes.
    agents_cfg
        .host
        .snapshots
        .get_or_insert_with(|| node_data(&cfg).join("session-snapshots"));
    let (agents, t) = agents::AgentsState::start(&plane, &agents_cfg, &stop_rx).await?;
    tasks.extend(t);
    let (tools, t) =
        tools::ToolsState::start(&plane, &cfg.tools, &node_data(&cfg), &stop_rx).await?;
    tasks.extend(t);
    // Tool results and errors are redacted before the ledger, the agent and the caller.
    tools.gateway.set_guard(plane.guard().clone());
    // The gateway's built-in tools (exec, files) run in sessions' sandboxes.
    if let Some(h) = agents.session_host() {
        tools.gateway.set_sandboxes(std::sync::Arc::new(h));
    }
    let (gateway, t) = gateway::GatewayState::start(&plane, &cfg.gateway, &stop_rx).await?;
    tasks.extend(t);
    let app = api::router(api::App {
        plane: plane.clone(),
        body_limit: cfg.body_limit,
        metrics,
        sandboxes,
        agents,
        tools,
        gateway,
        cluster,
        attester,
        weights,
    });
    let mut srx = stop_rx;
    tasks.push(tokio::spawn(async move {
        // No Nagle delay on small writes (streamed tokens, SSE events).
        use axum::serve::ListenerExt;
        let listener = listener.tap_io(|t| {
            let _ = t.set_nodelay(true);
        });
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = srx.wait_for(|s| *s).await;
            })
            .await;
    }));
    Ok(Running {
        addr,
        admin_key,
        plane,
        stop,
        tasks,
    })
}

/// The folder the local node keeps its state in: the data folder, else the one above
/// the task logs, else the temporary folder.
fn node_data(cfg: &ServerConfig) -> std::path::PathBuf {
    cfg.node
        .data_dir
        .clone()
        .or_else(|| {
            cfg.executor_logs
                .as_ref()
                .and_then(|l| l.parent().map(|p| p.to_path_buf()))
        })
        .unwrap_or_else(std::env::temp_dir)
}

/// Opens the local node's TPM (a software one for `swtpm`) and starts its attester.
async fn start_attestation(
    cfg: &ServerConfig,
    plane: &ControlPlane,
    node: &str,
    tcti: &str,
) -> Result<std::sync::Arc<attestation::Attester>, StartError> {
    let fail = |message: String| StartError::Component {
        what: "TPM (--tpm)",
        message,
    };
    let dir = node_data(cfg).join("node").join("tpm");
    let (tpm, sw) = tokio::task::spawn_blocking({
        let tcti = tcti.to_string();
        move || {
            // `swtpm`: a software TPM whose state is kept in the data folder, so its
            // keys (and the approved reference) survive a restart.
            let sw = if tcti == "swtpm" {
                Some(
                    tessera_node::attest::tpm::Swtpm::start_in(&dir.join("swtpm"))
                        .map_err(|e| e.to_string())?,
                )
            } else {
                None
            };
            let t = sw.as_ref().map(|s| s.tcti()).unwrap_or(tcti);
            let tpm = tessera_node::attest::Tpm::open(&t, &dir).map_err(|e| e.to_string())?;
            Ok::<_, String>((tpm, sw))
        }
    })
    .await
    .map_err(|e| fail(e.to_string()))?
    .map_err(fail)?;
    let a = attestation::Attester::start(
        plane.store().clone(),
        node.to_string(),
        tpm,
        sw,
        attestation::measurements(cfg),
    )
    .await;
    Ok(a)
}

impl Running {
    /// Stops the scheduler loop and the HTTP server (open watches end).
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
    }

    /// Waits until the server stops (it runs until the process ends).
    pub async fn wait(mut self) {
        if let Some(t) = self.tasks.pop() {
            let _ = t.await;
        }
    }
}
