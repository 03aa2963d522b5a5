//! `tessera sandbox …`: isolated Linux sandboxes (library: `tessera-sandbox`).
//!
//! `run` creates a sandbox, runs one command in it and destroys it; the exit status is
//! the command's (128 + signal when killed). Every command passes the runtime guard
//! first (`--no-guard` to skip); a blocked command exits 3.

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use tessera_sandbox::{
    Command, CommandCheck, ExecError, ExecOutput, ExecRequest, ExitStatus, FileError, InitProgram,
    Limits, Network, Runtime, RuntimeConfig, SandboxSpec,
};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

/// Exit status when the guard blocks the command.
pub const EXIT_BLOCKED: i32 = 3;

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox, run one command in it, destroy it.
    Run(RunArgs),
    /// Create a long-lived sandbox (kept by a background supervisor); prints its name.
    Create(CreateArgs),
    /// Run a command in a long-lived sandbox.
    Exec(ExecArgs),
    /// Copy a file into or out of a long-lived sandbox: `cp NAME:/path local` or
    /// `cp local NAME:/path`; with -r a folder's contents, as a tar archive (checked:
    /// no absolute paths, `..`, links leaving the folder or device nodes).
    Cp(CpArgs),
    /// List long-lived sandboxes.
    Ls(LsArgs),
    /// Destroy long-lived sandboxes.
    Rm(RmArgs),
    /// Sandboxes on a Tessera server (`/v1/sandboxes`; the server and key of
    /// `tessera login`): create, exec, ls, get, pause, resume, timeout, kill.
    #[command(subcommand)]
    Remote(super::remote::RemoteCommand),
    /// The sandbox's init (PID 1 inside each sandbox); not for people.
    #[command(name = "__init", hide = true)]
    Init,
    /// The background supervisor of a long-lived sandbox; not for people.
    #[command(name = "__serve", hide = true)]
    Serve(ServeArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetArg {
    /// Private network namespace, loopback only.
    None,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Network: `none` (loopback only; with --allow-domain, plus the egress proxy).
    #[arg(long, value_enum, default_value = "none")]
    pub net: NetArg,
    /// Memory limit: `512Mi`, `1Gi` (powers of 1024), `500M` (powers of 1000), or bytes.
    #[arg(long, default_value = "512Mi")]
    pub memory: String,
    /// CPU limit in cores, e.g. `0.5`, `2`.
    #[arg(long, default_value = "1")]
    pub cpus: String,
    /// Allow egress to this domain and its subdomains through the sandbox's proxy
    /// (`HTTPS_PROXY=http://127.0.0.1:3128` inside; repeatable). Without it, no egress.
    #[arg(long = "allow-domain")]
    pub allow_domain: Vec<String>,
    /// Let allowed domains resolve to loopback or private addresses (off: an allowed
    /// name must not reach the host's own services or a metadata endpoint).
    #[arg(long, requires = "allow_domain")]
    pub allow_private_egress: bool,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = 256)]
    pub pids: u32,
    /// Size of each writable layer (/tmp, /home/user, /workspace), e.g. `256Mi`.
    #[arg(long, default_value = "256Mi")]
    pub disk: String,
    /// Root file system: `host` (the host's /usr, read-only) or a template directory
    /// (from `tessera template build`).
    #[arg(long, value_name = "host|DIR", default_value = "host")]
    pub template: String,
}

/// What to run and how.
#[derive(Debug, Args)]
pub struct CmdArgs {
    /// Kill the whole process tree after this long, e.g. `10s`, `500ms`, `2m`.
    #[arg(long, default_value = "60s")]
    pub timeout: String,
    /// Environment variable `KEY=VALUE` (repeatable).
    #[arg(long = "env", short = 'e')]
    pub env: Vec<String>,
    /// Working directory inside the sandbox.
    #[arg(long, default_value = "/workspace")]
    pub cwd: String,
    /// Pass this program's stdin to the command.
    #[arg(long)]
    pub stdin: bool,
    /// Run the words as one shell command line (`/bin/sh -c`), not as argv.
    #[arg(long)]
    pub shell: bool,
    /// Print one JSON document (status, output, timings) instead of passing output through.
    #[arg(long)]
    pub json: bool,
    /// The command, after `--`.
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Do not check the command with the runtime guard.
    #[arg(long)]
    pub no_guard: bool,
    /// The runtime class: `standard` (namespace tier) or `isolated` (a micro-VM with its
    /// own kernel; needs QEMU and a kernel template, see --vm-kernel).
    #[arg(long, value_name = "NAME", default_value = "standard")]
    pub runtime_class: String,
    /// The micro-VM tier's kernel template folder (made from Debian's
    /// linux-image-cloud-amd64 package; see docs/sandbox.md).
    #[arg(long, value_name = "DIR", env = "TESSERA_VM_KERNEL_TEMPLATE")]
    pub vm_kernel: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub cmd: CmdArgs,
}

/// Where long-lived sandboxes keep their sockets and records.
#[derive(Debug, Args)]
pub struct StateArgs {
    /// State directory (one socket, record and log per sandbox).
    #[arg(
        long,
        env = "TESSERA_SANDBOX_STATE",
        default_value = "/run/tessera/sandboxes"
    )]
    pub state: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub state: StateArgs,
    /// Name (default: generated). Letters, digits, `-`, `_`.
    #[arg(long)]
    pub name: Option<String>,
    /// Do not check commands with the runtime guard.
    #[arg(long)]
    pub no_guard: bool,
    /// Destroy the sandbox this long after creation, e.g. `30m` (default: never).
    #[arg(long)]
    pub lifetime: Option<String>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub state: StateArgs,
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub no_guard: bool,
    #[arg(long)]
    pub lifetime: Option<String>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// The sandbox's name.
    pub name: String,
    #[command(flatten)]
    pub cmd: CmdArgs,
}

#[derive(Debug, Args)]
pub struct CpArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Source: a local path, or `NAME:/path` in a sandbox.
    pub src: String,
    /// Destination: a local path, or `NAME:/path` in a sandbox.
    pub dst: String,
    /// Copy a folder's contents (into DST, made if missing), as a tar archive; links
    /// are copied as links and any that would point outside DST are refused.
    #[arg(short = 'r', long)]
    pub recursive: bool,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    #[command(flatten)]
    pub state: StateArgs,
    #[command(flatten)]
    pub out: super::client::Out,
    /// The same as `-o json` (kept for scripts written before `-o`).
    #[arg(long, hide = true)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct RmArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Names of the sandboxes to destroy.
    #[arg(required = true)]
    pub names: Vec<String>,
}

pub fn run(c: SandboxCommand) -> i32 {
    match c {
        SandboxCommand::Init => tessera_sandbox::init::main(),
        SandboxCommand::Run(a) => run_one(a),
        SandboxCommand::Create(a) => long::create(a),
        SandboxCommand::Serve(a) => long::serve(a),
        SandboxCommand::Exec(a) => long::exec(a),
        SandboxCommand::Cp(a) => long::cp(a),
        SandboxCommand::Ls(a) => long::ls(a),
        SandboxCommand::Rm(a) => long::rm(a),
        SandboxCommand::Remote(c) => super::remote::remote(c),
    }
}

/// A size in bytes with the model's quantity rules, as job files and Kubernetes
/// write them: `Ki Mi Gi Ti` are powers of 1024, `k M G T` powers of 1000, no
/// suffix is bytes (`512Mi`, `1.5Gi`, `500M`, `4096`). Zero is refused: a limit
/// of nothing is a mistake.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    match tessera_model::parse_bytes(s.trim()) {
        Ok(0) => Err(format!("{s:?} must be a positive size")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!(
            "{e}; write a size such as 512Mi or 1Gi (powers of 1024) or 500M (powers of 1000)"
        )),
    }
}

/// Parses `10s`, `500ms`, `2m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, unit) = match t.find(|c: char| c.is_ascii_alphabetic()) {
        None => (t, "s"),
        Some(i) => (&t[..i], &t[i..]),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration; write e.g. 10s"))?;
    let secs = match unit {
        "ms" => v / 1000.0,
        "s" => v,
        "m" => v * 60.0,
        "h" => v * 3600.0,
        u => return Err(format!("unknown unit {u:?} in {s:?}; use ms, s, m or h")),
    };
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("{s:?} must be a positive duration"));
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Builds a spec from the flags.
pub fn spec_from(l: &LimitArgs) -> Result<SandboxSpec, String> {
    let cpus: f64 = l
        .cpus
        .parse()
        .map_err(|_| format!("--cpus {:?} is not a number; write e.g. 0.5", l.cpus))?;
    if !(cpus.is_finite() && cpus > 0.0 && cpus <= 1024.0) {
        return Err(format!("--cpus {:?} must be between 0 and 1024", l.cpus));
    }
    let memory = parse_bytes(&l.memory).map_err(|e| format!("--memory: {e}"))?;
    let disk = parse_bytes(&l.disk).map_err(|e| format!("--disk: {e}"))?;
    if l.pids == 0 {
        return Err("--pids must be at least 1".into());
    }
    Ok(SandboxSpec {
        network: match (l.net, l.allow_domain.is_empty()) {
            (NetArg::None, true) => Network::None,
            (NetArg::None, false) => Network::Proxy(tessera_sandbox::EgressPolicy {
                allow_domains: l.allow_domain.clone(),
                allow_private: l.allow_private_egress,
            }),
        },
        limits: Limits {
            memory_bytes: Some(memory),
            cpu_millis: Some((cpus * 1000.0).round().max(1.0) as u32),
            pids: Some(l.pids),
            disk_bytes: disk,
        },
        template: match l.template.as_str() {
            "host" => tessera_sandbox::Template::Host,
            dir => {
                let p = std::path::PathBuf::from(dir);
                if !p.is_dir() {
                    return Err(format!(
                        "--template {dir:?} is not a directory; give `host` or a folder made by `tessera template build`"
                    ));
                }
                tessera_sandbox::Template::Dir(std::fs::canonicalize(&p).unwrap_or(p))
            }
        },
        ..SandboxSpec::default()
    })
}

/// The small sandbox init this binary carries (see `build.rs`): empty in dev and
/// test builds, the whole `tessera-sandbox-init` in release builds.
static EMBEDDED_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/tessera-sandbox-init"));

/// The init program: `tessera-sandbox-init` next to this binary (or
/// `$TESSERA_SANDBOX_INIT`), else the copy this binary carries (release builds,
/// run from a sealed memfd), else this binary's hidden `sandbox __init`, with a
/// warning printed once: every sandbox then starts this whole binary, which costs
/// about half the creation rate and 3-4x the idle memory (measured in BENCHMARKS.md).
pub fn init_program() -> Option<InitProgram> {
    if let Some(p) = InitProgram::locate() {
        return Some(p);
    }
    if let Some(p) = embedded_init() {
        return Some(p);
    }
    let exe = std::env::current_exe().ok()?;
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        eprintln!(
            "warning: tessera-sandbox-init was not found next to {}; sandboxes will run \
             `tessera sandbox __init` instead, which starts slower and uses more memory. \
             Build it with `cargo build --release -p tessera-sandbox` (it lands next to \
             `tessera`) or point TESSERA_SANDBOX_INIT at it.",
            exe.display()
        );
    });
    Some(InitProgram {
        path: exe,
        args: vec!["sandbox".into(), "__init".into()],
    })
}

/// The embedded init, in a memfd made once per process.
pub fn embedded_init() -> Option<InitProgram> {
    static INIT: std::sync::OnceLock<Option<InitProgram>> = std::sync::OnceLock::new();
    INIT.get_or_init(|| {
        if EMBEDDED_INIT.is_empty() {
            return None;
        }
        match InitProgram::from_bytes("tessera-sandbox-init", EMBEDDED_INIT) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("warning: the embedded sandbox init cannot be used: {e}");
                None
            }
        }
    })
    .clone()
}

/// Bytes of the embedded init (0 when this build carries none).
pub fn embedded_init_len() -> usize {
    EMBEDDED_INIT.len()
}

pub fn sandbox_runtime(guard: bool) -> Result<Arc<Runtime>, String> {
    Runtime::new(RuntimeConfig {
        init: init_program(),
        cgroups: true,
        // `--no-guard` is the operator's own choice on this machine, and says so.
        guard: if guard {
            Arc::new(tessera_sandbox::PolicyGuard::default()) as Arc<dyn CommandCheck>
        } else {
            Arc::new(tessera_sandbox::AllowAll)
        },
        tenant: None,
        cgroup_backend: None,
        egress: None,
    })
    .map_err(|e| e.to_string())
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RunJson {
    exit_code: i32,
    signal: Option<i32>,
    timed_out: bool,
    oom_killed: bool,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    alerts: Vec<String>,
    redacted: bool,
    create_ms: f64,
    exec_ms: f64,
    cgroups: Option<String>,
}

/// Builds the request from the flags; `Err` is (exit status, message).
pub fn build_request(c: &CmdArgs) -> Result<ExecRequest, String> {
    let timeout = parse_duration(&c.timeout).map_err(|e| format!("--timeout: {e}"))?;
    let mut env = Vec::new();
    for kv in &c.env {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_string(), v.to_string())),
            _ => return Err(format!("--env {kv:?}: write KEY=VALUE")),
        }
    }
    let command = if c.shell {
        Command::Shell(c.command.join(" "))
    } else {
        Command::Argv(c.command.clone())
    };
    let mut req = ExecRequest::new(command)
        .timeout(timeout)
        .cwd(c.cwd.clone());
    req.env = env;
    Ok(req)
}

fn read_stdin_into(req: &mut ExecRequest) -> Result<(), String> {
    let mut buf = Vec::new();
    std::io::stdin()
        .read_to_end(&mut buf)
        .map_err(|e| format!("reading stdin: {e}"))?;
    req.stdin = Some(buf);
    Ok(())
}

/// A micro-VM for `tessera sandbox run --runtime-class isolated`.
fn microvm(
    a: &RunArgs,
    guard: bool,
    spec: &tessera_sandbox::SandboxSpec,
) -> Result<Box<dyn tessera_sandbox::tier::Isolated>, String> {
    let kernel = a.vm_kernel.clone().ok_or(
        "the `isolated` class needs a kernel template: give --vm-kernel DIR (or set TESSERA_VM_KERNEL_TEMPLATE)",
    )?;
    let cache = crate::cmd::up::default_data_dir().join("vm");
    let mut cfg = tessera_sandbox::vm::MicroVmConfig::new(kernel, cache);
    if !guard {
        cfg.guard = Arc::new(tessera_sandbox::AllowAll);
    }
    let tier = tessera_sandbox::vm::MicroVmTier::new(cfg).map_err(|e| e.to_string())?;
    eprintln!(
        "micro-VM: {}",
        tessera_sandbox::tier::Tier::info(&*tier).detail
    );
    let vm = tier.spawn_vm(spec).map_err(|e| e.to_string())?;
    Ok(Box::new(vm))
}

fn run_one(a: RunArgs) -> i32 {
    let spec = match spec_from(&a.limits) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let mut req = match build_request(&a.cmd) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    if a.cmd.stdin
        && let Err(e) = read_stdin_into(&mut req)
    {
        return fail(EXIT_FAILURE, e);
    }
    if !nix_is_root() {
        eprintln!("warning: not root: no cgroup limits, single-id user namespace");
    }
    let tier = match tessera_sandbox::RuntimeClasses::default().resolve(Some(&a.runtime_class)) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let rt = match sandbox_runtime(!a.no_guard) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let t0 = std::time::Instant::now();
    let made: Result<Box<dyn tessera_sandbox::tier::Isolated>, String> = match tier {
        tessera_sandbox::tier::TierKind::Namespace => rt
            .spawn(&spec)
            .map(|s| Box::new(s) as Box<dyn tessera_sandbox::tier::Isolated>)
            .map_err(|e| e.to_string()),
        tessera_sandbox::tier::TierKind::Microvm => microvm(&a, !a.no_guard, &spec),
    };
    let sb = match made {
        Ok(s) => s,
        Err(e) => return fail(EXIT_FAILURE, format!("creating the sandbox: {e}")),
    };
    let create_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = std::time::Instant::now();
    // Without --json, output is passed through as it arrives.
    let r = if a.cmd.json {
        sb.exec(&req)
    } else {
        sb.exec_streaming(&req, &mut |stream, data| {
            let _ = match stream {
                tessera_sandbox::Stream::Stdout => {
                    let mut o = std::io::stdout().lock();
                    o.write_all(data).and_then(|()| o.flush())
                }
                tessera_sandbox::Stream::Stderr => std::io::stderr().write_all(data),
            };
        })
    };
    let exec_ms = t1.elapsed().as_secs_f64() * 1e3;
    let _ = sb.destroy();
    let out = match r {
        Ok(o) => o,
        Err(ExecError::Blocked(why)) => {
            return fail(EXIT_BLOCKED, format!("blocked by the guard: {why}"));
        }
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let report = RunJson::new(&out, create_ms, exec_ms, rt.cgroups().map(|c| c.version()));
    report_output(&report, &a.cmd, !a.cmd.json)
}

impl RunJson {
    fn new(out: &ExecOutput, create_ms: f64, exec_ms: f64, cgroups: Option<&str>) -> Self {
        RunJson {
            exit_code: out.status.code(),
            signal: match out.status {
                ExitStatus::Signaled(s) => Some(s),
                ExitStatus::Exited(_) => None,
            },
            timed_out: out.timed_out,
            oom_killed: out.oom_killed,
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            stdout_truncated: out.stdout_truncated,
            stderr_truncated: out.stderr_truncated,
            alerts: out.alerts.clone(),
            redacted: out.redacted,
            create_ms,
            exec_ms,
            cgroups: cgroups.map(str::to_string),
        }
    }
}

/// Prints what a command produced (or one JSON document) and returns its exit status.
fn report_output(r: &RunJson, c: &CmdArgs, streamed: bool) -> i32 {
    for al in &r.alerts {
        eprintln!("guard alert: {al}");
    }
    if r.timed_out {
        eprintln!("timed out after {}; the process tree was killed", c.timeout);
    }
    if r.oom_killed {
        eprintln!("out of memory: a process was killed at the sandbox's memory limit");
    }
    if c.json {
        let code = print_json(r);
        if code != 0 {
            return code;
        }
    } else if !streamed {
        let _ = std::io::stdout().write_all(r.stdout.as_bytes());
        let _ = std::io::stderr().write_all(r.stderr.as_bytes());
    }
    r.exit_code
}

/// Long-lived sandboxes: each is kept by a background supervisor (`__serve`) that owns
/// it and answers one JSON line per connection on `<state>/<name>.sock`. The sandbox
/// lives as long as that process; `rm` ends both.
mod long {
    use super::*;
    use serde::Deserialize;
    use std::io::{BufRead, BufReader};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::path::{Path, PathBuf};

    #[derive(Debug, Serialize, Deserialize)]
    enum Req {
        Exec {
            command: Command,
            env: Vec<(String, String)>,
            cwd: Option<String>,
            stdin: Option<Vec<u8>>,
            timeout_ms: Option<u64>,
        },
        Read {
            path: String,
        },
        Write {
            path: String,
            data: Vec<u8>,
        },
        UploadTar {
            path: String,
            archive: Vec<u8>,
        },
        DownloadTar {
            path: String,
        },
        Destroy,
    }

    #[derive(Debug, Serialize, Deserialize)]
    enum Resp {
        Exec(RunJson),
        Data(Vec<u8>),
        Done,
        Blocked(String),
        Failed(String),
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Record {
        name: String,
        supervisor_pid: u32,
        init_pid: i32,
        sandbox_id: String,
        created_unix_s: u64,
        memory: String,
        cpus: String,
        pids: u32,
    }

    #[cfg(test)]
    pub fn valid_name_pub(n: &str) -> bool {
        valid_name(n)
    }
    #[cfg(test)]
    pub fn remote_pub(s: &str) -> Option<(&str, &str)> {
        remote(s)
    }

    fn valid_name(n: &str) -> bool {
        !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    }

    fn sock(state: &Path, name: &str) -> PathBuf {
        state.join(format!("{name}.sock"))
    }
    fn record(state: &Path, name: &str) -> PathBuf {
        state.join(format!("{name}.json"))
    }
    fn log(state: &Path, name: &str) -> PathBuf {
        state.join(format!("{name}.log"))
    }

    fn call(state: &Path, name: &str, req: &Req) -> Result<Resp, String> {
        if !valid_name(name) {
            return Err(format!(
                "{name:?} is not a sandbox name (letters, digits, - and _)"
            ));
        }
        let path = sock(state, name);
        let mut s = UnixStream::connect(&path).map_err(|e| {
            format!(
                "no running sandbox {name:?} in {} ({e}); see `tessera sandbox ls`",
                state.display()
            )
        })?;
        let mut line = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        line.push(b'\n');
        s.write_all(&line)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut reply = String::new();
        BufReader::new(s)
            .read_line(&mut reply)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&reply).map_err(|e| format!("bad reply from {name}: {e}"))
    }

    pub fn create(a: CreateArgs) -> i32 {
        if let Err(e) = spec_from(&a.limits) {
            return fail(EXIT_BAD_INPUT, e);
        }
        if let Some(l) = &a.lifetime
            && let Err(e) = parse_duration(l)
        {
            return fail(EXIT_BAD_INPUT, format!("--lifetime: {e}"));
        }
        let name = a.name.clone().unwrap_or_else(|| {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            format!(
                "sbx-{:08x}",
                (t as u64 ^ u64::from(std::process::id())) & 0xffff_ffff
            )
        });
        if !valid_name(&name) {
            return fail(
                EXIT_BAD_INPUT,
                format!("--name {name:?}: use letters, digits, - and _"),
            );
        }
        let state = &a.state.state;
        if let Err(e) = std::fs::create_dir_all(state) {
            return fail(EXIT_FAILURE, format!("{}: {e}", state.display()));
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(state, std::fs::Permissions::from_mode(0o700));
        if UnixStream::connect(sock(state, &name)).is_ok() {
            return fail(EXIT_BAD_INPUT, format!("sandbox {name:?} already exists"));
        }
        let exe = match std::env::current_exe() {
            Ok(e) => e,
            Err(e) => return fail(EXIT_FAILURE, format!("locating this program: {e}")),
        };
        let logf = match std::fs::File::create(log(state, &name)) {
            Ok(f) => f,
            Err(e) => {
                return fail(
                    EXIT_FAILURE,
                    format!("{}: {e}", log(state, &name).display()),
                );
            }
        };
        let l = &a.limits;
        let mut cmd = std::process::Command::new(exe);
        cmd.args(["sandbox", "__serve", "--name", &name, "--memory", &l.memory])
            .args([
                "--cpus",
                &l.cpus,
                "--disk",
                &l.disk,
                "--pids",
                &l.pids.to_string(),
                "--template",
                &l.template,
            ])
            .arg("--state")
            .arg(state)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(logf);
        if a.no_guard {
            cmd.arg("--no-guard");
        }
        for d in &l.allow_domain {
            cmd.args(["--allow-domain", d]);
        }
        if let Some(t) = &a.lifetime {
            cmd.args(["--lifetime", t]);
        }
        if l.allow_private_egress {
            cmd.arg("--allow-private-egress");
        }
        use std::os::unix::process::CommandExt;
        cmd.process_group(0);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => return fail(EXIT_FAILURE, format!("starting the supervisor: {e}")),
        };
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = BufReader::new(out).read_line(&mut line);
        }
        if line.trim() == name {
            println!("{name}");
            0
        } else {
            let _ = child.wait();
            let why = std::fs::read_to_string(log(state, &name)).unwrap_or_default();
            let _ = std::fs::remove_file(log(state, &name));
            fail(
                EXIT_FAILURE,
                format!("the sandbox did not start: {}", why.trim()),
            )
        }
    }

    pub fn serve(a: ServeArgs) -> i32 {
        let state = a.state.state.clone();
        let spec = match spec_from(&a.limits) {
            Ok(s) => s,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        };
        let rt = match sandbox_runtime(!a.no_guard) {
            Ok(r) => r,
            Err(e) => return fail(EXIT_FAILURE, e),
        };
        let sb = match rt.spawn(&spec) {
            Ok(s) => s,
            Err(e) => return fail(EXIT_FAILURE, format!("creating the sandbox: {e}")),
        };
        let sp = sock(&state, &a.name);
        let _ = std::fs::remove_file(&sp);
        let listener = match UnixListener::bind(&sp) {
            Ok(l) => l,
            Err(e) => return fail(EXIT_FAILURE, format!("{}: {e}", sp.display())),
        };
        let rec = Record {
            name: a.name.clone(),
            supervisor_pid: std::process::id(),
            init_pid: sb.pid(),
            sandbox_id: sb.id().to_string(),
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            memory: a.limits.memory.clone(),
            cpus: a.limits.cpus.clone(),
            pids: a.limits.pids,
        };
        let _ = std::fs::write(
            record(&state, &a.name),
            serde_json::to_vec_pretty(&rec).unwrap_or_default(),
        );
        println!("{}", a.name);
        let _ = std::io::stdout().flush();
        if let Some(life) = a.lifetime.as_deref().and_then(|l| parse_duration(l).ok()) {
            // At the end of its lifetime the sandbox destroys itself, like `rm`.
            let (state, name) = (state.clone(), a.name.clone());
            std::thread::spawn(move || {
                std::thread::sleep(life);
                let _ = call(&state, &name, &Req::Destroy);
            });
        }
        for conn in listener.incoming() {
            let Ok(conn) = conn else { continue };
            let mut line = String::new();
            let mut reader = BufReader::new(&conn);
            if reader.read_line(&mut line).is_err() {
                continue;
            }
            let (resp, stop) = match serde_json::from_str::<Req>(&line) {
                Err(e) => (Resp::Failed(format!("bad request: {e}")), false),
                Ok(Req::Destroy) => (Resp::Done, true),
                Ok(req) => (handle(&sb, req, rt.cgroups().map(|c| c.version())), false),
            };
            let mut out = serde_json::to_vec(&resp).unwrap_or_default();
            out.push(b'\n');
            let _ = (&conn).write_all(&out);
            if stop {
                break;
            }
        }
        let _ = sb.destroy();
        let _ = std::fs::remove_file(&sp);
        let _ = std::fs::remove_file(record(&state, &a.name));
        let _ = std::fs::remove_file(log(&state, &a.name));
        0
    }

    fn handle(sb: &tessera_sandbox::Sandbox, req: Req, cgroups: Option<&str>) -> Resp {
        match req {
            Req::Exec {
                command,
                env,
                cwd,
                stdin,
                timeout_ms,
            } => {
                let mut r = ExecRequest::new(command);
                r.env = env;
                r.cwd = cwd;
                r.stdin = stdin;
                r.timeout = timeout_ms.map(Duration::from_millis);
                let t = std::time::Instant::now();
                match sb.exec(&r) {
                    Ok(out) => Resp::Exec(RunJson::new(
                        &out,
                        0.0,
                        t.elapsed().as_secs_f64() * 1e3,
                        cgroups,
                    )),
                    Err(ExecError::Blocked(why)) => Resp::Blocked(why),
                    Err(e) => Resp::Failed(e.to_string()),
                }
            }
            Req::Read { path } => match sb.read_file(&path) {
                Ok(d) => Resp::Data(d),
                Err(e) => Resp::Failed(e.to_string()),
            },
            Req::Write { path, data } => match sb.write_file(&path, &data) {
                Ok(()) => Resp::Done,
                Err(e) => Resp::Failed(e.to_string()),
            },
            Req::UploadTar { path, archive } => match sb.upload_tar(&path, &archive) {
                Ok(_) => Resp::Done,
                Err(FileError::Exec(ExecError::Blocked(why))) => Resp::Blocked(why),
                Err(e) => Resp::Failed(e.to_string()),
            },
            Req::DownloadTar { path } => match sb.download_tar(&path) {
                Ok(d) => Resp::Data(d),
                Err(e) => Resp::Failed(e.to_string()),
            },
            Req::Destroy => Resp::Done,
        }
    }

    pub fn exec(a: ExecArgs) -> i32 {
        let mut req = match build_request(&a.cmd) {
            Ok(r) => r,
            Err(e) => return fail(EXIT_BAD_INPUT, e),
        };
        if a.cmd.stdin
            && let Err(e) = read_stdin_into(&mut req)
        {
            return fail(EXIT_FAILURE, e);
        }
        let wire = Req::Exec {
            command: req.command.clone(),
            env: req.env.clone(),
            cwd: req.cwd.clone(),
            stdin: req.stdin.clone(),
            timeout_ms: req.timeout.map(|t| t.as_millis() as u64),
        };
        match call(&a.state.state, &a.name, &wire) {
            Ok(Resp::Exec(r)) => report_output(&r, &a.cmd, false),
            Ok(Resp::Blocked(why)) => fail(EXIT_BLOCKED, format!("blocked by the guard: {why}")),
            Ok(Resp::Failed(e)) => fail(EXIT_FAILURE, e),
            Ok(other) => fail(EXIT_FAILURE, format!("unexpected reply {other:?}")),
            Err(e) => fail(EXIT_BAD_INPUT, e),
        }
    }

    /// `NAME:/path` -> (name, path).
    fn remote(s: &str) -> Option<(&str, &str)> {
        let (n, p) = s.split_once(':')?;
        (valid_name(n) && p.starts_with('/')).then_some((n, p))
    }

    pub fn cp(a: CpArgs) -> i32 {
        let state = &a.state.state;
        let limits = tessera_sandbox::TarLimits::default();
        let reply = |r: Result<Resp, String>| -> Result<Option<Vec<u8>>, (i32, String)> {
            match r {
                Ok(Resp::Done) => Ok(None),
                Ok(Resp::Data(d)) => Ok(Some(d)),
                Ok(Resp::Blocked(e)) => Err((EXIT_BLOCKED, format!("blocked by the guard: {e}"))),
                Ok(Resp::Failed(e)) => Err((EXIT_FAILURE, e)),
                Ok(other) => Err((EXIT_FAILURE, format!("unexpected reply {other:?}"))),
                Err(e) => Err((EXIT_BAD_INPUT, e)),
            }
        };
        let done = |r: Result<Option<Vec<u8>>, (i32, String)>,
                    then: &dyn Fn(Vec<u8>) -> Result<(), String>| match r {
            Ok(d) => match then(d.unwrap_or_default()) {
                Ok(()) => 0,
                Err(e) => fail(EXIT_FAILURE, e),
            },
            Err((code, e)) => fail(code, e),
        };
        match (remote(&a.src), remote(&a.dst)) {
            (Some((name, path)), None) if a.recursive => {
                let r = reply(call(state, name, &Req::DownloadTar { path: path.into() }));
                done(r, &|archive| {
                    // The archive was made inside the sandbox: as hostile as its contents.
                    tessera_sandbox::tarball::unpack(&archive, Path::new(&a.dst), &limits)
                        .map(drop)
                        .map_err(|e| format!("{}: {e}", a.dst))
                })
            }
            (Some((name, path)), None) => {
                let r = reply(call(state, name, &Req::Read { path: path.into() }));
                done(r, &|d| {
                    std::fs::write(&a.dst, d).map_err(|e| format!("{}: {e}", a.dst))
                })
            }
            (None, Some((name, path))) => {
                let is_dir = Path::new(&a.src).is_dir();
                if is_dir != a.recursive {
                    let why = if is_dir {
                        "is a folder: add -r to copy its contents"
                    } else {
                        "-r copies a folder, and this is not one"
                    };
                    return fail(EXIT_BAD_INPUT, format!("{}: {why}", a.src));
                }
                let req = if is_dir {
                    let mut archive = Vec::new();
                    if let Err(e) =
                        tessera_sandbox::tarball::pack(Path::new(&a.src), &mut archive, &limits)
                    {
                        return fail(EXIT_BAD_INPUT, format!("{}: {e}", a.src));
                    }
                    Req::UploadTar {
                        path: path.into(),
                        archive,
                    }
                } else {
                    match std::fs::read(&a.src) {
                        Ok(data) => Req::Write {
                            path: path.into(),
                            data,
                        },
                        Err(e) => return fail(EXIT_BAD_INPUT, format!("{}: {e}", a.src)),
                    }
                };
                done(reply(call(state, name, &req)), &|_| Ok(()))
            }
            _ => fail(
                EXIT_BAD_INPUT,
                "exactly one of SRC and DST must be NAME:/absolute/path inside a sandbox",
            ),
        }
    }

    #[derive(Serialize)]
    struct LsRow {
        #[serde(flatten)]
        record: Record,
        running: bool,
    }

    pub fn ls(a: LsArgs) -> i32 {
        let state = &a.state.state;
        let mut rows = Vec::new();
        if let Ok(rd) = std::fs::read_dir(state) {
            for e in rd.flatten() {
                let p = e.path();
                if p.extension().and_then(|x| x.to_str()) != Some("json") {
                    continue;
                }
                let Ok(rec) = std::fs::read(&p)
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice::<Record>(&b).map_err(|e| e.to_string()))
                else {
                    continue;
                };
                let running = UnixStream::connect(sock(state, &rec.name)).is_ok();
                rows.push(LsRow {
                    record: rec,
                    running,
                });
            }
        }
        rows.sort_by(|x, y| x.record.name.cmp(&y.record.name));
        let format = if a.json {
            super::super::client::Format::Json
        } else {
            a.out.format
        };
        let v = match serde_json::to_value(&rows) {
            Ok(v) => v,
            Err(e) => return fail(EXIT_FAILURE, e),
        };
        let table = |_: &serde_json::Value| {
            let mut t = format!(
                "{:<24} {:>8} {:>8} {:>6} {:>6}  status\n",
                "name", "pid", "memory", "cpus", "pids"
            );
            for r in &rows {
                t.push_str(&format!(
                    "{:<24} {:>8} {:>8} {:>6} {:>6}  {}\n",
                    r.record.name,
                    r.record.supervisor_pid,
                    r.record.memory,
                    r.record.cpus,
                    r.record.pids,
                    if r.running {
                        "running"
                    } else {
                        "dead (rm to clean up)"
                    }
                ));
            }
            t
        };
        super::super::client::finish(super::super::client::show(&v, format, table))
    }

    pub fn rm(a: RmArgs) -> i32 {
        let state = &a.state.state;
        let mut code = 0;
        for name in &a.names {
            match call(state, name, &Req::Destroy) {
                Ok(_) => {
                    // The supervisor removes its files once the sandbox is gone.
                    for _ in 0..500 {
                        if !sock(state, name).exists() {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    println!("{name}");
                }
                Err(e) if record(state, name).exists() => {
                    eprintln!("{name}: supervisor gone ({e}); removing its records");
                    let _ = std::fs::remove_file(sock(state, name));
                    let _ = std::fs::remove_file(record(state, name));
                    let _ = std::fs::remove_file(log(state, name));
                }
                Err(e) => code = fail(EXIT_BAD_INPUT, e),
            }
        }
        code
    }
}

pub(crate) fn nix_is_root() -> bool {
    // SAFETY-free: geteuid via std is not available; read /proc.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_parse() {
        // The model's rules (issue 24: one parse_bytes): binary with `i`, decimal
        // without, as job files and Kubernetes have them.
        assert_eq!(parse_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(parse_bytes("512M"), Ok(512_000_000));
        assert_eq!(parse_bytes("1Gi"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12X").unwrap_err().contains("512Mi"));
        assert!(parse_bytes("512MB").is_err());
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("").is_err());
        assert!(parse_bytes("0").unwrap_err().contains("positive"));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1d").is_err());
    }

    #[test]
    fn long_lived_names_are_checked() {
        assert!(long::valid_name_pub("sbx-01_a"));
        assert!(!long::valid_name_pub("../x"));
        assert!(!long::valid_name_pub(""));
        assert_eq!(long::remote_pub("a:/x/y"), Some(("a", "/x/y")));
        assert_eq!(long::remote_pub("a:rel"), None);
        assert_eq!(long::remote_pub("./local"), None);
    }
}
