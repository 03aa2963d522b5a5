//! The console (issue 23): plain HTML, CSS and JavaScript files under
//! `crates/server/ui/`, embedded in the binary and served at `/ui`. No build step and
//! no third-party browser code: the page reads only the public API (`/v1/…` and its
//! server-sent events) with the caller's key, which it keeps in session storage.
//!
//! Every path under `/ui` but `/ui/assets/…` serves the page (its views live in the
//! path and query, so links can be shared); `/` sends a browser to `/ui`. The files
//! carry a strict Content-Security-Policy (scripts and styles from this origin only,
//! no inline script, no framing, requests to this origin only).

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use crate::api::App;

/// One embedded file: name under `/ui/assets/`, content type, content.
struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static str,
}

const INDEX: &str = include_str!("../ui/index.html");

const ASSETS: &[Asset] = &[
    asset("app.css", "text/css", include_str!("../ui/app.css")),
    asset("app.js", JS, include_str!("../ui/app.js")),
    asset("api.js", JS, include_str!("../ui/api.js")),
    asset("util.js", JS, include_str!("../ui/util.js")),
    asset("cluster.js", JS, include_str!("../ui/cluster.js")),
    asset("queues.js", JS, include_str!("../ui/queues.js")),
    asset("jobs.js", JS, include_str!("../ui/jobs.js")),
    asset("agents.js", JS, include_str!("../ui/agents.js")),
    asset("pools.js", JS, include_str!("../ui/pools.js")),
    asset(
        "favicon.svg",
        "image/svg+xml",
        include_str!("../ui/favicon.svg"),
    ),
];

const JS: &str = "text/javascript; charset=utf-8";

const fn asset(name: &'static str, content_type: &'static str, body: &'static str) -> Asset {
    Asset {
        name,
        content_type,
        body,
    }
}

/// Scripts, styles, images and requests from this origin only; nothing inline,
/// no plugins, no framing, no forms posting elsewhere.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; \
                   frame-ancestors 'none'";

/// A short tag of a file's content for `ETag` (FNV-1a: stable across builds of the
/// same content, enough to tell versions apart).
fn etag(body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("\"{h:016x}\"")
}

fn serve(headers: &HeaderMap, content_type: &'static str, body: &'static str) -> Response {
    let tag = etag(body);
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == tag));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, content_type)], body).into_response()
    };
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Revalidated every time (cheap: 304), so a new binary's console is seen at once.
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(v) = HeaderValue::from_str(&tag) {
        h.insert(header::ETAG, v);
    }
    r
}

async fn page(headers: HeaderMap) -> Response {
    serve(&headers, "text/html; charset=utf-8", INDEX)
}

async fn page_at(headers: HeaderMap, Path(_): Path<String>) -> Response {
    serve(&headers, "text/html; charset=utf-8", INDEX)
}

async fn file(headers: HeaderMap, Path(name): Path<String>) -> Response {
    match ASSETS.iter().find(|a| a.name == name) {
        Some(a) => serve(&headers, a.content_type, a.body),
        None => (
            StatusCode::NOT_FOUND,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("no console file {name:?}"),
        )
            .into_response(),
    }
}

/// The console's routes (unauthenticated: static files; the page authenticates its
/// API calls with the key the user gives it).
pub(crate) fn routes() -> Router<App> {
    Router::new()
        .route("/", get(|| async { Redirect::to("/ui") }))
        .route("/ui", get(page))
        .route("/ui/", get(page))
        .route("/ui/assets/{name}", get(file))
        .route("/ui/{*path}", get(page_at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_script_the_page_imports_is_embedded() {
        let mut wanted: Vec<String> = Vec::new();
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            for line in a.body.lines() {
                let l = line.trim();
                if l.starts_with("import ") {
                    if let Some(p) = l.split('"').nth(1).and_then(|p| p.strip_prefix("./")) {
                        wanted.push(p.to_string());
                    }
                }
            }
        }
        for w in INDEX.split("/ui/assets/").skip(1) {
            wanted.push(w.split('"').next().unwrap().to_string());
        }
        assert!(!wanted.is_empty());
        for w in wanted {
            assert!(
                ASSETS.iter().any(|a| a.name == w),
                "{w} is used but not embedded"
            );
        }
    }

    #[test]
    fn no_inline_script_or_style_that_the_policy_would_block() {
        assert!(!INDEX.contains("<script>"), "inline script in index.html");
        assert!(!INDEX.contains("style="), "inline style in index.html");
        for a in ASSETS.iter().filter(|a| a.name.ends_with(".js")) {
            assert!(
                !a.body.contains(" style=\"") && !a.body.contains(" style='"),
                "{} writes a style attribute, which the policy blocks: set element.style instead",
                a.name
            );
            assert!(!a.body.contains("eval("), "{} calls eval", a.name);
        }
    }
}
