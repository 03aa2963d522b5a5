//! The HTTP face: routes under `/v1`, extractors that turn requests into typed
//! calls (a bad body is a 400 naming the field, an oversized one a 413), and the
//! OpenAPI document. Handlers only translate between HTTP and [`ControlPlane`].

use std::convert::Infallible;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures_util::{StreamExt, stream};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tessera_model::Node;

use crate::plane::{Caller, ControlPlane, render};
use crate::problem::{ApiError, Code};
use crate::wire::*;

/// Shared state of the HTTP layer.
#[derive(Clone, Debug)]
pub struct App {
    pub plane: ControlPlane,
    pub body_limit: usize,
    pub metrics: std::sync::Arc<crate::metrics::Metrics>,
    /// The pillars served next to the core API; each module owns its state.
    pub sandboxes: crate::sandboxes::SandboxesState,
    pub agents: crate::agents::AgentsState,
    pub tools: crate::tools::ToolsState,
    pub gateway: crate::gateway::GatewayState,
    pub cluster: crate::cluster::ClusterState,
    /// The local node's verifier, when it has a TPM (`tessera up --tpm`).
    pub attester: Option<std::sync::Arc<crate::attestation::Attester>>,
    /// The weights store and key service.
    pub weights: std::sync::Arc<crate::weights::KeyService>,
}

/// A tenant-wide caller: a user's, service account's or OIDC key. Session-scoped keys
/// (the key code inside a session's sandbox holds) are refused here, so every route
/// that takes a `Caller` is closed to them by construction; the routes a session's
/// agent needs take [`SessionCaller`] instead.
impl FromRequestParts<App> for Caller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        let c = authenticate(parts, app).await?;
        if let Some(s) = c.session() {
            return Err(ApiError::forbidden(format!(
                "this is the key of session {s:?}: it acts only on that session (its memory, \
                 history, checkpoints, spans and usage, the tools granted to it, the models \
                 of the gateway), not on the tenant's other objects"
            )));
        }
        Ok(c)
    }
}

async fn authenticate(parts: &Parts, app: &App) -> Result<Caller, ApiError> {
    let h = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let c = app.plane.authenticate(h).await?;
    crate::cluster::view_as(
        &app.plane,
        c,
        parts.headers.get(crate::cluster::VIEW_AS_HEADER),
    )
    .await
}

/// A caller that may also be a session-scoped key: for the few routes the agent inside
/// a session's sandbox uses (its own session's memory, history, checkpoints, spans and
/// usage; tool calls and MCP; the gateway's models). Each such handler checks that a
/// session key names its own session ([`Caller::session`]).
pub struct SessionCaller(pub Caller);

impl FromRequestParts<App> for SessionCaller {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        authenticate(parts, app).await.map(SessionCaller)
    }
}

/// A JSON (or YAML, by `Content-Type`) body with unknown fields rejected and the
/// failing field named.
pub struct Body<T>(pub T);

impl<T: DeserializeOwned> FromRequest<App> for Body<T> {
    type Rejection = ApiError;
    async fn from_request(req: Request, app: &App) -> Result<Self, ApiError> {
        let ct = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("application/json")
            .to_ascii_lowercase();
        let yaml = ["application/yaml", "application/x-yaml", "text/yaml"]
            .iter()
            .any(|p| ct.starts_with(p));
        if !yaml && !ct.starts_with("application/json") {
            return Err(ApiError::new(
                Code::UnsupportedMediaType,
                format!("Content-Type {ct:?}: send application/json or application/yaml"),
            ));
        }
        let limit = app.body_limit;
        let bytes = Bytes::from_request(req, app).await.map_err(|r| {
            if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    Code::PayloadTooLarge,
                    format!("the body is larger than {limit} bytes"),
                )
            } else {
                ApiError::new(Code::InvalidRequest, r.body_text())
            }
        })?;
        let res = if yaml {
            serde_path_to_error::deserialize(serde_norway::Deserializer::from_slice(&bytes))
                .map_err(|e| (e.path().to_string(), e.inner().to_string()))
        } else {
            let mut de = serde_json::Deserializer::from_slice(&bytes);
            match serde_path_to_error::deserialize(&mut de) {
                Ok(v) => de
                    .end()
                    .map(|()| v)
                    .map_err(|e| (".".to_string(), e.to_string())),
                Err(e) => Err((e.path().to_string(), e.inner().to_string())),
            }
        };
        match res {
            Ok(v) => Ok(Body(v)),
            Err((path, msg)) => {
                let what = if yaml { "YAML" } else { "JSON" };
                Err(ApiError::invalid(
                    path.clone(),
                    format!("malformed {what} at {path}: {msg}"),
                ))
            }
        }
    }
}

/// Query parameters, with a problem document on failure.
pub struct Q<T>(pub T);

impl<T: DeserializeOwned + Send> FromRequestParts<App> for Q<T> {
    type Rejection = ApiError;
    async fn from_request_parts(parts: &mut Parts, app: &App) -> Result<Self, ApiError> {
        match Query::<T>::from_request_parts(parts, app).await {
            Ok(Query(v)) => Ok(Q(v)),
            Err(e) => Err(ApiError::invalid("query", e.body_text())),
        }
    }
}

/// A handler's reply: JSON on success, a problem document on failure. The
/// helpers below are shared by every module's handlers.
pub(crate) type R = Result<Response, ApiError>;

pub(crate) fn ok(v: Value) -> R {
    Ok(Json(v).into_response())
}
pub(crate) fn created(v: Value) -> R {
    Ok((StatusCode::CREATED, Json(v)).into_response())
}
pub(crate) fn items(v: Vec<Value>) -> R {
    Ok(Json(json!({ "items": v })).into_response())
}

async fn whoami(State(a): State<App>, SessionCaller(c): SessionCaller) -> R {
    ok(a.plane.whoami(&c))
}
async fn create_tenant(State(a): State<App>, c: Caller, Body(b): Body<NewTenant>) -> R {
    created(a.plane.create_tenant(&c, b).await?)
}
async fn list_tenants(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_tenants(&c).await?)
}
async fn get_tenant(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.get_tenant(&c, &n).await?)
}
async fn create_key(State(a): State<App>, c: Caller, Body(b): Body<NewApiKey>) -> R {
    created(a.plane.create_key(&c, b).await?)
}
async fn list_keys(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_keys(&c).await?)
}
async fn revoke_key(State(a): State<App>, c: Caller, Path(id): Path<String>) -> R {
    ok(a.plane.revoke_key(&c, &id).await?)
}
async fn put_binding(
    State(a): State<App>,
    c: Caller,
    Path(s): Path<String>,
    Body(b): Body<RoleBindingSpec>,
) -> R {
    ok(a.plane.put_binding(&c, &s, b).await?)
}
async fn list_bindings(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_bindings(&c).await?)
}
async fn delete_binding(State(a): State<App>, c: Caller, Path(s): Path<String>) -> R {
    ok(a.plane.delete_binding(&c, &s).await?)
}
async fn list_nodes(State(a): State<App>, c: Caller) -> R {
    items(
        a.cluster
            .with_gpu_use(a.plane.list_nodes(&c).await?)
            .await?,
    )
}
async fn get_node(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    let v = a.plane.get_node(&c, &n).await?;
    ok(a.cluster.with_gpu_use(vec![v]).await?.remove(0))
}
async fn get_attestation(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.get_attestation(&c, &n).await?)
}
async fn check_attestation(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane
        .check_attestation(&c, &n, a.attester.as_deref())
        .await?)
}
async fn trust_node(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.trust_node(&c, &n, a.attester.as_deref()).await?)
}
async fn put_node(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Body(b): Body<Node>,
) -> R {
    ok(a.plane.put_node(&c, &n, b).await?)
}
async fn create_queue(State(a): State<App>, c: Caller, Body(b): Body<QueueSpec>) -> R {
    created(a.plane.create_queue(&c, b).await?)
}
async fn list_queues(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_queues(&c).await?)
}
async fn get_queue(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.get_queue(&c, &n).await?)
}
async fn put_queue(
    State(a): State<App>,
    c: Caller,
    Path(n): Path<String>,
    Body(b): Body<QueueSpec>,
) -> R {
    ok(a.plane.put_queue(&c, &n, b).await?)
}
async fn delete_queue(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.delete_queue(&c, &n).await?)
}
async fn submit_job(State(a): State<App>, c: Caller, Body(b): Body<JobSpec>) -> R {
    created(a.plane.submit_job(&c, b).await?)
}
async fn list_jobs(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_jobs(&c).await?)
}
async fn get_job(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.get_job(&c, &n).await?)
}
async fn cancel_job(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    ok(a.plane.cancel_job(&c, &n).await?)
}
async fn delete_job(State(a): State<App>, c: Caller, Path(n): Path<String>) -> R {
    match a.plane.delete_job(&c, &n).await? {
        (v, true) => ok(v),
        (v, false) => Ok((StatusCode::ACCEPTED, Json(v)).into_response()),
    }
}
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    #[serde(default)]
    task: Option<String>,
    /// With `task`: the log from this byte on, and `X-Tessera-Log-Offset` the next one.
    #[serde(default)]
    from: Option<u64>,
}

async fn job_logs(State(a): State<App>, c: Caller, Path(n): Path<String>, Q(q): Q<LogsQuery>) -> R {
    let plain = (header::CONTENT_TYPE, "text/plain; charset=utf-8");
    match (q.from, q.task.as_deref()) {
        (Some(from), Some(task)) => {
            let (text, next) = a.plane.job_log_from(&c, &n, task, from).await?;
            let next = header::HeaderValue::from(next);
            Ok(([plain], [(LOG_OFFSET, next)], text).into_response())
        }
        (Some(_), None) => Err(ApiError::invalid(
            "from",
            "from reads one task's log: give task=NAME too",
        )),
        (None, task) => {
            let text = a.plane.job_logs(&c, &n, task).await?;
            Ok(([plain], text).into_response())
        }
    }
}

/// The byte offset to ask for next (`?from=`) when reading a growing log.
const LOG_OFFSET: header::HeaderName = header::HeaderName::from_static("x-tessera-log-offset");
async fn list_templates(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_templates(&c)?)
}
async fn list_events(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_events(&c).await?)
}
async fn list_audit(State(a): State<App>, c: Caller) -> R {
    items(a.plane.list_audit(&c).await?)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    kind: String,
    #[serde(default)]
    after: Option<u64>,
}

/// Server-sent events: one event per change, `event:` created|updated|deleted,
/// `id:` the revision (resume with `?after=`), `data:` the object as GET renders it.
///
/// Sandboxes live in the server's memory, not the store: `kind=sandbox` follows their
/// own feed ([`crate::sandboxes::watch`]), numbered apart from the store's revisions;
/// `kind=pool` samples the inference pools' gauges ([`crate::gateway::watch_pools`]).
async fn watch(State(a): State<App>, c: Caller, Q(q): Q<WatchQuery>) -> Result<Response, ApiError> {
    if q.kind == crate::sandboxes::WATCH_KIND {
        let s = crate::sandboxes::watch(&a, &c, q.after)?;
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    if q.kind == crate::gateway::WATCH_KIND {
        let s = crate::gateway::watch_pools(&a, &c, q.after)?;
        return Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response());
    }
    let w = a.plane.watch(&c, q.after, &q.kind).await?;
    // A watch that falls behind the change log's compaction (or whose store
    // fails) ends with one `event: error` carrying the problem document.
    let s = stream::unfold(Some(w), |w| async move {
        let mut w = w?;
        match w.next().await {
            Ok(changes) => Some((Ok(changes), Some(w))),
            Err(e) => Some((Err(ApiError::from(e)), None)),
        }
    })
    .flat_map(|batch| {
        let events: Vec<Result<Event, Infallible>> = match batch {
            Ok(changes) => changes
                .into_iter()
                .map(|ch| {
                    let op = match ch.op {
                        tessera_store::ChangeOp::Created => "created",
                        tessera_store::ChangeOp::Updated => "updated",
                        tessera_store::ChangeOp::Deleted => "deleted",
                    };
                    Ok(Event::default()
                        .event(op)
                        .id(ch.version().to_string())
                        .data(render_watched(&ch.object).to_string()))
                })
                .collect(),
            Err(e) => vec![Ok(Event::default()
                .event("error")
                .data(crate::problem::problem_json(&e).to_string()))],
        };
        stream::iter(events)
    });
    Ok(Sse::new(s).keep_alive(KeepAlive::default()).into_response())
}

/// A watched object as its kind's GET renders it.
fn render_watched(o: &tessera_store::Object) -> Value {
    if o.kind == tessera_agent::sessions::KIND_SESSION {
        if let Some(v) = crate::agents::watched_session(o) {
            return v;
        }
    }
    render(o)
}

async fn openapi() -> Json<Value> {
    Json(openapi_document())
}

async fn healthz() -> &'static str {
    "ok"
}

async fn metrics(
    State(a): State<App>,
    headers: axum::http::HeaderMap,
) -> Result<Response, ApiError> {
    use crate::metrics::{gather, tenants};
    use tessera_store::Store;
    let auth = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let scope = gather::scope(&a.plane, auth).await?;
    let rev = a.plane.store().revision().await.unwrap_or(0);
    let mut text = a.metrics.render(rev);
    // Inference pools: the scaling signal and load (issue 10).
    text.push_str(&a.gateway.gateway.prometheus());
    let facts = gather::facts(&scope, &a.cluster, &a.sandboxes, a.plane.store()).await?;
    text.push_str(&tenants::render(&facts, &scope));
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response())
}

/// Counts every response and its latency (to the response head) under the family
/// of the route it matched.
async fn count(State(a): State<App>, req: Request, next: axum::middleware::Next) -> Response {
    let started = std::time::Instant::now();
    let route = req
        .extensions()
        .get::<axum::extract::MatchedPath>()
        .map(|m| m.as_str().to_string());
    let method = req.method().clone();
    let r = next.run(req).await;
    a.metrics.observe_request(
        route.as_deref(),
        method.as_str(),
        r.status().as_u16(),
        started.elapsed().as_secs_f64(),
    );
    r
}

async fn no_route() -> ApiError {
    ApiError::new(
        Code::NotFound,
        "no such route: the API lives under /v1, see /v1/openapi.json",
    )
}

/// One route of the API, for the router and the OpenAPI document alike.
pub struct RouteDoc {
    pub method: &'static str,
    pub path: &'static str,
    pub summary: &'static str,
    /// The request body schema name, if any.
    pub body: Option<&'static str>,
    /// The success status.
    pub status: u16,
}

/// Declares a module's routes once, for its router and the OpenAPI document:
/// `routes! { TABLE, router_fn; get "/v1/x" handler "Summary" None, 200; ... }`.
macro_rules! routes {
    ($table:ident, $router:ident; $( $m:ident $p:literal $h:ident $sum:literal $body:expr, $st:literal; )*) => {
        /// Every authenticated route of this module.
        pub const $table: &[$crate::api::RouteDoc] = &[
            $( $crate::api::RouteDoc { method: stringify!($m), path: $p, summary: $sum, body: $body, status: $st }, )*
        ];
        pub(crate) fn $router() -> axum::Router<$crate::api::App> {
            let r = axum::Router::new();
            $( let r = r.route($p, axum::routing::$m($h)); )*
            r
        }
    };
}
pub(crate) use routes;

/// Every module's route table, in the order the OpenAPI document lists them.
pub const ROUTE_TABLES: &[&[RouteDoc]] = &[
    ROUTES,
    crate::identity::ROUTES,
    crate::sandboxes::ROUTES,
    crate::agents::ROUTES,
    crate::tools::ROUTES,
    crate::gateway::ROUTES,
    crate::guardpol::ROUTES,
    crate::queuecaps::ROUTES,
    crate::cluster::ROUTES,
    crate::weights::ROUTES,
];

routes! {
    ROUTES, api_routes;
    get "/v1/whoami" whoami "The caller's tenant, subject and role" None, 200;
    post "/v1/tenants" create_tenant "Create a tenant and its first admin key (system admins)" Some("NewTenant"), 201;
    get "/v1/tenants" list_tenants "List tenants (the caller's own, or all for system admins)" None, 200;
    get "/v1/tenants/{name}" get_tenant "Get a tenant" None, 200;
    post "/v1/apikeys" create_key "Create an API key; the key text is shown only in this reply" Some("NewApiKey"), 201;
    get "/v1/apikeys" list_keys "List the tenant's API keys (never their secrets)" None, 200;
    delete "/v1/apikeys/{id}" revoke_key "Revoke an API key" None, 200;
    put "/v1/rolebindings/{subject}" put_binding "Bind a subject to a role in the tenant" Some("RoleBindingSpec"), 200;
    get "/v1/rolebindings" list_bindings "List role bindings" None, 200;
    delete "/v1/rolebindings/{subject}" delete_binding "Remove a role binding" None, 200;
    get "/v1/nodes" list_nodes "List nodes" None, 200;
    get "/v1/nodes/{name}" get_node "Get a node" None, 200;
    put "/v1/nodes/{name}" put_node "Register or replace a node (system operators)" Some("Node"), 200;
    get "/v1/nodes/{name}/attestation" get_attestation "The node's attestation: keys, measurements, approved values, last verdict" None, 200;
    post "/v1/nodes/{name}/attestation/check" check_attestation "Attest the node now (a fresh nonce and quote)" None, 200;
    post "/v1/nodes/{name}/attestation/trust" trust_node "Approve the node's last authentic quote as its reference values (system operators)" None, 200;
    post "/v1/queues" create_queue "Create a queue" Some("QueueSpec"), 201;
    get "/v1/queues" list_queues "List queues" None, 200;
    get "/v1/queues/{name}" get_queue "Get a queue" None, 200;
    put "/v1/queues/{name}" put_queue "Replace a queue (compare-and-swap with resource_version)" Some("QueueSpec"), 200;
    delete "/v1/queues/{name}" delete_queue "Delete a queue" None, 200;
    post "/v1/jobs" submit_job "Submit a job (a gang of tasks)" Some("JobSpec"), 201;
    get "/v1/jobs" list_jobs "List jobs with status and pending reasons" None, 200;
    get "/v1/jobs/{name}" get_job "Get a job" None, 200;
    post "/v1/jobs/{name}/cancel" cancel_job "Cancel a job" None, 200;
    delete "/v1/jobs/{name}" delete_job "Delete a job so its name can be used again (202 while its trees are being stopped, then it is gone)" None, 200;
    get "/v1/jobs/{name}/logs" job_logs "Output of the job's tasks on this machine (?task=NAME for one; with &from=BYTES the log from there on and X-Tessera-Log-Offset the next offset)" None, 200;
    get "/v1/events" list_events "List events" None, 200;
    get "/v1/audit" list_audit "The audit log: who changed what (admins)" None, 200;
    get "/v1/templates" list_templates "Templates an operator registered (name, digest): what sandboxes, runtimes and jobs may name" None, 200;
    get "/v1/watch" watch "Watch changes as server-sent events (?kind=job|queue|event|session|sandbox|pool&after=REVISION); 410 (code compacted) when REVISION left the change log: list again" None, 200;
}

/// The API router.
pub fn router(app: App) -> Router {
    let limit = app.body_limit;
    api_routes()
        .merge(crate::identity::routes())
        .merge(crate::sandboxes::routes())
        .merge(crate::agents::routes())
        .merge(crate::tools::routes())
        .merge(crate::gateway::routes())
        .merge(crate::guardpol::routes())
        .merge(crate::queuecaps::routes())
        .merge(crate::cluster::routes())
        .merge(crate::weights::routes())
        .merge(crate::exchange::routes())
        .merge(crate::ui::routes())
        .route("/v1/openapi.json", get(openapi))
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .fallback(no_route)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::middleware::from_fn(crate::gateway::openai_errors))
        .layer(axum::middleware::from_fn_with_state(app.clone(), count))
        .layer(axum::middleware::from_fn(crate::access::log))
        .with_state(app)
}

/// The OpenAPI 3.1 document, built from [`ROUTE_TABLES`] and each module's
/// schemas.
pub fn openapi_document() -> Value {
    let mut paths = serde_json::Map::new();
    for r in ROUTE_TABLES.iter().flat_map(|t| t.iter()) {
        let entry = paths.entry(r.path.to_string()).or_insert_with(|| json!({}));
        let params: Vec<Value> = r
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
            .map(|p| json!({"name": p, "in": "path", "required": true, "schema": {"type": "string"}}))
            .collect();
        let mut op = json!({
            "summary": r.summary,
            "operationId": format!("{}_{}", r.method, r.path.trim_start_matches("/v1/").replace(['/', '{', '}'], "_").trim_end_matches('_')),
            "security": [{"apiKey": []}],
            "responses": {
                r.status.to_string(): {"description": "success", "content": {"application/json": {}}},
                "400": {"$ref": "#/components/responses/Problem"},
                "401": {"$ref": "#/components/responses/Problem"},
                "403": {"$ref": "#/components/responses/Problem"},
                "404": {"$ref": "#/components/responses/Problem"},
                "409": {"$ref": "#/components/responses/Problem"},
                "410": {"$ref": "#/components/responses/Problem"},
                "413": {"$ref": "#/components/responses/Problem"},
            },
        });
        if !params.is_empty() {
            op["parameters"] = Value::Array(params);
        }
        if let Some(b) = r.body {
            op["requestBody"] = json!({
                "required": true,
                "content": {
                    "application/json": {"schema": {"$ref": format!("#/components/schemas/{b}")}},
                    "application/yaml": {"schema": {"$ref": format!("#/components/schemas/{b}")}},
                },
            });
        }
        entry[r.method] = op;
    }
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {"title": "Tessera control plane", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "components": {
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer", "description": "An API key tsk_<id>_<secret>"}},
            "responses": {"Problem": {"description": "RFC 9457 problem details", "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}}},
            "schemas": {
                "Problem": {"type": "object", "required": ["type", "title", "status", "code"], "properties": {
                    "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                    "detail": {"type": "string"}, "code": {"type": "string", "enum": [
                        "invalid_request", "unauthenticated", "forbidden", "not_found", "already_exists",
                        "conflict", "compacted", "payload_too_large", "unsupported_media_type", "internal",
                        "quota_exceeded", "budget_exceeded", "unavailable"]},
                    "field": {"type": "string", "description": "Path of the offending field"}}},
                "NewTenant": {"type": "object", "additionalProperties": false, "required": ["name"], "properties": {"name": {"type": "string"}}},
                "NewApiKey": {"type": "object", "additionalProperties": false, "required": ["subject"], "properties": {
                    "subject": {"type": "string"}, "role": {"$ref": "#/components/schemas/Role"}, "expires_in_seconds": {"type": "integer"}}},
                "Role": {"type": "string", "enum": ["viewer", "developer", "operator", "admin"]},
                "WeightsGrant": {"type": "object", "additionalProperties": false, "required": ["tenant"], "properties": {"tenant": {"type": "string"}, "revoke": {"type": "boolean", "description": "Take the grant back"}}},
                "RoleBindingSpec": {"type": "object", "additionalProperties": false, "required": ["role"], "properties": {"role": {"$ref": "#/components/schemas/Role"}}},
                "Resources": {"type": "object", "additionalProperties": false, "properties": {
                    "cpu_milli": {"type": "integer"}, "memory": {"description": "bytes; in requests also a quantity (16Gi, 512M)"}, "gpu_milli": {"type": "integer"},
                    "gpu_memory": {"description": "bytes; in requests also a quantity"}, "pods": {"type": "integer"}, "extended": {"type": "object"},
                    "cpu": {"description": "requests only: cores (4, 0.5, \"500m\"), instead of cpu_milli"},
                    "gpu": {"description": "queue limits only: GPUs, fractions allowed (8, 0.5), instead of gpu_milli"}}},
                "Node": {"type": "object", "additionalProperties": false, "required": ["name", "allocatable"], "properties": {
                    "name": {"type": "string"}, "labels": {"type": "object"}, "taints": {"type": "array"},
                    "allocatable": {"$ref": "#/components/schemas/Resources"}, "gpus": {"type": "array"}, "unschedulable": {"type": "boolean"},
                    "network": {"type": "array", "items": {"type": "string"}, "description": "network-tier domains above the node, bottom up"}}},
                "QueueSpec": {"type": "object", "additionalProperties": false, "required": ["name"], "properties": {
                    "name": {"type": "string"}, "parent": {"type": "string"}, "weight": {"type": "integer"},
                    "guarantee": {"$ref": "#/components/schemas/Resources"}, "capability": {"$ref": "#/components/schemas/Resources"},
                    "reclaimable": {"type": "boolean"}, "resource_version": {"type": "integer"}}},
                "TaskSpec": {"type": "object", "additionalProperties": false, "required": ["name"], "properties": {
                    "name": {"type": "string"}, "resources": {"$ref": "#/components/schemas/Resources"},
                    "replicas": {"type": "integer", "minimum": 1, "description": "This many tasks alike, named NAME-0 .. NAME-{N-1} (at most 10,000 tasks in a job)"},
                    "gpu": {"description": "A number of whole GPUs (8), \"none\", {\"whole\": {\"count\": N}}, {\"shared\": {\"milli\": M, \"memory\": BYTES}} or {\"mig\": {\"profile\": \"3g.40gb\"}}"},
                    "gpu_milli": {"type": "integer", "minimum": 1, "maximum": 999, "description": "A fraction of one GPU (instead of gpu)"},
                    "gpu_memory": {"description": "The fraction's device memory: bytes or a quantity (20Gi)"},
                    "gpu_models": {"type": "array", "items": {"type": "string"}, "description": "Only these GPU models"},
                    "mig": {"type": "string", "description": "One MIG instance of this profile, e.g. 3g.40gb (instead of gpu)"},
                    "env": {"type": "array", "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "value": {"type": "string"}}}},
                    "working_dir": {"type": "string"}, "template": {"type": "string", "description": "host or a registered template name (NAME[@sha256:HEX])"},
                    "limits": {"type": "object", "description": "cpu_milli, memory, pids, disk: Kubernetes limits above the requests"},
                    "node_selector": {"type": "object"}, "tolerations": {"type": "array"}, "priority": {"type": "integer"},
                    "runtime_class": {"type": "string", "description": "standard (namespaces, the default), isolated (a micro-VM) or a class the operator added; none: the tenant's minimum class"},
                    "command": {"type": "array", "items": {"type": "string"}},
                    "weights": {"type": "array", "items": {"type": "string"}, "description": "Model weights (NAME, or OWNER/NAME granted by another tenant) released into the task at /weights/NAME/FILE: memory-backed and read-only, on an attested node only"},
                    "duration": {"type": "number", "description": "Simulated seconds the task runs on a simulated node (tessera up --cluster)"},
                    "topology": {"description": "{\"scope\": \"nvlink_domain\"|\"pcie_root\"|\"numa\", \"strength\": \"hard\"|\"soft\"}"}}},
                "JobSpec": {"type": "object", "additionalProperties": false, "required": ["name", "queue", "tasks"], "properties": {
                    "name": {"type": "string"}, "queue": {"type": "string"}, "min_member": {"type": "integer"},
                    "min_resources": {"$ref": "#/components/schemas/Resources"}, "priority": {"type": "integer"},
                    "kind": {"type": "string", "enum": ["training", "inference", "batch", "agent"]},
                    "preemptable": {"type": "boolean"}, "tasks": {"type": "array", "items": {"$ref": "#/components/schemas/TaskSpec"}},
                    "network_topology": {"description": "{\"tier\": N, \"strength\": \"hard\"|\"soft\"}: all tasks within one tier-N network domain"},
                    "restart_policy": {"type": "string", "enum": ["Never", "OnFailure"]}, "backoff_limit": {"type": "integer"},
                    "active_deadline_seconds": {"type": "integer"}, "ttl_seconds_after_finished": {"type": "integer"},
                    "termination_grace_period_seconds": {"type": "integer"}}},
            },
        },
    });
    let schemas = &mut doc["components"]["schemas"];
    for (name, schema) in crate::identity::schemas()
        .into_iter()
        .chain(crate::sandboxes::schemas())
        .chain(crate::agents::schemas())
        .chain(crate::tools::schemas())
        .chain(crate::gateway::schemas())
        .chain(crate::guardpol::schemas())
        .chain(crate::queuecaps::schemas())
        .chain(crate::cluster::schemas())
    {
        schemas[name] = schema;
    }
    doc
}
