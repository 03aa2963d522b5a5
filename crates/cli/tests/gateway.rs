//! Real OpenAI clients against the inference gateway that `tessera up` serves:
//! the official `openai` Python package and the `async-openai` Rust crate, plain
//! and streaming, chat and completions, and the models list.
//!
//! The engines behind the pool are small OpenAI-compatible HTTP servers written
//! for the tests (`tessera_gateway::mock`, with vLLM-style `/metrics`): no GPU
//! engine runs here.
//!
//! The Python test needs `TESSERA_PYTHON` (a Python with `openai`; `.ci/run`
//! makes one). It skips with a reason only when that is unset and `CI` is unset.

mod common;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{Up, up_with};
use serde_json::{Value, json};
use tessera_gateway::mock::{self, MockEngine};

const MODEL: &str = "tiny-test-model";

struct Env {
    up: Up,
    key: String,
    engines: Vec<MockEngine>,
    _dir: tempfile::TempDir,
}

impl Env {
    fn requests(&self) -> u64 {
        self.engines
            .iter()
            .map(|e| e.knobs.requests.load(Ordering::Relaxed))
            .sum()
    }

    async fn get(&self, path: &str) -> Value {
        reqwest::Client::new()
            .get(format!("{}{path}", self.up.url))
            .bearer_auth(&self.key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Waits until the session's metered `tokens_out` reaches `at_least`
    /// (streams are metered when they end, after the client has its answer).
    async fn metered_out(&self, session: &str, at_least: f64) -> Value {
        let t0 = Instant::now();
        loop {
            let v = self.get(&format!("/v1/usage?session={session}")).await;
            let out = v["session_totals"]["quantities"]["tokens_out"]
                .as_f64()
                .unwrap_or(0.0);
            if out >= at_least || t0.elapsed() > Duration::from_secs(20) {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `tessera up` on a fresh folder, two test engines, one pool serving MODEL.
async fn start() -> Env {
    let dir = tempfile::tempdir().unwrap();
    let engines = vec![mock::start().await.unwrap(), mock::start().await.unwrap()];
    let d = dir.path().to_str().unwrap().to_string();
    let up = tokio::task::spawn_blocking(move || up_with(&["--data", &d]))
        .await
        .unwrap();
    let key = up.key.clone().expect("first start prints the admin key");
    let pool = json!({
        "name": "tiny",
        "model": MODEL,
        "endpoints": engines.iter().map(|e| json!({"url": e.url})).collect::<Vec<_>>(),
    });
    let r = reqwest::Client::new()
        .post(format!("{}/v1/pools", up.url))
        .bearer_auth(&key)
        .json(&pool)
        .send()
        .await
        .unwrap();
    let st = r.status().as_u16();
    let body = r.text().await.unwrap();
    assert_eq!(st, 201, "POST /v1/pools: {body}");
    Env {
        up,
        key,
        engines,
        _dir: dir,
    }
}

fn python() -> Option<String> {
    match std::env::var("TESSERA_PYTHON") {
        Ok(p) if !p.is_empty() => Some(p),
        _ if std::env::var_os("CI").is_some() => {
            panic!("TESSERA_PYTHON must be set in CI (.ci/run makes the venv with `openai`)")
        }
        _ => {
            eprintln!("SKIP: TESSERA_PYTHON is not set (a Python with the `openai` package)");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_package_talks_to_the_gateway() {
    let Some(py) = python() else { return };
    let env = start().await;
    let script = format!(
        "{}/tests/clients/openai_client.py",
        env!("CARGO_MANIFEST_DIR")
    );
    let (url, key) = (env.up.url.clone(), env.key.clone());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(py)
            .arg(script)
            .env("OPENAI_BASE_URL", format!("{url}/v1"))
            .env("OPENAI_API_KEY", key)
            .env("TESSERA_MODEL", MODEL)
            .env("TESSERA_SESSION", "py-openai")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the openai client failed:\nstdout: {stdout}\nstderr: {stderr}"
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    eprintln!("openai (Python) saw: {v}");
    // Every call reached an engine (chat plain, streamed with and without the
    // usage chunk; completions plain and streamed); the unknown model none.
    assert_eq!(env.requests(), 5, "requests that reached the engines");
    // And was metered to the session named by X-Session-Id.
    // (The engines answer 4 tokens each; streams are metered too, the gateway
    // asks the engine for the usage chunk even when the client did not.)
    let u = env.metered_out("py-openai", 5.0 * 4.0).await;
    assert!(
        u["session_totals"]["quantities"]["tokens_out"]
            .as_f64()
            .unwrap_or(0.0)
            >= 20.0,
        "usage metered per session: {u}"
    );
    // A session id the meter cannot take is refused up front, OpenAI-shaped.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", env.up.url))
        .bearer_auth(&env.key)
        .header("X-Session-Id", "not/a session")
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("X-Session-Id"),
        "{v}"
    );
    // Each call is a GenAI span `chat {model}` in the session's trace.
    let t0 = Instant::now();
    let spans = loop {
        let t = env.get("/v1/sessions/py-openai/trace").await;
        let chats: Vec<Value> = t["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["operation"] == "chat")
            .cloned()
            .collect();
        if chats.len() >= 5 || t0.elapsed() > Duration::from_secs(20) {
            break chats;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(spans.len(), 5, "{spans:?}");
    for s in &spans {
        assert_eq!(s["name"], format!("chat {MODEL}"), "{s}");
        assert_eq!(
            s["attributes"]["gen_ai.conversation.id"], "py-openai",
            "{s}"
        );
        assert_eq!(s["attributes"]["gen_ai.usage.output_tokens"], 4, "{s}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_openai_talks_to_the_gateway() {
    use async_openai::Client;
    use async_openai::config::OpenAIConfig;
    use async_openai::types::chat::{
        ChatCompletionRequestMessage, ChatCompletionRequestSystemMessage,
        ChatCompletionRequestUserMessage, ChatCompletionStreamOptions,
        CreateChatCompletionRequestArgs,
    };
    use async_openai::types::completions::CreateCompletionRequestArgs;
    use futures_util::StreamExt;

    let env = start().await;
    let client = Client::with_config(
        OpenAIConfig::new()
            .with_api_base(format!("{}/v1", env.up.url))
            .with_api_key(env.key.clone()),
    );

    let models = client.models().list().await.unwrap();
    assert!(
        models.data.iter().any(|m| m.id == MODEL),
        "{:?}",
        models.data
    );

    let messages: Vec<ChatCompletionRequestMessage> = vec![
        ChatCompletionRequestSystemMessage::from("You are terse.").into(),
        ChatCompletionRequestUserMessage::from("Say ok.").into(),
    ];
    // Chat, plain.
    let req = CreateChatCompletionRequestArgs::default()
        .model(MODEL)
        .messages(messages.clone())
        .build()
        .unwrap();
    let r = client.chat().create(req).await.unwrap();
    assert_eq!(r.object, "chat.completion");
    assert!(
        r.choices[0]
            .message
            .content
            .as_deref()
            .is_some_and(|c| !c.is_empty())
    );
    assert!(r.usage.is_some_and(|u| u.completion_tokens > 0));

    // Chat, streaming, with the usage chunk.
    let req = CreateChatCompletionRequestArgs::default()
        .model(MODEL)
        .messages(messages)
        .stream_options(ChatCompletionStreamOptions {
            include_usage: Some(true),
            ..Default::default()
        })
        .build()
        .unwrap();
    let mut s = client.chat().create_stream(req).await.unwrap();
    let (mut text, mut usage) = (String::new(), None);
    while let Some(c) = s.next().await {
        let c = c.unwrap();
        if let Some(d) = c.choices.first().and_then(|ch| ch.delta.content.clone()) {
            text.push_str(&d);
        }
        if c.usage.is_some() {
            usage = c.usage;
        }
    }
    assert!(!text.trim().is_empty(), "streamed text");
    assert!(
        usage.is_some_and(|u| u.completion_tokens > 0),
        "usage chunk"
    );

    // Completions, plain and streaming.
    let req = CreateCompletionRequestArgs::default()
        .model(MODEL)
        .prompt("Say ok.")
        .build()
        .unwrap();
    let r = client.completions().create(req.clone()).await.unwrap();
    assert!(!r.choices[0].text.is_empty());
    let mut s = client.completions().create_stream(req).await.unwrap();
    let mut text = String::new();
    while let Some(c) = s.next().await {
        for ch in c.unwrap().choices {
            text.push_str(&ch.text);
        }
    }
    assert!(!text.trim().is_empty(), "streamed completion text");

    assert_eq!(env.requests(), 4, "requests that reached the engines");
}

fn tessera(env: &Env, args: &[&str]) -> (i32, String, String) {
    let o = Command::new(common::BIN)
        .args(args)
        .env("TESSERA_URL", &env.up.url)
        .env("TESSERA_API_KEY", &env.key)
        .env("TESSERA_CONFIG", env._dir.path().join("no-config.yaml"))
        .output()
        .unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tessera_pool_creates_lists_updates_and_deletes_pools() {
    let env = start().await;
    let (a, b) = (env.engines[0].url.clone(), env.engines[1].url.clone());
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tessera(&env, &args)
    };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();

    // Create from flags; the second model is a new pool.
    let (code, out, err) = run(s(&[
        "pool",
        "create",
        "second",
        "--model",
        "m2",
        "--endpoint",
        a.as_str(),
        "--endpoint",
        format!("{b},weight=2").as_str(),
        "--max-in-flight",
        "8",
        "-o",
        "json",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["spec"]["endpoints"][1]["weight"], 2, "{v}");
    assert_eq!(v["spec"]["max_in_flight"], 8, "{v}");

    // List: both pools, as a table and as JSON.
    let (code, out, _) = run(s(&["pool", "list"]));
    assert_eq!(code, 0);
    assert!(
        out.contains("RECOMMENDED REPLICAS") && out.contains("second") && out.contains("tiny"),
        "{out}"
    );
    let (_, out, _) = run(s(&["pool", "list", "-o", "json"]));
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["items"].as_array().map(Vec::len), Some(2), "{v}");

    // Update in place: drop one engine, keep the rest of the spec.
    let (code, out, err) = run(s(&[
        "pool",
        "update",
        "second",
        "--remove-endpoint",
        a.as_str(),
        "-o",
        "json",
    ]));
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        v["spec"]["endpoints"].as_array().map(Vec::len),
        Some(1),
        "{v}"
    );
    assert_eq!(v["spec"]["max_in_flight"], 8, "kept: {v}");
    let (code, out, _) = run(s(&["pool", "get", "second"]));
    assert_eq!(code, 0);
    assert!(out.contains(&b) && !out.contains(&a), "{out}");
    // The engine's row says it is in rotation (a mock engine has vLLM's gauges).
    let row = out
        .lines()
        .find(|l| l.starts_with(b.as_str()))
        .unwrap_or("");
    assert!(
        row.contains(" up ") && !row.contains("out of rotation"),
        "{out}"
    );

    // Bad input: exit 2 with a message naming what to fix.
    let (code, _, err) = run(s(&[
        "pool",
        "create",
        "third",
        "--model",
        "m3",
        "--endpoint",
        "http://x,weight=lots",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("weight"), "{err}");
    let (code, _, err) = run(s(&[
        "pool",
        "create",
        "third",
        "--model",
        "m2",
        "--endpoint",
        "http://x",
    ]));
    assert_eq!(code, 2, "a model served twice: {err}");
    assert!(err.contains("already served"), "{err}");
    let (code, _, err) = run(s(&[
        "pool",
        "create",
        "third",
        "--model",
        "m3",
        "--endpoint",
        "ftp://x",
    ]));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("endpoints[0].url"), "{err}");

    // Delete.
    let (code, _, err) = run(s(&["pool", "delete", "second"]));
    assert_eq!(code, 0, "{err}");
    let (code, _, _) = run(s(&["pool", "get", "second"]));
    assert_eq!(code, 2, "gone");
}

#[test]
fn bench_gateway_reports_overhead_in_json() {
    let o = Command::new(common::BIN)
        .args([
            "bench",
            "gateway",
            "--requests",
            "30",
            "--warmup",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    for f in ["overhead_p50_us", "overhead_p99_us"] {
        assert!(v[f].is_u64(), "{f}: {v}");
    }
    let modes: Vec<&str> = v["modes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mode"].as_str().unwrap())
        .collect();
    assert_eq!(modes, ["plain", "stream"]);
    for m in v["modes"].as_array().unwrap() {
        assert_eq!(m["requests"], 30, "every request measured: {m}");
    }
}

#[test]
fn sim_routing_writes_the_table_json_and_plot_the_lead_runs() {
    // The command the benchmarks use (`--workload all --seeds 1..4 --plot
    // docs/routing.svg`), shortened.
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("routing.svg");
    let o = Command::new(common::BIN)
        .args(["sim", "routing", "--workload", "all", "--seeds", "1..1"])
        .args(["--duration", "6", "--plot"])
        .arg(&svg)
        .arg("--json")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(&out).unwrap();
    let ws = v["workloads"].as_array().unwrap();
    assert_eq!(ws.len(), 2, "default and tenant-heavy: {v}");
    for w in ws {
        let names: Vec<&str> = w["routers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["router"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "round-robin",
                "least-load",
                "sglang-cache-aware",
                "llm-d-weighted",
                "tessera"
            ]
        );
        for r in w["routers"].as_array().unwrap() {
            for f in ["hit_rate", "ttft_p50_ms", "ttft_p99_ms", "tokens_per_sec"] {
                assert!(r[f].is_number(), "{f}: {r}");
            }
        }
    }
    let plot = std::fs::read_to_string(&svg).unwrap();
    assert!(
        plot.starts_with("<svg") || plot.starts_with("<?xml"),
        "{plot:.80}"
    );
}

/// The Responses API is metered as chat is (it used to meter 0 tokens: the meter
/// knew only chat's field names, so `/v1/responses` went around budgets and
/// prices), answered whole and streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_responses_api_is_metered_as_chat_is() {
    let env = start().await;
    let http = reqwest::Client::new();
    for (session, stream) in [("resp-whole", false), ("resp-stream", true)] {
        let r = http
            .post(format!("{}/v1/responses", env.up.url))
            .bearer_auth(&env.key)
            .header("x-session-id", session)
            .json(&json!({"model": MODEL, "input": "hello there", "stream": stream}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
        let body = r.text().await.unwrap();
        assert!(body.contains("resp_mock"), "{body}");
        let u = env.metered_out(session, 4.0).await;
        let q = &u["session_totals"]["quantities"];
        assert_eq!(q["tokens_out"].as_f64(), Some(4.0), "{session}: {u}");
        assert!(
            q["tokens_in"].as_f64().unwrap_or(0.0) > 0.0,
            "{session}: {u}"
        );
        assert!(
            q["tokens_cached"].as_f64().unwrap_or(0.0) > 0.0,
            "{session}: {u}"
        );
    }
}
