//! The request and reply bodies of `/v1/sandboxes`, their errors as problems, and
//! their OpenAPI schemas.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_sandbox::{ExecError, ExecOutput, ExitStatus, FileError};

use crate::problem::{ApiError, Code};

// ------------------------------------------------------------------ bodies

/// `POST /v1/sandboxes`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewSandbox {
    /// `base` (the default: the host's /usr, read-only) or a template name.
    #[serde(default)]
    pub template: Option<String>,
    /// Seconds the sandbox lives before it is killed, or paused with `auto_pause`
    /// (default 300).
    #[serde(default)]
    pub timeout: Option<u64>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Environment of every command.
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default)]
    pub memory_mb: Option<u64>,
    #[serde(default)]
    pub cpus: Option<f64>,
    #[serde(default)]
    pub pids: Option<u32>,
    #[serde(default)]
    pub disk_mb: Option<u64>,
    /// Egress through the sandbox's proxy to these domains (and subdomains) only.
    #[serde(default)]
    pub allow_domains: Vec<String>,
    /// `standard` (namespaces), `isolated` (a micro-VM: its own kernel), or a class
    /// the operator added; none: the tenant's minimum class, else `standard`.
    #[serde(default)]
    pub runtime_class: Option<String>,
    /// At its timeout the sandbox is paused to disk instead of killed (E2B's
    /// `autoPause`); `resume` brings it back.
    #[serde(default)]
    pub auto_pause: bool,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxTimeout {
    /// Seconds from now.
    pub timeout: u64,
}

/// `POST /v1/sandboxes/{id}/commands`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxCommand {
    /// A shell command line (`/bin/sh -c`); give this or `argv`.
    #[serde(default)]
    pub cmd: Option<String>,
    /// A program and its arguments; give this or `cmd`.
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub stdin: Option<String>,
    /// Seconds before the command's whole process tree is killed (default 60).
    #[serde(default)]
    pub timeout: Option<f64>,
    /// Answer with server-sent events (`stdout`, `stderr`, then `end`) as output
    /// arrives (also chosen by `Accept: text/event-stream`).
    #[serde(default)]
    pub stream: bool,
}

#[derive(Debug, Deserialize)]
pub struct PathQuery {
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct CommandResult {
    exit_code: i32,
    signal: Option<i32>,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    timed_out: bool,
    oom_killed: bool,
    alerts: Vec<String>,
    redacted: bool,
}

impl CommandResult {
    pub(super) fn new(o: &ExecOutput, with_output: bool) -> Self {
        let text = |b: &[u8]| {
            if with_output {
                String::from_utf8_lossy(b).into_owned()
            } else {
                String::new()
            }
        };
        CommandResult {
            exit_code: o.status.code(),
            signal: match o.status {
                ExitStatus::Signaled(s) => Some(s),
                ExitStatus::Exited(_) => None,
            },
            stdout: text(&o.stdout),
            stderr: text(&o.stderr),
            stdout_truncated: o.stdout_truncated,
            stderr_truncated: o.stderr_truncated,
            timed_out: o.timed_out,
            oom_killed: o.oom_killed,
            alerts: o.alerts.clone(),
            redacted: o.redacted,
        }
    }
}

pub(super) fn exec_error(id: &str, e: ExecError) -> ApiError {
    match e {
        ExecError::Blocked(why) => {
            ApiError::new(Code::Forbidden, format!("blocked by the guard: {why}"))
        }
        ExecError::EmptyCommand => ApiError::invalid("cmd", "the command is empty"),
        // Killed while the command ran (deleted, expired): the command ended with it.
        ExecError::Destroyed(_) => ApiError::new(
            Code::Gone,
            format!("sandbox {id:?} was killed, and the command with it"),
        ),
        ExecError::Start(s) => ApiError::invalid("argv", format!("the command did not start: {s}")),
        other if other.to_string().contains("paused") => ApiError::new(
            Code::Conflict,
            format!("sandbox {id:?} is paused; resume it first"),
        ),
        other => ApiError::internal(format!("sandbox {id:?}: {other}")),
    }
}

pub(super) fn file_error(id: &str, path: &str, e: FileError) -> ApiError {
    match e {
        FileError::BadPath(p) => ApiError::invalid(
            "path",
            format!("{p:?}: give an absolute path inside the sandbox"),
        ),
        FileError::Exec(x) => exec_error(id, x),
        FileError::Archive { source, .. } => ApiError::invalid(
            "body",
            format!("tar archive for {path:?} in sandbox {id:?}: {source}"),
        ),
        FileError::Op { source, .. } if source.errno == ENOENT => {
            ApiError::not_found(format!("{path:?} in sandbox {id:?}"))
        }
        FileError::Op { source, .. } => {
            ApiError::invalid("path", format!("{path:?} in sandbox {id:?}: {source}"))
        }
    }
}

/// `ENOENT` (the same number on every Linux architecture).
pub(super) const ENOENT: i32 = 2;

/// Request-body schemas this module's routes name, for the OpenAPI document.
pub fn schemas() -> Vec<(&'static str, Value)> {
    let map = json!({"type": "object", "additionalProperties": {"type": "string"}});
    vec![
        (
            "NewSandbox",
            json!({"type": "object", "additionalProperties": false, "properties": {
                "template": {"type": "string", "description": "`base` (default) or a template name"},
                "timeout": {"type": "integer", "description": "seconds the sandbox lives (default 300)"},
                "metadata": map, "env_vars": map,
                "memory_mb": {"type": "integer"}, "cpus": {"type": "number"},
                "pids": {"type": "integer"}, "disk_mb": {"type": "integer"},
                "allow_domains": {"type": "array", "items": {"type": "string"}},
                "runtime_class": {"type": "string", "description": "standard (namespaces), isolated (a micro-VM) or a class the operator added; none: the tenant's minimum class"},
                "auto_pause": {"type": "boolean", "description": "at its timeout, pause to disk instead of kill (E2B autoPause)"}}}),
        ),
        (
            "SandboxTimeout",
            json!({"type": "object", "additionalProperties": false, "required": ["timeout"],
                "properties": {"timeout": {"type": "integer", "description": "seconds from now"}}}),
        ),
        (
            "SandboxCommand",
            json!({"type": "object", "additionalProperties": false, "properties": {
                "cmd": {"type": "string"}, "argv": {"type": "array", "items": {"type": "string"}},
                "envs": map, "cwd": {"type": "string"}, "stdin": {"type": "string"},
                "timeout": {"type": "number"}, "stream": {"type": "boolean"}}}),
        ),
    ]
}
