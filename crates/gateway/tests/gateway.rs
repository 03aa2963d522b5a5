//! The gateway against mock engines (small OpenAI-compatible HTTP servers with
//! vLLM-style metrics): plain and streaming calls, usage metering, an engine
//! dying mid-stream, retries before the first byte, overload and budgets.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::http::HeaderMap;
use axum::routing::post;
use serde_json::{Value, json};
use tessera_gateway::http::{
    EndpointSpec, InferenceCaller, InferenceGateway, InferenceGatewayConfig, MemorySink, PoolSpec,
};
use tessera_gateway::mock;

struct Harness {
    url: String,
    gw: InferenceGateway,
    sink: Arc<MemorySink>,
}

async fn harness(engines: &[&mock::MockEngine], max_in_flight: u32, max_queue: usize) -> Harness {
    let sink = Arc::new(MemorySink::default());
    let gw = InferenceGateway::new(
        sink.clone(),
        InferenceGatewayConfig {
            down_for: Duration::from_secs(60),
            ..InferenceGatewayConfig::default()
        },
    );
    gw.upsert_pool(PoolSpec {
        name: "p".into(),
        model: "m".into(),
        endpoints: engines
            .iter()
            .map(|e| EndpointSpec {
                url: e.url.clone(),
                weight: 1,
            })
            .collect(),
        max_in_flight,
        max_queue,
        queue_timeout_ms: 300,
        redact: Default::default(),
    })
    .unwrap();
    let g2 = gw.clone();
    let app = Router::new().route(
        "/v1/chat/completions",
        post(move |h: HeaderMap, body: Bytes| {
            let g = g2.clone();
            async move {
                let who = InferenceCaller {
                    tenant: h
                        .get("x-tenant")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("t1")
                        .into(),
                    session: Some("s1".into()),
                    ..InferenceCaller::default()
                };
                g.forward(who, "/v1/chat/completions", body).await
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    Harness {
        url: format!("http://{addr}/v1/chat/completions"),
        gw,
        sink,
    }
}

fn chat(stream: bool) -> Value {
    json!({"model": "m", "stream": stream, "messages": [{"role": "system", "content": "you are terse"}, {"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn plain_and_streaming_calls_are_forwarded_and_metered() {
    let e = mock::start().await.unwrap();
    let h = harness(&[&e], 8, 8).await;
    let c = reqwest::Client::new();
    let r = c.post(&h.url).json(&chat(false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let r = c.post(&h.url).json(&chat(true)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let text = r.text().await.unwrap();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(text.matches("\"delta\"").count(), 4);
    // The gateway asked the engine for usage, but the client did not: no usage chunk.
    assert!(!text.contains("\"usage\""), "{text}");
    let mut body = chat(true);
    body["stream_options"] = json!({"include_usage": true});
    let text = c
        .post(&h.url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("\"usage\""), "{text}");
    tokio::time::sleep(Duration::from_millis(50)).await;
    let recs = h.sink.records.lock().unwrap().clone();
    assert_eq!(recs.len(), 3);
    for (tenant, session, u) in &recs {
        assert_eq!(tenant, "t1");
        assert_eq!(session.as_deref(), Some("s1"));
        assert_eq!(u.completion_tokens, 4);
        assert!(u.prompt_tokens > 0 && u.cached_tokens > 0);
    }
}

#[tokio::test]
async fn engine_dying_mid_stream_ends_with_an_error_event_and_leaves_rotation() {
    let a = mock::start().await.unwrap();
    let b = mock::start().await.unwrap();
    a.knobs.die_after.store(2, Ordering::Relaxed);
    b.knobs.die_after.store(2, Ordering::Relaxed);
    let h = harness(&[&a, &b], 8, 8).await;
    let c = reqwest::Client::new();
    let text = c
        .post(&h.url)
        .json(&chat(true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("engine_failed"), "{text}");
    assert!(!text.contains("[DONE]"), "{text}");
    let st = h.gw.pool_status("p").unwrap();
    let down: Vec<_> = st.endpoints.iter().filter(|e| !e.healthy).collect();
    assert_eq!(down.len(), 1, "{st:?}");
    // The next call goes to the other engine.
    let dead = down[0].url.clone();
    let (live, dead_knobs) = if dead == a.url { (&b, &a) } else { (&a, &b) };
    let before = dead_knobs.knobs.requests.load(Ordering::Relaxed);
    live.knobs.die_after.store(0, Ordering::Relaxed);
    let r = c.post(&h.url).json(&chat(false)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(dead_knobs.knobs.requests.load(Ordering::Relaxed), before);
}

#[tokio::test]
async fn a_failing_engine_is_retried_elsewhere_before_the_first_byte() {
    let a = mock::start().await.unwrap();
    let b = mock::start().await.unwrap();
    a.knobs.down.store(true, Ordering::Relaxed);
    let h = harness(&[&a, &b], 8, 8).await;
    let c = reqwest::Client::new();
    for _ in 0..4 {
        let r = c.post(&h.url).json(&chat(false)).send().await.unwrap();
        assert_eq!(r.status(), 200);
    }
    assert_eq!(b.knobs.requests.load(Ordering::Relaxed), 4);
}

#[tokio::test]
async fn an_overloaded_pool_queues_then_sheds_with_429_and_retry_after() {
    let e = mock::start().await.unwrap();
    e.knobs.delay_ms.store(400, Ordering::Relaxed);
    e.knobs.tokens.store(1, Ordering::Relaxed);
    let h = harness(&[&e], 1, 2).await;
    let c = reqwest::Client::new();
    let mut hs = Vec::new();
    for _ in 0..6 {
        let (c, u) = (c.clone(), h.url.clone());
        hs.push(tokio::spawn(async move {
            let r = c.post(&u).json(&chat(false)).send().await.unwrap();
            (
                r.status().as_u16(),
                r.headers().get("retry-after").is_some(),
            )
        }));
    }
    let mut ok = 0;
    let mut shed = 0;
    for h in hs {
        let (s, retry_after) = h.await.unwrap();
        match s {
            200 => ok += 1,
            429 => {
                assert!(retry_after);
                shed += 1;
            }
            other => panic!("unexpected status {other}"),
        }
    }
    assert!(ok >= 1 && shed >= 3, "ok {ok} shed {shed}");
}

#[tokio::test]
async fn a_tenant_over_budget_gets_402_with_the_reason() {
    let e = mock::start().await.unwrap();
    let h = harness(&[&e], 8, 8).await;
    h.sink
        .over_budget
        .lock()
        .unwrap()
        .insert("t1".into(), "tenant t1 spent 10.00 of 10.00 USD".into());
    let r = reqwest::Client::new()
        .post(&h.url)
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 402);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("spent 10.00")
    );
    assert_eq!(e.knobs.requests.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn pool_update_in_place_keeps_endpoints_and_adds_new_ones() {
    let a = mock::start().await.unwrap();
    let b = mock::start().await.unwrap();
    let h = harness(&[&a], 8, 8).await;
    let mut spec = h.gw.pool_status("p").unwrap().spec;
    spec.endpoints.push(EndpointSpec {
        url: b.url.clone(),
        weight: 2,
    });
    assert!(!h.gw.upsert_pool(spec.clone()).unwrap());
    let st = h.gw.pool_status("p").unwrap();
    assert_eq!(st.endpoints.len(), 2);
    spec.endpoints.remove(0);
    h.gw.upsert_pool(spec).unwrap();
    let st = h.gw.pool_status("p").unwrap();
    assert_eq!(st.endpoints.len(), 1);
    assert_eq!(st.endpoints[0].url, b.url);
    let r = reqwest::Client::new()
        .post(&h.url)
        .json(&chat(false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(a.knobs.requests.load(Ordering::Relaxed), 0);
}

#[tokio::test]
async fn kv_events_steer_requests_to_the_engine_holding_the_prefix() {
    use tessera_gateway::http::{KvEvent, KvEvents, request_blocks};
    let a = mock::start().await.unwrap();
    let b = mock::start().await.unwrap();
    let h = harness(&[&a, &b], 8, 8).await;
    let mut body = chat(false);
    body["messages"][0]["content"] = json!("you are terse and careful. ".repeat(20));
    let blocks = request_blocks(&body);
    assert!(blocks.len() >= 8, "{}", blocks.len());
    let ev = |url: &str, events: Vec<KvEvent>| KvEvents {
        endpoint: url.to_string(),
        events,
    };
    let send = |n: usize| {
        let (url, body) = (h.url.clone(), body.clone());
        async move {
            for _ in 0..n {
                let r = reqwest::Client::new()
                    .post(&url)
                    .json(&body)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200);
            }
        }
    };
    let count = |e: &mock::MockEngine| e.knobs.requests.load(Ordering::Relaxed);

    // Both engines publish events; only b holds the prompt's blocks.
    h.gw.kv_events("p", &ev(&a.url, vec![KvEvent::AllBlocksCleared]))
        .unwrap();
    let n =
        h.gw.kv_events(
            "p",
            &ev(
                &b.url,
                vec![KvEvent::BlockStored {
                    block_hashes: blocks.clone(),
                }],
            ),
        )
        .unwrap();
    assert_eq!(n, blocks.len());
    send(3).await;
    assert_eq!((count(&a), count(&b)), (0, 3));

    // b evicts them, a stores them: the session follows the cache.
    h.gw.kv_events(
        "p",
        &ev(
            &b.url,
            vec![KvEvent::BlockRemoved {
                block_hashes: blocks.clone(),
            }],
        ),
    )
    .unwrap();
    h.gw.kv_events(
        "p",
        &ev(
            &a.url,
            vec![KvEvent::BlockStored {
                block_hashes: blocks[..blocks.len() / 2].to_vec(),
            }],
        ),
    )
    .unwrap();
    send(3).await;
    assert_eq!((count(&a), count(&b)), (3, 3));
    let st = h.gw.pool_status("p").unwrap();
    assert!(st.endpoints.iter().all(|e| e.precise_prefix), "{st:?}");

    // Bad batches name what is wrong.
    let e =
        h.gw.kv_events("p", &ev("http://nowhere:1", vec![]))
            .unwrap_err();
    assert!(e.starts_with("endpoint:"), "{e}");
    assert!(h.gw.kv_events("nope", &ev(&a.url, vec![])).is_err());
    let e =
        h.gw.kv_events(
            "p",
            &ev(
                &a.url,
                vec![KvEvent::BlockStored {
                    block_hashes: vec![0; 1 << 17],
                }],
            ),
        )
        .unwrap_err();
    assert!(e.starts_with("events:"), "{e}");
}

#[test]
fn kv_events_read_vllm_shaped_json() {
    use tessera_gateway::http::{KvEvent, KvEvents};
    let v = json!({"endpoint": "http://e:8000", "events": [
        {"type": "BlockStored", "block_hashes": [1, 18446744073709551615u64], "parent_block_hash": null,
         "token_ids": [1, 2, 3], "block_size": 16, "lora_id": null, "medium": "GPU"},
        {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"},
        {"type": "AllBlocksCleared"}
    ]});
    let b: KvEvents = serde_json::from_value(v).unwrap();
    assert_eq!(
        b.events,
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![1, u64::MAX]
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![1]
            },
            KvEvent::AllBlocksCleared,
        ]
    );
    assert!(
        serde_json::from_value::<KvEvents>(json!({"endpoint": "x", "events": [{"type": "Nope"}]}))
            .is_err()
    );
}

/// A pool of `urls` (weight 1 each) serving `model`, 8 in flight and 8 queued.
fn small_pool(name: &str, model: &str, urls: &[String]) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        model: model.into(),
        endpoints: urls
            .iter()
            .map(|u| EndpointSpec {
                url: u.clone(),
                weight: 1,
            })
            .collect(),
        max_in_flight: 8,
        max_queue: 8,
        queue_timeout_ms: 300,
        redact: Default::default(),
    }
}

/// Engines without vLLM's gauges are served on their health check alone, and an
/// endpoint out of rotation says why (in the pool's status, which `pool get`
/// and the console show).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_without_vllm_metrics_are_served_on_health_and_down_ones_say_why() {
    let vllm = mock::start().await.unwrap();
    let plain = mock::start().await.unwrap();
    plain.knobs.no_metrics.store(true, Ordering::Relaxed);
    let sick = mock::start().await.unwrap();
    sick.knobs.down.store(true, Ordering::Relaxed);
    // Nothing listens there.
    let gone = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone_url = format!("http://{}", gone.local_addr().unwrap());
    drop(gone);
    let sink = Arc::new(MemorySink::default());
    let gw = InferenceGateway::new(sink, InferenceGatewayConfig::default());
    let urls = [
        vllm.url.clone(),
        plain.url.clone(),
        sick.url.clone(),
        gone_url.clone(),
    ];
    gw.upsert_pool(small_pool("p", "m", &urls)).unwrap();
    gw.scrape_once().await;
    let st = gw.pool_status("p").unwrap();
    let by = |u: &str| st.endpoints.iter().find(|e| e.url == u).unwrap().clone();
    let (v, p, s, g) = (by(&vllm.url), by(&plain.url), by(&sick.url), by(&gone_url));
    assert!(
        v.healthy && v.probe == Some("metrics") && v.out_of_rotation.is_none(),
        "{v:?}"
    );
    assert!(p.healthy && p.probe == Some("/health"), "{p:?}");
    assert!(!s.healthy, "{s:?}");
    assert_eq!(
        s.out_of_rotation.as_deref(),
        Some("not healthy: /metrics answered 503, /health answered 503, /v1/models answered 404")
    );
    assert!(!g.healthy, "{g:?}");
    assert!(
        g.out_of_rotation
            .as_deref()
            .unwrap()
            .starts_with(&format!("no answer from {gone_url}")),
        "{g:?}"
    );
    // The engine without gauges takes requests (a pool of its own, so that routing
    // cannot prefer the other).
    gw.upsert_pool(small_pool("plain", "m2", std::slice::from_ref(&plain.url)))
        .unwrap();
    gw.scrape_once().await;
    let who = InferenceCaller {
        tenant: "t1".into(),
        session: Some("s1".into()),
        ..InferenceCaller::default()
    };
    let body = Bytes::from(
        json!({"model": "m2", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    for _ in 0..3 {
        let r = gw
            .forward(who.clone(), "/v1/chat/completions", body.clone())
            .await;
        assert_eq!(r.status().as_u16(), 200);
    }
    assert_eq!(plain.knobs.requests.load(Ordering::Relaxed), 3);
    assert_eq!(sick.knobs.requests.load(Ordering::Relaxed), 0);
    // As JSON (what `GET /v1/pools/p` answers): the reason is there by name.
    let j = serde_json::to_value(gw.pool_status("p").unwrap()).unwrap();
    assert!(j["endpoints"][2]["out_of_rotation"].is_string(), "{j}");
    assert!(j["endpoints"][0].get("out_of_rotation").is_none(), "{j}");
}
