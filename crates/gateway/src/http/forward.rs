//! The forward pipeline: a request is accepted, admitted, routed, sent (with
//! retries before the first byte) and its reply relayed and metered.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};
use tokio::sync::oneshot;

use crate::route::{EndpointLoad, RouteRequest, text_blocks};

use super::metrics::observe;
use super::pool::InFlight;
use super::queue::Ticket;
use super::{Caller, Gateway, Refusal, Usage, now_ms, openai_error, too_many};

/// The block hashes the gateway's prefix index uses for a request body (chat
/// messages or a completion prompt): what a KV-event adapter publishes.
pub fn request_blocks(body: &Value) -> Vec<u64> {
    text_blocks(&prompt_text(body))
}

impl Gateway {
    /// `POST /v1/chat/completions` (`path` = `/v1/chat/completions`) and
    /// `POST /v1/completions`.
    pub async fn forward(&self, who: Caller, path: &'static str, body: Bytes) -> Response {
        let t0 = Instant::now();
        let started_ms = now_ms();
        let mut v: Value = match serde_json::from_slice(&body) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    "the body must be a JSON object",
                );
            }
            Err(e) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    "invalid_request_error",
                    format!("the body is not valid JSON: {e}"),
                );
            }
        };
        let Some(model) = v.get("model").and_then(Value::as_str).map(str::to_string) else {
            return openai_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "model: missing; name a model from GET /v1/models",
            );
        };
        let Some(pool) = self.pool_for_model(&model) else {
            return openai_error(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model {model:?} is served by no pool; see GET /v1/models"),
            );
        };
        if let Err(r) = self.sink.check(&who).await {
            return match r {
                Refusal::Budget(why) => openai_error(
                    StatusCode::PAYMENT_REQUIRED,
                    "budget_exceeded",
                    format!("budget exceeded: {why}"),
                ),
                Refusal::Quota(why) => too_many(format!("quota exceeded: {why}"), 60),
            };
        }
        let stream = v.get("stream").and_then(Value::as_bool).unwrap_or(false);
        let client_wants_usage = v
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if stream {
            // Usage is metered from the stream's last chunk; ask for it.
            v["stream_options"] = json!({"include_usage": true});
        }
        let text = prompt_text(&v);
        let blocks = text_blocks(&text);
        let prompt_tokens = (text.len() / 4) as u32;
        // Admission: room now, or a place in the fair queue.
        let mut queued_ticket = None;
        {
            let Ok(mut g) = pool.inner.lock() else {
                return openai_error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "pool state poisoned",
                );
            };
            let now = Instant::now();
            if g.capacity(now) == 0 {
                return openai_error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("pool {:?} has no healthy endpoint", g.spec.name),
                );
            }
            if g.queue.len == 0 && g.has_room(now) {
                g.granted += 1;
            } else if g.queue.len >= g.spec.max_queue {
                let cap = g.capacity(now).max(1) as u64;
                let wait = (g.queue.len as u64).div_ceil(cap).max(1);
                return too_many(
                    format!(
                        "pool {:?} is saturated: {} requests in flight, {} waiting at the gateway",
                        g.spec.name, g.in_flight, g.queue.len
                    ),
                    wait,
                );
            } else {
                let (tx, rx) = oneshot::channel();
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                g.queue.push(
                    &who.tenant,
                    Ticket {
                        id,
                        priority: who.priority,
                        tx,
                    },
                );
                queued_ticket = Some((id, rx, Duration::from_millis(g.spec.queue_timeout_ms)));
            }
        }
        if let Some((id, rx, timeout)) = queued_ticket {
            match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(())) => {}
                _ => {
                    let still_queued = pool
                        .inner
                        .lock()
                        .map(|mut g| g.queue.remove(&who.tenant, id))
                        .unwrap_or(true);
                    if still_queued {
                        return too_many(
                            format!(
                                "waited {} ms at the gateway for room in the pool",
                                timeout.as_millis()
                            ),
                            2,
                        );
                    }
                    // Granted as the wait ended: go on.
                }
            }
        }
        let body = match serde_json::to_vec(&v) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                return openai_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string());
            }
        };
        let mut tried: u64 = 0;
        let mut last_err = String::new();
        // Time spent waiting on engines (excluded from the gateway's overhead).
        let mut engine_wait = Duration::ZERO;
        let mut granted = true;
        for _attempt in 0..=self.cfg.retries {
            // Route.
            let (slot, url, uncached, pool_name) = {
                let Ok(mut g) = pool.inner.lock() else {
                    break;
                };
                if granted {
                    g.granted = g.granted.saturating_sub(1);
                    granted = false;
                }
                let now = Instant::now();
                let limit = g.spec.max_in_flight;
                let loads: Vec<EndpointLoad> = g
                    .slots
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let mut l = s.load.clone();
                        l.weight = s.weight;
                        l.healthy = g.healthy(s, now) && tried & (1 << i) == 0;
                        l
                    })
                    .collect();
                // Prefer endpoints below their limit; all are over: least bad.
                let mut under = loads.clone();
                for (l, s) in under.iter_mut().zip(&g.slots) {
                    if l.outstanding >= s.weight * limit {
                        l.healthy = false;
                    }
                }
                let rr = RouteRequest {
                    tenant: &who.tenant,
                    session: who.session.as_deref(),
                    blocks: &blocks,
                    block_tokens: 16,
                    prompt_tokens,
                    now_ms: now_ms(),
                };
                let d = g
                    .router
                    .pick(&rr, &under)
                    .or_else(|| g.router.pick(&rr, &loads));
                let Some(d) = d else {
                    g.release_and_grant();
                    break;
                };
                g.router.routed(&rr, &d);
                g.in_flight += 1;
                let s = &mut g.slots[d.endpoint];
                s.load.outstanding += 1;
                s.load.pending_prefill += d.uncached_tokens;
                (
                    d.endpoint,
                    s.url.clone(),
                    d.uncached_tokens,
                    g.spec.name.clone(),
                )
            };
            tried |= 1 << slot;
            let guard = InFlight {
                pool: pool.clone(),
                slot,
                uncached,
            };
            let mut req = self
                .client
                .post(format!("{url}{path}"))
                .header(header::CONTENT_TYPE, "application/json")
                .body(body.clone());
            if let Some(tp) = &who.traceparent {
                req = req.header("traceparent", tp);
            }
            let sent = Instant::now();
            let resp = tokio::time::timeout(self.cfg.engine_timeout, req.send()).await;
            let resp = match resp {
                Ok(Ok(r)) if !r.status().is_server_error() => r,
                Ok(Ok(r)) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url} answered {}", r.status());
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
                Ok(Err(e)) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url}: {e}");
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
                Err(_) => {
                    engine_wait += sent.elapsed();
                    last_err = format!("{url}: no answer in {:?}", self.cfg.engine_timeout);
                    self.mark_down(&pool, slot, &url, &last_err);
                    continue;
                }
            };
            let status = resp.status();
            let mut usage = Usage {
                pool: pool_name,
                model: model.clone(),
                request_id: format!(
                    "gw-{:x}-{}",
                    self.boot,
                    self.ids.fetch_add(1, Ordering::Relaxed)
                ),
                endpoint: url.clone(),
                started_ms,
                ..Usage::default()
            };
            if !stream || !status.is_success() {
                let bytes = match resp.bytes().await {
                    Ok(b) => b,
                    Err(e) => {
                        engine_wait += sent.elapsed();
                        last_err = format!("{url}: {e}");
                        self.mark_down(&pool, slot, &url, &last_err);
                        continue;
                    }
                };
                engine_wait += sent.elapsed();
                drop(guard);
                if status.is_success() {
                    if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                        usage_of(&v, &mut usage);
                    }
                }
                let mut r = Response::new(Body::from(bytes));
                *r.status_mut() =
                    StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                );
                // The reply leaves now; metering (a store write) must not hold it.
                usage.ttft_ms = ms(t0);
                usage.total_ms = usage.ttft_ms;
                usage.overhead_us = overhead_us(t0, engine_wait);
                if status.is_success() {
                    observe(&pool, slot, &usage);
                    let sink = self.sink.clone();
                    tokio::spawn(async move { sink.record(&who, usage).await });
                }
                return r;
            }
            // Streaming: pass chunks through as they come; meter from the usage
            // chunk; an engine that dies mid-stream ends the stream with an
            // error event and leaves rotation.
            let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
            let gw = self.clone();
            let pool2 = pool.clone();
            let who2 = who.clone();
            tokio::spawn(async move {
                let _guard = guard;
                let mut resp = resp;
                let mut line = Vec::new();
                // Nothing forwarded yet: the engine's time runs until the chunk
                // that completes the first line to forward.
                let mut first = true;
                let mut failed = None;
                loop {
                    match resp.chunk().await {
                        Ok(Some(c)) => {
                            let engine_time = sent.elapsed();
                            let mut out = Vec::with_capacity(c.len());
                            for &b in c.iter() {
                                line.push(b);
                                if b == b'\n' {
                                    let keep = scan_sse_line(&line, &mut usage, client_wants_usage);
                                    if keep {
                                        out.extend_from_slice(&line);
                                    }
                                    line.clear();
                                }
                            }
                            if out.is_empty() {
                                continue;
                            }
                            if tx.send(Ok(Bytes::from(out))).await.is_err() {
                                break; // client gone
                            }
                            if first {
                                first = false;
                                usage.ttft_ms = ms(t0);
                                usage.overhead_us = overhead_us(t0, engine_wait + engine_time);
                            }
                        }
                        Ok(None) => {
                            if !line.is_empty() {
                                let _ = tx.send(Ok(Bytes::from(std::mem::take(&mut line)))).await;
                            }
                            break;
                        }
                        Err(e) => {
                            failed = Some(e.to_string());
                            break;
                        }
                    }
                }
                let failed_stream = failed.clone();
                if let Some(e) = failed {
                    gw.mark_down(&pool2, slot, &url, &format!("the stream broke: {e}"));
                    let ev = json!({"error": {"message": format!("the engine {url} failed mid-stream: {e}"), "type": "engine_failed", "code": "engine_failed"}});
                    let _ = tx.send(Ok(Bytes::from(format!("data: {ev}\n\n")))).await;
                }
                usage.total_ms = ms(t0);
                if failed_stream.is_none() {
                    observe(&pool2, slot, &usage);
                }
                gw.sink.record(&who2, usage).await;
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|x| (x, rx))
            });
            let mut r = Response::new(Body::from_stream(stream));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            r.headers_mut()
                .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            return r;
        }
        if granted {
            if let Ok(mut g) = pool.inner.lock() {
                g.granted = g.granted.saturating_sub(1);
                g.release_and_grant();
            }
        }
        openai_error(
            StatusCode::BAD_GATEWAY,
            "engine_failed",
            format!("no endpoint of the pool answered: {last_err}"),
        )
    }
}

/// The text a prompt's prefix is hashed over: chat messages (role and content)
/// in order, or the completion prompt.
fn prompt_text(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(ms) = v.get("messages").and_then(Value::as_array) {
        for m in ms {
            out.extend_from_slice(
                m.get("role")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .as_bytes(),
            );
            out.push(0);
            match m.get("content") {
                Some(Value::String(s)) => out.extend_from_slice(s.as_bytes()),
                Some(other) => out.extend_from_slice(other.to_string().as_bytes()),
                None => {}
            }
            out.push(0);
        }
    } else if let Some(p) = v.get("prompt") {
        match p {
            Value::String(s) => out.extend_from_slice(s.as_bytes()),
            other => out.extend_from_slice(other.to_string().as_bytes()),
        }
    }
    out
}

/// Picks up an engine reply's id and token usage, in either of OpenAI's shapes:
/// chat, completions and embeddings (`prompt_tokens`, `completion_tokens`), and the
/// Responses API (`input_tokens`, `output_tokens`; in a stream, inside the
/// `response.completed` event's `response`). A reply in the Responses shape must
/// not meter as 0 tokens: budgets and prices are charged from these figures.
fn usage_of(v: &Value, u: &mut Usage) {
    let id = v
        .get("id")
        .or_else(|| v.pointer("/response/id"))
        .and_then(Value::as_str);
    if let Some(id) = id {
        if u.response_id.is_empty() && id.len() <= 256 {
            u.response_id = id.to_string();
        }
    }
    let Some(x) = v
        .get("usage")
        .or_else(|| v.pointer("/response/usage"))
        .filter(|x| x.is_object())
    else {
        return;
    };
    let n = |p: &str| x.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    u.prompt_tokens = n("/prompt_tokens").max(n("/input_tokens"));
    u.completion_tokens = n("/completion_tokens").max(n("/output_tokens"));
    u.cached_tokens =
        n("/prompt_tokens_details/cached_tokens").max(n("/input_tokens_details/cached_tokens"));
    u.reasoning_tokens = n("/completion_tokens_details/reasoning_tokens")
        .max(n("/output_tokens_details/reasoning_tokens"));
}

/// One SSE line from the engine: picks up usage; drops the usage-only chunk
/// when the client did not ask for it. Returns whether to forward the line.
fn scan_sse_line(line: &[u8], usage: &mut Usage, client_wants_usage: bool) -> bool {
    let Some(rest) = line.strip_prefix(b"data:") else {
        return true;
    };
    let rest = rest.trim_ascii();
    if rest.is_empty() || rest == b"[DONE]" || !rest.windows(7).any(|w| w == b"\"usage\"") {
        return true;
    }
    let Ok(v) = serde_json::from_slice::<Value>(rest) else {
        return true;
    };
    usage_of(&v, usage);
    let usage_only = v
        .get("choices")
        .and_then(Value::as_array)
        .is_some_and(|c| c.is_empty());
    client_wants_usage || !usage_only
}

/// Request in to now, less the time spent waiting on engines, in µs.
fn overhead_us(t0: Instant, engine_wait: Duration) -> u64 {
    t0.elapsed().saturating_sub(engine_wait).as_micros() as u64
}

fn ms(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_in_the_chat_and_the_responses_shapes() {
        let mut u = Usage::default();
        usage_of(
            &serde_json::json!({"id": "chatcmpl-1", "usage": {"prompt_tokens": 10, "completion_tokens": 3,
                "prompt_tokens_details": {"cached_tokens": 4}}}),
            &mut u,
        );
        assert_eq!(
            (u.prompt_tokens, u.completion_tokens, u.cached_tokens),
            (10, 3, 4)
        );
        assert_eq!(u.response_id, "chatcmpl-1");
        // The Responses API, answered whole.
        let mut u = Usage::default();
        usage_of(
            &serde_json::json!({"id": "resp_1", "object": "response", "usage": {"input_tokens": 20,
                "input_tokens_details": {"cached_tokens": 8}, "output_tokens": 5,
                "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 25}}),
            &mut u,
        );
        assert_eq!(
            (
                u.prompt_tokens,
                u.completion_tokens,
                u.cached_tokens,
                u.reasoning_tokens
            ),
            (20, 5, 8, 2)
        );
        assert_eq!(u.response_id, "resp_1");
        // And streamed: the usage comes in the `response.completed` event.
        let mut u = Usage::default();
        let line = br#"data: {"type": "response.completed", "response": {"id": "resp_2", "usage": {"input_tokens": 7, "output_tokens": 9}}}"#;
        assert!(scan_sse_line(line, &mut u, false), "the event is forwarded");
        assert_eq!((u.prompt_tokens, u.completion_tokens), (7, 9));
        assert_eq!(u.response_id, "resp_2");
    }
}
