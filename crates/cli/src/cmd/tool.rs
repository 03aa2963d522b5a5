//! `tessera tool …`: the tool gateway of a running control plane — register
//! tools, grant them, call them through the ledger, list the ledger, resolve
//! in-doubt calls, decide approvals. The server URL and key come from
//! `TESSERA_URL` (default `http://127.0.0.1:7700`) and `TESSERA_API_KEY`.
//! See `docs/tools.md`.

use std::path::PathBuf;

use clap::{Subcommand, ValueEnum};
use serde_json::{Value, json};

use super::client::{Client, Failure, Out, finish, show, tokio_runtime};
use crate::output::EXIT_BAD_INPUT;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Outcome {
    /// It happened: record --result.
    Completed,
    /// It did not happen and must not: record --error.
    Failed,
    /// It did not happen: send it again on the next call with its key.
    Resend,
}

#[derive(Debug, Subcommand)]
pub enum ToolCommand {
    /// Register a tool from a YAML or JSON file (`-` for stdin); its schemas are checked.
    Register {
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// Replace the tool if it exists.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        out: Out,
    },
    /// List the tenant's tools with their grants.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one tool.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a tool and its grants.
    Delete { name: String },
    /// Grant a tool to the sessions of a runtime and/or to callers with a role.
    Grant {
        name: String,
        #[arg(long)]
        runtime: Option<String>,
        /// viewer, developer, operator or admin.
        #[arg(long)]
        role: Option<String>,
    },
    /// Revoke a grant (same flags as the grant).
    Revoke {
        name: String,
        #[arg(long)]
        runtime: Option<String>,
        #[arg(long)]
        role: Option<String>,
    },
    /// Call a tool through the ledger (a repeated --call-id replays the recorded result).
    Call {
        name: String,
        #[arg(long)]
        session: String,
        #[arg(long = "call-id")]
        call_id: String,
        /// Idempotency key (default <session>/<call-id>).
        #[arg(long)]
        key: Option<String>,
        /// Arguments as a JSON object.
        #[arg(long, default_value = "{}")]
        args: String,
        #[command(flatten)]
        out: Out,
    },
    /// List ledger entries.
    Ledger {
        #[arg(long)]
        session: Option<String>,
        /// intended, dispatched, completed, failed, in_doubt or denied.
        #[arg(long)]
        state: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// Resolve an in-doubt call after checking the tool.
    Resolve {
        id: String,
        #[arg(long = "as", value_enum)]
        outcome: Outcome,
        /// The result to record (JSON), with --as completed.
        #[arg(long)]
        result: Option<String>,
        /// The error to record, with --as failed.
        #[arg(long)]
        error: Option<String>,
    },
    /// List open approvals.
    Approvals {
        #[command(flatten)]
        out: Out,
    },
    /// Approve a pending call.
    Approve { id: String },
    /// Deny a pending call.
    Deny { id: String },
}

fn bad(msg: impl Into<String>) -> Failure {
    Failure(EXIT_BAD_INPUT, msg.into())
}

fn read_file(file: &PathBuf) -> Result<(String, Vec<u8>), Failure> {
    let data = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| bad(format!("reading stdin: {e}")))?;
        b
    } else {
        std::fs::read(file).map_err(|e| bad(format!("cannot read {}: {e}", file.display())))?
    };
    let name = file.to_string_lossy();
    let ct = if name.ends_with(".json") || data.first() == Some(&b'{') {
        "application/json"
    } else {
        "application/yaml"
    };
    Ok((ct.to_string(), data))
}

fn json_arg(flag: &str, s: &str) -> Result<Value, Failure> {
    serde_json::from_str(s).map_err(|e| bad(format!("{flag}: not valid JSON ({e}): {s}")))
}

/// Sends `v` as the JSON body, exactly as given.
async fn call_json(
    cl: &Client,
    method: reqwest::Method,
    path: &str,
    v: Value,
) -> Result<Value, Failure> {
    let body = ("application/json", v.to_string().into_bytes());
    cl.call(method, path, Some(body)).await
}

fn print(out: &Out, v: &Value, table: impl Fn(&Value) -> String) -> Result<i32, Failure> {
    show(v, out.format, table)
}

fn s(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn tools_table(v: &Value) -> String {
    let mut out = format!(
        "{:<24} {:<8} {:<10} {:<8} GRANTS\n",
        "NAME", "TARGET", "KIND", "APPROVE"
    );
    let items = v["items"]
        .as_array()
        .cloned()
        .unwrap_or_else(|| vec![v.clone()]);
    for t in &items {
        let kind = if t["read_only"] == true {
            "read-only"
        } else if t["idempotency_keys"] == true {
            "keyed"
        } else {
            "effect"
        };
        let grants: Vec<String> = t["grants"]
            .as_array()
            .map(|g| {
                g.iter()
                    .map(|g| {
                        format!(
                            "{}{}",
                            g["runtime"]
                                .as_str()
                                .map(|r| format!("runtime={r} "))
                                .unwrap_or_default(),
                            g["role"]
                                .as_str()
                                .map(|r| format!("role={r}"))
                                .unwrap_or_default()
                        )
                        .trim()
                        .to_string()
                    })
                    .collect()
            })
            .unwrap_or_default();
        out.push_str(&format!(
            "{:<24} {:<8} {:<10} {:<8} {}\n",
            s(&t["name"]),
            s(&t["target"]["type"]),
            kind,
            if t["approval"].is_object() {
                "yes"
            } else {
                "no"
            },
            if grants.is_empty() {
                "-".into()
            } else {
                grants.join(", ")
            }
        ));
    }
    out
}

fn ledger_table(v: &Value) -> String {
    let mut out = format!(
        "{:<34} {:<12} {:<20} {:<16} {:<11} {:>3} NOTE\n",
        "ID", "STATE", "TOOL", "SESSION", "CALL", "TRY"
    );
    for e in v["items"].as_array().into_iter().flatten() {
        out.push_str(&format!(
            "{:<34} {:<12} {:<20} {:<16} {:<11} {:>3} {}\n",
            s(&e["id"]),
            s(&e["state"]),
            s(&e["tool"]),
            s(&e["session_id"]),
            s(&e["tool_call_id"]),
            s(&e["attempts"]),
            e["error"]
                .as_str()
                .or(e["note"].as_str())
                .unwrap_or("")
                .chars()
                .take(60)
                .collect::<String>()
        ));
    }
    out
}

async fn run_async(c: ToolCommand) -> Result<(), Failure> {
    use reqwest::Method;
    let cl = Client::from_env()?;
    match c {
        ToolCommand::Register { file, replace, out } => {
            let (ct, data) = read_file(&file)?;
            let v = if replace {
                let spec: Value = if ct == "application/json" {
                    serde_json::from_slice(&data)
                        .map_err(|e| bad(format!("{}: {e}", file.display())))?
                } else {
                    serde_norway::from_slice(&data)
                        .map_err(|e| bad(format!("{}: {e}", file.display())))?
                };
                let name = spec["name"]
                    .as_str()
                    .ok_or_else(|| bad(format!("{}: the tool has no \"name\"", file.display())))?
                    .to_string();
                call_json(&cl, Method::PUT, &format!("/v1/tools/{name}"), spec).await?
            } else {
                cl.call(Method::POST, "/v1/tools", Some((&ct, data)))
                    .await?
            };
            print(&out, &v, tools_table)?;
        }
        ToolCommand::List { out } => {
            let v = cl.call(Method::GET, "/v1/tools", None).await?;
            print(&out, &v, tools_table)?;
        }
        ToolCommand::Get { name, out } => {
            let v = cl
                .call(Method::GET, &format!("/v1/tools/{name}"), None)
                .await?;
            print(&out, &v, |v| {
                format!("{}\n", serde_json::to_string_pretty(v).unwrap_or_default())
            })?;
        }
        ToolCommand::Delete { name } => {
            cl.call(Method::DELETE, &format!("/v1/tools/{name}"), None)
                .await?;
            eprintln!("deleted tool {name}");
        }
        ToolCommand::Grant {
            name,
            runtime,
            role,
        }
        | ToolCommand::Revoke {
            name,
            runtime,
            role,
        } if runtime.is_none() && role.is_none() => {
            return Err(bad(format!("tool {name}: give --runtime, --role, or both")));
        }
        ToolCommand::Grant {
            name,
            runtime,
            role,
        } => {
            let v = call_json(
                &cl,
                Method::POST,
                &format!("/v1/tools/{name}/grants"),
                json!({"runtime": runtime, "role": role}),
            )
            .await?;
            println!("{}", v["items"]);
        }
        ToolCommand::Revoke {
            name,
            runtime,
            role,
        } => {
            let v = call_json(
                &cl,
                Method::DELETE,
                &format!("/v1/tools/{name}/grants"),
                json!({"runtime": runtime, "role": role}),
            )
            .await?;
            println!("{}", v["items"]);
        }
        ToolCommand::Call {
            name,
            session,
            call_id,
            key,
            args,
            out,
        } => {
            let arguments = json_arg("--args", &args)?;
            let mut body =
                json!({"session_id": session, "tool_call_id": call_id, "arguments": arguments});
            if let Some(k) = key {
                body["idempotency_key"] = json!(k);
            }
            let v = call_json(&cl, Method::POST, &format!("/v1/tools/{name}/call"), body).await?;
            print(&out, &v, |v| {
                format!(
                    "status: {}{}\nledger: {}\nresult: {}\n{}",
                    s(&v["status"]),
                    if v["replayed"] == true {
                        " (replayed)"
                    } else {
                        ""
                    },
                    s(&v["ledger_id"]),
                    s(&v["result"]),
                    v["error"]
                        .as_str()
                        .map(|e| format!("error: {e}\n"))
                        .unwrap_or_default()
                )
            })?;
        }
        ToolCommand::Ledger {
            session,
            state,
            out,
        } => {
            let mut q = Vec::new();
            if let Some(s) = session {
                q.push(format!("session_id={s}"));
            }
            if let Some(s) = state {
                q.push(format!("state={s}"));
            }
            let path = if q.is_empty() {
                "/v1/ledger".to_string()
            } else {
                format!("/v1/ledger?{}", q.join("&"))
            };
            let v = cl.call(Method::GET, &path, None).await?;
            print(&out, &v, ledger_table)?;
        }
        ToolCommand::Resolve {
            id,
            outcome,
            result,
            error,
        } => {
            let outcome = match outcome {
                Outcome::Completed => "completed",
                Outcome::Failed => "failed",
                Outcome::Resend => "resend",
            };
            let mut body = json!({"outcome": outcome});
            if let Some(r) = result {
                body["result"] = json_arg("--result", &r)?;
            }
            if let Some(e) = error {
                body["error"] = json!(e);
            }
            let v = call_json(&cl, Method::POST, &format!("/v1/ledger/{id}/resolve"), body).await?;
            println!("{} is now {}", id, s(&v["state"]));
        }
        ToolCommand::Approvals { out } => {
            let v = cl.call(Method::GET, "/v1/approvals", None).await?;
            print(&out, &v, ledger_table)?;
        }
        ToolCommand::Approve { id } => {
            call_json(
                &cl,
                Method::POST,
                &format!("/v1/approvals/{id}"),
                json!({"decision": "approve"}),
            )
            .await?;
            println!("approved {id}");
        }
        ToolCommand::Deny { id } => {
            call_json(
                &cl,
                Method::POST,
                &format!("/v1/approvals/{id}"),
                json!({"decision": "deny"}),
            )
            .await?;
            println!("denied {id}");
        }
    }
    Ok(())
}

pub fn run(c: ToolCommand) -> i32 {
    finish(tokio_runtime().and_then(|rt| rt.block_on(run_async(c)).map(|()| 0)))
}
