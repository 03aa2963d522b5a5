//! `tessera up --oidc-issuer URL --oidc-audience AUD` without `--oidc-jwks`: the real
//! binary discovers the issuer's keys (a small issuer on 127.0.0.1 started by the
//! test), and `tessera login` with a token it signed logs in; an issuer whose
//! discovery document names another issuer stops the start with a message saying so.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BIN, run, up_with};
use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use serde_json::{Value, json};

/// An Ed25519 key made for this test, and its public half.
const KEY: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIJ7wSSs1U5sBgwxDc5ziOk6hrWlNC7Ez9qmES0efhht6
-----END PRIVATE KEY-----
";
const X: &str = "fe2R-x-6dn7mMXI9kl2Qw8lkKlKY2T45ya2fHCKGKdw";

/// Serves the discovery document (naming `names`, or its own URL) and the key set
/// on 127.0.0.1, one HTTP/1.1 request per connection; returns its URL.
fn issuer(names: Option<&str>) -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let doc = json!({"issuer": names.unwrap_or(&url), "jwks_uri": format!("{url}/jwks")});
    let jwks =
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "k1", "alg": "EdDSA", "x": X}]});
    std::thread::spawn(move || {
        for conn in l.incoming().map_while(Result::ok) {
            let mut r = BufReader::new(&conn);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            // The rest of the head.
            let mut h = String::new();
            while r.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let body = if line.starts_with("GET /.well-known/openid-configuration ") {
                doc.to_string()
            } else if line.starts_with("GET /jwks ") {
                jwks.to_string()
            } else {
                String::new()
            };
            let status = if body.is_empty() {
                "404 Not Found"
            } else {
                "200 OK"
            };
            let _ = write!(
                &conn,
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    url
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `tessera ARGS` with `key` (and `stdin`): (exit code, stdout, stderr).
fn tessera(
    url: &str,
    key: &str,
    config: &str,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    let mut c = Command::new(BIN);
    c.args(args)
        .env("TESSERA_URL", url)
        .env("TESSERA_API_KEY", key)
        .env("TESSERA_CONFIG", config);
    run(c, Some(stdin))
}

#[test]
fn tessera_up_discovers_the_issuers_keys_and_a_token_logs_in() {
    let iss = issuer(None);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = dir.path().join("config.yaml");
    let config = config.to_str().unwrap();
    let server = up_with(&[
        "--data",
        data.to_str().unwrap(),
        "--no-local-node",
        "--oidc-issuer",
        &iss,
        "--oidc-audience",
        "tessera",
    ]);
    let admin = server.key.clone().unwrap();
    let (code, out, err) = tessera(
        &server.url,
        &admin,
        config,
        &["tenant", "create", "alpha", "-o", "json"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let alpha: Value = serde_json::from_str(&out).unwrap();
    let alpha_admin = alpha["admin_key"].as_str().unwrap();
    let (code, _, err) = tessera(
        &server.url,
        alpha_admin,
        config,
        &["user", "create", "alice", "--role", "developer"],
        "",
    );
    assert_eq!(code, 0, "{err}");
    let mut h = Header::new(Algorithm::EdDSA);
    h.kid = Some("k1".into());
    let token = encode(
        &h,
        &json!({"iss": iss, "aud": "tessera", "sub": "alice", "exp": now() + 600,
                "tessera_tenant": "alpha"}),
        &EncodingKey::from_ed_pem(KEY.as_bytes()).unwrap(),
    )
    .unwrap();
    let (code, _, err) = tessera(
        &server.url,
        "",
        config,
        &["login", "--url", &server.url, "--key-stdin"],
        &token,
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("as alice (tenant alpha, role developer)"),
        "{err}"
    );
}

#[test]
fn tessera_up_refuses_an_issuer_whose_document_names_another() {
    let iss = issuer(Some("https://elsewhere.example"));
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["up", "--listen", "127.0.0.1:0", "--no-local-node", "--data"])
        .arg(dir.path().join("data"))
        .args(["--oidc-issuer", &iss, "--oidc-audience", "tessera"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tessera up kept running with a mismatching issuer");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains("names the issuer \"https://elsewhere.example\"")
            && err.contains("--oidc-issuer https://elsewhere.example"),
        "{err}"
    );
}
