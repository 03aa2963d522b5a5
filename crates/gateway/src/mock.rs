//! A small OpenAI-compatible engine for tests and benchmarks (no GPU engine
//! can run here): `/v1/chat/completions` and `/v1/completions`, plain and
//! streaming (SSE, `stream_options.include_usage`), the Responses API
//! (`/v1/responses`, plain and streaming, with its own usage field names), and
//! vLLM-style Prometheus gauges on `/metrics`. Knobs make it slow, or die in the middle of a stream.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// How a mock engine behaves.
#[derive(Debug, Default)]
pub struct MockKnobs {
    /// Tokens (chunks) per answer (at least 1).
    pub tokens: AtomicUsize,
    /// Delay before the first chunk and between chunks, ms.
    pub delay_ms: AtomicU64,
    /// End streams abruptly after this many chunks (0: never).
    pub die_after: AtomicUsize,
    /// Answer every request with 503.
    pub down: AtomicBool,
    /// No vLLM gauges: `/metrics` is a 404 (as on engines other than vLLM); the
    /// engine's health is on `/health`.
    pub no_metrics: AtomicBool,
    /// Requests served.
    pub requests: AtomicU64,
    /// Requests in progress (reported as `vllm:num_requests_running`).
    pub running: AtomicU64,
}

/// A running mock engine.
#[derive(Debug, Clone)]
pub struct MockEngine {
    pub addr: SocketAddr,
    pub url: String,
    pub knobs: Arc<MockKnobs>,
}

/// Starts a mock engine on 127.0.0.1 (a free port).
pub async fn start() -> std::io::Result<MockEngine> {
    let knobs = Arc::new(MockKnobs {
        tokens: AtomicUsize::new(4),
        ..MockKnobs::default()
    });
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(chat))
        .route("/v1/responses", post(responses))
        .route("/metrics", get(metrics))
        .route("/health", get(health))
        .with_state(knobs.clone());
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = l.local_addr()?;
    // Stream chunks leave at once (no Nagle delay on small writes).
    use axum::serve::ListenerExt;
    let l = l.tap_io(|t| {
        let _ = t.set_nodelay(true);
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Ok(MockEngine {
        addr,
        url: format!("http://{addr}"),
        knobs,
    })
}

async fn health(State(k): State<Arc<MockKnobs>>) -> Response {
    if k.down.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    "ok".into_response()
}

async fn metrics(State(k): State<Arc<MockKnobs>>) -> Response {
    if k.down.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    if k.no_metrics.load(Ordering::Relaxed) {
        return StatusCode::NOT_FOUND.into_response();
    }
    let r = k.running.load(Ordering::Relaxed);
    format!(
        "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{model_name=\"mock\"}} {r}\nvllm:num_requests_waiting{{model_name=\"mock\"}} 0\nvllm:kv_cache_usage_perc{{model_name=\"mock\"}} {:.3}\n",
        (r as f64 / 64.0).min(1.0)
    )
    .into_response()
}

struct Running(Arc<MockKnobs>);
impl Drop for Running {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn chat(State(k): State<Arc<MockKnobs>>, body: Bytes) -> Response {
    if k.down.load(Ordering::Relaxed) {
        return (StatusCode::SERVICE_UNAVAILABLE, "down").into_response();
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    k.requests.fetch_add(1, Ordering::Relaxed);
    k.running.fetch_add(1, Ordering::Relaxed);
    let run = Running(k.clone());
    let model = v
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("mock")
        .to_string();
    let chat = v.get("messages").is_some();
    let prompt_tokens = (body.len() / 4) as u64;
    let n = k.tokens.load(Ordering::Relaxed).max(1);
    let delay = Duration::from_millis(k.delay_ms.load(Ordering::Relaxed));
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n as u64,
        "prompt_tokens_details": {"cached_tokens": prompt_tokens / 2}});
    let object = if chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    if !v.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        let text = "ok ".repeat(n);
        let choice = if chat {
            json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"})
        } else {
            json!({"index": 0, "text": text, "finish_reason": "stop"})
        };
        drop(run);
        return axum::Json(
            json!({"id": "mock-1", "object": object, "created": 0, "model": model,
            "choices": [choice], "usage": usage}),
        )
        .into_response();
    }
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let die_after = k.die_after.load(Ordering::Relaxed);
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(8);
    tokio::spawn(async move {
        let _run = run;
        let object = if chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        };
        for i in 0..n {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            if die_after > 0 && i >= die_after {
                let _ = tx.send(Err(std::io::Error::other("engine died"))).await;
                return;
            }
            let choice = if chat {
                json!({"index": 0, "delta": {"content": "ok "}, "finish_reason": if i + 1 == n { json!("stop") } else { Value::Null }})
            } else {
                json!({"index": 0, "text": "ok ", "finish_reason": if i + 1 == n { json!("stop") } else { Value::Null }})
            };
            let c = json!({"id": "mock-1", "object": object, "created": 0, "model": model, "choices": [choice]});
            if tx
                .send(Ok(Bytes::from(format!("data: {c}\n\n"))))
                .await
                .is_err()
            {
                return;
            }
        }
        if include_usage {
            let c = json!({"id": "mock-1", "object": object, "created": 0, "model": model, "choices": [], "usage": usage});
            let _ = tx.send(Ok(Bytes::from(format!("data: {c}\n\n")))).await;
        }
        let _ = tx.send(Ok(Bytes::from_static(b"data: [DONE]\n\n"))).await;
    });
    let s =
        futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|x| (x, rx)) });
    let mut r = Response::new(Body::from_stream(s));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    r
}

/// The Responses API: `usage` as `input_tokens` / `output_tokens` (with details),
/// answered whole or streamed as `response.*` events, the usage in
/// `response.completed`.
async fn responses(State(k): State<Arc<MockKnobs>>, body: Bytes) -> Response {
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return (StatusCode::BAD_REQUEST, "bad json").into_response();
    };
    k.requests.fetch_add(1, Ordering::Relaxed);
    let model = v.get("model").and_then(Value::as_str).unwrap_or("mock");
    let input = (body.len() / 4) as u64;
    let n = k.tokens.load(Ordering::Relaxed).max(1);
    let text = "ok ".repeat(n);
    let usage = json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": input / 2},
        "output_tokens": n, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": input + n as u64});
    let done = json!({"id": "resp_mock", "object": "response", "status": "completed", "model": model,
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
        "usage": usage});
    if !v.get("stream").and_then(Value::as_bool).unwrap_or(false) {
        return axum::Json(done).into_response();
    }
    let mut out = String::new();
    out.push_str(&format!(
        "event: response.created\ndata: {}\n\n",
        json!({"type": "response.created", "response": {"id": "resp_mock", "status": "in_progress"}})
    ));
    for _ in 0..n {
        out.push_str(&format!(
            "event: response.output_text.delta\ndata: {}\n\n",
            json!({"type": "response.output_text.delta", "delta": "ok "})
        ));
    }
    out.push_str(&format!(
        "event: response.completed\ndata: {}\n\n",
        json!({"type": "response.completed", "response": done})
    ));
    let mut r = Response::new(Body::from(out));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/event-stream"),
    );
    r
}
