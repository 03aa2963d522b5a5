//! Token exchange (RFC 8693) over HTTP, as an OAuth client sends it (a form
//! post): a session's key becomes a short-lived JWT for one tool granted to it,
//! acting for the user who started the session (`sub`) with the session as actor
//! (`act`), verifiable with the server's published key set, each exchange an audit
//! entry naming the chain. A tool registered with `auth: exchange` receives such a
//! token as its Authorization header on every call, and never sees a static one.

mod common;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::post;
use common::{Server, StatusCode, Value, json};
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, decode, decode_header};

const GRANT: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
const ACCESS: &str = "urn:ietf:params:oauth:token-type:access_token";

/// `POST /v1/token` with a form, as `reqwest` (an OAuth client) sends it.
async fn exchange(s: &Server, form: &[(&str, &str)]) -> (StatusCode, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/token", s.base))
        .form(form)
        .send()
        .await
        .unwrap();
    let st = r.status();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// The claims of `token` after checking its signature against the server's
/// published keys, its issuer and its audience.
async fn verify(s: &Server, token: &str, aud: &str) -> Value {
    let jwks: JwkSet = reqwest::get(format!("{}/v1/token/jwks", s.base))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let kid = decode_header(token).unwrap().kid.unwrap();
    let key = DecodingKey::from_jwk(jwks.find(&kid).unwrap()).unwrap();
    let mut v = Validation::new(Algorithm::EdDSA);
    v.set_issuer(&["tessera"]);
    v.set_audience(&[aud]);
    v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
    decode::<Value>(token, &key, &v).unwrap().claims
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_exchanges_its_key_for_a_token_acting_for_its_user() {
    let s = Server::start().await;
    let acme = s.tenant("acme").await;
    let seen: Arc<Mutex<Vec<HeaderMap>>> = Arc::default();
    let tool_url = {
        let seen = seen.clone();
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", l.local_addr().unwrap());
        let app = Router::new().route(
            "/",
            post(move |h: HeaderMap| async move {
                let auth = h
                    .get("authorization")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                seen.lock().unwrap().push(h);
                axum::Json(json!({"you_sent": auth}))
            }),
        );
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        url
    };
    for (name, auth) in [("crm", true), ("other", false)] {
        let mut target = json!({"type": "http", "url": tool_url});
        if auth {
            target["auth"] = json!("exchange");
        }
        let (st, v) = acme
            .post("/v1/tools", json!({"name": name, "target": target}))
            .await;
        assert_eq!(st, StatusCode::CREATED, "{v}");
    }
    let (st, v) = acme
        .post("/v1/tools/crm/grants", json!({"runtime": "shop"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    s.session_started_by("acme", "s1", "shop", Some("alice"))
        .await;
    s.session("acme", "old", "shop").await;
    let agent = acme.key_for("session:s1", "developer").await;

    // The exchange: a JWT for the tool, acting for alice, the session its actor.
    let (st, v) = exchange(
        &s,
        &[
            ("grant_type", GRANT),
            ("subject_token", &agent),
            ("subject_token_type", ACCESS),
            ("audience", "crm"),
        ],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        v["issued_token_type"],
        "urn:ietf:params:oauth:token-type:jwt"
    );
    assert_eq!(v["token_type"], "Bearer");
    assert!(
        v["expires_in"].as_u64().is_some_and(|e| e > 0 && e <= 300),
        "{v}"
    );
    let claims = verify(&s, v["access_token"].as_str().unwrap(), "crm").await;
    assert_eq!(claims["sub"], "alice", "{claims}");
    assert_eq!(claims["act"], json!({"sub": "session:s1"}), "{claims}");
    assert_eq!(claims["tessera_tenant"], "acme", "{claims}");
    let jti = claims["jti"].as_str().unwrap().to_string();
    // The chain is in the audit log.
    let (_, audit) = acme.get("/v1/audit").await;
    let entry = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "token-exchange")
        .unwrap_or_else(|| panic!("{audit}"))
        .clone();
    assert_eq!(entry["subject"], "session:s1", "{entry}");
    let object = entry["object"].as_str().unwrap();
    for part in [
        "tool/crm",
        "sub=alice",
        "act=session:s1",
        &format!("jti={jti}"),
        "via=exchange",
    ] {
        assert!(object.contains(part), "{part} not in {object}");
    }

    // Refusals, in RFC 6749's shape.
    let alice = acme.key_for("alice", "developer").await;
    for (what, form, code) in [
        (
            "another grant type",
            vec![
                ("grant_type", "client_credentials"),
                ("subject_token", agent.as_str()),
            ],
            "unsupported_grant_type",
        ),
        (
            "a user's key, not a session's",
            vec![
                ("grant_type", GRANT),
                ("subject_token", alice.as_str()),
                ("subject_token_type", ACCESS),
                ("audience", "crm"),
            ],
            "invalid_request",
        ),
        (
            "a key that is not one",
            vec![
                ("grant_type", GRANT),
                ("subject_token", "tsk_000000000000_00"),
                ("subject_token_type", ACCESS),
                ("audience", "crm"),
            ],
            "invalid_request",
        ),
        (
            "a tool not granted to the session",
            vec![
                ("grant_type", GRANT),
                ("subject_token", agent.as_str()),
                ("subject_token_type", ACCESS),
                ("audience", "other"),
            ],
            "invalid_target",
        ),
        (
            "no audience",
            vec![
                ("grant_type", GRANT),
                ("subject_token", agent.as_str()),
                ("subject_token_type", ACCESS),
            ],
            "invalid_request",
        ),
    ] {
        let (st, v) = exchange(&s, &form).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{what}: {v}");
        assert_eq!(v["error"], code, "{what}: {v}");
        assert!(v["error_description"].is_string(), "{what}: {v}");
    }
    // A session with no recorded user cannot act for anyone.
    let old = acme.key_for("session:old", "developer").await;
    let (st, v) = exchange(
        &s,
        &[
            ("grant_type", GRANT),
            ("subject_token", &old),
            ("subject_token_type", ACCESS),
            ("audience", "crm"),
        ],
    )
    .await;
    assert_eq!(
        (st, v["error"].as_str()),
        (StatusCode::BAD_REQUEST, Some("invalid_request")),
        "{v}"
    );

    // A tool with `auth: exchange` gets such a token on each call; what it echoes
    // back is scrubbed like a secret.
    let caller = s.client(&agent);
    let (st, v) = caller
        .post(
            "/v1/tools/crm/call",
            json!({"session_id": "s1", "tool_call_id": "c1", "arguments": {}}),
        )
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(v["status"], "completed", "{v}");
    assert_eq!(v["result"]["you_sent"], "[REDACTED:tool-secret]", "{v}");
    let sent = seen.lock().unwrap().last().unwrap().clone();
    let bearer = sent["authorization"].to_str().unwrap();
    let token = bearer.strip_prefix("Bearer ").unwrap();
    let claims = verify(&s, token, "crm").await;
    assert_eq!(
        (&claims["sub"], &claims["act"]["sub"]),
        (&json!("alice"), &json!("session:s1")),
        "{claims}"
    );
    let (_, audit) = acme.get("/v1/audit").await;
    assert!(
        audit["items"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["action"] == "token-exchange"
                && a["object"].as_str().unwrap().contains("via=tool-call")),
        "{audit}"
    );
    // A static Authorization header beside `auth: exchange` is refused.
    let (st, v) = acme
        .post(
            "/v1/tools",
            json!({"name": "both", "target": {"type": "http", "url": tool_url, "auth": "exchange",
                   "headers": {"Authorization": {"secret": "Bearer static-token"}}}}),
        )
        .await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["field"], "target.auth", "{v}");
}
