//! `tessera sandbox remote …`: sandboxes on a Tessera server (`/v1/sandboxes`, a
//! server started with `tessera up --sandboxes`), with the server and key every
//! client command uses (`tessera login`, or `TESSERA_URL`/`TESSERA_API_KEY`). The
//! local `tessera sandbox run|create|exec|…` make sandboxes on this machine instead.

use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{Value, json};

use super::client::{
    Client, Failure, Out, cell, escape, finish, items, json_body, show, table, tokio_runtime,
};
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE};

#[derive(Debug, Subcommand)]
pub enum RemoteCommand {
    /// Create a sandbox on the server; prints its id.
    Create(RemoteCreate),
    /// Run a command in a sandbox (argv after `--`, or --shell with one string);
    /// prints what it wrote and exits with its exit code.
    Exec {
        id: String,
        /// Run the one argument with `sh -c`.
        #[arg(long)]
        shell: bool,
        /// Seconds before the command is stopped (default: the server's, 60).
        #[arg(long)]
        timeout: Option<f64>,
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true, trailing_var_arg = true)]
        command: Vec<String>,
    },
    /// List your sandboxes on the server.
    Ls {
        #[command(flatten)]
        out: Out,
    },
    /// Show one sandbox.
    Get {
        id: String,
        #[command(flatten)]
        out: Out,
    },
    /// Pause a sandbox to disk (its memory and processes freed).
    Pause {
        id: String,
        #[command(flatten)]
        out: Out,
    },
    /// Resume a paused sandbox.
    Resume {
        id: String,
        #[command(flatten)]
        out: Out,
    },
    /// Kill (or, with auto-pause, pause) the sandbox this many seconds from now.
    Timeout {
        id: String,
        seconds: u64,
        #[command(flatten)]
        out: Out,
    },
    /// Kill sandboxes and everything in them.
    Kill { ids: Vec<String> },
    /// Copy a file between this machine and a sandbox (`ID:/path` on one side); with
    /// -r a folder's contents, as a tar archive (one from the sandbox is unpacked as
    /// untrusted: no link out of the folder, no device nodes).
    Cp {
        src: String,
        dst: String,
        #[arg(short = 'r', long)]
        recursive: bool,
    },
}

/// `ID:/path` -> (id, path).
fn in_sandbox(s: &str) -> Option<(&str, &str)> {
    let (id, p) = s.split_once(':')?;
    (!id.is_empty() && !id.contains('/') && p.starts_with('/')).then_some((id, p))
}

/// `tessera sandbox remote cp`.
async fn cp(client: &Client, src: &str, dst: &str, recursive: bool) -> Result<i32, Failure> {
    use std::path::Path;
    let limits = tessera_sandbox::TarLimits::default();
    let local = |e: String| Failure(EXIT_BAD_INPUT, e);
    let at = |id: &str, what: &str, p: &str| format!("{}?path={}", path(id, what), escape(p));
    match (in_sandbox(src), in_sandbox(dst)) {
        (Some((id, p)), None) => {
            let what = if recursive { "files/tar" } else { "files" };
            let body = client
                .open(Method::GET, &at(id, what, p), None)
                .await?
                .bytes()
                .await
                .map_err(|e| Failure(EXIT_FAILURE, format!("reading {src}: {e}")))?;
            if recursive {
                // Made inside the sandbox: as hostile as its contents.
                tessera_sandbox::tarball::unpack(&body, Path::new(dst), &limits)
                    .map_err(|e| Failure(EXIT_FAILURE, format!("{dst}: {e}")))?;
            } else {
                std::fs::write(dst, &body).map_err(|e| local(format!("{dst}: {e}")))?;
            }
            Ok(0)
        }
        (None, Some((id, p))) => {
            let is_dir = Path::new(src).is_dir();
            if is_dir != recursive {
                return Err(local(if is_dir {
                    format!("{src} is a folder: add -r to copy its contents")
                } else {
                    format!("{src}: -r copies a folder, and this is not one")
                }));
            }
            let (what, ct, data) = if is_dir {
                let mut archive = Vec::new();
                tessera_sandbox::tarball::pack(Path::new(src), &mut archive, &limits)
                    .map_err(|e| local(format!("{src}: {e}")))?;
                ("files/tar", "application/x-tar", archive)
            } else {
                let d = std::fs::read(src).map_err(|e| local(format!("{src}: {e}")))?;
                ("files", "application/octet-stream", d)
            };
            client
                .open(Method::PUT, &at(id, what, p), Some((ct, data)))
                .await?;
            Ok(0)
        }
        _ => Err(local(format!(
            "one of {src:?} and {dst:?} must be ID:/path in a sandbox, the other a path here"
        ))),
    }
}

#[derive(Debug, Args)]
pub struct RemoteCreate {
    /// `base` (the default) or a registered template.
    #[arg(long)]
    pub template: Option<String>,
    /// Seconds it lives (default 300).
    #[arg(long)]
    pub timeout: Option<u64>,
    /// At its timeout, pause it to disk instead of killing it.
    #[arg(long)]
    pub auto_pause: bool,
    /// `standard`, `isolated` (a micro-VM) or a class the operator added.
    #[arg(long)]
    pub runtime_class: Option<String>,
    /// Memory limit in MiB.
    #[arg(long)]
    pub memory_mb: Option<u64>,
    /// CPU limit in cores.
    #[arg(long)]
    pub cpus: Option<f64>,
    /// Egress to this domain (and its subdomains) through the sandbox's proxy; repeat.
    #[arg(long = "allow-domain", value_name = "DOMAIN")]
    pub allow_domains: Vec<String>,
    #[command(flatten)]
    pub out: Out,
}

fn sandbox_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|s| {
            vec![
                cell(&s["sandbox_id"]),
                cell(&s["state"]),
                cell(&s["template"]),
                cell(&s["runtime_class"]),
                cell(&s["node"]),
                // Seconds since the epoch, with a fraction.
                crate::output::time_cell(&json!(s["end_at"].as_f64().map(|t| t as i64)), 1),
            ]
        })
        .collect();
    table(&["ID", "STATE", "TEMPLATE", "CLASS", "NODE", "ENDS"], rows)
}

fn path(id: &str, what: &str) -> String {
    let id = escape(id);
    if what.is_empty() {
        format!("/v1/sandboxes/{id}")
    } else {
        format!("/v1/sandboxes/{id}/{what}")
    }
}

pub fn remote(c: RemoteCommand) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(run(client, c))
    })())
}

async fn run(client: Client, c: RemoteCommand) -> Result<i32, Failure> {
    match c {
        RemoteCommand::Create(a) => {
            let b = json!({
                "template": a.template,
                "timeout": a.timeout,
                "runtime_class": a.runtime_class,
                "memory_mb": a.memory_mb,
                "cpus": a.cpus,
                "auto_pause": a.auto_pause.then_some(true),
                "allow_domains": (!a.allow_domains.is_empty()).then_some(a.allow_domains),
            });
            let v = client
                .call(Method::POST, "/v1/sandboxes", json_body(b))
                .await?;
            show(&v, a.out.format, |v| {
                format!("{}\n", cell(&v["sandbox_id"]))
            })
        }
        RemoteCommand::Exec {
            id,
            shell,
            timeout,
            command,
        } => {
            let mut b = if shell {
                if command.len() != 1 {
                    return Err(Failure(
                        EXIT_BAD_INPUT,
                        "--shell takes the command as one argument: -- 'cmd | other'".into(),
                    ));
                }
                json!({ "cmd": command[0] })
            } else {
                json!({ "argv": command })
            };
            if let Some(t) = timeout {
                b["timeout"] = json!(t);
            }
            let v = client
                .call(Method::POST, &path(&id, "commands"), json_body(b))
                .await?;
            print!("{}", v["stdout"].as_str().unwrap_or(""));
            eprint!("{}", v["stderr"].as_str().unwrap_or(""));
            if v["timed_out"] == true {
                eprintln!("tessera: the command timed out");
            }
            Ok(match (v["exit_code"].as_i64(), v["signal"].as_i64()) {
                (Some(c), _) => c as i32,
                (None, Some(s)) => 128 + s as i32,
                _ => EXIT_FAILURE,
            })
        }
        RemoteCommand::Ls { out } => {
            let v = client.call(Method::GET, "/v1/sandboxes", None).await?;
            show(&v, out.format, sandbox_table)
        }
        RemoteCommand::Get { id, out } => {
            let v = client.call(Method::GET, &path(&id, ""), None).await?;
            show(&v, out.format, sandbox_table)
        }
        RemoteCommand::Pause { id, out } => {
            let v = client.call(Method::POST, &path(&id, "pause"), None).await?;
            show(&v, out.format, sandbox_table)
        }
        RemoteCommand::Resume { id, out } => {
            let v = client
                .call(Method::POST, &path(&id, "resume"), None)
                .await?;
            show(&v, out.format, sandbox_table)
        }
        RemoteCommand::Timeout { id, seconds, out } => {
            let v = client
                .call(
                    Method::POST,
                    &path(&id, "timeout"),
                    json_body(json!({ "timeout": seconds })),
                )
                .await?;
            show(&v, out.format, sandbox_table)
        }
        RemoteCommand::Cp {
            src,
            dst,
            recursive,
        } => cp(&client, &src, &dst, recursive).await,
        RemoteCommand::Kill { ids } => {
            for id in &ids {
                client.call(Method::DELETE, &path(id, ""), None).await?;
                println!("killed {id}");
            }
            Ok(0)
        }
    }
}
