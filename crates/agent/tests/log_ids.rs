//! The tool gateway logs every call with the ids of the agent platform (issue 25
//! item 6): the session, the agent (its runtime), the caller's tool call id and the
//! ledger entry, as fields of one structured line a log pipeline can filter on.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};
use tessera_agent::tools::testing::{CountingConfig, CountingService};
use tessera_agent::tools::{
    CallRequest, Grant, Status, ToolCaller, ToolGateway, ToolGatewayConfig, ToolSpec,
};
use tessera_store::{Key, SqliteStore, Store};

/// What the subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn a_tool_call_is_logged_with_its_session_agent_and_call_ids() {
    let lines = Lines::default();
    let w = lines.clone();
    let sub = tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        .with_writer(move || w.clone())
        .finish();
    tracing::subscriber::set_global_default(sub).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let tool = CountingService::start(CountingConfig::default())
        .await
        .unwrap();
    store
        .create(
            Key::new("session", "acme", "s1"),
            json!({"id": "s1", "runtime": "shop", "state": "active"}),
        )
        .await
        .unwrap();
    let gw = ToolGateway::new(store.clone(), ToolGatewayConfig::default());
    let spec: ToolSpec = serde_json::from_value(
        json!({"name": "charge", "target": {"type": "http", "url": tool.url()}}),
    )
    .unwrap();
    gw.register("acme", spec).await.unwrap();
    let grant = Grant {
        runtime: Some("shop".into()),
        role: None,
    };
    gw.set_grant("acme", "charge", grant, true).await.unwrap();
    let caller = ToolCaller {
        tenant: "acme".into(),
        subject: "session:s1".into(),
        role: "developer".into(),
    };
    let out = gw
        .call(
            &caller,
            "charge",
            CallRequest {
                session_id: "s1".into(),
                tool_call_id: "call-7".into(),
                idempotency_key: None,
                arguments: json!({}),
            },
        )
        .await
        .unwrap();
    assert_eq!(out.status, Status::Completed, "{out:?}");

    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let line: Value = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["tool_call_id"] == "call-7")
        .unwrap_or_else(|| panic!("no line with the tool call's id in:\n{text}"));
    assert_eq!(line["level"], "INFO", "{line}");
    assert_eq!(line["tenant"], "acme", "{line}");
    assert_eq!(line["session_id"], "s1", "{line}");
    assert_eq!(line["agent_id"], "shop", "{line}");
    assert_eq!(line["tool"], "charge", "{line}");
    assert_eq!(line["ledger_id"], out.ledger_id.as_str(), "{line}");
    assert_eq!(line["status"], "Completed", "{line}");
}
