//! Traces: one span per step of a session (an invocation of the agent, a
//! tool call), with the OpenTelemetry GenAI attribute names
//! (`gen_ai.conversation.id` = session id, `gen_ai.agent.id`,
//! `gen_ai.tool.call.id`, `gen_ai.response.id`, `gen_ai.usage.*`), kept in
//! the store per session so that `tessera session trace ID` can print the tree
//! of steps with their durations and cost.
//!
//! Layout: the log `span_head` / `span` named by session id (spans in the
//! order they were recorded).

use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use tessera_store::Store;

use crate::error::AgentError;
use crate::events;

pub const KINDS_SPAN: (&str, &str) = ("span_head", "span");

/// One finished step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Span {
    pub session: String,
    pub span_id: String,
    /// The parent span's id; `None` for a step directly under the session.
    /// Tool calls without a parent are placed under the invocation whose
    /// time window holds their start.
    #[serde(default)]
    pub parent: Option<String>,
    pub name: String,
    /// `invoke_agent`, `execute_tool`, `chat`, ...
    pub operation: String,
    pub start_ms: u64,
    pub duration_ms: f64,
    /// Cost in the price table's currency.
    #[serde(default)]
    pub cost: f64,
    #[serde(default)]
    pub attributes: Value,
}

/// Where recorded spans also go once they are stored: an OTLP exporter, which
/// the server installs when OpenTelemetry export is configured. It must not
/// block (queue the span and return).
pub trait SpanSink: Send + Sync {
    fn send(&self, tenant: &str, span: &Span);
}

static SINK: OnceLock<Arc<dyn SpanSink>> = OnceLock::new();

/// Installs the process's span sink. Like OpenTelemetry's global tracer
/// provider there is one per process; returns false when one was already set.
pub fn set_sink(sink: Arc<dyn SpanSink>) -> bool {
    SINK.set(sink).is_ok()
}

/// Records a finished span (and hands it to the span sink, if one is set).
pub async fn record_span<S: Store>(store: &S, tenant: &str, span: Span) -> Result<u64, AgentError> {
    crate::sessions::check_id(&span.session)?;
    let v = serde_json::to_value(&span).map_err(|e| AgentError::invalid("span", e.to_string()))?;
    let at = span.start_ms;
    let seq = events::append(store, KINDS_SPAN, tenant, &span.session, v, at).await?;
    if let Some(sink) = SINK.get() {
        sink.send(tenant, &span);
    }
    Ok(seq)
}

/// The W3C trace id of a session's trace: every span of the session shares
/// it, so a tracing backend shows the session as one trace. Derived, not
/// stored: the same on every replica and after a restart.
pub fn otel_trace_id(tenant: &str, session: &str) -> [u8; 16] {
    derived_id(b"tessera-trace", &[tenant, session])
}

/// The W3C span id of one of a session's spans (by its `span_id`), so that a
/// child exported before or after its parent still points at it.
pub fn otel_span_id(tenant: &str, session: &str, span_id: &str) -> [u8; 8] {
    derived_id(b"tessera-span", &[tenant, session, span_id])
}

/// The first `N` bytes of SHA-256 over `domain`, then each part after a NUL;
/// never all zeroes (the invalid id).
fn derived_id<const N: usize>(domain: &[u8], parts: &[&str]) -> [u8; N] {
    let mut h = Sha256::new().chain_update(domain);
    for p in parts {
        h = h.chain_update(b"\0").chain_update(p.as_bytes());
    }
    let d = h.finalize();
    let mut id = [0u8; N];
    id.copy_from_slice(&d[..N]);
    if id == [0; N] {
        id[N - 1] = 1;
    }
    id
}

/// Every span of a session, in recorded order.
pub async fn spans<S: Store>(
    store: &S,
    tenant: &str,
    session: &str,
) -> Result<Vec<Span>, AgentError> {
    crate::sessions::check_id(session)?;
    let mut out = Vec::new();
    let mut after = 0;
    loop {
        let evs =
            events::read_log(store, KINDS_SPAN, tenant, session, after, events::MAX_READ).await?;
        let Some(last) = evs.last() else { break };
        after = last.offset;
        for e in evs {
            if let Ok(s) = serde_json::from_value::<Span>(e.payload) {
                out.push(s);
            }
        }
    }
    Ok(out)
}

/// A node of the trace tree.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Node {
    pub span: Span,
    pub children: Vec<Node>,
}

/// Builds the tree: explicit parents first, then tool calls under the
/// invocation that was running when they started. Siblings in start order.
pub fn tree(spans: &[Span]) -> Vec<Node> {
    let mut sorted: Vec<Span> = spans.to_vec();
    sorted.sort_by(|a, b| a.start_ms.cmp(&b.start_ms).then(a.span_id.cmp(&b.span_id)));
    let parent_of = |s: &Span| -> Option<String> {
        if let Some(p) = &s.parent {
            if sorted.iter().any(|x| &x.span_id == p) {
                return Some(p.clone());
            }
        }
        if s.operation == "invoke_agent" {
            return None;
        }
        sorted
            .iter()
            .filter(|x| x.operation == "invoke_agent" && x.span_id != s.span_id)
            .filter(|x| {
                x.start_ms <= s.start_ms && (s.start_ms as f64) <= x.start_ms as f64 + x.duration_ms
            })
            .map(|x| x.span_id.clone())
            .next_back()
    };
    let parents: Vec<Option<String>> = sorted.iter().map(parent_of).collect();
    fn build(
        i: Option<&str>,
        sorted: &[Span],
        parents: &[Option<String>],
        depth: usize,
    ) -> Vec<Node> {
        if depth > 64 {
            return Vec::new();
        }
        sorted
            .iter()
            .zip(parents)
            .filter(|(_, p)| p.as_deref() == i)
            .map(|(s, _)| Node {
                span: s.clone(),
                children: build(Some(&s.span_id), sorted, parents, depth + 1),
            })
            .collect()
    }
    build(None, &sorted, &parents, 0)
}

/// The tree as text: one line per step with its duration and cost.
pub fn render(session: &str, roots: &[Node]) -> String {
    fn total(n: &Node) -> f64 {
        n.span.cost + n.children.iter().map(total).sum::<f64>()
    }
    let cost: f64 = roots.iter().map(total).sum();
    let dur: f64 = roots.iter().map(|n| n.span.duration_ms).sum();
    let mut out = format!(
        "session {session}  {} steps  {:.1} ms in invocations  cost {:.6}\n",
        count(roots),
        dur,
        cost
    );
    fn count(ns: &[Node]) -> usize {
        ns.iter().map(|n| 1 + count(&n.children)).sum()
    }
    fn walk(ns: &[Node], prefix: &str, out: &mut String) {
        for (i, n) in ns.iter().enumerate() {
            let last = i + 1 == ns.len();
            let id = n
                .span
                .attributes
                .get("gen_ai.tool.call.id")
                .and_then(Value::as_str)
                .unwrap_or(&n.span.span_id);
            out.push_str(&format!(
                "{prefix}{} {}  [{id}]  {:.1} ms  cost {:.6}\n",
                if last { "└─" } else { "├─" },
                n.span.name,
                n.span.duration_ms,
                n.span.cost
            ));
            let p = format!("{prefix}{}", if last { "   " } else { "│  " });
            walk(&n.children, &p, out);
        }
    }
    walk(roots, "", &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    use tessera_sandbox::identity::hex;

    /// Exported ids must not change between versions: a backend joins spans
    /// recorded before and after an upgrade only if they do.
    #[test]
    fn otel_ids_are_stable_and_scoped_by_tenant_and_session() {
        assert_eq!(
            hex(&otel_trace_id("acme", "s-1")),
            "d4ef28e93683311047b938b3bb7da25f"
        );
        assert_eq!(
            hex(&otel_span_id("acme", "s-1", "inv1")),
            "de6d4284f59303a2"
        );
        assert_ne!(otel_trace_id("acme", "s-1"), otel_trace_id("acme2", "s-1"));
        // The separator keeps ("a", "bc") and ("ab", "c") apart.
        assert_ne!(otel_trace_id("a", "bc"), otel_trace_id("ab", "c"));
        assert_ne!(
            otel_span_id("acme", "s-1", "x"),
            otel_span_id("acme", "s-2", "x")
        );
    }
}
