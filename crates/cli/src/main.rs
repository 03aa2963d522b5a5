//! `tessera`: the one binary. Each subcommand lives in its own module under
//! `cmd/` (people-facing commands) or `bench/` (benchmarks); this file only
//! parses the command line and dispatches.
//!
//! Conventions for every command: data on stdout, logs and progress on stderr,
//! `--json` for scripts, exit status 0 on success, 1 on failure at run time, 2 on
//! bad input (a file, a field or a flag), with a message that says what to do.

mod bench;
mod cmd;
mod logs;
mod output;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tessera",
    version,
    about = "One control plane for GPU training, inference and AI agents.",
    propagate_version = true
)]
struct Cli {
    /// How logs are written on stderr: `text` for people, `json` (one object a
    /// line) for log pipelines.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "TESSERA_LOG_FORMAT"
    )]
    log_format: logs::LogFormat,
    /// More logs: -v debug, -vv trace (of Tessera's own; RUST_LOG overrides).
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Batch scheduler: plan a scenario file.
    #[command(subcommand)]
    Sched(cmd::sched::SchedCommand),
    /// Replay GPU-cluster traces through placement policies.
    Sim(cmd::sim::SimArgs),
    /// Mixed workload: training gangs (batch scheduler) and agent bursts (agent
    /// scheduler) on one cluster, with node shards moving between them.
    SimMixed(cmd::mixed::Args),
    /// Benchmarks that print a table, or JSON with --json.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Runtime guard: check commands, scan output for secrets, check paths.
    #[command(subcommand)]
    Guard(cmd::guard::GuardCommand),
    /// Isolated Linux sandboxes.
    #[command(subcommand)]
    Sandbox(cmd::sandbox::SandboxCommand),
    /// Sandbox templates: build a root file system from an OCI image layout or with
    /// debootstrap.
    #[command(subcommand)]
    Template(cmd::template::TemplateCommand),
    /// Start the control plane on this machine: store, API, scheduler loop.
    Up(cmd::up::UpArgs),
    /// Queues of your tenant (server and key from `tessera login`, or TESSERA_URL
    /// and TESSERA_API_KEY).
    #[command(subcommand)]
    Queue(cmd::client::QueueCommand),
    /// Jobs of your tenant: submit, list, get, logs, cancel, delete.
    #[command(subcommand)]
    Job(cmd::client::JobCommand),
    /// Nodes of the cluster.
    #[command(subcommand)]
    Node(cmd::client::NodeCommand),
    /// Model weights: sealed at rest, released only into attested, isolated tasks.
    #[command(subcommand)]
    Weights(cmd::weights::WeightsCommand),
    /// Follow changes to your tenant's jobs, queues or events.
    Watch(cmd::client::WatchArgs),
    /// Agent runtimes: deploy agents as immutable versions, pin endpoints.
    #[command(subcommand)]
    Runtime(cmd::agents::RuntimeCommand),
    /// Invoke an agent runtime in a session.
    #[command(subcommand)]
    Agent(cmd::agents::AgentCommand),
    /// Agent sessions: list, inspect, kill, trace, memory.
    #[command(subcommand)]
    Session(cmd::agents::SessionCommand),
    /// Metered usage and cost per tenant, session and runtime.
    Usage(cmd::agents::UsageArgs),
    /// Durable event topics: publish, read, follow, commit offsets.
    #[command(subcommand)]
    Events(cmd::agents::EventsCommand),
    /// Save the server URL and an API key for the client commands (checked first).
    Login(cmd::login::LoginArgs),
    /// Forget the saved API key.
    Logout,
    /// Tenants: create (with its first admin key, system admins), list, get.
    #[command(subcommand)]
    Tenant(cmd::identity::TenantCommand),
    /// Users of your tenant: create, list, get, delete.
    #[command(subcommand)]
    User(cmd::identity::UserCommand),
    /// Service accounts of your tenant (subject sa:NAME): create, list, get, delete.
    #[command(subcommand, alias = "sa")]
    Serviceaccount(cmd::identity::ServiceAccountCommand),
    /// API keys of your tenant: create (shown once), list, revoke.
    #[command(subcommand)]
    Apikey(cmd::identity::ApiKeyCommand),
    /// Tool gateway: register, grant, call tools; the ledger; approvals.
    #[command(subcommand)]
    Tool(cmd::tool::ToolCommand),
    /// Kubernetes mode: a secondary scheduler for pods with schedulerName tessera.
    #[command(subcommand)]
    K8s(cmd::k8s::K8sCommand),
    /// Inference pools behind the OpenAI-compatible gateway: create, list, get,
    /// update in place, delete.
    #[command(subcommand)]
    Pool(cmd::pool::PoolCommand),
}

fn main() {
    output::quiet_broken_pipes();
    let cli = Cli::parse();
    // Servers tell what they do (the access log among it); one-shot commands only
    // what went wrong.
    let quiet = match &cli.command {
        Command::Up(_) | Command::K8s(_) => tracing::Level::INFO,
        _ => tracing::Level::WARN,
    };
    logs::init(cli.log_format, cli.verbose, quiet);
    let code = match cli.command {
        Command::Sched(c) => cmd::sched::run(c),
        Command::Sim(a) => cmd::sim::run(a),
        Command::SimMixed(a) => cmd::mixed::run_cmd(a),
        Command::Bench(c) => bench::run(c),
        Command::Guard(c) => cmd::guard::run(c),
        Command::Sandbox(c) => cmd::sandbox::run(c),
        Command::Template(c) => cmd::template::template(c),
        Command::Up(a) => cmd::up::run(a),
        Command::Queue(c) => cmd::client::queue(c),
        Command::Job(c) => cmd::client::job(c),
        Command::Node(c) => cmd::client::node(c),
        Command::Weights(c) => cmd::weights::run(c),
        Command::Watch(a) => cmd::client::watch(a),
        Command::Runtime(c) => cmd::agents::runtime(c),
        Command::Agent(c) => cmd::agents::agent(c),
        Command::Session(c) => cmd::agents::session(c),
        Command::Usage(a) => cmd::agents::usage(a),
        Command::Events(c) => cmd::agents::events(c),
        Command::Login(a) => cmd::login::login(a),
        Command::Logout => cmd::login::logout(),
        Command::Tenant(c) => cmd::identity::tenant(c),
        Command::User(c) => cmd::identity::user(c),
        Command::Serviceaccount(c) => cmd::identity::service_account(c),
        Command::Apikey(c) => cmd::identity::api_key(c),
        Command::Tool(c) => cmd::tool::run(c),
        Command::K8s(c) => cmd::k8s::run(c),
        Command::Pool(c) => cmd::pool::run(c),
    };
    std::process::exit(code);
}
