//! The access log and request ids. Every request gets an id: the caller's
//! `X-Request-Id` when it is a sane one (at most 64 characters of `A-Z a-z 0-9 - _
//! .`), else a fresh one; it is sent back in `X-Request-Id`, is a field of every
//! log event the request's handling emits (the `request` span), and ends on one
//! access line (target `tessera::access`, level info): method, path, status,
//! duration. Query strings are not logged (they may carry names the tenant chose).

use axum::extract::Request;
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Instrument;

/// The request id header, read and written.
pub const REQUEST_ID: &str = "x-request-id";

/// Axum middleware: the request id, the span and the access line.
pub async fn log(mut req: Request, next: Next) -> Response {
    let started = std::time::Instant::now();
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| sane(v))
        .map(str::to_string)
        .unwrap_or_else(|| crate::auth::random_hex(8));
    let header = HeaderValue::from_str(&id).ok();
    if let Some(v) = &header {
        req.headers_mut().insert(REQUEST_ID, v.clone());
    }
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let span = tracing::info_span!("request", request_id = %id);
    let mut r = next.run(req).instrument(span).await;
    if let Some(v) = header {
        r.headers_mut().insert(REQUEST_ID, v);
    }
    tracing::info!(
        target: "tessera::access",
        request_id = %id,
        method = %method,
        path = %path,
        status = r.status().as_u16(),
        duration_ms = started.elapsed().as_secs_f64() * 1000.0,
        "{method} {path} {}",
        r.status().as_u16()
    );
    r
}

fn sane(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 64
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sane_ids_are_taken_from_the_caller() {
        assert!(sane("4bf92f3577b34da6-a3ce929d0e0e4736"));
        assert!(!sane(""));
        assert!(!sane(&"a".repeat(65)));
        assert!(!sane("x\ny"), "no new lines in a log line");
        assert!(!sane("a b"));
    }
}
