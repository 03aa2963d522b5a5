//! The agent platform over HTTP: runtimes (validation with field paths,
//! quotas), invocations in sessions on real sandboxes with the control plane
//! reachable from inside, session-scoped keys, kill, events (read, SSE,
//! offsets), usage.

mod common;
use common::{Method, Server, StatusCode, code, json};

const AGENT: &str = include_str!("../../agent/tests/agents/echo_agent.py");

fn sandboxes_here() -> bool {
    let probe = tessera_sandbox_probe();
    if let Err(e) = &probe {
        if std::env::var_os("CI").is_some() {
            panic!("sandboxes are needed in CI: {e}");
        }
        eprintln!("SKIP (sandbox part): cannot make sandboxes here: {e}");
    }
    probe.is_ok()
}

fn tessera_sandbox_probe() -> Result<(), String> {
    // The server finds `tessera-sandbox-init` the same way.
    if tessera_sandbox::InitProgram::locate().is_none() {
        return Err("tessera-sandbox-init not built next to the tests".into());
    }
    let rt = tessera_sandbox::Runtime::new(Default::default()).map_err(|e| e.to_string())?;
    rt.spawn(&Default::default())
        .map(drop)
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn runtimes_validate_and_enforce_quotas() {
    let s = Server::start_with(|c| {
        c.agents.host.quotas.runtimes_per_tenant = 1;
        c.agents.host.pool_min = 0;
    })
    .await;
    let t = s.tenant("alpha").await;
    let (st, v) = t
        .post(
            "/v1/runtimes",
            json!({"name": "bot", "command": ["x"], "resources": {"cpu_millis": 1}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "resources.cpu_millis");
    let (st, v) = t
        .post(
            "/v1/runtimes",
            json!({"name": "bot", "command": ["x"], "resouces": {}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(v["detail"].as_str().unwrap().contains("resouces"), "{v}");
    let (st, v) = t
        .post("/v1/runtimes", json!({"name": "bot", "command": ["x"]}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    assert_eq!(v["version"], 1);
    let (st, v) = t.put("/v1/runtimes/bot", json!({"command": ["y"]})).await;
    assert_eq!(
        (st, v["version"].as_u64()),
        (StatusCode::OK, Some(2)),
        "{v}"
    );
    let (st, v) = t
        .post("/v1/runtimes", json!({"name": "bot2", "command": ["x"]}))
        .await;
    assert_eq!(st, StatusCode::TOO_MANY_REQUESTS, "{v}");
    assert_eq!(code(&v), "quota_exceeded");
    assert!(
        v["detail"].as_str().unwrap().contains("its limit is 1"),
        "{v}"
    );
    let (st, v) = t
        .put("/v1/runtimes/bot/endpoints/prod", json!({"version": 1}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = t.get("/v1/runtimes/bot").await;
    assert_eq!(v["latest_version"], 2);
    assert_eq!(v["endpoints"][0]["name"], "DEFAULT");
    assert_eq!(v["endpoints"][1]["version"], 1);
    // Another tenant sees none of it.
    let u = s.tenant("beta").await;
    let (st, _) = u.get("/v1/runtimes/bot").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn events_usage_and_session_keys() {
    let s = Server::start_with(|c| c.agents.host.pool_min = 0).await;
    let t = s.tenant("alpha").await;
    for i in 0..3 {
        let (st, v) = t.post("/v1/topics/approvals/events", json!({"i": i})).await;
        assert_eq!(
            (st, v["offset"].as_u64()),
            (StatusCode::CREATED, Some(i + 1)),
            "{v}"
        );
    }
    let (_, v) = t.get("/v1/topics/approvals/events?after=1").await;
    assert_eq!(v["items"].as_array().unwrap().len(), 2);
    let (st, _) = t
        .put("/v1/topics/approvals/offsets/worker", json!({"offset": 2}))
        .await;
    assert_eq!(st, StatusCode::OK);
    let (_, v) = t.get("/v1/topics/approvals/events?consumer=worker").await;
    assert_eq!(v["items"][0]["offset"], 3);
    // SSE: the stream starts with the events after `after`.
    let r = t
        .request(Method::GET, "/v1/topics/approvals/events?after=2")
        .header("accept", "text/event-stream")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let mut r = r;
    let chunk = tokio::time::timeout(std::time::Duration::from_secs(10), r.chunk())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&chunk);
    assert!(text.contains("id: 3") && text.contains("\"i\":2"), "{text}");
    let (st, v) = t.post("/v1/topics/bad%2Fname/events", json!({})).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    // Usage: idempotent by source id; totals.
    let rec = json!({"session": "s1", "runtime": "bot", "kind": "tokens_in", "quantity": 100.0, "source_id": "m-1"});
    let (st, v) = t.post("/v1/usage", rec.clone()).await;
    assert_eq!(
        (st, v["counted"].as_bool()),
        (StatusCode::OK, Some(true)),
        "{v}"
    );
    let (_, v) = t.post("/v1/usage", rec).await;
    assert_eq!(v["counted"], false);
    let (_, v) = t.get("/v1/usage?session=s1&records=true").await;
    assert_eq!(v["session_totals"]["quantities"]["tokens_in"], 100.0);
    assert_eq!(v["records"].as_array().unwrap().len(), 1);
    // Writes into a session nobody started are 404, not stray records.
    let (st, v) = t.put("/v1/sessions/s1/memory/a", json!({"value": 1})).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, v) = t.post("/v1/sessions/s1/history", json!({"x": 1})).await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{v}");
    let (st, _) = t
        .post("/v1/runtimes", json!({"name": "bot", "command": ["x"]}))
        .await;
    assert_eq!(st, StatusCode::CREATED);
    let store = s.running.plane.store();
    let rv = tessera_agent::runtimes::resolve(store, "alpha", "bot", None)
        .await
        .unwrap();
    tessera_agent::sessions::get_or_create(store, "alpha", "s1", &rv, 1)
        .await
        .unwrap();
    // A session key reaches its own session only.
    let sk = t.with_role("session:s1", "developer").await;
    let (st, _) = sk
        .put("/v1/sessions/s1/memory/a", json!({"value": 1}))
        .await;
    assert_eq!(st, StatusCode::OK);
    // ... and nothing of the tenant's beyond it: no jobs, sandboxes, runtimes, keys,
    // listings or topics (each of these was open to it before).
    for (m, path, body) in [
        (
            Method::POST,
            "/v1/jobs",
            Some(json!({"name": "j", "queue": "q", "tasks": []})),
        ),
        (Method::GET, "/v1/jobs", None),
        (Method::POST, "/v1/sandboxes", Some(json!({}))),
        (Method::GET, "/v1/runtimes", None),
        (
            Method::POST,
            "/v1/runtimes",
            Some(json!({"name": "evil", "command": ["x"]})),
        ),
        (
            Method::POST,
            "/v1/runtimes/bot/invocations",
            Some(json!({})),
        ),
        (Method::GET, "/v1/sessions", None),
        (Method::POST, "/v1/apikeys", Some(json!({"subject": "x"}))),
        (Method::GET, "/v1/tools", None),
        (Method::GET, "/v1/events", None),
        (Method::POST, "/v1/topics/approvals/events", Some(json!({}))),
        (Method::GET, "/v1/watch?kind=job", None),
        // Other sessions' records, sandboxes and pools are not a session's to follow.
        (Method::GET, "/v1/watch?kind=session", None),
        (Method::GET, "/v1/watch?kind=sandbox", None),
        (Method::GET, "/v1/watch?kind=pool", None),
        (Method::GET, "/v1/agent-pools", None),
        (Method::GET, "/v1/approvals", None),
    ] {
        let (st, v) = sk.call(m.clone(), path, body).await;
        assert_eq!(st, StatusCode::FORBIDDEN, "{m} {path}: {v}");
        assert!(
            v["detail"].as_str().unwrap_or("").contains("session"),
            "{m} {path}: {v}"
        );
    }
    let (st, v) = sk.get("/v1/whoami").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (st, v) = sk
        .put("/v1/sessions/s2/memory/a", json!({"value": 1}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    let (st, _) = sk.get("/v1/usage").await;
    assert_eq!(st, StatusCode::FORBIDDEN);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invocations_run_in_sessions_on_sandboxes() {
    if !sandboxes_here() {
        return;
    }
    let s = Server::start_with(|c| c.agents.host.pool_min = 1).await;
    let t = s.tenant("alpha").await;
    let (st, v) = t
        .post("/v1/runtimes", json!({"name": "echo", "command": ["python3", "-c", AGENT], "resources": {"memory_mb": 256}}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    // The console's sessions list follows this watch.
    let mut watch = t.watch("session", None).await;
    let (st, v) = t
        .post(
            "/v1/runtimes/echo/invocations?session_id=abc",
            json!({"hello": 1}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["echo"]["hello"], 1);
    assert_eq!(v["has_url"], true);
    // The agent reaches the control plane from inside its sandbox with its
    // session key: its own session yes, another no.
    let (_, v) = t
        .post(
            "/v1/runtimes/echo/invocations?session_id=abc",
            json!({"memory_put": "abc", "value": 7}),
        )
        .await;
    assert_eq!(v["calls"]["status"], 200, "{v}");
    let (_, v) = t.get("/v1/sessions/abc/memory/k").await;
    assert_eq!(v["value"], 7);
    let (_, v) = t
        .post(
            "/v1/runtimes/echo/invocations?session_id=abc",
            json!({"memory_put": "other"}),
        )
        .await;
    assert_eq!(v["calls"]["status"], 403, "{v}");
    let (_, v) = t.get("/v1/sessions?state=active").await;
    assert_eq!(v["items"][0]["id"], "abc", "{v}");
    let (_, v) = t.get("/v1/sessions/abc").await;
    assert_eq!(v["invocations"], 3, "{v}");
    // Who started it (whom its exchanged tokens act for) is the first caller.
    let (_, me) = t.get("/v1/whoami").await;
    assert_eq!(v["started_by"], me["subject"], "{v}");
    assert_eq!(v["usage"]["quantities"]["tokens_in"], 30.0, "{v}");
    let (_, v) = t.get("/v1/sessions/abc/trace").await;
    assert_eq!(v["spans"].as_array().unwrap().len(), 3, "{v}");
    // The tokens an invocation reports are GenAI usage attributes of its span.
    assert_eq!(
        v["spans"][0]["attributes"]["gen_ai.usage.input_tokens"], 10.0,
        "{v}"
    );
    let (st, v) = t
        .post("/v1/sessions/abc/kill", json!({"reason": "runaway"}))
        .await;
    assert_eq!(
        (st, v["state"].as_str()),
        (StatusCode::OK, Some("killed")),
        "{v}"
    );
    // Every change of the session's record came through the watch, in order, as the
    // list shows a session (no host pid), ending with the kill.
    let mut seen = Vec::new();
    watch
        .until(|s| s.iter().any(|(_, o)| o["state"] == "killed"), &mut seen)
        .await;
    assert_eq!(seen[0].0, "created", "{seen:?}");
    assert!(
        seen.iter()
            .all(|(_, o)| o["id"] == "abc" && o.get("sandbox_pid").is_none()),
        "{seen:?}"
    );
    let versions: Vec<u64> = seen
        .iter()
        .map(|(_, o)| o["resource_version"].as_u64().unwrap())
        .collect();
    assert!(versions.windows(2).all(|w| w[0] < w[1]), "{versions:?}");
    assert!(seen.iter().any(|(_, o)| o["invocations"] == 3), "{seen:?}");
    // The list carries the version the watch compares with (the record may have
    // been written again since the kill: the watch brings that write too).
    let (_, l) = t.get("/v1/sessions").await;
    let listed = l["items"][0]["resource_version"].as_u64().unwrap();
    watch
        .until(
            |s| s.iter().any(|(_, o)| o["resource_version"] == listed),
            &mut seen,
        )
        .await;
    let (st, v) = t
        .post("/v1/runtimes/echo/invocations?session_id=abc", json!({}))
        .await;
    assert_eq!(st, StatusCode::CONFLICT, "{v}");
    assert!(
        v["detail"].as_str().unwrap().contains("killed (runaway)"),
        "{v}"
    );
    let (st, v) = t.get("/v1/sessions?state=bogus").await;
    assert_eq!(
        (st, v["field"].as_str()),
        (StatusCode::BAD_REQUEST, Some("state"))
    );
}

/// JSON-RPC over `/v1/mcp`, as a 2025-11-25 client does it: the reply's
/// session id and body (the last event of a stream).
async fn mcp(
    c: &common::Client,
    sid: Option<&str>,
    body: serde_json::Value,
) -> (Option<String>, serde_json::Value) {
    let mut r = c
        .request(Method::POST, "/v1/mcp")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    if let Some(s) = sid {
        r = r.header("mcp-session-id", s);
    }
    let resp = r.send().await.unwrap();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .next_back()
            .unwrap_or(serde_json::Value::String(text.clone()))
    });
    (sid, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn granted_runtimes_run_builtin_tools_in_their_sandbox_over_rest_and_mcp() {
    if !sandboxes_here() {
        return;
    }
    let s = Server::start_with(|c| c.agents.host.pool_min = 1).await;
    let t = s.tenant("alpha").await;
    let (st, v) = t
        .post("/v1/runtimes", json!({"name": "echo", "command": ["python3", "-c", AGENT], "resources": {"memory_mb": 256}}))
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    for (name, builtin) in [
        ("exec", "exec"),
        ("write", "write_file"),
        ("read", "read_file"),
    ] {
        let (st, v) = t
            .post(
                "/v1/tools",
                json!({"name": name, "target": {"type": "builtin", "builtin": builtin}}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    for name in ["exec", "write"] {
        let (st, v) = t
            .post(
                &format!("/v1/tools/{name}/grants"),
                json!({"runtime": "echo"}),
            )
            .await;
        assert_eq!(st, StatusCode::OK, "{v}");
    }
    let agent = t.with_role("session:abc", "developer").await;
    let exec = |id: &str, cmd: &str| json!({"session_id": "abc", "tool_call_id": id, "arguments": {"command": cmd}});
    // No session yet: nothing to run in.
    let (st, v) = agent.post("/v1/tools/exec/call", exec("c0", "true")).await;
    assert!(st.is_client_error(), "{st} {v}");
    // The session's sandbox exists once it is invoked.
    let (st, v) = t
        .post("/v1/runtimes/echo/invocations?session_id=abc", json!({}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, sess) = t.get("/v1/sessions/abc").await;
    // REST: exec runs in the session's sandbox (its hostname, its pid
    // namespace), once per tool call id.
    let (st, v) = agent
        .post(
            "/v1/tools/exec/call",
            exec(
                "c1",
                "echo $(hostname) >> /tmp/runs; cat /tmp/runs; echo pid1=$(cat /proc/1/comm)",
            ),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result"]["exit_code"], 0, "{v}");
    let out = v["result"]["stdout"].as_str().unwrap().to_string();
    assert!(out.starts_with("agent\n"), "{v}");
    assert!(!out.contains("pid1=systemd"), "{v}");
    let (_, again) = agent
        .post(
            "/v1/tools/exec/call",
            exec(
                "c1",
                "echo $(hostname) >> /tmp/runs; cat /tmp/runs; echo pid1=$(cat /proc/1/comm)",
            ),
        )
        .await;
    assert_eq!(again["replayed"], true, "{again}");
    assert_eq!(again["result"]["stdout"], v["result"]["stdout"]);
    // Not granted: 403.
    let (st, v) = agent
        .post(
            "/v1/tools/read/call",
            json!({"session_id": "abc", "tool_call_id": "r1", "arguments": {"path": "/tmp/runs"}}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    // MCP: the granted built-ins are listed and run in the same sandbox.
    let (sid, v) = mcp(
        &agent,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
    )
    .await;
    assert!(v["result"]["capabilities"]["tools"].is_object(), "{v}");
    let sid = sid.as_deref();
    mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let mut names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["exec", "write"], "{v}");
    let (_, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "write", "arguments": {"path": "/tmp/note", "content": "from mcp"},
            "_meta": {"tessera.dev/tool_call_id": "m1"}}}),
    )
    .await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    let (_, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "exec", "arguments": {"argv": ["cat", "/tmp/note", "/tmp/runs"]},
            "_meta": {"tessera.dev/tool_call_id": "m2"}}}),
    )
    .await;
    assert_eq!(
        v["result"]["structuredContent"]["stdout"], "from mcpagent\n",
        "{v}"
    );
    // The file is in the session's sandbox, not on the host.
    assert!(
        !std::path::Path::new("/tmp/note").exists()
            || std::fs::read_to_string("/tmp/note").unwrap() != "from mcp"
    );
    let _ = sess;
}
