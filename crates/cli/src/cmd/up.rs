//! `tessera up`: the control plane on this machine — the store (embedded SQLite
//! under a data folder, or PostgreSQL), the API, the scheduler loop, and this
//! machine registered as a node. The first start prints the admin key once.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;
use tessera_server::oidc::{OidcConfig, Refresh};
use tessera_server::{AnyStore, PgStore, ServerConfig, SqliteStore};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail};

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Data folder: the embedded store and task logs (default:
    /// $XDG_DATA_HOME/tessera or ~/.local/share/tessera).
    #[arg(long, value_name = "DIR")]
    pub data: Option<PathBuf>,
    /// Address to serve the API on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7700")]
    pub listen: String,
    /// Use PostgreSQL instead of the embedded store
    /// (postgres://user:password@host:port/database).
    #[arg(long, value_name = "URL")]
    pub postgres: Option<String>,
    /// With --postgres: keep Tessera's tables in this schema (created if needed), so
    /// several instances can share one database.
    #[arg(long, value_name = "NAME", requires = "postgres")]
    pub postgres_schema: Option<String>,
    /// Largest request body accepted, in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub body_limit: usize,
    /// Do not register this machine as a node.
    #[arg(long)]
    pub no_local_node: bool,
    /// Also register simulated nodes: the `nodes` of a scenario file (the
    /// `tessera sched plan` format) or the Alibaba GPU trace's node list (a .csv
    /// with sn,cpu_milli,memory_mib,gpu,model). Tasks bound there run in
    /// simulated time: one with `duration: SECONDS` succeeds after it (see
    /// --speedup); one without holds its resources until cancelled.
    #[arg(long, value_name = "FILE")]
    pub cluster: Option<PathBuf>,
    /// With --cluster: how many simulated seconds pass per real second.
    #[arg(
        long,
        value_name = "FACTOR",
        default_value_t = 1.0,
        requires = "cluster"
    )]
    pub speedup: f64,
    /// OIDC bearer tokens (boxed: it keeps the `up` variant of the command small).
    #[command(flatten)]
    pub oidc: Box<OidcArgs>,
    /// Agent platform: settings of runtimes, sessions and their sandboxes.
    #[command(flatten)]
    pub agents: crate::cmd::agents::AgentUpArgs,
    /// Serve /v1/sandboxes: isolated sandboxes on this machine, every command checked
    /// by the runtime guard. Off by default: sandboxes run tenants' code on the server's
    /// own machine and need root (or unprivileged user namespaces; without root there
    /// are no cgroup limits).
    #[arg(long)]
    pub sandboxes: bool,
    /// The operator's guard policy (YAML, docs/guard.md): the floor every workload
    /// answers to — sandboxes, agent sessions, built-in tools, job tasks — and every
    /// output is redacted by. Tenants may tighten it (`PUT /v1/guard/policy`), never
    /// loosen it. Default: the shipped policy (`tessera guard rules --default-policy`).
    #[arg(long, value_name = "FILE")]
    pub guard_policy: Option<PathBuf>,
    /// The template registry: root file systems an operator registered with
    /// `tessera template import` (default: DATA/templates). Sandboxes, agent runtimes and
    /// jobs name a template (`NAME` or `NAME@sha256:<hex>`); none may give a host path.
    #[arg(long, value_name = "DIR")]
    pub templates: Option<PathBuf>,
    /// The trust policy (YAML, docs/trust.md): which templates must be signed, by whom,
    /// or pinned to digests, per tenant and runtime class. Applied when a job is
    /// submitted, a sandbox made or an agent session started, and again at every start.
    /// Default: none (every registered template runs).
    #[arg(long, value_name = "FILE", env = "TESSERA_TRUST_POLICY")]
    pub trust_policy: Option<PathBuf>,
    /// With --sandboxes: sandboxes of the base template kept ready (a warm pool).
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub sandbox_warm: usize,
    /// With --sandboxes: sandboxes one tenant may hold at once.
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub sandbox_max_per_tenant: usize,
    /// The live scheduler's configuration: `actions` and `tiers` as in `tessera sched
    /// plan` files (Volcano's spelling accepted). Default: Volcano's usual actions and
    /// plugins with `reservation` on for training gangs.
    #[arg(long, value_name = "FILE")]
    pub scheduler_config: Option<PathBuf>,
    /// How fractions of a GPU are placed: `tessera` (the fragmentation-aware policy;
    /// the default) or `profile` (best fit by the workload kind's binpack/spread). Over
    /// a --scheduler-config file's `share_policy`.
    #[arg(long, value_name = "POLICY")]
    pub gpu_share_policy: Option<String>,
    /// How the local node holds fractional GPU tasks to their share: `on` (default)
    /// loads the CUDA interposer into every process of the task (through its
    /// sandbox's /etc/ld.so.preload) and refuses a fractional task, naming the
    /// missing file, where the interposer is not found; `off` only sets
    /// TESSERA_GPU_MEMORY_LIMIT / TESSERA_GPU_COMPUTE_MILLI (nothing enforces them).
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub gpu_share_enforcement: String,
    /// The CUDA interposer (`libtessera_cuda.so`, built by `cargo build --release -p
    /// tessera-gpushare-cuda`). Default: $TESSERA_CUDA_INTERPOSER, else next to this
    /// program, else /usr/lib/tessera/.
    #[arg(long, value_name = "FILE")]
    pub cuda_interposer: Option<PathBuf>,
    /// A micro-VM kernel template (`tessera template build --kernel`): the local node
    /// then runs the micro-VM tier too (QEMU `microvm`; KVM where it can run guests,
    /// else TCG) and advertises the classes that map to it (`isolated`), so job tasks
    /// and sandboxes of those classes run here in a VM with its own kernel. Without it
    /// such work stays pending, with the class in its reason.
    #[arg(long, value_name = "DIR", env = "TESSERA_VM_KERNEL_TEMPLATE")]
    pub vm_kernel: Option<PathBuf>,
    /// The local node's TPM, for node attestation (docs/trust.md): a tpm2-tools TCTI
    /// (`device:/dev/tpmrm0`, `swtpm:host=127.0.0.1,port=2321`), or `swtpm` for a
    /// software TPM started here (proves the protocol, not hardware). The node is then
    /// measured at start and quoted every --attest-period; it is attested once an
    /// operator approves its values (`tessera node trust NODE`). Needs tpm2-tools.
    #[arg(long, value_name = "TCTI", env = "TESSERA_TPM")]
    pub tpm: Option<String>,
    /// With --tpm: how often the node is quoted again, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = 60)]
    pub attest_period: u64,
    /// Adds or remaps a runtime class: `NAME=TIER` (`namespace` or `microvm`), beside
    /// `standard=namespace` and `isolated=microvm`. Repeatable.
    #[arg(long = "runtime-class", value_name = "NAME=TIER")]
    pub runtime_classes: Vec<String>,
    /// The weakest runtime class a tenant's workloads may have: `TENANT=CLASS` (`*`
    /// for every tenant without its own). A task or sandbox naming no class gets it;
    /// one naming a weaker class is refused. Repeatable.
    #[arg(long = "min-runtime-class", value_name = "TENANT=CLASS")]
    pub min_runtime_class: Vec<String>,
}

/// The OIDC flags of `tessera up`.
#[derive(Debug, Args)]
pub struct OidcArgs {
    /// Also accept OIDC bearer tokens from this issuer (the `iss` claim). Its keys
    /// are discovered at start (URL/.well-known/openid-configuration, then its
    /// jwks_uri) and refreshed, unless --oidc-jwks gives them.
    #[arg(long, value_name = "URL", requires = "oidc_audience")]
    pub oidc_issuer: Option<String>,
    /// The audience (`aud`) OIDC tokens must carry.
    #[arg(long, value_name = "AUD", requires = "oidc_issuer")]
    pub oidc_audience: Option<String>,
    /// The issuer's JSON Web Key Set, saved from its `jwks_uri`: used instead of
    /// discovery, never refreshed (a rotated key needs a new file and a restart).
    #[arg(long, value_name = "FILE", requires = "oidc_issuer")]
    pub oidc_jwks: Option<PathBuf>,
    /// With discovery: fetch the issuer's key set again this often, in seconds (a
    /// token with an unknown key id also fetches it, at most once per 30 s).
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 600,
        requires = "oidc_issuer",
        conflicts_with = "oidc_jwks"
    )]
    pub oidc_refresh: u64,
}

impl OidcArgs {
    /// The server's OIDC settings (none without --oidc-issuer).
    fn resolve(&self) -> Result<Option<OidcConfig>, String> {
        if self.oidc_refresh == 0 {
            return Err("--oidc-refresh 0: give a period of at least 1 second, e.g. 600".into());
        }
        Ok(
            match (&self.oidc_issuer, &self.oidc_audience, &self.oidc_jwks) {
                (Some(iss), Some(aud), Some(jwks)) => Some(
                    OidcConfig::from_jwks_file(iss, aud, jwks)
                        .map_err(|e| format!("--oidc-jwks: {e}"))?,
                ),
                (Some(iss), Some(aud), None) => {
                    Some(OidcConfig::discover(iss, aud).refreshed(Refresh {
                        every: std::time::Duration::from_secs(self.oidc_refresh),
                        ..Refresh::default()
                    }))
                }
                _ => None,
            },
        )
    }
}

/// The class table of `--runtime-class` and `--min-runtime-class`.
fn class_policy(a: &UpArgs) -> Result<tessera_server::classes::ClassPolicy, String> {
    let mut p = tessera_server::classes::ClassPolicy::default();
    for s in &a.runtime_classes {
        let (name, tier) = tessera_server::classes::parse_pair("--runtime-class", s)?;
        let tier: tessera_sandbox::TierKind = tier
            .parse()
            .map_err(|e| format!("--runtime-class {s:?}: {e}"))?;
        p.classes
            .insert(&name, tier)
            .map_err(|e| format!("--runtime-class {s:?}: {e}"))?;
    }
    for s in &a.min_runtime_class {
        let (tenant, class) = tessera_server::classes::parse_pair("--min-runtime-class", s)?;
        p.min_class.insert(tenant, class);
    }
    p.check()?;
    Ok(p)
}

/// The default data folder.
pub fn default_data_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("tessera");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".local/share/tessera"),
        None => PathBuf::from(".tessera"),
    }
}

pub fn run(a: UpArgs) -> i32 {
    let listen: SocketAddr = match a.listen.parse() {
        Ok(l) => l,
        Err(e) => {
            return fail(
                EXIT_BAD_INPUT,
                format!(
                    "--listen {:?}: {e}; give an address like 127.0.0.1:7700",
                    a.listen
                ),
            );
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    rt.block_on(serve(a, listen))
}

async fn serve(a: UpArgs, listen: SocketAddr) -> i32 {
    let simulated = match &a.cluster {
        Some(path) => match super::cluster::load(path) {
            Ok(nodes) => nodes,
            Err(e) => return fail(EXIT_BAD_INPUT, format!("--cluster: {e}")),
        },
        None => Vec::new(),
    };
    if !(a.speedup.is_finite() && a.speedup > 0.0) {
        return fail(
            EXIT_BAD_INPUT,
            format!("--speedup {}: give a positive factor, e.g. 60", a.speedup),
        );
    }
    let oidc = match a.oidc.resolve() {
        Ok(o) => o,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let guard = match &a.guard_policy {
        None => std::sync::Arc::new(tessera_sandbox::PolicyGuard::default()),
        Some(f) => match std::fs::read_to_string(f)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                tessera_sandbox::guard::Policy::from_yaml(&t, &f.display().to_string())
                    .map_err(|e| e.to_string())
            }) {
            Ok(p) => std::sync::Arc::new(tessera_sandbox::PolicyGuard::new(p)),
            Err(e) => {
                return fail(
                    EXIT_BAD_INPUT,
                    format!("--guard-policy {}: {e}", f.display()),
                );
            }
        },
    };
    let data = a.data.clone().unwrap_or_else(default_data_dir);
    // The data folder holds the store, task logs and templates: the server's alone.
    match tessera_server::prepare_data_dir(&data) {
        Ok(Some(warning)) => eprintln!("warning: {warning}"),
        Ok(None) => {}
        Err(e) => {
            return fail(
                EXIT_FAILURE,
                format!("{e}; pick another folder with --data DIR"),
            );
        }
    }
    let (store, where_): (AnyStore, String) = match &a.postgres {
        Some(url) => match PgStore::connect_in_schema(url, a.postgres_schema.as_deref()).await {
            Ok(s) => (s.into(), "PostgreSQL".to_string()),
            Err(e) => return fail(EXIT_FAILURE, format!("--postgres: {e}")),
        },
        None => {
            let dir = data.clone();
            match SqliteStore::open(&dir) {
                Ok(s) => (s.into(), format!("{}", dir.display())),
                Err(e) => {
                    return fail(
                        EXIT_FAILURE,
                        format!("{e}; pick another folder with --data DIR"),
                    );
                }
            }
        }
    };
    let backend = store.backend();
    let mut sched = tessera_server::scheduler::SchedulerSettings::default();
    if let Some(path) = &a.scheduler_config {
        match tessera_sim::scenario::load_config(path) {
            Ok(c) => sched.config = c,
            Err(e) => return fail(EXIT_BAD_INPUT, format!("--scheduler-config: {e}")),
        }
    }
    if let Some(p) = &a.gpu_share_policy {
        match tessera_server::scheduler::check_gpu_share_policy(p) {
            Ok(p) => sched.gpu_share_policy = Some(p),
            Err(e) => return fail(EXIT_BAD_INPUT, format!("--gpu-share-policy: {e}")),
        }
    }
    let describe = sched.describe();
    let init = crate::cmd::sandbox::init_program();
    let init_where = init
        .as_ref()
        .map(|i| {
            if i.path.starts_with("/proc/self/fd") {
                format!(
                    "the small init this binary carries ({} KiB, run from memory)",
                    crate::cmd::sandbox::embedded_init_len() >> 10
                )
            } else if i.args.is_empty() {
                format!("{}", i.path.display())
            } else {
                format!(
                    "{} {} (the whole tessera binary: slower)",
                    i.path.display(),
                    i.args.join(" ")
                )
            }
        })
        .unwrap_or_else(|| "none found".into());
    let classes = match class_policy(&a) {
        Ok(p) => p,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let trust = match &a.trust_policy {
        Some(p) => match tessera_sandbox::trust::TrustPolicy::load(p) {
            Ok(t) => {
                eprintln!("tessera: trust policy {}", t.file());
                Some(std::sync::Arc::new(t))
            }
            Err(e) => return fail(EXIT_BAD_INPUT, format!("--trust-policy: {e}")),
        },
        None => None,
    };
    let cfg = ServerConfig {
        listen,
        body_limit: a.body_limit,
        classes,
        trust,
        register_local_node: !a.no_local_node,
        executor_logs: Some(data.join("logs")),
        templates: Some(
            a.templates
                .clone()
                .unwrap_or_else(|| data.join("templates")),
        ),
        guard,
        oidc,
        simulated: (!simulated.is_empty()).then(|| tessera_server::Simulated {
            nodes: simulated.clone(),
            speedup: a.speedup,
        }),
        agents: a.agents.config(),
        sandboxes: tessera_server::sandboxes::SandboxesConfig {
            enabled: a.sandboxes,
            init: init.clone(),
            max_per_tenant: a.sandbox_max_per_tenant,
            warm: a.sandbox_warm,
        },
        scheduler: Some(tessera_server::scheduler::live_scheduler(sched.clone())),
        node: tessera_server::NodeSettings {
            init: init.clone(),
            data_dir: Some(data.clone()),
            gpushare: tessera_node::gpushare::with_embedded(
                match (a.gpu_share_enforcement.as_str(), &a.cuda_interposer) {
                    ("off", _) => tessera_node::gpushare::Enforcement::Off,
                    (_, Some(p)) => tessera_node::gpushare::Enforcement::InterposerAt(
                        std::path::absolute(p).unwrap_or_else(|_| p.clone()),
                    ),
                    _ => tessera_node::gpushare::Enforcement::Interposer,
                },
                EMBEDDED_INTERPOSER,
                &data.join("gpushare"),
            ),
            vm_kernel: a.vm_kernel.clone(),
            tpm: a.tpm.clone(),
            attest_period: std::time::Duration::from_secs(a.attest_period.max(1)),
            ..Default::default()
        },
        ..ServerConfig::default()
    };
    let otlp = match tessera_server::otlp::OtlpConfig::from_env() {
        Ok(None) => None,
        Ok(Some(c)) => match tessera_server::otlp::install(c) {
            Ok(x) => Some(x),
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        },
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let running = match tessera_server::start(store, cfg).await {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    if !simulated.is_empty() {
        eprintln!(
            "tessera: registered {} simulated nodes; their tasks run at {}x",
            simulated.len(),
            a.speedup
        );
    }
    let url = format!("http://{}", running.addr);
    eprintln!("tessera: store {backend} at {where_}");
    eprintln!("tessera: listening on {url}");
    eprintln!("tessera: scheduler: {describe}");
    eprintln!("tessera: job tasks run in sandboxes; sandbox init: {init_where}");
    if otlp.is_some() {
        eprintln!("tessera: exporting session spans over OTLP (OTEL_EXPORTER_OTLP_* settings)");
    }
    if let Some(key) = &running.admin_key {
        println!("First start: created tenant \"admin\" and its admin key. It is shown only now");
        println!("(the store keeps only a hash). Use it from another shell:");
        println!();
        println!("  export TESSERA_URL={url}");
        println!("  export TESSERA_API_KEY={key}");
        println!();
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot watch SIGTERM: {e}")),
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("tessera: shutting down");
    running.shutdown().await;
    if let Some(o) = otlp {
        o.shutdown().await;
    }
    0
}

/// The CUDA interposer this binary carries (release builds; empty otherwise): see
/// `build.rs` and [`tessera_node::gpushare::with_embedded`].
static EMBEDDED_INTERPOSER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/libtessera_cuda.so"));
