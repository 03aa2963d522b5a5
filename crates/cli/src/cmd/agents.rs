//! The agent platform from the command line: `tessera runtime …` (deploy
//! agents), `tessera agent invoke …`, `tessera session …` (list, inspect,
//! kill, trace, memory), `tessera usage`, `tessera events …`. Thin clients of
//! the API (`TESSERA_URL`, `TESSERA_API_KEY`); tables for people, `-o json`
//! for scripts. Also the `tessera up` flags of the agent platform.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tessera_agent::host::HostConfig;
use tessera_agent::runtimes::Quotas;

use super::client::{Failure, server_and_key};
use crate::output::{EXIT_BAD_INPUT, EXIT_FAILURE, fail, print_json, print_text};

/// `tessera up` flags of the agent platform.
#[derive(Debug, Clone, Args)]
pub struct AgentUpArgs {
    /// Most agent runtimes per tenant.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub agent_max_runtimes: u64,
    /// Most versions per agent runtime.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub agent_max_versions: u64,
    /// Warm sandboxes kept ready per runtime template.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub agent_pool_min: usize,
    /// Seconds between health checks (`GET /ping`) of each live agent.
    #[arg(long, value_name = "SECONDS", default_value_t = 2.0)]
    pub agent_ping_interval: f64,
}

impl AgentUpArgs {
    pub fn config(&self) -> tessera_server::agents::AgentsConfig {
        tessera_server::agents::AgentsConfig {
            host: HostConfig {
                init: crate::cmd::sandbox::init_program(),
                quotas: Quotas {
                    runtimes_per_tenant: self.agent_max_runtimes,
                    versions_per_runtime: self.agent_max_versions,
                },
                pool_min: self.agent_pool_min,
                ping_interval: Duration::from_secs_f64(self.agent_ping_interval.max(0.05)),
                ..HostConfig::default()
            },
        }
    }
}

#[derive(Debug, Args)]
pub struct Out {
    /// Print the reply as JSON instead of a table.
    #[arg(short = 'o', long = "output", value_parser = ["table", "json"], default_value = "table")]
    pub format: String,
}

impl Out {
    fn json(&self) -> bool {
        self.format == "json"
    }
}

#[derive(Debug, Subcommand)]
pub enum RuntimeCommand {
    /// Create a runtime (version 1) from a YAML or JSON spec file.
    Create {
        name: String,
        /// The spec: command, template, resources, env, idle_timeout_s, max_lifetime_s, session_budget.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[command(flatten)]
        out: Out,
    },
    /// Make a new immutable version from a spec file.
    Update {
        name: String,
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        #[command(flatten)]
        out: Out,
    },
    /// List runtimes.
    List {
        #[command(flatten)]
        out: Out,
    },
    /// Show a runtime: its latest spec and endpoints.
    Get {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// List a runtime's versions.
    Versions {
        name: String,
        #[command(flatten)]
        out: Out,
    },
    /// Pin endpoint ENDPOINT of a runtime to a version (DEFAULT follows the latest).
    Endpoint {
        name: String,
        endpoint: String,
        #[arg(long)]
        version: u64,
        #[command(flatten)]
        out: Out,
    },
    /// Delete a runtime with its versions and endpoints.
    Delete { name: String },
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Invoke a runtime in a session (created, or resumed when it exists).
    Invoke {
        runtime: String,
        /// The session id (a new one when absent; printed on stderr).
        #[arg(long)]
        session: Option<String>,
        /// The endpoint (default DEFAULT, the latest version).
        #[arg(long)]
        endpoint: Option<String>,
        /// The payload, JSON text.
        #[arg(long, conflicts_with = "file", default_value = "{}")]
        data: String,
        /// The payload from a file (`-` for stdin).
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// List sessions (from the state index).
    List {
        /// Only these states, comma-separated (starting,active,idle,ended,failed,killed).
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        runtime: Option<String>,
        #[command(flatten)]
        out: Out,
    },
    /// Inspect a session: state, sandbox, usage, the tail of its agent's output.
    Get {
        id: String,
        #[command(flatten)]
        out: Out,
    },
    /// Kill a session: its sandbox is destroyed, it takes no more invocations.
    Kill {
        id: String,
        #[arg(long)]
        reason: Option<String>,
    },
    /// The session's steps as a tree with durations and cost.
    Trace {
        id: String,
        #[command(flatten)]
        out: Out,
    },
    /// Read the session's memory (all keys, or one), or set a key with --set.
    Memory {
        id: String,
        key: Option<String>,
        /// JSON value to store under KEY.
        #[arg(long, requires = "key")]
        set: Option<String>,
    },
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[arg(long)]
    pub session: Option<String>,
    #[arg(long)]
    pub runtime: Option<String>,
    /// Also list the usage records.
    #[arg(long)]
    pub records: bool,
    #[command(flatten)]
    pub out: Out,
}

#[derive(Debug, Subcommand)]
pub enum EventsCommand {
    /// Publish one event (JSON) to a topic.
    Publish { topic: String, data: String },
    /// Read events after an offset; --follow keeps waiting for new ones.
    Read {
        topic: String,
        #[arg(long, default_value_t = 0)]
        after: u64,
        /// Start after this consumer's committed offset (and commit as you go with --follow).
        #[arg(long)]
        consumer: Option<String>,
        #[arg(long)]
        follow: bool,
    },
    /// Commit a consumer's offset.
    Commit {
        topic: String,
        consumer: String,
        offset: u64,
    },
}

struct Client {
    url: String,
    key: String,
    http: reqwest::Client,
}

impl Client {
    fn from_env() -> Result<Client, Failure> {
        let (url, key) = server_and_key()?;
        Ok(Client {
            url,
            key,
            http: reqwest::Client::new(),
        })
    }

    async fn call(
        &self,
        m: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<(Value, reqwest::header::HeaderMap), Failure> {
        let mut req = self
            .http
            .request(m, format!("{}{path}", self.url))
            .bearer_auth(&self.key);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.map_err(|e| {
            Failure(
                EXIT_FAILURE,
                format!("cannot reach {} ({e}): is `tessera up` running there? Set TESSERA_URL otherwise", self.url),
            )
        })?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let text = resp
            .text()
            .await
            .map_err(|e| Failure(EXIT_FAILURE, format!("reading the reply: {e}")))?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if status.is_success() {
            return Ok((v, headers));
        }
        let mut msg = v["detail"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| v.to_string());
        if let Some(f) = v["field"].as_str() {
            if !msg.starts_with(f) {
                msg = format!("field {f}: {msg}");
            }
        }
        let code = if status.as_u16() == 400 || status.as_u16() == 404 {
            EXIT_BAD_INPUT
        } else {
            EXIT_FAILURE
        };
        Err(Failure(
            code,
            format!(
                "{msg} ({} {})",
                status.as_u16(),
                v["code"].as_str().unwrap_or("")
            ),
        ))
    }

    async fn get(&self, path: &str) -> Result<Value, Failure> {
        Ok(self.call(reqwest::Method::GET, path, None).await?.0)
    }
}

fn read_doc(file: &PathBuf) -> Result<Value, Failure> {
    let text = if file.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin())
            .map_err(|e| Failure(EXIT_BAD_INPUT, format!("stdin: {e}")))?
    } else {
        std::fs::read_to_string(file)
            .map_err(|e| Failure(EXIT_BAD_INPUT, format!("{}: {e}", file.display())))?
    };
    serde_norway::from_str(&text).map_err(|e| {
        Failure(
            EXIT_BAD_INPUT,
            format!("{}: not YAML or JSON: {e}", file.display()),
        )
    })
}

fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn table(headers: &[&str], rows: Vec<Vec<String>>) -> String {
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

fn show(v: &Value, out: &Out, cols: &[(&str, &str)]) -> i32 {
    if out.json() {
        return print_json(v);
    }
    let list: Vec<Value> = match v.get("items").and_then(Value::as_array) {
        Some(a) => a.clone(),
        None => vec![v.clone()],
    };
    let rows = list
        .iter()
        .map(|x| {
            cols.iter()
                .map(|(_, ptr)| cell(x.pointer(ptr).unwrap_or(&Value::Null)))
                .collect()
        })
        .collect();
    print_text(&table(
        &cols.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
        rows,
    ))
}

fn run_async(f: impl std::future::Future<Output = Result<i32, Failure>>) -> i32 {
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(EXIT_FAILURE, format!("cannot start the runtime: {e}")),
    };
    match rt.block_on(f) {
        Ok(c) => c,
        Err(Failure(code, msg)) => fail(code, msg),
    }
}

const RT_COLS: &[(&str, &str)] = &[
    ("NAME", "/name"),
    ("LATEST", "/latest_version"),
    ("UPDATED_MS", "/updated_at_ms"),
];
const VER_COLS: &[(&str, &str)] = &[
    ("RUNTIME", "/runtime"),
    ("VERSION", "/version"),
    ("COMMAND", "/spec/command"),
    ("CREATED_MS", "/created_at_ms"),
];
const SESSION_COLS: &[(&str, &str)] = &[
    ("ID", "/id"),
    ("RUNTIME", "/runtime"),
    ("VERSION", "/version"),
    ("STATE", "/state"),
    ("SANDBOX", "/sandbox"),
    ("INVOCATIONS", "/invocations"),
    ("RESTARTS", "/restarts"),
    ("REASON", "/reason"),
];

pub fn runtime(c: RuntimeCommand) -> i32 {
    run_async(async move {
        let cl = Client::from_env()?;
        use reqwest::Method as M;
        Ok(match c {
            RuntimeCommand::Create { name, file, out } => {
                let mut spec = read_doc(&file)?;
                if let Some(m) = spec.as_object_mut() {
                    m.insert("name".into(), json!(name));
                } else {
                    return Err(Failure(
                        EXIT_BAD_INPUT,
                        format!("{}: the spec must be a mapping", file.display()),
                    ));
                }
                let (v, _) = cl.call(M::POST, "/v1/runtimes", Some(spec)).await?;
                show(&v, &out, VER_COLS)
            }
            RuntimeCommand::Update { name, file, out } => {
                let spec = read_doc(&file)?;
                let (v, _) = cl
                    .call(M::PUT, &format!("/v1/runtimes/{name}"), Some(spec))
                    .await?;
                show(&v, &out, VER_COLS)
            }
            RuntimeCommand::List { out } => show(&cl.get("/v1/runtimes").await?, &out, RT_COLS),
            RuntimeCommand::Get { name, out } => {
                let v = cl.get(&format!("/v1/runtimes/{name}")).await?;
                if out.json() {
                    print_json(&v)
                } else {
                    let mut s = format!(
                        "runtime {name}  latest version {}\ncommand {}\n\nendpoints:\n",
                        cell(&v["latest_version"]),
                        cell(&v["spec"]["command"])
                    );
                    for e in v["endpoints"].as_array().cloned().unwrap_or_default() {
                        s.push_str(&format!(
                            "  {:<12} -> version {}\n",
                            cell(&e["name"]),
                            cell(&e["version"])
                        ));
                    }
                    print_text(&s)
                }
            }
            RuntimeCommand::Versions { name, out } => show(
                &cl.get(&format!("/v1/runtimes/{name}/versions")).await?,
                &out,
                VER_COLS,
            ),
            RuntimeCommand::Endpoint {
                name,
                endpoint,
                version,
                out,
            } => {
                let (v, _) = cl
                    .call(
                        M::PUT,
                        &format!("/v1/runtimes/{name}/endpoints/{endpoint}"),
                        Some(json!({"version": version})),
                    )
                    .await?;
                show(
                    &v,
                    &out,
                    &[
                        ("RUNTIME", "/runtime"),
                        ("ENDPOINT", "/name"),
                        ("VERSION", "/version"),
                    ],
                )
            }
            RuntimeCommand::Delete { name } => {
                cl.call(M::DELETE, &format!("/v1/runtimes/{name}"), None)
                    .await?;
                eprintln!("deleted runtime {name}");
                0
            }
        })
    })
}

pub fn agent(c: AgentCommand) -> i32 {
    run_async(async move {
        let cl = Client::from_env()?;
        match c {
            AgentCommand::Invoke {
                runtime,
                session,
                endpoint,
                data,
                file,
            } => {
                let payload: Value = match &file {
                    Some(f) => read_doc(f)?,
                    None => serde_json::from_str(&data)
                        .map_err(|e| Failure(EXIT_BAD_INPUT, format!("--data is not JSON: {e}")))?,
                };
                let mut path = format!("/v1/runtimes/{runtime}/invocations?");
                if let Some(s) = &session {
                    path.push_str(&format!("session_id={s}&"));
                }
                if let Some(e) = &endpoint {
                    path.push_str(&format!("endpoint={e}"));
                }
                let (v, h) = cl.call(reqwest::Method::POST, &path, Some(payload)).await?;
                if let Some(s) = h.get("x-tessera-session-id").and_then(|v| v.to_str().ok()) {
                    eprintln!("session {s}");
                }
                Ok(print_json(&v))
            }
        }
    })
}

pub fn session(c: SessionCommand) -> i32 {
    run_async(async move {
        let cl = Client::from_env()?;
        Ok(match c {
            SessionCommand::List {
                state,
                runtime,
                out,
            } => {
                let mut q = Vec::new();
                if let Some(s) = state {
                    q.push(format!("state={s}"));
                }
                if let Some(r) = runtime {
                    q.push(format!("runtime={r}"));
                }
                show(
                    &cl.get(&format!("/v1/sessions?{}", q.join("&"))).await?,
                    &out,
                    SESSION_COLS,
                )
            }
            SessionCommand::Get { id, out } => {
                let v = cl.get(&format!("/v1/sessions/{id}")).await?;
                if out.json() {
                    print_json(&v)
                } else {
                    let mut s = table(
                        &SESSION_COLS.iter().map(|(h, _)| *h).collect::<Vec<_>>(),
                        vec![
                            SESSION_COLS
                                .iter()
                                .map(|(_, p)| cell(v.pointer(p).unwrap_or(&Value::Null)))
                                .collect(),
                        ],
                    );
                    s.push_str(&format!(
                        "cost {}  usage {}\n",
                        cell(&v["usage"]["cost"]),
                        cell(&v["usage"]["quantities"])
                    ));
                    if let Some(t) = v["live"]["output_tail"].as_str() {
                        s.push_str(&format!("agent output (tail):\n{t}\n"));
                    }
                    print_text(&s)
                }
            }
            SessionCommand::Kill { id, reason } => {
                let body = reason.map(|r| json!({"reason": r}));
                let (v, _) = cl
                    .call(
                        reqwest::Method::POST,
                        &format!("/v1/sessions/{id}/kill"),
                        body,
                    )
                    .await?;
                eprintln!(
                    "session {id}: {} ({})",
                    cell(&v["state"]),
                    cell(&v["reason"])
                );
                0
            }
            SessionCommand::Trace { id, out } => {
                let v = cl.get(&format!("/v1/sessions/{id}/trace")).await?;
                if out.json() {
                    print_json(&v)
                } else {
                    print_text(v["text"].as_str().unwrap_or_default())
                }
            }
            SessionCommand::Memory { id, key, set } => match (key, set) {
                (Some(k), Some(val)) => {
                    let value: Value = serde_json::from_str(&val)
                        .map_err(|e| Failure(EXIT_BAD_INPUT, format!("--set is not JSON: {e}")))?;
                    let (v, _) = cl
                        .call(
                            reqwest::Method::PUT,
                            &format!("/v1/sessions/{id}/memory/{k}"),
                            Some(json!({"value": value})),
                        )
                        .await?;
                    print_json(&v)
                }
                (Some(k), None) => {
                    print_json(&cl.get(&format!("/v1/sessions/{id}/memory/{k}")).await?)
                }
                (None, _) => print_json(&cl.get(&format!("/v1/sessions/{id}/memory")).await?),
            },
        })
    })
}

pub fn usage(a: UsageArgs) -> i32 {
    run_async(async move {
        let cl = Client::from_env()?;
        let mut q = Vec::new();
        if let Some(s) = &a.session {
            q.push(format!("session={s}"));
        }
        if let Some(r) = &a.runtime {
            q.push(format!("runtime={r}"));
        }
        if a.records {
            q.push("records=true".into());
        }
        let v = cl.get(&format!("/v1/usage?{}", q.join("&"))).await?;
        if a.out.json() {
            return Ok(print_json(&v));
        }
        let cur = cell(&v["currency"]);
        let mut rows = Vec::new();
        for (scope, key) in [
            ("tenant", "tenant_totals"),
            ("session", "session_totals"),
            ("runtime", "runtime_totals"),
        ] {
            let Some(t) = v.get(key) else { continue };
            let name = match scope {
                "tenant" => cell(&v["tenant"]),
                s => cell(&v[s]),
            };
            let q = t["quantities"].as_object().cloned().unwrap_or_default();
            for (kind, qty) in q {
                rows.push(vec![
                    scope.to_string(),
                    name.clone(),
                    kind,
                    cell(&qty),
                    String::new(),
                ]);
            }
            rows.push(vec![
                scope.to_string(),
                name,
                "total".into(),
                format!("{} records", cell(&t["records"])),
                format!("{:.6} {cur}", t["cost"].as_f64().unwrap_or(0.0)),
            ]);
        }
        Ok(print_text(&table(
            &["SCOPE", "NAME", "KIND", "QUANTITY", "COST"],
            rows,
        )))
    })
}

pub fn events(c: EventsCommand) -> i32 {
    run_async(async move {
        let cl = Client::from_env()?;
        use reqwest::Method as M;
        Ok(match c {
            EventsCommand::Publish { topic, data } => {
                let payload: Value = serde_json::from_str(&data)
                    .map_err(|e| Failure(EXIT_BAD_INPUT, format!("DATA is not JSON: {e}")))?;
                let (v, _) = cl
                    .call(
                        M::POST,
                        &format!("/v1/topics/{topic}/events"),
                        Some(payload),
                    )
                    .await?;
                print_text(&format!("{}\n", cell(&v["offset"])))
            }
            EventsCommand::Read {
                topic,
                after,
                consumer,
                follow,
            } => {
                let mut after = after;
                if let (Some(cons), 0) = (&consumer, after) {
                    after = cl
                        .get(&format!("/v1/topics/{topic}/offsets/{cons}"))
                        .await?["offset"]
                        .as_u64()
                        .unwrap_or(0);
                }
                loop {
                    let wait = if follow { 15_000 } else { 0 };
                    let v = cl
                        .get(&format!(
                            "/v1/topics/{topic}/events?after={after}&wait_ms={wait}"
                        ))
                        .await?;
                    let items = v["items"].as_array().cloned().unwrap_or_default();
                    for e in &items {
                        print_text(&format!(
                            "{}\n",
                            serde_json::to_string(e).unwrap_or_default()
                        ));
                        after = e["offset"].as_u64().unwrap_or(after);
                    }
                    if let (Some(cons), false) = (&consumer, items.is_empty()) {
                        cl.call(
                            M::PUT,
                            &format!("/v1/topics/{topic}/offsets/{cons}"),
                            Some(json!({"offset": after})),
                        )
                        .await?;
                    }
                    if !follow {
                        break;
                    }
                }
                0
            }
            EventsCommand::Commit {
                topic,
                consumer,
                offset,
            } => {
                let (v, _) = cl
                    .call(
                        M::PUT,
                        &format!("/v1/topics/{topic}/offsets/{consumer}"),
                        Some(json!({"offset": offset})),
                    )
                    .await?;
                print_text(&format!("{}\n", cell(&v["offset"])))
            }
        })
    })
}
