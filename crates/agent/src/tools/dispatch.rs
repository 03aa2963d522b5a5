//! Sending one call to where a tool lives: an HTTP endpoint, a remote MCP server,
//! or the calling session's sandbox. Each send reports one of four outcomes, and
//! the difference between them is what the ledger is about: did the effect
//! happen (`Ok`, `Failed`), surely not (`NotSent`), or nobody knows (`Unknown`)?
//!
//! This is the one place of `tessera-agent` that speaks HTTP, as a client of the
//! tools; it serves nothing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::secrets::ToolSecrets;
use super::spec::{Builtin, CompiledTool, Target};

/// A request's headers from the tool's registration, secrets filled in.
type Headers = [(String, String)];

/// A remote MCP server as the proxy knows it: its URL and a digest of the
/// headers (credentials) it is called with.
type McpServer = (String, [u8; 32]);

/// How one send ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Sent {
    /// The tool answered with this result.
    Ok(Value),
    /// The tool answered that it failed (its effect did not happen, or it owns it).
    Failed(String),
    /// It may or may not have happened: a timeout, a connection lost after the
    /// request went out, a 5xx.
    Unknown(String),
    /// Surely not sent (no connection).
    NotSent(String),
}

/// What a send knows about its call.
#[derive(Debug, Clone)]
pub struct CallIds<'a> {
    pub tenant: &'a str,
    pub session_id: &'a str,
    pub tool_call_id: &'a str,
    pub idempotency_key: &'a str,
}

/// Access to the sandbox a session is bound to, for the built-in tools. The
/// agent platform's session manager implements it.
pub trait SandboxAccess: Send + Sync + 'static {
    /// The sandbox `session_id` of `tenant` is bound to now, if any.
    fn sandbox(&self, tenant: &str, session_id: &str) -> Option<Arc<tessera_sandbox::Sandbox>>;
}

/// A boxed future, for the one trait method that must be async.
pub type BoxFuture<'a, T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'a>>;

/// Mints the tokens of tools registered with `auth: exchange`. The server
/// implements it (its token exchange, `POST /v1/token`).
pub trait Delegation: Send + Sync + 'static {
    /// A short-lived token acting for the user who started `session_id` of
    /// `tenant`, with `tool` as its audience. The gateway has already checked
    /// that the call is granted.
    fn token<'a>(
        &'a self,
        tenant: &'a str,
        session_id: &'a str,
        tool: &'a str,
    ) -> BoxFuture<'a, Result<String, String>>;
}

/// The senders, with their connection state (HTTP connection pool, remote MCP
/// sessions).
pub(crate) struct Dispatcher {
    http: reqwest::Client,
    sandboxes: std::sync::RwLock<Option<Arc<dyn SandboxAccess>>>,
    delegation: std::sync::RwLock<Option<Arc<dyn Delegation>>>,
    /// (Remote MCP server URL, digest of the headers sent to it) -> its
    /// `Mcp-Session-Id` (when it uses sessions). The headers are part of the key:
    /// two tools (of two tenants, say) with other credentials on one server must
    /// not share a session that one of them opened.
    mcp_sessions: Mutex<HashMap<McpServer, Option<String>>>,
}

/// The MCP revision the proxy speaks to remote servers (widest support: the
/// newer one drops the handshake, which servers still accept).
const MCP_VERSION: &str = "2025-11-25";

impl Dispatcher {
    pub(crate) fn new(sandboxes: Option<Arc<dyn SandboxAccess>>) -> Self {
        let http = reqwest::Client::builder()
            .pool_max_idle_per_host(64)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::custom(same_origin_redirects))
            .build()
            .unwrap_or_default();
        Dispatcher {
            http,
            sandboxes: std::sync::RwLock::new(sandboxes),
            delegation: std::sync::RwLock::new(None),
            mcp_sessions: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn set_sandboxes(&self, s: Arc<dyn SandboxAccess>) {
        *self.sandboxes.write().unwrap() = Some(s);
    }

    pub(crate) fn set_delegation(&self, d: Arc<dyn Delegation>) {
        *self.delegation.write().unwrap() = Some(d);
    }

    /// The headers of one send: the registered ones with their secrets filled
    /// in, and for `auth: exchange` a fresh token; and what to scrub from the
    /// reply (the secrets and that token).
    async fn headers(
        &self,
        tool: &CompiledTool,
        secrets: &ToolSecrets,
        ids: &CallIds<'_>,
    ) -> Result<(Vec<(String, String)>, ToolSecrets), String> {
        let name = &tool.spec.name;
        let (headers, auth) = match &tool.spec.target {
            Target::Http { headers, auth, .. } | Target::Mcp { headers, auth, .. } => {
                (headers, auth)
            }
            Target::Builtin { .. } => return Ok((Vec::new(), secrets.clone())),
        };
        let mut out = secrets.headers(name, headers)?;
        let mut scrub = secrets.clone();
        if auth.is_some() {
            let d = self.delegation.read().unwrap().clone().ok_or_else(|| {
                format!("tool {name:?} needs an exchanged token, and this server mints none")
            })?;
            let bearer = format!(
                "Bearer {}",
                d.token(ids.tenant, ids.session_id, name).await?
            );
            scrub = scrub.with("Authorization", &bearer);
            out.push(("Authorization".into(), bearer));
        }
        Ok((out, scrub))
    }

    /// Sends one call with the tool's `secrets` on the request, and scrubs them
    /// from whatever comes back.
    pub(crate) async fn send(
        &self,
        tool: &CompiledTool,
        secrets: &ToolSecrets,
        ids: &CallIds<'_>,
        args: &Value,
    ) -> Sent {
        let timeout = tool.timeout();
        let (h, scrub) = match self.headers(tool, secrets, ids).await {
            Ok(x) => x,
            Err(m) => return secrets.scrub(Sent::NotSent(m)),
        };
        let sent = match &tool.spec.target {
            Target::Http { url, .. } => self.http_call(url, &h, ids, args, timeout).await,
            Target::Mcp {
                url, tool: remote, ..
            } => {
                let name = remote.as_deref().unwrap_or(&tool.spec.name);
                self.mcp_call(url, &h, name, ids, args, timeout).await
            }
            Target::Builtin { builtin } => self.builtin(*builtin, ids, args, timeout).await,
        };
        scrub.scrub(sent)
    }

    async fn http_call(
        &self,
        url: &str,
        headers: &Headers,
        ids: &CallIds<'_>,
        args: &Value,
        timeout: Duration,
    ) -> Sent {
        let mut req = self
            .http
            .post(url)
            .timeout(timeout)
            .header("Idempotency-Key", ids.idempotency_key)
            .header("Tessera-Session-Id", ids.session_id)
            .header("Tessera-Tool-Call-Id", ids.tool_call_id)
            .json(args);
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) => return transport_error(url, &e),
        };
        let status = resp.status();
        let body = match resp.bytes().await {
            Ok(b) => b,
            Err(e) => {
                return Sent::Unknown(format!(
                    "{url} answered {status} but the reply was cut: {e}"
                ));
            }
        };
        let text = || String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
        if status.is_success() {
            if body.is_empty() {
                return Sent::Ok(Value::Null);
            }
            match serde_json::from_slice(&body) {
                Ok(v) => Sent::Ok(v),
                Err(_) => Sent::Ok(json!({"text": String::from_utf8_lossy(&body)})),
            }
        } else if status.is_redirection() {
            Sent::Unknown(redirect_refused(url, status))
        } else if status.is_client_error() {
            Sent::Failed(format!("{url} answered {status}: {}", text()))
        } else {
            Sent::Unknown(format!("{url} answered {status}: {}", text()))
        }
    }

    async fn mcp_post(
        &self,
        url: &str,
        headers: &Headers,
        session: Option<&str>,
        body: &Value,
        timeout: Duration,
        extra: &[(&str, &str)],
    ) -> Result<(reqwest::StatusCode, Option<String>, Option<Value>), reqwest::Error> {
        let mut req = self
            .http
            .post(url)
            .timeout(timeout)
            .header("Accept", "application/json, text/event-stream")
            .header("MCP-Protocol-Version", MCP_VERSION)
            .json(body);
        if let Some(m) = body.get("method").and_then(Value::as_str) {
            req = req.header("Mcp-Method", m);
        }
        if let Some(s) = session {
            req = req.header("Mcp-Session-Id", s);
        }
        for (k, v) in extra {
            req = req.header(*k, *v);
        }
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.send().await?;
        let status = resp.status();
        let sid = resp
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let sse = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|c| c.starts_with("text/event-stream"));
        let bytes = resp.bytes().await?;
        let id = body.get("id");
        let msg = if sse {
            // The reply is the `data:` of the event whose message has our id.
            let text = String::from_utf8_lossy(&bytes);
            let mut found = None;
            for ev in text.split("\n\n") {
                let data: String = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(str::trim_start)
                    .collect::<Vec<_>>()
                    .join("\n");
                if let Ok(v) = serde_json::from_str::<Value>(&data) {
                    if id.is_some() && v.get("id") == id {
                        found = Some(v);
                        break;
                    }
                }
            }
            found
        } else {
            serde_json::from_slice(&bytes).ok()
        };
        Ok((status, sid, msg))
    }

    async fn mcp_session(
        &self,
        url: &str,
        headers: &Headers,
        timeout: Duration,
        fresh: bool,
    ) -> Result<Option<String>, Sent> {
        let key = (url.to_string(), headers_digest(headers));
        if !fresh {
            if let Some(s) = self.mcp_sessions.lock().unwrap().get(&key) {
                return Ok(s.clone());
            }
        }
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": MCP_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "tessera-tool-gateway", "version": env!("CARGO_PKG_VERSION")}
        }});
        let (status, sid, msg) = self
            .mcp_post(url, headers, None, &init, timeout, &[])
            .await
            .map_err(|e| Sent::NotSent(format!("MCP server {url}: initialize failed: {e}")))?;
        if !status.is_success() || msg.as_ref().is_none_or(|m| m.get("result").is_none()) {
            return Err(Sent::NotSent(format!(
                "MCP server {url}: initialize answered {status}: {}",
                msg.map(|m| m.to_string()).unwrap_or_default()
            )));
        }
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        let _ = self
            .mcp_post(url, headers, sid.as_deref(), &note, timeout, &[])
            .await;
        self.mcp_sessions.lock().unwrap().insert(key, sid.clone());
        Ok(sid)
    }

    async fn mcp_call(
        &self,
        url: &str,
        headers: &Headers,
        name: &str,
        ids: &CallIds<'_>,
        args: &Value,
        timeout: Duration,
    ) -> Sent {
        let mut fresh = false;
        loop {
            let sid = match self.mcp_session(url, headers, timeout, fresh).await {
                Ok(s) => s,
                Err(e) => return e,
            };
            let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": name,
                "arguments": args,
                "_meta": {
                    "tessera.dev/session_id": ids.session_id,
                    "tessera.dev/tool_call_id": ids.tool_call_id,
                    "tessera.dev/idempotency_key": ids.idempotency_key,
                }
            }});
            let extra = [("Mcp-Name", name), ("Idempotency-Key", ids.idempotency_key)];
            let (status, _, msg) = match self
                .mcp_post(url, headers, sid.as_deref(), &call, timeout, &extra)
                .await
            {
                Ok(r) => r,
                Err(e) => return transport_error(url, &e),
            };
            // A server that forgot our session answers 404 before doing anything.
            if status == reqwest::StatusCode::NOT_FOUND && sid.is_some() && !fresh {
                fresh = true;
                continue;
            }
            let Some(msg) = msg else {
                return if status.is_redirection() {
                    Sent::Unknown(redirect_refused(url, status))
                } else if status.is_client_error() {
                    Sent::Failed(format!("MCP server {url} answered {status}"))
                } else {
                    Sent::Unknown(format!(
                        "MCP server {url} answered {status} without a reply"
                    ))
                };
            };
            if let Some(err) = msg.get("error") {
                return Sent::Failed(format!("MCP server {url}: {err}"));
            }
            let result = msg.get("result").cloned().unwrap_or(Value::Null);
            if result.get("isError").and_then(Value::as_bool) == Some(true) {
                return Sent::Failed(format!(
                    "tool {name} on {url} failed: {}",
                    content_text(&result)
                ));
            }
            return Sent::Ok(match result.get("structuredContent") {
                Some(v) => v.clone(),
                None => json!({"content": result.get("content").cloned().unwrap_or(Value::Null)}),
            });
        }
    }

    async fn builtin(
        &self,
        b: Builtin,
        ids: &CallIds<'_>,
        args: &Value,
        timeout: Duration,
    ) -> Sent {
        let access = self.sandboxes.read().unwrap().clone();
        let Some(access) = access else {
            return Sent::NotSent("this server runs no sandboxes: built-in tools are off".into());
        };
        let Some(sb) = access.sandbox(ids.tenant, ids.session_id) else {
            return Sent::NotSent(format!(
                "session {:?} has no sandbox now: invoke the session first",
                ids.session_id
            ));
        };
        let args = args.clone();
        let task = tokio::task::spawn_blocking(move || run_builtin(&sb, b, &args, timeout));
        match task.await {
            Ok(s) => s,
            Err(e) => Sent::Unknown(format!("the built-in {b:?} stopped: {e}")),
        }
    }
}

/// Follows a redirect only within the tool's own origin (scheme, host and
/// port), at most 10: elsewhere the request would carry the tool's headers —
/// its credentials — to a server nobody registered.
fn same_origin_redirects(attempt: reqwest::redirect::Attempt<'_>) -> reqwest::redirect::Action {
    let first = attempt.previous().first();
    let same = first.is_some_and(|f| f.origin() == attempt.url().origin());
    if same && attempt.previous().len() <= 10 {
        attempt.follow()
    } else {
        attempt.stop()
    }
}

fn redirect_refused(url: &str, status: reqwest::StatusCode) -> String {
    format!(
        "{url} answered {status}, a redirect to another origin (or more than 10): not followed, since it would carry the tool's headers elsewhere; register the final URL"
    )
}

/// A digest of the headers a request carries (secrets included), to key state
/// by the identity it was made with.
fn headers_digest(headers: &Headers) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    for (k, v) in headers {
        h.update(k.as_bytes());
        h.update([0]);
        h.update(v.as_bytes());
        h.update([0]);
    }
    h.finalize().into()
}

fn content_text(result: &Value) -> String {
    result
        .get("content")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .unwrap_or_default()
}

fn transport_error(url: &str, e: &reqwest::Error) -> Sent {
    if e.is_connect() || e.is_builder() {
        // Nothing left this process: the effect surely did not happen.
        Sent::NotSent(format!("cannot connect to {url}: {e}"))
    } else if e.is_timeout() {
        Sent::Unknown(format!("{url} did not answer in time: {e}"))
    } else {
        Sent::Unknown(format!("{url}: the connection failed: {e}"))
    }
}

fn run_builtin(sb: &tessera_sandbox::Sandbox, b: Builtin, args: &Value, timeout: Duration) -> Sent {
    use base64_lite as b64;
    use tessera_sandbox::{Command, ExecRequest};
    let s = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
    match b {
        Builtin::Exec => {
            let command = match (s("command"), args.get("argv").and_then(Value::as_array)) {
                (Some(c), _) => Command::Shell(c),
                (None, Some(a)) => Command::Argv(
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect(),
                ),
                _ => return Sent::Failed("give \"command\" or \"argv\"".into()),
            };
            let t = args
                .get("timeout_ms")
                .and_then(Value::as_u64)
                .map(Duration::from_millis)
                .unwrap_or(timeout)
                .min(timeout);
            let mut req = ExecRequest::new(command).timeout(t);
            req.max_output = 1 << 20;
            if let Some(c) = s("cwd") {
                req = req.cwd(c);
            }
            if let Some(i) = s("stdin") {
                req = req.stdin(i.into_bytes());
            }
            match sb.exec(&req) {
                Ok(out) => Sent::Ok(json!({
                    "exit_code": out.status.code(),
                    "stdout": String::from_utf8_lossy(&out.stdout),
                    "stderr": String::from_utf8_lossy(&out.stderr),
                })),
                Err(e) => Sent::Unknown(format!("exec in sandbox {}: {e}", sb.id())),
            }
        }
        Builtin::ReadFile => {
            let path = s("path").unwrap_or_default();
            match sb.read_file(&path) {
                Ok(data) => match String::from_utf8(data) {
                    Ok(text) => Sent::Ok(json!({"content": text})),
                    Err(e) => Sent::Ok(json!({"content_base64": b64::encode(e.as_bytes())})),
                },
                Err(e) => Sent::Failed(format!("read {path}: {e}")),
            }
        }
        Builtin::WriteFile => {
            let path = s("path").unwrap_or_default();
            let content = s("content").unwrap_or_default();
            match sb.write_file(&path, content.as_bytes()) {
                Ok(()) => Sent::Ok(json!({"written": content.len()})),
                Err(e) => Sent::Unknown(format!("write {path}: {e}")),
            }
        }
        Builtin::ListFiles => {
            let path = s("path").unwrap_or_default();
            match sb.list(&path) {
                Ok(entries) => Sent::Ok(json!({"entries": entries})),
                Err(e) => Sent::Failed(format!("list {path}: {e}")),
            }
        }
    }
}

/// Standard base64, for file contents that are not UTF-8.
mod base64_lite {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(data: &[u8]) -> String {
        let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
        for chunk in data.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
                } else {
                    out.push('=');
                }
            }
        }
        out
    }

    #[cfg(test)]
    #[test]
    fn encodes() {
        assert_eq!(encode(b""), "");
        assert_eq!(encode(b"f"), "Zg==");
        assert_eq!(encode(b"fo"), "Zm8=");
        assert_eq!(encode(b"foo"), "Zm9v");
        assert_eq!(encode(b"foobar"), "Zm9vYmFy");
    }
}
