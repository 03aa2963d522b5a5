//! OTLP export of session spans, against a stand-in collector on loopback that
//! records what it is sent (OTLP/HTTP with JSON bodies, as a collector's
//! port 4318 accepts them).
//!
//! One test per file: the span sink is process-wide, like OpenTelemetry's
//! global tracer provider.

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::routing::post;
use serde_json::{Value, json};
use tessera_agent::trace::{self, Span};
use tessera_server::otlp::{OtlpConfig, install};
use tessera_store::SqliteStore;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The value of an OTLP JSON attribute list entry, whatever its type.
fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)
        .and_then(|kv| kv["value"].as_object())
        .and_then(|v| v.values().next())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_spans_reach_the_collector_as_one_trace_per_session() {
    // The stand-in collector.
    let got: Arc<Mutex<Vec<Value>>> = Arc::default();
    let sink = got.clone();
    let app = Router::new().route(
        "/v1/traces",
        post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let v: Value = serde_json::from_slice(&body).expect("collector got JSON");
                sink.lock().unwrap().push(v);
                axum::Json(json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let export = install(OtlpConfig {
        endpoint: Some(format!("http://{addr}/v1/traces")),
        protocol: Some(opentelemetry_otlp::Protocol::HttpJson),
        service_name: "tessera-test".into(),
    })
    .expect("exporter starts");

    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path()).unwrap();
    let step = |id: &str, parent: Option<&str>, op: &str, start: u64| Span {
        session: "s-1".into(),
        span_id: id.into(),
        parent: parent.map(str::to_string),
        name: format!("{op} demo"),
        operation: op.into(),
        start_ms: start,
        duration_ms: 12.5,
        cost: 0.25,
        attributes: json!({
            "gen_ai.agent.id": "demo",
            "gen_ai.tool.call.id": format!("call-{id}"),
            "gen_ai.usage.input_tokens": 42,
            "nested": {"a": 1},
            "gone": null,
        }),
    };
    // The child is recorded before its parent: ids are derived, not assigned
    // in order, so it still points at it.
    trace::record_span(
        &store,
        "acme",
        step("t1", Some("inv1"), "execute_tool", 1_700_000_000_010),
    )
    .await
    .unwrap();
    trace::record_span(
        &store,
        "acme",
        step("inv1", None, "invoke_agent", 1_700_000_000_000),
    )
    .await
    .unwrap();
    // Another tenant's session of the same name is another trace.
    trace::record_span(
        &store,
        "other",
        step("inv1", None, "invoke_agent", 1_700_000_000_000),
    )
    .await
    .unwrap();
    export.shutdown().await;

    let bodies = got.lock().unwrap().clone();
    let mut spans = Vec::new();
    for b in &bodies {
        for rs in b["resourceSpans"].as_array().expect("resourceSpans") {
            let service = rs["resource"]["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|kv| kv["key"] == "service.name")
                .map(|kv| kv["value"]["stringValue"].clone());
            assert_eq!(service, Some(json!("tessera-test")), "{rs}");
            for ss in rs["scopeSpans"].as_array().unwrap() {
                spans.extend(ss["spans"].as_array().unwrap().iter().cloned());
            }
        }
    }
    assert_eq!(
        spans.len(),
        3,
        "every recorded span is exported once: {bodies:?}"
    );

    let acme_trace = hex(&trace::otel_trace_id("acme", "s-1"));
    let other_trace = hex(&trace::otel_trace_id("other", "s-1"));
    assert_ne!(acme_trace, other_trace);
    let inv = spans
        .iter()
        .find(|s| s["traceId"] == acme_trace.as_str() && s["name"] == "invoke_agent demo")
        .expect("the invocation, in the session's trace");
    let tool = spans
        .iter()
        .find(|s| s["name"] == "execute_tool demo")
        .expect("the tool call");
    assert_eq!(tool["traceId"], acme_trace.as_str());
    assert_eq!(
        tool["parentSpanId"], inv["spanId"],
        "the child points at its parent"
    );
    assert_eq!(
        inv["spanId"],
        hex(&trace::otel_span_id("acme", "s-1", "inv1")).as_str()
    );
    assert!(
        spans.iter().any(|s| s["traceId"] == other_trace.as_str()),
        "the other tenant's span has its own trace"
    );

    // GenAI attributes, the session as the conversation, cost, numbers as numbers.
    assert_eq!(attr(tool, "gen_ai.conversation.id"), Some(&json!("s-1")));
    assert_eq!(
        attr(tool, "gen_ai.operation.name"),
        Some(&json!("execute_tool"))
    );
    assert_eq!(attr(tool, "gen_ai.tool.call.id"), Some(&json!("call-t1")));
    assert_eq!(attr(tool, "gen_ai.agent.id"), Some(&json!("demo")));
    let tokens = attr(tool, "gen_ai.usage.input_tokens").expect("token usage");
    assert!(tokens == &json!(42) || tokens == &json!("42"), "{tokens}");
    assert_eq!(attr(tool, "tessera.tenant"), Some(&json!("acme")));
    assert_eq!(attr(tool, "nested"), Some(&json!("{\"a\":1}")));
    assert_eq!(attr(tool, "gone"), None, "nulls are left out");

    // Times: start and start + duration, in nanoseconds.
    let nanos = |v: &Value| -> u128 {
        v.as_str()
            .map(|s| s.parse().unwrap())
            .or_else(|| v.as_u64().map(u128::from))
            .unwrap()
    };
    assert_eq!(
        nanos(&inv["startTimeUnixNano"]),
        1_700_000_000_000 * 1_000_000
    );
    assert_eq!(
        nanos(&inv["endTimeUnixNano"]) - nanos(&inv["startTimeUnixNano"]),
        12_500_000
    );
    // invoke_agent crosses a process boundary (the agent's sandbox).
    assert_eq!(inv["kind"], json!(3), "SPAN_KIND_CLIENT");
    assert_eq!(tool["kind"], json!(1), "SPAN_KIND_INTERNAL");

    // Recording still works after the exporter stopped.
    trace::record_span(
        &store,
        "acme",
        step("t2", Some("inv1"), "execute_tool", 1_700_000_000_020),
    )
    .await
    .unwrap();
    assert_eq!(trace::spans(&store, "acme", "s-1").await.unwrap().len(), 3);
}

/// A call that came with a W3C `traceparent` continues the caller's trace: its span is
/// exported with the caller's trace id and the caller's span as its (remote) parent.
#[test]
fn a_traceparent_is_joined() {
    let caller_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let span = Span {
        session: "s-1".into(),
        span_id: "chat-1".into(),
        parent: None,
        name: "chat m".into(),
        operation: "chat".into(),
        start_ms: 1_700_000_000_000,
        duration_ms: 1.0,
        cost: 0.0,
        attributes: json!({"trace_id": caller_trace, "parent_span_id": caller_span}),
    };
    let d = tessera_server::otlp::to_span_data("acme", &span);
    assert_eq!(format!("{}", d.span_context.trace_id()), caller_trace);
    assert_eq!(format!("{}", d.parent_span_id), caller_span);
    assert!(d.parent_span_is_remote);
    let session = hex(&trace::otel_trace_id("acme", "s-1"));
    assert!(
        d.attributes
            .iter()
            .any(|kv| kv.key.as_str() == "tessera.session.trace_id" && kv.value.as_str() == session),
        "the session's trace id stays on the span"
    );
    // Without one, the session's own trace.
    let mut own = span.clone();
    own.attributes = json!({"trace_id": "zz", "parent_span_id": caller_span});
    let d = tessera_server::otlp::to_span_data("acme", &own);
    assert_eq!(format!("{}", d.span_context.trace_id()), session);
    assert!(!d.parent_span_is_remote);
}
