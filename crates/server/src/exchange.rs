//! Token exchange (RFC 8693): an agent session trades its key for a short-lived,
//! audience-bound JWT that acts for the user who started the session towards one
//! tool. `POST /v1/token` (form-encoded, as OAuth clients send it) with
//! `grant_type=urn:ietf:params:oauth:grant-type:token-exchange`, the session's key
//! as `subject_token` and a tool's name as `audience`; the tool gateway does the
//! same for tools registered with `auth: exchange` ([`TokenIssuer`] is its
//! [`Delegation`]). The token is signed with an Ed25519 key kept in the data folder
//! (`keys/token-signing.key`, 0600); `GET /v1/token/jwks` publishes its public half.
//! Every exchange is an audit entry naming the chain: the session (who asked), the
//! user (`sub`), the tool (`aud`), the token's id.
//!
//! The handlers parse and render; [`TokenIssuer::exchange`] decides.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_agent::tools::{self as gw, Delegation};
use tessera_store::{AnyStore, Key, Store};

use crate::api::App;
use crate::plane::{Caller, ControlPlane, SESSION_SUBJECT, now_ms};

pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub const ACCESS_TOKEN: &str = "urn:ietf:params:oauth:token-type:access_token";
pub const JWT: &str = "urn:ietf:params:oauth:token-type:jwt";
/// The `iss` of every token this server mints.
pub const ISSUER: &str = "tessera";
/// How long a minted token lives (never past its session's end).
pub const TOKEN_TTL: Duration = Duration::from_secs(300);

/// The server's token signer.
pub struct TokenIssuer {
    key: EncodingKey,
    kid: String,
    /// The public key, base64url (the JWK's `x`).
    x: String,
    plane: ControlPlane,
    gateway: gw::ToolGateway<AnyStore>,
}

impl std::fmt::Debug for TokenIssuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIssuer")
            .field("kid", &self.kid)
            .finish()
    }
}

/// A token exchange request (RFC 8693 section 2.1), as sent.
#[derive(Debug, Default, Deserialize)]
pub struct ExchangeRequest {
    #[serde(default)]
    pub grant_type: String,
    #[serde(default)]
    pub subject_token: String,
    #[serde(default)]
    pub subject_token_type: String,
    #[serde(default)]
    pub audience: Option<String>,
    #[serde(default)]
    pub requested_token_type: Option<String>,
    #[serde(default)]
    pub actor_token: Option<String>,
    #[serde(default)]
    pub scope: Option<String>,
    #[serde(default)]
    pub resource: Option<String>,
}

/// A successful exchange (RFC 8693 section 2.2.1).
#[derive(Debug, Serialize)]
pub struct Exchanged {
    pub access_token: String,
    pub issued_token_type: &'static str,
    pub token_type: &'static str,
    pub expires_in: u64,
}

/// Why an exchange was refused, as RFC 6749 section 5.2 codes it.
#[derive(Debug, thiserror::Error)]
pub enum ExchangeError {
    #[error("grant_type {0:?} is not supported: use {GRANT_TYPE}")]
    UnsupportedGrantType(String),
    #[error("{field}: {message}")]
    InvalidRequest {
        field: &'static str,
        message: String,
    },
    #[error("audience {audience:?}: {message}")]
    InvalidTarget { audience: String, message: String },
    #[error("{0}")]
    Server(String),
}

impl ExchangeError {
    /// The `error` code of the reply.
    pub fn code(&self) -> &'static str {
        match self {
            ExchangeError::UnsupportedGrantType(_) => "unsupported_grant_type",
            ExchangeError::InvalidRequest { .. } => "invalid_request",
            ExchangeError::InvalidTarget { .. } => "invalid_target",
            ExchangeError::Server(_) => "server_error",
        }
    }
}

fn invalid(field: &'static str, message: impl Into<String>) -> ExchangeError {
    ExchangeError::InvalidRequest {
        field,
        message: message.into(),
    }
}

/// A PKCS#8 document holding an Ed25519 private key (RFC 8410): a fixed prefix
/// and the 32-byte seed.
fn ed25519_pkcs8(seed: &[u8; 32]) -> Vec<u8> {
    const PREFIX: [u8; 16] = [
        0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04,
        0x20,
    ];
    let mut der = PREFIX.to_vec();
    der.extend_from_slice(seed);
    der
}

impl TokenIssuer {
    /// Opens (or, on the first start, makes) the signing key under `data/keys`.
    pub fn open(
        data: &Path,
        plane: ControlPlane,
        gateway: gw::ToolGateway<AnyStore>,
    ) -> Result<TokenIssuer, String> {
        let seed = crate::keyfile::seed(
            data,
            "token-signing.key",
            "tokens it signed stop verifying; a new key is made if the file is removed",
        )?;
        let public = ed25519_dalek::SigningKey::from_bytes(&seed)
            .verifying_key()
            .to_bytes();
        let x = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public);
        let kid = crate::auth::fingerprint(&x)[..16].to_string();
        Ok(TokenIssuer {
            key: EncodingKey::from_ed_der(&ed25519_pkcs8(&seed)),
            kid,
            x,
            plane,
            gateway,
        })
    }

    /// The public key set tools verify tokens with.
    pub fn jwks(&self) -> Value {
        json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig",
                         "kid": self.kid, "x": self.x}]})
    }

    /// Checks an exchange request and mints its token.
    pub async fn exchange(&self, req: ExchangeRequest) -> Result<Exchanged, ExchangeError> {
        if req.grant_type != GRANT_TYPE {
            return Err(ExchangeError::UnsupportedGrantType(req.grant_type));
        }
        for (field, v) in [
            ("actor_token", &req.actor_token),
            ("scope", &req.scope),
            ("resource", &req.resource),
        ] {
            if v.is_some() {
                return Err(invalid(
                    field,
                    "not supported: the actor is the session whose key is the subject_token, and the audience names the tool",
                ));
            }
        }
        if req.subject_token_type != ACCESS_TOKEN {
            return Err(invalid(
                "subject_token_type",
                format!("use {ACCESS_TOKEN} (the session's key)"),
            ));
        }
        if let Some(t) = req.requested_token_type.as_deref().filter(|t| *t != JWT) {
            return Err(invalid(
                "requested_token_type",
                format!("{t:?}: only {JWT} is issued"),
            ));
        }
        let audience = req
            .audience
            .filter(|a| !a.is_empty())
            .ok_or_else(|| invalid("audience", "name the tool the token is for"))?;
        let caller = self
            .plane
            .authenticate(Some(&format!("Bearer {}", req.subject_token)))
            .await
            .map_err(|_| invalid("subject_token", "not a valid key"))?;
        let Some(session) = caller.subject.strip_prefix(SESSION_SUBJECT) else {
            return Err(invalid(
                "subject_token",
                "not a session's key: only an agent session exchanges its key, to act for the user who started it",
            ));
        };
        let granted = self
            .gateway
            .granted_tools(&crate::tools::gw_caller(&caller), session)
            .await
            .map_err(|e| match e {
                gw::CallError::Store(e) => ExchangeError::Server(e.to_string()),
                // The session is gone or over: its key acts for nobody now.
                e => invalid("subject_token", e.to_string()),
            })?;
        if !granted.iter().any(|t| t.spec.name == audience) {
            return Err(ExchangeError::InvalidTarget {
                message: format!(
                    "no tool of that name is granted to session {session:?}: an admin grants it with POST /v1/tools/{audience}/grants"
                ),
                audience,
            });
        }
        self.mint(
            &caller.tenant,
            session,
            &audience,
            &caller.key_id,
            "exchange",
        )
        .await
    }

    /// A token for the user who started `session`, towards `tool`, audited with
    /// the chain (`key_id` and `via`: how it was asked). The grant is the
    /// caller's to check.
    async fn mint(
        &self,
        tenant: &str,
        session: &str,
        tool: &str,
        key_id: &str,
        via: &str,
    ) -> Result<Exchanged, ExchangeError> {
        let store = self.plane.store();
        let record = store
            .get(&Key::new(
                tessera_agent::sessions::KIND_SESSION,
                tenant,
                session,
            ))
            .await
            .map_err(|e| ExchangeError::Server(e.to_string()))?;
        let body = record.map(|o| o.body).unwrap_or_default();
        let Some(user) = body.get("started_by").and_then(Value::as_str) else {
            return Err(invalid(
                "subject_token",
                format!(
                    "session {session:?} has no recorded user (it was started before tokens were exchanged): start a new session"
                ),
            ));
        };
        let act = format!("{SESSION_SUBJECT}{session}");
        let now = now_ms() / 1000;
        let mut exp = now + TOKEN_TTL.as_secs();
        if let Some(end) = body.get("expires_at_ms").and_then(Value::as_u64) {
            exp = exp.min(end / 1000);
        }
        let jti = crate::auth::random_hex(16);
        let claims = json!({
            "iss": ISSUER, "sub": user, "aud": tool, "iat": now, "nbf": now, "exp": exp,
            "jti": jti, "act": {"sub": act}, "tessera_tenant": tenant,
        });
        let mut header = Header::new(Algorithm::EdDSA);
        header.kid = Some(self.kid.clone());
        let token = jsonwebtoken::encode(&header, &claims, &self.key)
            .map_err(|e| ExchangeError::Server(format!("signing the token: {e}")))?;
        let by = Caller {
            tenant: tenant.into(),
            subject: act.clone(),
            key_id: key_id.into(),
            role: crate::auth::Role::Developer,
        };
        crate::tools::audit(
            store,
            &by,
            "token-exchange",
            format!("tool/{tool} sub={user} act={act} jti={jti} exp={exp} via={via}"),
        )
        .await;
        Ok(Exchanged {
            access_token: token,
            issued_token_type: JWT,
            token_type: "Bearer",
            expires_in: exp.saturating_sub(now),
        })
    }
}

/// What the tool gateway asks for a tool registered with `auth: exchange`.
pub(crate) struct GatewayDelegation(pub Arc<TokenIssuer>);

impl Delegation for GatewayDelegation {
    fn token<'a>(
        &'a self,
        tenant: &'a str,
        session_id: &'a str,
        tool: &'a str,
    ) -> gw::BoxFuture<'a, Result<String, String>> {
        Box::pin(async move {
            self.0
                .mint(tenant, session_id, tool, "tool-gateway", "tool-call")
                .await
                .map(|t| t.access_token)
                .map_err(|e| format!("exchanging a token for tool {tool:?}: {e}"))
        })
    }
}

/// The routes of this module. Not in the authenticated route table: the
/// credential is the form's `subject_token`, and the key set is public.
pub(crate) fn routes() -> axum::Router<App> {
    axum::Router::new()
        .route("/v1/token", post(token))
        .route("/v1/token/jwks", get(jwks))
}

async fn token(State(a): State<App>, body: Bytes) -> Response {
    let out = match serde_urlencoded::from_bytes::<ExchangeRequest>(&body) {
        Ok(req) => a.tools.tokens.exchange(req).await,
        Err(e) => Err(invalid(
            "body",
            format!("not a form (application/x-www-form-urlencoded): {e}"),
        )),
    };
    match out {
        Ok(t) => (
            [("cache-control", "no-store"), ("pragma", "no-cache")],
            Json(t),
        )
            .into_response(),
        Err(e) => {
            let status = match e {
                ExchangeError::Server(_) => StatusCode::INTERNAL_SERVER_ERROR,
                _ => StatusCode::BAD_REQUEST,
            };
            (
                status,
                [("cache-control", "no-store")],
                Json(json!({"error": e.code(), "error_description": e.to_string()})),
            )
                .into_response()
        }
    }
}

async fn jwks(State(a): State<App>) -> Response {
    Json(a.tools.tokens.jwks()).into_response()
}
