//! The tool gateway over HTTP: registration with schema errors naming the field,
//! grants (403 plus an audit entry), REST calls through the ledger, approvals,
//! in-doubt resolution, and the MCP endpoint (used by rmcp's server and by the
//! gateway's own MCP proxy).

mod common;

use common::{Server, code};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use tessera_agent::tools::testing::{CountingConfig, CountingService};

#[tokio::test]
async fn tools_over_rest_with_grants_schemas_audit_and_ledger() {
    let s = Server::start().await;
    let acme = s.tenant("acme").await;
    let svc = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    // An invalid schema is rejected with the field path.
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "charge", "target": {"type": "http", "url": svc.url()},
                   "input_schema": {"type": "object", "properties": {"amount": {"type": "numbr"}}}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert!(
        v["field"]
            .as_str()
            .unwrap()
            .starts_with("input_schema.properties.amount.type"),
        "{v}"
    );
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "charge", "target": {"type": "ftp"}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "charge", "target": {"type": "http", "url": svc.url()},
                   "input_schema": {"type": "object", "properties": {"amount": {"type": "integer"}}, "required": ["amount"]}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    s.session("acme", "s1", "shop").await;
    let agent = acme.with_role("session:s1", "developer").await;
    let call = json!({"session_id": "s1", "tool_call_id": "c1", "arguments": {"amount": 3}});
    // Not granted: 403 and an audit entry.
    let (st, v) = agent.post("/v1/tools/charge/call", call.clone()).await;
    assert_eq!(st, StatusCode::FORBIDDEN, "{v}");
    assert_eq!(code(&v), "forbidden");
    let (_, audit) = acme.get("/v1/audit").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"] == "denied-call" && a["subject"] == "session:s1"),
        "{audit}"
    );
    // Only admins grant.
    let (st, _) = agent
        .post("/v1/tools/charge/grants", json!({"runtime": "shop"}))
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = acme
        .post("/v1/tools/charge/grants", json!({"runtime": "shop"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // Bad arguments: 400 naming the path.
    let (st, v) = agent
        .post(
            "/v1/tools/charge/call",
            json!({"session_id": "s1", "tool_call_id": "c0", "arguments": {"amount": "x"}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "arguments.amount", "{v}");
    // A call, then its replay.
    let (st, v) = agent.post("/v1/tools/charge/call", call.clone()).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result"]["executions"], 1);
    let (_, v2) = agent.post("/v1/tools/charge/call", call.clone()).await;
    assert_eq!(v2["result"], v["result"]);
    assert_eq!(v2["replayed"], true);
    assert_eq!(svc.executions("s1/c1"), 1);
    // Another session's call is refused for a session key.
    let (st, _) = agent
        .post(
            "/v1/tools/charge/call",
            json!({"session_id": "s2", "tool_call_id": "c1", "arguments": {"amount": 3}}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = agent.get("/v1/ledger?session_id=s1").await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["items"].as_array().unwrap().len(), 1);
    assert_eq!(v["items"][0]["state"], "completed");
    let (st, _) = agent.get("/v1/ledger").await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, v) = acme.get("/v1/tools/charge").await;
    assert_eq!(st, StatusCode::OK);
    assert_eq!(v["grants"], json!([{"runtime": "shop"}]));
    // Tenants do not see each other's tools.
    let other = s.tenant("other").await;
    let (st, _) = other.get("/v1/tools/charge").await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn approvals_and_in_doubt_resolution_over_rest() {
    let s = Server::start().await;
    let acme = s.tenant("acme").await;
    let svc = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "wire", "target": {"type": "http", "url": svc.url()}, "approval": {"ttl_seconds": 60}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    acme.post("/v1/tools/wire/grants", json!({"runtime": "bank"}))
        .await;
    s.session("acme", "s1", "bank").await;
    let agent = acme.with_role("session:s1", "developer").await;
    let call = json!({"session_id": "s1", "tool_call_id": "w1", "arguments": {}});
    let (_, v) = agent.post("/v1/tools/wire/call", call.clone()).await;
    assert_eq!(v["status"], "pending_approval", "{v}");
    let id = v["approval_id"].as_str().unwrap().to_string();
    // A session cannot approve.
    let (st, _) = agent
        .post(
            &format!("/v1/approvals/{id}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (_, list) = acme.get("/v1/approvals").await;
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let (st, v) = acme
        .post(
            &format!("/v1/approvals/{id}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let (_, v) = agent.post("/v1/tools/wire/call", call).await;
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(svc.executions("s1/w1"), 1);
    // Resolving something that is not in doubt is a conflict.
    let (st, _) = acme
        .post(
            &format!("/v1/ledger/{id}/resolve"),
            json!({"outcome": "completed"}),
        )
        .await;
    assert_eq!(st, StatusCode::CONFLICT);
}

/// JSON-RPC over the MCP endpoint, as a 2025-11-25 client does it.
async fn mcp(
    c: &common::Client,
    sid: Option<&str>,
    body: Value,
) -> (StatusCode, Option<String>, Value) {
    let mut r = c
        .request(Method::POST, "/v1/mcp")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2025-11-25")
        .json(&body);
    if let Some(s) = sid {
        r = r.header("mcp-session-id", s);
    }
    let resp = r.send().await.unwrap();
    let st = resp.status();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| {
        // An event stream: the data of the last event.
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .next_back()
            .unwrap_or(Value::String(text.clone()))
    });
    (st, sid, v)
}

#[tokio::test]
async fn the_mcp_endpoint_lists_granted_tools_and_calls_through_the_ledger() {
    let s = Server::start().await;
    let acme = s.tenant("acme").await;
    let svc = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    for (name, ro) in [("charge", false), ("lookup", true), ("hidden", false)] {
        let (st, v) = acme
            .post(
                "/v1/tools",
                json!({"name": name, "description": format!("the {name} tool"),
                       "target": {"type": "http", "url": svc.url()}, "read_only": ro}),
            )
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
        if name != "hidden" {
            acme.post(
                &format!("/v1/tools/{name}/grants"),
                json!({"runtime": "shop"}),
            )
            .await;
        }
    }
    s.session("acme", "s1", "shop").await;
    let agent = acme.with_role("session:s1", "developer").await;
    let (st, sid, v) = mcp(
        &agent,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert!(v["result"]["capabilities"]["tools"].is_object(), "{v}");
    let sid = sid.as_deref();
    mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, _, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let names: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["charge", "lookup"]);
    // A key without a session (an IDE-style client) may browse what its role is
    // granted in any runtime, but calling needs a session.
    let (st, bsid, v) = mcp(
        &acme,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "ide", "version": "1"}}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    let bsid = bsid.as_deref();
    mcp(
        &acme,
        bsid,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, _, v) = mcp(
        &acme,
        bsid,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    )
    .await;
    let browsed: Vec<&str> = v["result"]["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(browsed, ["charge", "lookup"], "ungranted tools stay hidden");
    let (_, _, v) = mcp(
        &acme,
        bsid,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "charge", "arguments": {}}}),
    )
    .await;
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("which session")),
        "{v}"
    );
    // Closing the session is 204, as the official client expects (not 202).
    let resp = acme
        .request(Method::DELETE, "/v1/mcp")
        .header("mcp-session-id", bsid.unwrap())
        .header("mcp-protocol-version", "2025-11-25")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::NO_CONTENT);
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "charge", "arguments": {"n": 1}, "_meta": {"tessera.dev/tool_call_id": "m1"}}});
    let (_, _, v) = mcp(&agent, sid, call.clone()).await;
    assert_eq!(v["result"]["structuredContent"]["executions"], 1, "{v}");
    let (_, _, v) = mcp(&agent, sid, call).await;
    assert_eq!(v["result"]["structuredContent"]["executions"], 1, "{v}");
    assert_eq!(svc.executions("s1/m1"), 1);
    // The call is one GenAI `execute_tool` span in the session's trace (the replay
    // adds none).
    let (_, t) = acme.get("/v1/sessions/s1/trace").await;
    let tools: Vec<&Value> = t["spans"]
        .as_array()
        .unwrap_or_else(|| panic!("{t}"))
        .iter()
        .filter(|s| s["operation"] == "execute_tool")
        .collect();
    assert_eq!(tools.len(), 1, "{t}");
    assert_eq!(tools[0]["name"], "execute_tool charge", "{t}");
    assert_eq!(tools[0]["attributes"]["gen_ai.tool.call.id"], "m1", "{t}");
    assert_eq!(
        tools[0]["attributes"]["gen_ai.conversation.id"], "s1",
        "{t}"
    );
    // Not granted: an error and an audit entry.
    let (_, _, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "hidden", "arguments": {}}}),
    )
    .await;
    assert!(v["error"].is_object(), "{v}");
    let (_, audit) = acme.get("/v1/audit").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"] == "denied-call")
    );
    // Arguments the model got wrong: a tool result with isError it can read and fix,
    // not a protocol error.
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "typed", "target": {"type": "http", "url": svc.url()},
                   "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    acme.post("/v1/tools/typed/grants", json!({"runtime": "shop"}))
        .await;
    let (_, _, v) = mcp(
        &agent,
        sid,
        json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "typed", "arguments": {"n": "many"}}}),
    )
    .await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(
        v["result"]["structuredContent"]["status"], "invalid_arguments",
        "{v}"
    );
    assert!(v["error"].is_null(), "{v}");
    // Without a credential, nothing.
    let (st, _, _) = mcp(
        &s.anonymous(),
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    .await;
    assert_eq!(st, StatusCode::UNAUTHORIZED);

    // The gateway proxies a remote MCP server: here, itself, as a session of
    // another tenant (the same tenant would share the ledger key and wait for
    // itself).
    let remote = s.tenant("remote").await;
    remote
        .post(
            "/v1/tools",
            json!({"name": "charge", "target": {"type": "http", "url": svc.url()}}),
        )
        .await;
    remote
        .post("/v1/tools/charge/grants", json!({"runtime": "backend"}))
        .await;
    s.session("remote", "r1", "backend").await;
    let remote_key = remote.key_for("session:r1", "developer").await;
    s.session("acme", "s2", "proxy").await;
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "remote-charge", "target": {"type": "mcp", "url": format!("{}/v1/mcp", s.base),
                   "tool": "charge", "headers": {"Authorization": {"secret": format!("Bearer {remote_key}")}}}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    // The key is a secret: used for the proxy's calls, shown to nobody.
    assert_eq!(v["target"]["headers"]["Authorization"], "<secret>", "{v}");
    acme.post(
        "/v1/tools/remote-charge/grants",
        json!({"runtime": "proxy"}),
    )
    .await;
    let proxy_agent = acme.with_role("session:s2", "developer").await;
    let call = json!({"session_id": "s2", "tool_call_id": "p1", "arguments": {"n": 2}});
    let (st, v) = proxy_agent
        .post("/v1/tools/remote-charge/call", call.clone())
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result"]["executions"], 1, "{v}");
    // The key travels: the remote gateway's ledger has the call under it too.
    assert_eq!(svc.executions("s2/p1"), 1);
    let (_, l) = remote.get("/v1/ledger?session_id=r1").await;
    assert_eq!(l["items"][0]["idempotency_key"], "s2/p1", "{l}");
}

/// A `tools/call` as an MCP 2026-07-28 client sends it: no handshake, the
/// protocol version and capabilities in `_meta`, the method in a header.
async fn mcp_2026(
    c: &common::Client,
    id: u64,
    tool: &str,
    args: Value,
    state: Option<&str>,
) -> Value {
    let mut params = json!({"name": tool, "arguments": args, "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {}}});
    if let Some(s) = state {
        params["requestState"] = json!(s);
    }
    let resp = c
        .request(Method::POST, "/v1/mcp")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}))
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| {
        text.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str(d.trim()).ok())
            .next_back()
            .unwrap_or(Value::String(text.clone()))
    })
}

#[tokio::test]
async fn mcp_2026_clients_get_input_required_while_an_approval_is_open() {
    let s = Server::start().await;
    let acme = s.tenant("acme").await;
    let svc = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "wire", "target": {"type": "http", "url": svc.url()}, "approval": {"ttl_seconds": 60}}),
        )
        .await;
    assert_eq!(st, StatusCode::CREATED, "{v}");
    acme.post("/v1/tools/wire/grants", json!({"runtime": "bank"}))
        .await;
    s.session("acme", "s1", "bank").await;
    s.session("acme", "s2", "bank").await;
    let agent = acme.with_role("session:s1", "developer").await;
    let v = mcp_2026(&agent, 1, "wire", json!({"amount": 5}), None).await;
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    let state = v["result"]["requestState"].as_str().unwrap().to_string();
    assert_eq!(
        v["result"]["_meta"]["tessera.dev/outcome"]["status"], "pending_approval",
        "{v}"
    );
    let id = state.strip_prefix("approval:").unwrap().to_string();
    // Retried before anyone decided: still input_required, nothing sent.
    let v = mcp_2026(&agent, 2, "wire", json!({"amount": 5}), Some(&state)).await;
    assert_eq!(v["result"]["resultType"], "input_required", "{v}");
    assert_eq!(svc.executions("s1/jsonrpc-1"), 0);
    // The handle is checked: another session's, another tool's, or a made-up
    // one is refused.
    let other = acme.with_role("session:s2", "developer").await;
    let v = mcp_2026(&other, 3, "wire", json!({"amount": 5}), Some(&state)).await;
    assert!(v["error"].is_object(), "{v}");
    let v = mcp_2026(
        &agent,
        4,
        "wire",
        json!({"amount": 5}),
        Some("approval:l-nope"),
    )
    .await;
    assert!(v["error"].is_object(), "{v}");
    let (st, v) = acme
        .post(
            &format!("/v1/approvals/{id}"),
            json!({"decision": "approve"}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    // The retry (a new JSON-RPC id) is the same logical call: sent once.
    let v = mcp_2026(&agent, 5, "wire", json!({"amount": 5}), Some(&state)).await;
    assert_eq!(v["result"]["isError"], false, "{v}");
    assert_eq!(v["result"]["structuredContent"]["executions"], 1, "{v}");
    let v = mcp_2026(&agent, 6, "wire", json!({"amount": 5}), Some(&state)).await;
    assert_eq!(v["result"]["structuredContent"]["executions"], 1, "{v}");
    assert_eq!(svc.executions("s1/jsonrpc-1"), 1);
    // A 2025-11-25 client has no input_required: while the approval is open it gets a
    // result that is plainly not a success (nothing ran yet), with the status.
    let (_, osid, v) = mcp(
        &other,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "old", "version": "1"}}}),
    )
    .await;
    let osid = osid.unwrap_or_else(|| panic!("{v}"));
    mcp(
        &other,
        Some(&osid),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    let (_, _, v) = mcp(
        &other,
        Some(&osid),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "wire", "arguments": {"amount": 1}, "_meta": {"tessera.dev/tool_call_id": "o1"}}}),
    )
    .await;
    assert_eq!(v["result"]["isError"], true, "{v}");
    assert_eq!(
        v["result"]["structuredContent"]["status"], "pending_approval",
        "{v}"
    );
    assert_eq!(svc.executions("s2/o1"), 0);
}
