//! `tessera pool …`: inference pools of a running control plane — one model
//! served by several OpenAI-compatible engines behind the gateway
//! (`/v1/chat/completions`, `/v1/completions`). Create, list, get, update in
//! place, delete; `get` shows each engine's health and load and the pool's
//! recommended replica count. See `docs/gateway.md`.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::client::{Client, Failure, Out, cell, finish, items, show, table, tokio_runtime};
use crate::output::EXIT_BAD_INPUT;

#[derive(Debug, Args)]
pub struct SpecFlags {
    /// The model name callers ask for (`model` in requests).
    #[arg(long)]
    pub model: Option<String>,
    /// An engine's base URL (the gateway calls URL/v1/...), optionally with a
    /// relative capacity: `http://10.0.0.5:8000,weight=2`. Repeat for each
    /// engine; on update, replaces the list.
    #[arg(long = "endpoint", value_name = "URL[,weight=N]")]
    pub endpoints: Vec<String>,
    /// Requests in flight per unit of engine weight before further ones wait
    /// at the gateway (default 32).
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// Requests waiting at the gateway before new ones get 429 (default 256).
    #[arg(long)]
    pub max_queue: Option<u64>,
    /// Longest wait at the gateway in ms before 429 (default 10000).
    #[arg(long)]
    pub queue_timeout_ms: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Register a pool (system operators): from a YAML or JSON file, or flags.
    Create {
        /// The pool's name (with flags; a file names it itself).
        name: Option<String>,
        /// The pool spec (YAML or JSON; `-` for stdin).
        #[arg(short = 'f', long = "file", conflicts_with_all = ["name", "model", "endpoints"])]
        file: Option<PathBuf>,
        #[command(flatten)]
        spec: SpecFlags,
        #[command(flatten)]
        out: Out,
    },
    /// List pools: model, engines in rotation, load, recommended replicas.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one pool with each engine's health and load.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Update a pool in place (system operators): engines that stay keep their
    /// state and cache index. A file replaces the spec; flags change only what
    /// they name.
    Update {
        name: String,
        /// The whole new spec (YAML or JSON; `-` for stdin).
        #[arg(short = 'f', long = "file", conflicts_with_all = ["model", "endpoints", "add_endpoint", "remove_endpoint"])]
        file: Option<PathBuf>,
        #[command(flatten)]
        spec: SpecFlags,
        /// Add an engine (`URL[,weight=N]`), keeping the others.
        #[arg(long, value_name = "URL[,weight=N]")]
        add_endpoint: Vec<String>,
        /// Remove the engine with this URL.
        #[arg(long, value_name = "URL")]
        remove_endpoint: Vec<String>,
        #[command(flatten)]
        out: Out,
    },
    /// Remove a pool (system operators).
    Delete { name: String },
}

fn bad(msg: impl Into<String>) -> Failure {
    Failure(EXIT_BAD_INPUT, msg.into())
}

/// `URL` or `URL,weight=N`.
fn endpoint(s: &str) -> Result<Value, Failure> {
    match s.rsplit_once(",weight=") {
        Some((url, w)) => {
            let w: u32 = w.trim().parse().map_err(|_| {
                bad(format!(
                    "--endpoint {s:?}: weight {w:?} is not a whole number (URL,weight=N)"
                ))
            })?;
            Ok(json!({"url": url.trim(), "weight": w}))
        }
        None => Ok(json!({"url": s.trim()})),
    }
}

fn apply(spec: &mut Value, f: &SpecFlags) -> Result<(), Failure> {
    if let Some(m) = &f.model {
        spec["model"] = json!(m);
    }
    if !f.endpoints.is_empty() {
        spec["endpoints"] = Value::Array(
            f.endpoints
                .iter()
                .map(|e| endpoint(e))
                .collect::<Result<_, _>>()?,
        );
    }
    if let Some(v) = f.max_in_flight {
        spec["max_in_flight"] = json!(v);
    }
    if let Some(v) = f.max_queue {
        spec["max_queue"] = json!(v);
    }
    if let Some(v) = f.queue_timeout_ms {
        spec["queue_timeout_ms"] = json!(v);
    }
    Ok(())
}

fn read_file(file: &Path) -> Result<(&'static str, Vec<u8>), Failure> {
    let data = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
            .map_err(|e| bad(format!("reading stdin: {e}")))?;
        b
    } else {
        std::fs::read(file).map_err(|e| bad(format!("cannot read {}: {e}", file.display())))?
    };
    let json = file.to_string_lossy().ends_with(".json") || data.first() == Some(&b'{');
    Ok((
        if json {
            "application/json"
        } else {
            "application/yaml"
        },
        data,
    ))
}

fn pool_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|p| {
            let eps = p["endpoints"].as_array().cloned().unwrap_or_default();
            let healthy = eps.iter().filter(|e| e["healthy"] == true).count();
            vec![
                cell(&p["spec"]["name"]),
                cell(&p["spec"]["model"]),
                format!("{healthy}/{}", eps.len()),
                cell(&p["in_flight"]),
                cell(&p["queued"]),
                cell(&p["recommended_replicas"]),
            ]
        })
        .collect();
    table(
        &[
            "NAME",
            "MODEL",
            "ENGINES UP",
            "IN FLIGHT",
            "QUEUED",
            "RECOMMENDED REPLICAS",
        ],
        rows,
    )
}

fn pool_detail(v: &Value) -> String {
    let mut s = pool_table(v);
    let rows = v["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|e| {
            vec![
                cell(&e["url"]),
                cell(&e["weight"]),
                match (e["healthy"] == true, e["probe"].as_str()) {
                    (true, Some("metrics") | None) => "up".into(),
                    // No vLLM gauges: served on its health check alone.
                    (true, Some(path)) => format!("up (health: {path})"),
                    (false, _) => format!(
                        "out of rotation: {}",
                        e["out_of_rotation"].as_str().unwrap_or("down")
                    ),
                },
                cell(&e["outstanding"]),
                cell(&e["waiting"]),
                cell(&e["running"]),
                format!("{:.0}%", e["kv_util"].as_f64().unwrap_or(0.0) * 100.0),
                cell(&e["failures"]),
            ]
        })
        .collect();
    s.push('\n');
    s.push_str(&table(
        &[
            "ENGINE", "WEIGHT", "STATE", "SENT", "WAITING", "RUNNING", "KV USED", "FAILURES",
        ],
        rows,
    ));
    s
}

pub fn run(c: PoolCommand) -> i32 {
    use reqwest::Method as M;
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            match c {
                PoolCommand::Create {
                    name,
                    file,
                    spec,
                    out,
                } => {
                    let body = match file {
                        Some(f) => read_file(&f)?,
                        None => {
                            let Some(name) = name else {
                                return Err(bad(
                                    "name the pool (tessera pool create NAME --model M --endpoint URL), or give -f FILE",
                                ));
                            };
                            if spec.model.is_none() || spec.endpoints.is_empty() {
                                return Err(bad(
                                    "a new pool needs --model and at least one --endpoint URL",
                                ));
                            }
                            let mut v = json!({"name": name});
                            apply(&mut v, &spec)?;
                            ("application/json", v.to_string().into_bytes())
                        }
                    };
                    let v = client.call(M::POST, "/v1/pools", Some(body)).await?;
                    show(&v, out.format, pool_detail)
                }
                PoolCommand::List { out } => {
                    let v = client.call(M::GET, "/v1/pools", None).await?;
                    show(&v, out.format, pool_table)
                }
                PoolCommand::Get { name, out } => {
                    let v = client
                        .call(M::GET, &format!("/v1/pools/{name}"), None)
                        .await?;
                    show(&v, out.format, pool_detail)
                }
                PoolCommand::Update {
                    name,
                    file,
                    spec,
                    add_endpoint,
                    remove_endpoint,
                    out,
                } => {
                    let path = format!("/v1/pools/{name}");
                    let body = match file {
                        Some(f) => read_file(&f)?,
                        None => {
                            let cur = client.call(M::GET, &path, None).await?;
                            let mut v = cur["spec"].clone();
                            apply(&mut v, &spec)?;
                            let mut eps = v["endpoints"].as_array().cloned().unwrap_or_default();
                            for r in &remove_endpoint {
                                let before = eps.len();
                                eps.retain(|e| e["url"].as_str() != Some(r.trim()));
                                if eps.len() == before {
                                    return Err(bad(format!(
                                        "--remove-endpoint {r:?}: pool {name:?} has no such engine"
                                    )));
                                }
                            }
                            for a in &add_endpoint {
                                eps.push(endpoint(a)?);
                            }
                            v["endpoints"] = Value::Array(eps);
                            ("application/json", v.to_string().into_bytes())
                        }
                    };
                    let v = client.call(M::PUT, &path, Some(body)).await?;
                    show(&v, out.format, pool_detail)
                }
                PoolCommand::Delete { name } => {
                    client
                        .call(M::DELETE, &format!("/v1/pools/{name}"), None)
                        .await?;
                    eprintln!("pool {name} deleted");
                    Ok(0)
                }
            }
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_flags_parse_url_and_weight() {
        assert_eq!(
            endpoint("http://a:8000").ok(),
            Some(json!({"url": "http://a:8000"}))
        );
        assert_eq!(
            endpoint("http://a:8000,weight=3").ok(),
            Some(json!({"url": "http://a:8000", "weight": 3}))
        );
        assert!(endpoint("http://a,weight=x").is_err());
    }
}
