//! Client commands against a running control plane: `tessera queue …`,
//! `tessera job …`, `tessera node …`. The server URL and key come from
//! `TESSERA_URL` and `TESSERA_API_KEY`, else from the config file `tessera login`
//! wrote (see [`super::config`]); the URL defaults to `http://127.0.0.1:7700`.
//! Tables for people; `-o json|yaml` for scripts.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

pub(crate) use super::request::{escape, json_body};
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail};

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct Out {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Create a queue in your tenant.
    Create {
        name: String,
        /// Weight among sibling queues for fair share.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Parent queue.
        #[arg(long)]
        parent: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// List your tenant's queues.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one queue.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a queue (refused while jobs or child queues use it).
    Delete {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Submit a job from a YAML or JSON file.
    Submit {
        /// The job file (`-` for stdin).
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[command(flatten)]
        out: Out,
    },
    /// List your tenant's jobs with their phase and pending reason.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one job.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Print the output of a job's tasks (those that ran on the server's machine).
    Logs {
        name: String,
        /// Only this task.
        #[arg(long)]
        task: Option<String>,
        /// Keep printing what the tasks write (each line after the first task's prefixed
        /// `[TASK]`) until the job ends; Ctrl-C to stop earlier.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Cancel a job.
    Cancel {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a job (and its logs) so that its name can be used again; running tasks
    /// are stopped first (SIGTERM, the job's grace period, SIGKILL).
    Delete {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// List nodes.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show one node: its resources, GPUs, labels, taints and the node runtime's
    /// conditions.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Show a node's attestation: whether it is attested and why (or why not), its TPM,
    /// what it measured at start beside the values an operator approved.
    Attestation {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Attest a node now: a fresh nonce, its TPM's quote, the verdict (operators).
    Attest {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Approve a node's current measurements (its last authentic quote) as the values
    /// its quotes must show from now on, then attest it (system operators). Check them
    /// first with `tessera node attestation NODE`.
    Trust {
        name: String,
        #[command(flatten)]
        out: Out,
    },
}

/// A failed call: the exit status and the message.
pub(crate) struct Failure(pub(crate) i32, pub(crate) String);

/// The server URL and API key every client command uses: from the
/// environment, else the config file `tessera login` wrote (see
/// [`super::config`]).
pub(crate) fn server_and_key() -> Result<(String, String), Failure> {
    let s = super::config::resolve(&super::config::ProcessEnv)
        .map_err(|e| Failure(EXIT_BAD_INPUT, e))?;
    let key = s.key.ok_or_else(|| {
        Failure(
            EXIT_BAD_INPUT,
            "no API key: run `tessera login` (it saves the server and key), or export TESSERA_API_KEY with the key `tessera up` printed on first start"
                .into(),
        )
    })?;
    Ok((s.url, key))
}

pub(crate) struct Client {
    pub(crate) url: String,
    key: String,
    pub(crate) http: reqwest::Client,
}

impl Client {
    /// The server and key from the environment or the config file (see
    /// [`super::config`]).
    pub(crate) fn from_env() -> Result<Client, Failure> {
        let (url, key) = server_and_key()?;
        Ok(Client::new(&url, &key))
    }

    pub(crate) fn new(url: &str, key: &str) -> Client {
        Client {
            url: url.trim_end_matches('/').to_string(),
            key: key.to_string(),
            http: reqwest::Client::new(),
        }
    }

    pub(crate) async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<Value, Failure> {
        self.send(method, path, body).await.map(|(v, _)| v)
    }

    /// [`Client::call`], with the reply's headers.
    pub(crate) async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<(Value, reqwest::header::HeaderMap), Failure> {
        self.reply(self.request(method, path, body)).await
    }

    /// A request to `path` with the key and `body` (content type, bytes).
    fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> reqwest::RequestBuilder {
        let url = format!("{}{path}", self.url);
        let req = self.http.request(method, url).bearer_auth(&self.key);
        match body {
            Some((ct, b)) => req.header("content-type", ct).body(b),
            None => req,
        }
    }

    /// Sends a request whose body streams (`tessera weights put`); the reply as
    /// [`Client::call`]'s.
    pub(crate) async fn upload(
        &self,
        method: reqwest::Method,
        path: &str,
        body: reqwest::Body,
    ) -> Result<Value, Failure> {
        let req = self.request(method, path, None);
        let req = req.header("content-type", "application/octet-stream");
        self.reply(req.body(body)).await.map(|(v, _)| v)
    }

    /// Sends a request and hands back a successful reply for the caller to read (a
    /// stream, raw bytes); a failure as [`Client::call`]'s.
    pub(crate) async fn open(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
    ) -> Result<reqwest::Response, Failure> {
        let resp = self
            .request(method, path, body)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Err(failure(status, &v))
    }

    fn unreachable(&self, e: reqwest::Error) -> Failure {
        Failure(
            EXIT_FAILURE,
            format!(
                "cannot reach {} ({e}): is `tessera up` running there? Set TESSERA_URL otherwise",
                self.url
            ),
        )
    }

    async fn reply(
        &self,
        req: reqwest::RequestBuilder,
    ) -> Result<(Value, reqwest::header::HeaderMap), Failure> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let plain = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/plain"));
        let text = resp
            .text()
            .await
            .map_err(|e| Failure(EXIT_FAILURE, format!("reading the reply: {e}")))?;
        let v: Value = if plain {
            Value::String(text)
        } else {
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        };
        if status.is_success() {
            return Ok((v, headers));
        }
        Err(failure(status, &v))
    }
}

/// A failed reply as the message and exit code every client command uses: its detail
/// (and field), status and code; 4xx other than 401/403 is bad input.
fn failure(status: reqwest::StatusCode, v: &Value) -> Failure {
    let mut msg = v["detail"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string());
    if let Some(f) = v["field"].as_str() {
        msg = format!("field {f}: {msg}");
    }
    let code = v["code"].as_str().unwrap_or("");
    let status_code =
        if status.is_client_error() && status.as_u16() != 401 && status.as_u16() != 403 {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILURE
        };
    Failure(status_code, format!("{msg} ({} {code})", status.as_u16()))
}

pub(crate) fn tokio_runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure(EXIT_FAILURE, format!("cannot start the runtime: {e}")))
}

pub(crate) fn finish(r: Result<i32, Failure>) -> i32 {
    match r {
        Ok(c) => c,
        Err(Failure(code, msg)) => fail(code, msg),
    }
}

pub(crate) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// Prints `rows` under `headers`, columns padded to their widest cell.
pub(crate) fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut w: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut s = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<width$}  ", width = w[i]));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(headers.iter().map(|h| h.to_string()).collect());
    for r in rows {
        out.push_str(&line(r));
    }
    out
}

pub(crate) fn show(
    v: &Value,
    f: Format,
    as_table: impl Fn(&Value) -> String,
) -> Result<i32, Failure> {
    let text = match f {
        Format::Json => serde_json::to_string_pretty(v)
            .map(|s| s + "\n")
            .map_err(|e| Failure(EXIT_FAILURE, e.to_string()))?,
        Format::Yaml => {
            serde_norway::to_string(v).map_err(|e| Failure(EXIT_FAILURE, e.to_string()))?
        }
        Format::Table => as_table(v),
    };
    print!("{text}");
    Ok(0)
}

pub(crate) fn items(v: &Value) -> Vec<Value> {
    match v.get("items") {
        Some(Value::Array(a)) => a.clone(),
        _ => vec![v.clone()],
    }
}

fn queue_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|q| vec![cell(&q["name"]), cell(&q["weight"]), cell(&q["parent"])])
        .collect();
    table(&["NAME", "WEIGHT", "PARENT"], rows)
}

fn job_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|j| {
            let total = j["spec"]["tasks"].as_array().map_or(0, Vec::len);
            let bound = j["status"]["tasks"].as_object().map_or(0, |m| m.len());
            vec![
                cell(&j["name"]),
                cell(&j["spec"]["queue"]),
                cell(&j["status"]["phase"]),
                format!("{bound}/{total}"),
                if j["status"]["pending_reason"].is_null() {
                    cell(&j["status"]["reason"])
                } else {
                    cell(&j["status"]["pending_reason"])
                },
            ]
        })
        .collect();
    table(&["NAME", "QUEUE", "PHASE", "BOUND", "REASON"], rows)
}

fn node_table(v: &Value) -> String {
    let rows = items(v)
        .iter()
        .map(|n| {
            let a = &n["allocatable"];
            let cpu = a["cpu_milli"].as_u64().unwrap_or(0) as f64 / 1000.0;
            let mem = a["memory"].as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64;
            let gpus = gpu_use(n);
            let state = if n["unschedulable"].as_bool() == Some(true) {
                "cordoned"
            } else {
                "ready"
            };
            vec![
                cell(&n["name"]),
                format!("{cpu}"),
                format!("{mem:.1}Gi"),
                gpus,
                state.into(),
            ]
        })
        .collect();
    table(&["NAME", "CPU", "MEMORY", "GPUS", "STATE"], rows)
}

/// A node's GPUs for people: `8 (6 free, 1.5 allocated)` from the server's `gpu_use`,
/// or the count alone from a server that sends none.
fn gpu_use(n: &Value) -> String {
    let total = n["gpus"].as_array().map_or(0, Vec::len);
    let u = &n["gpu_use"];
    match (u["free"].as_u64(), u["allocated_milli"].as_u64()) {
        (Some(free), Some(milli)) if total > 0 => {
            format!("{total} ({free} free, {} allocated)", milli as f64 / 1000.0)
        }
        _ => total.to_string(),
    }
}

/// `key: value` lines of a detail view, skipping what is absent.
fn fields(pairs: &[(&str, String)]) -> String {
    let w = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .filter(|(_, v)| v != "-" && !v.is_empty())
        .map(|(k, v)| format!("{:<w$} {v}\n", format!("{k}:")))
        .collect()
}

/// Resources as people read them: `cpu 4, memory 16.0Gi, gpu 8`.
fn resources(r: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(c) = r["cpu_milli"].as_u64().filter(|c| *c > 0) {
        parts.push(format!("cpu {}", c as f64 / 1000.0));
    }
    if let Some(m) = r["memory"].as_u64().filter(|m| *m > 0) {
        parts.push(format!(
            "memory {}",
            tessera_model::quantity::format_bytes(m)
        ));
    }
    if let Some(g) = r["gpu_milli"].as_u64().filter(|g| *g > 0) {
        parts.push(format!("gpu {}", g as f64 / 1000.0));
    }
    if let Some(m) = r["gpu_memory"].as_u64().filter(|m| *m > 0) {
        parts.push(format!(
            "gpu memory {}",
            tessera_model::quantity::format_bytes(m)
        ));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// A task's GPU request in the job file's words.
fn gpu_words(g: &Value) -> String {
    if let Some(w) = g.get("whole") {
        format!("{} whole", cell(&w["count"]))
    } else if let Some(sh) = g.get("shared") {
        format!("{} milli", cell(&sh["milli"]))
    } else if let Some(m) = g.get("mig") {
        format!("mig {}", cell(&m["profile"]))
    } else {
        "-".into()
    }
}

/// `tessera job get`: the job, then one row per task.
fn job_detail(j: &Value) -> String {
    let st = &j["status"];
    let mut out = fields(&[
        ("name", cell(&j["name"])),
        ("queue", cell(&j["spec"]["queue"])),
        ("kind", cell(&j["spec"]["kind"])),
        ("priority", cell(&j["spec"]["priority"])),
        ("phase", cell(&st["phase"])),
        ("pending", cell(&st["pending_reason"])),
        ("reason", cell(&st["reason"])),
        ("message", cell(&st["message"])),
    ]);
    let tasks = j["spec"]["tasks"].as_array().cloned().unwrap_or_default();
    let rows = tasks
        .iter()
        .map(|t| {
            let name = t["name"].as_str().unwrap_or("");
            let s = &st["tasks"][name];
            let gpus = s["gpus"].as_array().map_or("-".to_string(), |g| {
                g.iter().map(cell).collect::<Vec<_>>().join(",")
            });
            vec![
                name.to_string(),
                gpu_words(&t["gpu"]),
                cell(&s["node"]),
                if gpus.is_empty() { "-".into() } else { gpus },
                cell(&s["state"]),
                cell(&s["exit_code"]),
                cell(&s["reason"]),
            ]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["TASK", "ASKS", "NODE", "GPUS", "STATE", "EXIT", "REASON"],
        rows,
    ));
    out
}

/// `tessera queue get`.
fn queue_detail(q: &Value) -> String {
    fields(&[
        ("name", cell(&q["name"])),
        ("parent", cell(&q["parent"])),
        ("weight", cell(&q["weight"])),
        ("guarantee", resources(&q["guarantee"])),
        ("capability", resources(&q["capability"])),
        ("reclaimable", cell(&q["reclaimable"])),
        ("version", cell(&q["resource_version"])),
    ])
}

/// `tessera node get`: the node, its GPUs, its conditions.
/// A node's attestation record: the verdict, then each measurement beside its
/// approved value.
fn attestation_detail(a: &Value) -> String {
    let tpm = format!(
        "{}{}",
        cell(&a["tcti"]),
        if a["software_tpm"] == true {
            " (software TPM: proves the protocol, not hardware)"
        } else {
            ""
        }
    );
    let mut out = fields(&[
        ("node", cell(&a["node"])),
        ("attested", cell(&a["attested"])),
        ("reason", cell(&a["reason"])),
        ("tpm", tpm),
        ("registered", cell(&a["registered"])),
        ("checked", crate::output::time_cell(&a["checked_ms"], 1000)),
        ("last ok", crate::output::time_cell(&a["last_ok_ms"], 1000)),
    ]);
    let approved = &a["reference"]["measurements"];
    let rows: Vec<Vec<String>> = a["measurements"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let name = m["name"].as_str().unwrap_or_default();
            let digest = m["digest"].as_str().unwrap_or_default();
            let state = match approved.get(name).and_then(Value::as_str) {
                None if a["reference"].is_null() => "not approved yet",
                None => "not in the approved values",
                Some(d) if d == digest => "approved",
                Some(_) => "CHANGED",
            };
            vec![name.to_string(), digest.to_string(), state.to_string()]
        })
        .collect();
    out.push('\n');
    out.push_str(&table(&["MEASUREMENT", "DIGEST", "STATE"], rows));
    out
}

fn node_detail(n: &Value) -> String {
    let labels = n["labels"].as_object().map_or(String::new(), |m| {
        m.iter()
            .map(|(k, v)| format!("{k}={}", cell(v)))
            .collect::<Vec<_>>()
            .join(", ")
    });
    let taints = n["taints"].as_array().map_or(String::new(), |a| {
        a.iter()
            .map(|t| format!("{}:{}", cell(&t["key"]), cell(&t["effect"])))
            .collect::<Vec<_>>()
            .join(", ")
    });
    let mut out = fields(&[
        ("name", cell(&n["name"])),
        ("allocatable", resources(&n["allocatable"])),
        (
            "state",
            if n["unschedulable"].as_bool() == Some(true) {
                "cordoned".into()
            } else {
                "ready".into()
            },
        ),
        ("network", cell(&n["network"])),
        ("labels", labels),
        ("taints", taints),
        ("heartbeat", cell(&n["status"]["heartbeat_ms"])),
        ("gpus", gpu_use(n)),
    ]);
    let gpus = n["gpus"].as_array().cloned().unwrap_or_default();
    if !gpus.is_empty() {
        let rows = gpus
            .iter()
            .enumerate()
            .map(|(i, g)| {
                vec![
                    g["index"].as_u64().map_or(i.to_string(), |x| x.to_string()),
                    cell(&g["model"]),
                    g["memory"]
                        .as_u64()
                        .map_or("-".into(), tessera_model::quantity::format_bytes),
                    cell(&g["nvlink_domain"]),
                    cell(&g["pcie_root"]),
                    if g["mig"].is_null() {
                        "whole".into()
                    } else {
                        "mig".into()
                    },
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(
            &["GPU", "MODEL", "MEMORY", "NVLINK", "PCIE ROOT", "MODE"],
            rows,
        ));
    }
    if let Some(conds) = n["status"]["conditions"]
        .as_array()
        .filter(|c| !c.is_empty())
    {
        let rows = conds
            .iter()
            .map(|c| {
                vec![
                    cell(&c["kind"]),
                    cell(&c["status"]),
                    cell(&c["reason"]),
                    cell(&c["message"]),
                ]
            })
            .collect();
        out.push('\n');
        out.push_str(&table(&["CONDITION", "STATUS", "REASON", "MESSAGE"], rows));
    }
    out
}

/// `tessera job logs --follow`: each task's log from where the last read ended
/// (`?from=`), once a second, until the job is over and nothing new came.
async fn follow_logs(client: &Client, name: &str, only: Option<&str>) -> Result<i32, Failure> {
    use std::io::Write;
    let mut offsets: std::collections::BTreeMap<String, u64> = Default::default();
    let mut partial: std::collections::BTreeMap<String, String> = Default::default();
    loop {
        let job = client
            .call(reqwest::Method::GET, &format!("/v1/jobs/{name}"), None)
            .await?;
        let over = matches!(
            job["status"]["phase"].as_str(),
            Some("succeeded" | "failed" | "cancelled")
        );
        let tasks: Vec<String> = match only {
            Some(t) => vec![t.to_string()],
            None => job["spec"]["tasks"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|t| t["name"].as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        };
        let prefix = tasks.len() > 1;
        let mut any = false;
        for t in &tasks {
            let from = offsets.get(t).copied().unwrap_or(0);
            let (v, headers) = client
                .send(
                    reqwest::Method::GET,
                    &format!("/v1/jobs/{name}/logs?task={t}&from={from}"),
                    None,
                )
                .await?;
            let next = headers
                .get("x-tessera-log-offset")
                .and_then(|h| h.to_str().ok())
                .and_then(|h| h.parse().ok())
                .ok_or_else(|| {
                    Failure(
                        EXIT_FAILURE,
                        "the server does not follow logs (no X-Tessera-Log-Offset): upgrade it, or drop --follow".into(),
                    )
                })?;
            let text = match v {
                Value::String(s) => s,
                other => other.to_string(),
            };
            any |= next != from;
            offsets.insert(t.clone(), next);
            // Whole lines only, each under its task's name; a line's end comes later.
            let buf = partial.entry(t.clone()).or_default();
            buf.push_str(&text);
            let mut out = String::new();
            while let Some(i) = buf.find('\n') {
                let line: String = buf.drain(..=i).collect();
                if prefix {
                    out.push_str(&format!("[{t}] "));
                }
                out.push_str(&line);
            }
            let mut o = std::io::stdout().lock();
            if o.write_all(out.as_bytes())
                .and_then(|()| o.flush())
                .is_err()
            {
                return Ok(0); // the reader went away (`| head`)
            }
        }
        if over && !any {
            let mut o = std::io::stdout().lock();
            for (t, rest) in &partial {
                if !rest.is_empty() {
                    let p = if prefix {
                        format!("[{t}] ")
                    } else {
                        String::new()
                    };
                    let _ = writeln!(o, "{p}{rest}");
                }
            }
            return Ok(0);
        }
        if !any {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
}

pub fn queue(c: QueueCommand) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            match c {
                QueueCommand::Create {
                    name,
                    weight,
                    parent,
                    out,
                } => {
                    let mut body = json!({"name": name, "weight": weight});
                    if let Some(p) = parent {
                        body["parent"] = json!(p);
                    }
                    let v = client
                        .call(
                            reqwest::Method::POST,
                            "/v1/queues",
                            Some(("application/json", body.to_string().into_bytes())),
                        )
                        .await?;
                    show(&v, out.format, queue_table)
                }
                QueueCommand::List { out } => {
                    let v = client
                        .call(reqwest::Method::GET, "/v1/queues", None)
                        .await?;
                    show(&v, out.format, queue_table)
                }
                QueueCommand::Get { name, out } => {
                    let v = client
                        .call(reqwest::Method::GET, &format!("/v1/queues/{name}"), None)
                        .await?;
                    show(&v, out.format, queue_detail)
                }
                QueueCommand::Delete { name, out } => {
                    let v = client
                        .call(reqwest::Method::DELETE, &format!("/v1/queues/{name}"), None)
                        .await?;
                    show(&v, out.format, queue_table)
                }
            }
        })
    })())
}

pub fn job(c: JobCommand) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            match c {
                JobCommand::Submit { file, out } => {
                    let (name, bytes) = if file.as_os_str() == "-" {
                        let mut b = Vec::new();
                        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b)
                            .map_err(|e| Failure(EXIT_BAD_INPUT, format!("reading stdin: {e}")))?;
                        ("stdin".to_string(), b)
                    } else {
                        let b = std::fs::read(&file).map_err(|e| {
                            Failure(EXIT_BAD_INPUT, format!("{}: {e}", file.display()))
                        })?;
                        (file.display().to_string(), b)
                    };
                    let ct = if name.ends_with(".json") {
                        "application/json"
                    } else {
                        "application/yaml"
                    };
                    let v = client
                        .call(reqwest::Method::POST, "/v1/jobs", Some((ct, bytes)))
                        .await
                        .map_err(|Failure(c, m)| Failure(c, format!("{name}: {m}")))?;
                    show(&v, out.format, job_table)
                }
                JobCommand::List { out } => {
                    let v = client.call(reqwest::Method::GET, "/v1/jobs", None).await?;
                    show(&v, out.format, job_table)
                }
                JobCommand::Get { name, out } => {
                    let v = client
                        .call(reqwest::Method::GET, &format!("/v1/jobs/{name}"), None)
                        .await?;
                    show(&v, out.format, job_detail)
                }
                JobCommand::Logs {
                    name,
                    task,
                    follow: true,
                } => follow_logs(&client, &name, task.as_deref()).await,
                JobCommand::Logs { name, task, .. } => {
                    let path = match task {
                        Some(t) => format!("/v1/jobs/{name}/logs?task={t}"),
                        None => format!("/v1/jobs/{name}/logs"),
                    };
                    let v = client.call(reqwest::Method::GET, &path, None).await?;
                    match v {
                        Value::String(s) => print!("{s}"),
                        other => print!("{other}"),
                    }
                    Ok(0)
                }
                JobCommand::Delete { name, out } => {
                    let v = client
                        .call(reqwest::Method::DELETE, &format!("/v1/jobs/{name}"), None)
                        .await?;
                    show(&v, out.format, job_table)
                }
                JobCommand::Cancel { name, out } => {
                    let v = client
                        .call(
                            reqwest::Method::POST,
                            &format!("/v1/jobs/{name}/cancel"),
                            None,
                        )
                        .await?;
                    show(&v, out.format, job_table)
                }
            }
        })
    })())
}

pub fn node(c: NodeCommand) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            match c {
                NodeCommand::List { out } => {
                    let v = client.call(reqwest::Method::GET, "/v1/nodes", None).await?;
                    show(&v, out.format, node_table)
                }
                NodeCommand::Get { name, out } => {
                    let v = client
                        .call(reqwest::Method::GET, &format!("/v1/nodes/{name}"), None)
                        .await?;
                    show(&v, out.format, node_detail)
                }
                NodeCommand::Attestation { name, out } => {
                    let path = format!("/v1/nodes/{name}/attestation");
                    let v = client.call(reqwest::Method::GET, &path, None).await?;
                    show(&v, out.format, attestation_detail)
                }
                NodeCommand::Attest { name, out } => {
                    let path = format!("/v1/nodes/{name}/attestation/check");
                    let v = client.call(reqwest::Method::POST, &path, None).await?;
                    show(&v, out.format, attestation_detail)
                }
                NodeCommand::Trust { name, out } => {
                    let path = format!("/v1/nodes/{name}/attestation/trust");
                    let v = client.call(reqwest::Method::POST, &path, None).await?;
                    show(&v, out.format, attestation_detail)
                }
            }
        })
    })())
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// What to watch: job, queue or event.
    #[arg(long, default_value = "job")]
    pub kind: String,
    /// Start after this revision (default: from now).
    #[arg(long)]
    pub after: Option<u64>,
    /// Print each change as one JSON line instead of a table row.
    #[arg(long)]
    pub json: bool,
}

/// `tessera watch`: follows changes in your tenant until interrupted.
pub fn watch(a: WatchArgs) -> i32 {
    finish((|| {
        let client = Client::from_env()?;
        tokio_runtime()?.block_on(async move {
            let mut path = format!("/v1/watch?kind={}", a.kind);
            if let Some(after) = a.after {
                path.push_str(&format!("&after={after}"));
            }
            let mut resp = client.open(reqwest::Method::GET, &path, None).await?;
            let mut buf = String::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| Failure(EXIT_FAILURE, format!("the watch broke: {e}")))?
            {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let ev: String = buf.drain(..end + 2).collect();
                    let field = |name: &str| {
                        ev.lines()
                            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
                    };
                    let (Some(op), Some(data)) = (field("event:"), field("data:")) else {
                        continue;
                    };
                    let rev = field("id:").unwrap_or_default();
                    let v: Value = serde_json::from_str(&data).unwrap_or(Value::Null);
                    if op == "error" {
                        // The server ended the watch (e.g. it fell behind the
                        // change log's compaction: list again and watch anew).
                        let msg = v["detail"].as_str().unwrap_or(&data).to_string();
                        return Err(Failure(EXIT_FAILURE, format!("the watch ended: {msg}")));
                    }
                    if a.json {
                        println!("{}", json!({"revision": rev, "op": op, "object": v}));
                    } else {
                        let state = v["status"]["phase"]
                            .as_str()
                            .or(v["reason"].as_str())
                            .unwrap_or("");
                        println!("{rev:>8}  {op:<8} {}/{}  {state}", a.kind, cell(&v["name"]));
                    }
                    use std::io::Write;
                    let _ = std::io::stdout().flush();
                }
            }
            Ok(0)
        })
    })())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_gpus_show_free_and_allocated_where_the_server_says() {
        let n = json!({"name": "g", "gpus": [{}, {}, {}, {}],
                       "gpu_use": {"total": 4, "free": 1, "allocated_milli": 2500}});
        assert_eq!(gpu_use(&n), "4 (1 free, 2.5 allocated)");
        assert_eq!(gpu_use(&json!({"gpus": [{}, {}]})), "2");
        assert_eq!(gpu_use(&json!({"name": "cpu-only"})), "0");
        let t = node_table(&json!({"items": [n]}));
        assert!(t.contains("4 (1 free, 2.5 allocated)"), "{t}");
    }
}
