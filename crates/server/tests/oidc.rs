//! OIDC bearer tokens: a token signed by the configured issuer's key, for the
//! configured audience, naming an existing tenant whose role binding covers the
//! subject, is accepted; anything else is 401 (or 403 without a role).

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tessera_server::oidc::OidcConfig;

mod common;
use common::Server;

/// The issuer's signing key (Ed25519, generated for this test only) and its JWKS.
const ISSUER_KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ7wSSs1U5sBgwxDc5ziOk6hrWlNC7Ez9qmES0efhht6
-----END PRIVATE KEY-----
";
const ISSUER_JWKS: &str = r#"{"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "alg": "EdDSA", "use": "sig",
  "x": "fe2R-x-6dn7mMXI9kl2Qw8lkKlKY2T45ya2fHCKGKdw"}]}"#;
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
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some("k1".into());
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
