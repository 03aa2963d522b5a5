//! OAuth 2.0 / OIDC bearer tokens: JWTs signed by a configured issuer, checked
//! against the issuer's key set (JWKS), the issuer and the audience. The tenant comes
//! from a claim (`tessera_tenant` by default); the role comes from the role binding of
//! the token's subject (`sub`) in that tenant, as for API keys.
//!
//! The key set is either a saved file ([`OidcConfig::from_jwks_file`], never
//! refreshed) or discovered from the issuer ([`OidcConfig::discover`]): at start the
//! server reads `ISSUER/.well-known/openid-configuration`, checks that it names the
//! same issuer, and fetches its `jwks_uri`; then it fetches the key set again every
//! [`Refresh::every`] (so removed keys stop working), and when a token names a `kid`
//! it does not know — at most once per [`Refresh::unknown_kid_gap`], so tokens with
//! made-up kids cannot make it fetch on every request. A rotated key thus works
//! without a restart. [`Verifier`] is the running side.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{DecodingKey, Validation, decode, decode_header};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Who may issue tokens, for whom, and with which keys.
#[derive(Debug, Clone)]
pub struct OidcConfig {
    pub issuer: String,
    pub audience: String,
    pub keys: KeySource,
    /// The claim that names the caller's tenant.
    pub tenant_claim: String,
}

/// Where the issuer's keys come from.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// A key set saved from the issuer's `jwks_uri` (`--oidc-jwks FILE`); never
    /// refreshed: a rotation needs a new file and a restart.
    File(JwkSet),
    /// Discovered from the issuer at start and refreshed (`--oidc-issuer` alone).
    Discover(Refresh),
}

/// How a discovered key set is kept fresh.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refresh {
    /// Fetch the key set again this often (default 10 minutes).
    pub every: Duration,
    /// A token with an unknown `kid` fetches the key set at once, unless a
    /// fetch happened less than this ago (default 30 seconds).
    pub unknown_kid_gap: Duration,
    /// Each request's timeout (default 10 seconds).
    pub timeout: Duration,
}

impl Default for Refresh {
    fn default() -> Self {
        Refresh {
            every: Duration::from_secs(600),
            unknown_kid_gap: Duration::from_secs(30),
            timeout: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OidcConfigError {
    #[error("reading the JWKS file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("the JWKS file {path} is not a JSON Web Key Set: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
}

/// Why the issuer's keys could not be discovered (at start, or at a refresh).
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "{url}: an issuer's keys fetched over plain http could be replaced on the way; use https (http is accepted for 127.0.0.1, ::1 and localhost only)"
    )]
    Insecure { url: String },
    #[error("{url}: not a URL: {message}")]
    BadUrl { url: String, message: String },
    #[error("fetching {url}: {message}: check that the issuer is reachable from this server")]
    Fetch { url: String, message: String },
    #[error("{url} answered {status}: check the issuer URL")]
    Status { url: String, status: u16 },
    #[error("{url} is not an OpenID Provider configuration: {message}")]
    Document { url: String, message: String },
    #[error(
        "the discovery document at {url} names the issuer {found:?}, not {configured:?}: they must be identical (OpenID Connect Discovery 1.0, section 4.3); if {found:?} is the issuer you mean, start with --oidc-issuer {found}"
    )]
    IssuerMismatch {
        url: String,
        configured: String,
        found: String,
    },
    #[error("{url} is not a JSON Web Key Set: {message}")]
    Jwks { url: String, message: String },
    #[error("{url} holds no signing key this server can use ({skipped} skipped)")]
    NoKeys { url: String, skipped: usize },
}

impl OidcConfig {
    /// Loads the key set from a JWKS document (the issuer's `jwks_uri`, saved).
    pub fn from_jwks_file(
        issuer: &str,
        audience: &str,
        path: &Path,
    ) -> Result<Self, OidcConfigError> {
        let p = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| OidcConfigError::Read {
            path: p.clone(),
            source,
        })?;
        let jwks = serde_json::from_str(&text)
            .map_err(|source| OidcConfigError::Parse { path: p, source })?;
        Ok(Self::with_keys(issuer, audience, KeySource::File(jwks)))
    }

    /// Keys discovered from `issuer` when the server starts (no I/O here).
    pub fn discover(issuer: &str, audience: &str) -> Self {
        Self::with_keys(issuer, audience, KeySource::Discover(Refresh::default()))
    }

    /// The same, refreshed as `r` says (ignored for a key file).
    pub fn refreshed(mut self, r: Refresh) -> Self {
        if let KeySource::Discover(old) = &mut self.keys {
            *old = r;
        }
        self
    }

    fn with_keys(issuer: &str, audience: &str, keys: KeySource) -> Self {
        OidcConfig {
            issuer: issuer.into(),
            audience: audience.into(),
            keys,
            tenant_claim: "tessera_tenant".into(),
        }
    }
}

/// Checks tokens against the issuer's current keys; for a discovered issuer,
/// also fetches them (see the module's documentation).
#[derive(Debug)]
pub struct Verifier {
    issuer: String,
    audience: String,
    tenant_claim: String,
    keys: std::sync::RwLock<Arc<JwkSet>>,
    remote: Option<Remote>,
}

#[derive(Debug)]
struct Remote {
    jwks_uri: String,
    http: reqwest::Client,
    refresh: Refresh,
    /// When the key set was last fetched (or tried). Held across a fetch, so
    /// that many tokens with unknown kids at once make one fetch.
    last: tokio::sync::Mutex<Instant>,
    fetches: AtomicU64,
}

/// Whether `url` may be fetched: https, or http to this machine.
fn check_url(url: &str) -> Result<reqwest::Url, DiscoveryError> {
    let u = reqwest::Url::parse(url).map_err(|e| DiscoveryError::BadUrl {
        url: url.into(),
        message: e.to_string(),
    })?;
    let local = match u.host_str() {
        Some("localhost") => true,
        Some(h) => h
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|a| a.is_loopback()),
        None => false,
    };
    match u.scheme() {
        "https" => Ok(u),
        "http" if local => Ok(u),
        _ => Err(DiscoveryError::Insecure { url: url.into() }),
    }
}

async fn get_json(
    http: &reqwest::Client,
    url: &str,
    timeout: Duration,
) -> Result<Value, DiscoveryError> {
    let u = check_url(url)?;
    let fetch = |message: String| DiscoveryError::Fetch {
        url: url.into(),
        message,
    };
    let resp = http
        .get(u)
        .timeout(timeout)
        .header("accept", "application/json")
        .send()
        .await
        .map_err(|e| fetch(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(DiscoveryError::Status {
            url: url.into(),
            status: resp.status().as_u16(),
        });
    }
    // Bounded: a key set or a configuration is a few KiB.
    let bytes = resp.bytes().await.map_err(|e| fetch(e.to_string()))?;
    if bytes.len() > 1 << 20 {
        return Err(fetch(format!(
            "the reply has {} bytes, more than 1 MiB",
            bytes.len()
        )));
    }
    serde_json::from_slice(&bytes).map_err(|e| DiscoveryError::Document {
        url: url.into(),
        message: e.to_string(),
    })
}

/// The keys of a JWKS document this server can use; keys it cannot read (an
/// unknown type or algorithm, an encryption key) are skipped, not fatal.
fn usable_keys(url: &str, doc: &Value) -> Result<(JwkSet, usize), DiscoveryError> {
    let Some(list) = doc.get("keys").and_then(Value::as_array) else {
        return Err(DiscoveryError::Jwks {
            url: url.into(),
            message: "no \"keys\" array".into(),
        });
    };
    let mut keys = Vec::new();
    let mut skipped = 0;
    for k in list {
        // A published symmetric key ("oct") would let anyone sign: never used.
        let for_signing = k
            .get("use")
            .and_then(Value::as_str)
            .is_none_or(|u| u == "sig")
            && k.get("kty").and_then(Value::as_str) != Some("oct");
        match serde_json::from_value::<Jwk>(k.clone()) {
            Ok(jwk) if for_signing && DecodingKey::from_jwk(&jwk).is_ok() => keys.push(jwk),
            _ => skipped += 1,
        }
    }
    Ok((JwkSet { keys }, skipped))
}

impl Verifier {
    /// Makes the verifier of `cfg`; a discovered issuer is read now: its
    /// configuration (which must name the same issuer) and its key set.
    pub async fn start(cfg: &OidcConfig) -> Result<Verifier, DiscoveryError> {
        let (keys, remote) = match &cfg.keys {
            KeySource::File(k) => (k.clone(), None),
            KeySource::Discover(refresh) => {
                let http = reqwest::Client::builder()
                    // A redirect could lead to plain http elsewhere: not followed.
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| DiscoveryError::Fetch {
                        url: cfg.issuer.clone(),
                        message: e.to_string(),
                    })?;
                let url = format!(
                    "{}/.well-known/openid-configuration",
                    cfg.issuer.trim_end_matches('/')
                );
                let doc = get_json(&http, &url, refresh.timeout).await?;
                let found = doc.get("issuer").and_then(Value::as_str).unwrap_or("");
                if found != cfg.issuer {
                    return Err(DiscoveryError::IssuerMismatch {
                        url,
                        configured: cfg.issuer.clone(),
                        found: found.into(),
                    });
                }
                let Some(jwks_uri) = doc.get("jwks_uri").and_then(Value::as_str) else {
                    return Err(DiscoveryError::Document {
                        url,
                        message: "it has no \"jwks_uri\"".into(),
                    });
                };
                let remote = Remote {
                    jwks_uri: jwks_uri.to_string(),
                    http,
                    refresh: *refresh,
                    last: tokio::sync::Mutex::new(Instant::now()),
                    fetches: AtomicU64::new(0),
                };
                (remote.fetch().await?, Some(remote))
            }
        };
        Ok(Verifier {
            issuer: cfg.issuer.clone(),
            audience: cfg.audience.clone(),
            tenant_claim: cfg.tenant_claim.clone(),
            keys: std::sync::RwLock::new(Arc::new(keys)),
            remote,
        })
    }

    /// The task that fetches a discovered key set every [`Refresh::every`]
    /// until `stop` turns true (none for a key file). A failed fetch keeps the
    /// keys held and is logged.
    pub fn refresher(self: &Arc<Self>, stop: watch::Receiver<bool>) -> Option<JoinHandle<()>> {
        let every = self.remote.as_ref()?.refresh.every;
        let me = self.clone();
        let mut stop = stop;
        Some(tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(every) => {}
                }
                if let Err(e) = me.refresh().await {
                    tracing::warn!("OIDC: {e}; the keys held are kept");
                }
            }
        }))
    }

    /// Fetches the key set now and holds it (a discovered issuer only).
    pub async fn refresh(&self) -> Result<(), DiscoveryError> {
        let Some(r) = &self.remote else { return Ok(()) };
        let mut last = r.last.lock().await;
        *last = Instant::now();
        let keys = r.fetch().await?;
        *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys);
        Ok(())
    }

    /// Key sets fetched since start (the first one included).
    pub fn fetches(&self) -> u64 {
        self.remote
            .as_ref()
            .map_or(0, |r| r.fetches.load(Ordering::Relaxed))
    }

    /// A token naming a `kid` not held: fetch once, unless a fetch happened
    /// within the gap (then the token is refused without a fetch).
    async fn refetch_for_unknown_kid(&self) {
        let Some(r) = &self.remote else { return };
        let mut last = r.last.lock().await;
        if last.elapsed() < r.refresh.unknown_kid_gap {
            return;
        }
        *last = Instant::now();
        match r.fetch().await {
            Ok(keys) => *self.keys.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(keys),
            Err(e) => tracing::warn!("OIDC: {e}; the keys held are kept"),
        }
    }

    fn key_for(&self, kid: Option<&str>) -> Option<Jwk> {
        let keys = self.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        match kid {
            Some(kid) => keys.find(kid).cloned(),
            None if keys.keys.len() == 1 => Some(keys.keys[0].clone()),
            None => None,
        }
    }

    /// Validates `token`; returns (tenant, subject). Any failure is `None`: the
    /// caller answers 401 without saying why.
    pub async fn verify(&self, token: &str) -> Option<(String, String)> {
        let header = decode_header(token).ok()?;
        let jwk = match self.key_for(header.kid.as_deref()) {
            Some(k) => k,
            None => {
                self.refetch_for_unknown_kid().await;
                self.key_for(header.kid.as_deref())?
            }
        };
        // A key that names its algorithm is used with that one only.
        if let Some(alg) = jwk.common.key_algorithm {
            if alg.to_string() != format!("{:?}", header.alg) {
                return None;
            }
        }
        let key = DecodingKey::from_jwk(&jwk).ok()?;
        let mut v = Validation::new(header.alg);
        v.set_issuer(&[&self.issuer]);
        v.set_audience(&[&self.audience]);
        v.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        // A token not valid yet (`nbf` ahead) is refused, with the same leeway as `exp`.
        v.validate_nbf = true;
        #[derive(Deserialize)]
        struct Claims {
            sub: String,
            #[serde(flatten)]
            rest: serde_json::Map<String, serde_json::Value>,
        }
        let data = decode::<Claims>(token, &key, &v).ok()?;
        let tenant = data
            .claims
            .rest
            .get(&self.tenant_claim)?
            .as_str()?
            .to_string();
        Some((tenant, data.claims.sub))
    }
}

/// The verifier of `cfg` for [`crate::start`]: a discovered issuer is read now,
/// and a server whose issuer cannot be read does not start.
pub(crate) async fn start(
    cfg: Option<&OidcConfig>,
) -> Result<Option<Arc<Verifier>>, crate::StartError> {
    let Some(cfg) = cfg else { return Ok(None) };
    let v = Verifier::start(cfg)
        .await
        .map_err(|e| crate::StartError::Component {
            what: "OIDC (--oidc-issuer)",
            message: e.to_string(),
        })?;
    Ok(Some(Arc::new(v)))
}

impl Remote {
    async fn fetch(&self) -> Result<JwkSet, DiscoveryError> {
        self.fetches.fetch_add(1, Ordering::Relaxed);
        let doc = get_json(&self.http, &self.jwks_uri, self.refresh.timeout).await?;
        let (keys, skipped) = usable_keys(&self.jwks_uri, &doc)?;
        if keys.keys.is_empty() {
            return Err(DiscoveryError::NoKeys {
                url: self.jwks_uri.clone(),
                skipped,
            });
        }
        Ok(keys)
    }
}
