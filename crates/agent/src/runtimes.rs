//! Agent runtimes: a command plus a sandbox template and resources. Every
//! update makes a new immutable version; named endpoints pin a version, and
//! `DEFAULT` always follows the latest. Quotas bound runtimes per tenant and
//! versions per runtime.
//!
//! Layout (tenant-scoped store kinds):
//! - `runtime`, name = runtime: `{"name", "latest_version", "created_at_ms", "updated_at_ms"}`.
//! - `runtime_version`, name = `<runtime>/<version, 8 digits>`: [`RuntimeVersion`].
//! - `endpoint`, name = `<runtime>/<endpoint>`: `{"runtime", "name", "version"}`.
//! - `runtime_count`, name = `tenant`: `{"runtimes": N}` (the quota counter,
//!   written in the same commit as a create or delete).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_store::{Key, Op, Store, StoreError};

use crate::error::{AgentError, check_token};

pub const KIND_RUNTIME: &str = "runtime";
pub const KIND_VERSION: &str = "runtime_version";
pub const KIND_ENDPOINT: &str = "endpoint";
pub const KIND_COUNT: &str = "runtime_count";
/// The endpoint that always follows the latest version.
pub const DEFAULT_ENDPOINT: &str = "DEFAULT";

/// Limits per tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub runtimes_per_tenant: u64,
    pub versions_per_runtime: u64,
}

impl Default for Quotas {
    fn default() -> Self {
        Quotas {
            runtimes_per_tenant: 1000,
            versions_per_runtime: 1000,
        }
    }
}

/// Resources of a runtime's sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RuntimeResources {
    /// Thousandths of a CPU.
    pub cpu_millis: u32,
    pub memory_mb: u64,
    pub pids: u32,
    pub disk_mb: u64,
}

impl Default for RuntimeResources {
    fn default() -> Self {
        RuntimeResources {
            cpu_millis: 1000,
            memory_mb: 512,
            pids: 256,
            disk_mb: 256,
        }
    }
}

/// What a runtime runs: the body of `POST /v1/runtimes` and `PUT /v1/runtimes/{name}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSpec {
    /// The agent's server: argv, run inside the sandbox; it must serve the
    /// agent contract on the unix socket `$TESSERA_AGENT_SOCKET`.
    pub command: Vec<String>,
    /// `host` (the host's `/usr` read-only) or a registered template: `NAME` or
    /// `NAME@sha256:<hex>` (`GET /v1/templates`). Never a host path.
    #[serde(default = "default_template")]
    pub template: String,
    #[serde(default)]
    pub resources: RuntimeResources,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Working directory inside the sandbox.
    #[serde(default)]
    pub cwd: Option<String>,
    /// Release the sandbox after this long without an invocation (AgentCore: 15 min).
    #[serde(default = "default_idle")]
    pub idle_timeout_s: u64,
    /// End the session this long after it started (AgentCore: 8 h).
    #[serde(default = "default_lifetime")]
    pub max_lifetime_s: u64,
    /// Default budget of each session, in the price table's currency.
    #[serde(default)]
    pub session_budget: Option<f64>,
    #[serde(default)]
    pub description: String,
}

fn default_template() -> String {
    "host".into()
}
fn default_idle() -> u64 {
    900
}
fn default_lifetime() -> u64 {
    8 * 3600
}

impl RuntimeSpec {
    /// Checks every field; the error names the field path.
    pub fn validate(&self) -> Result<(), AgentError> {
        if self.command.is_empty() || self.command[0].is_empty() {
            return Err(AgentError::invalid(
                "command",
                "must name a program: e.g. [\"python3\", \"/app/agent.py\"]",
            ));
        }
        for (i, a) in self.command.iter().enumerate() {
            if a.contains('\0') || a.len() > 65_536 {
                return Err(AgentError::invalid(
                    format!("command[{i}]"),
                    "must be at most 65536 bytes without NUL",
                ));
            }
        }
        if self.template != tessera_sandbox::registry::HOST_TEMPLATE
            && let Err(e) = tessera_sandbox::registry::parse_reference(&self.template)
        {
            return Err(AgentError::invalid("template", e.to_string()));
        }
        let r = &self.resources;
        if !(10..=64_000).contains(&r.cpu_millis) {
            return Err(AgentError::invalid(
                "resources.cpu_millis",
                format!("{}: use 10 to 64000", r.cpu_millis),
            ));
        }
        if !(16..=1 << 20).contains(&r.memory_mb) {
            return Err(AgentError::invalid(
                "resources.memory_mb",
                format!("{}: use 16 to 1048576", r.memory_mb),
            ));
        }
        if !(8..=65_536).contains(&r.pids) {
            return Err(AgentError::invalid(
                "resources.pids",
                format!("{}: use 8 to 65536", r.pids),
            ));
        }
        if !(1..=1 << 20).contains(&r.disk_mb) {
            return Err(AgentError::invalid(
                "resources.disk_mb",
                format!("{}: use 1 to 1048576", r.disk_mb),
            ));
        }
        for k in self.env.keys() {
            let ok = !k.is_empty()
                && !k.starts_with("TESSERA_")
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !k.as_bytes()[0].is_ascii_digit();
            if !ok {
                return Err(AgentError::invalid(
                    format!("env.{k}"),
                    "not a valid variable name (letters, digits, '_'; TESSERA_ is reserved)",
                ));
            }
        }
        if self.idle_timeout_s == 0 || self.idle_timeout_s > 7 * 86_400 {
            return Err(AgentError::invalid(
                "idle_timeout_s",
                format!("{}: use 1 to 604800", self.idle_timeout_s),
            ));
        }
        if self.max_lifetime_s == 0 || self.max_lifetime_s > 30 * 86_400 {
            return Err(AgentError::invalid(
                "max_lifetime_s",
                format!("{}: use 1 to 2592000", self.max_lifetime_s),
            ));
        }
        if let Some(b) = self.session_budget {
            if !b.is_finite() || b < 0.0 {
                return Err(AgentError::invalid(
                    "session_budget",
                    format!("{b}: use a number >= 0"),
                ));
            }
        }
        Ok(())
    }
}

/// One immutable version of a runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuntimeVersion {
    pub runtime: String,
    pub version: u64,
    pub spec: RuntimeSpec,
    pub created_at_ms: u64,
}

fn version_key(tenant: &str, runtime: &str, v: u64) -> Key {
    Key::new(KIND_VERSION, tenant, format!("{runtime}/{v:08}"))
}

fn to_json<T: Serialize>(v: &T) -> Result<Value, AgentError> {
    serde_json::to_value(v).map_err(|e| AgentError::Store(StoreError::Backend(e.to_string())))
}

fn from_json<T: serde::de::DeserializeOwned>(what: &str, v: Value) -> Result<T, AgentError> {
    serde_json::from_value(v)
        .map_err(|e| AgentError::Store(StoreError::Backend(format!("{what}: {e}"))))
}

/// Creates runtime `name` with version 1. Fails if it exists or the tenant is
/// at its quota.
pub async fn create<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    spec: RuntimeSpec,
    quotas: Quotas,
    now_ms: u64,
) -> Result<RuntimeVersion, AgentError> {
    check_token("name", name, 63)?;
    spec.validate()?;
    let rkey = Key::new(KIND_RUNTIME, tenant, name);
    let ckey = Key::new(KIND_COUNT, tenant, "tenant");
    for _ in 0..100 {
        if store.get(&rkey).await?.is_some() {
            return Err(AgentError::AlreadyExists(format!(
                "runtime {name:?} (update it with PUT /v1/runtimes/{name} to make a new version)"
            )));
        }
        let count = store.get(&ckey).await?;
        let n = count
            .as_ref()
            .and_then(|o| o.body.get("runtimes").and_then(Value::as_u64))
            .unwrap_or(0);
        if n >= quotas.runtimes_per_tenant {
            return Err(AgentError::Quota(format!(
                "tenant {tenant:?} has {n} runtimes, its limit is {}: delete one or raise --agent-max-runtimes",
                quotas.runtimes_per_tenant
            )));
        }
        let v = RuntimeVersion {
            runtime: name.into(),
            version: 1,
            spec: spec.clone(),
            created_at_ms: now_ms,
        };
        let count_op = match count {
            Some(o) => Op::Update {
                key: ckey.clone(),
                expected: Some(o.version),
                body: json!({"runtimes": n + 1}),
            },
            None => Op::Create {
                key: ckey.clone(),
                body: json!({"runtimes": 1}),
            },
        };
        let ops = vec![
            Op::Create {
                key: rkey.clone(),
                body: json!({"name": name, "latest_version": 1, "created_at_ms": now_ms, "updated_at_ms": now_ms}),
            },
            Op::Create {
                key: version_key(tenant, name, 1),
                body: to_json(&v)?,
            },
            count_op,
        ];
        match store.commit(ops).await {
            Ok(_) => return Ok(v),
            Err(StoreError::Conflict { .. }) => continue,
            Err(StoreError::AlreadyExists(k)) if k.kind == KIND_COUNT => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "runtime {name:?}: too much contention; retry"
    )))
}

/// Makes a new version of runtime `name` (the next number), unless the
/// runtime is at its version quota.
pub async fn update<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    spec: RuntimeSpec,
    quotas: Quotas,
    now_ms: u64,
) -> Result<RuntimeVersion, AgentError> {
    check_token("name", name, 63)?;
    spec.validate()?;
    let rkey = Key::new(KIND_RUNTIME, tenant, name);
    for _ in 0..100 {
        let Some(o) = store.get(&rkey).await? else {
            return Err(AgentError::NotFound(format!("runtime {name:?}")));
        };
        let latest = o
            .body
            .get("latest_version")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        if latest >= quotas.versions_per_runtime {
            return Err(AgentError::Quota(format!(
                "runtime {name:?} has {latest} versions, its limit is {}: create a new runtime or raise --agent-max-versions",
                quotas.versions_per_runtime
            )));
        }
        let v = RuntimeVersion {
            runtime: name.into(),
            version: latest + 1,
            spec: spec.clone(),
            created_at_ms: now_ms,
        };
        let mut body = o.body.clone();
        body["latest_version"] = json!(latest + 1);
        body["updated_at_ms"] = json!(now_ms);
        let ops = vec![
            Op::Update {
                key: rkey.clone(),
                expected: Some(o.version),
                body,
            },
            Op::Create {
                key: version_key(tenant, name, latest + 1),
                body: to_json(&v)?,
            },
        ];
        match store.commit(ops).await {
            Ok(_) => return Ok(v),
            Err(StoreError::Conflict { .. } | StoreError::AlreadyExists(_)) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "runtime {name:?}: too much contention; retry"
    )))
}

/// The runtime object with its latest version's spec and its endpoints.
pub async fn get<S: Store>(store: &S, tenant: &str, name: &str) -> Result<Value, AgentError> {
    let Some(o) = store.get(&Key::new(KIND_RUNTIME, tenant, name)).await? else {
        return Err(AgentError::NotFound(format!("runtime {name:?}")));
    };
    let latest = o
        .body
        .get("latest_version")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let v = get_version(store, tenant, name, latest).await?;
    let mut out = o.body.clone();
    out["spec"] = to_json(&v.spec)?;
    out["endpoints"] = Value::Array(list_endpoints(store, tenant, name).await?);
    Ok(out)
}

/// Every runtime of the tenant (at most the quota, so a full list is bounded).
pub async fn list<S: Store>(store: &S, tenant: &str) -> Result<Vec<Value>, AgentError> {
    Ok(store
        .list(KIND_RUNTIME, Some(tenant))
        .await?
        .objects
        .into_iter()
        .map(|o| o.body)
        .collect())
}

pub async fn get_version<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    version: u64,
) -> Result<RuntimeVersion, AgentError> {
    match store.get(&version_key(tenant, name, version)).await? {
        Some(o) => from_json("runtime version", o.body),
        None => Err(AgentError::NotFound(format!(
            "version {version} of runtime {name:?}"
        ))),
    }
}

/// Every version, oldest first.
pub async fn versions<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
) -> Result<Vec<RuntimeVersion>, AgentError> {
    let Some(o) = store.get(&Key::new(KIND_RUNTIME, tenant, name)).await? else {
        return Err(AgentError::NotFound(format!("runtime {name:?}")));
    };
    let latest = o
        .body
        .get("latest_version")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let mut out = Vec::new();
    for v in 1..=latest {
        out.push(get_version(store, tenant, name, v).await?);
    }
    Ok(out)
}

/// Points endpoint `ep` of runtime `name` at `version` (not `DEFAULT`, which
/// always follows the latest).
pub async fn put_endpoint<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    ep: &str,
    version: u64,
) -> Result<Value, AgentError> {
    check_token("endpoint", ep, 63)?;
    if ep == DEFAULT_ENDPOINT {
        return Err(AgentError::invalid(
            "endpoint",
            "DEFAULT always follows the latest version; name another endpoint to pin one",
        ));
    }
    get_version(store, tenant, name, version).await?;
    let key = Key::new(KIND_ENDPOINT, tenant, format!("{name}/{ep}"));
    let body = json!({"runtime": name, "name": ep, "version": version});
    match store.get(&key).await? {
        Some(o) => store.update(key, Some(o.version), body.clone()).await?,
        None => store.create(key, body.clone()).await?,
    };
    Ok(body)
}

pub async fn delete_endpoint<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    ep: &str,
) -> Result<(), AgentError> {
    store
        .delete(
            Key::new(KIND_ENDPOINT, tenant, format!("{name}/{ep}")),
            None,
        )
        .await?;
    Ok(())
}

/// The runtime's endpoints, `DEFAULT` first.
pub async fn list_endpoints<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
) -> Result<Vec<Value>, AgentError> {
    let Some(o) = store.get(&Key::new(KIND_RUNTIME, tenant, name)).await? else {
        return Err(AgentError::NotFound(format!("runtime {name:?}")));
    };
    let latest = o
        .body
        .get("latest_version")
        .and_then(Value::as_u64)
        .unwrap_or(1);
    let mut out = vec![
        json!({"runtime": name, "name": DEFAULT_ENDPOINT, "version": latest, "follows_latest": true}),
    ];
    let prefix = format!("{name}/");
    out.extend(
        store
            .list(KIND_ENDPOINT, Some(tenant))
            .await?
            .objects
            .into_iter()
            .filter(|o| o.name.starts_with(&prefix))
            .map(|o| o.body),
    );
    Ok(out)
}

/// The version an invocation through endpoint `ep` (default `DEFAULT`) runs.
pub async fn resolve<S: Store>(
    store: &S,
    tenant: &str,
    name: &str,
    ep: Option<&str>,
) -> Result<RuntimeVersion, AgentError> {
    let ep = ep.unwrap_or(DEFAULT_ENDPOINT);
    let version = if ep == DEFAULT_ENDPOINT {
        let Some(o) = store.get(&Key::new(KIND_RUNTIME, tenant, name)).await? else {
            return Err(AgentError::NotFound(format!("runtime {name:?}")));
        };
        o.body
            .get("latest_version")
            .and_then(Value::as_u64)
            .unwrap_or(1)
    } else {
        match store
            .get(&Key::new(KIND_ENDPOINT, tenant, format!("{name}/{ep}")))
            .await?
        {
            Some(o) => o.body.get("version").and_then(Value::as_u64).unwrap_or(1),
            None => {
                return Err(AgentError::NotFound(format!(
                    "endpoint {ep:?} of runtime {name:?}"
                )));
            }
        }
    };
    get_version(store, tenant, name, version).await
}

/// Deletes a runtime, its versions and endpoints (sessions keep running on
/// the version they started with until they end).
pub async fn delete<S: Store>(store: &S, tenant: &str, name: &str) -> Result<(), AgentError> {
    let ckey = Key::new(KIND_COUNT, tenant, "tenant");
    for _ in 0..100 {
        let Some(o) = store.get(&Key::new(KIND_RUNTIME, tenant, name)).await? else {
            return Err(AgentError::NotFound(format!("runtime {name:?}")));
        };
        let latest = o
            .body
            .get("latest_version")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let mut ops = vec![Op::Delete {
            key: o.key(),
            expected: Some(o.version),
        }];
        for v in 1..=latest {
            ops.push(Op::Delete {
                key: version_key(tenant, name, v),
                expected: None,
            });
        }
        let prefix = format!("{name}/");
        for e in store.list(KIND_ENDPOINT, Some(tenant)).await?.objects {
            if e.name.starts_with(&prefix) {
                ops.push(Op::Delete {
                    key: e.key(),
                    expected: None,
                });
            }
        }
        if let Some(c) = store.get(&ckey).await? {
            let n = c.body.get("runtimes").and_then(Value::as_u64).unwrap_or(1);
            ops.push(Op::Update {
                key: ckey.clone(),
                expected: Some(c.version),
                body: json!({"runtimes": n.saturating_sub(1)}),
            });
        }
        match store.commit(ops).await {
            Ok(_) => return Ok(()),
            Err(StoreError::Conflict { .. }) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(AgentError::Conflict(format!(
        "runtime {name:?}: too much contention; retry"
    )))
}
