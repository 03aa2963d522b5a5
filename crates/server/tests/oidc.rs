//! OIDC bearer tokens: a token signed by the configured issuer's key, for the
//! configured audience, naming an existing tenant whose role binding covers the
//! subject, is accepted; anything else is 401 (or 403 without a role). The keys come
//! from a saved file or are discovered from a local issuer (127.0.0.1) started by
//! the test: rotated without a restart, removed by the periodic refresh, unknown
//! kids rate-limited, an issuer mismatch refused at start.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::routing::get;
use axum::{Json, Router};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tessera_server::oidc::{OidcConfig, Refresh};

mod common;
use common::Server;

/// The issuer's signing key (Ed25519, generated for this test only) and its JWKS.
const ISSUER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ7wSSs1U5sBgwxDc5ziOk6hrWlNC7Ez9qmES0efhht6
-----END PRIVATE KEY-----
";
const ISSUER_JWKS: &str = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "alg": "EdDSA", "use": "sig",
  "x": "fe2R-x-6dn7mMXI9kl2Qw8lkKlKY2T45ya2fHCKGKdw"}]}"#;
/// The public half of `ISSUER_KEY`, and a second key pair (`k2`) for rotations.
const X1: &str = "fe2R-x-6dn7mMXI9kl2Qw8lkKlKY2T45ya2fHCKGKdw";
const KEY2: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIP61pZiwKiERdqfI1pwFoEl0JINv3Jlg9e9Bdx3nKTeC
-----END PRIVATE KEY-----
";
const X2: &str = "5ADCwBXDJyFD9bErZtCNrq8iRAmLok7FvdGOb-ftfHM";
/// Some other key the server does not trust.
const OTHER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIL8ELd2ndAEe1EXlupVKQSx1BN6vpR+xU7hLEZq6R/nh
-----END PRIVATE KEY-----
";
const ISS: &str = "https://issuer.example";
const AUD: &str = "tessera";

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn token(pem: &str, claims: Value) -> String {
    token_kid(pem, "k1", claims)
}

fn token_kid(pem: &str, kid: &str, claims: Value) -> String {
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some(kid.into());
    encode(
        &h,
        &claims,
        &EncodingKey::from_ed_pem(pem.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn claims(sub: &str, tenant: &str) -> Value {
    json!({"iss": ISS, "aud": AUD, "sub": sub, "exp": now() + 600, "tessera_tenant": tenant})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_tokens_from_the_issuer_are_accepted_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, ISSUER_JWKS).unwrap();
    let server = Server::start_with(|c| {
        c.scheduler = None;
        c.register_local_node = false;
        c.oidc = Some(OidcConfig::from_jwks_file(ISS, AUD, &jwks).unwrap());
    })
    .await;
    let admin = server.admin.key().to_string();
    let call = |auth: String, m: reqwest::Method, path: &str, body: Option<Value>| {
        let c = server.client(&auth);
        let path = path.to_string();
        async move { c.call(m, &path, body).await }
    };
    let (st, t) = call(
        admin.clone(),
        reqwest::Method::POST,
        "/v1/tenants",
        Some(json!({"name": "alpha"})),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED);
    let alpha_admin = t["admin_key"].as_str().unwrap().to_string();
    let (st, _) = call(
        alpha_admin,
        reqwest::Method::PUT,
        "/v1/rolebindings/alice",
        Some(json!({"role": "developer"})),
    )
    .await;
    assert_eq!(st, StatusCode::OK);

    let good = token(ISSUER_KEY, claims("alice", "alpha"));
    let (st, v) = call(good, reqwest::Method::GET, "/v1/whoami", None).await;
    assert_eq!(st, StatusCode::OK, "{v}");
    assert_eq!(
        (
            v["tenant"].as_str(),
            v["subject"].as_str(),
            v["role"].as_str()
        ),
        (Some("alpha"), Some("alice"), Some("developer"))
    );

    let mut wrong_aud = claims("alice", "alpha");
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = claims("alice", "alpha");
    wrong_iss["iss"] = json!("https://evil.example");
    let mut expired = claims("alice", "alpha");
    expired["exp"] = json!(now() - 3600);
    let mut not_yet = claims("alice", "alpha");
    not_yet["nbf"] = json!(now() + 3600);
    let mut no_tenant = claims("alice", "alpha");
    no_tenant.as_object_mut().unwrap().remove("tessera_tenant");
    for (what, tok) in [
        ("wrong audience", token(ISSUER_KEY, wrong_aud)),
        ("wrong issuer", token(ISSUER_KEY, wrong_iss)),
        ("expired", token(ISSUER_KEY, expired)),
        (
            "not valid for another hour (nbf)",
            token(ISSUER_KEY, not_yet),
        ),
        ("no tenant claim", token(ISSUER_KEY, no_tenant)),
        ("unknown tenant", token(ISSUER_KEY, claims("alice", "nope"))),
        ("untrusted key", token(OTHER_KEY, claims("alice", "alpha"))),
        ("garbage", "not.a.jwt".to_string()),
    ] {
        let (st, v) = call(tok, reqwest::Method::GET, "/v1/whoami", None).await;
        assert_eq!(st, StatusCode::UNAUTHORIZED, "{what}: {v}");
    }
    // A valid token whose subject has no role in the tenant: 403.
    let (st, _) = call(
        token(ISSUER_KEY, claims("bob", "alpha")),
        reqwest::Method::GET,
        "/v1/whoami",
        None,
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    server.stop().await;
}

/// A JWKS document of Ed25519 public keys (kid, x).
fn jwks(keys: &[(&str, &str)]) -> Value {
    json!({"keys": keys.iter().map(|(kid, x)| json!({
        "kty": "OKP", "crv": "Ed25519", "kid": kid, "alg": "EdDSA", "use": "sig", "x": x}))
        .collect::<Vec<_>>()})
}

/// An OpenID Provider on 127.0.0.1: its discovery document (naming `names`, or
/// its own URL) and a key set the test changes, counting the key set's fetches.
struct Issuer {
    url: String,
    keys: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

impl Issuer {
    async fn start(names: Option<&str>, keys: Value) -> Issuer {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let keys = Arc::new(Mutex::new(keys));
        let fetches = Arc::new(AtomicUsize::new(0));
        let doc = json!({"issuer": names.unwrap_or(&url), "jwks_uri": format!("{url}/jwks"),
                         "id_token_signing_alg_values_supported": ["EdDSA"]});
        let (k, f) = (keys.clone(), fetches.clone());
        let app = Router::new()
            .route(
                "/.well-known/openid-configuration",
                get(move || async move { Json(doc) }),
            )
            .route(
                "/jwks",
                get(move || async move {
                    f.fetch_add(1, Ordering::SeqCst);
                    Json(k.lock().unwrap().clone())
                }),
            );
        tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
        Issuer { url, keys, fetches }
    }

    fn publish(&self, keys: Value) {
        *self.keys.lock().unwrap() = keys;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }

    fn claims(&self, sub: &str, tenant: &str) -> Value {
        json!({"iss": self.url, "aud": AUD, "sub": sub, "exp": now() + 600, "tessera_tenant": tenant})
    }
}

/// A server trusting `issuer` by discovery, refreshed as `r` says, with tenant
/// `alpha` where `alice` is a developer.
async fn discovering_server(issuer: &Issuer, r: Refresh) -> Server {
    let cfg = OidcConfig::discover(&issuer.url, AUD).refreshed(r);
    let server = Server::start_with(|c| {
        c.scheduler = None;
        c.register_local_node = false;
        c.oidc = Some(cfg);
    })
    .await;
    let alpha = server.tenant("alpha").await;
    let (st, v) = alpha
        .put("/v1/rolebindings/alice", json!({"role": "developer"}))
        .await;
    assert_eq!(st, StatusCode::OK, "{v}");
    server
}

async fn whoami(s: &Server, token: String) -> StatusCode {
    s.client(&token).get("/v1/whoami").await.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovered_keys_rotate_without_a_restart_and_unknown_kids_are_rate_limited() {
    let issuer = Issuer::start(None, jwks(&[("k1", X1)])).await;
    let gap = Duration::from_millis(1500);
    let server = discovering_server(
        &issuer,
        Refresh {
            every: Duration::from_secs(3600),
            unknown_kid_gap: gap,
            timeout: Duration::from_secs(5),
        },
    )
    .await;
    let alice = issuer.claims("alice", "alpha");
    assert_eq!(
        whoami(&server, token_kid(ISSUER_KEY, "k1", alice.clone())).await,
        StatusCode::OK
    );
    assert_eq!(issuer.fetches(), 1, "one fetch at start");

    // The issuer rotates to k2: a k2 token makes the server fetch the set at once
    // (after the gap since the last fetch), no restart.
    issuer.publish(jwks(&[("k1", X1), ("k2", X2)]));
    tokio::time::sleep(gap).await;
    assert_eq!(
        whoami(&server, token_kid(KEY2, "k2", alice.clone())).await,
        StatusCode::OK
    );
    assert_eq!(issuer.fetches(), 2);

    // Made-up kids, many at once: refused, and no fetch within the gap...
    let burst = |round: usize| {
        let s = &server;
        let alice = alice.clone();
        futures_util::future::join_all((0..40).map(move |i| {
            whoami(
                s,
                token_kid(KEY2, &format!("made-up-{round}-{i}"), alice.clone()),
            )
        }))
    };
    assert!(
        burst(0)
            .await
            .iter()
            .all(|st| *st == StatusCode::UNAUTHORIZED)
    );
    assert_eq!(
        issuer.fetches(),
        2,
        "unknown kids within the gap fetch nothing"
    );
    // ...and after it, one fetch however many arrive together.
    tokio::time::sleep(gap).await;
    assert!(
        burst(1)
            .await
            .iter()
            .all(|st| *st == StatusCode::UNAUTHORIZED)
    );
    assert_eq!(issuer.fetches(), 3, "one fetch for a burst of unknown kids");
    // The keys held still work.
    assert_eq!(
        whoami(&server, token_kid(ISSUER_KEY, "k1", alice)).await,
        StatusCode::OK
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_refresh_picks_up_new_keys_and_drops_removed_ones() {
    let issuer = Issuer::start(None, jwks(&[("k1", X1)])).await;
    // Unknown kids never fetch here: only the period does.
    let server = discovering_server(
        &issuer,
        Refresh {
            every: Duration::from_millis(200),
            unknown_kid_gap: Duration::from_secs(3600),
            timeout: Duration::from_secs(5),
        },
    )
    .await;
    let alice = issuer.claims("alice", "alpha");
    let (old, new) = (
        token_kid(ISSUER_KEY, "k1", alice.clone()),
        token_kid(KEY2, "k2", alice),
    );
    assert_eq!(whoami(&server, old.clone()).await, StatusCode::OK);
    assert_eq!(whoami(&server, new.clone()).await, StatusCode::UNAUTHORIZED);
    issuer.publish(jwks(&[("k2", X2)]));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (o, n) = (
            whoami(&server, old.clone()).await,
            whoami(&server, new.clone()).await,
        );
        if (o, n) == (StatusCode::UNAUTHORIZED, StatusCode::OK) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "after 10 s the old key gives {o}, the new one {n}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    server.stop().await;
}

/// `tessera_server::start` with `oidc`; its error.
async fn start_error(oidc: OidcConfig) -> String {
    let dir = tempfile::tempdir().unwrap();
    let store = tessera_server::SqliteStore::open(dir.path().join("data")).unwrap();
    let mut cfg = common::test_config(dir.path());
    cfg.scheduler = None;
    cfg.register_local_node = false;
    cfg.oidc = Some(oidc);
    match tessera_server::start(store.into(), cfg).await {
        Ok(_) => panic!("the server started"),
        Err(e) => e.to_string(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discovery_document_naming_another_issuer_is_refused_at_start() {
    let issuer = Issuer::start(Some("https://elsewhere.example"), jwks(&[("k1", X1)])).await;
    let e = start_error(OidcConfig::discover(&issuer.url, AUD)).await;
    assert!(
        e.contains("names the issuer \"https://elsewhere.example\"")
            && e.contains(&format!("not \"{}\"", issuer.url))
            && e.contains("--oidc-issuer https://elsewhere.example"),
        "{e}"
    );
    assert_eq!(
        issuer.fetches(),
        0,
        "no key is fetched from a mismatching issuer"
    );
    // Keys over plain http from another machine could be swapped on the way.
    let e = start_error(OidcConfig::discover("http://issuer.example", AUD)).await;
    assert!(e.contains("use https"), "{e}");
}
