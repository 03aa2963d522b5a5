//! Errors as RFC 9457 problem details (`application/problem+json`), each with a
//! stable `code` that clients may match on.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use tessera_store::StoreError;

/// The stable error codes of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Code {
    /// 400: the body is not valid JSON/YAML, has an unknown field, or a value is wrong.
    InvalidRequest,
    /// 401: no credential, an unknown or wrong one, a revoked or expired one.
    Unauthenticated,
    /// 403: the caller's role does not allow this.
    Forbidden,
    /// 404: no such object in the caller's tenant (or no such route).
    NotFound,
    /// 409: the object already exists.
    AlreadyExists,
    /// 409: the resource version given is stale.
    Conflict,
    /// 410: a watch asked for changes that were compacted away; list again and
    /// watch from the list's revision.
    Compacted,
    /// 413: the body is larger than the server accepts.
    PayloadTooLarge,
    /// 415: the body is neither JSON nor YAML.
    UnsupportedMediaType,
    /// 500: a bug or a failing store.
    Internal,
    /// 429: a quota (runtimes per tenant, versions per runtime, ...) is reached.
    QuotaExceeded,
    /// 402: a session's or tenant's budget is spent.
    BudgetExceeded,
    /// 503: a dependency (a session's agent, the sandboxes) is not available now.
    Unavailable,
    /// The object went away under the request (a sandbox killed during its command).
    Gone,
}

impl Code {
    pub fn status(self) -> StatusCode {
        match self {
            Code::InvalidRequest => StatusCode::BAD_REQUEST,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::Forbidden => StatusCode::FORBIDDEN,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::AlreadyExists | Code::Conflict => StatusCode::CONFLICT,
            Code::Compacted => StatusCode::GONE,
            Code::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Code::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Code::QuotaExceeded => StatusCode::TOO_MANY_REQUESTS,
            Code::BudgetExceeded => StatusCode::PAYMENT_REQUIRED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Gone => StatusCode::GONE,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidRequest => "invalid_request",
            Code::Unauthenticated => "unauthenticated",
            Code::Forbidden => "forbidden",
            Code::NotFound => "not_found",
            Code::AlreadyExists => "already_exists",
            Code::Conflict => "conflict",
            Code::Compacted => "compacted",
            Code::PayloadTooLarge => "payload_too_large",
            Code::UnsupportedMediaType => "unsupported_media_type",
            Code::Internal => "internal",
            Code::QuotaExceeded => "quota_exceeded",
            Code::BudgetExceeded => "budget_exceeded",
            Code::Unavailable => "unavailable",
            Code::Gone => "gone",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Code::InvalidRequest => "The request is invalid",
            Code::Unauthenticated => "Authentication required",
            Code::Forbidden => "Not allowed for this role",
            Code::NotFound => "Not found",
            Code::AlreadyExists => "Already exists",
            Code::Conflict => "Resource version conflict",
            Code::Compacted => "Revision compacted",
            Code::PayloadTooLarge => "Request body too large",
            Code::UnsupportedMediaType => "Unsupported media type",
            Code::Internal => "Internal error",
            Code::QuotaExceeded => "Quota exceeded",
            Code::BudgetExceeded => "Budget exceeded",
            Code::Unavailable => "Unavailable",
            Code::Gone => "Gone",
        }
    }
}

/// An API error: a code, a human detail, and where it applies, the field path.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {detail}", code.as_str())]
pub struct ApiError {
    pub code: Code,
    pub detail: String,
    pub field: Option<String>,
}

impl ApiError {
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        ApiError {
            code,
            detail: detail.into(),
            field: None,
        }
    }
    pub fn invalid(field: impl Into<String>, detail: impl Into<String>) -> Self {
        ApiError {
            code: Code::InvalidRequest,
            detail: detail.into(),
            field: Some(field.into()),
        }
    }
    pub fn not_found(what: impl std::fmt::Display) -> Self {
        ApiError::new(Code::NotFound, format!("{what} not found"))
    }
    pub fn unauthenticated(detail: impl Into<String>) -> Self {
        ApiError::new(Code::Unauthenticated, detail)
    }
    pub fn forbidden(detail: impl Into<String>) -> Self {
        ApiError::new(Code::Forbidden, detail)
    }
    pub fn internal(detail: impl std::fmt::Display) -> Self {
        ApiError::new(Code::Internal, detail.to_string())
    }
}

/// The problem document, as sent.
#[derive(Debug, Serialize)]
pub struct Problem<'a> {
    #[serde(rename = "type")]
    pub type_: String,
    pub title: &'a str,
    pub status: u16,
    pub detail: &'a str,
    pub code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub field: Option<&'a str>,
}

/// Longest `detail` a problem document carries, in bytes: an error never echoes a
/// whole hostile value back (a 100 kB name in a 400), whatever the code that made it.
pub const MAX_DETAIL: usize = 1024;

/// A value quoted for an error message: at most 64 characters of it, with how many
/// bytes were left out.
pub fn quote(s: &str) -> String {
    const KEEP: usize = 64;
    match s.char_indices().nth(KEEP) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes in all)", &s[..cut], s.len()),
    }
}

/// `detail` cut to [`MAX_DETAIL`] bytes on a character boundary.
fn bounded(detail: &str) -> std::borrow::Cow<'_, str> {
    if detail.len() <= MAX_DETAIL {
        return detail.into();
    }
    let mut cut = MAX_DETAIL;
    while !detail.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}… ({} bytes in all)", &detail[..cut], detail.len()).into()
}

/// The problem document of an error, as JSON (also sent as a watch's last
/// `event: error`).
pub fn problem_json(e: &ApiError) -> serde_json::Value {
    let status = e.code.status();
    let detail = bounded(&e.detail);
    let field = e.field.as_deref().map(bounded);
    serde_json::to_value(Problem {
        type_: format!(
            "https://tessera.invalid/problems/{}",
            e.code.as_str().replace('_', "-")
        ),
        title: e.code.title(),
        status: status.as_u16(),
        detail: &detail,
        code: e.code.as_str(),
        field: field.as_deref(),
    })
    .unwrap_or_default()
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        let p = problem_json(&self);
        let body = serde_json::to_vec(&p).unwrap_or_default();
        let mut r = (status, body).into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/problem+json"),
        );
        if status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound(k) => ApiError::not_found(format!("{} {:?}", k.kind, k.name)),
            StoreError::AlreadyExists(k) => ApiError::new(
                Code::AlreadyExists,
                format!("{} {:?} already exists", k.kind, k.name),
            ),
            StoreError::Conflict {
                key,
                expected,
                actual,
            } => ApiError {
                code: Code::Conflict,
                detail: format!(
                    "{} {:?} is at resource version {actual}, not {expected}: read it again and retry",
                    key.kind, key.name
                ),
                field: Some("resource_version".into()),
            },
            StoreError::Compacted {
                requested,
                compacted,
            } => ApiError {
                code: Code::Compacted,
                detail: format!(
                    "revision {requested} is no longer in the change log (compacted through {compacted}): list the objects again and watch with after= the list's resource_version"
                ),
                field: Some("after".into()),
            },
            other => ApiError::internal(other),
        }
    }
}
