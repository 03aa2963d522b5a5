//! The forward pipeline: a request is accepted, admitted, routed, sent (with
//! retries before the first byte) and its reply relayed and metered.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use serde_json::{Value, json};

use crate::route::{EndpointLoad, RouteRequest, text_blocks};

use super::metrics::observe;
use super::pool::{InFlight, Pool};
use super::{InferenceCaller, InferenceGateway, Refusal, Usage, now_ms, openai_error, too_many};

/// The block hashes the gateway's prefix index uses for a request body (chat
/// messages or a completion prompt): what a KV-event adapter publishes.
pub fn request_blocks(body: &Value) -> Vec<u64> {
    text_blocks(&prompt_text(body))
}

/// A request accepted for forwarding: who sent it, the pool that serves its
/// model, what it asks, and when it came in.
struct Call {
    who: InferenceCaller,
    path: &'static str,
    model: String,
    pool: Arc<Pool>,
    /// The request as engines get it (with `stream_options` set when streaming).
    request: Value,
    stream: bool,
    /// The caller asked for the usage chunk (else it is metered and dropped).
    client_wants_usage: bool,
    /// For routing: the prompt's block hashes and its tokens (estimated).
    blocks: Vec<u64>,
    prompt_tokens: u32,
    t0: Instant,
    started_ms: u64,
}

/// The attempts at a request so far.
struct Attempts {
    /// Slots tried (a bitmask).
    tried: u64,
    last_err: String,
    /// Time spent waiting on engines (excluded from the gateway's overhead).
    engine_wait: Duration,
    /// The admission grant is not used up yet (the first routing uses it).
    granted: bool,
}

impl Attempts {
    /// Notes an attempt sent at `sent` that failed, and why; returns why.
    fn failed(&mut self, sent: Instant, why: String) -> &str {
        self.engine_wait += sent.elapsed();
        self.last_err = why;
        &self.last_err
    }
}

/// The endpoint one attempt is routed to.
struct Routed {
    slot: usize,
    url: String,
    uncached: u64,
    pool_name: String,
}

impl InferenceGateway {
    /// `POST /v1/chat/completions` (`path` = `/v1/chat/completions`) and
    /// `POST /v1/completions`. The steps: `accept`, `admit` (see `queue`), then
    /// `send_with_retries` (`route`, `send`, and `reply_whole` or a `Relay`).
    pub async fn forward(&self, who: InferenceCaller, path: &'static str, body: Bytes) -> Response {
        let call = match self.accept(who, path, &body).await {
            Ok(call) => call,
            Err(r) => return r,
        };
        if let Err(r) = self.admit(&call.pool, &call.who).await {
            return r;
        }
        let body = match serde_json::to_vec(&call.request) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                return openai_error(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string());
            }
        };
        self.send_with_retries(call, body).await
    }

    /// Accepts a request: a JSON object naming a model that a pool serves, from a
    /// caller who may spend. A streaming request asks the engine for the usage
    /// chunk, which is what is metered.
    async fn accept(
        &self,
        who: InferenceCaller,
        path: &'static str,
        body: &Bytes,
    ) -> Result<Call, Response> {
        let t0 = Instant::now();
        let started_ms = now_ms();
        let mut v = parse_request(body)
            .map_err(|why| openai_error(StatusCode::BAD_REQUEST, "invalid_request_error", why))?;
        let Some(model) = v.get("model").and_then(Value::as_str).map(str::to_string) else {
            return Err(openai_error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "model: missing; name a model from GET /v1/models",
            ));
        };
        let Some(pool) = self.pool_for_model(&model) else {
            return Err(openai_error(
                StatusCode::NOT_FOUND,
                "model_not_found",
                format!("model {model:?} is served by no pool; see GET /v1/models"),
            ));
        };
        if let Err(r) = self.sink.check(&who).await {
            return Err(match r {
                Refusal::Budget(why) => openai_error(
                    StatusCode::PAYMENT_REQUIRED,
                    "budget_exceeded",
                    format!("budget exceeded: {why}"),
                ),
                Refusal::Quota(why) => too_many(format!("quota exceeded: {why}"), 60),
            });
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
        Ok(Call {
            who,
            path,
            model,
            pool,
            request: v,
            stream,
            client_wants_usage,
            blocks,
            prompt_tokens,
            t0,
            started_ms,
        })
    }

    /// Sends an admitted request (`body`) to the endpoint the router picks, and
    /// on a failure before the first byte to another, up to `retries` more
    /// times; the first answer is passed on, whole or streamed. 502 when no
    /// endpoint answers.
    async fn send_with_retries(&self, call: Call, body: Bytes) -> Response {
        let mut a = Attempts {
            tried: 0,
            last_err: String::new(),
            engine_wait: Duration::ZERO,
            granted: true,
        };
        for _attempt in 0..=self.cfg.retries {
            let Some(to) = self.route(&call, &mut a) else {
                break;
            };
            a.tried |= 1 << to.slot;
            let guard = InFlight {
                pool: call.pool.clone(),
                slot: to.slot,
                uncached: to.uncached,
            };
            let (sent, resp) = self.send(&call, &to.url, &body).await;
            let resp = match resp {
                Ok(r) => r,
                Err(why) => {
                    self.mark_down(&call.pool, to.slot, &to.url, a.failed(sent, why));
                    continue;
                }
            };
            let status = resp.status();
            let usage = self.usage_for(&call, to.pool_name, &to.url);
            if call.stream && status.is_success() {
                let relay = Relay {
                    gw: self.clone(),
                    pool: call.pool,
                    who: call.who,
                    slot: to.slot,
                    url: to.url,
                    guard,
                    sent,
                    usage,
                    client_wants_usage: call.client_wants_usage,
                    t0: call.t0,
                    engine_wait: a.engine_wait,
                };
                return relay.respond(resp);
            }
            let bytes = match resp.bytes().await {
                Ok(b) => b,
                Err(e) => {
                    let why = format!("{}: {e}", to.url);
                    self.mark_down(&call.pool, to.slot, &to.url, a.failed(sent, why));
                    continue;
                }
            };
            a.engine_wait += sent.elapsed();
            drop(guard);
            return self.reply_whole(call, to.slot, status, bytes, usage, a.engine_wait);
        }
        if a.granted {
            if let Ok(mut g) = call.pool.inner.lock() {
                g.granted = g.granted.saturating_sub(1);
                g.release_and_grant();
            }
        }
        openai_error(
            StatusCode::BAD_GATEWAY,
            "engine_failed",
            format!("no endpoint of the pool answered: {}", a.last_err),
        )
    }

    /// Routes one attempt among the endpoints in rotation not tried yet,
    /// preferring those below their in-flight limit (when all are over it, the
    /// least bad), and charges the pick to its endpoint. `None` when there is
    /// none (the request's room goes to the next in the queue).
    fn route(&self, call: &Call, a: &mut Attempts) -> Option<Routed> {
        let Ok(mut g) = call.pool.inner.lock() else {
            return None;
        };
        if a.granted {
            g.granted = g.granted.saturating_sub(1);
            a.granted = false;
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
                l.healthy = g.healthy(s, now) && a.tried & (1 << i) == 0;
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
            tenant: &call.who.tenant,
            session: call.who.session.as_deref(),
            blocks: &call.blocks,
            block_tokens: 16,
            prompt_tokens: call.prompt_tokens,
            now_ms: now_ms(),
        };
        let d = g
            .router
            .pick(&rr, &under)
            .or_else(|| g.router.pick(&rr, &loads));
        let Some(d) = d else {
            g.release_and_grant();
            return None;
        };
        g.router.routed(&rr, &d);
        g.in_flight += 1;
        let s = &mut g.slots[d.endpoint];
        s.load.outstanding += 1;
        s.load.pending_prefill += d.uncached_tokens;
        Some(Routed {
            slot: d.endpoint,
            url: s.url.clone(),
            uncached: d.uncached_tokens,
            pool_name: g.spec.name.clone(),
        })
    }

    /// Sends `body` to the engine at `url`: when it was sent, and the engine's
    /// response, or why there is none to pass on (no answer in time, a server
    /// error).
    async fn send(
        &self,
        call: &Call,
        url: &str,
        body: &Bytes,
    ) -> (Instant, Result<reqwest::Response, String>) {
        let mut req = self
            .client
            .post(format!("{url}{}", call.path))
            .header(header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        if let Some(tp) = &call.who.traceparent {
            req = req.header("traceparent", tp);
        }
        let sent = Instant::now();
        let resp = match tokio::time::timeout(self.cfg.engine_timeout, req.send()).await {
            Ok(Ok(r)) if !r.status().is_server_error() => Ok(r),
            Ok(Ok(r)) => Err(format!("{url} answered {}", r.status())),
            Ok(Err(e)) => Err(format!("{url}: {e}")),
            Err(_) => Err(format!("{url}: no answer in {:?}", self.cfg.engine_timeout)),
        };
        (sent, resp)
    }

    /// The usage record of a request `url` answers, filled in from its reply.
    fn usage_for(&self, call: &Call, pool_name: String, url: &str) -> Usage {
        Usage {
            pool: pool_name,
            model: call.model.clone(),
            request_id: format!(
                "gw-{:x}-{}",
                self.boot,
                self.ids.fetch_add(1, Ordering::Relaxed)
            ),
            endpoint: url.to_string(),
            started_ms: call.started_ms,
            ..Usage::default()
        }
    }

    /// Passes on a whole reply (not streamed, or an error) as the engine gave it;
    /// a successful one is counted in the pool's figures and metered.
    fn reply_whole(
        &self,
        call: Call,
        slot: usize,
        status: reqwest::StatusCode,
        bytes: Bytes,
        mut usage: Usage,
        engine_wait: Duration,
    ) -> Response {
        if status.is_success() {
            if let Ok(v) = serde_json::from_slice::<Value>(&bytes) {
                usage_of(&v, &mut usage);
            }
        }
        let mut r = Response::new(Body::from(bytes));
        *r.status_mut() = StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        // The reply leaves now; metering (a store write) must not hold it.
        usage.ttft_ms = ms(call.t0);
        usage.total_ms = usage.ttft_ms;
        usage.overhead_us = overhead_us(call.t0, engine_wait);
        if status.is_success() {
            observe(&call.pool, slot, &usage);
            let sink = self.sink.clone();
            let who = call.who;
            tokio::spawn(async move { sink.record(&who, usage).await });
        }
        r
    }
}

/// The request body as JSON; it must be an object. The error says why not.
fn parse_request(body: &Bytes) -> Result<Value, String> {
    match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err("the body must be a JSON object".into()),
        Err(e) => Err(format!("the body is not valid JSON: {e}")),
    }
}

/// A streamed reply on its way to the caller: chunks pass through as they
/// come; usage is metered from the usage chunk; an engine that dies
/// mid-stream ends the stream with an error event and leaves rotation.
struct Relay {
    gw: InferenceGateway,
    pool: Arc<Pool>,
    who: InferenceCaller,
    slot: usize,
    url: String,
    /// The request's place in the pool, given back when the relay ends.
    guard: InFlight,
    sent: Instant,
    usage: Usage,
    client_wants_usage: bool,
    t0: Instant,
    /// Time spent on engines before this one answered.
    engine_wait: Duration,
}

/// What a relay sends the caller.
type Chunks = tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>;

impl Relay {
    /// Starts relaying the engine's `resp`; the caller's streamed response.
    fn respond(self, resp: reqwest::Response) -> Response {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        tokio::spawn(self.run(resp, tx));
        let stream =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|x| (x, rx)) },
            );
        let mut r = Response::new(Body::from_stream(stream));
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        r.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        r
    }

    /// Relays until the engine's stream ends, breaks or the caller goes; then
    /// counts and meters the request.
    async fn run(self, mut resp: reqwest::Response, tx: Chunks) {
        let Relay {
            gw,
            pool,
            who,
            slot,
            url,
            guard: _guard,
            sent,
            mut usage,
            client_wants_usage,
            t0,
            engine_wait,
        } = self;
        let mut line = Vec::new();
        // Nothing forwarded yet: the engine's time runs until the chunk
        // that completes the first line to forward.
        let mut first = true;
        let mut failed = None;
        loop {
            match resp.chunk().await {
                Ok(Some(c)) => {
                    let engine_time = sent.elapsed();
                    let out = sse_lines(&mut line, &c, &mut usage, client_wants_usage);
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
        if let Some(e) = &failed {
            gw.mark_down(&pool, slot, &url, &format!("the stream broke: {e}"));
            let ev = json!({"error": {"message": format!("the engine {url} failed mid-stream: {e}"), "type": "engine_failed", "code": "engine_failed"}});
            let _ = tx.send(Ok(Bytes::from(format!("data: {ev}\n\n")))).await;
        }
        usage.total_ms = ms(t0);
        if failed.is_none() {
            observe(&pool, slot, &usage);
        }
        gw.sink.record(&who, usage).await;
    }
}

/// Adds chunk `c` to the SSE `line` being read, and returns the complete lines
/// to forward (see [`scan_sse_line`]); an incomplete last line stays in `line`.
fn sse_lines(line: &mut Vec<u8>, c: &[u8], usage: &mut Usage, client_wants_usage: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(c.len());
    for &b in c {
        line.push(b);
        if b == b'\n' {
            let keep = scan_sse_line(line, usage, client_wants_usage);
            if keep {
                out.extend_from_slice(line);
            }
            line.clear();
        }
    }
    out
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
