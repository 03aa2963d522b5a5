//! OpenTelemetry export of the sessions' spans over OTLP/HTTP.
//!
//! The agent platform records every step of a session (an invocation, a tool
//! call, a model call) as a span in the store, with the GenAI attribute names;
//! `tessera session trace ID` prints them. When OTLP export is configured
//! (the standard `OTEL_EXPORTER_OTLP_*` variables), each recorded span is also
//! queued here and sent in batches to the collector, with ids derived from the
//! tenant, session and step ([`tessera_agent::trace::otel_trace_id`]), so the
//! whole session is one trace in Jaeger, Tempo or any OTLP backend, whichever
//! replica recorded each step.
//!
//! Exporting never slows a request: spans go through a bounded queue, and when
//! it is full (the collector is slow or down) spans are dropped from export
//! (they stay in the store) and counted in the log.

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, UNIX_EPOCH};

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value as OtelValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks};
use serde_json::Value;
use tessera_agent::trace::{self, Span, SpanSink};
use tokio::sync::{mpsc, oneshot};

/// Spans sent per request at most.
const BATCH: usize = 512;
/// How long a span may wait for its batch to fill.
const LINGER: Duration = Duration::from_millis(500);
/// Spans queued for export at most; more are dropped from export.
const QUEUE: usize = 8192;

/// What to export to.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The traces URL (`http://collector:4318/v1/traces`); `None` reads
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: Option<String>,
    /// `None` reads `OTEL_EXPORTER_OTLP_PROTOCOL` (default `http/protobuf`).
    pub protocol: Option<Protocol>,
    /// The `service.name` resource attribute.
    pub service_name: String,
}

impl OtlpConfig {
    /// From the standard environment variables: `None` when no endpoint is
    /// set or `OTEL_TRACES_EXPORTER=none`; an error for a protocol that is not
    /// built in.
    pub fn from_env() -> Result<Option<OtlpConfig>, String> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        if var("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim() == "none") {
            return Ok(None);
        }
        // The exporter reads the endpoint itself (and appends /v1/traces
        // to the general one); here it only decides whether to export.
        if var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_none()
            && var("OTEL_EXPORTER_OTLP_ENDPOINT").is_none()
        {
            return Ok(None);
        }
        let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"));
        let protocol = match protocol.as_deref().map(str::trim) {
            None | Some("http/protobuf") => Protocol::HttpBinary,
            Some("http/json") => Protocol::HttpJson,
            Some(other) => {
                return Err(format!(
                    "OTEL_EXPORTER_OTLP_PROTOCOL={other:?} is not supported: Tessera exports over \
                     OTLP/HTTP only; set it to http/protobuf or http/json and point \
                     OTEL_EXPORTER_OTLP_ENDPOINT at the collector's HTTP port (usually 4318)"
                ));
            }
        };
        Ok(Some(OtlpConfig {
            endpoint: None,
            protocol: Some(protocol),
            service_name: var("OTEL_SERVICE_NAME").unwrap_or_else(|| "tessera".into()),
        }))
    }
}

enum Msg {
    Span(Box<SpanData>),
    Flush(oneshot::Sender<()>),
}

/// The running exporter; [`OtlpExport::shutdown`] sends what is queued.
pub struct OtlpExport {
    tx: mpsc::Sender<Msg>,
    task: tokio::task::JoinHandle<()>,
}

struct Sink {
    tx: mpsc::Sender<Msg>,
    dropped: AtomicU64,
}

impl SpanSink for Sink {
    fn send(&self, tenant: &str, span: &Span) {
        if self
            .tx
            .try_send(Msg::Span(Box::new(to_span_data(tenant, span))))
            .is_err()
        {
            let n = self.dropped.fetch_add(1, Ordering::Relaxed);
            if n.is_power_of_two() || n == 0 {
                tracing::warn!(
                    "tessera: OTLP export queue full or closed: {} span(s) dropped from export so far (they stay in the store)",
                    n + 1
                );
            }
        }
    }
}

/// Starts the exporter and installs it as the process's span sink. Call from
/// inside the Tokio runtime. Fails when the exporter cannot be built (a bad
/// URL) or a sink is already installed in this process.
pub fn install(cfg: OtlpConfig) -> Result<OtlpExport, String> {
    let mut b = opentelemetry_otlp::SpanExporter::builder().with_http();
    if let Some(p) = cfg.protocol {
        b = b.with_protocol(p);
    }
    if let Some(e) = &cfg.endpoint {
        b = b.with_endpoint(e.clone());
    }
    let mut exporter = b
        .build()
        .map_err(|e| format!("OTLP exporter: {e}; check OTEL_EXPORTER_OTLP_ENDPOINT"))?;
    exporter.set_resource(
        &Resource::builder_empty()
            .with_service_name(cfg.service_name.clone())
            .build(),
    );
    let (tx, rx) = mpsc::channel(QUEUE);
    let sink = Arc::new(Sink {
        tx: tx.clone(),
        dropped: AtomicU64::new(0),
    });
    if !trace::set_sink(sink) {
        return Err("an OTLP exporter is already installed in this process".into());
    }
    let task = tokio::spawn(run(exporter, rx));
    Ok(OtlpExport { tx, task })
}

impl OtlpExport {
    /// Sends every span queued so far and waits for it (bounded by the
    /// exporter's own timeout).
    pub async fn flush(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Msg::Flush(ack)).await.is_ok() {
            let _ = done.await;
        }
    }

    /// Flushes, then stops the export task. Spans recorded afterwards stay in
    /// the store only.
    pub async fn shutdown(self) {
        self.flush().await;
        self.task.abort();
    }
}

async fn run(exporter: opentelemetry_otlp::SpanExporter, mut rx: mpsc::Receiver<Msg>) {
    let mut batch: Vec<SpanData> = Vec::new();
    let mut failures = 0u64;
    loop {
        // Wait for the first span (or a flush), then let the batch fill for
        // at most LINGER.
        let mut acks = Vec::new();
        match rx.recv().await {
            None => return,
            Some(Msg::Span(s)) => batch.push(*s),
            Some(Msg::Flush(a)) => acks.push(a),
        }
        let deadline = tokio::time::Instant::now() + LINGER;
        while acks.is_empty() && batch.len() < BATCH {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Msg::Span(s))) => batch.push(*s),
                Ok(Some(Msg::Flush(a))) => acks.push(a),
                Ok(None) | Err(_) => break,
            }
        }
        // A flush also takes everything already queued behind it.
        while let Ok(m) = rx.try_recv() {
            match m {
                Msg::Span(s) => batch.push(*s),
                Msg::Flush(a) => acks.push(a),
            }
        }
        for chunk in std::mem::take(&mut batch).chunks(BATCH) {
            if let Err(e) = exporter.export(chunk.to_vec()).await {
                failures += 1;
                if failures.is_power_of_two() {
                    tracing::warn!(
                        "tessera: OTLP export of {} span(s) failed ({failures} failure(s) so far): {e}; those spans stay in the store only",
                        chunk.len()
                    );
                }
            }
        }
        for a in acks {
            let _ = a.send(());
        }
    }
}

/// The caller's trace and span from a span's `trace_id` / `parent_span_id`
/// attributes (a `traceparent` it came with), when both are valid and non-zero.
fn caller_context(attrs: &Value) -> Option<(TraceId, SpanId)> {
    let t = TraceId::from_hex(attrs.get("trace_id")?.as_str()?).ok()?;
    let p = SpanId::from_hex(attrs.get("parent_span_id")?.as_str()?).ok()?;
    (t != TraceId::INVALID && p != SpanId::INVALID).then_some((t, p))
}

/// One recorded span as OpenTelemetry span data, with the ids derived from
/// tenant, session and step (or the caller's, for a call that sent a
/// `traceparent`).
pub fn to_span_data(tenant: &str, span: &Span) -> SpanData {
    let session_trace = TraceId::from_bytes(trace::otel_trace_id(tenant, &span.session));
    let span_id = SpanId::from_bytes(trace::otel_span_id(tenant, &span.session, &span.span_id));
    // A call that came with a W3C `traceparent` (kept as `trace_id` and
    // `parent_span_id`) continues the caller's trace under the caller's span; the
    // session's own trace id stays on it as `tessera.session.trace_id`.
    let caller = caller_context(&span.attributes);
    let (trace_id, parent_span_id, remote) = match caller {
        Some((t, p)) => (t, p, true),
        None => (
            session_trace,
            span.parent.as_deref().map_or(SpanId::INVALID, |p| {
                SpanId::from_bytes(trace::otel_span_id(tenant, &span.session, p))
            }),
            false,
        ),
    };
    let start = UNIX_EPOCH + Duration::from_millis(span.start_ms);
    let end = start + Duration::from_secs_f64((span.duration_ms / 1000.0).clamp(0.0, 1e9));
    let mut attributes = vec![
        KeyValue::new("gen_ai.conversation.id", span.session.clone()),
        KeyValue::new("gen_ai.operation.name", span.operation.clone()),
        KeyValue::new("tessera.tenant", tenant.to_string()),
        KeyValue::new("tessera.span_id", span.span_id.clone()),
    ];
    if remote {
        attributes.push(KeyValue::new(
            "tessera.session.trace_id",
            format!("{session_trace}"),
        ));
    }
    if span.cost != 0.0 {
        attributes.push(KeyValue::new("tessera.cost", span.cost));
    }
    if let Value::Object(m) = &span.attributes {
        for (k, v) in m {
            if matches!(
                k.as_str(),
                "gen_ai.conversation.id" | "gen_ai.operation.name"
            ) {
                continue;
            }
            let v = match v {
                Value::Null => continue,
                Value::Bool(b) => OtelValue::Bool(*b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => OtelValue::I64(i),
                    None => OtelValue::F64(n.as_f64().unwrap_or(f64::NAN)),
                },
                Value::String(s) => OtelValue::String(s.clone().into()),
                other => OtelValue::String(other.to_string().into()),
            };
            attributes.push(KeyValue::new(k.clone(), v));
        }
    }
    let failed = span
        .attributes
        .get("error.type")
        .and_then(Value::as_str)
        .map(str::to_string);
    SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id,
        parent_span_is_remote: remote,
        // The agent and the model are called across a process boundary.
        span_kind: match span.operation.as_str() {
            "invoke_agent" | "chat" | "text_completion" => SpanKind::Client,
            _ => SpanKind::Internal,
        },
        name: Cow::Owned(span.name.clone()),
        start_time: start,
        end_time: end.max(start),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: match failed {
            Some(e) => Status::error(e),
            None => Status::Unset,
        },
        instrumentation_scope: InstrumentationScope::builder("tessera")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}
