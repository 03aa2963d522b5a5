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
    CheckDecision, Command, CommandCheck, ExecError, ExecRequest, ExitStatus, FileAccess,
    InitProgram, Limits, Network, PathAccess, Runtime, RuntimeConfig, SandboxSpec,
};

use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json};

/// Exit status when the guard blocks the command.
pub const EXIT_BLOCKED: i32 = 3;

#[derive(Debug, Subcommand)]
pub enum SandboxCommand {
    /// Create a sandbox, run one command in it, destroy it.
    Run(RunArgs),
    /// The sandbox's init (PID 1 inside each sandbox); not for people.
    #[command(name = "__init", hide = true)]
    Init,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum NetArg {
    /// Private network namespace, loopback only.
    None,
}

#[derive(Debug, Args)]
pub struct LimitArgs {
    /// Network: `none` (loopback only) is the only mode so far.
    #[arg(long, value_enum, default_value = "none")]
    pub net: NetArg,
    /// Memory limit, e.g. `512M`, `1G`, or bytes.
    #[arg(long, default_value = "512M")]
    pub memory: String,
    /// CPU limit in cores, e.g. `0.5`, `2`.
    #[arg(long, default_value = "1")]
    pub cpus: String,
    /// Maximum number of processes and threads.
    #[arg(long, default_value_t = 256)]
    pub pids: u32,
    /// Size of each writable layer (/tmp, /home/user, /workspace), e.g. `256M`.
    #[arg(long, default_value = "256M")]
    pub disk: String,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub limits: LimitArgs,
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
    /// Do not check the command with the runtime guard.
    #[arg(long)]
    pub no_guard: bool,
    /// Print one JSON document (status, output, timings) instead of passing output through.
    #[arg(long)]
    pub json: bool,
    /// The command, after `--`.
    #[arg(required = true, num_args = 1.., allow_hyphen_values = true, trailing_var_arg = true)]
    pub command: Vec<String>,
}

pub fn run(c: SandboxCommand) -> i32 {
    match c {
        SandboxCommand::Init => tessera_sandbox::init::main(),
        SandboxCommand::Run(a) => run_one(a),
    }
}

/// Parses `512M`, `1G`, `1.5Gi`, `4096` into bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        None => (t, 1u64),
        Some((i, _)) => {
            let m = match t[i..].to_ascii_lowercase().as_str() {
                "b" => 1,
                "k" | "kb" | "ki" | "kib" => 1 << 10,
                "m" | "mb" | "mi" | "mib" => 1 << 20,
                "g" | "gb" | "gi" | "gib" => 1 << 30,
                u => return Err(format!("unknown unit {u:?} in {s:?}; use K, M or G")),
            };
            (&t[..i], m)
        }
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size; write e.g. 512M"))?;
    if !(v.is_finite() && v > 0.0) {
        return Err(format!("{s:?} must be a positive size"));
    }
    Ok((v * mult as f64) as u64)
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
        network: match l.net {
            NetArg::None => Network::None,
        },
        limits: Limits {
            memory_bytes: Some(memory),
            cpu_millis: Some((cpus * 1000.0).round().max(1.0) as u32),
            pids: Some(l.pids),
            disk_bytes: disk,
        },
        extra_rules: guard_landlock_rules(),
        ..SandboxSpec::default()
    })
}

/// The init program: `tessera-sandbox-init` next to this binary when installed (small
/// and fast to start), else this binary's hidden `sandbox __init`.
pub fn init_program() -> Option<InitProgram> {
    InitProgram::locate().or_else(|| {
        Some(InitProgram {
            path: std::env::current_exe().ok()?,
            args: vec!["sandbox".into(), "__init".into()],
        })
    })
}

/// The runtime guard as the sandbox's command check.
pub struct GuardCheck {
    policy: tessera_guard::Policy,
}

impl GuardCheck {
    pub fn new() -> Self {
        GuardCheck {
            policy: tessera_guard::Policy::default(),
        }
    }
}

/// The guard's Landlock grants as sandbox rules (`~` is the sandbox user's home). Deny
/// entries cannot be expressed in Landlock beneath a grant; the sandbox's own layout
/// keeps them out of reach (read-only base, no /sys, /proc read-only).
pub fn guard_landlock_rules() -> Vec<PathAccess> {
    let policy = tessera_guard::Policy::default();
    policy
        .landlock_rules()
        .into_iter()
        .filter(|r| r.allow)
        .map(|r| {
            let path = match r.path.strip_prefix('~') {
                Some(rest) => format!("/home/user{rest}"),
                None => r.path.clone(),
            };
            let has = |op| r.access.contains(&op);
            PathAccess {
                path,
                read: has(tessera_guard::FileOp::Read),
                write: has(tessera_guard::FileOp::Write) || has(tessera_guard::FileOp::Delete),
                execute: has(tessera_guard::FileOp::Exec),
            }
        })
        .collect()
}

fn decision(v: &tessera_guard::Verdict) -> CheckDecision {
    let reasons = || {
        v.findings
            .iter()
            .map(|f| format!("{} ({}): {}", f.rule, f.severity.as_str(), f.explanation))
            .collect::<Vec<_>>()
    };
    match v.decision {
        tessera_guard::Decision::Allow => CheckDecision::Allow,
        tessera_guard::Decision::Alert => CheckDecision::Alert(reasons()),
        tessera_guard::Decision::Block => CheckDecision::Block(reasons()),
    }
}

impl Default for GuardCheck {
    fn default() -> Self {
        Self::new()
    }
}

impl CommandCheck for GuardCheck {
    fn check(&self, tenant: Option<&str>, command: &Command) -> CheckDecision {
        let v = match command {
            Command::Shell(s) => tessera_guard::check_command(&self.policy, tenant, s),
            Command::Argv(a) => tessera_guard::check_argv(&self.policy, tenant, a),
        };
        decision(&v)
    }

    fn check_file(&self, tenant: Option<&str>, op: FileAccess, path: &str) -> CheckDecision {
        let op = match op {
            FileAccess::Read => tessera_guard::FileOp::Read,
            FileAccess::Write => tessera_guard::FileOp::Write,
            FileAccess::Delete => tessera_guard::FileOp::Delete,
        };
        decision(&tessera_guard::check_path(&self.policy, tenant, op, path))
    }

    fn redact(&self, output: &[u8]) -> Option<Vec<u8>> {
        let r = tessera_guard::Scanner::new(&self.policy).redact(output);
        (r != output).then_some(r)
    }
}

pub fn runtime(guard: bool) -> Result<Arc<Runtime>, String> {
    Runtime::new(RuntimeConfig {
        init: init_program(),
        cgroups: true,
        guard: guard.then(|| Arc::new(GuardCheck::new()) as Arc<dyn CommandCheck>),
        tenant: None,
    })
    .map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct RunJson {
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
    cgroups: Option<&'static str>,
}

fn run_one(a: RunArgs) -> i32 {
    let spec = match spec_from(&a.limits) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_BAD_INPUT, e),
    };
    let timeout = match parse_duration(&a.timeout) {
        Ok(t) => t,
        Err(e) => return fail(EXIT_BAD_INPUT, format!("--timeout: {e}")),
    };
    let mut env = Vec::new();
    for kv in &a.env {
        match kv.split_once('=') {
            Some((k, v)) if !k.is_empty() => env.push((k.to_string(), v.to_string())),
            _ => return fail(EXIT_BAD_INPUT, format!("--env {kv:?}: write KEY=VALUE")),
        }
    }
    let command = if a.shell {
        Command::Shell(a.command.join(" "))
    } else {
        Command::Argv(a.command.clone())
    };
    let mut req = ExecRequest::new(command)
        .timeout(timeout)
        .cwd(a.cwd.clone());
    req.env = env;
    if a.stdin {
        let mut buf = Vec::new();
        if let Err(e) = std::io::stdin().read_to_end(&mut buf) {
            return fail(EXIT_FAILURE, format!("reading stdin: {e}"));
        }
        req.stdin = Some(buf);
    }
    if !nix_is_root() {
        eprintln!("warning: not root: no cgroup limits, single-id user namespace");
    }
    let rt = match runtime(!a.no_guard) {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    let t0 = std::time::Instant::now();
    let sb = match rt.spawn(&spec) {
        Ok(s) => s,
        Err(e) => return fail(EXIT_FAILURE, format!("creating the sandbox: {e}")),
    };
    let create_ms = t0.elapsed().as_secs_f64() * 1e3;
    let t1 = std::time::Instant::now();
    let r = sb.exec(&req);
    let exec_ms = t1.elapsed().as_secs_f64() * 1e3;
    let _ = sb.destroy();
    let out = match r {
        Ok(o) => o,
        Err(ExecError::Blocked(why)) => {
            return fail(EXIT_BLOCKED, format!("blocked by the guard: {why}"));
        }
        Err(e) => return fail(EXIT_FAILURE, e),
    };
    for al in &out.alerts {
        eprintln!("guard alert: {al}");
    }
    if out.timed_out {
        eprintln!("timed out after {}; the process tree was killed", a.timeout);
    }
    if out.oom_killed {
        eprintln!(
            "out of memory: a process was killed at the {} limit",
            a.limits.memory
        );
    }
    if a.json {
        let code = print_json(&RunJson {
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
            cgroups: rt.cgroups().map(|c| c.version()),
        });
        if code != 0 {
            return code;
        }
    } else {
        let _ = std::io::stdout().write_all(&out.stdout);
        let _ = std::io::stderr().write_all(&out.stderr);
    }
    out.status.code()
}

fn nix_is_root() -> bool {
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
        assert_eq!(parse_bytes("512M"), Ok(512 << 20));
        assert_eq!(parse_bytes("1G"), Ok(1 << 30));
        assert_eq!(parse_bytes("1.5Gi"), Ok(3 << 29));
        assert_eq!(parse_bytes("4096"), Ok(4096));
        assert!(parse_bytes("12X").unwrap_err().contains("unit"));
        assert!(parse_bytes("-1").is_err());
        assert!(parse_bytes("").is_err());
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1d").is_err());
    }
}
