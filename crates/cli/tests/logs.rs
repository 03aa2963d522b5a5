//! Structured logs (issue 25 item 6): `tessera up --log-format json` writes one JSON
//! object a line on stderr; every request has an access line with its request id,
//! which the reply carries in `X-Request-Id` (the caller's own id when it sent a
//! sane one); `--log-format text` and `-v` are taken; a bad format is a usage error.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{BIN, up_with};
use serde_json::Value;

/// The JSON access line of the request with `id`, read from `up`'s output.
fn access_line(up: &common::Up, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let Ok(l) = up.lines.recv_timeout(Duration::from_millis(200)) else {
            continue;
        };
        if let Ok(v) = serde_json::from_str::<Value>(&l)
            && v["target"] == "tessera::access"
            && v["request_id"] == id
        {
            return v;
        }
        seen.push(l);
    }
    panic!("no access line for {id} in:\n{}", seen.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_logs_json_lines_with_request_ids() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let up = up_with(&["--data", d, "--no-local-node", "--log-format", "json"]);
    let http = reqwest::Client::new();

    // The caller's id is kept, echoed and logged.
    let r = http
        .get(format!("{}/v1/whoami", up.url))
        .bearer_auth(up.key.as_deref().unwrap())
        .header("x-request-id", "trace-4bf92f35")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["x-request-id"], "trace-4bf92f35");
    let v = access_line(&up, "trace-4bf92f35");
    assert_eq!(v["level"], "INFO", "{v}");
    assert_eq!(v["method"], "GET", "{v}");
    assert_eq!(v["path"], "/v1/whoami", "{v}");
    assert_eq!(v["status"], 200, "{v}");
    assert!(v["duration_ms"].as_f64().is_some(), "{v}");
    assert!(v["timestamp"].is_string(), "{v}");

    // No id, or one that could break a log line: a fresh one, echoed and logged.
    for sent in [None, Some("two words")] {
        let mut req = http.get(format!("{}/v1/whoami", up.url));
        if let Some(s) = sent {
            req = req.header("x-request-id", s);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let id = r.headers()["x-request-id"].to_str().unwrap().to_string();
        assert!(
            id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()),
            "{id}"
        );
        let v = access_line(&up, &id);
        assert_eq!(v["status"], 401, "{v}");
    }
}

#[test]
fn log_flags_are_checked() {
    let out = Command::new(BIN)
        .args(["--log-format", "xml", "node", "list"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("text") && err.contains("json"), "{err}");
    // -v and the format are global: accepted after the subcommand too.
    let out = Command::new(BIN)
        .args(["guard", "rules", "-v", "--log-format", "text"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}
